"""Regressions of the sequential ("seek") long-form loop against OpenAI's transcribe()."""

from __future__ import annotations

import pytest

from asr import window_session
from asr.audio import load_audio
from asr.transcribe import TranscribeOptions, transcribe
from asr.window_decoder import WindowDecoder
from tests.conftest import SAMPLES

pytestmark = pytest.mark.slow


def test_prompt_holds_only_the_previous_windows_finished_segments(whisper_base, monkeypatch):
    """OpenAI's prompt is all_tokens: the tokens of the segments each window kept. What follows
    a window's last complete segment is decoded again by the next window, so it must not be in
    that window's prompt too. pyannote_sample's first window ends in an unclosed timestamp
    (<|29.00|><|29.00|> then the end), which the old loop put in the prompt."""
    prompts: list[tuple[int, ...]] = []
    splits = []
    decode, split = WindowDecoder.decode, window_session.Session.split

    def recording_decode(self, batch, temperature=0.0, seed=0):
        prompts.extend(batch.prompts)
        return decode(self, batch, temperature, seed)

    def recording_split(self, encoded, decoded, unfinished, **passages):
        found = split(self, encoded, decoded, unfinished, **passages)
        splits.extend(found)
        return found

    monkeypatch.setattr(WindowDecoder, "decode", recording_decode)
    monkeypatch.setattr(window_session.Session, "split", recording_split)
    # Greedy only: every window is decided by its first pass, and the context is never reset.
    options = TranscribeOptions(language="en", temperatures=(0.0,), repetition_ngram=None)
    transcribe(whisper_base, load_audio(SAMPLES / "pyannote_sample.wav"), options)

    special = whisper_base.special
    assert len(prompts) == len(splits) >= 2  # no window is silent
    sot = tuple(whisper_base.sot_sequence("en", "transcribe", timestamps=True))
    context: list[int] = []
    for prompt, before in zip(prompts, [None, *splits[:-1]], strict=True):
        if before is not None:
            context += [
                token
                for segment, tokens in zip(before.segments, before.tokens, strict=True)
                if segment.text.strip() and segment.end > segment.start
                for token in tokens
            ]
        kept = context[-(whisper_base.max_context // 2 - 1) :]
        expected = ((special.sot_prev, *kept) if kept else ()) + sot
        assert prompt == expected
    # The first window's last kept segment closes at 29 s and nothing follows it in the prompt.
    assert prompts[1][-len(sot) - 1] == special.timestamp_begin + 29 * 50
    assert prompts[1][-len(sot) - 2] != special.timestamp_begin + 29 * 50
