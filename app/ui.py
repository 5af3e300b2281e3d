"""The web UI: a Gradio app that talks to the TranscriptionService only.

Upload or record audio (or give a video, any file ffmpeg reads), choose the language, task,
speakers, draft and word timestamps, then read the transcript (times and speaker labels), the
decode statistics, and download txt/srt/vtt/json (and rttm when speakers were labelled). A page
stops its transcription when it is closed, when Stop is pressed or another recording chosen.

Concurrency: the service runs one request at a time (its models are not re-entrant, so it holds a
lock), and the transcribe event has a concurrency limit of 1 to match. What Gradio's queue adds is
fairness and feedback, not parallel decoding: requests wait in arrival order instead of holding
a worker thread blocked on the lock, each waiting user sees their position and an estimated wait,
a running request streams its progress bar, and a bounded queue (`queue_size`) turns a flood into
a clear "queue is full" message rather than a pile of stalled connections. Page loads, uploads and
downloads are not queued, so they stay responsive while a long file decodes.

Nothing is fetched from the internet: analytics are off (app.config), the default theme uses
fonts that Gradio serves itself, and server-side rendering (which needs a Node server) is off.
"""

from __future__ import annotations

import html
import itertools
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import gradio as gr

from asr.audio import (
    AudioChannelError,
    AudioLoadError,
    AudioStreamError,
    AudioTooLongError,
    DecodingStopped,
    decode_audio,
)
from asr.types import ProgressHook, Transcript
from asr.writers import output_paths, write_outputs

from .api.work_queue import Abandoned, until_stopped
from .service import MAX_PROMPT_CHARACTERS, ServiceOptions, TranscriptionService

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
DOWNLOAD_FORMATS = ("txt", "srt", "vtt", "json")  # + rttm when the request labelled speakers
AUTO_LANGUAGE = "auto"
# The language detected in every window (ServiceOptions.multilingual): recordings that change
# language. Offered by multilingual models only.
PER_WINDOW_LANGUAGE = "per-window"
# The form's beam search: faster-whisper's default decoding (beam_size=5, best_of=5).
BEAM_SEARCH_SIZE = 5
# The form's channel choices (label, `ServiceOptions.channel`): a file's channels mixed, or
# one side of a call recorded with each party on its own channel.
CHANNEL_CHOICES = [
    ("Both, mixed", ""),
    ("Left only (channel 0)", "left"),
    ("Right only (channel 1)", "right"),
]
KEEP_OUTPUTS_SECONDS = 3600  # a request's download files are removed after this long


# -- pure formatting helpers (unit-tested without a browser) ------------------------------


def clock(seconds: float) -> str:
    """12.34 -> "00:12.3"; with hours when there are any: 3725.0 -> "1:02:05.0"."""
    tenths = round(seconds * 10)
    hours, tenths = divmod(tenths, 36_000)
    minutes, tenths = divmod(tenths, 600)
    text = f"{minutes:02d}:{tenths // 10:02d}.{tenths % 10}"
    return f"{hours}:{text}" if hours else text


def transcript_text(transcript: Transcript) -> str:
    """One line per segment: "[00:06.7 → 00:07.2] SPEAKER_00: Hello?"."""
    lines = []
    for segment in transcript.segments:
        text = " ".join(segment.text.split())
        if not text:
            continue
        speaker = f"{segment.speaker}: " if segment.speaker else ""
        lines.append(f"[{clock(segment.start)} → {clock(segment.end)}] {speaker}{text}")
    return "\n".join(lines)


def mean_accepted(histogram: Sequence[int]) -> float:
    """Mean drafted tokens accepted per verify step; histogram[n] = steps that accepted n."""
    steps = sum(histogram)
    return sum(n * count for n, count in enumerate(histogram)) / steps if steps else 0.0


