"""Long-form transcription: 30 s windows, decoded plainly or speculatively, -> Transcript.

Two ways to lay out windows (`TranscribeOptions.windows`):
- "seek" follows OpenAI's transcribe(): each window is decoded with the previous window's text
  as a prompt, split into segments at its timestamp pairs, and the next window starts at the
  last complete segment's end. Windows depend on each other, so they decode one at a time.
- "silence" cuts the recording at its quietest points into independent chunks of at most 30 s
  (`asr.silence`), which decode `batch_size` at a time; text after a chunk's last complete
  segment ends with the chunk, and a chunk whose text stops seconds before its audio does has
  that loud tail decoded as one more window.
A draft changes how many target calls a window takes, never its tokens.

With `word_timestamps`, every decided window gets one more decoder pass for its words'
times (`asr.word_timing`); segment times follow the words and, as in OpenAI's transcribe, a
sequential window that ends unfinished hands over at its last word's end.

`spans` (speech regions from `asr.vad`, clip ranges, or both) restricts decoding to parts of
the recording, laid end to end (`asr.speech_timeline`); times come back on the recording's own
timeline. The hallucination guards (`asr.guards`) act on decided text only.

This module is the entry (options checked, recordings prepared, transcripts assembled);
`asr.window_session` decodes and splits a recording's windows, `asr.seek_windows` and
`asr.silence_windows` lay them out, `asr.transcribe_options` holds the options.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from asr.audio import SAMPLE_RATE
from asr.seek_windows import seek_windows
from asr.silence_windows import silence_windows
from asr.speech_timeline import SEAM_PAUSE, Span, SpeechTimeline
from asr.transcribe_options import TranscribeOptions
from asr.types import ProgressHook, Segment, Transcript, WindowHook, no_progress
from asr.whisper import WhisperModel
from asr.whisper_drafters import DraftSource
from asr.window_decoder import WindowResult, compression_ratio
from asr.window_journal import WindowJournal
from asr.window_session import Ledger, Session, detect_language
from decoding import LookaheadPolicy

__all__ = [
    "Recording",
    "TranscribeOptions",
    "WindowResult",
    "compression_ratio",
    "detect_language",
    "transcribe",
    "transcribe_many",
]


@dataclass(frozen=True)
class Recording:
    """One recording for `transcribe_many`: float32 mono 16 kHz samples, shape =
    (n_samples,), and the (start, end) seconds to decode (None: all of it), as `transcribe`
    takes them."""

    samples: np.ndarray
    spans: tuple[Span, ...] | None = None
    # Seconds where a new speaker's turn starts (`diarize.language_turns`): with
    # `multilingual`, each starts a passage, whose language is detected from it.
    turn_starts: tuple[float, ...] = ()
    # Seconds where a passage starts however short the pause before it: the clip ranges'
    # starts, so that each range decodes in windows of its own, as OpenAI's clip_timestamps
    # does (joined across a short gap, Whisper read one range's words into the other's).
    passage_starts: tuple[float, ...] = ()


def transcribe(
    model: WhisperModel,
    samples: np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    progress: ProgressHook = no_progress,
    draft: DraftSource | None = None,
    policy: LookaheadPolicy | None = None,
    on_window: WindowHook | None = None,
    spans: tuple[Span, ...] | None = None,
    turn_starts: tuple[float, ...] = (),
    passage_starts: tuple[float, ...] = (),
    journal: WindowJournal | None = None,
) -> Transcript:
    """samples: float32 mono 16 kHz, shape = (n_samples,).

    spans: decode only these (start, end) seconds of the recording (speech regions, clip
    ranges); None decodes all of it. No span at all gives an empty transcript with a warning.
    turn_starts: seconds where a new speaker starts (`Recording.turn_starts`).
    passage_starts: seconds where a passage starts whatever the pause before it
    (`Recording.passage_starts`: the clip ranges' starts).

    draft: a draft paired with `model` (`asr.whisper_drafters.pair_draft`) or prompt lookup
    (`LookupDraft`); policy: its draft-length policy for the whole recording (default: the
    draft's `default_policy()`: blocks of 3 for a distilled draft, else decoding.Adaptive).
    on_window: called with each window's kept segments as soon as they are decided (a server
    streams them): in time order for "seek" windows; a "silence" chunk's tail may come after a
    later chunk. The returned Transcript holds the same segments, sorted.
    journal: the windows an earlier run of this recording with these options decoded, read
    back rather than decoded again; each window decoded now is added to it
    (`asr.window_journal`: the transcript is the one an uninterrupted run gives).
    """
    recording = Recording(samples, spans, turn_starts, passage_starts)
    (transcript,) = _transcribe(
        [recording], options, model, progress, draft, policy, on_window, [journal]
    )
    return transcript


def transcribe_many(
    model: WhisperModel,
    recordings: list[Recording],
    options: TranscribeOptions = TranscribeOptions(),
    progress: ProgressHook = no_progress,
    draft: DraftSource | None = None,
    policy: LookaheadPolicy | None = None,
    journals: Sequence[WindowJournal | None] | None = None,
) -> list[Transcript]:
    """Several recordings with the same options, one Transcript each, in order; each is the
    transcript `transcribe` gives it alone (its windows, text and times: a window decodes the
    same whatever else is in its batch).

    With "seek" windows their windows decode side by side, as a recording's passages do (up to
    PASSAGES_PER_PASS at a time, recordings of one language together): a short recording is one
    window, and one decoder call serves several of them for little more than the price of one.
    Their transcripts then report the decoding costs of the whole group (target and draft
    calls, tokens, seconds), with `decoded_together` the number of recordings in it.
    ("silence" windows decode one recording at a time.) Without `options.language`, each
    recording's language is detected from its first window.

    journals: each recording's, or None (`transcribe`'s `journal`): a window of a recording
    decodes the same beside any others, so what one run recorded of it side by side is read
    back by a run that decodes it beside others or alone.
    """
    if journals is not None and len(journals) != len(recordings):
        raise ValueError(f"{len(journals)} journals for {len(recordings)} recordings")
    return _transcribe(recordings, options, model, progress, draft, policy, None, journals)


def _transcribe(
    recordings: list[Recording],
    options: TranscribeOptions,
    model: WhisperModel,
    progress: ProgressHook,
    draft: DraftSource | None,
    policy: LookaheadPolicy | None,
    on_window: WindowHook | None,
    journals: Sequence[WindowJournal | None] | None = None,
) -> list[Transcript]:
    """journals: each recording's, or None (`transcribe_many`)."""
    # 1. Check the request; mel spectrograms for the target and a draft that needs its own.
    options.validate(model)
    if draft is not None and draft.target is not model:
        raise ValueError(
            f"draft {draft.name} was paired with {draft.target.name}, not with {model.name}"
        )
    if draft is not None and policy is None:
        policy = draft.default_policy()  # one for the whole run: Adaptive learns the pair
    started = time.perf_counter()
    journals = journals if journals is not None else [None] * len(recordings)
    prepared = [
        _prepare(model, recording, options, draft, policy, on_window, journal)
        for recording, journal in zip(recordings, journals, strict=True)
    ]
    sessions = [session for session in prepared if isinstance(session, Session)]

    # 2. Decode every window, then put times back on each recording's timeline.
    progress("transcribe", 0, sum(session.content_frames for session in sessions))
    if options.windows == "seek" and sessions:
        ledger = Ledger(recordings=len(sessions))
        for session in sessions:
            session.ledger = ledger
        decoded = seek_windows(sessions, progress)
        finished = [
            _finished(session, segments, started)
            for session, segments in zip(sessions, decoded, strict=True)
        ]
    else:  # one recording after another, each timed on its own
        finished = []
        for session in sessions:
            session_started = started if len(sessions) == 1 else time.perf_counter()
            segments = silence_windows(session, progress)
            finished.append(_finished(session, segments, session_started))
    done = iter(finished)
    return [session if isinstance(session, Transcript) else next(done) for session in prepared]


