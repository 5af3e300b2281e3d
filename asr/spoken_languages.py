"""Languages heard in a window: the whole window's, and each segment's on its own.

Whisper tells a window's language once, from all 30 s of it, at <|startoftranscript|>. A window
that holds two languages (speakers who switch after a short pause) is then decoded in one of
them, and Whisper translates the other into it or spells it in that language's words: JFK's
"ask not what your country can do for you" came out in French after a Spanish sentence whose
window Whisper told as French. With `multilingual`, each segment's language is told again from
its own audio: the same <|startoftranscript|> step, its cross-attention cut to the segment's
encoder frames (`EncodedAudio.frames_between`), costs one decoder call and no encoder pass.
"""

from __future__ import annotations

import math

import torch

from asr.segments import WindowSplit, has_content
from asr.whisper import FRAMES_PER_SECOND, EncodedAudio, WhisperModel
from asr.whisper_target import language_odds

# Encoder frames a second: the encoder halves the mel frames.
ENCODER_FRAMES_PER_SECOND = FRAMES_PER_SECOND // 2

# A segment is taken for another language than its window's only when it lasts this long (s)
# and its own odds give that language at least HEARD_PROBABILITY and HEARD_TIMES_NAMED times
# the window's. Told from a segment alone, the odds are less sure than a window's. On 65
# one-language recordings (bench.cli's 59 English files, German, Spanish and French readings,
# AMI, the pyannote sample; one window at a time), 11 segments of 2.5 s or more led with
# another language, at most 5.9 times as likely as the window's but once: English words of the
# mfa_acoustic_corpus reading heard as Hawaiian, 0.78 against 0.034 (22.9 times); and a
# one-word "Yes" was read as Catalan at 0.61 (the window's 0.002). Segments of a second
# language after a pause held 0.54 to 0.97 against 0.0001 to 0.025 for the window's (38 times
# and more), and a German reading's first 2.5 s, in a window told as Spanish, 0.42 against
# under 0.0001: decoded in Spanish under the bound before this one (at least 0.5, the window's
# at most 0.02; `bench.multilingual`, docs/benchmarks.md). Left: a Spanish sentence after JFK,
# 0.92 against 0.033 (27 times), which stays translated into English.
MIN_SECONDS_TO_TELL = 2.5
HEARD_PROBABILITY = 0.4
HEARD_TIMES_NAMED = 30


def sot_logits(model: WhisperModel, encoded: EncodedAudio, row: int = 0) -> torch.Tensor:
    """The logits after <|startoftranscript|> alone (no prompt before it) in window `row` of
    `encoded` (default: the first): Tensor, shape = (1, vocab)."""
    first = encoded.rows(torch.tensor([row], device=encoded.features.device))
    tokens = torch.tensor([[model.special.sot]], device=model.device)
    positions = torch.zeros_like(tokens)
    cache = model.new_cache(first)
    return model.logits(model.decoder_states(tokens, positions, cache))[:, -1]


def before_another_language(
    model: WhisperModel,
    window: EncodedAudio,
    split: WindowSplit,
    language: str,
    from_first: bool = True,
) -> WindowSplit:
    """`split` (of `window`, one window's encoding, decoded in `language`) up to its first
    segment whose own audio is plainly in another language (`WindowSplit.before_segment`), or
    `split` itself. from_first: whether the first segment with text is asked too (not where
    the window's language was told from that segment)."""
    named = torch.tensor([model.special.language_ids[language]])
    asked = from_first
    for index, segment in enumerate(split.segments):
        if not has_content(segment):
            continue
        if not asked:
            asked = True
            continue
        if segment.end - segment.start < MIN_SECONDS_TO_TELL:
            continue
        start = (segment.start - split.time_offset) * ENCODER_FRAMES_PER_SECOND
        end = (segment.end - split.time_offset) * ENCODER_FRAMES_PER_SECOND
        frames = (max(0, math.floor(start)), min(window.cross[0][1].shape[-2], math.ceil(end)))
        if frames[1] <= frames[0]:
            continue
        heard = window.frames_between(*frames)
        (odds,) = language_odds(model, sot_logits(model, heard), named)
        if (
            odds.heard != language
            and odds.heard_probability >= HEARD_PROBABILITY
            and odds.named_probability * HEARD_TIMES_NAMED <= odds.heard_probability
        ):
            return split.before_segment(index, odds.heard)
    return split