def stats_markdown(transcript: Transcript) -> str:
    """The decode statistics as a short Markdown list.

    Plain greedy decoding makes one target call per generated token, so with a draft the target
    calls saved are `generated_tokens - target_calls`. Wall time saved is not shown: it needs
    the same request decoded without the draft (`specscribe bench asr` measures that).
    """
    stats, options = transcript.stats, transcript.options
    tokens, calls = stats.get("generated_tokens", 0), stats.get("target_calls", 0)
    total = stats.get("total_seconds", 0.0)
    model = options.get("model", "?")
    lines = [
        f"- **{tokens} tokens**, {transcript.duration:.1f} s of audio, language "
        f"`{transcript.language}`, model `{model}`",
    ]
    # Windows decoded side by side (passages after long pauses) share each target call, so
    # calls then say nothing of what the draft saved: plain decoding too makes fewer than one
    # a token.
    side_by_side = stats.get("passages", 1) > 1
    beams = stats.get("beam_size", 1)
    if not tokens:
        pass  # nothing decoded (no speech): no calls to count, nothing saved
    elif beams > 1:
        lines.append(
            f"- **Beam search** of {beams} hypotheses, no draft: {calls} target calls for "
            f"{tokens} tokens (each call scores every hypothesis)"
        )
    elif options.get("assistant"):
        per_call = (
            ""
            if side_by_side
            else f"{stats.get('tokens_per_target_call', 0.0):.2f} tokens per target call, "
        )
        lines.append(
            f"- **Draft** `{options['assistant']}`: {per_call}"
            f"{mean_accepted(stats.get('accepted_histogram', ())):.2f} drafted tokens accepted "
            f"per verify step"
        )
        if side_by_side:
            lines.append(
                f"- {calls} target calls and {stats.get('draft_calls', 0)} draft calls for "
                f"{tokens} tokens (windows decoded side by side share each call)"
            )
        else:
            saved = tokens - calls
            share = f" ({saved / tokens:.0%})" if tokens else ""
            lines.append(
                f"- **Target calls saved**: {saved}{share} — {calls} calls instead of {tokens}, "
                f"for {stats.get('draft_calls', 0)} draft calls"
            )
    elif side_by_side:
        lines.append(
            f"- No draft: {calls} target calls for {tokens} tokens (windows decoded side by "
            "side share each call)"
        )
    else:
        lines.append(f"- No draft: {calls} target calls, one per token")
    lines.append(
        f"- **Time**: {total:.1f} s decoding (encoder {stats.get('encoder_seconds', 0.0):.1f} s, "
        f"draft {stats.get('draft_seconds', 0.0):.1f} s, "
        f"target {stats.get('verify_seconds', 0.0):.1f} s)"
        + (f", real-time factor {total / transcript.duration:.2f}" if transcript.duration else "")
    )
    if "vad" in stats:
        lines.append(
            f"- **Speech**: {stats.get('speech_seconds', 0.0):.1f} s of "
            f"{transcript.duration:.1f} s decoded (VAD: {stats['vad']})"
        )
    if "speakers" in stats:
        holding = stats.get("speakers_with_words", stats["speakers"])
        lines.append(
            f"- **Speakers**: {stats['speakers']}, {holding} with words "
            f"(diarization {stats['diarize_seconds']:.1f} s)"
        )
    lines.extend(f"- **Warning**: {warning}" for warning in transcript.warnings)
    return "\n".join(lines)


def describe_progress(stage: str, completed: int, total: int) -> tuple[float, str]:
    """The service's progress(stage, completed, total) -> (fraction in [0, 1], label)."""
    fraction = min(max(completed / total, 0.0), 1.0) if total > 0 else 0.0
    if stage == "transcribe":
        label = "Transcribing"
    elif stage.startswith("diarize"):
        step = stage.removeprefix("diarize").strip()
        label = f"Finding speakers ({step})" if step else "Finding speakers"
    else:
        label = stage[:1].upper() + stage[1:]
    return fraction, label


