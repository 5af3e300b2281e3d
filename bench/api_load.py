"""Load benchmark of the OpenAI-compatible API: concurrent clients, real speech, checked answers.

Starts `specscribe serve` (or uses `--url`), then:
1. references: each recording transcribed once, alone, through the API;
2. load: `--clients` threads each send `--requests` transcriptions, cycling through distinct
   recordings; a 429 (queue full) is retried after its Retry-After, so every request must end
   with a 200 whose text is exactly its own recording's reference (none lost, none mixed up);
3. burst: twice (queue size + 1) requests at once, with no retry: the queue limit must answer
   429 to some, and every accepted one must still get its own transcript;
4. the server must still answer (and, when started here, still run).
It prints p50/p95 latency (of accepted attempts, and end to end with retries), throughput
(requests and audio seconds per second) and the counts as one JSON object, and exits 1 when a
check fails. Not a timed test: figures depend on the machine.

    python -m bench.api_load [--clients 8] [--requests 5] [--queue-size 4] [--assistant auto]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import prog

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO.parent / "shared" / "speech" / "en_single"
# Distinct short recordings with exact references (../shared/speech/manifest.tsv).
SHARED_FILES = (
    "jfk.wav",
    "librispeech_61-70968-0000.flac",
    "librispeech_1995-1837-0001.wav",
    "librispeech_1089-134686-0002.wav",
    "librispeech_1221-135766-0002.wav",
    "ljspeech/LJ001-0001.wav",
    "ljspeech/LJ001-0004.wav",
    "ljspeech/LJ001-0006.wav",
)
SAMPLE_FILES = (
    "jfk.wav",
    "librispeech_1089-134686-0002.wav",
    "librispeech_61-70968-0000.flac",
)


@dataclass(frozen=True)
class Outcome:
    """One request: the file, its final status and text, its tries, and its timings (s)."""

    file: str
    status: int
    text: str | None
    tries: int
    attempt_seconds: float  # the last attempt alone
    total_seconds: float  # from the first send, retries and waits included


def recordings() -> list[Path]:
    if all((SPEECH / name).is_file() for name in SHARED_FILES):
        return [SPEECH / name for name in SHARED_FILES]
    return [REPO / "samples" / name for name in SAMPLE_FILES]


def transcribe(
    client: httpx.Client, path: Path, audio: bytes, retry: bool, key: str | None
) -> Outcome:
    """POSTs one transcription; with `retry`, waits out 429s (Retry-After, at most 1 s)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.perf_counter()
    tries = 0
    while True:
        tries += 1
        sent = time.perf_counter()
        response = client.post(
            "/v1/audio/transcriptions",
            files={"file": (path.name, audio)},
            data={"model": "whisper-1"},
            headers=headers,
        )
        done = time.perf_counter()
        if response.status_code == 429 and retry:
            time.sleep(min(float(response.headers.get("retry-after", "1")), 1.0))
            continue
        text = response.json().get("text") if response.status_code == 200 else None
        return Outcome(str(path), response.status_code, text, tries, done - sent, done - started)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_server(port: int, queue_size: int, assistant: str, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "specscribe.cli", "serve", "--port", str(port)]
    command += ["--queue-size", str(queue_size), "--assistant", assistant]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def wait_ready(url: str, process: subprocess.Popen | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code in (200, 401):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{url} did not answer in {timeout} s")


def run(url: str, args: argparse.Namespace, process: subprocess.Popen | None) -> dict:
    files = recordings()
    audio = {path: path.read_bytes() for path in files}
    seconds = {path: _duration(path) for path in files}
    local = threading.local()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=600)
        return local.client

    # 1. References, one request at a time.
    reference = {}
    for path in files:
        outcome = transcribe(client(), path, audio[path], retry=True, key=args.api_key)
        if outcome.status != 200:
            raise SystemExit(f"reference for {path} failed: {outcome.status}")
        reference[str(path)] = outcome.text

    # 2. Load: clients x requests, every request retried until accepted.
    jobs = [
        files[(c * args.requests + r) % len(files)]
        for c in range(args.clients)
        for r in range(args.requests)
    ]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.clients) as pool:
        load = list(
            pool.map(
                lambda p: transcribe(client(), p, audio[p], retry=True, key=args.api_key), jobs
            )
        )
    wall = time.perf_counter() - started

    # 3. Burst: more than the queue holds, at once, no retries.
    burst_size = 2 * (args.queue_size + 1)
    burst_jobs = [files[i % len(files)] for i in range(burst_size)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=burst_size) as pool:
        burst = list(
            pool.map(
                lambda p: transcribe(client(), p, audio[p], retry=False, key=args.api_key),
                burst_jobs,
            )
        )

    # 4. Still up?
    alive = httpx.get(url + "/v1/models", timeout=10, headers=_auth(args.api_key))
    mixed = [o for o in load + burst if o.status == 200 and o.text != reference[o.file]]
    lost = [o for o in load if o.status != 200] + [o for o in burst if o.status not in (200, 429)]
    refused = [o for o in burst if o.status == 429]
    attempts = [o.attempt_seconds for o in load]
    totals = [o.total_seconds for o in load]
    audio_seconds = sum(seconds[Path(o.file)] for o in load)
    checks = {
        "every_load_request_answered": not [o for o in load if o.status != 200],
        "no_transcript_lost_or_mixed": not mixed and not lost,
        "burst_got_429": bool(refused),
        "burst_accepted_correct": all(
            o.text == reference[o.file] for o in burst if o.status == 200
        ),
        "server_still_up": alive.status_code == 200 and (process is None or process.poll() is None),
    }
    return {
        "clients": args.clients,
        "requests_per_client": args.requests,
        "queue_size": args.queue_size,
        "assistant": args.assistant,
        "recordings": len(files),
        "requests": len(load),
        "audio_seconds": round(audio_seconds, 1),
        "wall_seconds": round(wall, 2),
        "throughput_requests_per_s": round(len(load) / wall, 3),
        "throughput_audio_s_per_s": round(audio_seconds / wall, 2),
        "latency_accepted_p50_s": round(statistics.median(attempts), 3),
        "latency_accepted_p95_s": round(percentile(attempts, 0.95), 3),
        "latency_end_to_end_p50_s": round(statistics.median(totals), 3),
        "latency_end_to_end_p95_s": round(percentile(totals, 0.95), 3),
        "load_429_retries": sum(o.tries - 1 for o in load),
        "burst_requests": burst_size,
        "burst_accepted": sum(o.status == 200 for o in burst),
        "burst_429": len(refused),
        "mixed_up": len(mixed),
        "lost": len(lost),
        "checks": checks,
        "ok": all(checks.values()),
    }


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _duration(path: Path) -> float:
    import soundfile

    return soundfile.info(str(path)).duration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("api_load"), description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=5, help="requests per client")
    parser.add_argument("--queue-size", type=int, default=4, help="serve --queue-size")
    parser.add_argument("--assistant", default="auto", help="serve --assistant")
    parser.add_argument("--url", help="a running server (its --queue-size must be given)")
    parser.add_argument("--api-key", default=os.environ.get("SPECSCRIBE_API_KEY"))
    args = parser.parse_args(argv)
    process = None
    url = args.url
    with tempfile.TemporaryDirectory(prefix="specscribe-load-") as tmp:
        if url is None:
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            process = start_server(port, args.queue_size, args.assistant, Path(tmp) / "serve.log")
        try:
            wait_ready(url, process)
            result = run(url, args, process)
        finally:
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    if process is not None:
        result["server_exit_status"] = process.returncode
        result["ok"] = result["ok"] and process.returncode == 0
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
