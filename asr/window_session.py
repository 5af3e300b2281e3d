"""One recording's decoding session (`Session`): its mel and speech levels, prompts, window
decoding with temperature fallback and the hallucination guards, language detection and
switches, and how a decoded window splits into segments. `asr.seek_windows` and
`asr.silence_windows` lay out the windows it decodes."""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from asr.audio import SAMPLE_RATE
from asr.guards import REPEATED_SHARE, RepetitionGuard, drop_isolated_anomalies, words_of
from asr.languages import LANGUAGES
from asr.logit_rules import LogitRules
from asr.passages import plan_passages
from asr.segments import WindowSplit, has_content, split_segments
from asr.silence import (
    ONSET_MARGIN_FRAMES,
    chunk_window,
    first_loud_frame,
    loud_frames,
    loudness,
)
from asr.speech_timeline import SpeechTimeline
from asr.spoken_languages import before_another_language, sot_logits
from asr.transcribe_options import TranscribeOptions
from asr.types import DecidedWindow, Segment, WindowHook, Word
from asr.whisper import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    TIME_PRECISION,
    EncodedAudio,
    WhisperModel,
)
from asr.whisper_drafters import DraftSource
from asr.whisper_target import LanguageOdds, language_odds
from asr.window_decoder import WindowBatch, WindowDecoder, WindowResult, compression_ratio
from asr.window_journal import WindowJournal, window_key
from asr.word_timing import add_word_timestamps
from decoding import DecodeStats, LookaheadPolicy, device_clock

if TYPE_CHECKING:  # a passage is read, never made, here
    from asr.seek_windows import Passage


# Tokens a cut through hotwords too long for a prompt may move back to fall before a word.
HOTWORD_CUT_REACH = 32


# A window whose text ends this long before its audio, louder audio following, has its tail
# decoded again (`skipped_tail`).
MIN_TAIL_SECONDS = 2
MIN_TAIL_FRAMES = round(MIN_TAIL_SECONDS * FRAMES_PER_SECOND)
# The same for a `batch_size` chunk cut inside speech (`split_at_silence`'s quietest moment,
# not a long pause or the recording's end): Whisper often leaves out a phrase the cut
# clipped, and the next chunk starts after it (AMI: "instead of having too many buttons",
# 1.8 s before a cut, was lost).
MIN_TAIL_SECONDS_AT_A_CUT = 1
# A window whose text jumps over this much loud audio between two segments is cut at the
# jump, the next window starting there (`Session._before_skipped_speech`).
MIN_SKIPPED_SECONDS = 5


def detect_language(model: WhisperModel, encoded: EncodedAudio, row: int = 0) -> str:
    """The most probable language token after <|startoftranscript|> in window `row` (a
    decoder call on that window alone, so a window's language does not depend on its batch)."""
    if not model.special.multilingual:
        return "en"
    probabilities = language_probabilities(model, encoded, row)
    return max(probabilities, key=probabilities.__getitem__)


def language_probabilities(model: WhisperModel, encoded: EncodedAudio, row: int = 0) -> dict:
    """Window `row`'s probability of each language (code -> probability, a softmax over the
    language tokens after <|startoftranscript|>, as `detect_language` reads them)."""
    languages = model.special.language_ids
    ids = torch.tensor(list(languages.values()), device=model.device)
    odds = sot_logits(model, encoded, row)[0].float()[ids].softmax(dim=-1).tolist()
    return dict(zip(languages, odds, strict=True))


# A recording's first window whose likeliest language scores under LANGUAGE_SURE does not
# decide alone (faster-whisper's language_detection_threshold is the same 0.5): the next
# windows, up to LANGUAGE_WINDOWS in all, are heard too, and the language with the highest
# mean probability over them is the recording's. 24 s of reversed speech before JFK read
# as Welsh (0.29 against English's 0.42 over the first 30 s), and JFK was transcribed in
# Welsh; whisper-base's first windows of clean speech score 0.95 and more.
LANGUAGE_SURE = 0.5
LANGUAGE_WINDOWS = 4


def _odds_alone(
    model: WhisperModel, encoded: EncodedAudio, language: str, row: int = 0
) -> LanguageOdds:
    """Window `row`'s `LanguageOdds` against `language`, read at <|startoftranscript|> with no
    prompt before it (a prompt sways them toward its own language)."""
    named = torch.tensor([model.special.language_ids[language]])
    (odds,) = language_odds(model, sot_logits(model, encoded, row), named)
    return odds


# A language option the speech plainly is not: Whisper then translates into the named
# language or spells the speech out in its script, so the user is told. On whisper-base's first
# windows of 174 real recordings (../shared/speech, 125 of them non-native English read by
# Mandarin speakers) the language spoken scored 0.0096 at the least (another: 0.90) and
# another language led in 22; named wrongly, a clean reading's named language scores 1e-6 to
# 1e-3, a short utterance's about 1e-3 (JFK, English at 0.96, read as German: 0.002).
MISNAMED_LANGUAGE_PROBABILITY = 0.95  # the language heard, at least
NAMED_LANGUAGE_PROBABILITY = 0.005  # the language named, at most


# A prompted window's language less probable than this is read again without its prompt (in
# one language, a prompted window's own scored 0.63 at the least, on AMI meeting speech).
SWAYED_NAMED_PROBABILITY = 0.9


def misnamed_language(odds: LanguageOdds, task: str = "transcribe") -> str | None:
    """A warning when a window's speech is plainly not in the language it was decoded in (the
    odds above), else None. task: what Whisper does with it (translating from a language the
    speech is not in, it translated a Spanish "middle grain" as "the grass is medium")."""
    if (
        odds.heard == odds.named
        or odds.heard_probability < MISNAMED_LANGUAGE_PROBABILITY
        or odds.named_probability > NAMED_LANGUAGE_PROBABILITY
    ):
        return None
    heard, named = LANGUAGES[odds.heard].title(), LANGUAGES[odds.named].title()
    return (
        f"the speech sounds like {heard} ({odds.heard}, p={odds.heard_probability:.2f}), not "
        f"{named} ({odds.named}, p={odds.named_probability:.3f}) as the language option says: "
        + (
            f"Whisper then translates it as if it were {named}"
            if task == "translate"
            else "Whisper then translates or transliterates it"
        )
        + "; leave the language out to detect it"
    )


def is_silent(result: WindowResult, options: TranscribeOptions) -> bool:
    return (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and (options.logprob_threshold is None or result.avg_logprob < options.logprob_threshold)
    )


def _needs_fallback(result: WindowResult, options: TranscribeOptions) -> bool:
    if is_silent(result, options):
        return False  # a silent window is skipped, whatever its text
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and result.compression_ratio > options.compression_ratio_threshold
    )
    too_improbable = (
        options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold
    )
    return too_repetitive or too_improbable


def _most_probable_of_failed(
    results: list[WindowResult],
    options: TranscribeOptions,
    segment_texts: Callable[[WindowResult], list[TimedText]] | None = None,
) -> WindowResult:
    """The window's text where every temperature failed the checks (`results`, coolest
    first): the one with the highest average log-probability among those not too repetitive,
    else among all, as faster-whisper chooses. OpenAI keeps the last, hottest sample, which on
    noise or a window that really repeats itself is often text in another script or language
    that the model itself finds improbable; the chosen text is the model's best guess, and
    no prompt carries it on when the schedule went past 0.5 (`prompt_temperature`).

    Speech said again and again fails the repetition check however it is transcribed, and the
    texts that pass it are then samples the model finds improbable: a sentence said four times
    kept once, seven times garbled ("who buddhadnice behind the curtain", -2.7 against the
    greedy text's -0.14). So a probable text whose repetition is timed (`_timed_repeats`:
    segments by its timestamps, none a loop of its own; `segment_texts` gives them) is kept
    over those, where it is clearly speech (`_clearly_speech`); among such texts, the least
    repetitive ones (within SAME_REPETITION of the least) and of those the most probable: a
    loop that says the sentence more often than the audio does compresses better. Only where
    the coolest text is such a text itself: over English speech decoded as Spanish, the 0.2
    sample looped "así me falo americanas," 8 times (the greedy text looped "lo" inside one
    segment), and over 27 s of reversed speech the 0.4 sample "I am not afraid of the sun."
    22 times, once a second (greedy: two improbable lines), each kept in place of the
    window's speech."""
    limit = options.compression_ratio_threshold
    plain = [r for r in results if limit is None or r.compression_ratio <= limit]
    said_again = (
        [
            r
            for r in results
            if r.compression_ratio > limit
            and _clearly_speech(r, options)
            and _timed_repeats(segment_texts(r), limit)
        ]
        if limit is not None and segment_texts is not None
        else []
    )
    if said_again and said_again[0] is not results[0]:
        # Speech said again is what the coolest decoding hears: where only hotter samples
        # repeat a line, the line is a loop of theirs (see the docstring).
        said_again = []
    if said_again:
        least = min(r.compression_ratio for r in said_again)
        plain = [r for r in said_again if r.compression_ratio <= least * SAME_REPETITION]
    best = max(plain or results, key=lambda result: result.avg_logprob)  # ties: the coolest
    return replace(best, fallback_exhausted_at=results[-1].temperature)