def request_options(
    language: str | None,
    task: str,
    word_timestamps: bool,
    use_draft: bool,
    diarize: bool,
    num_speakers: float | None,
    min_speakers: float | None,
    max_speakers: float | None,
    vad: bool = True,
    initial_prompt: str | None = None,
    beam_search: bool = False,
    audio_stream: str | None = None,
    channel: str | None = None,
) -> ServiceOptions:
    """The form's values -> validated ServiceOptions (ValueError names a bad field).

    Speaker counts of 0 or empty mean "not set"; they are ignored unless `diarize`, since the
    form hides them then. An empty or blank prompt means none. beam_search: faster-whisper's
    default decoding (beam 5, the best of 5 samples where a window falls back). audio_stream:
    of a file with several, an index counted from 0 or a language; empty: the default one.
    channel: "left", "right" or an index counted from 0; empty: every channel mixed.
    """

    def count(value: float | None, name: str) -> int | None:
        if not diarize or value is None or value == 0:
            return None
        if value != int(value):
            raise ValueError(f"{name} must be a whole number, not {value}")
        return int(value)

    detected = language in (AUTO_LANGUAGE, PER_WINDOW_LANGUAGE)
    return ServiceOptions(
        language=None if detected else language,
        multilingual=language == PER_WINDOW_LANGUAGE,
        task=task,
        word_timestamps=word_timestamps,
        use_assistant=use_draft,
        diarize=diarize,
        num_speakers=count(num_speakers, "num_speakers"),
        min_speakers=count(min_speakers, "min_speakers"),
        max_speakers=count(max_speakers, "max_speakers"),
        vad=vad,
        initial_prompt=initial_prompt,
        beam_size=BEAM_SEARCH_SIZE if beam_search else 1,
        best_of=BEAM_SEARCH_SIZE if beam_search else 1,
        audio_stream=audio_stream,
        channel=channel,
    )


def safe_stem(path: str | Path) -> str:
    """A download file name stem from an upload's name: letters, digits, '.', '-' and '_'."""
    stem = re.sub(r"[^\w.-]+", "_", Path(path).stem).strip("._")
    return stem or "audio"


def language_choices(codes: Sequence[str]) -> list[tuple[str, str]]:
    """Whisper language codes -> dropdown (label, value) pairs, "Detect" first, then (where
    there are several) "Detect in every window"."""
    try:
        from asr.languages import LANGUAGES
    except ImportError:  # names are a nicety; codes alone still work
        LANGUAGES = {}
    named = sorted((f"{LANGUAGES.get(code, code).title()} ({code})", code) for code in codes)
    per_window = [("Detect in every window", PER_WINDOW_LANGUAGE)] if len(codes) > 1 else []
    return [("Detect", AUTO_LANGUAGE), *per_window, *named]


# -- the app --------------------------------------------------------------------------------


