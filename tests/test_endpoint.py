"""The Inference Endpoints handler: real models on real recordings, and every kind of bad input
answered with its 4xx status and a message that names the cause."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json

import pytest

from app.endpoint import EndpointError, to_response
from asr.types import Segment, Transcript, Word
from tests.conftest import (
    REPO,
    SAMPLES,
    collapse_spaces,
    multi_stream_file,
    reference_text,
    two_sided_call,
    word_error_rate,
)

JFK = SAMPLES / "jfk.wav"
MEETING = SAMPLES / "pyannote_sample.wav"  # 30 s, two speakers


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def stm_text(path) -> str:
    """The words of an STM reference (fields after the sixth are the transcript)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return " ".join(line.split(None, 5)[5] for line in lines if line.strip())


@pytest.fixture(scope="module")
def endpoint(settings):
    """whisper-base without a draft, embedded diarization: pinned, whatever the environment."""
    from handler import EndpointHandler  # the module the Inference Toolkit imports

    return EndpointHandler(
        settings=dataclasses.replace(
            settings, asr_model="whisper-base", assistant_model="none", diarization_model="embedded"
        )
    )


@pytest.fixture(scope="module")
def tiny_endpoint(settings, registry):
    """`path` holds whisper-tiny.en (so it wins over ASR_MODEL=whisper-base); diarization off;
    limits small enough for the samples to cross them."""
    from app.endpoint import EndpointHandler

    limited = dataclasses.replace(
        settings,
        asr_model="whisper-base",
        assistant_model="none",
        diarization_model="none",
        max_audio_bytes=500_000,  # jfk.wav (352 kB) fits, pyannote_sample.wav (960 kB) does not
        max_audio_seconds=5.0,  # jfk.wav lasts 11 s
    )
    return EndpointHandler(registry.resolve("whisper-tiny.en"), settings=limited)


@pytest.fixture(scope="module")
def assisted_endpoint(settings):
    """whisper-base drafted by whisper-tiny.en; diarization off."""
    from app.endpoint import EndpointHandler

    return EndpointHandler(
        settings=dataclasses.replace(
            settings,
            asr_model="whisper-base",
            assistant_model="whisper-tiny.en",
            diarization_model="none",
        )
    )


def refused(handler, data) -> EndpointError:
    with pytest.raises(EndpointError) as caught:
        handler(data)
    return caught.value


# -- real requests ---------------------------------------------------------------------------


@pytest.mark.slow
def test_base64_request_with_diarization_names_two_speakers(endpoint, one_torch_thread):
    parameters = {"diarize": True, "batch_size": 4}  # batched: same text here, 3x faster
    result = endpoint({"inputs": b64(MEETING.read_bytes()), "parameters": parameters})

    json.dumps(result)  # the toolkit serialises it as JSON
    assert result["language"] == "en"
    # whisper-base repeats a few sentences near the end of this telephone call (measured WER
    # 0.52 against the STM reference); the words that matter are all there.
    assert word_error_rate(stm_text(SAMPLES / "pyannote_sample.stm"), result["text"]) < 0.6
    for phrase in ("Diane in New Jersey", "originally from Chicago", "Yankee down here"):
        assert phrase in result["text"]
    labels = {chunk["speaker"] for chunk in result["chunks"]}
    assert labels == {"SPEAKER_00", "SPEAKER_01"}
    assert {turn["speaker"] for turn in result["speakers"]} == labels
    assert result["stats"]["speakers"] == 2
    # speakers: alternating turns in time order that together carry the whole text.
    turns = result["speakers"]
    assert all(a["speaker"] != b["speaker"] for a, b in itertools.pairwise(turns))
    starts = [turn["timestamp"][0] for turn in turns]
    assert starts == sorted(starts)
    assert all(turn["timestamp"][0] <= turn["timestamp"][1] for turn in turns)
    assert collapse_spaces(" ".join(turn["text"] for turn in turns)) == result["text"]
    assert result["options"]["diarization_model"] == "embedded"


@pytest.mark.slow
def test_raw_bytes_of_jfk(endpoint, one_torch_thread):
    result = endpoint({"inputs": JFK.read_bytes()})

    assert word_error_rate(reference_text(JFK), result["text"]) == 0.0
    assert "".join(chunk["text"] for chunk in result["chunks"]).strip() == result["text"]
    assert all(chunk["speaker"] is None for chunk in result["chunks"])
    assert result["speakers"] == []
    assert result["chunks"][0]["timestamp"][0] == 0.0
    assert result["stats"]["audio_seconds"] == pytest.approx(11.0, abs=0.01)
    assert result["chunks"][-1]["timestamp"][1] <= result["stats"]["audio_seconds"]
    assert result["stats"]["seconds"] > 0 and result["stats"]["real_time_factor"] > 0
    assert result["options"]["model"] == "whisper-base"


