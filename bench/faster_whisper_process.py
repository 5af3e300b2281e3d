"""faster-whisper in a child process of its own, for the ASR benchmark.

Why a process: CTranslate2's wheel bundles its own libgomp next to torch's. Once CTranslate2 has
run in a process, torch's matrix products there slow down for good (measured on the 2-core
CPU: whisper-base int8 greedy over the benchmark set 14.1 s before a faster-whisper pass and
21.9-24.2 s after it, sleeping in between or not; with faster-whisper in a child process, 14 s
throughout). Each engine therefore runs in its own process, as users run them, and neither
disturbs the other's timings.

The child loads the model once and answers requests over a pipe; seconds are measured in the
child around the transcription alone, so the pipe's copies of the audio are not counted.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class FasterWhisperResult:
    seconds: float
    text: str
    generated_tokens: int
    encoder_seconds: float


def _serve(connection, model_dir: str, compute_type: str, threads: int, device: str) -> None:
    """The child's loop: one request (samples, timestamps) in, one result or error out; None
    ends it."""
    from faster_whisper import WhisperModel

    kind, _, index = device.partition(":")
    model = WhisperModel(
        model_dir,
        device=kind,
        device_index=int(index or 0),
        compute_type=compute_type,
        cpu_threads=threads,
    )
    encoder = {"seconds": 0.0}
    encode = model.encode

    def timed_encode(features):
        started = time.perf_counter()
        try:
            return encode(features)
        finally:
            encoder["seconds"] += time.perf_counter() - started

    model.encode = timed_encode  # faster-whisper calls self.encode once per window
    while (request := connection.recv()) is not None:
        samples, timestamps = request
        try:
            encoder["seconds"] = 0.0
            started = time.perf_counter()
            segments, _ = model.transcribe(
                samples,
                language="en",
                task="transcribe",
                beam_size=1,
                temperature=0.0,
                without_timestamps=not timestamps,
                condition_on_previous_text=True,
                vad_filter=False,
            )
            segments = list(segments)  # a generator: decoding happens here
            seconds = time.perf_counter() - started
            connection.send(
                FasterWhisperResult(
                    seconds=seconds,
                    text="".join(s.text for s in segments).strip(),
                    generated_tokens=sum(len(s.tokens) for s in segments),
                    encoder_seconds=encoder["seconds"],
                )
            )
        except Exception as error:  # sent back and raised in the parent, naming the cause
            connection.send(RuntimeError(f"faster-whisper: {type(error).__name__}: {error}"))


class FasterWhisperProcess:
    """A faster-whisper model served by a spawned child process (see the module docstring)."""

    def __init__(
        self, model_dir: Path, compute_type: str, threads: int, device: str = "cpu"
    ) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state
        self._connection, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child_end, str(model_dir), compute_type, threads, device),
            daemon=True,  # never outlives the benchmark
            name=f"faster-whisper-{compute_type}",
        )
        self._process.start()
        child_end.close()

    def transcribe(self, samples: np.ndarray, timestamps: bool) -> FasterWhisperResult:
        try:
            self._connection.send((samples, timestamps))
            reply = self._connection.recv()
        except (EOFError, BrokenPipeError) as error:
            code = self._process.exitcode
            raise RuntimeError(f"faster-whisper's process ended (exit code {code})") from error
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):  # already gone: nothing to end
                self._connection.send(None)
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
        self._connection.close()