def _said_again_over(
    failed: list[WindowResult],
    passed: WindowResult,
    options: TranscribeOptions,
    segment_texts: Callable[[WindowResult], list[TimedText]],
) -> WindowResult:
    """`passed`, a hotter sample that passed the checks after cooler ones failed (`failed`,
    coolest first), unless the greedy text failed only for repeating itself, is speech said
    again as `_most_probable_of_failed` keeps it (`segment_texts` gives its segments), and is
    SAID_AGAIN_MARGIN or more more probable: then the greedy text. A sentence said three
    times in a row came out twice, as the 0.8 sample that dropped a copy (and misheard words:
    "brophales") passed the compression check at -0.50 a token, where the greedy text was
    right at -0.11."""
    limit = options.compression_ratio_threshold
    if not failed or limit is None or failed[0].temperature > 0:
        return passed
    greedy = failed[0]
    if (
        greedy.avg_logprob < passed.avg_logprob + SAID_AGAIN_MARGIN
        or not _clearly_speech(greedy, options)
        or not _timed_repeats(segment_texts(greedy), limit)
    ):
        return passed
    return greedy


# How much more probable (average log-probability a token) the greedy text said again must be
# than the sample that passed for it to be kept (`_said_again_over`): its sample lost a copy
# of the sentence at -0.50 against -0.11.
SAID_AGAIN_MARGIN = 0.3


# A text said again is kept over improbable ones only where its average log-probability is
# at least this share of `logprob_threshold` (-0.5 for -1) and its window's no-speech
# probability under this share of `no_speech_threshold` (0.3 for 0.6): sentences said four
# and seven times scored -0.14 to -0.24 at 0.01 to 0.07, while over reversed speech 40 dB
# down Whisper looped "and the top" every 2 s (-0.86, 0.36) and "Have a good day." every
# second (-0.20, 0.54).
CLEAR_SHARE = 0.5


def _clearly_speech(result: WindowResult, options: TranscribeOptions) -> bool:
    """Whether a window's text is clearly probable and its audio clearly speech (CLEAR_SHARE
    of the thresholds; a threshold turned off asks nothing)."""
    floor, silent = options.logprob_threshold, options.no_speech_threshold
    return (floor is None or result.avg_logprob >= floor * CLEAR_SHARE) and (
        silent is None or result.no_speech_prob < silent * CLEAR_SHARE
    )


# Texts whose compression ratios are this close (10 %) repeat alike; one more repeat of a
# sentence said four times raises the ratio by about a fifth.
SAME_REPETITION = 1.1


# A segment's text and the seconds its timestamps give it.
TimedText = tuple[str, float]


def _timed_repeats(segments: list[TimedText], limit: float) -> bool:
    """Whether a window's segments (cut at its timestamps) are repetition timed as speech is:
    two segments or more, none too repetitive on its own (a loop inside one segment is no
    sentence said again), at no more than MAX_WORDS_PER_SECOND over their timed seconds."""
    words = sum(len(text.split()) for text, _ in segments)
    seconds = sum(length for _, length in segments)
    return (
        len(segments) >= 2
        and all(compression_ratio(text) <= limit for text, _ in segments)
        and words <= MAX_WORDS_PER_SECOND * seconds
    )


# Speech said again is said at a speaking rate (about 3 words a second; fast speech 5); a loop
# Whisper stamps at one-second steps is not: translating a German reading, it said an 11-word
# line in each second of the window's last 12 (compression ratio 10), and was kept as speech.
MAX_WORDS_PER_SECOND = 6


def _segment_texts(model: WhisperModel, result: WindowResult) -> list[TimedText]:
    """The window's text cut at every timestamp token: its segments' texts, each with the
    seconds from the timestamp before it to the one after (0 where none comes before)."""
    begin = model.special.timestamp_begin
    pieces: list[tuple[list[int], float | None]] = [([], None)]
    segments: list[TimedText] = []
    for token in result.tokens:
        if token < begin:
            pieces[-1][0].append(token)
            continue
        time = (token - begin) * TIME_PRECISION
        piece, start = pieces[-1]
        if piece:
            segments.append((model.text_of(piece), time - start if start is not None else 0.0))
        pieces.append(([], time))
    if pieces[-1][0]:  # unfinished: no timestamp after it
        segments.append((model.text_of(pieces[-1][0]), 0.0))
    return segments


@dataclass
class Ledger:
    """What decoding cost, shared by the recordings whose windows decode together."""

    stats: DecodeStats = field(default_factory=DecodeStats)
    recordings: int = 1  # how many recordings decoded side by side


@dataclass(frozen=True)
class _WindowsView:
    """What `Session.split` reads of these rows of `encoded`: called with indices into `rows`,
    those windows' rows, selected only when asked for. Selecting rows copies their
    cross-attention keys and values, 37 MB a window in float32 (290 MB with 8 passages side by
    side), which windows whose words are not timed never need; one window (`window`) is a
    view."""

    encoded: EncodedAudio
    rows: list[int]

    def __call__(self, indices: list[int]) -> EncodedAudio:
        picked = torch.tensor([self.rows[i] for i in indices], device=self.encoded.features.device)
        return self.encoded.rows(picked)

    def window(self, index: int) -> EncodedAudio:
        return self.encoded.row(self.rows[index])


