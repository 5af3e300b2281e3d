"""Transcription reads checkpoints without transformers: the same mel filters, an encoder that
computes what transformers' does, int8 layers quantized once, and no transformers import."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from asr.audio import load_audio
from asr.int8_store import Int8Store
from asr.static_encoder import StaticEncoder
from asr.whisper import N_FRAMES
from asr.whisper_checkpoint import Tensors, mel_filters
from tests.conftest import SAMPLES


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_are_the_feature_extractors(n_mels):
    from transformers import WhisperFeatureExtractor

    expected = np.asarray(WhisperFeatureExtractor(feature_size=n_mels).mel_filters).T
    assert torch.equal(mel_filters(n_mels), torch.from_numpy(expected.astype(np.float32)))


@pytest.mark.slow
def test_the_encoder_computes_what_transformers_computes(whisper_base):
    mel = whisper_base.log_mel(load_audio(SAMPLES / "jfk.wav"))[None, :, :N_FRAMES]
    ours = whisper_base.encode(mel)
    with torch.inference_mode():
        theirs = whisper_base.model.model.encoder(mel).last_hidden_state
    assert ours.shape == theirs.shape == (1, 1500, 512)
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


@pytest.mark.slow
def test_the_encoder_on_packed_weights_gives_the_same_bits(whisper_base):
    """bfloat16 products on weights packed once (asr.static_encoder) are F.linear's sums."""
    tensors = whisper_base.checkpoint.with_prefix("model.encoder.")
    heads = whisper_base.config.encoder_attention_heads
    halves = {name: t.to(torch.bfloat16) for name, t in tensors.items()}
    encoder, unpacked = StaticEncoder(halves, heads), StaticEncoder(halves, heads)
    if not encoder.packed:
        pytest.skip("this CPU has no native bfloat16 through oneDNN")
    mel = whisper_base.log_mel(load_audio(SAMPLES / "jfk.wav"))[None, :, :N_FRAMES]
    packed = encoder(mel)
    unpacked.packed = False  # decided before its first call: a packed encoder drops the rest
    plain = unpacked(mel)
    assert packed.dtype == torch.bfloat16 and packed.shape == (1, 1500, 512)
    assert torch.equal(packed, plain)
    assert StaticEncoder(tensors, heads).packed is False  # float32 keeps F.linear's kernel


def test_released_tensors_are_read_back_when_asked_for_by_name_or_as_a_whole():
    reads = []

    def reload(names):  # what the file holds: each tensor filled with its name's length
        reads.append(names)
        return {name: torch.full((2,), float(len(name))) for name in names}

    tensors = Tensors({"a": torch.ones(2), "bb": torch.full((2,), 2.0)}, reload)
    assert tensors.release(["bb", "missing"]) == 8  # bytes; what it does not hold is skipped
    assert dict.keys(tensors) == {"a"} and tensors.released == {"bb"}
    assert "bb" in tensors and tensors.names() == {"a", "bb"} and reads == []
    assert torch.equal(tensors["bb"], torch.full((2,), 2.0)) and reads == [["bb"]]
    tensors.release(["a", "bb"])
    assert tensors.get("nothing") is None and reads == [["bb"]]
    assert sorted(tensors) == ["a", "bb"] and reads[-1] == ["a", "bb"]  # a whole view: all
    assert tensors.released == frozenset()
    with pytest.raises(KeyError):
        tensors["nothing"]
    # Other weights in the file than the ones released: refused, never mixed in.
    changed = Tensors({"c": torch.full((2,), 5.0)}, reload)
    changed.release(["c"])
    with pytest.raises(ValueError, match=r"weights on disk changed since it was loaded \(c\)"):
        changed["c"]
    kept = Tensors({"a": torch.ones(2)})  # nothing to read them back from: none released
    assert kept.release(["a"]) == 0 and "a" in dict.keys(kept)


@pytest.mark.slow
def test_quantized_layers_and_a_packed_encoder_release_the_weights_they_copied(registry):
    """An int8 target's decoder and head, its draft's, and a bfloat16 encoder on packed
    weights read copies of the checkpoint's float weights: those are dropped from memory, and
    read back, the same, where anything asks for them (a runtime of another kind)."""
    from asr.precision import resolve_precision
    from asr.transcribe import TranscribeOptions, transcribe
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import load_draft

    path = registry.resolve("whisper-base")
    dtypes = resolve_precision("cpu", "int8")
    model = WhisperModel.load(path, encoder_dtype=dtypes.encoder, int8_decoder=True)
    original = {name: tensor.clone() for name, tensor in model.checkpoint.tensors.items()}
    audio = load_audio(SAMPLES / "jfk.wav")
    options = TranscribeOptions(language="en")
    plain = transcribe(model, audio, options)
    released = model.checkpoint.released
    layer = "model.decoder.layers.3."
    for product in ("self_attn.q_proj", "self_attn.v_proj", "encoder_attn.out_proj", "fc2"):
        assert f"{layer}{product}.weight" in released
    # Not the cross-attention's: its values are computed for every window, and a draft
    # loaded later (once the speech repays it) takes keys and values from its target.
    assert not any(
        ".encoder_attn.k_proj." in name or ".encoder_attn.v_proj." in name for name in released
    )
    reads = []
    reload = model.checkpoint.tensors._reload
    model.checkpoint.tensors._reload = lambda names: reads.append(names) or reload(names)
    assistant = load_draft(model, registry.resolve("whisper-base-draft"), int8=True)
    drafted = transcribe(model, audio, options, draft=assistant)
    assert drafted.segments == plain.segments
    assert reads == []  # nothing read back: a run never depends on the file after its load
    assert "model.decoder.embed_tokens.weight" not in released
    if model._encoder.packed:
        assert "model.encoder.layers.2.fc1.weight" in released
    freed = sum(original[name].numel() * original[name].element_size() for name in released)
    assert freed > 80e6  # of whisper-base's 290 MB
    draft_released = assistant.model.checkpoint.released
    assert "model.decoder.layers.1.fc1.weight" in draft_released
    # Read back as they were, for whatever builds from the whole checkpoint.
    model.use_linear_kind("packed")  # a float32 decoder: its weights read back
    _ = model.runtime
    assert not any(name.startswith("model.decoder.") for name in model.checkpoint.released)
    for name, tensor in model.checkpoint.tensors.items():  # a whole view: every one back
        assert torch.equal(tensor, original[name]), name
    assert model.checkpoint.tensors.released == frozenset()