class WebApp:
    """The request handler behind the page: form values in, transcript and files out.

    outputs_dir: where each request's download files are written (one sub-folder per request,
    removed after KEEP_OUTPUTS_SECONDS; Gradio serves copies from its own cache).
    """

    def __init__(self, service: TranscriptionService, outputs_dir: Path) -> None:
        self.service = service
        self.outputs_dir = outputs_dir
        # Each browser session's running transcription (its audio's path, its stop signal),
        # told to stop when its page asks for another recording, presses Stop or closes.
        self._running: dict[str, tuple[str, threading.Event]] = {}
        # Presses of Transcribe still in the queue, by ticket (`requested`): their page and
        # recording. Stop, another recording or the page closed takes a page's tickets back,
        # and a transcription whose ticket is gone ends as it starts.
        self._queued: dict[int, tuple[str, str | None]] = {}
        self._tickets = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def has_draft(self) -> bool:
        return self.service.draft is not None

    def requested(self, audio: str | None, other_file: str | None, request: gr.Request) -> int:
        """A press of Transcribe, as it is made (not queued): the ticket its transcription
        starts with. Until it starts, Stop or another recording takes the ticket back (a
        request waiting behind another page's stayed queued, then ran and showed the
        replaced recording's text under the new one)."""
        ticket = next(self._tickets)
        with self._lock:
            self._queued[ticket] = (request.session_hash, audio or other_file)
        return ticket

    def stop(self, request: gr.Request) -> None:
        """Stops this browser session's transcription: one running ends after the window
        being decoded (or the diarization stage under way; within 0.1 s while ffmpeg reads
        its audio), one waiting in the queue as it starts, each with the message "Stopped.",
        freeing the service for the requests behind it. Without it a closed tab kept the
        service busy to the end of its recording (Gradio cannot stop an event's thread)."""
        self._stop(request.session_hash, unless_audio=None)

    def new_recording(
        self, audio: str | None, other_file: str | None, request: gr.Request
    ) -> tuple[str, str, None]:
        """Another recording in the form (`audio`, else `other_file`, as `transcribe` reads
        them; None once both are cleared): the last one's results
        go as it comes, so that a failure never shows them as its own, and a transcription
        of another recording still running stops, so that its text never shows under this
        one. Gradio may report an upload after the click that transcribes it: that
        transcription, of this very recording, goes on."""
        self._stop(request.session_hash, unless_audio=audio or other_file)
        return "", "", None

    def _stop(self, session: str, unless_audio: str | None) -> None:
        with self._lock:
            for ticket, (page, audio) in list(self._queued.items()):
                if page == session and (unless_audio is None or audio != unless_audio):
                    del self._queued[ticket]
            audio, running = self._running.get(session, (None, None))
            if running is None or (unless_audio is not None and audio == unless_audio):
                return
            del self._running[session]
        running.set()

    def transcribe(
        self,
        audio: str | None,
        language: str,
        task: str,
        use_draft: bool,
        word_timestamps: bool,
        diarize: bool,
        num_speakers: float | None,
        min_speakers: float | None,
        max_speakers: float | None,
        vad: bool = True,
        initial_prompt: str | None = None,
        other_file: str | None = None,
        beam_search: bool = False,
        audio_stream: str | None = None,
        channel: str | None = None,
        request: gr.Request | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's way to ask for a bar)
        ticket: int | None = None,
    ) -> tuple[str, str, list[str]]:
        """One click: returns (transcript text, stats Markdown, download file paths).
        other_file: the form's file of any format (a video), read where `audio` is empty.
        request: the browser session's (Gradio's), whose `stop` ends this transcription.
        ticket: the page's press (`requested`; None: a call through the API), taken back
        while it waited if the page stopped it or moved to another recording."""
        if ticket is not None:
            with self._lock:
                if self._queued.pop(ticket, None) is None:
                    raise gr.Error("Stopped.", print_exception=False)
        # 1. Check the request before any work.
        audio = audio or other_file
        if not audio:
            raise gr.Error("Upload or record some audio first.", print_exception=False)
        try:
            options = request_options(
                language,
                task,
                word_timestamps,
                use_draft,
                diarize,
                num_speakers,
                min_speakers,
                max_speakers,
                vad,
                initial_prompt,
                beam_search,
                audio_stream,
                channel,
            )
        except ValueError as error:
            raise gr.Error(
                html.escape(str(error)), title="Invalid options", print_exception=False
            ) from None

        # 2. Transcribe; errors become messages, never tracebacks.
        session = request.session_hash if request is not None else None
        stop = self._started(session, audio)
        try:
            # The operator's duration cap holds here as in the API (MAX_AUDIO_SECONDS).
            limit = self.service.settings.max_audio_seconds
            decoded = decode_audio(
                Path(audio),
                max_seconds=limit,
                audio_stream=options.audio_stream,
                channel=options.channel,
                stop=stop,
            )
            transcript = self.service.run(
                decoded,
                options,
                progress=until_stopped(stop, gradio_progress(progress)),
                on_window=until_stopped(stop, lambda window: None),
            )
            if stop.is_set():  # stopped as its last window was decided: shown as stopped
                raise Abandoned("stopped by the page")
        except (Abandoned, DecodingStopped):
            log.info("transcription of %s stopped by its page", Path(audio).name)
            raise gr.Error("Stopped.", print_exception=False) from None
        except AudioLoadError as error:
            # The message names the upload's temporary path; the user knows it by its name.
            message = html.escape(str(error).replace(str(audio), Path(audio).name))
            if isinstance(error, AudioTooLongError):
                message = f"{message} (MAX_AUDIO_SECONDS)"
            elif not isinstance(error, AudioStreamError | AudioChannelError):  # reads, not as asked
                message = f"Could not read the audio: {message}"
            raise gr.Error(message, print_exception=False) from None
        except ValueError as error:
            raise gr.Error(html.escape(str(error)), print_exception=False) from None
        except Exception as error:
            log.exception("transcription of %s failed", audio)
            raise gr.Error(
                f"Transcription failed ({type(error).__name__}); the server log has the details.",
                print_exception=False,
            ) from None
        finally:
            self._finished(session, stop)

        # 3. Warnings for results that are empty or unlabelled, then the files.
        text = transcript_text(transcript)
        if not text:
            gr.Warning("No speech was found in this recording.")
        elif diarize and not any(segment.speaker for segment in transcript.segments):
            gr.Warning("No speaker turns were found: the transcript is not labelled.")
        files = self.write_downloads(transcript, safe_stem(audio), diarize)
        return text, stats_markdown(transcript), [str(path) for path in files]

    def _started(self, session: str | None, audio: str) -> threading.Event:
        """The stop signal of a transcription of `audio` starting for `session` (None: not a
        browser's). One the same page started before is stopped: a page shows one result."""
        stop = threading.Event()
        if session is not None:
            with self._lock:
                _, earlier = self._running.get(session, (None, None))
                self._running[session] = (audio, stop)
            if earlier is not None:
                earlier.set()
        return stop

    def _finished(self, session: str | None, stop: threading.Event) -> None:
        with self._lock:
            if session is not None and self._running.get(session, (None, None))[1] is stop:
                del self._running[session]

    def write_downloads(self, transcript: Transcript, stem: str, speakers: bool) -> list[Path]:
        """Writes STEM.txt/.srt/.vtt/.json (+ .rttm) into a fresh folder, atomically."""
        self._remove_old_outputs()
        formats = [*DOWNLOAD_FORMATS, *(["rttm"] if speakers else [])]
        folder = self.outputs_dir / uuid.uuid4().hex
        paths = output_paths(folder, Path(stem), formats)
        write_outputs(transcript, paths)
        return list(paths.values())

    def _remove_old_outputs(self) -> None:
        cutoff = time.time() - KEEP_OUTPUTS_SECONDS
        for folder in self.outputs_dir.glob("*"):
            if folder.is_dir() and folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)


