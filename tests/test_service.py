"""TranscriptionService: which draft "auto" picks; request options into decoding and records."""

from __future__ import annotations

import pytest

from app.service import (
    MAX_PROMPT_CHARACTERS,
    ServiceOptions,
    TranscriptionService,
    _choose_draft,
)
from asr.models import SHIPPED_DRAFTS_DIR


def test_auto_picks_the_draft_distilled_for_the_asr_model():
    assert (SHIPPED_DRAFTS_DIR / "whisper-base-draft" / "config.json").is_file()
    assert _choose_draft("auto", "whisper-base") == "whisper-base-draft"
    assert _choose_draft("auto", "whisper-tiny.en") == "none"  # none made for it
    assert _choose_draft("auto", "/some/local/whisper") == "none"
    assert _choose_draft("whisper-tiny.en", "whisper-base") == "whisper-tiny.en"
    assert _choose_draft("none", "whisper-base") == "none"


def test_the_service_resolves_auto_without_loading_models(settings):
    service = TranscriptionService(settings, asr_model="whisper-base", assistant_model="auto")
    assert service.draft_model_name == "whisper-base-draft"
    assert service._model is None  # nothing loaded yet
    int8 = TranscriptionService(
        settings, asr_model="whisper-base", assistant_model="auto", precision="int8"
    )
    assert int8.draft_model_name == "whisper-base-draft"  # it pays in int8 too


def test_prompt_options_reach_the_decoder_and_the_output_record(settings):
    options = ServiceOptions(
        initial_prompt="Kubernetes, Grafana.", condition_on_previous_text=False
    )
    decoding = options.transcribe_options()
    assert decoding.initial_prompt == "Kubernetes, Grafana."
    assert decoding.condition_on_previous_text is False
    # Batched windows are independent: never prompted with each other's text.
    batched = ServiceOptions(batch_size=4, condition_on_previous_text=True).transcribe_options()
    assert batched.condition_on_previous_text is False
    with pytest.raises(ValueError) as caught:
        ServiceOptions(initial_prompt="x" * (MAX_PROMPT_CHARACTERS + 1))
    assert str(caught.value) == (  # the value cut, its quote closed, its length said
        "initial_prompt: string should have at most 4000 characters "
        f"(got '{'x' * 60}'…, {MAX_PROMPT_CHARACTERS + 1} characters)"
    )
    service = TranscriptionService(settings)
    # Set, they are part of what made an output; at their defaults, records made before these
    # options existed still match.
    assert service.output_record(options)["initial_prompt"] == "Kubernetes, Grafana."
    assert service.output_record(options)["condition_on_previous_text"] is False
    default = service.output_record(ServiceOptions())
    assert "initial_prompt" not in default and "condition_on_previous_text" not in default
    # The fallback's settings, at the values every earlier output was decoded with, are not
    # recorded either: an upgrade does not redo a library of outputs; changed, they are.
    fallback = ("temperature_increment_on_fallback", "compression_ratio_threshold")
    fallback += ("logprob_threshold", "no_speech_threshold")
    assert not any(name in default for name in fallback)
    changed = service.output_record(ServiceOptions(logprob_threshold="off"))
    assert "logprob_threshold" in changed and changed["logprob_threshold"] is None


def test_fused_rounds_are_a_setting_of_the_environment_that_reaches_the_loaded_model(
    settings, monkeypatch
):
    from dataclasses import replace

    from app.config import Settings

    assert Settings.from_env().fused_rounds is False
    for text, value in (("1", True), ("true", True), ("On", True), ("0", False), ("no", False)):
        monkeypatch.setenv("SPECSCRIBE_FUSED_ROUNDS", text)
        assert Settings.from_env().fused_rounds is value
    monkeypatch.setenv("SPECSCRIBE_FUSED_ROUNDS", "maybe")
    with pytest.raises(ValueError, match="SPECSCRIBE_FUSED_ROUNDS must be 1 or 0"):
        Settings.from_env()
    service = TranscriptionService(
        replace(settings, fused_rounds=True), asr_model="whisper-tiny.en", assistant_model="none"
    )
    assert service.model.fused_rounds is True  # WindowDecoder fuses its rounds (CUDA only)


