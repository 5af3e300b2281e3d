"""The watchdog that kills what a killed driver's private Ray instance leaves behind
(`app.orphan_reaper`), with stand-in processes: a real `specscribe worker --engine ray` was
checked by hand (its agents gone within seconds of a SIGKILL, still there after 1:44 without
the watchdog); as a test beside test_ray_cluster.py's cluster its `ray.init()` may join that
cluster instead of starting its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO, wait_for

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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


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