@pytest.mark.slow
def test_a_films_other_language_is_transcribed_when_asked_for(endpoint, tmp_path, one_torch_thread):
    english = SAMPLES / "librispeech_61-70968-0000.flac"
    film = multi_stream_file(tmp_path / "film.mkv", (JFK, ""), (english, "eng"))
    for asked in (1, "eng"):
        result = endpoint({"inputs": b64(film.read_bytes()), "parameters": {"audio_stream": asked}})
        assert word_error_rate(reference_text(english), result["text"]) < 0.1, asked
        assert result["options"]["audio_stream"] == (1 if asked == 1 else "en")


@pytest.mark.slow
def test_one_side_of_a_two_channel_call_is_transcribed_when_asked_for(
    endpoint, tmp_path, one_torch_thread
):
    callee = SAMPLES / "librispeech_1089-134686-0002.wav"
    call = two_sided_call(tmp_path / "call.flac", JFK, callee)
    result = endpoint({"inputs": b64(call.read_bytes()), "parameters": {"channel": 1}})
    assert word_error_rate(reference_text(callee), result["text"]) < 0.1
    assert result["options"]["channel"] == 1
    with pytest.raises(EndpointError, match="but its audio has 2 channels") as refused:
        endpoint({"inputs": b64(call.read_bytes()), "parameters": {"channel": "3"}})
    assert refused.value.status == 422


@pytest.mark.slow
def test_data_url_and_the_blog_parameter_names(endpoint, one_torch_thread):
    """The asr-diarization blog's parameters, at values that mean the same here."""
    url = "data:audio/wav;base64," + b64(JFK.read_bytes())
    blog = {
        "batch_size": 24,
        "assisted": False,
        "chunk_length_s": 30,
        "sampling_rate": 16000,
        "language": "english",
        "task": "transcribe",
    }
    result = endpoint({"inputs": url, "parameters": blog})

    assert word_error_rate(reference_text(JFK), result["text"]) == 0.0
    assert result["options"]["language"] == "en"
    assert result["options"]["batch_size"] == 24


@pytest.mark.slow
def test_word_timestamps_give_one_chunk_per_word(endpoint, one_torch_thread):
    result = endpoint({"inputs": JFK.read_bytes(), "parameters": {"word_timestamps": True}})

    chunks = result["chunks"]
    assert len(chunks) == len(result["text"].split())
    assert "".join(chunk["text"] for chunk in chunks).strip() == result["text"]
    times = [time for chunk in chunks for time in chunk["timestamp"]]
    assert times == sorted(times)


@pytest.mark.slow
def test_the_assistant_drafts_unless_the_request_turns_it_off(assisted_endpoint, one_torch_thread):
    drafted = assisted_endpoint({"inputs": JFK.read_bytes()})
    plain = assisted_endpoint({"inputs": JFK.read_bytes(), "parameters": {"assisted": False}})

    assert word_error_rate(reference_text(JFK), drafted["text"]) == 0.0
    assert drafted["text"] == plain["text"]  # speculative decoding is lossless
    assert drafted["options"]["assistant"] == "whisper-tiny.en"
    assert drafted["stats"]["draft_calls"] > 0
    assert drafted["stats"]["tokens_per_target_call"] > 1
    assert plain["options"]["assistant"] is None
    assert plain["stats"]["draft_calls"] == 0


@pytest.mark.slow
def test_a_whisper_checkpoint_in_path_is_the_asr_model(tiny_endpoint, registry, one_torch_thread):
    assert tiny_endpoint.service.asr_model_name == registry.resolve("whisper-tiny.en")
    error = refused(tiny_endpoint, {"inputs": JFK.read_bytes(), "parameters": {"language": "fr"}})
    assert error.status == 422 and "English-only" in error.message
    error = refused(tiny_endpoint, {"inputs": JFK.read_bytes(), "parameters": {"diarize": True}})
    assert error.status == 422 and "DIARIZATION_MODEL=none" in error.message


# -- limits ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_oversized_raw_bytes(tiny_endpoint):
    error = refused(tiny_endpoint, {"inputs": MEETING.read_bytes()})
    assert error.status == 413
    assert "960104 bytes, more than the 500000 allowed" in error.message


@pytest.mark.slow
def test_oversized_base64_is_refused_before_decoding(tiny_endpoint):
    error = refused(tiny_endpoint, {"inputs": b64(MEETING.read_bytes())})
    assert error.status == 413 and "500000 allowed" in error.message