def _prepare(
    model: WhisperModel,
    recording: Recording,
    options: TranscribeOptions,
    draft: DraftSource | None,
    policy: LookaheadPolicy | None,
    on_window: WindowHook | None,
    journal: WindowJournal | None = None,
) -> Session | Transcript:
    """A recording's decoding session, or its (empty) transcript when it has nothing to decode."""
    samples = recording.samples
    duration = len(samples) / SAMPLE_RATE
    timeline = None
    if recording.spans is not None:
        timeline = SpeechTimeline(tuple(recording.spans), SEAM_PAUSE).bounded(duration)
    if timeline is not None and not timeline.spans:
        return Transcript(
            segments=(),
            language=options.language or "en",
            duration=round(duration, 3),
            options=asdict(options),
            stats={
                "speech_seconds": 0.0,
                **(
                    {"window_languages": {}, "language_switches": 0} if options.multilingual else {}
                ),
                "total_seconds": 0.0,
            },
            warnings=("no speech found: nothing was decoded",),
        )
    decoded = samples if timeline is None else timeline.compact(samples)
    resumptions = None
    if timeline is not None and options.passage_pause is not None:
        resumptions = timeline.resumptions(len(samples), options.passage_pause)
    # Each speaker's language is detected from their own speech (diarize.language_turns).
    turn_starts = recording.turn_starts if options.multilingual else ()
    if turn_starts or recording.passage_starts:
        starts = [round(s * SAMPLE_RATE) for s in (*turn_starts, *recording.passage_starts)]
        if timeline is not None:
            starts = [timeline.compacted_sample(sample, len(samples)) for sample in starts]
        inside = {start for start in starts if 0 < start < len(decoded)}
        resumptions = sorted(inside.union(resumptions or ()))
    return Session(
        model, decoded, options, draft, policy, on_window, timeline, resumptions, duration, journal
    )


