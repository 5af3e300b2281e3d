"""On a CUDA GPU: drafting and batching stay lossless in fp32 and in the default precision.

Skipped on machines without CUDA (CI has none); run them where a GPU is:
`python -m pytest tests/test_cuda.py`. The audio is the samples' 16 kHz WAV/FLAC files joined
(52 s, several seek windows), so these tests need neither ffmpeg nor ../shared. Greedy only:
windows that fall back to sampling are decoded without the draft (asr.transcribe), so only
greedy passes exercise drafting.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.audio import load_audio
from asr.precision import resolve_precision
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import WhisperModel
from asr.whisper_drafters import load_draft
from tests.conftest import SAMPLES, normalised_words
from tests.test_transcribe_speculative import assert_same_segments

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

JOINED = (
    "jfk.wav",
    "librispeech_1089-134686-0002.wav",
    "librispeech_61-70968-0000.flac",
    "pyannote_sample.wav",
)


GREEDY = TranscribeOptions(temperatures=(0.0,))


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return np.concatenate([load_audio(SAMPLES / name) for name in JOINED])


@pytest.fixture(scope="module", params=["fp32", "auto"])
def pair(request, registry):
    """(whisper-base, its shipped draft, their dtypes) on the GPU in fp32 and in the default
    precision, which must keep a float32 decoder there ("mixed") for drafting to be lossless."""
    dtypes = resolve_precision("cuda", request.param)
    assert dtypes.decoder == torch.float32
    target = WhisperModel.load(
        registry.resolve("whisper-base"), "cuda", dtypes.decoder, encoder_dtype=dtypes.encoder
    )
    return target, load_draft(target, registry.resolve("whisper-base-draft")), dtypes


def test_drafted_long_form_equals_plain_greedy_on_the_gpu(pair, speech):
    target, assistant, _ = pair
    plain = transcribe(target, speech, GREEDY)
    drafted = transcribe(target, speech, GREEDY, draft=assistant)
    assert len(plain.segments) >= 4
    assert_same_segments(drafted.segments, plain.segments)
    assert drafted.stats["target_calls"] * 2 < plain.stats["target_calls"]
    assert target.round_pools  # greedy windows decode in captured rounds on a GPU
    assert "ask not what your country can do for you" in " ".join(normalised_words(plain.text))


def test_drafting_a_large_batch_of_windows_equals_plain_greedy_on_the_gpu(pair, speech):
    target, assistant, dtypes = pair
    independent = {
        "windows": "silence",
        "condition_on_previous_text": False,
        "temperatures": (0.0,),
    }
    # Eight copies of the audio: a few dozen windows, decoded at once by one call per step.
    eight = np.concatenate([speech] * 8)
    batched = TranscribeOptions(**independent, batch_size=32)
    plain = transcribe(target, eight, batched)
    drafted = transcribe(target, eight, batched, draft=assistant)
    assert len(plain.segments) >= 16
    assert_same_segments(drafted.segments, plain.segments)
    # Rows share target calls, so the slowest row sets their number: fewer, not 2.8x fewer.
    assert drafted.stats["target_calls"] < plain.stats["target_calls"]

    # Batching itself keeps the text: each row decodes as it would alone. (In "mixed" the fp16
    # encoder's sums depend on how many windows it encodes at once, so log-probabilities may
    # move by a few 1e-4; the fp32 encoder's agree as closely as on the CPU.)
    alone = transcribe(target, eight, TranscribeOptions(**independent))
    # A pass takes as many calls as its longest window, and a window whose text closes early
    # queues its tail for a second pass: 4x fewer calls than one window at a time (8.5x for
    # the original weights on a CPU, 6.5x for the int8-rounded ones on an H200) is batching.
    assert plain.stats["target_calls"] * 4 < alone.stats["target_calls"]
    assert [(s.start, s.end, s.text) for s in plain.segments] == [
        (s.start, s.end, s.text) for s in alone.segments
    ]
    if dtypes.encoder == torch.float32:
        assert_same_segments(plain.segments, alone.segments)


def test_captured_steps_equal_uncaptured_steps_bit_for_bit(registry):
    """asr.cuda_graphs: a replayed step computes what the same step computes uncaptured."""
    from asr.cuda_graphs import StepGraphs
    from asr.whisper import N_FRAMES

    target = WhisperModel.load(registry.resolve("whisper-base"), "cuda", torch.float32)
    mels = [target.log_mel(load_audio(SAMPLES / name))[:, :N_FRAMES] for name in JOINED[:2]]
    encoded = target.cross_attention(target.encode(torch.stack(mels)))
    prompt = torch.tensor([target.sot_sequence("en", "transcribe", True)] * 2, device="cuda")
    positions = torch.arange(prompt.shape[1], device="cuda").expand(2, -1)
    logits = {}
    for capture in (True, False):
        graphs = StepGraphs(target, 2, capture=capture)
        graphs.load(encoded.cross)
        graphs.forward(prompt, positions, None)
        done, steps = prompt.shape[1], []
        for width in (1, 5, 3, 1, 5):  # widths replayed more than once
            block = torch.full((2, width), 440, device="cuda")
            at = torch.arange(done, done + width, device="cuda").expand(2, -1)
            steps.append(graphs.step(block, at).clone())
            done += width
        logits[capture] = steps
    for captured, eager in zip(logits[True], logits[False], strict=True):
        assert torch.equal(captured, eager)
    assert torch.isfinite(torch.cat([s.flatten() for s in logits[True]])).all()


def _joined_windows(target, assistant):
    """The JOINED samples as one 30 s window each, for the target and the draft, with the
    target's rules and a plain English prompt per window."""
    from asr.logit_rules import LogitRules
    from asr.whisper import N_FRAMES

    mels = []
    for name in JOINED:
        mel = target.log_mel(load_audio(SAMPLES / name))[:, :N_FRAMES]
        mels.append(torch.nn.functional.pad(mel, (0, N_FRAMES - mel.shape[1])))
    encoded = target.cross_attention(target.encode(torch.stack(mels)))
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    prompts = (tuple(target.sot_sequence("en", "transcribe", True)),) * len(JOINED)
    return encoded, assistant.encode(encoded, None), rules, prompts