@pytest.mark.slow
def test_too_long_recording(tiny_endpoint):
    error = refused(tiny_endpoint, {"inputs": b64(JFK.read_bytes())})
    assert error.status == 413
    assert error.message == "inputs: the audio lasts more than the 5 s allowed"


# -- bad input -------------------------------------------------------------------------------

JFK_B64 = b64(JFK.read_bytes())

BAD_REQUESTS = [
    # (request, status, words the message must contain)
    ({"inputs": "not base64!!"}, 400, "character '!' at position 10"),
    ({"inputs": "QUJD" * 3 + "Q"}, 400, "not valid base64"),
    ({"inputs": "data:audio/wav," + JFK_B64}, 400, "data URL must be base64"),
    ({"inputs": ""}, 400, "inputs is empty"),
    ({"inputs": " \n "}, 400, "inputs is empty"),
    ({"inputs": b""}, 400, "inputs is empty"),
    ({"inputs": 42}, 400, "not int"),
    ({"parameters": {}}, 400, '"inputs"'),
    ({"inputs": JFK_B64, "parameter": {}}, 400, "unknown request keys ['parameter']"),
    ({"inputs": JFK_B64, "parameters": ["diarize"]}, 400, "parameters must be a JSON object"),
    ({"inputs": JFK_B64, "parameters": {"speed": 2}}, 422, "speed: unknown parameter"),
    ({"inputs": "https://example.org/talk.mp3"}, 400, "inputs is a URL: this endpoint fetches"),
    ({"inputs": JFK_B64, "parameters": {"num_speakers": "two"}}, 422, "num_speakers: Input"),
    ({"inputs": JFK_B64, "parameters": {"num_speakers": 0}}, 422, "num_speakers: Input should"),
    ({"inputs": JFK_B64, "parameters": {"num_speakers": 1000}}, 422, "num_speakers: Input should"),
    ({"inputs": JFK_B64, "parameters": {"batch_size": 1.5}}, 422, "batch_size: Input should"),
    ({"inputs": JFK_B64, "parameters": {"word_timestamps": "yes"}}, 422, "word_timestamps"),
    ({"inputs": JFK_B64, "parameters": {"task": "summarise"}}, 422, "task: Input should be"),
    ({"inputs": JFK_B64, "parameters": {"language": "klingon"}}, 422, "language 'klingon'"),
    ({"inputs": JFK_B64, "parameters": {"chunk_length_s": 10}}, 422, "chunk_length_s"),
    ({"inputs": JFK_B64, "parameters": {"sampling_rate": 8000}}, 422, "sampling_rate"),
    ({"inputs": JFK_B64, "parameters": {"assistant": True}}, 422, "ASSISTANT_MODEL=none"),
    (
        {"inputs": JFK_B64, "parameters": {"assistant": False, "assisted": False}},
        422,
        "assisted: another name for assistant",
    ),
    (
        {"inputs": JFK_B64, "parameters": {"min_speakers": 3, "max_speakers": 2}},
        422,
        "min_speakers (3) exceeds max_speakers (2)",
    ),
    (
        {"inputs": JFK_B64, "parameters": {"diarize": False, "num_speakers": 2}},
        422,
        "num_speakers needs diarize=True",
    ),
    (
        {"inputs": JFK_B64, "parameters": {"initial_prompt": "x" * 4001}},
        422,
        "initial_prompt: String should have at most 4000 characters",
    ),
    (
        {"inputs": JFK_B64, "parameters": {"condition_on_previous_text": "no"}},
        422,
        "condition_on_previous_text: Input should be a valid boolean",
    ),
    ({"inputs": JFK_B64, "parameters": {"vad": "off"}}, 422, "vad: Input should be"),
    ({"inputs": JFK_B64, "parameters": {"vad_threshold": 1.5}}, 422, "vad_threshold"),
    ({"inputs": JFK_B64, "parameters": {"passage_pause": -1}}, 422, "passage_pause"),
    (
        {"inputs": JFK_B64, "parameters": {"clip_timestamps": "20-10"}},
        422,
        "start must be >= 0 and before its end",
    ),
    (  # infinite seconds are no threshold, and not JSON either
        {
            "inputs": JFK_B64,
            "parameters": {
                "hallucination_silence_threshold": float("inf"),
                "word_timestamps": True,
            },
        },
        422,
        "hallucination_silence_threshold: Input should be a finite number",
    ),
    ({"inputs": JFK_B64, "parameters": {"repetition_ngram": 1}}, 422, "repetition_ngram"),
    ({"inputs": JFK_B64, "parameters": {"temperature": 2.0}}, 422, "temperature: Input should"),
    ({"inputs": JFK_B64, "parameters": {"logprob_threshold": 1.0}}, 422, "logprob_threshold"),
    (
        {"inputs": JFK_B64, "parameters": {"no_speech_threshold": "high"}},
        422,
        "no_speech_threshold: Input should be a valid number",
    ),
    ({"inputs": JFK_B64, "parameters": {"vad_threshold": "nan"}}, 422, "finite number"),
    ({"inputs": JFK_B64, "parameters": {"audio_stream": -1}}, 422, "neither a stream's index"),
    (  # a WAV holds one stream
        {"inputs": JFK_B64, "parameters": {"audio_stream": 1}},
        422,
        "inputs: asked for audio stream 1, but it holds one audio stream: 0",
    ),
]


