"""Beam search (`decoding.beam`): OpenAI Whisper's rule, checked against a search that rescores
every hypothesis from scratch, on a toy target whose scores depend on each row's whole cache
and on real Whisper windows; one hypothesis is greedy decoding. And best_of sampling, the
temperature fallback's counterpart."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from asr.audio import load_audio
from asr.logit_rules import LogitRules
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import N_FRAMES
from asr.whisper_drafters import load_draft
from asr.whisper_target import WhisperTarget
from decoding import BeamOptions, beam_search, generate
from decoding.reference import beam_search_one
from tests.conftest import SAMPLES, reference_text, word_error_rate

JFK = SAMPLES / "jfk.wav"
LIBRISPEECH = SAMPLES / "librispeech_1089-134686-0002.wav"
VOCABULARY, STOP = 12, 0


class _ToyTarget:
    """Logits that depend on every token a row's cache holds, so a hypothesis that continued
    from another row's cache, or a row that lost its place, scores differently."""

    device = torch.device("cpu")

    def __init__(self, rows: int = 1) -> None:
        self.rows = rows
        self.reset()

    def reset(self) -> None:
        self.cache = [[] for _ in range(self.rows)]

    def score(self, tokens, positions, mask, keep):
        logits = []
        for row in range(tokens.shape[0]):
            for token, position, real in zip(tokens[row], positions[row], mask[row], strict=True):
                if real:
                    del self.cache[row][int(position) :]
                    self.cache[row].append(int(token))
            logits.append(self._logits(self.cache[row]))
        return torch.stack(logits)[:, None].expand(-1, keep, -1)

    @staticmethod
    def _logits(prefix: list[int]) -> torch.Tensor:
        seed = zlib.crc32(bytes(prefix))
        logits = torch.randn(VOCABULARY, generator=torch.Generator().manual_seed(seed)) * 2
        logits[STOP] += len(prefix) / 4 - 2  # ending grows likelier with length
        logits[5] = float("-inf")  # a token the rules forbid
        return logits

    def rollback(self, lengths) -> None:
        pass

    def keep_rows(self, rows) -> None:
        self.cache = [list(self.cache[row]) for row in rows.tolist()]

    def copy_positions(self, source, starts, stops) -> None:
        copied = [list(row) for row in self.cache]
        for row, (chain, start, stop) in enumerate(
            zip(source.tolist(), starts.tolist(), stops.tolist(), strict=True)
        ):
            if chain != row and stop > start:
                copied[row][start:stop] = self.cache[chain][start:stop]
        self.cache = copied


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_beam_search_of_a_batch_equals_a_search_that_rescores_every_hypothesis(size):
    prompts = [[1, 2], [3], [4, 6, 7, 8], [9, 9]]
    searched = beam_search(_ToyTarget(len(prompts) * size), prompts, BeamOptions(size), 14, STOP)
    for row, prompt in enumerate(prompts):
        tokens, logprob = beam_search_one(_ToyTarget(), prompt, size, 14, (STOP,))
        assert searched.tokens[row] == tokens, (size, row)
        assert searched.sum_logprobs[row] == pytest.approx(logprob, abs=1e-9)
        assert 5 not in tokens  # forbidden tokens are never candidates
    if size == 1:  # one hypothesis is greedy decoding
        greedy = generate(_ToyTarget(len(prompts)), prompts, max_new_tokens=14, eos_token_id=STOP)
        assert greedy.tokens == searched.tokens
    # Prompts end at different steps and leave the batch; some run into max_new_tokens.
    assert {len(tokens) for tokens in searched.tokens} != {14}
    patient = beam_search(
        _ToyTarget(len(prompts) * size), prompts, BeamOptions(size, patience=2.0), 14, STOP
    )
    for row, prompt in enumerate(prompts):
        expected = beam_search_one(_ToyTarget(), prompt, size, 14, (STOP,), patience=2.0)
        assert patient.tokens[row] == expected[0]


def test_beam_options_are_checked_and_rank_by_length():
    # patience 1e308 overflowed (a 500 from the API); 1e300 ran every window to its limit
    for bad in ({"beam_size": 0}, {"beam_size": 17}, {"beam_size": 2.0}, {"patience": 0}):
        with pytest.raises(ValueError):
            BeamOptions(**bad)
    for patience in (10.5, 1e300, 1e308, math.inf, math.nan):
        with pytest.raises(ValueError, match="patience: a positive number up to 10"):
            BeamOptions(beam_size=16, patience=patience)
    assert BeamOptions(16, patience=10.0).candidates == 160
    with pytest.raises(ValueError, match="whose product with beam_size rounds to at least 1"):
        BeamOptions(beam_size=2, patience=0.2)
    options = BeamOptions(5)
    assert options.candidates == 5 and BeamOptions(5, patience=1.5).candidates == 8
    assert options.ranking_score(-6.0, 3) == -2.0 and options.ranking_score(-1.0, 0) == -1.0
    assert BeamOptions(5, length_penalty=1.0).ranking_score(-6.0, 7) == pytest.approx(-3.0)


