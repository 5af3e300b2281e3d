"""TranscriptionService: the composition root every front (CLI, UI, endpoint, worker) uses.

It loads the models once, lazily (the diarizer only when a request asks for speakers), and turns
audio plus `ServiceOptions` into a `Transcript`. Requests may come from several threads (the
Gradio queue, the worker); the models are not re-entrant, so one request runs at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from asr.audio import SAMPLE_RATE, DecodedAudio
from asr.types import (
    DecidedWindow,
    ProgressHook,
    Segment,
    SpeakerTurn,
    Transcript,
    WindowHook,
    no_progress,
)
from asr.writers import RECORDED_SINCE

from .config import Settings
from .malloc import trimming
from .request import (  # re-exported: the Python API takes them from here
    DECODING_CHOICES,
    MAX_PROMPT_CHARACTERS,
    ServiceOptions,
    decoding_choices,
    language_code,
)
from .unlabelled_cache import reused

if TYPE_CHECKING:
    from asr.models import ModelRegistry
    from asr.transcribe import Recording
    from asr.vad import VoiceActivityDetector
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import DraftSource
    from diarize.passes import SpeakerPasses
    from diarize.pipeline import Diarization, DiarizeOptions, Diarizer

__all__ = [
    "DECODING_CHOICES",
    "MAX_PROMPT_CHARACTERS",
    "AudioInput",
    "ServiceOptions",
    "TranscriptionService",
    "decoding_choices",
    "language_code",
]

AudioInput = str | Path | bytes | BinaryIO | np.ndarray | DecodedAudio
"""A path, the bytes of an audio file, an open binary file, samples at 16 kHz (float in
[-1, 1] or integer PCM, mono or channels: `asr.audio.samples_audio`), or a file decoded
already (`asr.audio.decode_audio`: its warnings join the transcript's)."""

# A recording this long (s) or longer keeps a journal of its decoded windows where the caller
# offers one (`run_keeping_unlabelled`): a run stopped part-way is taken up where it stopped.
# Shorter ones cost little to decode again.
JOURNAL_MIN_SECONDS = 120.0


def _choose_draft(requested: str, asr_model: str) -> str:
    """The requested draft; for "auto", the shipped draft distilled for this ASR model when one
    is built (asr.models.SHIPPED_DRAFTS, e.g. whisper-base-draft for whisper-base), else none.
    It pays in every precision the decoder runtime offers (docs/benchmarks.md)."""
    if requested != "auto":
        return requested
    from asr.models import shipped_draft_ready

    name = f"{asr_model}-draft"
    return name if shipped_draft_ready(name) else "none"


# Speech after which "auto"'s model draft has paid for itself. Loading whisper-base-draft and
# setting up its int8 kernels costs a process about 0.22 s on a 2-core CPU; drafting saves
# 0.009 s of decoding per second of speech over bench.cli's 59 files and 0.013 s on jfk.wav
# (int8), so it breaks even between 17 and 25 s of speech.
DRAFT_PAYS_AFTER_SECONDS = 20.0


# Assistants that are no model (`TranscriptionService`).
MODEL_FREE_ASSISTANTS = ("none", "prompt-lookup")


def _check_assistant(name: str) -> None:
    """Raises ModelNotFoundError unless `name` can name a transcription assistant: a shipped
    draft, a Whisper model (embedded, a folder or a hub id), or one of MODEL_FREE_ASSISTANTS.
    Its error lists those, not the text and speaker models a Whisper cannot draft with."""
    from asr.models import EMBEDDED, SHIPPED_DRAFTS, ModelNotFoundError, check_model_name

    if name in MODEL_FREE_ASSISTANTS or name in SHIPPED_DRAFTS:
        return
    try:
        check_model_name(name, kind="whisper")
    except ModelNotFoundError as error:
        if name in EMBEDDED:  # a model of another kind
            raise ModelNotFoundError(f"assistant {error}: it cannot draft for Whisper") from None
        whispers = sorted(n for n, model in EMBEDDED.items() if model.kind == "whisper")
        known = ", ".join(["auto", *MODEL_FREE_ASSISTANTS, *sorted(SHIPPED_DRAFTS), *whispers])
        raise ModelNotFoundError(
            f"unknown assistant {name!r}: not a draft, a Whisper model, a local directory or a "
            f"hub id (organisation/name). Assistants: {known}"
        ) from None


def _given(value: str | None, default: str, what: str) -> str:
    """`value` unless it was left out (None); an empty or blank value is an error, not the
    default (`--model ""` from a script whose variable is unset must not run another model)."""
    if value is None:
        return default
    if not value.strip():
        raise ValueError(f"the {what} must not be empty")
    return value


@contextlib.contextmanager
def _repair_hint(name: str):
    """An embedded model that fails to load (a cached file damaged or cut short): its error
    says how to fetch it again."""
    from asr.models import EMBEDDED

    try:
        yield
    except ValueError as error:
        if name not in EMBEDDED:
            raise
        raise ValueError(
            f"{error}; `specscribe models pull --force {name}` fetches it again"
        ) from None


def _file_name(path: str) -> str:
    """A file name that stands for a model path or hub id (its quantized layers' store)."""
    import hashlib

    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return f"{Path(path).name}-{digest}"


class TranscriptionService:
    """Models loaded once; `run` turns one request into a Transcript.

    asr_model / assistant_model / diarization_model: embedded names, local directories or hub
    ids (None: the settings' choice). assistant_model "none" decodes without a draft,
    "prompt-lookup" drafts from the window's own text (no model), "auto"
    (the default) with the shipped draft distilled for the ASR model, if there is one;
    diarization_model "embedded" is the offline segmentation-3.0 + CAM++ pipeline.
    precision: auto | fp32 | bf16 | fp16 | mixed | int8 (`asr.precision`) for the target and
    the draft.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        asr_model: str | None = None,
        assistant_model: str | None = None,
        diarization_model: str | None = None,
        device: str | None = None,
        precision: str | None = None,
        progress: ProgressHook = no_progress,
    ) -> None:
        from asr.models import check_model_name

        self.settings = settings or Settings.from_env()
        self.asr_model_name = _given(asr_model, self.settings.asr_model, "model")
        check_model_name(self.asr_model_name, kind="whisper")
        self.diarization_model_name = _given(
            diarization_model, self.settings.diarization_model, "diarization pipeline"
        )
        from asr.precision import check_device, resolve_precision

        # Settled once, before any model loads: a device this machine lacks, or a bad
        # (device, precision) pair, fails here.
        self.device = check_device(_given(device, self.settings.device, "device"))
        self.dtypes = resolve_precision(
            self.device, _given(precision, self.settings.precision, "precision")
        )
        requested_draft = _given(assistant_model, self.settings.assistant_model, "assistant")
        self.draft_model_name = _choose_draft(requested_draft, self.asr_model_name)
        _check_assistant(self.draft_model_name)
        # "auto" loads its model draft once the speech transcribed reaches
        # DRAFT_PAYS_AFTER_SECONDS (`_draft_for`); a draft the caller named is always used.
        self._draft_when_it_pays = requested_draft == "auto"
        self._speech_seconds_before_draft = 0.0
        self.dtype = self.dtypes.decoder
        self.precision = self.dtypes.name  # resolved, e.g. "bf16 encoder, int8 decoder"
        self._load_progress = progress
        self._lock = threading.Lock()
        self._registry: ModelRegistry | None = None
        self._model: WhisperModel | None = None
        self._draft: DraftSource | None = None
        self._diarizer: Diarizer | None = None
        self._vad: VoiceActivityDetector | None = None

    def output_record(self, options: ServiceOptions) -> dict:
        """What decides a request's outputs, as JSON values: the model, the precision and the
        request's options (the draft is left out: it never changes the output)."""
        request = options.model_dump()
        del request["use_assistant"]
        # Options added after records began are recorded only when they differ from what
        # outputs were made with before them, so those outputs still count as made that way
        # (and outputs made without VAD or the repetition guard are redone with them).
        for name, before in RECORDED_SINCE.items():
            if request[name] == before:
                del request[name]
        if not options.vad:
            for name in [name for name in request if name.startswith("vad_")]:
                del request[name]
            if options.clip_timestamps is None:  # nothing is cut out: no passages
                request.pop("passage_pause", None)
        # Settings of a decoding the request never runs: beams at temperature 0 only, samples
        # only at temperatures above it.
        temperatures = options.temperatures()
        if temperatures[0] > 0:
            request.pop("beam_size", None)
            request.pop("patience", None)
        if max(temperatures) == 0:
            request.pop("best_of", None)
        # "speakers": how words get speakers; outputs labelled segment by segment (before
        # segments were split at speaker changes) are made again.
        diarizer = (
            {"diarization_model": self.diarization_model_name, "speakers": "per word"}
            if options.diarize
            else {}
        )
        return {"model": self.asr_model_name, "precision": self.precision, **request, **diarizer}

    # -- models, each loaded on first use -------------------------------------------------

    @property
    def registry(self) -> ModelRegistry:
        if self._registry is None:
            from asr.models import ModelRegistry

            self._registry = ModelRegistry(self.settings.cache_dir, progress=self._load_progress)
        return self._registry

    @property
    def model(self) -> WhisperModel:
        if self._model is None:
            from asr.whisper import WhisperModel

            path = self.registry.resolve(self.asr_model_name)
            with _repair_hint(self.asr_model_name):
                self._model = WhisperModel.load(
                    path,
                    self.device,
                    self.dtypes.decoder,
                    encoder_dtype=self.dtypes.encoder,
                    int8_decoder=self.dtypes.int8_decoder,
                    int8_store=self.settings.cache_dir / "int8" / f"{_file_name(path)}.safetensors",
                )
            self._model.fused_rounds = self.settings.fused_rounds
            self._model.trace_steps = self.settings.traced_steps
        return self._model

    @property
    def draft(self) -> DraftSource | None:
        if self.draft_model_name == "none":
            return None
        if self._draft is None:
            from asr.whisper_drafters import LOOKUP, LookupDraft, load_draft

            if self.draft_model_name == LOOKUP:  # no model to load
                self._draft = LookupDraft(self.model)
                return self._draft
            # The draft computes in the target's dtype and device (load_draft): a
            # shared-encoder draft reads the target's encoder output, and both see logits of
            # the same precision.
            draft_path = self.registry.resolve(self.draft_model_name)
            self._draft = dataclasses.replace(
                load_draft(self.model, draft_path),
                branches=self.settings.draft_branches,
                lookup_branch=self.settings.lookup_branch,
            )
            self._draft.model.trace_steps = self.settings.traced_steps
        return self._draft

    @property
    def diarizer(self) -> Diarizer:
        if self._diarizer is None:
            from diarize.pipeline import Diarizer

            if self.diarization_model_name == "embedded":
                self._diarizer = Diarizer.embedded(
                    self.registry.resolve("pyannote-segmentation-3.0"),
                    self.registry.resolve("campplus-sv-zh-en"),
                    device=self.device,
                )
            else:
                self._diarizer = Diarizer.from_pretrained(
                    self.diarization_model_name, token=self.settings.hf_token, device=self.device
                )
        return self._diarizer

    @property
    def vad(self) -> VoiceActivityDetector:
        if self._vad is None:
            from asr.vad import VoiceActivityDetector

            self._vad = VoiceActivityDetector(
                self.settings.cache_dir / "vad" / "silero.safetensors"
            )
        return self._vad

    def load(
        self, diarization: bool = False, vad: bool = False, defer_auto_draft: bool = False
    ) -> TranscriptionService:
        """Loads the models now instead of at the first request (a server's start-up).

        defer_auto_draft leaves "auto"'s draft until the speech transcribed repays it
        (`_draft_for`): a one-shot run of short files never loads it. A draft the caller named
        still loads now (a bad name fails before any request), and a loaded draft is always
        used.
        """
        _ = self.model
        if not (defer_auto_draft and self._draft_when_it_pays):
            _ = self.draft
        if diarization:
            _ = self.diarizer
        if vad:
            _ = self.vad
        return self

    # -- requests -----------------------------------------------------------------------

    def run(
        self,
        audio: AudioInput,
        options: ServiceOptions | Mapping[str, object] | None = None,
        progress: ProgressHook = no_progress,
        on_window: WindowHook | None = None,
    ) -> Transcript:
        """One request: audio (`AudioInput`) -> Transcript, with speakers when options.diarize
        (ServiceOptions, or a dict of its fields). Bad audio raises asr.audio.AudioLoadError,
        bad options ValueError.
        on_window: each window's segments as soon as they are decided (`asr.transcribe`),
        before speakers are assigned."""
        return self._run([audio], options, progress, on_window)[0].transcript

    def run_many(
        self,
        audios: list[AudioInput],
        options: ServiceOptions | Mapping[str, object] | None = None,
        progress: ProgressHook = no_progress,
    ) -> list[Transcript]:
        """Several recordings with the same options, one Transcript each, in order, each the
        one `run` gives it alone: their windows decode side by side (`asr.transcribe.
        transcribe_many`), which serves several short files for little more than the decoder
        calls of one. Errors as `run`'s; one bad recording fails the call (callers that must
        go on past it run the others again one at a time)."""
        return [result.transcript for result in self._run(audios, options, progress, None)]

    def run_keeping_unlabelled(
        self,
        audios: list[AudioInput],
        options: ServiceOptions | Mapping[str, object] | None = None,
        progress: ProgressHook = no_progress,
        journals: Sequence[Path | None] | None = None,
    ) -> list[Labelled]:
        """`run_many`, each transcript with the one it was before speakers were assigned
        (`Labelled.unlabelled`), which `relabel` labels again for other speaker options
        without transcribing again.

        journals: one per recording, or None: for a recording of JOURNAL_MIN_SECONDS or more,
        a file that keeps its decoded windows as they are decoded (`asr.window_journal`), so
        that a run stopped part-way and run again with the same audio, model, precision and
        options reads them back instead of decoding them again, whether the recording is
        decoded alone or beside others either time. The caller removes each once its
        transcript is kept."""
        return self._run(audios, options, progress, None, journals)

    def _journal(
        self,
        path: Path,
        recording: Recording,
        transcribe_options,
        options: ServiceOptions,
        draft: DraftSource | None,
    ):
        """The window journal at `path` for this recording decoded this way: its identity
        names everything a window's result depends on besides the window itself. The draft
        is named only where it may change the text: in a half-precision decoder
        (`asr.precision`), not in float32 or int8, where a run stopped with the draft goes on
        without it, or the other way round."""
        import torch

        from asr.window_journal import WindowJournal, audio_digest, code_digest

        drafted = None
        if draft is not None and self.dtypes.decoder != torch.float32:
            drafted = {
                "name": self.draft_model_name,
                "branches": getattr(draft, "branches", 1),
                "lookup_branch": getattr(draft, "lookup_branch", False),
            }
        identity = {
            "code": code_digest(),  # the decoder's code, as this checkout or install has it
            "torch": torch.__version__,  # its kernels decide the bits
            "draft": drafted,
            "model": self.asr_model_name,
            "weights": self.model.name,
            "precision": self.precision,
            "device": str(self.device),
            "audio": audio_digest(recording.samples),
            "spans": None if recording.spans is None else [list(span) for span in recording.spans],
            "turn_starts": list(recording.turn_starts),
            "passage_starts": list(recording.passage_starts),
            "options": json.loads(json.dumps(dataclasses.asdict(transcribe_options), default=str)),
        }
        return WindowJournal(path, identity)

    def relabel(
        self,
        audio: AudioInput,
        unlabelled: Transcript,
        options: ServiceOptions,
        progress: ProgressHook = no_progress,
        passes: SpeakerPasses | None = None,
    ) -> Transcript:
        """The transcript `run` would give `audio` with `options` (diarize on), made from its
        `unlabelled` transcript (`run_keeping_unlabelled`, made with the same options but for
        the speaker counts): only the speakers are found again. The transcript does not
        depend on the counts: the VAD reads the diarizer's segmentation pass, which precedes
        clustering. passes: the diarizer's passes over it (`Labelled.passes`), which leave only
        the clustering to run again."""
        options = _service_options(options)
        if not options.diarize:
            raise ValueError("relabel needs diarize")
        decoded = _decoded(audio, options)
        with self._lock:
            started = time.perf_counter()
            diarization = self._diarization(decoded.samples, options, progress, passes)
            seconds = time.perf_counter() - started
            transcript = self._labelled(reused(unlabelled), diarization, options, seconds)
        return _with_audio_warnings(transcript, decoded)

    def _run(
        self,
        audios: list[AudioInput],
        options: ServiceOptions | Mapping[str, object] | None,
        progress: ProgressHook,
        on_window: WindowHook | None,
        journals: Sequence[Path | None] | None = None,
    ) -> list[Labelled]:
        from asr.transcribe import Recording, transcribe, transcribe_many

        if journals is not None and len(journals) != len(audios):
            raise ValueError(f"{len(journals)} journals for {len(audios)} recordings")
        options = _service_options(options)
        if self.settings.heap_trim_seconds > 0:  # long recordings: free pages back as it goes
            progress = trimming(progress, self.settings.heap_trim_seconds)
        # 1. Check everything that can be checked before any work (the options were checked
        # when they were made; what depends on the model is checked once it is loaded).
        transcribe_options = options.transcribe_options()
        decoded = [_decoded(audio, options) for audio in audios]
        recordings = [d.samples for d in decoded]
        with self._lock:
            transcribe_options.validate(self.model)
            # Speakers are assigned word by word, so that a segment is split where its speaker
            # changes: words are timed for them even when the output does not show word times.
            hidden_words = (
                options.diarize and not options.word_timestamps and bool(self.model.alignment_heads)
            )
            if hidden_words:
                transcribe_options = dataclasses.replace(transcribe_options, word_timestamps=True)
                on_window = _without_words(on_window)
            # 2. Speakers first when asked for (the VAD reads their segmentation pass), then
            # which parts to decode: the clip ranges, and where someone speaks.
            prepared = [self._prepare(samples, options, progress) for samples in recordings]
            # 3. Transcribe, speculatively when there is a draft and the request wants it (not
            # in beam search, which decodes without one).
            speech = sum(_speech_seconds(p.samples, p.spans) for p in prepared)
            drafted = options.use_assistant and options.beam_size == 1
            draft = self._draft_for(speech) if drafted else None
            kept = [
                Recording(p.samples, p.spans, _turn_starts(p, options), _clip_starts(options))
                for p in prepared
            ]
            windows = [
                self._journal(path, recording, transcribe_options, options, draft)
                if path is not None and len(recording.samples) >= JOURNAL_MIN_SECONDS * SAMPLE_RATE
                else None
                for path, recording in zip(journals or [None] * len(kept), kept, strict=True)
            ]
            try:
                if len(kept) == 1:
                    transcripts = [
                        transcribe(
                            self.model,
                            kept[0].samples,
                            transcribe_options,
                            progress=progress,
                            draft=draft,
                            on_window=on_window,
                            spans=kept[0].spans,
                            turn_starts=kept[0].turn_starts,
                            passage_starts=kept[0].passage_starts,
                            journal=windows[0],
                        )
                    ]
                else:
                    transcripts = transcribe_many(
                        self.model,
                        kept,
                        transcribe_options,
                        progress=progress,
                        draft=draft,
                        journals=windows,
                    )
            finally:
                for journal in windows:
                    if journal is not None:
                        journal.close()
            results = []
            for transcript, p, d in zip(transcripts, prepared, decoded, strict=True):
                unlabelled = self._unlabelled(transcript, p, options, draft is not None)
                if p.diarization is None:
                    heard = _with_audio_warnings(unlabelled, d)
                    results.append(Labelled(heard, heard))
                    continue
                labelled = self._labelled(unlabelled, p.diarization, options, p.diarize_seconds)
                passes = p.diarization.passes
                results.append(Labelled(_with_audio_warnings(labelled, d), unlabelled, passes))
            return results

    def _prepare(
        self, samples: np.ndarray, options: ServiceOptions, progress: ProgressHook
    ) -> _Prepared:
        """A recording's speakers (when asked for) and the spans to decode."""
        diarization, diarize_seconds = None, 0.0
        if options.diarize:
            started = time.perf_counter()
            diarization = self._diarization(samples, options, progress)
            diarize_seconds = time.perf_counter() - started
        spans, vad = self._spans(samples, options, diarization)
        return _Prepared(samples, spans, vad, diarization, diarize_seconds)

    def _diarization(
        self,
        samples: np.ndarray,
        options: ServiceOptions,
        progress: ProgressHook,
        passes: SpeakerPasses | None = None,
    ) -> Diarization:
        """The speakers of the audio a request transcribes, on the recording's timeline: with
        clip ranges, those of the stretch from the first range's start to the last one's end,
        so that speaker counts describe what is transcribed (the whole file's were counted,
        and two speakers asked for in a clip of a meeting went to two people mostly outside
        it). passes: the same stretch's, from an earlier run."""
        first, last = _clipped_stretch(options, len(samples))
        if passes is not None and not passes.cover((last - first) / SAMPLE_RATE):
            passes = None  # another stretch's: the networks run again
        diarization = self.diarizer.diarization(
            samples[first:last], options.speaker_options(), progress=progress, passes=passes
        )
        return diarization.shifted(first / SAMPLE_RATE)

    def _unlabelled(
        self, transcript: Transcript, prepared: _Prepared, options: ServiceOptions, drafted: bool
    ) -> Transcript:
        """The decoded transcript with what the request adds before speakers: the VAD's
        statistics, the models and precision, a warning about clip ranges past the end."""
        past_the_end = _clips_past_the_end(options.clip_spans(), transcript.duration)
        tree = {}  # a tree of drafts (docs/drafts.md): said where one was drafted
        if drafted and self._draft is not None and self._draft.branches > 1:
            tree = {
                "draft_branches": self._draft.branches,
                "lookup_branch": self._draft.lookup_branch,
            }
        return dataclasses.replace(
            transcript,
            warnings=(past_the_end, *transcript.warnings) if past_the_end else transcript.warnings,
            stats={**transcript.stats, **prepared.vad},
            options={
                **transcript.options,
                "model": self.asr_model_name,
                "assistant": self.draft_model_name if drafted else None,
                **tree,
                "precision": self.precision,
                **_cut_out(options),
            },
        )

    def _labelled(
        self,
        unlabelled: Transcript,
        diarization: Diarization,
        options: ServiceOptions,
        seconds: float,
    ) -> Transcript:
        """`unlabelled` with speakers merged into its words (cut to the request's clip
        ranges); word times the request did not ask for are left out, as they always were."""
        transcript = self._with_speakers(
            unlabelled,
            diarization.within(options.clip_spans()),
            options.speaker_options(),
            seconds,
        )
        return transcript if options.word_timestamps else _words_removed(transcript)

    def _draft_for(self, speech_seconds: float) -> DraftSource | None:
        """The draft for a request of this much speech (None: decode plainly).

        "auto"'s model draft is loaded once the speech this service has transcribed, this
        request's included, reaches DRAFT_PAYS_AFTER_SECONDS; until then its load would cost
        more than it saves. As in ski rental, the plain decoding before it costs about one
        load, so a run that turns out long loses at most that. A loaded draft (a server's
        `load`) is always used.
        """
        if self._draft is None and self._draft_when_it_pays:
            self._speech_seconds_before_draft += speech_seconds
            if self._speech_seconds_before_draft < DRAFT_PAYS_AFTER_SECONDS:
                return None
        return self.draft

    def _spans(
        self, samples: np.ndarray, options: ServiceOptions, diarization: Diarization | None
    ) -> tuple[tuple[tuple[float, float], ...] | None, dict]:
        """The spans to decode (None: all of it), and the VAD's statistics (source, seconds).
        With diarization, the VAD reads its segmentation pass instead of running Silero."""
        from asr.speech_timeline import intersect
        from asr.vad import speech_regions

        duration = len(samples) / SAMPLE_RATE
        clips = options.clip_spans()  # transcribe() clips them to the recording
        if not options.vad:
            return clips, {}
        started = time.perf_counter()
        shared = diarization.speech if diarization is not None else None
        if shared is not None:
            regions = speech_regions(shared, duration, options.vad_options())
        else:
            regions = self.vad.regions(samples, options.vad_options())
        stats = {
            "vad": "diarization" if shared is not None else "silero",
            "vad_seconds": round(time.perf_counter() - started, 3),
        }
        return (regions if clips is None else intersect(regions, clips)), stats

    def _with_speakers(
        self,
        transcript: Transcript,
        diarization: Diarization,
        speakers: DiarizeOptions,
        seconds: float,
    ) -> Transcript:
        from diarize.merge import assign_speakers, starts_in_speech

        turns = diarization.turns
        # Words start where the diarizer hears speech, and go by the exclusive turns: in
        # overlapped speech, to the speaker most active.
        timed = starts_in_speech(transcript.segments, turns)
        segments = assign_speakers(timed, diarization.exclusive)
        found = len({turn.speaker for turn in turns})
        holding = speakers_holding_words(segments)
        warnings = (
            speaker_count_warning(speakers, found),
            wordless_speakers_warning(turns, holding),
        )
        return dataclasses.replace(
            transcript,
            warnings=transcript.warnings + tuple(w for w in warnings if w),
            segments=segments,
            turns=turns,
            options={
                **transcript.options,
                "diarize": dataclasses.asdict(speakers),
                "diarization_model": self.diarization_model_name,
            },
            stats={
                **transcript.stats,
                "speakers": found,
                "speakers_with_words": len(holding),
                "diarize_seconds": round(seconds, 3),
            },
        )


def _service_options(options: ServiceOptions | Mapping[str, object] | None) -> ServiceOptions:
    """A request's options: None for the defaults, or a mapping of ServiceOptions' fields
    (checked as ServiceOptions checks them: ValueError)."""
    if options is None:
        return ServiceOptions()
    if isinstance(options, ServiceOptions):
        return options
    if isinstance(options, Mapping):
        return ServiceOptions(**options)
    raise TypeError(f"options must be a ServiceOptions or a dict, not {type(options).__name__}")


def _decoded(audio: AudioInput, options: ServiceOptions) -> DecodedAudio:
    """Any AudioInput as float32 mono samples, from the options' `audio_stream` where a file
    holds several (asr.audio.AudioStream), their `channel` alone where they name one (of an
    array's channels too); AudioLoadError for what is not audio (TypeError for what is not an
    AudioInput). Decoded audio is taken as it is."""
    audio_stream, channel = options.audio_stream, options.channel
    from asr.audio import decode_audio, samples_audio

    if isinstance(audio, DecodedAudio):
        return audio
    if isinstance(audio, np.ndarray):
        return samples_audio(audio, channel=channel)
    if hasattr(audio, "read"):  # an open binary file, as faster-whisper takes one
        binary_only = "a file object must be opened in binary mode ('rb')"
        if isinstance(audio, io.TextIOBase):  # reading audio as text fails to decode it
            raise TypeError(binary_only)
        try:
            data = audio.read()
        except UnicodeDecodeError:  # another text reader
            raise TypeError(binary_only) from None
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(binary_only)
        name = str(getattr(audio, "name", "<file object>"))
        return decode_audio(data, name=name, audio_stream=audio_stream, channel=channel)
    if not isinstance(audio, str | Path | bytes | bytearray | memoryview):
        raise TypeError(
            f"audio must be a path, a file's bytes, an open binary file or a numpy array of "
            f"samples, not {type(audio).__name__}"
        )
    return decode_audio(audio, audio_stream=audio_stream, channel=channel)


def _with_audio_warnings(transcript: Transcript, audio: DecodedAudio) -> Transcript:
    """The transcript with what its audio's decoding warned about first."""
    if not audio.warnings:
        return transcript
    return dataclasses.replace(transcript, warnings=audio.warnings + transcript.warnings)


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A request's transcript, and the transcript it was before speakers were assigned (with
    diarization, words timed even where the request does not show them: what
    `TranscriptionService.relabel` labels again; without, the transcript itself), which
    `app.unlabelled_cache` keeps for reruns asking other outputs of it. None: nothing to keep
    (a transcript written again from a kept one)."""

    transcript: Transcript
    unlabelled: Transcript | None
    passes: SpeakerPasses | None = None  # the diarizer's, where it keeps them


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A request's recording before transcription: its samples, the spans to decode (None:
    all of it) with the VAD's statistics, and its speakers when asked for."""

    samples: np.ndarray
    spans: tuple[tuple[float, float], ...] | None
    vad: dict
    diarization: Diarization | None
    diarize_seconds: float


