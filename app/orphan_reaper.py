"""A watchdog that kills what a private Ray instance leaves when its driver is killed.

`ray.init()` without an address starts Ray's processes under the driver. Where the driver is
SIGKILLed (the kernel's OOM killer, `kill -9`, a container's hard stop), Ray takes its GCS,
raylet and actors down, but the raylet's agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) were left running, reparented to init, for as long as anyone looked
(Ray 2.60). `reaping_orphans()` starts this file as a script beside the driver: it
notes the driver's descendants every POLL_SECONDS, and when its pipe from the driver closes
with the driver gone, it kills the descendants it saw that are still the same processes (pid
and start time). A driver that exits on its own (Ray shut down) closes the pipe alive, and the
watchdog leaves. Linux only (/proc); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_SECONDS = 1.0
PROC = Path("/proc")
FINISHED = b"finished\n"  # the driver's last words on the pipe when it leaves on its own

# A process as the watchdog knows it: its pid and its start time (in clock ticks since boot,
# /proc/PID/stat's 22nd field), so that a pid reused by another process is never killed.
Process = tuple[int, int]


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, or None where it is gone or dead (a
    zombie: a killed driver stays one until its parent collects it)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> set[Process]:
    """Every live process below `root` (children, theirs, ...), as (pid, start time)."""
    children: dict[int, list[Process]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: set[Process] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child[0])
    return found


def _alive(process: Process) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[1] == process[1]


def _nothing() -> None:
    pass


def watch(driver: int, pipe: int, watching: Callable[[], None] = _nothing) -> None:
    """Notes `driver`'s descendants until `pipe` (the driver's end of it open) closes; kills
    the ones still alive unless the driver wrote FINISHED first. watching: called once the
    first note is taken."""
    me = os.getpid()
    if _stat(driver) is None:
        return
    seen: set[Process] = set()
    heard = b""
    while True:
        seen = {p for p in seen if _alive(p)} | {p for p in descendants(driver) if p[0] != me}
        watching()
        watching = _nothing
        readable, _, _ = select.select([pipe], [], [], POLL_SECONDS)
        if readable:
            if not (words := os.read(pipe, 4096)):
                break  # closed: the driver left or died
            heard = (heard + words)[-len(FINISHED) :]
    if heard == FINISHED:
        return  # it exits on its own: Ray was shut down
    for process in seen:
        if _alive(process):
            with contextlib.suppress(OSError):
                os.kill(process[0], signal.SIGKILL)


def _say_watching() -> None:
    """Tells `reaping_orphans` (on standard output) that the watch has begun."""
    sys.stdout.write("watching\n")
    sys.stdout.close()


@contextlib.contextmanager
def reaping_orphans() -> Iterator[None]:
    """Runs the body with the watchdog watching this process (where /proc exists), from its
    first note on: the body starts no process before the watchdog can see it (started late on
    a loaded machine, it missed a process whose parent had come and gone)."""
    if not (PROC / str(os.getpid()) / "stat").exists():
        yield
        return
    watchdog = subprocess.Popen(
        # Run as a script (it imports only the standard library), isolated (-I) so that this
        # folder's modules shadow none of it, whatever name the package has.
        [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's group leaves it to do its job
    )
    watchdog.stdout.readline()  # "watching", or nothing where it could not start
    watchdog.stdout.close()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # a watchdog gone already has nothing to kill
            watchdog.stdin.write(FINISHED)
            watchdog.stdin.flush()
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(timeout=5)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.stdin.fileno(), _say_watching)
