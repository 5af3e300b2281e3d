"""How OpenMP's threads wait, chosen from what else runs on the machine as a process starts.

A decoder step is hundreds of operations, each split over torch's threads and ended at a
barrier where every thread waits for the last. libgomp (PyTorch's OpenMP) lets a waiting
thread spin for about 300000 rounds before it sleeps. On an idle machine that is fastest: the
next operation starts without a wake-up. Beside another busy program it is ruinous: the
thread the system has put aside holds up every barrier while its partner spins on the core it
could have run on. On the 2-core Xeon, with one core held by a busy loop, a 53 s recording took
24-32 s to transcribe with spinning threads and 6.1-6.3 s with sleeping ones (`OMP_WAIT_POLICY=
PASSIVE`); on the idle machine sleeping threads cost 40 % (6.3-6.7 s against 4.5-4.7 s;
shorter spins, `GOMP_SPINCOUNT` 3000 or 30000, gave up one side or the other). libgomp reads
the policy once, as torch loads, and the thread count changes some transcripts' bits where the
policy never does, so the choice is made here, before torch loads: threads sleep where other
programs are running as the process starts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
READINGS = 5  # the fewest over these, so that a task running for an instant is not counted
READING_GAP_SECONDS = 0.001
WAIT_POLICY = "OMP_WAIT_POLICY"
# Variables by which a user has chosen how the threads wait (libgomp's spin count outranks
# the policy); none of them set, the choice is specscribe's.
USERS_CHOICE = (WAIT_POLICY, "GOMP_SPINCOUNT")


def others_running(
    loadavg: Path = LOADAVG, readings: int = READINGS, gap: float = READING_GAP_SECONDS
) -> int | None:
    """Tasks ready to run besides this one: the kernel's count of runnable tasks (the fourth
    field of /proc/loadavg, "running/total", which counts the reader itself) less one, the
    fewest of a few readings `gap` seconds apart. None where the file cannot be read (not
    Linux)."""
    counts = []
    for reading in range(readings):
        if reading:
            time.sleep(gap)
        try:
            running = loadavg.read_text().split()[3].split("/")[0]
            counts.append(int(running) - 1)
        except (OSError, IndexError, ValueError):
            return None
    return max(0, min(counts))


def wait_policy_default(
    environ: MutableMapping[str, str], others: int | None, torch_loaded: bool
) -> str | None:
    """The wait policy to set in `environ`: PASSIVE (threads sleep at once) where `others`
    tasks are running besides this process, None (libgomp's spinning default, or what the
    user set) where none are, where the user chose (USERS_CHOICE) or where torch, which read
    the policy as it loaded, is loaded already."""
    if _users_choice(environ) or torch_loaded or not others:
        return None
    return "PASSIVE"


def _users_choice(environ: MutableMapping[str, str]) -> bool:
    return any(name in environ for name in USERS_CHOICE)


def choose_wait_policy(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Sets `OMP_WAIT_POLICY` in `environ` by `wait_policy_default` from this machine's
    runnable tasks now; returns what it set (None: nothing)."""
    torch_loaded = "torch" in sys.modules
    undecided = not _users_choice(environ) and not torch_loaded
    policy = wait_policy_default(environ, others_running() if undecided else None, torch_loaded)
    if policy is not None:
        environ[WAIT_POLICY] = policy
    return policy