def _speech_seconds(samples: np.ndarray, spans: tuple[tuple[float, float], ...] | None) -> float:
    """Seconds a request decodes: its spans (speech regions, clip ranges), or all of it."""
    from asr.audio import SAMPLE_RATE

    if spans is None:
        return len(samples) / SAMPLE_RATE
    return sum(end - start for start, end in spans)


def _turn_starts(prepared: _Prepared, options: ServiceOptions) -> tuple[float, ...]:
    """Where speakers change, for a multilingual request with speakers: each new speaker's
    language is then detected from their own speech (`diarize.language_turns`)."""
    if not options.multilingual or prepared.diarization is None:
        return ()
    from diarize.language_turns import speaker_change_starts

    return speaker_change_starts(prepared.diarization.exclusive)


def _cut_out(options: ServiceOptions) -> dict:
    """What decided which audio was decoded, for a transcript's options: the audio stream
    asked for (None: the one a player plays), its channel (None: all mixed), the clip ranges
    in their one spelling (None: the whole file) and the VAD's settings (False: no VAD)."""
    vad = dataclasses.asdict(options.vad_options()) if options.vad else False
    return {
        "audio_stream": options.audio_stream,
        "channel": options.channel,
        "clip_timestamps": options.clip_timestamps,
        "vad": vad,
    }


