"""The Ray engine: the same jobs, decoded by a pool of Ray actors (one machine or a cluster).

The driver (`specscribe worker --engine ray`) is a worker like the local one: it claims tasks
from the same SQLite store under the same leases, writes the outputs and records the results, so
durability does not change. What moves is the decoding: each actor is a process that loads the
models once and decodes one file at a time. The driver sends it the file's bytes through Ray's
object store (nodes need no shared input folder) and gets a Transcript back. An actor that dies
takes its file back to the queue and is replaced; when the driver dies, its actors die with it
and its tasks are reclaimed like any dead worker's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.jobs import ClaimedTask, JobStore, WorkerId
from app.service import ServiceOptions, TranscriptionService
from app.worker import (
    LeaseKeeper,
    Log,
    Outcome,
    Shutdown,
    WorkerOptions,
    execute,
    finish,
    log_to_stderr,
    prepare,
    stop_on_signals,
)


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a private local instance; else "auto" or host:port
    actors: int = 1  # decoding processes, each with its own copy of the models
    cpus_per_actor: int = 1  # Ray CPUs each actor reserves; also its torch thread count

    def validate(self) -> RayOptions:
        if self.actors < 1:
            raise ValueError(f"actors must be >= 1, not {self.actors}")
        if self.cpus_per_actor < 1:
            raise ValueError(f"cpus_per_actor must be >= 1, not {self.cpus_per_actor}")
        return self


class Transcriber:
    """The actor: a TranscriptionService whose models load once, in the actor's process."""

    def __init__(self, settings: Settings, models: dict[str, str | None], threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.service = TranscriptionService(settings, **models).load()

    def model_name(self) -> str:
        return self.service.asr_model_name

    def transcribe(self, audio: bytes, label: str, options: ServiceOptions) -> Outcome:
        return execute(self.service, audio, label, options)


class RayWorker:
    """Claims tasks for as many actors as are idle and finishes each as its actor answers."""

    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        models: dict[str, str | None],
        options: WorkerOptions | None = None,
        ray_options: RayOptions | None = None,
        log: Log = log_to_stderr,
    ) -> None:
        """models: TranscriptionService's keyword arguments (asr_model, assistant_model,
        diarization_model, device)."""
        self.store, self.settings, self.models = store, settings, models
        self.options = (options or WorkerOptions()).validate()
        self.ray_options = (ray_options or RayOptions()).validate()
        self.log = log
        self.worker = WorkerId.this_process("ray")
        self.model = models.get("asr_model") or settings.asr_model
        self._actor_class: Any = None

    def run(self) -> int:
        """Starts (or joins) Ray, works until stopped or idle, shuts Ray down. Returns the number
        of tasks finished here."""
        import ray

        if self.ray_options.address is None:
            ray.init(
                num_cpus=self.ray_options.actors * self.ray_options.cpus_per_actor,
                include_dashboard=False,
                configure_logging=False,
            )
        else:
            ray.init(address=self.ray_options.address, configure_logging=False)
        try:
            self._actor_class = ray.remote(
                num_cpus=self.ray_options.cpus_per_actor, max_restarts=0
            )(Transcriber)
            with stop_on_signals():
                return self._loop(ray)
        finally:
            ray.shutdown()

    def _start_actor(self, ray) -> Any:
        actor = self._actor_class.remote(
            self.settings, self.models, self.ray_options.cpus_per_actor
        )
        try:
            name = ray.get(actor.model_name.remote())
        except ray.exceptions.RayError as error:
            raise RuntimeError(f"a Ray actor could not load the models: {error}") from None
        if name != self.model:
            raise RuntimeError(f"the actor loaded {name}, the driver claims for {self.model}")
        return actor

    def _loop(self, ray) -> int:
        idle = [self._start_actor(ray) for _ in range(self.ray_options.actors)]
        self.log(
            f"{self.worker.name} ready: {len(idle)} Ray actors ({self.model}) on {self.store.path}"
        )
        in_flight: dict[Any, tuple[ClaimedTask, Any]] = {}  # ObjectRef -> (task, actor)
        finished = 0
        with LeaseKeeper(self.store.path, self.options.lease) as keeper:
            try:
                while True:
                    # 1. Give every idle actor a task.
                    while idle and (task := self._claim()) is not None:
                        if not prepare(self.store, task, self.worker, self.log):
                            finished += 1
                            continue
                        try:
                            audio = task.path.read_bytes()
                        except OSError as error:
                            reason = f"{task.path}: cannot read it ({error.strerror})"
                            finish(
                                self.store, task, self.worker, Outcome(None, reason, 0.0), self.log
                            )
                            finished += 1
                            continue
                        actor = idle.pop()
                        keeper.hold(task)
                        in_flight[self._dispatch(actor, task, audio)] = (task, actor)
                    if not in_flight:
                        if self.options.until_idle and not self.store.has_work(self.model):
                            return finished
                        time.sleep(self.options.poll)
                        continue
                    # 2. Finish whatever the actors answered.
                    ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=self.options.poll)
                    for ref in ready:
                        task, actor = in_flight.pop(ref)
                        keeper.drop(task)
                        idle.append(self._collect(ray, ref, task, actor))
                        finished += 1
            except (Shutdown, KeyboardInterrupt) as stop:
                reason = f"worker stopped ({stop or 'interrupt'})"
                for task, _ in in_flight.values():
                    self.store.release(task, self.worker, reason)
                self.log(f"{reason}; {len(in_flight)} tasks handed back")
                return finished

    def _claim(self) -> ClaimedTask | None:
        return self.store.claim(
            self.worker,
            self.model,
            lease=self.options.lease,
            max_attempts=self.options.max_attempts,
        )

    def _dispatch(self, actor: Any, task: ClaimedTask, audio: bytes) -> Any:
        self.log(
            f"task {task.id} (job {task.job_id}) running on Ray, attempt {task.attempt}: "
            f"{task.path}"
        )
        return actor.transcribe.remote(audio, str(task.path), task.spec.options)

    def _collect(self, ray, ref: Any, task: ClaimedTask, actor: Any) -> Any:
        """Records one answer; returns the actor to reuse (a fresh one if this one died)."""
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            # The process died mid-file (killed, out of memory): the file goes back to the queue,
            # and counts as an attempt, so a file that kills every actor ends up failed.
            reason = f"Ray actor died: {error}".splitlines()[0]
            if task.attempt >= self.options.max_attempts:
                self.store.fail(task, self.worker, f"{reason} ({task.attempt} attempts)")
            else:
                self.store.release(task, self.worker, reason, count_attempt=True)
            self.log(f"task {task.id}: {reason}; starting a new actor")
            return self._start_actor(ray)
        except ray.exceptions.RayTaskError as error:
            outcome = Outcome(None, f"Ray task error: {error}".splitlines()[0], 0.0)
        finish(self.store, task, self.worker, outcome, self.log)
        return actor