def test_captured_rounds_equal_eager_rounds_and_drafting_keeps_them(pair):
    """asr.graph_rounds: a replayed round computes what the same round computes eagerly, bit
    for bit, plain and drafted; drafted rounds give plain rounds' tokens in fewer target
    calls."""
    from asr.graph_rounds import RoundGraphs

    target, assistant, _ = pair
    encoded, draft_encoded, rules, prompts = _joined_windows(target, assistant)
    runs = {}
    for capture in (True, False):
        for draft, k in ((None, 0), (assistant.model, 4)):
            pool = RoundGraphs(target, rules, len(JOINED), draft, k, capture=capture)
            runs[capture, k] = pool.decode(
                encoded, prompts, 224, None if draft is None else draft_encoded
            )
    for k in (0, 4):
        captured, eager = runs[True, k], runs[False, k]
        assert (captured.tokens, captured.sum_logprobs) == (eager.tokens, eager.sum_logprobs)
    plain, drafted = runs[True, 0], runs[True, 4]
    assert drafted.tokens == plain.tokens
    assert drafted.stats.target_calls * 2 < plain.stats.target_calls
    text = target.text_of([t for t in plain.tokens[0] if t < target.special.eot])
    assert "ask not what your country can do for you" in " ".join(normalised_words(text))


def test_a_compiled_draft_in_captured_rounds_keeps_plain_greedy(pair):
    """asr.graph_rounds' fused draft (its steps through torch.compile, recorded inside the
    round's CUDA graph): the windows decode to plain rounds' tokens, in about as many target
    calls as the eager draft takes."""
    from asr.graph_rounds import RoundGraphs

    target, assistant, _ = pair
    encoded, draft_encoded, rules, prompts = _joined_windows(target, assistant)
    runs = {}
    for draft, k, fused in (
        (None, 0, False),
        (assistant.model, 3, False),
        (assistant.model, 3, True),
    ):
        pool = RoundGraphs(target, rules, len(JOINED), draft, k, draft_grammar=False, fused=fused)
        runs[k, fused] = pool.decode(encoded, prompts, 224, draft_encoded if k else None)
    plain, eager, fused = runs[0, False], runs[3, False], runs[3, True]
    assert fused.tokens == plain.tokens
    assert abs(fused.stats.target_calls - eager.stats.target_calls) <= 4
