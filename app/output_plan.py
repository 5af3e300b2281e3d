"""Which files of a request are left to do: the one rule the CLI, the job worker and the Ray
engine share.

A file is done when every output it asks for exists and its option record (written beside the
outputs, `asr.writers`) says the same model, precision and options made them. Then it is
skipped, unless the request says to overwrite; outputs made otherwise are made again, and the
user is told what changed. When every output exists but no record says how they were made
(written by hand, a reference transcript beside its audio, or a version that kept no records),
the file is skipped and the user told why; when some of them are missing, all are made, those
included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Action = Literal["make", "redo", "overwrite", "skip"]


@dataclass(frozen=True)
class OutputPlan:
    """What to do with one file. action: "make" (an output is missing), "redo" (the outputs
    were made with other options: `changes` names them), "overwrite" (done, but the request
    says to make them again), "skip" (done). unrecorded: skipped outputs that no record says
    how they were made (worth telling the user: they may be someone else's files)."""

    action: Action
    changes: str = ""
    unrecorded: bool = False

    @property
    def decode(self) -> bool:
        return self.action != "skip"


def plan_outputs(outputs: dict[str, Path], record: dict | None, overwrite: bool) -> OutputPlan:
    """outputs: format -> path of one file's outputs; record: what makes them
    (`TranscriptionService.output_record`), None to take any existing outputs as done."""
    from asr.writers import outputs_state

    state, changes = outputs_state(outputs, record)
    if state == "missing":
        return OutputPlan("make")
    if state == "changed":
        return OutputPlan("redo", changes)
    if overwrite:
        return OutputPlan("overwrite")
    return OutputPlan("skip", unrecorded=state == "unrecorded")