def _clipped_stretch(options: ServiceOptions, length: int) -> tuple[int, int]:
    """[first, last) samples from the first clip range's start to the last one's end, within
    the recording; all of it without clip ranges, or where they lie past its end (the
    transcript is then empty, and the turns are cut to nothing)."""
    clips = options.clip_spans()
    if not clips:
        return 0, length
    first = round(clips[0][0] * SAMPLE_RATE)
    last = length if math.isinf(clips[-1][1]) else min(round(clips[-1][1] * SAMPLE_RATE), length)
    return (first, last) if first < last else (0, length)


def _clip_starts(options: ServiceOptions) -> tuple[float, ...]:
    """Where the clip ranges start: each range decodes in windows of its own."""
    return tuple(start for start, _ in options.clip_spans() or ())


def _clips_past_the_end(clips, duration: float) -> str | None:
    """A warning naming the clip ranges that start at or after the end of the recording
    (there is nothing in them to decode); None when there are none."""
    past = [(start, end) for start, end in clips or () if start >= duration]
    if not past:
        return None
    named = ", ".join(
        f"{start:g}-{end:g} s" if end != float("inf") else f"{start:g} s onwards"
        for start, end in past
    )
    what = "clip range" if len(past) == 1 else "clip ranges"
    verb = "starts" if len(past) == 1 else "start"
    return (
        f"{what} {named} {verb} past the end of the recording ({duration:g} s): nothing to decode"
    )