class Session:
    """One recording's mel spectrograms, encoders, window decoder and running statistics."""

    def __init__(
        self,
        model: WhisperModel,
        samples: np.ndarray,
        options: TranscribeOptions,
        draft: DraftSource | None,
        policy: LookaheadPolicy | None,
        on_window: WindowHook | None = None,
        timeline: SpeechTimeline | None = None,
        resumptions: list[int] | None = None,
        recording_seconds: float | None = None,
        journal: WindowJournal | None = None,
    ) -> None:
        """journal: windows decoded by an earlier run of this recording, read back rather than
        decoded again, and this run's windows added (`asr.window_journal`)."""
        self.model, self.options, self.draft, self.policy = model, options, draft, policy
        self.journal = journal
        self.on_window = on_window
        self.timeline = timeline  # where the decoded spans lie in the recording (None: all)
        self.mel = model.log_mel(samples)  # shape = (n_mels, content frames + 3000)
        self.draft_mel = None
        if draft is not None and draft.needs_mel:
            same_mel = draft.model.n_mels == model.n_mels
            self.draft_mel = self.mel if same_mel else draft.model.log_mel(samples)
        self.content_frames = self.mel.shape[-1] - N_FRAMES
        # Samples where speech resumes after a long pause that was cut out -> passages. A
        # passage starts on the first frame at or after its first sample, so that its times
        # map back into its own span, not to the end of the span before the pause.
        cuts = [-(-sample // HOP_LENGTH) for sample in resumptions or ()]
        # Multilingual: no short passages packed into one window, so that speech after a long
        # pause (often another speaker) has its language detected from its own window.
        packing = N_FRAMES if options.pack_passages and not options.multilingual else 0
        self.passages = plan_passages(cuts, self.content_frames, packing)
        self.pause_cuts = cuts  # "silence" chunks are cut there too
        if timeline is not None:  # no time is placed across a passage's (or chunk's) start
            starts = cuts if options.windows == "silence" else [s for s, _ in self.passages]
            timeline = timeline.with_passage_starts([s / FRAMES_PER_SECOND for s in starts])
            self.timeline = timeline
        # where pauses were cut out of the decoded audio (word timing keeps words out of them)
        self.seam_silences = timeline.seam_silences() if timeline is not None else ()
        self.duration = len(samples) / SAMPLE_RATE  # of what is decoded
        # of the whole recording (`samples` may be its spans, laid end to end)
        self.recording_seconds = recording_seconds if recording_seconds else self.duration
        self.rules = LogitRules(model.special, model.suppress_tokens, timestamps=options.timestamps)
        self.language = options.language  # the first window's, once detected
        # A language the options name is checked on the first spoken window's odds.
        self._check_named_language = bool(
            options.language and not options.multilingual and model.special.multilingual
        )
        self.language_warnings: tuple[str, ...] = ()
        # Without `multilingual` every window is decoded in the recording's one language,
        # whatever it holds: windows plainly in another are counted, to tell the user.
        self._watch_language_switch = bool(
            options.task == "transcribe" and not options.multilingual and model.special.multilingual
        )
        self.switched_windows: list[tuple[float, LanguageOdds]] = []  # (start s, odds)
        self.checked_windows = 0  # decoded windows whose odds were looked at
        self.window_languages: Counter[str] = Counter()  # multilingual: windows per language
        # Tokens a prompt holds before its SOT sequence: half the context, <|startofprev|> aside.
        self.prompt_room = model.max_context // 2 - 1
        self.initial_prompt = self._tokens(options.initial_prompt)
        self.hotwords, self.prompt_warnings = self._fitted_hotwords(options.hotwords)
        self.prompt_warnings += self._initial_prompt_warnings(options.initial_prompt)
        self.dropped_repeats = 0
        self.reprompted = 0  # windows decoded again without previous text (repeats)
        self.dropped_anomalies = 0
        self.dropped_in_pauses = 0  # segments timed wholly inside a cut-out pause
        self.dropped_words_past_audio = 0  # words timed with no sound at the audio's end
        self.retimed_windows = 0  # windows whose segments took their words' times (late starts)
        self.resumed_windows = 0  # windows cut short at speech their text skipped
        self.language_windows = 0  # windows the language was detected over (`_first_language`)
        # multilingual: windows decoded again, or cut short, at a segment of another language
        self.language_switches = 0
        self._level: torch.Tensor | None = None  # `level`, computed on first use
        self.ledger = Ledger()  # shared with the recordings decoded beside this one
        self.encoder_seconds = 0.0
        self.word_seconds = 0.0
        self.last_speech = 0.0  # where the last timed word ended (s)
        self._encoded: dict = {}  # (windows, padded) -> EncodedAudio, encoded ahead of time

    def new_guard(self) -> RepetitionGuard | None:
        """A record of what was said, to catch repeats of it (None: the guard is off)."""
        ngram = self.options.repetition_ngram
        return RepetitionGuard(ngram) if ngram is not None else None

    def _fitted_hotwords(self, text: str | None) -> tuple[list[int], tuple[str, ...]]:
        """The hotwords' tokens that fit a prompt (half the context), cut before a word
        rather than inside one (a cut word is text Whisper goes on from), and a warning where
        some were left out."""
        tokens = self._tokens(text)
        room = self.prompt_room
        if len(tokens) <= room:
            return tokens, ()
        # Back to the start of the word that tokens[room] continues, within a long word's
        # reach; text without spaces between words (Chinese, Japanese) is cut where it fills.
        starts = [
            cut
            for cut in range(room, max(room - HOTWORD_CUT_REACH, 0), -1)
            if self.model.tokenizer.decode([tokens[cut]]).startswith(" ")
        ]
        cut = starts[0] if starts else room
        kept = self.model.tokenizer.decode(tokens[:cut])
        warning = (
            f"hotwords: only the first {len(kept.strip())} of {len(text.strip())} characters "
            f"fit the prompt ({room} tokens); the rest were left out"
        )
        return tokens[:cut], (warning,)

    def _initial_prompt_warnings(self, text: str | None) -> tuple[str, ...]:
        """A warning where the initial prompt is longer than the room `prompt` leaves it
        beside the hotwords: as any previous text, only its end is kept."""
        room = self.prompt_room - len(self.hotwords)
        if len(self.initial_prompt) <= room:
            return ()
        if room <= 0:
            return ("initial_prompt: the hotwords fill the prompt; it was left out",)
        kept = self.model.tokenizer.decode(self.initial_prompt[-room:]).strip()
        beside = " beside the hotwords" if self.hotwords else ""
        return (
            f"initial_prompt: only the last {len(kept)} of {len(text.strip())} characters "
            f"fit the prompt ({room} tokens{beside}); the start was left out",
        )

    def _tokens(self, text: str | None) -> list[int]:
        if not text or not text.strip():
            return []
        return self.model.tokenizer.encode_text(" " + text.strip())

    def encode(self, windows: list[tuple[int, int]], padded: bool) -> tuple[EncodedAudio, ...]:
        """The target's and the draft's views of frame ranges [start, end) (`view`), made
        when first read where a journal may hold their decoding (`encoded_when_needed`)."""
        if self.encoding_can_wait():
            return encoded_when_needed([(self, windows)], padded)
        return encode_together([(self, windows)], padded)

    def view(self, mel: torch.Tensor, window: tuple[int, int], padded: bool) -> torch.Tensor:
        """Frames [start, end) of `mel` padded with silence, or (not `padded`) the 30 s from
        start where that holds no audio past `end` but the recording's end (the mel ends with
        30 s of silence). Unpadded, a window that reaches the recording's end sees its 30 s of
        silence; one that ends earlier (a passage's last) must not see the next passage's
        audio."""
        start, end = window
        if padded or end < min(start + N_FRAMES, self.content_frames):
            return chunk_window(mel, start, end)
        return mel[:, start : start + N_FRAMES]

    def encode_target(self, windows: list[tuple[int, int]], padded: bool) -> EncodedAudio:
        """The target's view of these windows; the language, when it is still unknown, is
        detected from the earliest of them (the recording's first: a batch puts its longest
        window first, and a French sentence, a pause, then JFK came out in English alone and
        in French beside another file)."""
        started = device_clock(self.model.device)
        cached = self._encoded.pop((tuple(windows), padded), None)
        if cached is not None:
            return cached
        mel = torch.stack([self.view(self.mel, window, padded) for window in windows])
        encoded = self.model.cross_attention(self.model.encode(mel))
        self.encoder_seconds += device_clock(self.model.device) - started
        if self.language is None and not self.options.multilingual:  # else window_language
            earliest = min(range(len(windows)), key=lambda index: windows[index][0])
            self.language = self._first_language(encoded, earliest, windows[earliest][0])
        elif self._check_named_language and (self.initial_prompt or self.hotwords):
            # A prompt before <|startoftranscript|> sways the odds decoding reads there (a
            # German "Hallo" made JFK 0.88 English): asked without it, at one more call.
            self._settle_named_language(_odds_alone(self.model, encoded, self.options.language))
        return encoded

    def _first_language(self, encoded: EncodedAudio, row: int, start: int) -> str:
        """The recording's language, from its first window (row `row` of `encoded`, starting
        at frame `start`) and, where that one is unsure (`LANGUAGE_SURE`), the 30 s windows
        after it, encoded for this alone."""
        if not self.model.special.multilingual:
            return "en"
        heard = [language_probabilities(self.model, encoded, row)]
        mean = heard[0]
        while max(mean.values()) < LANGUAGE_SURE and len(heard) < LANGUAGE_WINDOWS:
            start += N_FRAMES
            if start >= self.content_frames:
                break
            window = (start, min(start + N_FRAMES, self.content_frames))
            started = device_clock(self.model.device)
            mel = self.view(self.mel, window, padded=True)[None]
            later = self.model.cross_attention(self.model.encode(mel))
            self.encoder_seconds += device_clock(self.model.device) - started
            heard.append(language_probabilities(self.model, later))
            mean = {code: sum(h[code] for h in heard) / len(heard) for code in heard[0]}
        self.language_windows = len(heard)
        return max(mean, key=mean.__getitem__)

    def encoding_can_wait(self) -> bool:
        """Whether this recording's windows may be encoded only when something reads them
        (`encoded_when_needed`): where its journal holds windows an earlier run decoded, and
        encoding would decide nothing else (the recording's language is known or is detected
        window by window; a named language's check is settled)."""
        journal = self.journal
        language_known = self.options.multilingual or self.language is not None
        return (
            journal is not None
            and journal.read_back < journal.kept  # some left to read back
            and language_known
            and not (self._check_named_language and (self.initial_prompt or self.hotwords))
        )

    def detect_language(self, window: tuple[int, int], padded: bool) -> str:
        """The language, detected from `window` when the options do not give it; that
        window's encoding is kept for the first `encode_target` that asks for it alone."""
        if self.language is None:
            self._encoded[((window,), padded)] = self.encode_target([window], padded)
        return self.language

    def window_language(
        self, encoded: EncodedAudio, row: int, kept: str | None = None
    ) -> str | None:
        """The language of window `row` of `encoded`, one of this recording's: with
        `multilingual`, detected from that window alone (and counted), else the recording's.
        kept: its passage's language so far, which a window too short to tell keeps
        (TOO_SHORT_TO_TELL)."""
        if not self.options.multilingual:
            return self.language
        if kept is not None:
            self.window_languages[kept] += 1
            return kept
        window = encoded.rows(torch.tensor([row], device=encoded.features.device))
        language = detect_language(self.model, window)
        self.window_languages[language] += 1
        if self.language is None:  # the recording's: its first window's
            self.language = language
        return language

    def retell(self, language: str | None) -> None:
        """A window decoded in `language` is decoded again in the language its first segment
        was heard in: counted once, in that one (`window_languages`)."""
        self.window_languages[language] -= 1
        self.window_languages += Counter()  # drops a count of 0

    def prompt(self, previous: list[int], language: str | None = None) -> tuple[int, ...]:
        """[<|startofprev|>, hotwords, previous text] (at most half the context), SOT sequence
        in `language` (default: the recording's)."""
        room = self.prompt_room
        hotwords = self.hotwords[:room]
        room -= len(hotwords)
        context = hotwords + (previous[-room:] if room > 0 else [])
        language = language or self.language
        sot = self.model.sot_sequence(language, self.options.task, self.options.timestamps)
        return tuple(([self.model.special.sot_prev, *context] if context else []) + sot)

    def decode(
        self,
        batch: WindowBatch,
        seeds: list[int],
        guards: list[RepetitionGuard | None],
        owners: list[Session] | None = None,
        language: str | None = None,
    ) -> list[WindowResult]:
        """Each window at the first temperature whose result passes the checks; where none
        does, the most probable of them (`_most_probable_of_failed`).

        Greedy passes decode the batch at once, drafted when there is a draft. Sampled passes
        decode one window at a time with its own seed and without the draft: speculative
        sampling would draw from the same distribution but consume the random stream
        differently, so a window that falls back would get another sample than without a draft.
        Plain sampling keeps the whole transcript the same with and without one, and its text
        never depends on other windows.

        A window whose first pass repeats earlier text (`asr.guards`), or with `multilingual`
        sounds silent (`_silenced_by_prompt`), and was prompted with previous text is decoded
        again at once without it (the prompt is what Whisper copies, or what silenced it);
        the checks above then go on from that result. A repeat left after that is dropped when
        the window is split, not sampled away: where speech really repeats, sampling only
        trades the right words for worse ones. guards: each window's record of what was said
        before it (None: the guard is off); owners: each window's recording, where windows
        of several decode together (default: this one), which must share its options, draft and
        policy; language: the windows' (default: the recording's), which their prompts end in.
        """
        options = self.options
        language = language or self.language
        decoder = WindowDecoder(
            self.model,
            self.rules,
            language,
            options.task,
            options.max_new_tokens,
            self.draft,
            self.policy,
            beam=options.beam,
            best_of=options.best_of,
        )
        plain = replace(decoder, draft=None, policy=None)
        bare = self.prompt([], language)
        results: list[WindowResult | None] = [None] * len(batch.prompts)
        failed: list[list[WindowResult]] = [[] for _ in batch.prompts]
        for temperature in options.temperatures:
            first = temperature == options.temperatures[0]
            pending = [row for row, result in enumerate(results) if result is None]
            groups = [pending] if temperature == 0 else [[row] for row in pending]
            for rows in groups:
                chosen = decoder if temperature == 0 else plain
                seed = seeds[rows[0]]
                decoded = dict(
                    zip(
                        rows, self._run(chosen, batch, rows, temperature, seed, owners), strict=True
                    )
                )
                echoes = [
                    row
                    for row in rows
                    if first
                    and batch.prompts[row] != bare
                    and (
                        self._repeats(decoded[row], guards[row])
                        or self._silenced_by_prompt(decoded[row])
                    )
                ]
                if echoes:
                    prompts = [bare if r in echoes else p for r, p in enumerate(batch.prompts)]
                    batch = replace(batch, prompts=tuple(prompts))
                    again = self._run(chosen, batch, echoes, temperature, seeds[echoes[0]], owners)
                    decoded.update(zip(echoes, again, strict=True))
                    for row in echoes:
                        (owners[row] if owners is not None else self).reprompted += 1
                for row, result in decoded.items():
                    result = replace(result, prompted=batch.prompts[row] != bare)
                    (owners[row] if owners is not None else self).check_language(result)
                    if not _needs_fallback(result, options):
                        results[row] = _said_again_over(
                            failed[row],
                            result,
                            options,
                            functools.partial(_segment_texts, self.model),
                        )
                        continue
                    failed[row].append(result)
                    if temperature == options.temperatures[-1]:
                        alone = self._without_hotwords(decoder, batch, row, seeds, owners)
                        if alone and (not _needs_fallback(alone, options)):
                            results[row] = alone
                            continue
                        results[row] = _most_probable_of_failed(
                            failed[row], options, functools.partial(_segment_texts, self.model)
                        )
            if all(result is not None for result in results):
                break
        return [self._unswayed(batch, row, result) for row, result in enumerate(results)]

    def _without_hotwords(
        self,
        decoder: WindowDecoder,
        batch: WindowBatch,
        row: int,
        seeds: list[int],
        owners: list[Session] | None = None,
    ) -> WindowResult | None:
        """A window that failed at every temperature with the hotwords in its prompt, decoded
        greedily without them (its previous text kept), or None where it had none. Words
        Whisper does not hear in the window can lead it astray: 17 s of the MFA reading clipped
        from 3 s (mid-word) with the hotwords "Montreal aligner" came out "the here.", each
        window failing (a token -1.4, then -1.6 at 0.2), and its text was complete without them.
        Where the window passes without them it is taken; otherwise the most probable of the
        prompted passes stays."""
        prompt = batch.prompts[row]
        hotwords = tuple(self.hotwords)
        if not hotwords or prompt[1 : 1 + len(hotwords)] != hotwords:
            return None
        rest = prompt[1 + len(hotwords) :]
        bare = rest if rest[:1] == (self.model.special.sot,) else (prompt[0], *rest)
        alone = replace(batch, prompts=(*batch.prompts[:row], bare, *batch.prompts[row + 1 :]))
        (result,) = self._run(decoder, alone, [row], 0.0, seeds[row], owners)
        return replace(result, prompted=bare[:1] != (self.model.special.sot,))

    def _unswayed(self, batch: WindowBatch, row: int, result: WindowResult) -> WindowResult:
        """A prompted window whose odds lean away from its language, or that sounded silent in
        it, with the odds read again without its prompt: previous text in the recording's
        language sways them toward it (German read after an English window: English at 0.034
        prompted, 0.0011 alone; English after German: German at 0.44, and a window of English
        decoded as German came out "silent"), and `misnamed_language`'s thresholds hold for
        windows read alone. One decoder call, only for such windows."""
        odds = result.language_odds
        if not (
            self._watch_language_switch
            and result.prompted
            and odds is not None
            and (
                odds.named_probability < SWAYED_NAMED_PROBABILITY or is_silent(result, self.options)
            )
        ):
            return result
        return replace(
            result, language_odds=_odds_alone(self.model, batch.encoded, odds.named, row)
        )

    def check_language(self, result: WindowResult) -> None:
        """Checks a named language once, on the first spoken window whose odds are known."""
        odds = result.language_odds
        if self._check_named_language and odds is not None and not is_silent(result, self.options):
            self._settle_named_language(odds)

    def _settle_named_language(self, odds: LanguageOdds) -> None:
        """The named language's one check, on these odds: a warning where it is plainly not."""
        self._check_named_language = False
        warning = misnamed_language(odds, self.options.task)
        self.language_warnings = (warning,) if warning else ()

    def note_language_switch(self, result: WindowResult, start: float) -> None:
        """Counts a decoded window, spoken or silent, and notes it where its speech is plainly
        not the language it was decoded in (`misnamed_language`'s odds). start: where its
        speech starts (s, on the decoded audio's timeline). The window the language was
        detected from never differs from it (the same odds)."""
        self.checked_windows += 1
        odds = result.language_odds
        if not self._watch_language_switch or odds is None or misnamed_language(odds) is None:
            return
        if self.timeline is not None:
            start = self.timeline.original(start)
        self.switched_windows.append((start, odds))

    def language_switch_warning(self) -> str | None:
        """A warning where windows were plainly in another language than the recording's,
        from the earliest of them (None where none were, or where the named language was
        already found wrong: `misnamed_language`)."""
        if not self.switched_windows or self.language_warnings:
            return None
        start, odds = min(self.switched_windows, key=lambda switched: switched[0])
        minutes, seconds = divmod(int(start), 60)
        heard, named = LANGUAGES[odds.heard].title(), LANGUAGES[odds.named].title()
        return (
            f"from {minutes}:{seconds:02d} the speech sounds like {heard} ({odds.heard}, "
            f"p={odds.heard_probability:.2f}) in {len(self.switched_windows)} of "
            f"{self.checked_windows} windows, but the recording is transcribed in {named} "
            f"({odds.named}): Whisper translates such speech or leaves it out; --multilingual "
            "(the API's multilingual) transcribes each passage in its own language"
        )

    def _run(
        self,
        decoder: WindowDecoder,
        batch: WindowBatch,
        rows: list[int],
        temperature: float,
        seed: int,
        owners: list[Session] | None = None,
    ) -> list[WindowResult]:
        """These rows of the batch, decoded at one temperature; rows whose recording's journal
        holds them are read back from it, and the others recorded in their recording's.
        owners: each row's recording (`decode`'s; default: this one)."""
        results: dict[int, WindowResult] = {}
        keys = {}
        journals = {row: (owners[row] if owners is not None else self).journal for row in rows}
        if batch.windows is not None:
            # A greedy batch is called with its first row's seed, which decides nothing.
            seeded = seed if temperature > 0 else 0
            for row in (row for row in rows if journals[row] is not None):
                key = window_key(
                    batch.windows[row], batch.prompts[row], decoder.language, temperature, seeded
                )
                keys[row] = key
                if (kept := journals[row].result(key)) is not None:
                    results[row] = kept
        if pending := [row for row in rows if row not in results]:
            subset = batch if len(pending) == len(batch.prompts) else batch.rows(pending)
            decoded, stats = decoder.decode(subset, temperature, seed)
            self.ledger.stats = self.ledger.stats + stats
            for row, result in zip(pending, decoded, strict=True):
                results[row] = result
                if row in keys:
                    journals[row].record(keys[row], result)
        return [results[row] for row in rows]

    def _silenced_by_prompt(self, result: WindowResult) -> bool:
        """Whether a prompted window that sounds silent may be speech its prompt silenced, and
        is decoded again without it (`decode`'s echoes). With `multilingual` the previous text
        may be in another language than the window: after JFK's English, told again from his
        window, a Spanish speaker's 7 s that overlapped his last second scored as no speech
        prompted (0.63, its text -1.06 a token) and were dropped; alone they are Spanish.
        Windows of one language are left to OpenAI's rule, prompted, as before."""
        return self.options.multilingual and is_silent(result, self.options)

    def _repeats(self, result: WindowResult, guard: RepetitionGuard | None) -> bool:
        """Whether a segment of the window repeats text that `guard` has seen."""
        if guard is None:
            return False
        texts = [text for text, _ in _segment_texts(self.model, result)]
        return any(guard.repeated_share(text) >= REPEATED_SHARE for text in texts)

    def words_view(self, encoded: EncodedAudio, rows: list[int]) -> _WindowsView:
        """What `split` reads of these rows of `encoded` (`_WindowsView`)."""
        return _WindowsView(encoded, rows)

    @property
    def level(self) -> torch.Tensor:
        """The recording's loudness per mel frame (`asr.silence.loudness`): where a window
        holds speech its text never reached (a skipped tail, a jump), it tells where that
        speech starts."""
        if self._level is None:
            self._level = loudness(self.mel, self.content_frames)
        return self._level

    def split(
        self,
        encoded: _WindowsView,
        decoded: list[tuple[WindowResult, int, int]],
        unfinished: bool,
        guards: list[RepetitionGuard | None],
        passages: list[Passage] | None = None,
        languages: list[str | None] | None = None,
        told: list[bool] | None = None,
    ) -> list[WindowSplit]:
        """Spoken windows -> their segments, timed word by word when the options ask for it.

        decoded: per window, its result, first frame and content frames; `encoded`: the
        target's encoding of these windows (`words_view`), read where words are timed and
        where segments' languages are told. guards: each window's record of what was said (its
        passage's, or its stretch's between long pauses). passages: each window's passage, for
        windows of independent passages side by side: no time of a window runs past its
        passage's end, and each reads (and moves on) where its own passage's speech last ended.
        None: the windows follow each other in the recording. languages: each window's (default: the
        recording's). told: with `multilingual`, each window whose language was not told from
        the whole window (heard in its first segment's own audio, `WindowSplit.language_after`,
        or kept from the audio before it), whose first segment is then not asked again.

        With `multilingual`, a window's text stops before its first segment heard in another
        language (`asr.spoken_languages`), before its words are timed or its guard records
        them: that audio is decoded again in its own language, and the text in the wrong one
        must leave no trace (a guard that had recorded JFK's sentence, decoded as English under
        a Spanish window, dropped it as a repeat when its own window said it again).
        """
        languages = languages or [self.language] * len(decoded)
        if passages is None:
            ends = [self.duration] * len(decoded)
        else:  # a passage that runs to the recording's end ends with its last sample
            ends = [
                p.end / FRAMES_PER_SECOND if p.end < self.content_frames else self.duration
                for p in passages
            ]
        splits = [
            split_segments(
                self.model, result, start / FRAMES_PER_SECOND, frames, end, unfinished, language
            )
            for (result, start, frames), end, language in zip(decoded, ends, languages, strict=True)
        ]
        if self.options.multilingual and self.model.special.multilingual:
            told = told or [False] * len(splits)
            splits = [
                before_another_language(
                    self.model, encoded.window(index), split, language, from_first=not given
                )
                if language is not None
                else split
                for index, (split, language, given) in enumerate(
                    zip(splits, languages, told, strict=True)
                )
            ]
            self.language_switches += sum(split.language_after is not None for split in splits)
        if splits and not self.options.word_timestamps:
            splits = self._late_starts_retimed(encoded, splits, languages, ends)
        if self.options.word_timestamps and splits:
            started = time.perf_counter()
            encoded = encoded(list(range(len(splits))))
            if passages is None:
                before = [self.last_speech] * len(splits)
                splits, self.last_speech = add_word_timestamps(
                    self.model,
                    encoded,
                    splits,
                    languages,
                    self.options.task,
                    self.duration,
                    self.last_speech,
                    self.seam_silences,
                )
            else:
                before = [p.last_speech for p in passages]
                splits, _ = add_word_timestamps(
                    self.model,
                    encoded,
                    splits,
                    languages,
                    self.options.task,
                    ends,
                    before,
                    self.seam_silences,
                )
                for passage, split in zip(passages, splits, strict=True):
                    word_ends = [s.words[-1].end for s in split.segments if s.words]
                    passage.last_speech = word_ends[-1] if word_ends else passage.last_speech
            self.word_seconds += time.perf_counter() - started
            splits = [
                self._without_words_past_the_audio(split, end)
                for split, end in zip(splits, ends, strict=True)
            ]
            threshold = self.options.hallucination_silence_threshold
            if threshold is not None:
                splits = [
                    self._without_anomalies(split, threshold, last)
                    for split, last in zip(splits, before, strict=True)
                ]
        if self.options.word_timestamps and self.seam_silences:
            splits = [self._without_text_in_pauses(split) for split in splits]
        if not unfinished:  # sequential windows: the next one can start at skipped speech
            splits = [
                self._before_skipped_speech(split, start, frames)
                for split, (_, start, frames) in zip(splits, decoded, strict=True)
            ]
            if not self.options.word_timestamps:
                splits = self._resumed_before_unsaid_words(encoded, splits, languages, ends)
        return [
            self._without_repeats(split, guard, result.prompted)
            for split, guard, (result, _, _) in zip(splits, guards, decoded, strict=True)
        ]

    def _before_skipped_speech(self, split: WindowSplit, start: int, frames: int) -> WindowSplit:
        """`split` up to the first gap of MIN_SKIPPED_SECONDS or more between its segments
        where the audio is loud, the next window starting there; else `split` itself.

        Whisper can jump over speech inside a window: its timestamps go from one segment to a
        later one, and OpenAI's seek moves past both, so the words between are lost for good.
        A window of German, English and French speech decoded with --language en gave the
        German and the French, and the 11 s of English between them vanished without a
        warning. Decoded from where that speech begins, the window after it hears it first.
        A gap counts only where its audio reaches the window's median level
        (`first_loud_frame`) MIN_TAIL_SECONDS or more before the next segment starts. Shorter
        gaps are left as Whisper timed them: in an AMI meeting's overlapped speech a segment
        began 2 s after the one before it ended, crosstalk filling the gap, and decoding from
        there only changed the words around it."""
        content = [i for i, segment in enumerate(split.segments) if has_content(segment)]
        for before, after in itertools.pairwise(content):
            earlier, later = split.segments[before], split.segments[after]
            gap_start = max(split.timestamp_ends[before], earlier.end)
            if later.start - gap_start < MIN_SKIPPED_SECONDS:
                continue
            gap = (round(gap_start * FRAMES_PER_SECOND), round(later.start * FRAMES_PER_SECOND))
            loud = first_loud_frame(self.level, (start, start + frames), gap[0])
            if loud is None or loud + MIN_TAIL_SECONDS * FRAMES_PER_SECOND > gap[1]:
                continue
            resume = max(loud - ONSET_MARGIN_FRAMES, gap[0])
            self.resumed_windows += 1
            return replace(
                split,
                segments=split.segments[: before + 1],
                tokens=split.tokens[: before + 1],
                timestamp_ends=split.timestamp_ends[: before + 1],
                consumed=resume - start,
                single_timestamp_ending=True,  # nothing unfinished: go on from `resume`
                language_after=None,  # a segment heard in another language is decoded again
            )
        return split

    def skipped_before_first_segment(
        self, split: WindowSplit, start: int, frames: int
    ) -> int | None:
        """The frame where a sequential window's first segment starts when Whisper skipped
        loud audio before it (MIN_SKIPPED_SECONDS or more of window, MIN_TAIL_SECONDS of them
        at the window's median level), or None. Whisper times a
        window's first text from 1 s at the latest, so a start that late is one word timing
        found (`_late_starts_retimed`, or word timestamps): in a reading joined from clips, a
        window over 17 s of spoken commands ("Repeat. Yes. Start. ...") gave only the speech
        after them, JFK's sentence, timed from the window's start, and the commands were lost.
        The caller decodes the audio before that frame apart (`asr.seek_windows`)."""
        said = segments_with_content(split)
        if not said:
            return None
        first = round(said[0].start * FRAMES_PER_SECOND)
        if first - start < MIN_SKIPPED_SECONDS * FRAMES_PER_SECOND or first >= start + frames:
            return None
        # Loud for MIN_TAIL_SECONDS in all, not only from that long before: a window that
        # begins on the last word of the text before (transcribed already) then holds a pause
        # is no skipped speech, and decoded apart the pause made Whisper say "He was a very
        # serious person." twice.
        loud = loud_frames(self.level, (start, start + frames), (start, first))
        if int(loud.sum()) < MIN_TAIL_SECONDS * FRAMES_PER_SECOND:
            return None
        self.resumed_windows += 1
        return first

    def _late_starts_retimed(
        self,
        encoded: Callable[[list[int]], EncodedAudio],
        splits: list[WindowSplit],
        languages: list[str | None],
        ends: list[float],
    ) -> list[WindowSplit]:
        """Windows with a segment that lasts far longer than its text could be spoken in get
        their segments' times from their words (timed, then dropped: not asked for).

        Whisper's first timestamp of a window is at most 1 s (OpenAI's rules), so speech after
        a long silence at a window's start, as `--no-vad` decodes it, began at 0:00 in every
        output (20 s of silence then JFK: a subtitle 0:00-0:29 for words spoken from 0:20).
        Word timing finds where the words are; windows without such a segment cost nothing.
        """
        eot = self.model.special.eot
        late = [index for index, split in enumerate(splits) if _outlasts_its_text(split, eot)]
        if not late or not self.model.alignment_heads:  # a model without: as Whisper timed it
            return splits
        timed = self._words_timed_for_times(encoded, splits, languages, ends, late)
        splits = list(splits)
        for index, retimed in zip(late, timed, strict=True):
            segments = tuple(
                _narrowed(segment, new)
                for segment, new in zip(splits[index].segments, retimed.segments, strict=True)
            )
            splits[index] = replace(splits[index], segments=segments)
        self.retimed_windows += len(late)
        return splits

    def _words_timed_for_times(
        self,
        encoded: Callable[[list[int]], EncodedAudio],
        splits: list[WindowSplit],
        languages: list[str | None],
        ends: list[float],
        indices: list[int],
    ) -> list[WindowSplit]:
        """Windows `indices` of `splits` with their words timed where only the times are read
        (no probabilities), each window on its own (no speech before it, in the window); the
        time is counted in `word_seconds`."""
        started = time.perf_counter()
        timed, _ = add_word_timestamps(
            self.model,
            encoded(indices),
            [splits[index] for index in indices],
            [languages[index] for index in indices],
            self.options.task,
            [ends[index] for index in indices],
            [splits[index].time_offset for index in indices],
            self.seam_silences,
            probabilities=False,
        )
        self.word_seconds += time.perf_counter() - started
        return timed

    def _resumed_before_unsaid_words(
        self,
        encoded: Callable[[list[int]], EncodedAudio],
        splits: list[WindowSplit],
        languages: list[str | None],
        ends: list[float],
    ) -> list[WindowSplit]:
        """Sequential windows whose next window would start inside their audio, after words
        their text does not say, get it to start where their text's last word ends (timed,
        then dropped: not asked for), as OpenAI's seek does with word timestamps.

        Whisper's last timestamp can come late (whisper-base in int8 times whole seconds): a
        window's text ended at "printing." timed to 81.0 s, where it was said by 79.9 s, and
        "the earliest" in between was in neither window. Only windows whose text stops inside
        their audio are timed (in continuous speech, most windows but a passage's last), and
        only those with `MIN_UNSAID_FRAMES` of loud audio between their last word and that
        timestamp move (`last_word_before_unsaid_speech`). The whole window's words are
        timed: the last segment's alone, aligned over the audio around it, once put a single
        "Yes." on the one said a second before it, and the window after said it again."""
        inside = [
            index
            for index, split in enumerate(splits)
            if split.consumed < split.frames
            and split.language_after is None
            and any(segment.text.strip() for segment in split.segments)
        ]
        if not inside or not self.model.alignment_heads:
            return splits
        timed = self._words_timed_for_times(encoded, splits, languages, ends, inside)
        splits = list(splits)
        for index, words in zip(inside, timed, strict=True):
            split = splits[index]
            said = [i for i, segment in enumerate(words.segments) if segment.words]
            if not said:
                continue
            start = round(split.time_offset * FRAMES_PER_SECOND)
            word_end = round(words.segments[said[-1]].words[-1].end * FRAMES_PER_SECOND)
            frame = last_word_before_unsaid_speech(split, word_end, self.level, start)
            if frame is None:
                continue
            segments = list(split.segments)  # the last ends where the next window starts
            last = segments[said[-1]]
            if last.start < frame / FRAMES_PER_SECOND < last.end:
                segments[said[-1]] = replace(last, end=frame / FRAMES_PER_SECOND)
            splits[index] = replace(
                split, segments=tuple(segments), consumed=frame - start, resumed_early=True
            )
            self.resumed_windows += 1
        return splits

    def _without_words_past_the_audio(self, split: WindowSplit, end: float) -> WindowSplit:
        """`without_words_past_the_audio`, counted."""
        split, dropped = without_words_past_the_audio(split, end)
        self.dropped_words_past_audio += dropped
        return split

    def _without_text_in_pauses(self, split: WindowSplit) -> WindowSplit:
        """The split without segments whose words are timed wholly inside the silence of a
        cut-out pause (`seam_silences`): voice activity found no speech there, so their text
        is Whisper's own (in overlapped speech a sentence was said again into the pause after
        it, timed there, then put on the next speaker's turn at zero length)."""
        keep = [not _inside_pause(segment, self.seam_silences) for segment in split.segments]
        self.dropped_in_pauses += keep.count(False)
        return _select(split, keep)

    def _without_anomalies(
        self, split: WindowSplit, threshold: float, last_speech: float
    ) -> WindowSplit:
        window = (split.time_offset, split.time_offset + split.frames / FRAMES_PER_SECOND)
        kept = drop_isolated_anomalies(list(split.segments), threshold, window, last_speech)
        keep = [segment in kept for segment in split.segments]
        self.dropped_anomalies += keep.count(False)
        return _select(split, keep)

    def _without_repeats(
        self, split: WindowSplit, guard: RepetitionGuard | None, prompted: bool
    ) -> WindowSplit:
        """The split without segments that repeat text `guard` has seen, where its window was
        decoded with earlier text in the prompt (a repeat left after the re-prompt, as a
        sampled fallback can copy the prompt); what stays is recorded as said. A window
        decoded without earlier text says what its audio says, even where that is a repeat:
        speech said again (a chorus, a line read twice) is kept."""
        if guard is None:
            return split
        keep = [not (prompted and guard.repeats(segment)) for segment in split.segments]
        self.dropped_repeats += keep.count(False)
        split = _select(split, keep)
        guard.add(segment.text for segment in split.segments if has_content(segment))
        return split

    def report(self, result: WindowResult, seek: int, split: WindowSplit) -> None:
        """Hands a decided window's kept segments to `on_window`, if there is one. Called once
        for each spoken window, in time order."""
        spoken = segments_with_content(split)
        self.note_language_switch(result, spoken[0].start if spoken else seek / FRAMES_PER_SECOND)
        if self.on_window is None:
            return
        pairs = [
            (s, t) for s, t in zip(split.segments, split.tokens, strict=True) if has_content(s)
        ]
        segments = [s for s, _ in pairs]
        if self.timeline is not None:  # times on the recording's own timeline, as returned
            segments = self.timeline.restore(segments)
            seek = round(self.timeline.original(seek / FRAMES_PER_SECOND) * FRAMES_PER_SECOND)
        self.on_window(
            DecidedWindow(
                seek=seek,
                temperature=result.temperature,
                compression_ratio=result.compression_ratio,
                segments=tuple(segments),
                tokens=tuple(t for _, t in pairs),
            )
        )


def encode_together(
    pieces: list[tuple[Session, list[tuple[int, int]]]], padded: bool
) -> tuple[EncodedAudio, EncodedAudio | None]:
    """The target's and the draft's views of windows of one or more recordings, as one batch
    in the order given. Each recording's windows are encoded from its own mel (`view`); the
    draft sees the whole batch, cut to the longest audio among its windows."""
    parts = (session.encode_target(w, padded) for session, w in pieces)  # each when joined
    encoded = EncodedAudio.joined(parts, sum(len(w) for _, w in pieces))
    lead = pieces[0][0]
    if lead.draft is None:
        return encoded, None
    started = device_clock(lead.model.device)
    draft_mel = None
    if lead.draft_mel is not None:
        draft_mel = torch.stack(
            [s.view(s.draft_mel, window, padded) for s, windows in pieces for window in windows]
        )
    # Mel frames of audio in the longest window -> encoder frames (two mel frames each).
    audio = max(audio_frames(s, window) for s, windows in pieces for window in windows)
    draft_encoded = lead.draft.encode(encoded, draft_mel, -(-audio // 2))
    elapsed, windows = device_clock(lead.model.device) - started, sum(len(w) for _, w in pieces)
    for session, session_windows in pieces:  # each recording its share of the batch's
        session.encoder_seconds += elapsed * len(session_windows) / windows
    return encoded, draft_encoded


# Words timed with no length this close to where a window's audio ends (s) are words the
# alignment found no sound for; this many or more at a window's end are Whisper's own.
PAST_THE_AUDIO_SECONDS = 0.05
MIN_WORDS_PAST_THE_AUDIO = 2


def _past_the_audio(word: Word, end: float) -> bool:
    return word.end - word.start <= 0.0 and word.start >= end - PAST_THE_AUDIO_SECONDS


def without_words_past_the_audio(split: WindowSplit, end: float) -> tuple[WindowSplit, int]:
    """The split without the words at its end that word timing found no sound for, and how
    many went: where a recording stops mid-sentence, Whisper may go on with words of its own,
    which the alignment stacks at the audio's end with no length (LJ001's clips with pauses
    between them: "and it was natural therefore that the name of the book is a way of life.",
    the audio ending at "therefore"). MIN_WORDS_PAST_THE_AUDIO or more such words are left
    out (one may be a word the recording cut off); a segment left with none goes. end: where
    the split's audio ends (s)."""
    segments, dropped = list(split.segments), 0
    while segments and segments[-1].words:
        words = segments[-1].words
        past = 0
        while past < len(words) and _past_the_audio(words[-1 - past], end):
            past += 1
        if past == len(words):
            dropped += past
            segments.pop()
            continue
        if past >= MIN_WORDS_PAST_THE_AUDIO or (dropped and past):
            dropped += past
            kept = words[:-past]
            text = "".join(word.text for word in kept)
            cut = replace(segments[-1], words=kept, text=text, end=kept[-1].end, tokens=())
            segments[-1] = cut  # no tokens: its window's hold the words left out
        break
    if dropped < MIN_WORDS_PAST_THE_AUDIO:
        return split, 0
    kept = _select(split, [index < len(segments) for index in range(len(split.segments))])
    return replace(kept, segments=tuple(segments)), dropped


def encoded_when_needed(
    pieces: list[tuple[Session, list[tuple[int, int]]]], padded: bool
) -> tuple[EncodedAudio, EncodedAudio | None]:
    """`encode_together`'s views, encoded when first used rather than now, for windows whose
    decoding a journal may hold (`asr.window_journal`): where every result is read back and no
    word is timed, the encoder never runs. Only for sessions whose encoding has no side effect
    left to give (`Session.encoding_can_wait`)."""
    made: list[tuple[EncodedAudio, EncodedAudio | None]] = []

    def views() -> tuple[EncodedAudio, EncodedAudio | None]:
        if not made:
            made.append(encode_together(pieces, padded))
        return made[0]

    draft = None if pieces[0][0].draft is None else _EncodedOnFirstUse(lambda: views()[1])
    return _EncodedOnFirstUse(lambda: views()[0]), draft  # type: ignore[return-value]


class _EncodedOnFirstUse:
    """Stands for an EncodedAudio made on first use: any attribute read makes it."""

    def __init__(self, make: Callable[[], EncodedAudio | None]) -> None:
        self._make = make

    def __getattr__(self, name: str):
        return getattr(self._make(), name)


def _select(split: WindowSplit, keep: list[bool]) -> WindowSplit:
    """The split with only the segments (and their tokens) where `keep` is True."""
    if all(keep):
        return split
    parts = zip(split.segments, split.tokens, split.timestamp_ends, strict=True)
    kept = [part for part, keeps in zip(parts, keep, strict=True) if keeps]
    return replace(
        split,
        segments=tuple(segment for segment, _, _ in kept),
        tokens=tuple(tokens for _, tokens, _ in kept),
        timestamp_ends=tuple(end for _, _, end in kept),
    )


# Times within this much of a cut-out pause's edges count as inside it (word timing puts a
# word it finds no sound for at the pause's edge).
PAUSE_EDGE_SECONDS = 0.02


def _inside_pause(segment: Segment, pauses: tuple[tuple[float, float], ...]) -> bool:
    """Whether a segment with timed words lies wholly inside one of these (start, end)
    silences. Only timed words tell: a segment's own timestamps may fall early into a pause
    before speech (Whisper's starts do, by a few hundred ms)."""
    return bool(segment.words) and any(
        start - PAUSE_EDGE_SECONDS <= segment.start and segment.end <= end + PAUSE_EDGE_SECONDS
        for start, end in pauses
    )


def segments_with_content(split: WindowSplit) -> list[Segment]:
    """A window's segments that stay in the transcript."""
    return [s for s in split.segments if has_content(s)]


def window_context(split: WindowSplit) -> list[int]:
    """What a window adds to the next prompt (OpenAI's all_tokens): its kept segments' tokens.
    The unfinished text after its last complete segment is not among them: the next window
    decodes that audio again, and must not find it in its prompt as already said."""
    pairs = zip(split.segments, split.tokens, strict=True)
    return [token for segment, tokens in pairs if has_content(segment) for token in tokens]


def consumed_frames(split: WindowSplit, seek: int, total: int, word_timestamps: bool) -> int:
    """Frames a sequential window used up. OpenAI: when its text does not end in a single
    timestamp and words are timed, the next window starts at the last word's end (not at the
    last timestamp, nor after the whole window). Unlike OpenAI, a window that used all its
    frames up to the end of the recording keeps them: its text runs to the end, and decoding
    the last second again only invites a repeat of the prompt."""
    frames = split.frames
    reaches_the_end = split.consumed == frames and seek + frames >= total
    if word_timestamps and not split.single_timestamp_ending and not reaches_the_end:
        ends = [s.words[-1].end for s in split.segments if s.words]
        if ends and ends[-1] > seek / FRAMES_PER_SECOND:
            return min(round(ends[-1] * FRAMES_PER_SECOND) - seek, frames)
    return split.consumed


def last_word_before_unsaid_speech(
    split: WindowSplit, word_end: int, level: torch.Tensor, start: int
) -> int | None:
    """`word_end`, the frame where a sequential window's text's last word ends (`start`: the
    window's first frame), where `MIN_UNSAID_FRAMES` or more of loud audio (`loud_frames`, at
    the window's median level) lie between that word's end, past `WORD_FADE_FRAMES`, and
    where the window's text stops (`split.consumed`); else None. Word timing ends a word where
    its sound fades, often well before the timestamp, so a short loud stretch there is the
    last word ringing out, not words left unsaid."""
    stop = start + split.consumed
    if not start < word_end < stop - WORD_FADE_FRAMES - MIN_UNSAID_FRAMES:
        return None
    window = (start, start + split.frames)
    unsaid = loud_frames(level, window, (word_end + WORD_FADE_FRAMES, stop))
    return word_end if int(unsaid.sum()) >= MIN_UNSAID_FRAMES else None


# `last_word_before_unsaid_speech`: loud audio a window's text left out before its last
# timestamp (0.3 s: "the earliest" took 0.67 s), counted from 0.1 s after its last word's end.
MIN_UNSAID_FRAMES = 30
WORD_FADE_FRAMES = 10


# A multilingual passage's window after its first with less audio than this (mel frames: 5 s)
# keeps the passage's language: Whisper tells a language poorly from a few seconds, and a
# passage's last window is often its speech's last second and the pause after it (detected
# alone, a Spanish speaker's tail came out as an English "y").
TOO_SHORT_TO_TELL = 500


# start (s), may be the last words before it heard again (`Resumption.without_echo`).
MAX_ECHO_SECONDS = 1.5
MAX_ECHO_DELAY = 0.3
MAX_ECHO_WORDS = 3


@dataclass(frozen=True)
class Resumption:
    """A passage's next window, resumed at `frame` after a window whose text closed early
    (`skipped_tail`), and that window's last text."""

    frame: int
    text_before: str

    def without_echo(self, split: WindowSplit) -> WindowSplit:
        """`split` (the resumed window's) with its first segment emptied where it repeats the
        end of the text before: a window resumed inside the last word hears it again. Without
        word timestamps the text's end is its last timestamp, which can come before the word
        falls silent: JFK's closing "country." ends 0.4 s after its 10.0 s timestamp, in noise
        as loud as speech, and the next window began with "country." again."""
        content = [i for i, segment in enumerate(split.segments) if has_content(segment)]
        if not content:
            return split
        first = split.segments[content[0]]
        echoed = words_of(first.text)
        if not (
            0 < len(echoed) <= MAX_ECHO_WORDS
            and first.start - self.frame / FRAMES_PER_SECOND <= MAX_ECHO_DELAY
            and first.end - first.start <= MAX_ECHO_SECONDS
            and words_of(self.text_before)[-len(echoed) :] == echoed
        ):
            return split
        segments = list(split.segments)
        segments[content[0]] = replace(first, text="", words=())
        return replace(split, segments=tuple(segments))


def audio_frames(session: Session, window: tuple[int, int]) -> int:
    """Mel frames of the recording's audio in the window (the rest is padding)."""
    start, end = window
    return min(end, session.content_frames) - start


# A segment lasting longer than this plus this much a text token is taken for one whose start
# Whisper could not place (`Session._late_starts_retimed`). Speech runs at 2-5 tokens a second
# in English (JFK's slow delivery: about 2), a token a syllable or a character where there are
# no spaces (Japanese, Chinese: 4-8 characters a second), so only a silence of several seconds
# inside the segment reaches the bound. At 1 s a token JFK's sentence timed over 29 s (26
# tokens, 17 s of other speech skipped before it) stayed under it.
LATE_START_SLACK = 4.0  # seconds
LATE_START_PER_TOKEN = 0.7  # seconds


def _narrowed(segment: Segment, timed: Segment) -> Segment:
    """`segment` over the part of its span where its words are (`timed`: the same segment timed
    word by word): a start only later, an end only earlier, so it never runs into its
    neighbours' times, which stay as they were."""
    start, end = max(segment.start, timed.start), min(segment.end, timed.end)
    return replace(segment, start=start, end=end) if start < end else segment


def _outlasts_its_text(split: WindowSplit, eot: int) -> bool:
    """Whether a segment of this window lasts far longer than its text (its tokens below `eot`,
    the text tokens) could be spoken in."""
    return any(
        _outlasts(segment.end - segment.start, tokens, eot)
        for segment, tokens in zip(split.segments, split.tokens, strict=True)
    )


def _outlasts(seconds: float, tokens: Sequence[int], eot: int) -> bool:
    """Whether `seconds` is far longer than these tokens' text could be spoken in."""
    return seconds > LATE_START_SLACK + LATE_START_PER_TOKEN * sum(1 for t in tokens if t < eot)


def decode_by_language(
    batch: WindowBatch,
    languages: list[str | None],
    seeds: list[int],
    guards: list[RepetitionGuard | None],
    owners: list[Session],
) -> list[WindowResult]:
    """`Session.decode` of a batch whose windows may differ in language (`multilingual`):
    the windows of each language decode as one batch (a batch's prompts end in one SOT
    sequence). A window decodes the same in any batch, so the split changes no result."""
    results: list[WindowResult | None] = [None] * len(languages)
    for language in dict.fromkeys(languages):
        rows = [row for row, code in enumerate(languages) if code == language]
        part = batch if len(rows) == len(languages) else batch.rows(rows)
        decoded = owners[rows[0]].decode(
            part,
            seeds=[seeds[row] for row in rows],
            guards=[guards[row] for row in rows],
            owners=[owners[row] for row in rows],
            language=language,
        )
        for row, result in zip(rows, decoded, strict=True):
            results[row] = result
    return results


def speech_onset(level: torch.Tensor, window: tuple[int, int], frame: int) -> int:
    """Where speech resumes in `window` from `frame` on: just before its first loud frame
    (`first_loud_frame`), or `frame` itself where none is. The audio after a language switch
    is decoded from there, not from the pause before it, where Whisper is prone to invent
    words."""
    loud = first_loud_frame(level, window, frame)
    return frame if loud is None else max(loud - ONSET_MARGIN_FRAMES, frame)


def speech_after_a_seam(
    seam_silences: Sequence[tuple[float, float]], after: int, end: int
) -> int | None:
    """The first frame in (after, end) where a span starts after a cut-out pause (the end of
    a seam silence, in seconds of the decoded audio), or None."""
    for _, resumed in seam_silences:
        frame = round(resumed * FRAMES_PER_SECOND)
        if after < frame < end:
            return frame
    return None


def skipped_tail(
    split: WindowSplit, start: int, frames: int, eot: int, least: float = MIN_TAIL_SECONDS
) -> int | None:
    """First frame of audio after a window's text when that text ends at least `least`
    seconds before the window's audio does, or None. Where the text ends is its last
    timestamp (unfinished text already runs to the window's end), or its last word's end where
    that is later. Not the word's end alone: word timing ends a word where its sound fades,
    often a second before the timestamp, and that gap is no skipped speech (decoded again, it
    made Whisper say "Thank you."). But words timed past the timestamp are speech transcribed
    there (in overlapped speech a sentence's timestamps ended 2 s before its words did, and the
    "tail" decoded again repeated the sentence). A segment whose timestamps last far longer than
    its text (`_outlasts`: JFK's closing "country." timed over the 13 s of a reading 30 dB
    quieter after it, which was lost) ends where its words do (its end narrowed to them)."""
    ends = []
    for segment, tokens, end in zip(
        split.segments, split.tokens, split.timestamp_ends, strict=True
    ):
        if not has_content(segment):
            continue
        spoken_end = segment.words[-1].end if segment.words else segment.end
        if _outlasts(end - segment.start, tokens, eot):
            ends.append(spoken_end)
        else:
            ends.append(max(end, spoken_end) if segment.words else end)
    if not ends:
        return None
    tail = round(ends[-1] * FRAMES_PER_SECOND)
    if start < tail <= start + frames - least * FRAMES_PER_SECOND:
        return tail
    return None