def test_fallback_parameters_reach_the_options():
    from app.endpoint import parse_parameters

    options = parse_parameters(
        {"temperature": 0.2, "temperature_increment_on_fallback": 0.4, "logprob_threshold": None}
    ).service_options()
    decoding = options.transcribe_options()
    assert decoding.temperatures == (0.2, 0.6, 1.0)
    assert decoding.logprob_threshold is None and decoding.compression_ratio_threshold == 2.4
    plain = parse_parameters({"temperature_increment_on_fallback": 0}).service_options()
    assert plain.transcribe_options().temperatures == (0.0,)


def test_decimals_from_a_query_string_are_read_as_numbers():
    """The toolkit turns only whole non-negative numbers and true/false of a query string into
    JSON types: `?vad_threshold=0.5` reached the parameters as "0.5" and was refused."""
    from app.endpoint import parse_parameters

    query = {
        "vad_threshold": "0.5",
        "logprob_threshold": "-0.5",
        "temperature": "0.2",
        "passage_pause": " 2.5 ",
        "no_speech_threshold": "off",  # off / none / null: a setting turned off
        "compression_ratio_threshold": "None",
    }
    parameters = parse_parameters(query)
    assert (parameters.vad_threshold, parameters.logprob_threshold) == (0.5, -0.5)
    assert (parameters.temperature, parameters.passage_pause) == (0.2, 2.5)
    assert parameters.no_speech_threshold is parameters.compression_ratio_threshold is None
    decoding = parameters.service_options().transcribe_options()
    assert decoding.no_speech_threshold is None and decoding.logprob_threshold == -0.5
    # Whole numbers and booleans stay strict: the toolkit has typed those already.
    for strict in ({"num_speakers": "2"}, {"vad": "false"}, {"vad": 0}):
        with pytest.raises(EndpointError, match="invalid parameters"):
            parse_parameters(strict)
    # Text the toolkit made a number (all digits) is its digits again; they were refused.
    digits = parse_parameters({"clip_timestamps": 5, "hotwords": 1984, "initial_prompt": 2024})
    assert (digits.clip_timestamps, digits.hotwords, digits.initial_prompt) == ("5", "1984", "2024")
    assert digits.service_options().clip_spans() == ((5.0, float("inf")),)
    with pytest.raises(EndpointError, match="invalid parameters"):
        parse_parameters({"hotwords": True})  # a boolean is no text
    # off turns the repetition guard off, as it does the other optional settings
    assert parse_parameters({"repetition_ngram": "off"}).repetition_ngram is None
    # openai-whisper's list form of clip timestamps, in JSON
    listed = parse_parameters({"clip_timestamps": [0, 5.5, 10]}).service_options()
    assert listed.clip_spans() == ((0.0, 5.5), (10.0, float("inf")))


@pytest.mark.slow
def test_the_silence_guard_computes_word_times_without_chunking_by_word(endpoint):
    """The HTTP API computes word times for the guard; the endpoint refused it instead
    ("hallucination_silence_threshold needs word_timestamps")."""
    guarded = endpoint(
        {"inputs": JFK.read_bytes(), "parameters": {"hallucination_silence_threshold": 2.0}}
    )
    assert "fellow Americans" in guarded["text"]
    assert len(guarded["chunks"]) < len(guarded["text"].split())  # a chunk per segment
    assert guarded["options"]["hallucination_silence_threshold"] == 2.0


@pytest.mark.slow
@pytest.mark.parametrize(("request_body", "status", "words"), BAD_REQUESTS)
def test_bad_request(endpoint, request_body, status, words):
    error = refused(endpoint, request_body)
    assert error.status == status
    assert words in error.message
    # What the Inference Toolkit sends back: {"error": str(exception)}, with the status first.
    assert str(error).startswith(f"{status} ")


