"""Word timestamps from the cross-attention of Whisper's alignment heads (OpenAI's algorithm).

After a window's tokens are decided, one more decoder pass reads [SOT sequence,
<|notimestamps|>, text tokens, <|endoftext|>] against the window's encoder output. The
cross-attention of the alignment heads (generation_config.alignment_heads: the heads whose
attention follows the audio) over the window's content frames is normalised (softmax over
frames, standardised over tokens, median filter over frames), averaged over the heads, and
dynamic time warping finds the cheapest monotonic token -> frame path through -weights. A token
starts at the frame where the path first reaches it; a word starts with its first token and ends
where the next word starts. The decoding itself never sees this pass, so plain and speculative
decoding give the same tokens, and therefore the same words.

Deliberate differences from openai/whisper: words are split and punctuation merged within each
segment, never across a segment boundary (so a segment's words always concatenate to its
text), and a segment is widened to cover its words where OpenAI's boundary heuristics move a
word past the segment's edge.
"""

from __future__ import annotations

import functools
import itertools
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from asr.segments import WindowSplit
from asr.types import Segment, Word
from asr.whisper import TIME_PRECISION, EncodedAudio, WhisperModel

MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MAX_MEDIAN_DURATION = 0.7  # s: words longer than twice the median (at most this) are suspect
# Written without spaces between words: split wherever a token completes a character.
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
REPLACEMENT = "\ufffd"


