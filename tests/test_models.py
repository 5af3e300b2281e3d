"""The model registry: names, checksums, conversion of the embedded weights."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import WhisperTokenizer

from asr.models import (
    EMBEDDED,
    MANIFEST,
    ModelFetchError,
    ModelNotFoundError,
    ModelRegistry,
    Wheel,
    check_wheel,
)
from tests.conftest import SAMPLES, reference_text, word_error_rate


def test_unknown_name_lists_the_known_names(tmp_path):
    registry = ModelRegistry(tmp_path)
    with pytest.raises(ModelNotFoundError) as error:
        registry.resolve("whisper-huge")
    for name in EMBEDDED:
        assert name in str(error.value)


def test_hub_ids_and_local_directories_pass_through(tmp_path):
    registry = ModelRegistry(tmp_path / "cache")
    assert registry.resolve("openai/whisper-large-v3") == "openai/whisper-large-v3"
    assert registry.resolve("distil-whisper/distil-large-v3") == "distil-whisper/distil-large-v3"
    assert registry.resolve(str(tmp_path)) == str(tmp_path)
    assert not (tmp_path / "cache").exists()  # resolving fetched nothing


def test_wheel_checksum_mismatch_is_refused(tmp_path):
    wheel_file = tmp_path / "x-1.0-py3-none-any.whl"
    wheel_file.write_bytes(b"not the pinned bytes")
    with pytest.raises(ModelFetchError, match="does not match the pinned"):
        check_wheel(wheel_file, Wheel("x==1.0", "0" * 64, 20))


def test_ensure_rehashes_a_cache_and_fetches_again_only_what_fails(tmp_path, registry, monkeypatch):
    """A node's cache (a Ray node): intact, `ensure` fetches nothing; one flipped byte, it
    fetches the model again (here the fetch is refused: this machine may be offline)."""
    import shutil

    fetches = []

    def refuse(self, model, dest):
        fetches.append(model.name)
        raise ModelFetchError(f"{model.name}: offline")

    monkeypatch.setattr(ModelRegistry, "_download", refuse)
    copied = ModelRegistry(tmp_path / "node-cache")
    shutil.copytree(registry.path_of("whisper-tiny.en"), copied.path_of("whisper-tiny.en"))
    assert copied.ensure("whisper-tiny.en") == copied.path_of("whisper-tiny.en")
    assert fetches == []
    config = copied.path_of("whisper-tiny.en") / "config.json"
    config.write_bytes(config.read_bytes().replace(b"{", b"[", 1))
    with pytest.raises(ModelFetchError, match="offline"):
        copied.ensure("whisper-tiny.en")
    assert fetches == ["whisper-tiny.en"]


def test_a_cached_model_changed_since_its_check_is_rehashed_and_a_damaged_one_fetched_again(
    tmp_path, registry, monkeypatch
):
    """Loading compares each file's size and time with those of its last good check: an
    untouched cache is not re-hashed, a touched but intact one is re-hashed and kept, and one
    whose weights were rewritten is fetched again (refused here, as this machine may be offline)
    with the damaged file named, rather than loaded as garbage."""
    import os
    import shutil

    import asr.models

    fetches, hashes = [], []

    def refuse(self, model, dest):
        fetches.append(model.name)
        raise ModelFetchError("offline")

    def counting_sha256_of(path):
        hashes.append(path.name)
        return real_sha256_of(path)

    real_sha256_of = asr.models.sha256_of
    monkeypatch.setattr(ModelRegistry, "_download", refuse)
    monkeypatch.setattr(asr.models, "sha256_of", counting_sha256_of)
    copied = ModelRegistry(tmp_path / "cache")
    shutil.copytree(registry.path_of("whisper-tiny.en"), copied.path_of("whisper-tiny.en"))
    (copied.path_of("whisper-tiny.en") / asr.models.CHECKED_STAMP).unlink(missing_ok=True)

    assert copied.pull("whisper-tiny.en") == copied.path_of("whisper-tiny.en")  # checked once
    assert hashes and fetches == []
    hashes.clear()
    assert copied.pull("whisper-tiny.en") == copied.path_of("whisper-tiny.en")
    assert hashes == []  # unchanged since: a stat per file

    weights = max(copied.path_of("whisper-tiny.en").iterdir(), key=lambda p: p.stat().st_size)
    os.utime(weights)  # touched, not changed
    copied.pull("whisper-tiny.en")
    assert weights.name in hashes and fetches == []

    with open(weights, "r+b") as stream:  # one byte rewritten in place
        stream.seek(weights.stat().st_size // 2)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelFetchError, match=f"damaged \\({weights.name} no longer match"):
        copied.pull("whisper-tiny.en")
    assert fetches == ["whisper-tiny.en"]

    def read_only(*args, **kwargs):  # a cache on a read-only mount (hunt: a traceback)
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(asr.models.tempfile, "TemporaryDirectory", read_only)
    with pytest.raises(ModelFetchError, match=r"damaged .* cannot be written \(Read-only"):
        copied.pull("whisper-tiny.en")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EMBEDDED))
def test_embedded_models_are_cached_with_matching_checksums(registry, name):
    path = registry.pull(name)  # setup fetched them: this only reads the manifest
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["wheels"] == {w.requirement: w.sha256 for w in EMBEDDED[name].wheels}
    assert registry.verify(name) == []


@pytest.mark.slow
def test_converted_whisper_base_transcribes_jfk_exactly(whisper_base):
    from asr.audio import load_audio
    from asr.transcribe import transcribe

    audio = SAMPLES / "jfk.wav"
    transcript = transcribe(whisper_base, load_audio(audio))
    assert word_error_rate(reference_text(audio), transcript.text) == 0.0
    assert transcript.language == "en"


@pytest.mark.slow
def test_whisper_base_tokenizer_round_trips_text_and_special_tokens(whisper_base):
    tokenizer = whisper_base.tokenizer
    text = " And so my fellow Americans, ask not what your country can do for you."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    specials = {
        "<|endoftext|>": 50257,
        "<|startoftranscript|>": 50258,
        "<|en|>": 50259,
        "<|de|>": 50261,
        "<|translate|>": 50358,
        "<|transcribe|>": 50359,
        "<|startofprev|>": 50361,
        "<|nospeech|>": 50362,
        "<|notimestamps|>": 50363,
        "<|0.00|>": 50364,
        "<|30.00|>": 51864,
    }
    transformers_tokenizer = WhisperTokenizer.from_pretrained(whisper_base.checkpoint.path)
    for token, token_id in specials.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
        assert transformers_tokenizer.convert_ids_to_tokens(token_id) == token
    # transformers derives the timestamp grid from the special tokens: <|0.00|> must stay 0.00.
    decoded = transformers_tokenizer.decode([50364, *ids, 50364 + 550], decode_with_timestamps=True)
    assert decoded == f"<|0.00|>{text}<|11.00|>"
    assert tokenizer.decode([50258, 50259, 50359, *ids, 50257], skip_special_tokens=True) == text
    assert tokenizer.decode([50364, *ids, 50364 + 550]) == text  # timestamps left out, as there
    # Transcription's own tokenizer (asr.tokenizer, no transformers) agrees with transformers'.
    chooser = random.Random(0)
    for _ in range(300):
        row = [chooser.randrange(0, 50257) for _ in range(chooser.randrange(1, 25))]
        assert tokenizer.decode(row) == transformers_tokenizer.decode(row)
    for sample in (text, " naïve café, 3.5%!", "日本語", "  two  spaces"):
        assert tokenizer.encode(sample) == transformers_tokenizer.encode(
            sample, add_special_tokens=False
        )
    assert whisper_base.special.timestamp_begin == 50364
    assert whisper_base.special.no_speech == 50362


@pytest.mark.slow
def test_whisper_tiny_en_has_the_english_only_vocabulary(whisper_tiny_en):
    tokenizer = whisper_tiny_en.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 50256
    assert tokenizer.convert_tokens_to_ids("<|notimestamps|>") == 50362
    tokenizer = WhisperTokenizer.from_pretrained(whisper_tiny_en.checkpoint.path)
    assert tokenizer.convert_ids_to_tokens(50363) == "<|0.00|>"
    assert tokenizer.decode([50363, 50363 + 100], decode_with_timestamps=True) == (
        "<|0.00|><|2.00|>"
    )
    assert not whisper_tiny_en.special.multilingual
    assert whisper_tiny_en.special.no_speech == 50361
    assert len(tokenizer) == whisper_tiny_en.config.vocab_size == 51864


@pytest.mark.slow
def test_plain_greedy_equals_transformers_generate(whisper_base):
    """Our window decoder and transformers' generate agree token for token (no timestamps)."""
    from asr.audio import load_audio
    from asr.logit_rules import LogitRules
    from asr.whisper import N_FRAMES
    from tests.whisper_helpers import decode_window

    samples = load_audio(SAMPLES / "librispeech_1089-134686-0002.wav")
    mel = whisper_base.log_mel(samples)[:, :N_FRAMES]
    features = whisper_base.encode(mel[None])
    prompt = whisper_base.sot_sequence("en", "transcribe", timestamps=False)
    rules = LogitRules(whisper_base.special, whisper_base.suppress_tokens, timestamps=False)
    ours = decode_window(whisper_base, features, prompt, rules, max_new_tokens=224)

    with torch.inference_mode():
        theirs = whisper_base.model.generate(
            input_features=mel[None], language="en", task="transcribe", return_timestamps=False
        )
    generated = [t for t in theirs[0].tolist() if t not in prompt and t != 50257]
    assert list(ours.tokens) == generated


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-3-270m"])
def test_converted_language_models_load_and_know_a_fact(registry, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = registry.resolve(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = "The Eiffel Tower is a famous landmark in the city of"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == prompt
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


def test_pulls_and_checks_of_one_model_at_once_take_turns(tmp_path, monkeypatch):
    """Several processes fetching one model (two terminals on a fresh machine, workers starting
    together) swapped its folder under each other: tracebacks, and a check that re-hashed the
    folder while another replaced it reported a checksum mismatch. Here threads (each with its
    own lock file handle, as processes have) replace a small stand-in model again and again
    while another checks it."""
    import threading
    import time

    import asr.models

    def staged_model(sources, out):
        out.mkdir()
        for index in range(40):
            (out / f"part-{index}.bin").write_bytes(bytes([index]) * 4096)
            time.sleep(0.0005)  # widens the window a swap can fall into

    monkeypatch.setattr(ModelRegistry, "_download", lambda self, model, dest: {})
    monkeypatch.setattr(asr.models, "_extract", lambda *args, **kwargs: None)
    monkeypatch.setitem(asr.models._CONVERTERS, "ct2-whisper", staged_model)
    registry = ModelRegistry(tmp_path / "cache")
    registry.pull("whisper-tiny.en")
    errors, mismatches, pulling = [], [], threading.Event()

    def pull_again():
        try:
            for _ in range(4):
                ModelRegistry(tmp_path / "cache").pull("whisper-tiny.en", force=True)
        except Exception as error:  # any is the failure this test is about
            errors.append(error)

    def check():
        while pulling.is_set():
            if bad := ModelRegistry(tmp_path / "cache").verify("whisper-tiny.en"):
                mismatches.append(bad)

    pullers = [threading.Thread(target=pull_again) for _ in range(3)]
    checker = threading.Thread(target=check)
    pulling.set()
    checker.start()
    for thread in pullers:
        thread.start()
    for thread in pullers:
        thread.join()
    pulling.clear()
    checker.join()
    assert errors == [] and mismatches == []
    assert registry.verify("whisper-tiny.en") == []
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".locks", "whisper-tiny.en"]


def test_a_model_cache_that_is_a_file_is_named_as_one(tmp_path):
    """It said "cannot be written (File exists): make it writable"."""
    (tmp_path / "models").write_text("not a folder")
    with pytest.raises(ModelFetchError, match="models is a file\\): move it"):
        ModelRegistry(tmp_path / "models").pull("whisper-tiny.en")
