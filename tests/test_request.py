"""app.request: the one request type every front builds, its rules, and the plan of which
files are left (app.output_plan), shared by the CLI and the workers."""

from __future__ import annotations

import json

import pytest

from app.output_plan import OutputPlan, kept_outputs, plan_outputs
from app.request import MAX_PROMPT_CHARACTERS, ServiceOptions, check_formats
from asr.transcribe import TranscribeOptions
from asr.writers import output_paths, record_path, write_outputs
from tests.test_writers import TRANSCRIPT


def test_languages_are_codes_whatever_the_front_sent():
    for given, code in [("de", "de"), ("German", "de"), ("<|de|>", "de"), (" EN ", "en")]:
        assert ServiceOptions(language=given).language == code
    for locale, code in [("pt-BR", "pt"), ("zh-CN", "zh"), ("en_US", "en")]:  # were refused
        assert ServiceOptions(language=locale).language == code
    # ISO 639-2/3 codes, as other tools and files' metadata write them (were refused).
    for other, code in [("deu", "de"), ("GER", "de"), ("fre", "fr"), ("iw", "he"), ("jv", "jw")]:
        assert ServiceOptions(language=other).language == code
    assert ServiceOptions(language="deu-DE").language == "de"
    for locale, code in [("en_US.UTF-8", "en"), ("sr_RS@latin", "sr"), ("zh-yue", "yue")]:
        assert ServiceOptions(language=locale).language == code
    assert ServiceOptions(language="haw").language == "haw"  # Whisper's own 3-letter codes
    with pytest.raises(ValueError, match=r"^language 'xx-YY' is not a Whisper language code"):
        ServiceOptions(language="xx-YY")
    for detect in (None, "", "auto", "AUTO"):
        assert ServiceOptions(language=detect).language is None
    with pytest.raises(ValueError, match=r"^language 'xx' is not a Whisper language code"):
        ServiceOptions(language="xx")


def test_speaker_counts_ask_for_speakers_and_a_contradiction_is_refused():
    assert ServiceOptions().diarize is False
    assert ServiceOptions(num_speakers=2).diarize is True
    assert ServiceOptions(diarize=None, min_speakers=2).diarize is True
    assert ServiceOptions(diarize=True).diarize is True
    with pytest.raises(ValueError, match="num_speakers, max_speakers needs diarize"):
        ServiceOptions(diarize=False, num_speakers=2, max_speakers=3)
    # Ranges and consistency are the diarizer's options' own rule.
    with pytest.raises(ValueError, match=r"num_speakers must be in 1\.\.100"):
        ServiceOptions(num_speakers=0)
    with pytest.raises(ValueError, match=r"min_speakers \(5\) exceeds max_speakers \(2\)"):
        ServiceOptions(min_speakers=5, max_speakers=2)


def test_empty_text_means_none_and_a_zero_ngram_turns_the_guard_off():
    options = ServiceOptions(initial_prompt="  ", hotwords="", clip_timestamps="")
    assert (options.initial_prompt, options.hotwords, options.clip_timestamps) == (None,) * 3
    assert ServiceOptions(repetition_ngram=0).repetition_ngram is None
    assert ServiceOptions().repetition_ngram == 6
    assert ServiceOptions(passage_pause=0).passage_pause is None
    assert ServiceOptions().passage_pause == 5.0


def test_an_audio_stream_is_an_index_from_0_or_a_language():
    assert ServiceOptions().audio_stream is None
    assert ServiceOptions(audio_stream="").audio_stream is None
    for index in (0, 2, "1", " 3 "):
        assert ServiceOptions(audio_stream=index).audio_stream == int(index)
    for language in ("eng", "en", "English", "ger", "de-AT"):
        assert ServiceOptions(audio_stream=language).audio_stream in ("en", "de"), language
    for wrong in (-1, True, 1.5, "x1", "klingon", "１"):
        with pytest.raises(ValueError, match=r"^audio_stream .* is neither a stream's index"):
            ServiceOptions(audio_stream=wrong)
    stored = ServiceOptions(audio_stream="1").to_json()  # the job store keeps the index
    assert ServiceOptions.from_json(stored).audio_stream == 1