def test_traced_steps_are_on_unless_the_environment_turns_them_off(settings, monkeypatch):
    from dataclasses import replace

    from app.config import Settings

    monkeypatch.delenv("SPECSCRIBE_TRACED_STEPS", raising=False)
    assert Settings.from_env().traced_steps is True
    monkeypatch.setenv("SPECSCRIBE_TRACED_STEPS", "0")
    assert Settings.from_env().traced_steps is False
    service = TranscriptionService(
        replace(settings, traced_steps=False), asr_model="whisper-base", assistant_model="auto"
    )
    # Their steps run eagerly (asr.traced_step), the draft's and the target's.
    assert service.draft.model.trace_steps is False
    assert service.model.trace_steps is False


def test_free_heap_pages_are_handed_back_as_the_setting_says(settings, monkeypatch):
    from dataclasses import replace

    import app.malloc
    import app.service
    from app.config import Settings
    from tests.conftest import SAMPLES

    monkeypatch.delenv("SPECSCRIBE_HEAP_TRIM_SECONDS", raising=False)
    assert Settings.from_env().heap_trim_seconds == 2.0
    for text, seconds in (("0", 0.0), ("0.5", 0.5)):
        monkeypatch.setenv("SPECSCRIBE_HEAP_TRIM_SECONDS", text)
        assert Settings.from_env().heap_trim_seconds == seconds
    for wrong in ("-1", "soon", "inf"):
        monkeypatch.setenv("SPECSCRIBE_HEAP_TRIM_SECONDS", wrong)
        with pytest.raises(ValueError, match="SPECSCRIBE_HEAP_TRIM_SECONDS"):
            Settings.from_env()

    trims = []

    def counted(progress, interval):  # trims at every progress call, counting them
        return app.malloc.trimming(progress, 0.0, lambda: trims.append(interval))

    monkeypatch.setattr(app.service, "trimming", counted)
    options = ServiceOptions(language="en", vad=False)
    for every, expected in ((0.0, False), (1.5, True)):
        trims.clear()
        service = TranscriptionService(
            replace(settings, heap_trim_seconds=every),
            asr_model="whisper-tiny.en",
            assistant_model="none",
        )
        service.run(str(SAMPLES / "jfk.wav"), options)
        assert bool(trims) is expected and set(trims) <= {every}


