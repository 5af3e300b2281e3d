"""The Ray engine: the same jobs, decoded by a pool of Ray actors (one machine or a cluster).

The driver (`specscribe worker --engine ray`) is a worker like the local one: it claims tasks
from the same SQLite store under the same leases, writes the outputs and records the results, so
durability does not change and the store never leaves the driver's machine. What moves is the
decoding: each actor (app/ray_actor.py) is a process on some node that resolves its models from
that node's own cache and decodes one file at a time. The driver sends it the file's bytes
through Ray's object store (nodes need no shared input folder) and gets a Transcript back.

Faults: an actor that dies, or whose node is lost, takes its file back to the queue (counted as
an attempt) and is replaced (app/ray_pool.py); only the driver writes outputs, atomically, so a
lost node never leaves half a file. When the driver dies, its actors die with it and its tasks
are reclaimed like any dead worker's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .config import Settings
from .jobs import ClaimedTask, JobStore, JobStoreError, WorkerId
from .orphan_reaper import reaping_orphans
from .output_claim import OutputClaim
from .output_plan import fingerprinted, made_from
from .ray_actor import ActorSpec, NodeInfo
from .ray_pool import ActorPool, ActorStartError, first_line
from .ray_progress import ProgressRelay
from .unlabelled_cache import kept_unlabelled
from .worker import (
    LeaseKeeper,
    Log,
    Outcome,
    Shutdown,
    WorkerOptions,
    finish,
    log_to_stderr,
    prepare,
    stop_on_signals,
    stopped_by,
    store_replaced,
    tell_of_other_models,
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


@dataclass(frozen=True)
class Dispatch:
    """A file on its way through an actor: what the driver needs when the answer comes."""

    ref: Any  # what transcribe() will answer
    task: ClaimedTask
    actor: Any
    node: NodeInfo
    record: dict  # the option record its outputs will carry (the actor's)
    claim: OutputClaim  # this driver's on its outputs, until they are written (app.worker)


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
        diarization_model, device, precision); None takes the driver's settings."""
        self.store = store
        self.options = (options or WorkerOptions()).validate()
        self.ray_options = (ray_options or RayOptions()).validate()
        self.spec = ActorSpec.choose(settings, models, self.ray_options.cpus_per_actor)
        self.log = log
        self.worker = WorkerId.this_process("ray")
        self.model = self.spec.asr_model
        self.finished = 0  # tasks finished here (done or failed)
        self.stopped_by: int | None = None  # the signal that stopped it, if one did

    def run(self) -> int:
        """Starts (or joins) Ray, works until stopped or idle, shuts Ray down. Returns the number
        of tasks finished here."""
        import ray

        if self.ray_options.address is not None:
            try:
                ray.init(address=self.ray_options.address, configure_logging=False)
            except ConnectionError as error:  # no cluster at that address
                raise ValueError(
                    f"--ray-address {self.ray_options.address}: {error} (start one with "
                    f"`ray start --head`, or leave --ray-address out for a private one)"
                ) from None
            return self._run_started(ray)
        # A private instance's processes are this one's to clean up, even where it is killed
        # (`app.orphan_reaper`): watched from before they start. "local": without an address
        # Ray joins the cluster a `ray start` left on this machine, and refused this call's
        # num_cpus ("When connecting to an existing cluster, num_cpus ... must not be provided").
        with reaping_orphans():
            ray.init(
                address="local",
                num_cpus=self.ray_options.actors * self.ray_options.cpus_per_actor,
                include_dashboard=False,
                configure_logging=False,
            )
            return self._run_started(ray)

    def _run_started(self, ray) -> int:
        try:
            with stop_on_signals():
                return self._loop(ray)
        finally:
            ray.shutdown()

    def _loop(self, ray) -> int:
        pool = ActorPool(ray, self.spec, self.ray_options.actors, self.log)
        pool.start()
        self.log(
            f"{self.worker.name} started {pool.size} Ray actors ({self.model}) on {self.store.path}"
        )
        relay = ProgressRelay(ray, self.store)
        in_flight: dict[Any, Dispatch] = {}  # transcribe() ref -> its file
        held: list[ClaimedTask] = []  # claimed, not yet decoding or finished (at most one)
        with LeaseKeeper(self.store.path, self.options.lease) as keeper:
            try:
                while True:
                    # 1. Give every idle actor a task.
                    while pool.has_idle() and (task := self._claim()) is not None:
                        keeper.hold(task)
                        held.append(task)
                        if (dispatch := self._start(ray, pool, task)) is None:
                            keeper.drop(task)
                        else:
                            in_flight[dispatch.ref] = dispatch
                        held.remove(task)
                    idle = not in_flight and self.options.until_idle
                    if idle and not self.store.has_work(self.model):
                        tell_of_other_models(self.store, self.model, self.log)
                        return self.finished
                    if not in_flight and self.store.replaced():
                        raise JobStoreError(store_replaced(self.store))
                    # 2. Wait for an answer: a file decoded, or an actor started.
                    waiting = [*in_flight, *pool.waiting]
                    if not waiting:
                        time.sleep(self.options.poll)
                        continue
                    ready, _ = ray.wait(waiting, num_returns=1, timeout=self.options.poll)
                    pool.settle(ready)
                    # 3. Finish whatever the actors answered; tell the store where the rest are.
                    for ref in [ref for ref in ready if ref in in_flight]:
                        dispatch = in_flight.pop(ref)
                        keeper.drop(dispatch.task)
                        relay.forget(dispatch.task)
                        self._collect(ray, pool, dispatch)
                    relay.relay((d.task, d.actor) for d in in_flight.values())
            except (Shutdown, KeyboardInterrupt, SystemError) as error:
                stop = _stop_signal(error)
                if stop is None:
                    raise
                self.stopped_by = stopped_by(stop)
                reason = f"worker stopped ({stop or 'interrupt'})"
                self._hand_back([*held, *(d.task for d in in_flight.values())], reason)
                return self.finished
            except ActorStartError as error:
                self._hand_back([d.task for d in in_flight.values()], f"worker stopped: {error}")
                raise
            finally:
                for dispatch in in_flight.values():
                    dispatch.claim.release()

    def _hand_back(self, tasks: list[ClaimedTask], reason: str) -> None:
        """Releases tasks this worker will not finish (a release that lost its claim, or of a
        task finished meanwhile, changes nothing), so that other workers take them at once."""
        handed = sum(self.store.release(task, self.worker, reason) for task in tasks)
        self.log(f"{reason}; {handed} tasks handed back")

    def _claim(self) -> ClaimedTask | None:
        return self.store.claim(
            self.worker,
            self.model,
            lease=self.options.lease,
            max_attempts=self.options.max_attempts,
        )

    def _start(self, ray, pool: ActorPool, task: ClaimedTask) -> Dispatch | None:
        """Steps 2 and 3 of the life cycle (app/worker.py) for one claimed task and an idle
        actor. None when the file is not decoding: finished here (outputs already made with
        these options, or the file unreadable), or handed back because the actor was lost
        first (it is replaced)."""
        actor = pool.take()
        node = pool.where(actor)
        try:
            record = ray.get(actor.output_record.remote(task.spec.options), timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            reason = f"Ray actor on {node.label} lost before decoding: {first_line(error)}"
            self.store.release(task, self.worker, reason)
            self.log(f"task {task.id}: {reason}; starting another")
            pool.replace(actor)
            return None
        record = made_from(task.path, task.spec.record(record))
        if (claim := prepare(self.store, task, self.worker, self.log, record)) is None:
            pool.give_back(actor)
            self.finished += 1
            return None
        try:
            audio = fingerprinted(task.path, record).read_bytes()
        except OSError as error:
            reason = f"{task.path}: cannot read it ({error.strerror})"
            claim.release()
            finish(self.store, task, self.worker, Outcome(None, reason, 0.0), self.log)
            pool.give_back(actor)
            self.finished += 1
            return None
        except BaseException:
            claim.release()
            raise
        # other speaker counts or formats than its outputs': the actor takes the kept transcript
        kept = None
        if not task.spec.overwrite:
            kept = kept_unlabelled(task.outputs, record)
        self.log(
            f"task {task.id} (job {task.job_id}) running on Ray node {node.label}, "
            f"attempt {task.attempt}: {task.path}"
        )
        try:
            ref = actor.transcribe.remote(audio, str(task.path), task.spec.options, kept)
        except BaseException:
            claim.release()
            raise
        return Dispatch(ref, task, actor, node, record, claim)

    def _collect(self, ray, pool: ActorPool, dispatch: Dispatch) -> None:
        """Records one answer; the actor goes back to the pool, or is replaced if it died."""
        try:
            self._record_answer(ray, pool, dispatch)
        finally:
            dispatch.claim.release()

    def _record_answer(self, ray, pool: ActorPool, dispatch: Dispatch) -> None:
        task = dispatch.task
        try:
            outcome = ray.get(dispatch.ref)
        except ray.exceptions.RayActorError as error:
            # The process died mid-file (killed, out of memory, its node lost): the file goes
            # back to the queue and counts as an attempt, so a file that kills every actor ends
            # up failed.
            reason = f"Ray actor on {dispatch.node.label} died: {first_line(error)}"
            if task.attempt >= self.options.max_attempts:
                self.store.fail(task, self.worker, f"{reason} ({task.attempt} attempts)")
                self.finished += 1
            else:
                self.store.release(task, self.worker, reason, count_attempt=True)
            self.log(f"task {task.id}: {reason}; starting another actor")
            pool.replace(dispatch.actor)
            return
        except ray.exceptions.RayTaskError as error:
            outcome = Outcome(None, f"Ray task error: {first_line(error)}", 0.0)
        self.finished += 1
        place = f"Ray node {dispatch.node.label}"
        finish(self.store, task, self.worker, outcome, self.log, dispatch.record, place=place)
        pool.give_back(dispatch.actor)


def _stop_signal(error: BaseException) -> Shutdown | KeyboardInterrupt | None:
    """The stop request an exception carries, or None. A signal that arrives while the driver
    waits inside Ray's compiled code (`ray.wait`, `ray.get`) has its handler's exception
    re-raised by Ray as a SystemError caused by it, not as itself."""
    stops = (Shutdown, KeyboardInterrupt)
    if isinstance(error, stops):
        return error
    cause = error.__cause__ or error.__context__
    return cause if isinstance(error, SystemError) and isinstance(cause, stops) else None
