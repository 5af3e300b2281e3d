"""Diarizer: pyannote.audio's SpeakerDiarization pipeline -> sorted SpeakerTurns.

Two ways to build one:
- `Diarizer.embedded(segmentation_dir, embedding_dir)`: offline, from the local pyannote
  segmentation-3.0 and CAM++ weights, agglomerative clustering with the parameters that
  scripts/tune_diarization.py chose (no PLDA, so nothing is fetched);
- `Diarizer.from_pretrained("pyannote/speaker-diarization-community-1", token=...)`: any pyannote
  pipeline for users who can reach the Hugging Face hub (not exercised by the tests).

Memory stays bounded on hour-long audio: pyannote slides the 10 s segmentation window (1 s hop)
over the samples in batches of `segmentation_batch_size` and keeps only (chunks, 589 frames,
3 speakers) scores, about 25 MB per hour; CAM++ runs on blocks of `chunks_per_block` = 32
consecutive chunks (41 s of audio at a time) and keeps one 192-d vector per (chunk, speaker).
Measured with one thread: 10 min of audio took 37 s and 30 min 121 s (real-time factor 0.06-0.07)
with the same peak memory, about 350 MB above the loaded models and the samples. What still grows
with length is the agglomerative clustering's condensed distance matrix, n^2/2 doubles over the
n (chunk, speaker) pairs that speak alone long enough: at most 3 per chunk, so at worst 470 MB
for an hour.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pyannote.audio.core.plda import PLDA
from pyannote.audio.pipelines import SpeakerDiarization
from pyannote.audio.pipelines.clustering import AgglomerativeClustering
from pyannote.audio.telemetry import set_telemetry_metrics
from pyannote.core import Annotation, SlidingWindow, SlidingWindowFeature
from pyannote.core import Segment as TimeSpan
from pyannote.pipeline.parameter import Uniform

from asr.audio import SAMPLE_RATE
from asr.types import ProgressHook, SpeakerTurn, no_progress
from asr.vad import SpeechProbability, probability_from_activity
from diarize.campplus import FRAME_SHIFT, load_campplus, num_frames
from diarize.embedding import CamPlusPlusEmbedding
from diarize.options import DiarizeOptions
from diarize.passes import SpeakerPasses

log = logging.getLogger(__name__)

SEGMENTATION_WINDOW = 10.0  # seconds: segmentation-3.0's chunk
MIN_CLEAN_SPEECH = 0.5  # seconds: below this, an embedding keeps the overlapped frames


@dataclass(frozen=True)
class EmbeddedParams:
    """Hyper-parameters of the embedded pipeline.

    threshold: cosine-distance threshold of centroid-linkage agglomerative clustering;
    min_cluster_size: clusters with fewer (chunk, speaker) embeddings merge into the nearest
      large one;
    min_embedding_speech: seconds of a 10 s chunk where a speaker must be the only one active
      for that chunk's embedding of them to take part in the clustering;
    min_duration_off: gaps shorter than this (seconds) inside one speaker's turns are filled;
    min_duration_on: turns shorter than this (seconds) are dropped;
    segmentation_step: hop of the 10 s segmentation window, as a fraction of it;
    exclude_overlap: embeddings pool only frames where their speaker talks alone (when at
      least 0.5 s of such frames exist);
    chunks_per_block: consecutive chunks whose audio goes through CAM++ in one pass.
    The defaults are the values scripts/tune_diarization.py chose on AMI trn00..09: pooled
    development DER 28.3 %, where pyannote's untuned clustering (threshold 0.6,
    min_cluster_size 12, 2 s alone) gives 42.6 %.
    """

    threshold: float = 0.8
    min_cluster_size: int = 1
    min_embedding_speech: float = 1.0
    min_duration_off: float = 0.0
    min_duration_on: float = 0.0
    segmentation_step: float = 0.1
    exclude_overlap: bool = True
    chunks_per_block: int = 32

    def validate(self) -> EmbeddedParams:
        if not 0.0 < self.threshold < 2.0:
            raise ValueError(f"threshold must be in (0, 2), got {self.threshold}")
        if self.min_cluster_size < 1:
            raise ValueError(f"min_cluster_size must be at least 1, got {self.min_cluster_size}")
        if not 0.0 <= self.min_embedding_speech <= SEGMENTATION_WINDOW:
            raise ValueError(
                f"min_embedding_speech must be in [0, {SEGMENTATION_WINDOW}] s, "
                f"got {self.min_embedding_speech}"
            )
        if self.min_duration_off < 0 or self.min_duration_on < 0:
            raise ValueError("min_duration_off and min_duration_on must not be negative")
        if not 0.0 < self.segmentation_step <= 1.0:
            raise ValueError(f"segmentation_step must be in (0, 1], got {self.segmentation_step}")
        if self.chunks_per_block < 1:
            raise ValueError(f"chunks_per_block must be at least 1, got {self.chunks_per_block}")
        return self

    def pyannote_parameters(self) -> dict[str, dict[str, Any]]:
        """The part that pyannote's `Pipeline.instantiate` takes."""
        return {
            "segmentation": {"min_duration_off": self.min_duration_off},
            "clustering": {
                "method": "centroid",
                "threshold": self.threshold,
                "min_cluster_size": self.min_cluster_size,
                "min_active_ratio": self.min_embedding_speech / SEGMENTATION_WINDOW,
            },
        }


