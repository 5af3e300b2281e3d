"""Per-stage progress of files decoded on Ray actors, recorded in the driver's store.

Actors may run on machines that cannot reach the SQLite store, so they never write to it: each
keeps its current stage (`Transcriber.progress`) and the driver asks the busy ones, at most
once per `every` seconds per file, without waiting for the answers. `specscribe status` then
shows the same stages as for the local worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .jobs import ClaimedTask, JobStore


class ProgressRelay:
    def __init__(self, ray: Any, store: JobStore, every: float = 1.0) -> None:
        self.ray, self.store, self.every = ray, store, every
        self._asked: dict[Any, ClaimedTask] = {}  # progress() ref -> the task it is about
        self._last: dict[int, float] = {}  # task id -> when it was last asked about

    def relay(self, busy: Iterable[tuple[ClaimedTask, Any]]) -> None:
        """Records the answers that came in, then asks the busy actors again where due.

        busy: (task, actor) for every file being decoded now. A late answer about a finished
        task changes nothing: `JobStore.progress` writes only under the claim's token."""
        self._record_answers()
        now = time.monotonic()
        pending = {task.id for task in self._asked.values()}
        for task, actor in busy:
            if task.id not in pending and now - self._last.get(task.id, 0.0) >= self.every:
                self._asked[actor.progress.remote()] = task
                self._last[task.id] = now

    def _record_answers(self) -> None:
        if not self._asked:
            return
        ready, _ = self.ray.wait(list(self._asked), num_returns=len(self._asked), timeout=0)
        for ref in ready:
            task = self._asked.pop(ref)
            try:
                progress = self.ray.get(ref)
            except self.ray.exceptions.RayError:
                continue  # the actor died: the file's own answer says so
            if progress is not None:
                self.store.progress(task, progress.stage, progress.completed, progress.total)

    def forget(self, task: ClaimedTask) -> None:
        self._last.pop(task.id, None)
