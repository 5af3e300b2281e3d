"""Run one command and report its own wall-clock seconds and peak resident memory.

    python -I -S bench/launcher.py COMMAND [ARG ...]

The report is one JSON line on stdout, `{"seconds": ..., "peak_rss_kb": ..., "status": ...}`;
the command's stdout goes to /dev/null, its stderr is this process's, and the launcher exits
with the command's exit code (128 + N for a signal).

Why a process of its own: Linux carries a process's resident high-water mark into its child's
`ru_maxrss` when the child execs (`exec_mmap` records the replaced memory's peak), so a child
started by a benchmark holding gigabytes of models reported the benchmark's memory, not its
own. Started from this small process (stdlib only, no site packages: about 10 MB), the command
inherits that instead. Only the standard library, so that it runs under `-I -S`.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(command: list[str]) -> int:
    if not command:
        print("usage: launcher.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the command
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        try:
            os.execvp(command[0], command)
        except OSError as error:
            print(f"launcher: cannot run {command[0]}: {error}", file=sys.stderr)
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    report = {"seconds": seconds, "peak_rss_kb": usage.ru_maxrss, "status": code}
    print(json.dumps(report), flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