def test_beam_options_reach_decoding_and_the_output_record(settings):
    from app.request import ServiceOptions
    from app.service import TranscriptionService

    options = ServiceOptions(beam_size=5, patience=2.0, best_of=3)
    assert options.transcribe_options().beam == BeamOptions(5, patience=2.0)
    assert options.transcribe_options().best_of == 3
    assert ServiceOptions().transcribe_options().beam is None  # greedy
    service = TranscriptionService(settings)
    record = service.output_record(options)
    # A rerun redoes outputs made otherwise; at the defaults, earlier outputs still count.
    assert (record["beam_size"], record["patience"], record["best_of"]) == (5, 2.0, 3)
    default = service.output_record(ServiceOptions())
    assert not {"beam_size", "patience", "best_of"} & set(default)
    with pytest.raises(ValueError, match="beam_size"):
        ServiceOptions(beam_size=17)
    with pytest.raises(ValueError, match="patience: needs beam_size > 1"):
        ServiceOptions(patience=2.0)
    # What a request never runs does not count: beams where sampling starts at once, samples
    # where nothing is ever sampled.
    sampled = service.output_record(ServiceOptions(temperature=0.4, beam_size=5, patience=2.0))
    assert not {"beam_size", "patience"} & set(sampled)
    assert sampled == service.output_record(ServiceOptions(temperature=0.4))
    no_fallback = ServiceOptions(best_of=5, temperature_increment_on_fallback=0)
    assert "best_of" not in service.output_record(no_fallback)
    assert service.output_record(ServiceOptions(best_of=5))["best_of"] == 5


@pytest.fixture(scope="module")
def two_windows(whisper_base_int8):
    model = whisper_base_int8
    mels = [model.log_mel(load_audio(path))[:, :N_FRAMES] for path in (JFK, LIBRISPEECH)]
    encoded = model.cross_attention(model.encode(torch.stack(mels)))
    sot = list(model.sot_sequence("en", "transcribe", True))
    previous = [model.special.sot_prev, *model.tokenizer.encode(" The lamps were lit.")]
    return encoded, [sot, [*previous, *sot]]


@pytest.mark.parametrize("size", [1, 3, 5])
def test_whisper_beams_in_a_batch_equal_each_windows_search_from_scratch(
    whisper_base_int8, two_windows, size
):
    """Real windows, int8 (exact mode: a position scores the same bits alone and in any
    batch), Whisper's timestamp rules on every hypothesis; tokens and log-probabilities the
    same bits. Without the copies that seat a hypothesis in a dead one's row, the search of 5
    differs here (and the toy test's of 3 and 5)."""
    model = whisper_base_int8
    encoded, prompts = two_windows
    rules = LogitRules(model.special, model.suppress_tokens, timestamps=True)
    eot = model.special.eot
    target = WhisperTarget(model, encoded, rules, group=size)
    searched = beam_search(target, prompts, BeamOptions(size), 224, eot)
    for row, prompt in enumerate(prompts):
        alone = WhisperTarget(model, encoded.rows(torch.tensor([row])), rules)
        tokens, logprob = beam_search_one(alone, prompt, size, 224, (eot,))
        assert searched.tokens[row] == tokens and searched.sum_logprobs[row] == logprob
        assert tokens[-1] == eot and model.special.timestamp_begin <= tokens[-2]
    if size == 1:
        greedy = generate(
            WhisperTarget(model, encoded, rules), prompts, max_new_tokens=224, eos_token_id=eot
        )
        assert greedy.tokens == searched.tokens and greedy.sum_logprobs == searched.sum_logprobs
    text = model.text_of([t for t in searched.tokens[1] if t < model.special.eot])
    assert "nightfall" in text and "brothels" in text


def test_transcription_with_beams_ignores_the_draft_and_stays_accurate(registry, whisper_base_int8):
    model = whisper_base_int8
    draft = load_draft(model, registry.resolve("whisper-base-draft"))
    audio = load_audio(LIBRISPEECH)
    options = TranscribeOptions(language="en", beam_size=5)
    beams = transcribe(model, audio, options)
    drafted = transcribe(model, audio, options, draft=draft)
    assert [s.text for s in drafted.segments] == [s.text for s in beams.segments]
    assert drafted.stats["draft_calls"] == 0
    assert word_error_rate(reference_text(LIBRISPEECH), beams.text) < 0.1
    with pytest.raises(ValueError, match="beam_size"):
        TranscribeOptions(beam_size=0).checked()