class NoPLDA(PLDA):
    """pyannote 4 loads a PLDA for VBx clustering whatever the clustering is; agglomerative
    clustering never uses it, and handing over this empty one keeps it from going to the hub."""

    def __init__(self) -> None:
        pass


class _AgglomerativeClustering(AgglomerativeClustering):
    """pyannote's agglomerative clustering with its fixed 20 % rule made a hyper-parameter:
    only (chunk, speaker) pairs with at least `min_active_ratio` of the chunk as the sole
    active speaker shape the clusters (the others are assigned to the nearest centroid), so a
    speaker who never talks that long alone cannot become a cluster of their own."""

    def __init__(self, metric: str = "cosine") -> None:
        super().__init__(metric=metric)
        self.min_active_ratio = Uniform(0.0, 1.0)

    def filter_embeddings(self, embeddings, segmentations=None, min_active_ratio=0.2):
        return super().filter_embeddings(embeddings, segmentations, self.min_active_ratio)


class EmbeddedSpeakerDiarization(SpeakerDiarization):
    """pyannote's SpeakerDiarization with CAM++ embeddings computed once per block of audio.

    pyannote embeds every (chunk, local speaker) pair by running the embedding network on the
    whole 10 s chunk under that speaker's mask: with a 1 s hop and 3 local speakers, each second
    of audio goes through the network 30 times. CAM++ is convolutional up to its statistics
    pooling, so here its frame features are computed once over `chunks_per_block` consecutive
    chunks and each pair's embedding pools that pair's slice of frames under its mask.
    """

    EMBEDDING_CACHE = "training_cache/campplus_embeddings"
    # A file's passes from an earlier run (diarize.passes): used instead of running the networks.
    REUSED_PASSES = "specscribe/passes"

    def __init__(
        self,
        segmentation_dir: Path,
        embedding: CamPlusPlusEmbedding,
        segmentation_step: float,
        exclude_overlap: bool,
        chunks_per_block: int,
        segmentation_batch_size: int = 16,
    ) -> None:
        super().__init__(
            segmentation=str(segmentation_dir),
            segmentation_step=segmentation_step,
            embedding=embedding,
            embedding_exclude_overlap=exclude_overlap,
            plda=NoPLDA(),
            clustering="AgglomerativeClustering",
            segmentation_batch_size=segmentation_batch_size,
        )
        self.chunks_per_block = chunks_per_block
        self.clustering = _AgglomerativeClustering(metric=self._embedding.metric)
        self.device = torch.device("cpu")  # until `to`
        self.last_segmentations: SlidingWindowFeature | None = None
        self.last_embeddings: np.ndarray | None = None

    def get_segmentations(self, file: dict[str, Any], hook: Any = None) -> SlidingWindowFeature:
        """pyannote's segmentation pass, kept (until the next file) for the speech detector
        (`speech_probability`): VAD and diarization share it."""
        self.last_embeddings = None
        reused: SpeakerPasses | None = file.get(self.REUSED_PASSES)
        if reused is not None:
            start, duration, step = reused.chunk_window
            window = SlidingWindow(start=start, duration=duration, step=step)
            self.last_segmentations = SlidingWindowFeature(reused.segmentations.copy(), window)
        else:
            self.last_segmentations = super().get_segmentations(file, hook=hook)
        return self.last_segmentations

    def last_passes(self) -> SpeakerPasses | None:
        """The last file's segmentation and embedding passes (None where it had no speech to
        embed), for `Diarizer.diarization(..., passes=...)` to cluster again."""
        if self.last_segmentations is None or self.last_embeddings is None:
            return None
        window = self.last_segmentations.sliding_window
        return SpeakerPasses(
            self.last_segmentations.data,
            (float(window.start), float(window.duration), float(window.step)),
            self.last_embeddings,
        )

    def speech_probability(self) -> SpeechProbability | None:
        """Whether anyone speaks, frame by frame, in the last file segmented (None before)."""
        segmentations = self.last_segmentations
        if segmentations is None:
            return None
        chunks = segmentations.sliding_window
        starts = np.array([chunks[i].start for i in range(len(segmentations.data))])
        field = self._segmentation.model.receptive_field
        return probability_from_activity(
            segmentations.data, starts, float(field.step), float(field.start + field.duration / 2)
        )

    def get_embeddings(
        self,
        file: dict[str, Any],
        binary_segmentations: SlidingWindowFeature,
        exclude_overlap: bool = False,
        hook: Any = None,
    ) -> np.ndarray:
        """binary_segmentations (chunks, frames, 3) -> embeddings (chunks, 3, 192); NaN rows for
        speakers silent in a chunk (pyannote's clustering skips them)."""
        if self.training and self.EMBEDDING_CACHE in file:
            return file[self.EMBEDDING_CACHE]
        if self.REUSED_PASSES in file:
            self.last_embeddings = file[self.REUSED_PASSES].embeddings
            return self.last_embeddings.copy()
        model: CamPlusPlusEmbedding = self._embedding.model_
        chunks = binary_segmentations.sliding_window
        masks = np.nan_to_num(binary_segmentations.data, nan=0.0).astype(np.float32)
        if exclude_overlap:
            masks = _without_overlap(
                masks, round(MIN_CLEAN_SPEECH / chunks.duration * masks.shape[1])
            )
        num_chunks, _, num_speakers = masks.shape
        frames_per_chunk = num_frames(round(chunks.duration * SAMPLE_RATE))  # 499 for 10 s
        embeddings = np.full((num_chunks, num_speakers, model.dimension), np.nan, np.float32)
        num_blocks = math.ceil(num_chunks / self.chunks_per_block)
        for block in range(num_blocks):
            first = block * self.chunks_per_block
            last = min(first + self.chunks_per_block, num_chunks)
            start = chunks[first].start
            waveform, _ = self._audio.crop(file, TimeSpan(start, chunks[last - 1].end), "pad")
            with torch.inference_mode():
                frames = model.frame_features(waveform[None].to(self.device))[0]
                # (512, block frames)
                offsets = [
                    min(
                        round((chunks[c].start - start) / FRAME_SHIFT),
                        frames.shape[1] - frames_per_chunk,
                    )
                    for c in range(first, last)
                ]
                windows = torch.stack([frames[:, o : o + frames_per_chunk] for o in offsets])
                weights = torch.from_numpy(masks[first:last]).transpose(1, 2).to(self.device)
                pooled = model.pool(windows, weights)  # (block chunks, speakers, 192)
            embeddings[first:last] = pooled.cpu().numpy()
            if hook is not None:
                hook("embeddings", None, total=num_blocks, completed=block + 1)
        if self.training:
            file[self.EMBEDDING_CACHE] = embeddings
        self.last_embeddings = embeddings.copy()  # clustering's input, as it was
        return embeddings