@pytest.mark.slow
def test_data_urls_in_any_case_and_text_around_base64_are_read(endpoint, one_torch_thread):
    for inputs in (
        "data:audio/wav;BASE64," + JFK_B64,
        "\n DATA:audio/wav;base64," + JFK_B64 + "\n",
    ):
        # repetition_ngram 0 is the guard turned off, as the warnings that name it say
        result = endpoint({"inputs": inputs, "parameters": {"repetition_ngram": 0}})
        assert word_error_rate(reference_text(JFK), result["text"]) < 0.1
        assert result["options"]["repetition_ngram"] is None


@pytest.mark.slow
def test_a_request_that_is_not_an_object(endpoint):
    error = refused(endpoint, ["inputs"])
    assert error.status == 400


@pytest.mark.slow
@pytest.mark.parametrize("encode", [lambda data: data, b64], ids=["raw", "base64"])
def test_bytes_that_are_not_audio(endpoint, encode):
    readme = (REPO / "README.md").read_bytes()
    error = refused(endpoint, {"inputs": encode(readme)})
    assert error.status == 422
    assert error.message.startswith("not decodable audio: inputs: ffmpeg could not decode it")
    assert error.to_dict() == {"error": error.message, "status": 422}


# -- the response, from hand-made transcripts -------------------------------------------------


def word(start, end, text, speaker=None):
    return Word(start, end, text, probability=0.9, speaker=speaker)


def test_response_groups_consecutive_segments_of_one_speaker():
    segments = (
        Segment(0.0, 1.5, " Hello?", speaker="SPEAKER_00"),
        Segment(1.5, 2.25, " Oh, hello.", speaker="SPEAKER_00"),
        Segment(2.5, 4.0, " Neither did I.", speaker="SPEAKER_01"),
        Segment(4.0, 5.0, " Okay.", speaker="SPEAKER_00"),
    )
    transcript = Transcript(segments, "en", duration=5.0, stats={"target_calls": 9})
    result = to_response(transcript, word_level=False, seconds=0.5)

    assert result["text"] == "Hello? Oh, hello. Neither did I. Okay."
    assert result["speakers"] == [
        {"text": "Hello? Oh, hello.", "timestamp": [0.0, 2.25], "speaker": "SPEAKER_00"},
        {"text": "Neither did I.", "timestamp": [2.5, 4.0], "speaker": "SPEAKER_01"},
        {"text": "Okay.", "timestamp": [4.0, 5.0], "speaker": "SPEAKER_00"},
    ]
    assert [chunk["text"] for chunk in result["chunks"]] == [s.text for s in segments]
    assert result["stats"] == {
        "target_calls": 9,
        "audio_seconds": 5.0,
        "seconds": 0.5,
        "real_time_factor": 0.1,
    }


def test_word_level_chunks_carry_each_word_and_its_speaker():
    words = (word(0.0, 0.4, " Hello", "SPEAKER_00"), word(0.5, 0.9, " there.", "SPEAKER_00"))
    segments = (
        Segment(0.0, 0.9, " Hello there.", words=words, speaker="SPEAKER_00"),
        Segment(1.0, 2.0, " Hm.", speaker="SPEAKER_01"),  # no word times: one chunk
    )
    result = to_response(Transcript(segments, "en", duration=2.0), word_level=True, seconds=1.0)

    assert result["chunks"] == [
        {"text": " Hello", "timestamp": [0.0, 0.4], "speaker": "SPEAKER_00"},
        {"text": " there.", "timestamp": [0.5, 0.9], "speaker": "SPEAKER_00"},
        {"text": " Hm.", "timestamp": [1.0, 2.0], "speaker": "SPEAKER_01"},
    ]
    segment_level = to_response(Transcript(segments, "en", 2.0), word_level=False, seconds=1.0)
    assert len(segment_level["chunks"]) == 2


def test_multilingual_chunks_carry_their_segments_language():
    segments = (
        Segment(0.0, 0.9, " Hello.", words=(word(0.0, 0.9, " Hello.", None),), language="en"),
        Segment(1.0, 2.0, " Hallo.", language="de"),
    )
    mixed = Transcript(segments, "en", 2.0, options={"multilingual": True})
    chunks = to_response(mixed, word_level=True, seconds=1.0)["chunks"]
    assert [chunk["language"] for chunk in chunks] == ["en", "de"]
    one = to_response(dataclasses.replace(mixed, options={}), word_level=True, seconds=1.0)
    assert all("language" not in chunk for chunk in one["chunks"])
