"""TranscriptionService: which draft "auto" picks."""

from __future__ import annotations

from app.service import TranscriptionService, _choose_assistant
from asr.models import SHIPPED_DRAFTS_DIR


def test_auto_picks_the_draft_distilled_for_the_asr_model():
    assert (SHIPPED_DRAFTS_DIR / "whisper-base-draft" / "config.json").is_file()
    assert _choose_assistant("auto", "whisper-base") == "whisper-base-draft"
    assert _choose_assistant("auto", "whisper-tiny.en") == "none"  # none made for it
    assert _choose_assistant("auto", "/some/local/whisper") == "none"
    assert _choose_assistant("whisper-tiny.en", "whisper-base") == "whisper-tiny.en"
    assert _choose_assistant("none", "whisper-base") == "none"


def test_the_service_resolves_auto_without_loading_models(settings):
    service = TranscriptionService(settings, asr_model="whisper-base", assistant_model="auto")
    assert service.assistant_model_name == "whisper-base-draft"
    assert service._model is None  # nothing loaded yet
    int8 = TranscriptionService(
        settings, asr_model="whisper-base", assistant_model="auto", precision="int8"
    )
    assert int8.assistant_model_name == "whisper-base-draft"  # it pays in int8 too