def _without_overlap(masks: np.ndarray, min_frames: int) -> np.ndarray:
    """masks (chunks, frames, speakers) 0/1 -> the same with frames where two or more speakers
    are active zeroed, for each (chunk, speaker) that keeps at least `min_frames` frames
    (pyannote's rule: an embedding of too little clean speech is worse than a mixed one)."""
    clean = masks * (masks.sum(axis=2, keepdims=True) < 2)
    enough = clean.sum(axis=1, keepdims=True) >= min_frames  # (chunks, 1, speakers)
    return np.where(enough, clean, masks)


class Diarizer:
    """Wraps one pyannote speaker diarization pipeline; `diarize` returns sorted SpeakerTurns
    labelled SPEAKER_00, SPEAKER_01, ... in order of first speech."""

    def __init__(self, pipeline: Any, min_duration_on: float = 0.0) -> None:
        self.pipeline = pipeline
        self.min_duration_on = min_duration_on

    @classmethod
    def embedded(
        cls,
        segmentation_dir: str | Path,
        embedding_dir: str | Path,
        params: EmbeddedParams | None = None,
        device: str = "cpu",
    ) -> Diarizer:
        """Offline pipeline from local weights: `segmentation_dir` holds pyannote
        segmentation-3.0 (pytorch_model.bin, config.yaml), `embedding_dir` CAM++."""
        set_telemetry_metrics(False)
        params = (params or EmbeddedParams()).validate()
        embedding = CamPlusPlusEmbedding(load_campplus(embedding_dir))
        pipeline = EmbeddedSpeakerDiarization(
            Path(segmentation_dir),
            embedding,
            segmentation_step=params.segmentation_step,
            exclude_overlap=params.exclude_overlap,
            chunks_per_block=params.chunks_per_block,
        )
        pipeline.instantiate(params.pyannote_parameters())
        pipeline.to(torch.device(device))
        return cls(pipeline, min_duration_on=params.min_duration_on)

    @classmethod
    def from_pretrained(
        cls,
        pipeline_id: str,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        device: str = "cpu",
    ) -> Diarizer:
        """Any pyannote pipeline on the hub or in a local folder (e.g.
        "pyannote/speaker-diarization-community-1", gated: accept its conditions and pass a
        Hugging Face token). Needs hub access on first use; pyannote telemetry stays off."""
        from pyannote.audio import Pipeline

        _check_local_pipeline(pipeline_id)
        set_telemetry_metrics(False)
        try:
            pipeline = Pipeline.from_pretrained(pipeline_id, token=token, cache_dir=cache_dir)
        except OSError as error:  # hub errors: offline, gated, not found
            raise ValueError(
                f"pyannote pipeline {pipeline_id!r} could not be loaded ({type(error).__name__}); "
                "the hub needs HF_HUB_OFFLINE=0, and gated pipelines a token"
            ) from error
        if pipeline is None:
            raise ValueError(f"pyannote could not load the pipeline {pipeline_id!r}")
        pipeline.to(torch.device(device))
        return cls(pipeline)

    def diarize(
        self,
        samples: np.ndarray,
        options: DiarizeOptions | None = None,
        progress: ProgressHook = no_progress,
    ) -> tuple[SpeakerTurn, ...]:
        """samples: float32 mono at 16 kHz, shape = (n_samples,) -> turns sorted by start.

        Turns of different speakers may overlap (overlapped speech)."""
        return self.diarization(samples, options, progress).turns

    def diarization(
        self,
        samples: np.ndarray,
        options: DiarizeOptions | None = None,
        progress: ProgressHook = no_progress,
        passes: SpeakerPasses | None = None,
    ) -> Diarization:
        """The overlap-aware turns and the exclusive ones (see Diarization) of one recording.

        passes: the recording's `Diarization.passes` from an earlier run: only the clustering
        runs again, on the same inputs (the embedded pipeline; others run in full)."""
        options = (options or DiarizeOptions()).validate()
        embedded = isinstance(self.pipeline, EmbeddedSpeakerDiarization)
        file = audio_file(samples)
        if passes is not None and embedded:
            file[EmbeddedSpeakerDiarization.REUSED_PASSES] = passes
        # pyannote's clustering print()s when it finds fewer clusters than asked, onto the
        # stdout that carries our transcript; the caller reports a count not met itself.
        with contextlib.redirect_stdout(io.StringIO()) as chatter, warnings.catch_warnings():
            # numpy's complaints about averaging no embeddings, where nobody speaks alone
            # long enough for one: the result (no turns there) is right, the noise is not ours.
            warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
            # A count not met: the caller says so in its own words (speaker_count_warning).
            warnings.filterwarnings("ignore", r"\s*The detected number of speakers", UserWarning)
            output = self.pipeline(
                file,
                num_speakers=options.num_speakers,
                min_speakers=options.min_speakers,
                max_speakers=options.max_speakers,
                hook=_pyannote_hook(progress),
            )
        for line in chatter.getvalue().splitlines():
            log.info("pyannote: %s", line)
        # Pipelines built with legacy=True return the Annotation itself, without an exclusive one.
        annotation = getattr(output, "speaker_diarization", output)
        names = speaker_names(annotation, self.min_duration_on)
        turns = turns_from_annotation(annotation, self.min_duration_on, names)
        exclusive = getattr(output, "exclusive_speaker_diarization", None)
        if exclusive is not None:
            exclusive = turns_from_annotation(exclusive, self.min_duration_on, names)
        speech = getattr(self.pipeline, "speech_probability", lambda: None)()
        kept = getattr(self.pipeline, "last_passes", lambda: None)()
        exclusive = exclusive if exclusive is not None else turns
        diarization = Diarization(turns, exclusive, speech, kept)
        # pyannote's last 10 s chunk is padded past the recording, and its turns may run
        # into that padding (up to a second past the end of 30 s AMI chunks).
        return diarization.within(((0.0, len(samples) / SAMPLE_RATE),))