def _segments(count: int) -> str:
    return f"{count} segment{'s' if count != 1 else ''}"


def _dropped_warnings(session: Session) -> tuple[str, ...]:
    """What the hallucination guards left out, said where the user reads warnings: a dropped
    segment may be speech that really repeats itself (a chorus, a reading said twice)."""
    warnings = []
    if session.dropped_repeats:
        ngram = session.options.repetition_ngram
        warnings.append(
            f"{_segments(session.dropped_repeats)} left out: they repeated earlier text that "
            f"their prompt held (repetition n-gram {ngram}; 0 keeps them)"
        )
    if session.dropped_in_pauses:
        warnings.append(
            f"{_segments(session.dropped_in_pauses)} left out: timed inside a pause where voice "
            "activity detection found no speech (text Whisper repeated or made up)"
        )
    if session.dropped_words_past_audio:
        count = session.dropped_words_past_audio
        warnings.append(
            f"{count} word{'s' if count != 1 else ''} left out where the audio ends: word "
            "timing found no sound for them (text Whisper went on with past the speech)"
        )
    if session.dropped_anomalies:
        threshold = session.options.hallucination_silence_threshold
        warnings.append(
            f"{_segments(session.dropped_anomalies)} left out as text hallucinated in a pause "
            f"(hallucination silence threshold {threshold:g} s)"
        )
    return tuple(warnings)


def _journal_stats(session: Session) -> dict:
    """How many windows' decoder results were read back from an interrupted run's journal."""
    journal = session.journal
    return {} if journal is None else {"journal_windows": journal.read_back}


def _finished(session: Session, segments: list[Segment], started: float) -> Transcript:
    """A decoded recording's transcript: times on its own timeline, options, costs."""
    if session.timeline is not None:
        segments = session.timeline.restore(segments)
    stats = session.ledger.stats
    language = session.language or "en"  # its first window's
    if session.options.multilingual and segments:  # its first words' (a window told again)
        language = min(segments, key=lambda s: s.start).language or language
    together = {"decoded_together": session.ledger.recordings}
    languages = {
        "window_languages": dict(session.window_languages.most_common()),
        "language_switches": session.language_switches,
    }
    return Transcript(
        warnings=session.prompt_warnings
        + session.language_warnings
        + tuple(filter(None, [session.language_switch_warning()]))
        + _dropped_warnings(session),
        segments=tuple(segments),
        language=language,
        duration=round(session.recording_seconds, 3),
        options=asdict(session.options),
        stats={
            "speech_seconds": round(session.duration, 3),
            "passages": len(session.passages),
            **(together if session.ledger.recordings > 1 else {}),
            **(languages if session.options.multilingual else {}),
            "reprompted_windows": session.reprompted,
            "dropped_repeats": session.dropped_repeats,
            "dropped_anomalies": session.dropped_anomalies,
            "dropped_in_pauses": session.dropped_in_pauses,
            "dropped_words_past_audio": session.dropped_words_past_audio,
            "retimed_windows": session.retimed_windows,
            "resumed_windows": session.resumed_windows,
            "language_windows": session.language_windows,  # 0: the language was given
            **_journal_stats(session),
            "beam_size": session.options.beam_size,  # 1: greedy
            "best_of": session.options.best_of,
            "target_calls": stats.target_calls,
            "draft_calls": stats.draft_calls,
            "generated_tokens": stats.generated_tokens,
            "tokens_per_target_call": round(stats.tokens_per_target_call, 3),
            "accepted_histogram": list(stats.accepted_histogram),
            "encoder_seconds": round(session.encoder_seconds, 3),
            "word_timing_seconds": round(session.word_seconds, 3),
            "draft_seconds": round(stats.draft_seconds, 3),
            "verify_seconds": round(stats.verify_seconds, 3),
            "total_seconds": round(time.perf_counter() - started, 3),
            "threads": torch.get_num_threads(),  # the CPU threads the models computed on
        },
    )