# -- the alignment path ---------------------------------------------------------------------


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` from (0, 0) to (n - 1, m - 1).

    cost: shape = (n, m), e.g. n tokens by m frames. Each step moves one row down, one column
    right, or both; ties prefer a column step, then a row step (OpenAI's order, so paths
    match its `dtw_cpu`). Returns (rows, columns), each shape = (path length,).

    Cells of one anti-diagonal depend only on the two before it, so each diagonal is computed
    at once: `acc[d, i]` is the accumulated cost of cell (i, d - i) with a border of infinite
    cost in row and column 0.
    """
    n, m = cost.shape
    if n == 0 or m == 0:
        raise ValueError(f"dtw needs a non-empty cost matrix, not shape {cost.shape}")
    diagonals = n + m + 1
    acc = np.full((diagonals, n + 1), np.inf)
    step = np.zeros((diagonals, n + 1), dtype=np.int8)  # 0 diagonal, 1 row (up), 2 column (left)
    acc[0, 0] = 0.0
    for d in range(2, diagonals):
        rows = np.arange(max(1, d - m), min(n, d - 1) + 1)
        if rows.size == 0:
            continue
        diagonal = acc[d - 2, rows - 1]  # (i - 1, j - 1)
        up = acc[d - 1, rows - 1]  # (i - 1, j)
        left = acc[d - 1, rows]  # (i, j - 1)
        take_diagonal = (diagonal < up) & (diagonal < left)
        take_up = ~take_diagonal & (up < diagonal) & (up < left)
        choice = np.where(take_diagonal, 0, np.where(take_up, 1, 2))
        best = np.where(take_diagonal, diagonal, np.where(take_up, up, left))
        acc[d, rows] = cost[rows - 1, d - rows - 1] + best
        step[d, rows] = choice

    path = []
    i, j = n, m
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        move = 2 if i == 0 else 1 if j == 0 else step[i + j, i]
        if move == 0:
            i, j = i - 1, j - 1
        elif move == 1:
            i -= 1
        else:
            j -= 1
    rows_taken, columns_taken = np.array(path[::-1]).T
    return rows_taken, columns_taken


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd `width` along the last dimension, reflect-padded;
    shape kept. Inputs no wider than width // 2 come back unchanged (reflection needs more).

    The middle element is selected by a sorting network pruned to that output
    (`_median_network`): elementwise minima and maxima over `width` shifted views, a fifth of
    the time of sorting every window (20 against 100 ms for a 30 s window's alignment heads on
    this CPU), and the same values, ties included. Inputs with NaN or infinities are sorted
    (sort() orders NaN last; minimum() would spread it)."""
    if width < 1 or width % 2 == 0:
        raise ValueError(f"median filter width must be a positive odd number, not {width}")
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])
    padded = torch.nn.functional.pad(flat, (pad, pad), mode="reflect")
    if not bool(torch.isfinite(padded).all()):
        # sort() is faster than median() here, and takes the same (lower) middle element.
        return padded.unfold(-1, width, 1).sort(dim=-1).values[..., pad].reshape(shape)
    views = [padded[:, 0, i : i + shape[-1]] for i in range(width)]
    for low, high, keep_min, keep_max in _median_network(width):
        a, b = views[low], views[high]
        if keep_min:
            views[low] = torch.minimum(a, b)
        if keep_max:
            views[high] = torch.maximum(a, b)
    return views[pad].reshape(shape)


@functools.cache
def _median_network(width: int) -> tuple[tuple[int, int, bool, bool], ...]:
    """Odd-even transposition sort of `width` wires (`width` rounds of neighbour swaps: a
    sorting network), less the comparators the middle wire does not depend on: (low wire,
    high wire, whether the minimum is needed, whether the maximum is)."""
    network = [(i, i + 1) for round_ in range(width) for i in range(round_ % 2, width - 1, 2)]
    needed = {width // 2}
    kept = []
    for low, high in reversed(network):
        if low in needed or high in needed:
            kept.append((low, high, low in needed, high in needed))
            needed |= {low, high}
    return tuple(reversed(kept))


def alignment_matrix(scores: torch.Tensor, median_width: int = MEDIAN_FILTER_WIDTH) -> torch.Tensor:
    """scores: Tensor, shape = (heads, tokens, frames), query.key / sqrt(head_dim) over the
    window's content frames -> Tensor, shape = (tokens, frames), larger where a token is heard.

    Softmax over frames, then per head and frame standardised over the tokens (so a frame every
    token attends to stops standing out), smoothed over frames, averaged over heads.
    """
    weights = scores.float().softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = (weights - mean) / std
    return median_filter(weights, median_width).mean(dim=0)


@dataclass(frozen=True)
class TokenTimes:
    """Where each text token of a window is heard, from one alignment pass.

    starts: shape = (n_text + 1,), seconds from the window's start; token k spans
    [starts[k], starts[k + 1]] and starts[n_text] is where <|endoftext|> is predicted.
    probabilities: shape = (n_text,), each token's probability given the SOT sequence and the
    tokens before it (text vocabulary only, as OpenAI); NaN where they were not asked for.
    """

    starts: np.ndarray
    probabilities: np.ndarray


def align_tokens(
    model: WhisperModel,
    encoded: EncodedAudio,
    texts: Sequence[Sequence[int]],
    frames: Sequence[int],
    language: str | Sequence[str | None] | None,
    task: str,
    probabilities: bool = True,
) -> list[TokenTimes]:
    """One batched decoder pass over every window's text; rows of `encoded` match `texts`.

    texts: per window, its text tokens (no special tokens), at least one each.
    frames: per window, its content frames (mel frames, 100 per second); attention to the
    padding after them is ignored. language: the windows', or one per window (a
    multilingual recording's windows side by side). probabilities: False where the words'
    times alone are wanted (each window's text through the output head costs about a third
    of the alignment).
    """
    if not model.alignment_heads:
        raise ValueError(f"model {model.name} has no alignment_heads in its generation_config")
    if len(texts) != len(frames) or len(texts) != encoded.features.shape[0]:
        raise ValueError("align_tokens needs one text and one frame count per encoded window")
    eot = model.special.eot
    languages = per_window(language, len(texts))
    # Every prefix ends in <|notimestamps|> and has the same length whatever its language.
    prefixes = [model.sot_sequence(code, task, timestamps=False) for code in languages]
    prefix = prefixes[0]
    rows = [[*start, *text, eot] for start, text in zip(prefixes, texts, strict=True)]
    width = max(map(len, rows))
    # Padding goes after each row's end; causal attention keeps it out of every real position.
    tokens = torch.tensor(
        [row + [eot] * (width - len(row)) for row in rows], dtype=torch.long, device=model.device
    )
    states, scores = model.alignment_scores(tokens, encoded)
    first = len(prefix) - 1  # the <|notimestamps|> position predicts the first text token
    times = []
    for index, (text, content_frames) in enumerate(zip(texts, frames, strict=True)):
        n = len(text)
        positions = max(content_frames // 2, 1)  # encoder positions: 2 mel frames each
        matrix = alignment_matrix(scores[index, :, : len(rows[index]), :positions])
        # Rows from <|notimestamps|> to the last text token: the queries predicting each token.
        rows_taken, columns = dtw(-matrix[first : first + n + 1].double().cpu().numpy())
        jumps = np.diff(rows_taken, prepend=-1).astype(bool)
        starts = columns[jumps] * TIME_PRECISION
        chances = np.full(n, np.nan)
        if probabilities:
            logits = model.logits(states[index, first : first + n])[:, :eot]
            chosen = torch.tensor(text, device=logits.device)[:, None]
            chances = logits.softmax(dim=-1).gather(1, chosen)[:, 0].double().cpu().numpy()
        times.append(TokenTimes(starts, chances))
    return times


# -- tokens -> words --------------------------------------------------------------------------


@dataclass(frozen=True)
class WordPiece:
    """A word (or punctuation) being timed: text, tokens, seconds, mean token probability."""

    text: str
    tokens: tuple[int, ...]
    start: float = 0.0
    end: float = 0.0
    probability: float = 0.0


def _characters(model: WhisperModel, tokens: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Runs of tokens that each decode to whole characters (a character's UTF-8 bytes may span
    tokens); their texts concatenate to the tokens' text. A run ends where its text is the
    next stretch of the whole text: a replacement character that the whole text has too is
    real (invalid bytes), not a character whose bytes continue in the next token."""
    whole = model.tokenizer.decode(list(tokens))
    pieces, current, offset = [], [], 0
    for token in tokens:
        current.append(token)
        text = model.tokenizer.decode(current)
        if not whole.startswith(text, offset):
            continue  # a character whose bytes continue in the next token
        pieces.append((text, current))
        current, offset = [], offset + len(text)
    if current:  # bytes that never complete a character: keep them with the last piece
        text = whole[offset:]  # as the whole text decodes them
        if pieces:
            pieces[-1] = (pieces[-1][0] + text, pieces[-1][1] + current)
        else:
            pieces.append((text, current))
    return pieces


def split_words(
    model: WhisperModel, tokens: Sequence[int], language: str | None
) -> list[WordPiece]:
    """Text tokens -> words, each with its tokens; the words' texts concatenate to the text.

    Languages written with spaces: a word starts at a piece that begins with a space, and
    punctuation stands alone (merge_punctuations attaches it later). Languages without spaces:
    every whole character run is a word.
    """
    pieces = _characters(model, tokens)
    spaced = language not in NO_SPACE_LANGUAGES
    words: list[WordPiece] = []
    for text, ids in pieces:
        if spaced:
            starts_word = text.startswith(" ") or text.strip() in string.punctuation
        else:  # every character run, but a spaced script's word inside ("iPhone") stays one
            starts_word = not (words and _joins(words[-1].text, text))
        if starts_word or not words:
            words.append(WordPiece(text, tuple(ids)))
        else:
            last = words[-1]
            words[-1] = replace(last, text=last.text + text, tokens=last.tokens + tuple(ids))
    return words


def _joins(before: str, after: str) -> bool:
    """Whether text `after` continues a word of a spaced script that `before` ends with: a
    letter or digit of Latin, Greek or Cyrillic (or ASCII) on both sides, no space between."""
    return bool(before and after) and _spaced_letter(before[-1]) and _spaced_letter(after[0])


def _spaced_letter(character: str) -> bool:
    if not character.isalnum():
        return False
    if character.isascii():
        return True
    return unicodedata.name(character, "").startswith(("LATIN", "GREEK", "CYRILLIC"))


def merge_punctuations(
    words: Sequence[WordPiece],
    prepended: str = PREPEND_PUNCTUATIONS,
    appended: str = APPEND_PUNCTUATIONS,
) -> list[WordPiece]:
    """Opening punctuation joins the word after it, closing punctuation the word before it;
    the merged word keeps that word's times and probability. Empty pieces are dropped."""
    words = list(words)
    # Opening marks (written with a space before them), scanned from the end.
    following = len(words) - 1
    for index in range(len(words) - 2, -1, -1):
        previous, after = words[index], words[following]
        if previous.text.startswith(" ") and previous.text.strip() in prepended:
            words[following] = replace(
                after, text=previous.text + after.text, tokens=previous.tokens + after.tokens
            )
            words[index] = replace(previous, text="", tokens=())
        else:
            following = index
    # Closing marks (no space before them), scanned from the start.
    before = 0
    for index in range(1, len(words)):
        previous, current = words[before], words[index]
        if not previous.text.endswith(" ") and current.text in appended:
            words[before] = replace(
                previous, text=previous.text + current.text, tokens=previous.tokens + current.tokens
            )
            words[index] = replace(current, text="", tokens=())
        else:
            before = index
    return [word for word in words if word.text]


# -- words -> segments -------------------------------------------------------------------------


def _timed_words(
    model: WhisperModel,
    split: WindowSplit,
    times: TokenTimes,
    language: str | None,
) -> tuple[list[list[WordPiece]], float]:
    """Per segment, its words with window-relative times; and the median word duration."""
    eot = model.special.eot
    per_segment, offset = [], 0
    for tokens in split.tokens:
        text = [t for t in tokens if t < eot]
        words = []
        for word in split_words(model, text, language):
            end = offset + len(word.tokens)
            words.append(
                replace(
                    word,
                    start=float(times.starts[offset]),
                    end=float(times.starts[end]),
                    probability=float(times.probabilities[offset:end].mean()),
                )
            )
            offset = end
        per_segment.append(words)

    flat = [w for words in per_segment for w in words]
    durations = np.array([w.end - w.start for w in flat])
    durations = durations[durations.nonzero()]
    if not len(durations):
        return per_segment, 0.0
    median = min(MAX_MEDIAN_DURATION, float(np.median(durations)))
    flat = _clamp_at_sentence_ends(flat, median)
    bounds = list(itertools.accumulate(map(len, per_segment), initial=0))
    return [flat[a:b] for a, b in itertools.pairwise(bounds)], median


def _clamp_at_sentence_ends(words: list[WordPiece], median: float) -> list[WordPiece]:
    """OpenAI's hack: punctuation closing a sentence, or the word after it, is no longer than
    twice the median word (DTW lets a pause stretch them)."""
    longest = 2 * median
    clamped = list(words)
    for index in range(1, len(clamped)):
        word = clamped[index]
        if word.end - word.start > longest:
            if word.text in SENTENCE_END_MARKS:
                clamped[index] = replace(word, end=word.start + longest)
            elif clamped[index - 1].text in SENTENCE_END_MARKS:
                clamped[index] = replace(word, start=word.end - longest)
    return clamped


def _after_seam(
    start: float, words: list[WordPiece], seam_silences: Sequence[tuple[float, float]]
) -> list[WordPiece]:
    """A segment's words (absolute seconds) kept out of the silence of a cut-out pause that
    its own start timestamp lies past. The alignment tends to put a first word after a pause
    right behind the last word before it (on jfk said twice 3 s apart, "And" landed in the
    previous span, 3.6 s early); the segment's timestamp, which Whisper predicts from the
    audio, says the speech starts after the silence. So the words up to the first one that
    ends past the silence share, evenly, the time from the silence's end to that word's end."""
    before = [silence for silence in seam_silences if silence[0] < start]
    if not before or not words:
        return words
    _, silence_end = max(before)
    if words[0].start >= silence_end:
        return words
    past = next((i for i, word in enumerate(words) if word.end > silence_end), None)
    if past is None:
        return words  # every word before the silence: nothing to anchor them after it
    step = (words[past].end - silence_end) / (past + 1)
    moved = [
        replace(word, start=silence_end + i * step, end=silence_end + (i + 1) * step)
        for i, word in enumerate(words[: past + 1])
    ]
    return moved + words[past + 1 :]


def _fit_segment(
    segment: Segment,
    words: list[WordPiece],
    median: float,
    last_speech: float,
    duration: float,
) -> Segment:
    """OpenAI's boundary heuristics for one segment's words (absolute seconds), then the
    segment's times from its words; the segment always covers its words."""
    longest = 2 * median
    words = list(words)
    start, end = segment.start, segment.end
    first = words[0]
    # After a pause, the first (and second) word must not soak up the silence before them.
    if first.end - last_speech > median * 4 and (
        first.end - first.start > longest
        or (len(words) > 1 and words[1].end - first.start > longest * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first = replace(first, end=boundary)
            words[1] = replace(words[1], start=boundary)
        first = replace(first, start=max(0.0, first.end - longest))
    # A first word that starts long before the segment's own timestamp: trust the timestamp.
    if start < first.end and start - 0.5 > first.start:
        first = replace(first, start=max(0.0, min(first.end - median, start)))
    else:
        start = first.start
    words[0] = first
    last = words[-1]
    if end > last.start and end + 0.5 < last.end:
        words[-1] = replace(last, end=max(last.start + median, end))
    else:
        end = last.end
    start, end = min(start, words[0].start), max(end, words[-1].end)

    def clamp(seconds: float) -> float:
        return round(min(max(seconds, 0.0), duration), 3)

    return replace(
        segment,
        start=clamp(start),
        end=clamp(end),
        words=tuple(Word(clamp(w.start), clamp(w.end), w.text, w.probability) for w in words),
    )


def per_window(language: str | Sequence[str | None] | None, windows: int) -> list[str | None]:
    """One language for every window, or one per window (checked against their count)."""
    if language is None or isinstance(language, str):
        return [language] * windows
    if len(language) != windows:
        raise ValueError(f"{len(language)} languages for {windows} windows")
    return list(language)


def add_word_timestamps(
    model: WhisperModel,
    encoded: EncodedAudio,
    splits: Sequence[WindowSplit],
    language: str | Sequence[str | None] | None,
    task: str,
    duration: float | Sequence[float],
    last_speech: float | Sequence[float] = 0.0,
    seam_silences: Sequence[tuple[float, float]] = (),
    probabilities: bool = True,
) -> tuple[list[WindowSplit], float]:
    """Every segment of these windows gets its words; segment times follow the words.

    encoded: the target's view of the windows, one row per split, in order. duration: where
    times end (s); last_speech: where speech last ended before the first window (s). Windows
    without text cost nothing; the others share one decoder pass. Returns the new splits and
    where speech last ended. Windows of independent passages, side by side, give both per
    window (sequences): each window then reads its own, not the window before it. language:
    the windows', or one per window (`TranscribeOptions.multilingual`). seam_silences: the
    (start, end) seconds of silence laid where pauses were cut out of the audio
    (`asr.speech_timeline.SpeechTimeline.seam_silences`), which no word of a segment that
    starts after one may begin in or before (`_after_seam`). probabilities: False where only
    the words' times are read (their probabilities are then NaN).
    """
    independent = not isinstance(last_speech, float | int)
    bounds = [duration] * len(splits) if isinstance(duration, float | int) else list(duration)
    before = list(last_speech) if independent else [float(last_speech)] * len(splits)
    if len(bounds) != len(splits) or len(before) != len(splits):
        raise ValueError("duration and last_speech: one value, or one per window")
    languages = per_window(language, len(splits))
    eot = model.special.eot
    texts = [[t for tokens in split.tokens for t in tokens if t < eot] for split in splits]
    spoken = [index for index, text in enumerate(texts) if text]
    times: dict[int, TokenTimes] = {}
    if spoken:
        rows = torch.tensor(spoken, dtype=torch.long, device=encoded.features.device)
        found = align_tokens(
            model,
            encoded.rows(rows),
            [texts[index] for index in spoken],
            [splits[index].frames for index in spoken],
            [languages[index] for index in spoken],
            task,
            probabilities,
        )
        times = dict(zip(spoken, found, strict=True))

    result = []
    speech_end = 0.0 if independent else float(last_speech)
    for index, split in enumerate(splits):
        if independent:
            speech_end = before[index]
        if index not in times:
            result.append(split)
            continue
        per_segment, median = _timed_words(model, split, times[index], languages[index])
        segments = []
        for segment, words in zip(split.segments, per_segment, strict=True):
            words = merge_punctuations(words)
            if not words:
                segments.append(segment)
                continue
            offset = split.time_offset
            absolute = [replace(w, start=w.start + offset, end=w.end + offset) for w in words]
            absolute = _after_seam(segment.start, absolute, seam_silences)
            segment = _fit_segment(segment, absolute, median, speech_end, bounds[index])
            speech_end = segment.end
            segments.append(segment)
        result.append(replace(split, segments=tuple(segments)))
        ends = [s.words[-1].end for s in segments if s.words]
        if ends:
            speech_end = ends[-1]
    return result, speech_end
