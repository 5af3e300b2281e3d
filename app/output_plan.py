"""Which files of a request are left to do: the one rule the CLI, the job worker and the Ray
engine share.

A file is done when every output it asks for exists and its option record (written beside the
outputs, `asr.writers`) says the same model, precision and options made them, from the same
recording where the caller names it (`asr.writers.RECORD_SOURCE`). Then it is
skipped, unless the request says to overwrite; outputs made otherwise are made again, and the
user is told what changed. When every output exists but no record says how they were made
(written by hand, a reference transcript beside its audio, or a version that kept no records),
they are kept and the file is not done: the transcript asked for was not written, which the
CLI and the worker count as a failure and the user is told why. An output that specscribe did
not write is never replaced without `overwrite`, nor one it made from another recording at
another path (a recorder's REC001.WAV of another day), nor one edited since specscribe wrote
it (its record holds each output's digest). A file whose outputs are all there, some edited,
is done where they were made as asked; where they would be made again (other options, or
another format asked for), it is not, and the user is told which edit kept them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Action = Literal["make", "redo", "overwrite", "skip"]


@dataclass(frozen=True)
class OutputPlan:
    """What to do with one file. action: "make" (an output is missing; `changes` names the
    options changed too), "redo" (the outputs were made with other options: `changes` names
    them), "overwrite" (done, but the request says to make them again), "skip" (done, or
    kept). kept: the formats of outputs that no record says specscribe made, which are kept
    (worth telling the user: they may be someone else's files); blocked: the formats asked for
    and not made because of them (missing, or made otherwise)."""

    action: Action
    changes: str = ""
    kept: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    replaced: bool = False  # a redo because the recording is not the one they were made from
    elsewhere: bool = False  # kept: made from another recording (`changes` names it)
    edited: bool = False  # kept: specscribe's outputs, changed since it wrote them
    # A redo from another recording (`replaced`): the other outputs specscribe made from the
    # one before, not asked for, which stay as they are (`asr.writers.left_from_earlier`).
    left: tuple[Path, ...] = ()

    @property
    def why(self) -> str:
        """Why a redo, as the user is told."""
        from asr.writers import UNFINISHED

        if self.replaced or self.changes == UNFINISHED:
            return self.changes
        return f"options changed ({self.changes})"

    @property
    def left_told(self) -> str:
        """What the user is told of `left`: "" where nothing is left."""
        if not self.left:
            return ""
        one = len(self.left) == 1
        formats = ", ".join(path.suffix.removeprefix(".") for path in self.left)
        return (
            f"{', '.join(map(str, self.left))}, not asked for, {'is' if one else 'are'} left as "
            f"the transcript of the earlier recording (--format {formats} makes "
            f"{'it' if one else 'them'} again)"
        )

    @property
    def unrecorded(self) -> bool:
        return bool(self.kept)

    @property
    def decode(self) -> bool:
        return self.action != "skip"


def plan_outputs(outputs: dict[str, Path], record: dict | None, overwrite: bool) -> OutputPlan:
    """outputs: format -> path of one file's outputs; record: what makes them
    (`TranscriptionService.output_record`), None to take any existing outputs as done."""
    from asr.writers import left_from_earlier, outputs_state

    state, detail = outputs_state(outputs, record)
    if state == "missing":
        return OutputPlan("make", detail)
    if state == "elsewhere" and not overwrite:  # another recording's transcript: kept
        existing = tuple(fmt for fmt, path in outputs.items() if path.exists())
        return OutputPlan("skip", detail, kept=existing, blocked=tuple(outputs), elsewhere=True)
    if state in ("elsewhere", "replaced"):
        left = tuple(left_from_earlier(outputs, record))
        return OutputPlan("redo", detail, replaced=True, left=left)
    if state == "changed":
        return OutputPlan("redo", detail)
    if overwrite:
        return OutputPlan("overwrite")
    if state not in ("unrecorded", "edited"):
        return OutputPlan("skip")
    kept = tuple(detail.split(", "))
    # Not made because of them: the outputs missing, and specscribe's own made otherwise.
    ours = {fmt: path for fmt, path in outputs.items() if fmt not in kept and path.exists()}
    stale = tuple(ours) if ours and outputs_state(ours, record)[0] != "done" else ()
    missing = tuple(fmt for fmt, path in outputs.items() if not path.exists())
    # Theirs stand where specscribe's outputs would go; edited ones would have been made again
    # (an edit is only "edited" where the outputs are not done: other options, or one missing).
    blocked = stale + missing + kept
    blocked = tuple(f for f in outputs if f in blocked)
    return OutputPlan("skip", kept=kept, blocked=blocked, edited=state == "edited")


def kept_outputs(plan: OutputPlan, outputs: dict[str, Path]) -> str:
    """What a skip that keeps unrecorded outputs, edited ones, or another recording's, tells the
    user: those files, and the outputs not made because of them."""
    one = len(plan.kept) == 1
    if plan.elsewhere:
        kept = ", ".join(str(outputs[fmt]) for fmt in plan.kept)
        made = plan.changes.removeprefix("its outputs were made from ")
        hold, them = ("holds", "it") if one else ("hold", "them")
        return f"{kept} {hold} the transcript of {made}: kept (--overwrite replaces {them})"
    why = (
        f"{'has' if one else 'have'} changed since specscribe wrote {'it' if one else 'them'}"
        if plan.edited
        else f"{'exists' if one else 'exist'} without a record that specscribe made "
        f"{'it' if one else 'them'}"
    )
    told = f"{', '.join(str(outputs[fmt]) for fmt in plan.kept)} {why}"
    if others := [fmt for fmt in plan.blocked if fmt not in plan.kept]:
        blocked = [str(outputs[fmt]) for fmt in others]
        told += (
            f", so {', '.join(blocked)} {'was' if len(blocked) == 1 else 'were'} not made either"
        )
    return told + f" (--overwrite replaces {'it' if one and not others else 'them'})"


def made_from(path: Path, record: dict, recorded_as: str | None = None) -> dict:
    """The record of one file's outputs: `record`, and the recording they are made from
    (`asr.writers.RECORD_SOURCE`; not where it cannot be read: decoding it will say why).
    recorded_as: where the record says the recording is, when not at `path` (`-`: piped)."""
    from asr.source import Source
    from asr.writers import RECORD_SOURCE

    try:
        return {**record, RECORD_SOURCE: Source.of(path, recorded_as)}
    except OSError:
        return record


def fingerprinted(path: Path, record: dict) -> Path:
    """`path`, once the digest of the recording its record names is read: before its samples,
    so that the record names the bytes decoded. Raises OSError where it cannot be read."""
    from asr.writers import RECORD_SOURCE

    if RECORD_SOURCE in record:
        _ = record[RECORD_SOURCE].digest
    return path
