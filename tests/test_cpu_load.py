"""OpenMP's wait policy, chosen as a process starts from what else runs (app.cpu_load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cpu_load import WAIT_POLICY, others_running, wait_policy_default
from tests.conftest import SAMPLES


class Readings:
    """A stand-in for /proc/loadavg whose text changes at every read."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def read_text(self) -> str:
        return self.texts.pop(0)


def test_others_running_is_the_fewest_runnable_tasks_seen_less_the_reader(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.43 2.55 2.52 3/117 22480\n")
    assert others_running(loadavg, readings=1) == 2
    # A task that ran for one reading only is not counted; the reader always is.
    readings = Readings("0.1 0.1 0.1 4/90 1", "0.1 0.1 0.1 2/90 1", "0.1 0.1 0.1 3/90 1")
    assert others_running(readings, readings=3, gap=0) == 1
    assert others_running(Readings("0.1 0.1 0.1 1/90 1"), readings=1) == 0


def test_others_running_is_unknown_where_the_kernel_does_not_say(tmp_path):
    assert others_running(tmp_path / "missing", readings=1) is None
    garbled = tmp_path / "loadavg"
    garbled.write_text("not a load average")
    assert others_running(garbled, readings=1) is None


def test_threads_sleep_only_where_others_run_and_nobody_chose_before():
    assert wait_policy_default({}, others=1, torch_loaded=False) == "PASSIVE"
    assert wait_policy_default({}, others=0, torch_loaded=False) is None  # an idle machine
    assert wait_policy_default({}, others=None, torch_loaded=False) is None  # unknown
    assert wait_policy_default({WAIT_POLICY: "ACTIVE"}, others=3, torch_loaded=False) is None
    assert wait_policy_default({"GOMP_SPINCOUNT": "1000"}, others=3, torch_loaded=False) is None
    assert wait_policy_default({}, others=3, torch_loaded=True) is None  # too late to matter


@pytest.fixture
def busy_core():
    """A process keeping a core busy, running by the time the test starts."""
    spinner = subprocess.Popen([sys.executable, "-I", "-S", "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            fields = Path(f"/proc/{spinner.pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[11]) > 0:  # utime: it has run
                break
            time.sleep(0.01)
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def openmp_settings(environment: dict[str, str], threads: int = 2) -> str:
    """What libgomp says it runs with (OMP_DISPLAY_ENV) as `specscribe transcribe` loads torch."""
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(SAMPLES / "jfk.wav")]
    run = subprocess.run(
        [*command, "--language", "en", "--threads", str(threads)],
        env={**environment, "OMP_DISPLAY_ENV": "VERBOSE"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ask what you can do for your country" in run.stdout
    return run.stderr


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/loadavg").is_file(), reason="Linux's /proc/loadavg")
def test_a_run_beside_a_busy_core_has_its_threads_sleep_unless_the_user_chose(busy_core):
    environment = {k: v for k, v in os.environ.items() if k not in (WAIT_POLICY, "GOMP_SPINCOUNT")}
    # Spinning threads made a 53 s recording take 24-32 s beside a busy core, sleeping ones 6 s.
    assert "GOMP_SPINCOUNT = '0'" in openmp_settings(environment)
    # One thread: a thread that spins for good would make two crawl beside the busy core.
    chosen = openmp_settings({**environment, WAIT_POLICY: "ACTIVE"}, threads=1)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in chosen
    assert "GOMP_SPINCOUNT = '0'" not in chosen