def test_a_channel_is_an_index_from_0_left_right_or_mix():
    assert ServiceOptions().channel is None
    for mixed in ("", "mix", " All ", None):
        assert ServiceOptions(channel=mixed).channel is None
    for asked, index in ((0, 0), ("1", 1), (" 5 ", 5), ("left", 0), ("Right", 1)):
        assert ServiceOptions(channel=asked).channel == index
    for wrong in (-1, True, 1.5, "x1", "centre", "１"):
        with pytest.raises(ValueError, match=r"^channel .* is none of a channel's index"):
            ServiceOptions(channel=wrong)
    assert ServiceOptions.from_json(ServiceOptions(channel="right").to_json()).channel == 1


def test_the_fallback_schedule_follows_its_increment_and_off_turns_a_check_off():
    def schedule(**fields):
        return ServiceOptions(**fields).transcribe_options().temperatures

    assert schedule() == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # OpenAI's
    assert schedule(temperature=0.1, temperature_increment_on_fallback=0.3) == (0.1, 0.4, 0.7, 1.0)
    assert schedule(temperature_increment_on_fallback=0) == (0.0,)  # no fallback
    assert schedule(temperature=0.5, temperature_increment_on_fallback="off") == (0.5,)
    assert schedule(temperature_increment_on_fallback=1.0) == (0.0, 1.0)
    off = ServiceOptions(
        compression_ratio_threshold="None", logprob_threshold="off", no_speech_threshold=None
    ).transcribe_options()
    assert (off.compression_ratio_threshold, off.logprob_threshold, off.no_speech_threshold) == (
        None,
        None,
        None,
    )
    given = ServiceOptions(
        compression_ratio_threshold="2.0", logprob_threshold=0, no_speech_threshold=0.9
    ).transcribe_options()
    assert (given.compression_ratio_threshold, given.logprob_threshold) == (2.0, 0.0)
    assert given.no_speech_threshold == 0.9
    defaults = ServiceOptions().transcribe_options()  # OpenAI's, as TranscribeOptions has them
    assert defaults == TranscribeOptions()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"batch_size": 0}, "batch_size: input should be greater than or equal to 1 (got 0)"),
        ({"temperature": 1.5}, "temperature: input should be less than or equal to 1"),
        ({"temperature": float("nan")}, "temperature: input should be a finite number (got nan)"),
        ({"vad_threshold": float("nan")}, "vad_threshold: input should be a finite number"),
        ({"task": "summarise"}, "task: input should be 'transcribe' or 'translate'"),
        ({"initial_prompt": "x" * (MAX_PROMPT_CHARACTERS + 1)}, "initial_prompt: string should"),
        ({"vad_threshold": 1.5}, "vad_threshold must be in (0, 1)"),
        ({"vad_min_silence_duration": -1}, "vad_min_silence_duration must be in [0, 60] s"),
        ({"clip_timestamps": "20-10"}, "start must be >= 0 and before its end"),
        ({"hallucination_silence_threshold": 2.0}, "needs word_timestamps"),
        ({"speed": 2}, "speed: unknown option"),
        ({"passage_pause": -1}, "passage_pause must be 0 (off) or a positive number of seconds"),
        ({"passage_pause": float("inf")}, "passage_pause: input should be a finite number"),
        ({"passage_pause": float("nan")}, "passage_pause: input should be a finite number"),
        ({"compression_ratio_threshold": 0}, "compression_ratio_threshold must be a positive"),
        ({"compression_ratio_threshold": "x"}, "compression_ratio_threshold: input should be"),
        ({"logprob_threshold": 0.5}, "logprob_threshold must be a log-probability, at most 0"),
        ({"logprob_threshold": "-inf"}, "logprob_threshold: input should be a finite number or"),
        ({"no_speech_threshold": 1.5}, "no_speech_threshold must be a probability in 0..1"),
        ({"temperature_increment_on_fallback": 1.5}, "temperature_increment_on_fallback: input"),
        ({"temperature_increment_on_fallback": 1e-6}, "0 (no fallback) or at least 0.05"),
    ],
)
def test_a_bad_request_is_refused_when_made_in_one_line_naming_the_field(fields, message):
    with pytest.raises(ValueError) as refused:
        ServiceOptions(**fields)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value) and "pydantic" not in str(refused.value)