def _check_local_pipeline(pipeline_id: str) -> None:
    """A clear error for a local pipeline that is not there: a path that does not exist (a hub
    id is "owner/name": one slash, no leading "/", "." or "~"), or a folder without the
    config.yaml pyannote reads. pyannote would take the first for a hub id and report the
    hub's own complaint about its form, or being offline."""
    path = Path(pipeline_id).expanduser()
    if path.is_dir() and not (path / "config.yaml").is_file():
        raise ValueError(f"{pipeline_id}: this folder holds no pyannote pipeline (config.yaml)")
    looks_local = pipeline_id.startswith(("/", ".", "~")) or pipeline_id.count("/") > 1
    if looks_local and not path.exists():
        raise ValueError(f"{pipeline_id}: no such pipeline folder or file")


@dataclass(frozen=True)
class Diarization:
    """turns: who speaks when, overlapping speech included (what RTTM and DER want).
    exclusive: one speaker at a time (pyannote 3.1+: where speakers overlap, the one the
    segmentation model finds most active), what words are assigned by, so that a word in
    overlapped speech goes to the speaker most likely saying it. Same speaker names in both;
    a pipeline without an exclusive output gives its turns for both. speech: whether anyone
    speaks, frame by frame, from the same segmentation pass (the embedded pipeline only), for
    voice activity detection. passes: the networks' passes that clustering read (the embedded
    pipeline only), to cluster again for other speaker counts."""

    turns: tuple[SpeakerTurn, ...]
    exclusive: tuple[SpeakerTurn, ...]
    speech: SpeechProbability | None = None
    passes: SpeakerPasses | None = None

    def within(self, spans: tuple[tuple[float, float], ...] | None) -> Diarization:
        """The turns cut to `spans` (sorted, disjoint seconds; an end may be inf), as for a
        request that transcribes only its clip ranges: its rttm and its speaker counts are
        then about the audio transcribed, and its speakers are named SPEAKER_00, 01, ... in
        order of first speech inside them (a speaker heard only outside left a gap in the
        names). None: all of it."""
        if spans is None:
            return self
        turns, exclusive = _cut(self.turns, spans), _cut(self.exclusive, spans)
        first_speech: dict[str, float] = {}
        for turn in sorted(turns + exclusive, key=lambda turn: turn.start):
            first_speech.setdefault(turn.speaker, turn.start)
        names = {speaker: f"SPEAKER_{index:02d}" for index, speaker in enumerate(first_speech)}

        def renamed(cut: tuple[SpeakerTurn, ...]) -> tuple[SpeakerTurn, ...]:
            return tuple(replace(turn, speaker=names[turn.speaker]) for turn in cut)

        return replace(self, turns=renamed(turns), exclusive=renamed(exclusive))

    def shifted(self, seconds: float) -> Diarization:
        """The same speakers `seconds` later: the diarization of a stretch of a recording put
        on the recording's timeline (`passes` stay the stretch's, to cluster it again)."""
        if seconds == 0:
            return self

        def moved(turns: tuple[SpeakerTurn, ...]) -> tuple[SpeakerTurn, ...]:
            return tuple(
                replace(turn, start=turn.start + seconds, end=turn.end + seconds) for turn in turns
            )

        speech = self.speech
        if speech is not None:
            speech = replace(speech, offset=speech.offset + seconds)
        return replace(
            self, turns=moved(self.turns), exclusive=moved(self.exclusive), speech=speech
        )


