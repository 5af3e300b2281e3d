"""Precision settled in one place; whisper-base in bfloat16 transcribes right, with and without
a draft in the same dtype."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from app.cli import PRECISIONS as cli_precisions
from app.cli import main
from app.config import Settings
from app.service import ServiceOptions, TranscriptionService
from asr import precision
from asr.audio import load_audio
from asr.precision import (
    PRECISIONS,
    precision_name,
    quantize_draft,
    resolve_dtype,
    resolve_precision,
)
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper_drafters import load_draft
from tests.conftest import SAMPLES, normalised_words, reference_text, word_error_rate

JFK = SAMPLES / "jfk.wav"


@pytest.mark.parametrize(
    ("device", "precision", "dtype"),
    [
        ("cpu", "auto", torch.float32),
        ("cpu", "fp32", torch.float32),
        ("cpu", "bf16", torch.bfloat16),
        ("cuda", "auto", torch.float32),  # the decoder's: "auto" is "mixed" on CUDA
        ("cuda:1", "fp16", torch.float16),
        ("cuda", "fp32", torch.float32),
    ],
)
def test_precision_resolves_to_a_dtype(device, precision, dtype):
    assert resolve_dtype(device, precision) == dtype


def test_fp16_on_cpu_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"fp16 on device cpu.*use bf16"):
        resolve_dtype("cpu", "fp16")


def test_unknown_precision_and_device_name_the_bad_value():
    with pytest.raises(
        ValueError, match=r"precision must be one of auto, fp32, bf16, fp16, mixed, int8, not 'fp8'"
    ):
        resolve_dtype("cpu", "fp8")
    with pytest.raises(ValueError, match=r"unknown device 'gpu0'"):
        resolve_dtype("gpu0", "auto")


def test_mixed_precision_is_a_half_encoder_and_a_float32_decoder():
    cpu = resolve_precision("cpu", "mixed")
    assert (cpu.encoder, cpu.decoder) == (torch.bfloat16, torch.float32)
    assert resolve_precision("cuda", "mixed").encoder == torch.float16
    assert cpu.name == "bf16 encoder, fp32 decoder"
    assert resolve_precision("cpu", "bf16").name == "bf16"


def test_auto_is_lossless_everywhere_int8_on_x86_cpus_and_mixed_on_cuda(monkeypatch):
    assert resolve_precision("cpu", "auto") == resolve_precision("cpu", "int8")
    assert resolve_precision("cpu", "auto").int8_decoder
    monkeypatch.setattr(precision, "cpu_has_int8_kernels", lambda: False)  # arm64, say
    assert resolve_precision("cpu", "auto") == resolve_precision("cpu", "fp32")
    assert resolve_precision("cuda", "auto") == resolve_precision("cuda", "mixed")
    assert resolve_precision("cuda:1", "auto").name == "fp16 encoder, fp32 decoder"


@pytest.mark.slow
def test_mixed_precision_drafting_stays_lossless(settings):
    """With a float32 decoder, block widths cannot change the result: drafted == greedy."""
    service = TranscriptionService(settings, assistant_model="whisper-base", precision="mixed")
    assert service.model.model.model.encoder.conv1.weight.dtype == torch.bfloat16
    assert service.model.dtype == torch.float32
    plain = service.run(JFK, ServiceOptions(use_assistant=False))
    drafted = service.run(JFK, ServiceOptions())
    assert drafted.stats["draft_calls"] > 0
    assert [(s.start, s.end, s.text) for s in drafted.segments] == [
        (s.start, s.end, s.text) for s in plain.segments
    ]
    assert word_error_rate(reference_text(JFK), plain.text) <= 0.05


def test_precision_names_round_trip():
    for name in ("fp32", "bf16", "fp16"):
        assert precision_name(resolve_dtype("cuda", name)) == name
    # bf16 where the CPU computes it natively; emulated bf16 is slower than fp32.
    encoder = "bf16" if precision.cpu_has_native_bf16() else "fp32"
    assert resolve_precision("cpu", "int8").name == f"{encoder} encoder, int8 decoder"
    assert cli_precisions == PRECISIONS


def test_int8_is_refused_on_cuda():
    with pytest.raises(ValueError, match="int8 on device cuda"):
        resolve_precision("cuda", "int8")


def test_settings_read_the_precision_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPECSCRIBE_PRECISION", raising=False)
    assert Settings.from_env().precision == "auto"
    monkeypatch.setenv("SPECSCRIBE_PRECISION", "bf16")
    assert Settings.from_env().precision == "bf16"


def test_service_refuses_a_bad_precision_before_loading_anything(settings):
    with pytest.raises(ValueError, match="fp16 on device cpu"):
        TranscriptionService(settings, precision="fp16")
    bad_env = dataclasses.replace(settings, precision="half")
    with pytest.raises(ValueError, match="precision must be one of"):
        TranscriptionService(bad_env)


def test_cli_reports_an_unsupported_precision(capsys):
    assert main(["transcribe", str(JFK), "--precision", "fp16"]) == 2
    assert "fp16 on device cpu is not supported" in capsys.readouterr().err


@pytest.fixture(scope="module")
def bf16_service(settings):
    """whisper-base drafted by whisper-tiny.en, both loaded by the service in bfloat16."""
    service = TranscriptionService(settings, assistant_model="whisper-tiny.en", precision="bf16")
    return service.load()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_bf16_whisper_base_transcribes_jfk_and_drafting_keeps_its_words(bf16_service):
    service = bf16_service
    assert service.model.dtype == torch.bfloat16
    assert service.draft.model.dtype == torch.bfloat16
    # The weights compute in bf16; what leaves the model for the rules and verification is fp32.
    states = service.model.model.model.decoder.embed_tokens(torch.tensor([[50258]]))
    assert states.dtype == torch.bfloat16
    assert service.model.logits(states).dtype == torch.float32

    plain = service.run(JFK, ServiceOptions(language="en", use_assistant=False))
    drafted = service.run(JFK, ServiceOptions(language="en"))

    assert word_error_rate(reference_text(JFK), plain.text) < 0.05
    assert plain.options["precision"] == "bf16" and plain.options["assistant"] is None
    assert drafted.options["assistant"] == "whisper-tiny.en"
    assert drafted.stats["draft_calls"] > 0
    # Adaptive (the default policy) drafts where it pays: measured 15 target calls against 30.
    assert drafted.stats["target_calls"] * 4 < plain.stats["target_calls"] * 3
    # In bf16 a logit depends on how many tokens the call scores (up to 0.25 here between one
    # token and a 9-token block; 6e-5 in fp32), so a near-tie can flip (on this CPU the drafted
    # run splits JFK's sentence at 7.6 s where the plain one does not). The words stay the same.
    assert normalised_words(drafted.text) == normalised_words(plain.text)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_bf16_whisper_base_drafts_with_its_distilled_draft_in_bf16(bf16_service, registry):
    # fbgemm's int8 kernels take float32 only: this pair crashed on its first draft step when
    # the draft was quantized whatever its dtype.
    target = bf16_service.model
    assistant = load_draft(target, registry.resolve("whisper-base-draft"))
    assert assistant.model.dtype == torch.bfloat16 and assistant.model.linear_kind == "dense"
    with pytest.raises(ValueError, match="an int8 draft needs a float32 decoder on CPU, not bf16"):
        quantize_draft(assistant.model)

    samples = load_audio(JFK)
    options = TranscribeOptions(language="en")
    plain = transcribe(target, samples, options)
    drafted = transcribe(target, samples, options, draft=assistant)
    assert drafted.stats["target_calls"] < plain.stats["target_calls"]
    # bf16 near-ties may flip between a block and one token (see the test above): same words.
    assert normalised_words(drafted.text) == normalised_words(plain.text)


def test_int8_keeps_an_fp32_encoder_where_bf16_is_emulated(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("cpu", "int8").name == "fp32 encoder, int8 decoder"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("cpu", "int8").name == "bf16 encoder, int8 decoder"