def test_options_are_frozen_and_a_changed_copy_is_checked_again():
    options = ServiceOptions(language="en", word_timestamps=True)
    with pytest.raises(ValueError):
        options.language = "de"  # type: ignore[misc]
    assert options.replace(vad=False) == ServiceOptions(
        language="en", word_timestamps=True, vad=False
    )
    with pytest.raises(ValueError, match="batch_size"):
        options.replace(batch_size=0)
    # a batch's windows are held together: 1000 of them held 2.9 GB for 10 minutes of audio
    with pytest.raises(ValueError, match="batch_size: input should be less than or equal to 64"):
        options.replace(batch_size=1000)
    assert options.replace(batch_size=64).batch_size == 64


def test_stored_options_read_back_equal_and_keep_the_stored_json_shape():
    options = ServiceOptions(language="en", num_speakers=2, hotwords="Kubernetes")
    text = options.to_json()
    assert ServiceOptions.from_json(text) == options
    stored = json.loads(text)
    assert list(stored) == sorted(stored)  # sorted keys: equal options, equal text
    assert stored["diarize"] is True and stored["use_assistant"] is True


def test_output_formats_have_one_rule():
    check_formats(["txt", "srt"], diarize=False)
    check_formats(["rttm"], diarize=True)
    with pytest.raises(ValueError, match=r"format rttm needs speakers \(--diarize"):
        check_formats(["txt", "rttm"], diarize=False)
    with pytest.raises(ValueError, match="unknown format docx"):
        check_formats(["docx"], diarize=False)
    with pytest.raises(ValueError, match="formats is empty"):
        check_formats([], diarize=False)


def test_the_plan_makes_missing_outputs_redoes_changed_ones_and_skips_finished_ones(tmp_path):
    outputs = output_paths(tmp_path, tmp_path / "talk", ["txt", "json"])
    record = {"model": "whisper-base", "language": "en"}
    assert plan_outputs(outputs, record, overwrite=False).action == "make"
    outputs["txt"].write_text("hello")
    # Outputs without a record (written by hand or an older version) are kept, and said to be,
    # even where others are missing; only overwrite replaces them. The file is not done: what
    # it asked for was not written (it was counted done when all of them were someone else's).
    kept = plan_outputs(outputs, record, overwrite=False)
    assert (kept.action, kept.kept, kept.unrecorded) == ("skip", ("txt",), True)
    assert kept.blocked == ("txt", "json")
    assert plan_outputs(outputs, record, overwrite=True).decode
    outputs["json"].write_text("{}")
    unrecorded = plan_outputs(outputs, record, overwrite=False)
    assert (unrecorded.action, unrecorded.kept) == ("skip", ("txt", "json"))
    assert unrecorded.blocked == ("txt", "json")
    record_path(outputs).write_text(json.dumps(record))
    plan = plan_outputs(outputs, record, overwrite=False)
    assert (plan.action, plan.decode) == ("skip", False)
    assert plan_outputs(outputs, record, overwrite=True).action == "overwrite"
    changed = plan_outputs(outputs, {**record, "language": "de"}, overwrite=False)
    assert (changed.action, changed.changes, changed.decode) == (
        "redo",
        'language "en" -> "de"',
        True,
    )


def test_a_file_kept_beside_outputs_made_otherwise_blocks_them(tmp_path):
    # A reference txt beside its audio, and an srt specscribe made with other options: the srt
    # cannot be made again without the txt being replaced, so the file is not done (the CLI
    # and the worker count it failed), and the user is told both.
    outputs = output_paths(tmp_path, tmp_path / "talk", ["txt", "srt"])
    outputs["txt"].write_text("a reference transcript")
    srt_only = {"srt": outputs["srt"]}
    write_outputs(TRANSCRIPT, srt_only, {"max_line_width": None})
    # The srt is done, but the txt asked for is still someone else's: not done either.
    done = plan_outputs(outputs, {"max_line_width": None}, overwrite=False)
    assert (done.action, done.kept, done.blocked) == ("skip", ("txt",), ("txt",))
    assert "not made either" not in kept_outputs(done, outputs)
    plan = plan_outputs(outputs, {"max_line_width": 20}, overwrite=False)
    assert (plan.action, plan.kept, plan.blocked) == ("skip", ("txt",), ("txt", "srt"))
    told = kept_outputs(plan, outputs)
    assert f"so {outputs['srt']} was not made either" in told


def test_a_redo_says_why():
    changed = OutputPlan("redo", 'language "en" -> "de"')
    assert changed.why == 'options changed (language "en" -> "de")'
    replaced = "the recording changed since its outputs were made"
    assert OutputPlan("redo", replaced, replaced=True).why == replaced