def _cut(turns: tuple[SpeakerTurn, ...], spans: tuple[tuple[float, float], ...]) -> tuple:
    """Each turn's parts inside `spans`, in the turns' order."""
    return tuple(
        SpeakerTurn(max(turn.start, start), min(turn.end, end), turn.speaker)
        for turn in turns
        for start, end in spans
        if min(turn.end, end) > max(turn.start, start)
    )


def audio_file(samples: np.ndarray, uri: str = "audio") -> dict[str, Any]:
    """samples (n_samples,) float32 at 16 kHz -> the in-memory file pyannote pipelines take
    (shares memory with `samples` unless they are read-only: torch cannot wrap those)."""
    waveform = torch.from_numpy(np.require(samples, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
    waveform = waveform[None]
    return {"waveform": waveform, "sample_rate": SAMPLE_RATE, "uri": uri}


def speaker_names(annotation: Annotation, min_duration_on: float = 0.0) -> dict[str, str]:
    """pyannote labels -> SPEAKER_00, SPEAKER_01, ... in order of first speech (turns shorter
    than `min_duration_on` seconds left out)."""
    return _named(_tracks(annotation, min_duration_on), {})


def turns_from_annotation(
    annotation: Annotation,
    min_duration_on: float = 0.0,
    names: dict[str, str] | None = None,
) -> tuple[SpeakerTurn, ...]:
    """pyannote Annotation -> SpeakerTurns sorted by (start, end), shorter than
    `min_duration_on` seconds dropped, speakers renamed by `names` (default: SPEAKER_00.. by
    first appearance in this annotation); a label `names` lacks keeps a name after theirs."""
    tracks = _tracks(annotation, min_duration_on)
    named = _named(tracks, dict(names or {}))
    return tuple(SpeakerTurn(start, end, named[label]) for start, end, label in tracks)


def _named(tracks: list[tuple[float, float, str]], names: dict[str, str]) -> dict[str, str]:
    """`names` extended with SPEAKER_NN for each label of `tracks` it lacks, in track order."""
    for _, _, label in tracks:
        names.setdefault(label, f"SPEAKER_{len(names):02d}")
    return names


def _tracks(annotation: Annotation, min_duration_on: float) -> list[tuple[float, float, str]]:
    return sorted(
        (segment.start, segment.end, str(label))
        for segment, _, label in annotation.itertracks(yield_label=True)
        if segment.duration >= min_duration_on
    )


def _pyannote_hook(progress: ProgressHook):
    """pyannote calls hook(step, artefact, file=..., total=..., completed=...); long steps
    report completed/total, the others once when done."""

    def hook(step_name: str, step_artefact: Any, file: Any = None, total=None, completed=None):
        if total is not None and completed is not None:
            # pyannote's segmentation counts whole batches, past the total on the last one.
            progress(f"diarize {step_name}", min(int(completed), int(total)), int(total))
        else:
            progress(f"diarize {step_name}", 1, 1)

    return hook