def gradio_progress(progress: gr.Progress) -> ProgressHook:
    """Adapts the service's progress(stage, completed, total) hook to a Gradio progress bar."""

    def hook(stage: str, completed: int, total: int) -> None:
        fraction, label = describe_progress(stage, completed, total)
        progress(fraction, desc=label)

    return hook


def build_app(service: TranscriptionService, outputs_dir: Path, queue_size: int = 16) -> gr.Blocks:
    """The page, wired to `service`; its models are loaded here if they were not already."""
    app = WebApp(service, outputs_dir)
    model = service.model
    multilingual = model.special.multilingual
    codes = sorted(model.special.language_ids) if multilingual else ["en"]
    draft_name = service.draft_model_name if app.has_draft else None

    # delete_cache: every 30 min, Gradio drops uploads and served copies older than 1 h.
    with gr.Blocks(
        title="specscribe", analytics_enabled=False, delete_cache=(1800, KEEP_OUTPUTS_SECONDS)
    ) as demo:
        gr.Markdown(
            "# specscribe\nSpeech to text with speculative decoding: the output is the "
            f"model's own greedy transcript, only faster. Model `{service.asr_model_name}`"
            + (f", draft `{draft_name}`." if draft_name else ", no draft.")
        )
        with gr.Row():
            with gr.Column(scale=2):
                audio = gr.Audio(
                    sources=["upload", "microphone"],
                    type="filepath",
                    label="Audio",
                    buttons=["download"],  # no "share": that posts to Hugging Face Spaces
                    elem_id="audio",
                )
                # The Audio box takes what the browser calls audio; ffmpeg reads far more.
                with gr.Accordion("Video or another format", open=False):
                    other_file = gr.File(
                        label="Any file ffmpeg reads (mp4, mkv, webm, ...): read when the Audio "
                        "box is empty",
                        type="filepath",
                        elem_id="other-file",
                    )
                    audio_stream = gr.Textbox(
                        label="Audio stream of a file with several (a film's languages): its "
                        "number, counted from 0, or its language (eng, de); empty: the default",
                        elem_id="audio-stream",
                    )
                channel = gr.Dropdown(
                    CHANNEL_CHOICES,
                    value="",
                    label="Channels (a call with each side on its own channel)",
                    elem_id="channel",
                )
                with gr.Row():
                    language = gr.Dropdown(
                        language_choices(codes),
                        value=AUTO_LANGUAGE,
                        label="Language",
                        elem_id="language",
                    )
                    task = gr.Radio(
                        ["transcribe", "translate"],
                        value="transcribe",
                        label="Task",
                        info=None if multilingual else "English-only model: transcribe only",
                        interactive=multilingual,
                        elem_id="task",
                    )
                with gr.Row():
                    use_draft = gr.Checkbox(
                        value=app.has_draft,
                        label="Speculative draft",
                        info=f"draft with {draft_name}"
                        if draft_name
                        else "start the server with --assistant NAME to enable",
                        interactive=app.has_draft,
                        elem_id="draft",
                    )
                    word_timestamps = gr.Checkbox(
                        label="Word timestamps", info="in the JSON download", elem_id="words"
                    )
                    vad = gr.Checkbox(
                        value=True,
                        label="Skip silence",
                        info="voice activity detection: no text where nobody speaks",
                        elem_id="vad",
                    )
                    beam_search = gr.Checkbox(
                        label="Beam search",
                        info=f"{BEAM_SEARCH_SIZE} beams: slower, a little more accurate; no draft",
                        elem_id="beams",
                    )
                initial_prompt = gr.Textbox(
                    label="Prompt",
                    placeholder="names, spellings, style (optional)",
                    max_length=MAX_PROMPT_CHARACTERS,
                    elem_id="prompt",
                )
                diarize = gr.Checkbox(
                    label="Label speakers", info="speaker diarization", elem_id="diarize"
                )
                with gr.Row(visible=False) as speaker_counts:
                    # Checked by request_options (a message to the user), not by Gradio's
                    # `minimum`, whose refusal also logs a traceback for a value someone typed.
                    # precision None: 1.5 reaches the check as typed (precision 0 rounded it).
                    number = {"precision": None, "value": 0}
                    num_speakers = gr.Number(label="Speakers (0: detect)", **number)
                    min_speakers = gr.Number(label="At least (0: any)", **number)
                    max_speakers = gr.Number(label="At most (0: any)", **number)
                with gr.Row():
                    button = gr.Button("Transcribe", variant="primary", elem_id="transcribe")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
            with gr.Column(scale=3):
                transcript = gr.Textbox(
                    label="Transcript",
                    lines=14,
                    max_lines=40,
                    interactive=False,
                    buttons=["copy"],
                    elem_id="transcript",
                )
                stats = gr.Markdown(elem_id="stats")
                downloads = gr.File(
                    label="Downloads", file_count="multiple", interactive=False, elem_id="downloads"
                )

        diarize.change(
            lambda on: gr.Row(visible=on),
            diarize,
            speaker_counts,
            queue=False,
            api_visibility="private",
        )
        ticket = gr.State(None)
        pressed = button.click(
            app.requested,
            [audio, other_file],
            [ticket],
            queue=False,
            api_visibility="private",
            trigger_mode="multiple",
        )
        pressed.then(
            app.transcribe,
            [
                audio,
                language,
                task,
                use_draft,
                word_timestamps,
                diarize,
                num_speakers,
                min_speakers,
                max_speakers,
                vad,
                initial_prompt,
                other_file,
                beam_search,
                audio_stream,
                channel,
                ticket,
            ],
            [transcript, stats, downloads],
            api_name="transcribe",
            show_progress_on=[transcript],
            concurrency_limit=1,  # the service decodes one request at a time anyway
            concurrency_id="service",
            # A press while the last one runs is taken (Gradio's "once" ignored it, and a
            # recording replaced meanwhile was never transcribed); the last one then stops.
            trigger_mode="multiple",
        )
        # Another recording, Stop, or the page closed: the transcription running for this page
        # stops (`WebApp.stop`), so that the replaced recording's text never shows under the
        # new one and nobody waits behind a page that has gone.
        for recording in (audio, other_file):
            recording.change(
                app.new_recording,
                [audio, other_file],
                [transcript, stats, downloads],
                queue=False,
                api_visibility="private",
            )
        stop.click(app.stop, None, None, queue=False, api_visibility="private")
        demo.unload(app.stop)
    return demo.queue(max_size=queue_size, default_concurrency_limit=1)