def test_an_int8_store_hands_back_the_layers_it_saved(tmp_path):
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(64, 32, generator=generator), torch.randn(16, 64, generator=generator)]
    bias = torch.randn(64, generator=generator)
    path = tmp_path / "store.safetensors"

    first = Int8Store(path, "model-a")
    made = [first.linear(weights[0], bias), first.linear(weights[1], input_passes=2)]
    first.save()
    assert path.is_file()

    again = Int8Store(path, "model-a")
    read = [again.linear(weights[0], bias), again.linear(weights[1], input_passes=2)]
    assert not again._new  # both read back, none quantized
    states = torch.randn(5, 32, generator=generator)
    assert torch.equal(read[0](states), made[0](states))
    assert torch.equal(read[1](read[0](states)), made[1](made[0](states)))
    assert read[1].input_passes == 2

    other = Int8Store(path, "model-b")  # another checkpoint: quantized anew
    assert not other._saved
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    broken = Int8Store(tmp_path / "broken.safetensors", "model-a")
    assert torch.equal(broken.linear(weights[0], bias)(states), made[0](states))


@pytest.mark.slow
def test_transcribing_imports_nothing_from_transformers(registry, tmp_path):
    script = (
        "import sys\n"
        "from specscribe.cli import main\n"
        f"code = main(['transcribe', {str(SAMPLES / 'jfk.wav')!r}, '--precision', 'int8',"
        " '--language', 'en'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')\n"
        "print('transformers modules:', len(heavy))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "ask not what your country can do for you" in done.stdout
    assert "transformers modules: 0" in done.stdout


def test_a_tokenizer_file_is_parsed_once_and_named_by_its_digest(whisper_base, whisper_tiny_en):
    from asr.tokenizer import WhisperTokenizer
    from asr.whisper_drafters import _same_vocabulary

    again = WhisperTokenizer(whisper_base.checkpoint.path)
    assert again.digest == whisper_base.tokenizer.digest
    assert again._tokenizer is whisper_base.tokenizer._tokenizer  # parsed once
    assert again.encode(" ask not") == whisper_base.tokenizer.encode(" ask not")
    # Another file: another digest, and the vocabularies are then compared in full.
    assert whisper_tiny_en.tokenizer.digest != whisper_base.tokenizer.digest
    assert not _same_vocabulary(whisper_base, whisper_tiny_en)
    assert _same_vocabulary(whisper_base, whisper_base)


def test_a_users_text_never_becomes_a_control_token(whisper_base):
    # A prompt "<|en|>" put the real language token in the prompt: German speech came out in
    # English, labelled German; "<|endoftext|>" or "<|translate|>" in hotwords did the same.
    from asr.transcribe import TranscribeOptions
    from asr.window_session import Session

    tokenizer = whisper_base.tokenizer
    # Timestamp markup too: a prompt of "<|30.00|>" tokens made Whisper time whole seconds.
    markup = " Hallo <|en|> Welt <|endoftext|><|translate|> <|0.00|> hi <|30.00|>"
    assert 50257 in tokenizer.encode(markup)  # the plain encoder reads control tokens
    assert 50364 in tokenizer.encode(markup)  # and timestamps
    as_text = tokenizer.encode_text(markup)
    assert max(as_text) < 50257 and tokenizer.decode(as_text) == markup
    assert tokenizer.encode_text(" ask not") == tokenizer.encode(" ask not")  # text as before
    options = TranscribeOptions(initial_prompt="<|en|>", hotwords="<|translate|>")
    session = Session(whisper_base, np.zeros(16_000, np.float32), options, None, None)
    assert max(session.initial_prompt + session.hotwords) < 50257


@pytest.mark.slow
def test_the_console_entry_exits_with_the_runs_status_after_writing_everything(tmp_path):
    """`python -m specscribe.cli transcribe` leaves without the interpreter's teardown
    (app.cli.run): outputs, printed text and the exit status must all be there."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "jfk.wav").symlink_to(SAMPLES / "jfk.wav")
    (folder / "notes.wav").write_text("not audio")
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(folder)]
    command += ["--output-dir", str(tmp_path / "out"), "--language", "en", "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

    assert done.returncode == 1, done.stderr  # one file failed
    assert "ask not what your country can do for you" in done.stdout
    assert "1 transcribed, 0 skipped (outputs exist), 1 failed" in done.stderr
    assert json.loads((tmp_path / "out" / "jfk.json").read_text())["text"]
    again = subprocess.run(
        [*command[:4], str(folder / "jfk.wav"), *command[5:]],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0 and "jfk.wav has its outputs in" in again.stderr