def _without_words(on_window: WindowHook | None) -> WindowHook | None:
    """on_window fed segments without the word times that were computed for speakers only."""
    if on_window is None:
        return None

    def report(window: DecidedWindow) -> None:
        segments = tuple(dataclasses.replace(s, words=()) for s in window.segments)
        on_window(dataclasses.replace(window, segments=segments))

    return report


def _words_removed(transcript: Transcript) -> Transcript:
    """The transcript as a request without word timestamps gets it: segments (already split
    and labelled by speaker) without their words, and the options as asked."""
    return dataclasses.replace(
        transcript,
        segments=tuple(dataclasses.replace(s, words=()) for s in transcript.segments),
        options={**transcript.options, "word_timestamps": False},
    )


def speakers_holding_words(segments: tuple[Segment, ...]) -> set[str]:
    """The speakers that some word (or, without word times, some segment) was assigned to."""
    return {
        speaker
        for segment in segments
        for speaker in ([w.speaker for w in segment.words] or [segment.speaker])
        if speaker
    }


def wordless_speakers_warning(turns: tuple[SpeakerTurn, ...], holding: set[str]) -> str | None:
    """Names the speakers the diarizer found who hold no word of the transcript (a short
    back-channel, or speech only where someone else is assigned the words), with their time."""
    seconds: dict[str, float] = {}
    for turn in turns:
        seconds[turn.speaker] = seconds.get(turn.speaker, 0.0) + turn.end - turn.start
    missing = sorted(speaker for speaker in seconds if speaker not in holding)
    if not missing:
        return None
    described = ", ".join(f"{name} ({seconds[name]:.1f} s of speech)" for name in missing)
    found = f"{len(seconds)} speaker{'s' if len(seconds) != 1 else ''}"
    holds = f"{len(holding)} hold{'s' if len(holding) == 1 else ''}"
    return (
        f"{found} found in the audio, {holds} words of the "
        f"transcript; no words for {described} (their turns are with the others': rttm, "
        "json's turns, verbose_json's speakers)"
    )


def speaker_count_warning(options: DiarizeOptions, found: int) -> str | None:
    """Why the speakers found differ from the count asked, or None when they do not.

    pyannote clusters into the count asked, but a speaker whose cluster is never the most
    active one in any frame has no turn left, and a short recording has too few speech
    windows to form many clusters, so an exact or minimum count is a wish, not a promise."""
    if options.num_speakers is not None and found != options.num_speakers:
        asked = f"exactly {options.num_speakers}"
    elif options.min_speakers is not None and found < options.min_speakers:
        asked = f"at least {options.min_speakers}"
    elif options.max_speakers is not None and found > options.max_speakers:
        asked = f"at most {options.max_speakers}"
    else:
        return None
    return f"{asked} speakers were asked for; {found} found in the audio"
