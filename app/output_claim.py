"""One run at a time per file's outputs, so that several `specscribe transcribe` processes on
one folder share its files instead of each transcribing all of them (and racing on their
outputs and records).

A run claims a file's outputs with an exclusive, non-blocking `flock` on the hidden
.STEM.specscribe.lock beside its record (`asr.writers.record_path`) before it decodes the
file, and holds it until its outputs are written. A file another run has claimed is left to
that run. The kernel drops a lock when its process dies however it dies (SIGKILL, a crash),
so a stale claim never blocks a rerun; and while a run holds a claim, write_atomically's
temporaries beside those outputs (.NAME.*.tmp) can only be a dead run's, so it removes them.

The lock file is removed on release, while still locked. A run that opened it just before
then may lock the removed file; it checks after locking that the path still names the file
it locked, and tries again if not, so two runs never both hold one file's claim.

flock is advisory and, on NFS before Linux 2.6.12, local only: runs on different machines
sharing one network folder are not kept apart (the job queue, `app.jobs`, is for that).
"""

from __future__ import annotations

import fcntl
import glob
import os
from pathlib import Path

from asr.writers import record_path

from .unlabelled_cache import journal_path, passes_path, unlabelled_path


class OutputClaim:
    """A held claim on one file's outputs; `release` ends it (and so does the process's end)."""

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path = path
        self._descriptor: int | None = descriptor

    def release(self) -> None:
        if self._descriptor is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # still locked: no other run holds it meanwhile
        finally:
            os.close(self._descriptor)  # closing drops the lock
            self._descriptor = None


def claim_path(outputs: dict[str, Path]) -> Path:
    """The lock file of a file's outputs: .STEM.specscribe.lock, beside its record."""
    return record_path(outputs).with_suffix(".lock")


def claim_outputs(outputs: dict[str, Path]) -> OutputClaim | None:
    """Claims a file's outputs (making their folder), or None where another run holds them.
    Raises OSError where the folder cannot take the lock file."""
    path = claim_path(outputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        except BaseException:
            os.close(descriptor)
            raise
        try:
            locked, named = os.fstat(descriptor), os.stat(path)
        except FileNotFoundError:  # released and removed between the open and the lock
            os.close(descriptor)
            continue
        if (locked.st_dev, locked.st_ino) != (named.st_dev, named.st_ino):
            os.close(descriptor)  # removed and made anew by another run: lock that one
            continue
        claim = OutputClaim(path, descriptor)
        remove_dead_runs_temporaries(outputs)
        return claim


def wait_until_unclaimed(outputs: dict[str, Path]) -> None:
    """Returns once no run holds a claim on these outputs (at once where none does). Takes no
    claim: another run may claim them right after."""
    try:
        descriptor = os.open(claim_path(outputs), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # released (its lock file is removed then) or never claimed
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)  # blocks while a claim (exclusive) is held
    finally:
        os.close(descriptor)


def remove_dead_runs_temporaries(outputs: dict[str, Path]) -> None:
    """write_atomically's temporaries beside the outputs and their hidden companions (the
    record, a kept transcript and its passes), left by a run killed while it wrote them. Only
    for a caller that holds these outputs (a claim, or the job queue's task)."""
    companions = (record_path(outputs), unlabelled_path(outputs), passes_path(outputs))
    for name in (*outputs.values(), *companions):
        if name.parent.is_dir():
            for leftover in name.parent.glob(f".{glob.escape(name.name)}.*.tmp"):
                leftover.unlink(missing_ok=True)


def remove_stale_journal(outputs: dict[str, Path]) -> None:
    """Removes the window journal beside outputs a run skips as made: one left by a run
    stopped part-way (an --overwrite run, or one whose file another run then finished) that
    nothing would read again. Kept where another run holds the outputs: it may be writing it.
    Costs one stat where there is none."""
    if not outputs or not (journal := journal_path(outputs)).exists():
        return
    try:
        claim = claim_outputs(outputs)
    except OSError:
        return  # a read-only folder: nothing to tidy
    if claim is not None:
        try:
            journal.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            claim.release()


# write_atomically's temporaries: ".NAME." + 8 random characters + ".tmp".
_TEMPORARY_EXTRA = len("..") + 8 + len(".tmp")


def names_too_long(outputs: dict[str, Path]) -> str | None:
    """Why a file's outputs cannot be written under their names, or None: the longest name
    written beside them (an output's or a hidden companion's temporary, the claim's lock)
    exceeds what the folder's file system takes (255 bytes on most). Said before the file is
    decoded: a long recording's name (a downloaded video's title in a script of three bytes a
    letter) failed only once its transcript was to be written."""
    if not outputs:
        return None
    companions = (record_path(outputs), unlabelled_path(outputs), passes_path(outputs))
    temporaries = [
        len(os.fsencode(p.name)) + _TEMPORARY_EXTRA for p in (*outputs.values(), *companions)
    ]
    longest = max(*temporaries, len(os.fsencode(claim_path(outputs).name)))
    folder = next(iter(outputs.values())).parent
    existing = next((p for p in (folder, *folder.parents) if p.is_dir()), Path("/"))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if longest <= limit:
        return None
    over = longest - limit
    return (
        f"its outputs' names would be too long for {folder} ({longest} bytes, more than the "
        f"{limit} its file system takes); rename the recording, shorter by {over} "
        f"byte{'' if over == 1 else 's'} or more"
    )
