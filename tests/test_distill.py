"""The distilled draft: training data hygiene, the file format, training, and losslessness."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from asr.audio import SAMPLE_RATE, load_audio
from asr.distill import (
    DistillConfig,
    _batch_loss,
    _Head,
    build_draft,
    choose_vocabulary,
    distill,
    draft_predictions,
    label_windows,
)
from asr.distill_data import (
    TrainingClip,
    generate_sentences,
    is_reported,
    sentences_from_text,
    speak,
    synthetic_clips,
    voices_of,
)
from asr.draft_checkpoint import save_draft
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import WhisperModel
from asr.whisper_drafters import load_draft
from bench.asr_data import SPEECH, benchmark_files, held_out_files, user_files
from tests.conftest import SAMPLES

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_no_benchmark_or_reported_file_can_be_training_data():
    manifest = (SPEECH / "manifest.tsv").read_text().splitlines()[1:]
    listed = {row.split("\t")[0] for row in manifest}
    held_out = {
        str(path.relative_to(SPEECH)) for path in held_out_files() if path.is_relative_to(SPEECH)
    }
    assert held_out <= listed  # the benchmark's files are in the manifest training reads
    assert all(is_reported(relative) for relative in held_out)
    for reported in ("multi/pyannote_sample.wav", "multi/ami_es2004_1min_mixture.wav"):
        assert is_reported(reported)
    trainable = [relative for relative in listed if not is_reported(relative)]
    assert not any(relative.startswith(("en_single/", "en_longform/")) for relative in trainable)
    assert "multi/ami_pyannote_debug/trn03.flac" in trainable


def test_generated_text_is_cut_into_speakable_sentences():
    text = "Bees live in hives.\nA queen lays eggs — thousands of them! Ok.\n\nhttp://x.y #tag"
    assert sentences_from_text(text) == [
        "Bees live in hives.",
        "A queen lays eggs thousands of them!",
    ]


@pytest.mark.integration  # runs espeak-ng: real synthesis, seconds of it
def test_espeak_speech_is_packed_into_windows_of_at_most_28_seconds():
    sentences = ["The bridge was built in the spring of that year."] * 12
    clips = synthetic_clips(sentences, seed=1)
    assert len(clips) >= 2
    assert all(len(c.samples) <= 28 * SAMPLE_RATE and c.source == "synthetic" for c in clips)
    total = sum(len(c.samples) for c in clips)
    one = len(speak(sentences[0], "espeak-ng", "en-us", 165 / 175, Path("/tmp")))
    assert total > 12 * one * 0.8  # every sentence is in some window


def test_flite_speaks_its_share_of_the_sentences_at_the_pace_asked(tmp_path):
    sentence = "The bridge was built in the spring of that year."
    slow = speak(sentence, "flite", "slt", 0.8, tmp_path)
    fast = speak(sentence, "flite", "slt", 1.25, tmp_path)
    assert 1.3 < len(slow) / len(fast) < 1.8  # about 1.5625: duration scales with 1 / pace
    assert np.abs(fast).max() > 0.05  # speech, not silence
    # flite alone: every sentence is flite's, at a pace within the recipe's 140-190 / 175
    clips = synthetic_clips([sentence] * 4, seed=2, engines=("flite",))
    assert len(clips) == 1
    fastest = len(speak(sentence, "flite", "kal16", 190 / 175, tmp_path))
    slowest = len(speak(sentence, "flite", "rms", 140 / 175, tmp_path))
    gaps = 3 * 0.8 * SAMPLE_RATE
    assert 4 * min(fastest, len(fast)) * 0.9 < len(clips[0].samples) < 4 * slowest + gaps


def test_unknown_speech_engines_are_refused():
    with pytest.raises(ValueError, match="speech engines"):
        voices_of(("festival",))
    with pytest.raises(ValueError, match="speech engines"):
        voices_of(())


@pytest.mark.slow
def test_the_language_model_writes_sentences_for_synthetic_speech(registry):
    from app.llm import load_language_model, prompt_continuer

    writer = prompt_continuer(load_language_model(registry, "smollm2-135m"))
    sentences = generate_sentences(writer, 5, seed=3)
    assert len(sentences) == 5
    assert all(4 <= len(s.split()) <= 40 for s in sentences)
    assert sentences == generate_sentences(writer, 5, seed=3)  # seeded: the recipe repeats


@pytest.fixture(scope="module")
def labelled(whisper_base):
    clips = [
        TrainingClip(name, load_audio(SAMPLES / name), "real")
        for name in ("jfk.wav", "librispeech_61-70968-0000.flac")
    ]
    return label_windows(whisper_base, clips, keep_layers=(0, 5), seed=0)


@pytest.mark.slow
def test_labels_are_the_targets_own_transcriptions(whisper_base, labelled):
    texts = [whisper_base.text_of(list(w.labels)) for w in labelled]
    assert "ask not what your country can do for you" in texts[0]
    for window in labelled:
        assert window.tokens[-1] == whisper_base.special.eot
        assert window.tokens[window.first_loss] in (
            whisper_base.special.transcribe,
            whisper_base.special.no_timestamps,
        )
        assert window.teacher_ids.shape[0] == len(window.labels)
        # The teacher's most probable token is the label wherever no timestamp rule intervened.
        top = window.teacher_ids[:, 0].tolist()
        agree = sum(t == label for t, label in zip(top, window.labels, strict=True))
        assert agree >= 0.9 * len(top)
        assert len(window.cross) == 2 and window.cross[0][0].shape[1] == 1500


@pytest.mark.slow
def test_vocabulary_keeps_special_tokens_and_frequent_text(whisper_base, labelled):
    vocabulary = choose_vocabulary(whisper_base, labelled, head_tokens=1000)
    eot, size = whisper_base.special.eot, whisper_base.config.vocab_size
    assert len(vocabulary) == 1000 + (size - eot)
    assert set(range(eot, size)) <= set(vocabulary.tolist())  # specials and timestamps
    labels = {t for w in labelled for t in w.labels}
    assert labels <= set(vocabulary.tolist())
    assert torch.equal(vocabulary, vocabulary.sort().values)
    # The rest is English text in id order: pieces of other scripts are skipped, not kept.
    text = [t for t in vocabulary.tolist() if t < eot]

    def english(token: int) -> bool:
        piece = whisper_base.tokenizer.decode([token])
        return bool(piece) and piece.isascii() and piece.isprintable()

    assert all(t in labels or english(t) for t in text)
    filled_up_to = max(t for t in text if t not in labels)
    skipped = set(range(filled_up_to)) - set(text)
    assert skipped and not any(english(t) for t in skipped)


@pytest.mark.slow
def test_training_raises_agreement_and_the_saved_draft_is_lossless(
    whisper_base, labelled, tmp_path
):
    target_dir = Path(whisper_base.name)
    config = DistillConfig(epochs=4, batch_size=2, head_tokens=2000, validation_fraction=0)
    seconds = {"real_speech": 16.0, "synthetic_speech": 0.0, "make_speech": 0.0, "label": 0.0}
    report = distill(whisper_base, target_dir, tmp_path / "draft", config, labelled, seconds)
    assert report.agreement_after > report.agreement_before + 0.2
    assert 0.0 < report.agreement_after_with_head <= 1.0  # trained on every token, saved head
    recipe = json.loads((tmp_path / "draft" / "recipe.json").read_text())
    assert recipe["layers"] == [0, 5] and recipe["report"]["head_size"] == report.head_size
    assert recipe["target"] == target_dir.name  # not the path of this machine's model cache

    assistant = load_draft(whisper_base, str(tmp_path / "draft"))
    assert assistant.pairing == "shared-encoder"
    assert assistant.model.output_vocabulary is not None
    audio = load_audio(SAMPLES / "librispeech_1089-134686-0002.wav")
    for timestamps in (True, False):
        options = TranscribeOptions(timestamps=timestamps)
        plain = transcribe(whisper_base, audio, options)
        speculative = transcribe(whisper_base, audio, options, draft=assistant)
        assert [(s.start, s.end, s.text) for s in speculative.segments] == [
            (s.start, s.end, s.text) for s in plain.segments
        ]
        assert speculative.stats["draft_calls"] > 0


@pytest.mark.slow
def test_saved_draft_loads_with_the_targets_shared_tensors(whisper_base, tmp_path):
    draft = build_draft(whisper_base, (0, 5))
    vocabulary = torch.arange(whisper_base.config.vocab_size)
    save_draft(draft, vocabulary, (0, 5), Path(whisper_base.name), tmp_path / "d", {"target": "t"})
    files = {p.name for p in (tmp_path / "d").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "recipe.json"} <= files
    size = (tmp_path / "d" / "model.safetensors").stat().st_size
    assert size < 20e6  # the embeddings and cross-attention projections are not stored
    loaded = load_draft(whisper_base, str(tmp_path / "d"), int8=False).model
    target_layer = whisper_base.model.model.decoder.layers[5].encoder_attn.k_proj.weight
    assert torch.equal(
        loaded.model.model.decoder.layers[1].encoder_attn.k_proj.weight, target_layer
    )
    tokens = torch.tensor([[whisper_base.special.sot, 440, 1029]])
    features = torch.randn(1, 1500, 512)
    with torch.no_grad():
        ours = draft.model.decoder(input_ids=tokens, encoder_hidden_states=features)
        theirs = loaded.model.model.decoder(input_ids=tokens, encoder_hidden_states=features)
    # float16 storage of the draft's own tensors
    torch.testing.assert_close(
        ours.last_hidden_state, theirs.last_hidden_state, atol=0.05, rtol=0.01
    )
    # On CPU a draft's layers run in int8 by default (the decoder runtime's fbgemm kernels):
    # still close to the float draft.
    assistant = load_draft(whisper_base, str(tmp_path / "d"))
    quantized = assistant.model
    assert quantized.linear_kind == "dynamic-int8" and loaded.linear_kind == "packed"
    encoded = assistant.encode(whisper_base.cross_attention(features), None)
    positions = torch.arange(tokens.shape[1])[None]
    int8 = quantized.decoder_states(tokens, positions, quantized.new_cache(encoded))
    assert torch.nn.functional.cosine_similarity(int8, ours.last_hidden_state, dim=-1).min() > 0.99
    # ... and so does its output head, whose logits stay close to the float head's.
    with torch.no_grad():
        exact = loaded.logits(theirs.last_hidden_state)
        approximate = quantized.logits(theirs.last_hidden_state)
    assert torch.nn.functional.cosine_similarity(approximate, exact, dim=-1).min() > 0.99
    # fbgemm's int8 head: a draft's head may depend on its call, so it takes the faster kernel.
    assert isinstance(quantized._head, torch.ao.nn.quantized.dynamic.Linear)


@pytest.mark.slow
def test_shipped_draft_is_small_and_pairs_with_its_target(registry, whisper_base):
    # Its losslessness and acceptance on a >2 min recording: tests/test_long_form.py.
    path = Path(registry.resolve("whisper-base-draft"))
    assert sum(f.stat().st_size for f in path.iterdir()) < 30e6
    assistant = load_draft(whisper_base, str(path))
    assert assistant.pairing == "shared-encoder"
    assert assistant.model.cross_from_target == (0, 5)
    recipe = json.loads((path / "recipe.json").read_text())
    trained_on = " ".join(recipe["real_training_windows"])
    # Nothing bench.cli or bench.asr report on (its LibriSpeech is test-clean, training's is
    # train-clean-100, other speakers).
    reported = [p.stem for p in {u.audio for u in user_files() + benchmark_files()}]
    assert reported and not [stem for stem in reported if stem in trained_on]
    assert "en_single" not in trained_on and "en_longform" not in trained_on


@pytest.mark.slow
def test_shipped_draft_predicts_held_out_speech(registry, whisper_base, labelled):
    # jfk and the LibriSpeech clip are benchmark files, never trained on.
    draft = WhisperModel.load_draft(registry.resolve("whisper-base-draft"), whisper_base)
    module, vocabulary, layers = draft.model, draft.output_vocabulary, draft.cross_from_target
    assert layers == (0, 5)
    predicted = draft_predictions(module.eval(), whisper_base, labelled, vocabulary)
    assert [len(p) for p in predicted] == [len(w.labels) for w in labelled]
    hits = sum(
        int((p == torch.tensor(w.labels)).sum()) for p, w in zip(predicted, labelled, strict=True)
    )
    total = sum(len(w.labels) for w in labelled)
    # The same count as the training loss's own, through the saved head.
    _, loss_hits, loss_total = _batch_loss(
        module, whisper_base, labelled, _Head.of(module, vocabulary), 0.0
    )
    assert (hits, total) == (loss_hits, loss_total)
    # bench.draft_agreement on all 21 pieces: 0.770 (the previous draft, also trained on
    # synthetic speech and on files bench.cli reports: 0.794).
    assert hits / total > 0.8


@pytest.mark.slow
def test_config_rejects_layers_the_target_lacks(whisper_tiny_en):
    with pytest.raises(ValueError, match="keep_layers"):
        DistillConfig(keep_layers=(0, 9)).validate(whisper_tiny_en)
    with pytest.raises(ValueError, match="increasing"):
        DistillConfig(keep_layers=(1, 0)).validate(whisper_tiny_en)


def test_a_draft_replaces_only_a_missing_empty_or_draft_folder(tmp_path):
    from asr.draft_checkpoint import check_replaceable

    check_replaceable(tmp_path / "new")  # missing
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    shipped = Path(__file__).resolve().parent.parent / "asr" / "drafts" / "whisper-base-draft"
    check_replaceable(shipped)  # an earlier draft
    thesis = tmp_path / "work" / "thesis.txt"
    thesis.parent.mkdir()
    thesis.write_text("years of it")
    with pytest.raises(ValueError, match="holds other files"):
        check_replaceable(thesis.parent)
    with pytest.raises(ValueError, match="is a file"):
        check_replaceable(thesis)


@pytest.mark.slow
def test_saving_a_draft_over_a_folder_of_other_files_keeps_them(whisper_base, tmp_path):
    """`distill --output ~/drafts` removed the folder and everything in it, then wrote the draft
    there."""
    draft = build_draft(whisper_base, (0, 5))
    vocabulary = torch.arange(whisper_base.config.vocab_size)
    kept = tmp_path / "drafts" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        save_draft(draft, vocabulary, (0, 5), Path(whisper_base.name), kept.parent, {})
    assert [p.name for p in kept.parent.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["drafts"]  # no staging folder left


def test_distill_refuses_what_it_cannot_train_on_and_leaves_other_files_alone(tmp_path, capsys):
    from app.cli import main

    listed = tmp_path / "speech"
    listed.mkdir()
    (listed / "manifest.tsv").write_text("file\tduration_s\n")
    kept = tmp_path / "work" / "thesis.txt"
    kept.parent.mkdir()
    kept.write_text("years of it")
    cases = [
        (["--speech-dir", str(tmp_path / "missing")], "no such folder"),
        (["--speech-dir", str(kept.parent)], "holds no manifest.tsv"),
        (["--speech-dir", str(listed), "--output", str(kept.parent)], "holds other files"),
        (["--speech-dir", str(listed), "--synthetic-sentences", "-3"], ">= 0"),
        (["--speech-dir", str(listed), "--target", "smollm2-135m"], "not a whisper one"),
    ]
    for flags, said in cases:
        assert main(["distill", "--output", str(tmp_path / "out"), *flags]) == 2, flags
        assert said in capsys.readouterr().err, flags
    assert kept.read_text() == "years of it"


def test_saved_windows_are_reused_only_for_the_same_speech(tmp_path):
    from asr.distill import _speech_identity

    first, second = tmp_path / "a", tmp_path / "b"
    for folder, rows in ((first, "x.wav\t1\n"), (second, "y.wav\t2\n")):
        folder.mkdir()
        (folder / "manifest.tsv").write_text("file\tduration_s\n" + rows)
    assert _speech_identity(first) == _speech_identity(first)
    assert _speech_identity(first) != _speech_identity(second)
    before = _speech_identity(first)
    (first / "manifest.tsv").write_text("file\tduration_s\nz.wav\t3\n")  # other recordings
    assert _speech_identity(first) != before