def test_best_of_keeps_the_most_probable_of_its_samples(whisper_base_int8, two_windows):
    """A sampled window draws best_of samples side by side and keeps the one with the best
    log-probability per token (OpenAI's best_of, for the temperature fallback)."""
    from asr.window_decoder import WindowBatch, WindowDecoder

    model = whisper_base_int8
    encoded, prompts = two_windows
    rules = LogitRules(model.special, model.suppress_tokens, timestamps=True)
    decoder = WindowDecoder(model, rules, "en", "transcribe", 224, best_of=4)
    batch = WindowBatch(encoded, tuple(prompts))
    chosen, stats = decoder.decode(batch, temperature=1.0, seed=3)
    samples, drawn_stats = WindowDecoder(model, rules, "en", "transcribe", 224).decode(
        batch.rows([0, 0, 0, 0, 1, 1, 1, 1]), temperature=1.0, seed=3
    )
    rank = BeamOptions(1).ranking_score
    for window in range(2):
        drawn = samples[4 * window : 4 * window + 4]
        assert len({result.tokens for result in drawn}) > 1  # hot enough to differ
        best = max(drawn, key=lambda result: rank(result.sum_logprob, len(result.tokens)))
        assert chosen[window] == best
    assert (stats.generated_tokens, stats.target_calls) == (
        drawn_stats.generated_tokens,
        drawn_stats.target_calls,
    )
    with pytest.raises(ValueError, match="best_of"):
        TranscribeOptions(best_of=0).checked()


def test_an_initial_prompt_longer_than_its_room_keeps_its_end_and_says_so(whisper_base_int8):
    """As previous text, only an initial prompt's last tokens fit: it was cut silently."""
    import numpy as np

    from asr.window_session import Session

    model = whisper_base_int8
    silence = np.zeros(16_000, np.float32)
    prompt = " ".join(f"Item {n} of the glossary." for n in range(80))
    session = Session(model, silence, TranscribeOptions(initial_prompt=prompt), None, None)
    room = model.max_context // 2 - 1
    context = session.prompt(session.initial_prompt)[1 : 1 + room]  # after <|startofprev|>
    assert list(context) == session.initial_prompt[-room:]
    kept = model.tokenizer.decode(context).strip()
    assert prompt.endswith(kept)
    (warning,) = session.prompt_warnings
    assert warning == (
        f"initial_prompt: only the last {len(kept)} of {len(prompt)} characters fit the "
        f"prompt ({room} tokens); the start was left out"
    )
    both = TranscribeOptions(initial_prompt=prompt, hotwords="Pearl Prynne")
    beside = Session(model, silence, both, None, None)
    room_left = room - len(beside.hotwords)
    assert len(beside.prompt_warnings) == 1
    assert f"({room_left} tokens beside the hotwords)" in beside.prompt_warnings[0]
    full = TranscribeOptions(initial_prompt="Hello.", hotwords="北京欢迎你" * 200)  # fills it
    filled = Session(model, silence, full, None, None).prompt_warnings
    assert filled[-1] == "initial_prompt: the hotwords fill the prompt; it was left out"
    short = TranscribeOptions(initial_prompt="Item 1 of the glossary.")
    assert Session(model, silence, short, None, None).prompt_warnings == ()


def test_hotwords_longer_than_a_prompt_are_cut_before_a_word_and_said_so(whisper_base_int8):
    """Cut inside a word ("... Hester P|rynne"), beam search went on from the fragment and
    transcribed jfk.wav as hotword text; cut before the word it stays the speech."""
    import numpy as np

    from asr.window_session import Session

    model = whisper_base_int8
    hotwords = " ".join(["Hester Prynne walked in Boston with Pearl."] * 24)
    options = TranscribeOptions(language="en", hotwords=hotwords, beam_size=5)
    session = Session(model, np.zeros(16_000, np.float32), options, None, None)
    kept = model.tokenizer.decode(session.hotwords)
    assert len(session.hotwords) <= model.max_context // 2 - 1
    assert hotwords.startswith(kept.strip()) and hotwords[len(kept.strip())] == " "
    (warning,) = session.prompt_warnings
    assert f"only the first {len(kept.strip())} of {len(hotwords)} characters fit" in warning
    transcript = transcribe(model, load_audio(JFK), options)
    assert transcript.text.startswith("And so my fellow Americans")
    assert warning in transcript.warnings
    # Without spaces between words, the cut falls where the prompt is full.
    silence = np.zeros(16_000, np.float32)
    chinese = Session(model, silence, TranscribeOptions(hotwords="北京欢迎你" * 200), None, None)
    assert len(chinese.hotwords) == model.max_context // 2 - 1 and chinese.prompt_warnings
    short = Session(model, silence, TranscribeOptions(hotwords="Pearl"), None, None)
    assert short.prompt_warnings == () and model.tokenizer.decode(short.hotwords) == " Pearl"
