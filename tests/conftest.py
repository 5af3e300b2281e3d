"""Shared fixtures (models are loaded once per test session) and the test tiers.

Every test gets exactly one tier marker, selectable with `-m` (CI runs all three):
- unit: pure logic and tiny random models; the whole tier runs in under a minute;
- integration: real weights (a model fixture below, or the `slow` marker);
- e2e: real processes, servers and the browser.
`tier_of` assigns them; a test may also carry its tier marker itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from app.config import Settings

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers on a 2-core machine: one thread each, inherited by the
    # processes the tests start, so neither worker's thread pool spins against the other's.
    os.environ["OMP_NUM_THREADS"] = "1"
    # The few tests that need two threads' numerics (tests/test_vad.py) then share a core with
    # the other worker: their idle thread sleeps instead of spinning (it was ten times slower).
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
SHARED_SPEECH = REPO.parent / "shared" / "speech"
needs_speech = pytest.mark.skipif(
    not (SHARED_SPEECH / "manifest.tsv").is_file(), reason="../shared/speech is not present"
)


TIERS = ("unit", "integration", "e2e")
# Fixtures that load real weights: a test that uses one, however indirectly, is integration.
REAL_MODEL_FIXTURES = frozenset(
    {"registry", "whisper_base", "whisper_tiny_en", "gemma", "gemma_int8", "smollm2", "diarizer"}
)
# Fixtures that start `specscribe` server processes (tests/test_ui.py, tests/test_openai_api.py)
# or run the CLI in one (`generated`).
PROCESS_FIXTURES = frozenset({"server", "servers", "generated"})
# Tests that start processes themselves, by file and test name.
E2E_TESTS = {
    "test_cli.py": {
        "test_ctrl_c_ends_a_transcription_with_a_line_not_a_traceback",
        "test_two_runs_on_one_folder_share_its_files",
        "test_a_reader_that_stops_reading_ends_nothing_but_the_printing",
        "test_the_bench_command_runs_from_anywhere",
    },
    "test_bench_cli.py": {
        "test_a_one_file_run_times_real_processes",
        "test_a_terminated_benchmark_ends_its_running_command_and_removes_its_folder",
    },
    "test_worker.py": {
        "test_claims_from_several_processes_never_overlap",
        "test_a_worker_killed_mid_job_loses_nothing_and_finishes_each_file_once",
        "test_ctrl_c_stops_a_worker_cleanly_and_hands_its_task_back",
        "test_two_workers_process_twenty_queued_files_each_once",
        "test_the_ray_engine_processes_a_folder_on_a_local_instance",
    },
}


def tier_of(item: pytest.Item) -> str:
    """The item's own tier marker, else e2e for processes, integration for real weights (or the
    `slow` marker, which marks tests that load real models or decode real audio), else unit."""
    own = [tier for tier in TIERS if item.get_closest_marker(tier)]
    if own:
        return own[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    name = getattr(item, "originalname", item.name)
    if fixtures & PROCESS_FIXTURES or name in E2E_TESTS.get(item.path.name, ()):
        return "e2e"
    if fixtures & REAL_MODEL_FIXTURES or item.get_closest_marker("slow"):
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item))


def wait_for(condition, timeout: float, what: str, process=None, log: Path | None = None):
    """Polls `condition` until it holds; fails when `process` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            raise AssertionError(f"process exited ({process.returncode}) before {what}:\n{tail}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def reference_text(audio: Path) -> str:
    return audio.with_suffix(".txt").read_text(encoding="utf-8").strip()


def normalised_words(text: str) -> list[str]:
    from bench.asr import normalise  # the benchmarks' normaliser: one rule for every WER

    return normalise(text).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    import jiwer

    return jiwer.wer(" ".join(normalised_words(reference)), " ".join(normalised_words(hypothesis)))


def multi_stream_file(path: Path, *streams: tuple[Path, str]) -> Path:
    """A Matroska file at `path` (made by real ffmpeg) holding each (recording, language tag)
    as a FLAC audio stream, in order, tagged where the tag is not "": a film's languages."""
    import subprocess

    inputs = [argument for source, _ in streams for argument in ("-i", str(source))]
    mapped = [argument for index in range(len(streams)) for argument in ("-map", f"{index}:a")]
    tags = [
        argument
        for index, (_, tag) in enumerate(streams)
        if tag
        for argument in (f"-metadata:s:a:{index}", f"language={tag}")
    ]
    command = ["ffmpeg", "-loglevel", "error", *inputs, *mapped, "-c:a", "flac", *tags, str(path)]
    subprocess.run(command, check=True)
    return path


def two_sided_call(path: Path, left: Path, right: Path) -> Path:
    """A stereo file at `path` (made by real ffmpeg; its extension picks the codec): `left`
    on the left channel, then `right` on the right channel once `left` has ended and half a
    second has passed, each side silent while the other speaks, as a call recorder keeps
    each party on its own channel."""
    import subprocess

    import soundfile

    start_ms = round(soundfile.info(str(left)).duration * 1000) + 500
    mono = "aresample=16000,aformat=sample_fmts=fltp:channel_layouts=mono"
    graph = (
        f"[0]{mono},apad[l];[1]{mono},adelay={start_ms},apad[r];"
        "[l][r]amerge=inputs=2,atrim=end="
        f"{start_ms / 1000 + soundfile.info(str(right)).duration + 0.5:.3f}[a]"
    )
    inputs = ["-i", str(left), "-i", str(right)]
    command = ["ffmpeg", "-loglevel", "error", "-y", *inputs, "-filter_complex", graph]
    subprocess.run([*command, "-map", "[a]", "-ac", "2", str(path)], check=True)
    return path


def playlists_naming(folder: Path, audio: Path) -> dict[str, Path]:
    """An HLS playlist naming `audio` (as an MPEG-TS copy) by absolute path, and an ffconcat
    list naming it by a relative one, as an uploader could write them."""
    import subprocess

    segment = folder / "segment.ts"
    command = ["ffmpeg", "-loglevel", "error", "-y", "-i", str(audio), "-c:a", "aac"]
    subprocess.run([*command, "-f", "mpegts", str(segment)], check=True)
    hls = folder / "list.m3u8"
    hls.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:11\n#EXTINF:11.0,\n{segment}\n#EXT-X-ENDLIST\n")
    concat = folder / "list.ffconcat"
    concat.write_text("ffconcat version 1.0\nfile segment.ts\n")
    return {"hls": hls, "concat": concat}


def collapse_spaces(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@contextlib.contextmanager
def torch_threads(count: int):
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: matmuls then sum in a repeatable order, and on a busy
    2-core machine no idle pool thread spins against another process."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def registry(settings):
    from asr.models import ModelRegistry

    return ModelRegistry(settings.cache_dir)


@pytest.fixture(scope="session")
def whisper_base(registry):
    from asr.whisper import WhisperModel

    return WhisperModel.load(registry.resolve("whisper-base"))


@pytest.fixture(scope="session")
def whisper_base_int8(registry):
    from asr.precision import resolve_precision
    from asr.whisper import WhisperModel

    # As users get it (--precision int8): the encoder in bfloat16, whose output once exposed
    # attention products that were not row-invariant (docs/decoder-runtime.md).
    dtypes = resolve_precision("cpu", "int8")
    return WhisperModel.load(
        registry.resolve("whisper-base"),
        encoder_dtype=dtypes.encoder,
        int8_decoder=dtypes.int8_decoder,
    )


@pytest.fixture(scope="session")
def whisper_tiny_en(registry):
    from asr.whisper import WhisperModel

    return WhisperModel.load(registry.resolve("whisper-tiny.en"))


@pytest.fixture(scope="session")
def gemma(registry):
    from app.llm import load_language_model

    return load_language_model(registry, "gemma-3-270m")


@pytest.fixture(scope="session")
def gemma_int8(gemma):
    from app.llm import LanguageModel, quantize_int8

    return LanguageModel("gemma-3-270m:int8", quantize_int8(gemma.model), gemma.tokenizer)


@pytest.fixture(scope="session")
def smollm2(registry):
    from app.llm import load_language_model

    return load_language_model(registry, "smollm2-135m")


@pytest.fixture(scope="session")
def diarizer(registry):
    from diarize.pipeline import Diarizer

    return Diarizer.embedded(
        registry.resolve("pyannote-segmentation-3.0"), registry.resolve("campplus-sv-zh-en")
    )