@pytest.mark.slow
def test_auto_loads_its_draft_once_the_speech_transcribed_repays_it(settings):
    from app.service import DRAFT_PAYS_AFTER_SECONDS
    from asr.audio import SAMPLE_RATE, load_audio
    from tests.conftest import SAMPLES

    jfk = load_audio(SAMPLES / "jfk.wav")  # 11 s
    options = ServiceOptions(language="en", vad=False)
    auto = TranscriptionService(settings, asr_model="whisper-base", assistant_model="auto")
    transcripts = []
    for _ in range(4):
        transcripts.append(auto.run(jfk, options))
        if auto._draft:
            break
    runs_without = len(transcripts) - 1
    assert runs_without == int(DRAFT_PAYS_AFTER_SECONDS // (len(jfk) / SAMPLE_RATE))  # 1
    for plain in transcripts[:-1]:
        assert plain.options["assistant"] is None and plain.stats["draft_calls"] == 0
    drafted = transcripts[-1]
    assert drafted.options["assistant"] == "whisper-base-draft"
    assert drafted.stats["draft_calls"] > 0
    assert {t.text for t in transcripts} == {drafted.text}  # the draft changes no word

    # A draft the caller names is used from the first request, as is one a server loaded.
    named = TranscriptionService(
        settings, asr_model="whisper-base", assistant_model="whisper-base-draft"
    )
    assert named.run(jfk, options).stats["draft_calls"] > 0
    loaded = TranscriptionService(settings, asr_model="whisper-base", assistant_model="auto")
    assert loaded.load().run(jfk, options).stats["draft_calls"] > 0


@pytest.mark.slow
def test_draft_branches_are_a_setting_of_the_environment_and_reach_the_loaded_draft(
    settings, monkeypatch
):
    from dataclasses import replace

    from app.config import Settings

    assert Settings.from_env().draft_branches == 1
    monkeypatch.setenv("SPECSCRIBE_DRAFT_BRANCHES", "3")
    assert Settings.from_env().draft_branches == 3
    monkeypatch.setenv("SPECSCRIBE_DRAFT_BRANCHES", "")  # set but empty: as unset
    assert Settings.from_env().draft_branches == 1
    for bad in ("0", "9", "two", "1.5"):
        monkeypatch.setenv("SPECSCRIBE_DRAFT_BRANCHES", bad)
        with pytest.raises(ValueError, match="draft branches must be a whole number from 1 to 8"):
            Settings.from_env()
    monkeypatch.setenv("SPECSCRIBE_DRAFT_BRANCHES", "1")
    monkeypatch.setenv("SPECSCRIBE_LOOKUP_BRANCH", "1")  # a default for trees: inert without
    assert not Settings.from_env().lookup_branch
    monkeypatch.setenv("SPECSCRIBE_DRAFT_BRANCHES", "2")
    assert Settings.from_env().lookup_branch
    service = TranscriptionService(
        replace(settings, draft_branches=2, draft_lookup_branch=True),
        asr_model="whisper-base",
        assistant_model="whisper-base-draft",
    )
    assert service.draft.branches == 2 and service.draft.lookup_branch
    from asr.audio import load_audio
    from tests.conftest import SAMPLES

    jfk = load_audio(SAMPLES / "jfk.wav")
    transcript = service.load().run(jfk, ServiceOptions(language="en"))
    assert transcript.options["draft_branches"] == 2 and transcript.options["lookup_branch"]
    assert transcript.stats["draft_calls"] > 0


@pytest.mark.slow
def test_the_python_api_takes_audio_as_users_hold_it(settings, tmp_path):
    # faster-whisper's users pass open files and soundfile's arrays (int16, (frames, channels))
    # and dicts of options: each gives the transcript of the file, and what is not audio is
    # refused as bad audio before any model work (an int16 array gave an empty transcript in
    # another language, a stereo one a numpy broadcast error, an empty one a torch error).
    import numpy as np
    import soundfile

    from asr.audio import AudioLoadError
    from tests.conftest import SAMPLES

    jfk = SAMPLES / "jfk.wav"
    service = TranscriptionService(settings, asr_model="whisper-tiny.en", assistant_model="none")
    options = {"language": "en"}
    expected = service.run(jfk, ServiceOptions(language="en")).text
    assert "ask not what your country can do for you" in expected
    pcm = soundfile.read(jfk, dtype="int16")[0]
    assert service.run(pcm, options).text == expected
    stereo = np.stack([pcm, pcm], axis=1)  # (frames, 2), as soundfile reads a stereo file
    soundfile.write(tmp_path / "stereo.wav", stereo, 16000, subtype="PCM_16")
    assert service.run(stereo, options).text == service.run(tmp_path / "stereo.wav", options).text
    with jfk.open("rb") as opened:
        assert service.run(opened, options).text == expected
    with jfk.open() as opened, pytest.raises(TypeError, match=r"binary mode \('rb'\)"):
        service.run(opened, options)  # text mode: reading it failed with UnicodeDecodeError
    with pytest.raises(AudioLoadError, match="contains no audio samples"):
        service.run(np.zeros(0, np.float32), options)
    with pytest.raises(TypeError, match="not int"):
        service.run(7, options)
    with pytest.raises(ValueError, match="language"):
        service.run(jfk, {"language": "xx"})
