"""The batch worker: runs the tasks of a `JobStore` with models loaded once.

Every engine follows one life cycle per task, written once here:

1. claim a task (app/jobs.py: a lease that a heartbeat thread renews);
2. `prepare`: remove temporary files a killed attempt left beside the outputs; a task whose
   outputs all exist (and overwrite is off, or an earlier attempt of this task wrote them) is
   done without decoding;
3. decode: `execute` here (the local engine), or on a Ray actor (app/ray_engine.py);
4. `finish`: only while the claim still holds, write each output atomically, then record the
   task done in the store; or record it failed with the error. A crash between the two makes
   the next attempt find the outputs and finish at step 2.

`LocalWorker` is the embedded engine: one process, one file at a time; start several on one
store to use more cores.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asr.types import ProgressHook, Transcript, no_progress

from .jobs import ClaimedTask, JobStore, JobStoreError, WorkerId
from .output_claim import OutputClaim
from .output_plan import made_from
from .service import ServiceOptions, TranscriptionService
from .status_lines import one_line
from .stop_signals import raising_on
from .unlabelled_cache import Kept, journal_path, keep_unlabelled, kept_unlabelled, reused

if TYPE_CHECKING:
    from diarize.passes import SpeakerPasses

Log = Callable[[str], None]


def log_to_stderr(message: str) -> None:
    print(one_line(f"specscribe worker: {message}"), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker uses the store (not what a job asks for: that is JobSpec)."""

    lease: float = 30.0  # seconds a claim lasts without a heartbeat
    poll: float = 1.0  # seconds between looks at an empty queue
    until_idle: bool = False  # exit once nothing this worker could run is pending or running
    max_attempts: int = 3  # a task whose workers died this often fails

    def validate(self) -> WorkerOptions:
        if self.lease < 1.0:
            raise ValueError(f"lease must be at least 1 second, not {self.lease}")
        if self.poll <= 0:
            raise ValueError(f"poll must be positive, not {self.poll}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {self.max_attempts}")
        return self


@dataclass(frozen=True)
class Outcome:
    """What decoding one file gave: a transcript, or the error that names the cause; the
    transcript before speakers (`app.service.Labelled.unlabelled`) and with diarization the
    diarizer's passes too, which `finish` keeps beside the outputs (app.unlabelled_cache) for a
    job asking other speaker counts or formats."""

    transcript: Transcript | None
    error: str | None
    seconds: float
    unlabelled: Transcript | None = None
    passes: SpeakerPasses | None = None
    from_kept: bool = False  # made from a kept transcript (speakers found again, or as it was)
    relabelled: bool = False  # from a kept transcript, its speakers found again


class Shutdown(BaseException):
    """SIGTERM, SIGINT or SIGHUP: hand the current task back and stop. A BaseException, like
    KeyboardInterrupt, so that `except Exception` around decoding does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stopped_by(stop: BaseException) -> int:
    """The signal a worker's stop (Shutdown, or KeyboardInterrupt: Ctrl-C) came from."""
    return stop.signum if isinstance(stop, Shutdown) else signal.SIGINT


# -- the steps every engine shares --------------------------------------------------------------


def describe_error(error: BaseException) -> str:
    from asr.audio import AudioLoadError

    # AudioLoadError messages already name the file and the cause.
    return str(error) if isinstance(error, AudioLoadError) else f"{type(error).__name__}: {error}"


def execute(
    service: TranscriptionService,
    audio: Path | bytes,
    label: str,
    options: ServiceOptions,
    progress: ProgressHook = no_progress,
    kept: Kept | None = None,
    journal: Path | None = None,
) -> Outcome:
    """Decodes one file (a path, or its bytes named `label` in errors). Any error becomes a
    failed Outcome: one bad file must not stop the worker. kept: the file's kept transcript
    (`app.unlabelled_cache.kept_unlabelled`), labelled again (with diarization) or taken as
    it is instead of transcribing (labelled with the counts asked for: as it was). journal:
    where a long file keeps its decoded windows (`app.unlabelled_cache.journal_path`), for a
    worker that takes the task up again after this one stopped."""
    from asr.audio import decode_audio

    started = time.perf_counter()
    as_it_was = None if kept is None else kept.as_it_was(options.diarize)
    if as_it_was is not None:  # only the formats differ: nothing to decode
        return Outcome(reused(as_it_was), None, time.perf_counter() - started, from_kept=True)
    try:
        if isinstance(audio, bytes):
            source = decode_audio(
                audio, name=label, audio_stream=options.audio_stream, channel=options.channel
            )
        else:
            source = audio
        if kept is not None:
            unlabelled, passes = kept.unlabelled, kept.passes
            transcript = service.relabel(source, unlabelled, options, progress, passes=passes)
            seconds = time.perf_counter() - started
            # Kept again with the transcript labelled with these counts (`finish`).
            return Outcome(
                transcript, None, seconds, unlabelled, passes, from_kept=True, relabelled=True
            )
        result = service.run_keeping_unlabelled([source], options, progress, [journal])[0]
    except Exception as error:
        return Outcome(None, describe_error(error), time.perf_counter() - started)
    seconds = time.perf_counter() - started
    return Outcome(result.transcript, None, seconds, result.unlabelled, result.passes)


def _output_folders_ready(store: JobStore, task: ClaimedTask, worker: WorkerId, log: Log) -> bool:
    """Makes the folders the task's outputs go to; a folder that cannot be made, or whose disk
    is full (`asr.writers.no_room_for_outputs`), fails the task before its audio is decoded rather
    than after (False)."""
    from asr.writers import file_in_the_way, no_room_for_outputs

    reason = None
    try:
        for folder in {path.parent for path in task.outputs.values()}:
            folder.mkdir(parents=True, exist_ok=True)
            if full := no_room_for_outputs(folder):
                reason = f"cannot write its outputs in {folder}: {full}"
                break
    except OSError as error:
        folders = {path.parent for path in task.outputs.values()}
        blocking = next(filter(None, map(file_in_the_way, folders)), None)
        made = f"{blocking} is a file, not a folder" if blocking else describe_error(error)
        reason = f"cannot make the output folder: {made}"
    if reason is None:
        return True
    if store.fail(task, worker, reason):
        log(f"task {task.id} (job {task.job_id}) failed: {reason}")
    return False


def prepare(
    store: JobStore, task: ClaimedTask, worker: WorkerId, log: Log, record: dict | None = None
) -> OutputClaim | None:
    """Step 2. The task's claim on its outputs (`app.output_claim`) when it still needs
    decoding, which the caller releases once `finish` has run; None when it was finished here.

    record: what makes this task's outputs (TranscriptionService.output_record); outputs
    whose record says they were made otherwise are made again (app.output_plan, as the CLI).
    The claim is the one `specscribe transcribe` runs take: a run writing these outputs is
    waited for (the plan is made again after it), and temporaries beside the outputs are only
    removed once no run can be writing them."""
    from .output_plan import kept_outputs, plan_outputs

    plan = plan_outputs(task.outputs, record, task.spec.overwrite)
    claim = None
    if plan.decode:  # made again once no other run writes them: planned as that run left them
        if (claim := _claimed(store, task, worker, log)) is None:
            return None
        plan = plan_outputs(task.outputs, record, task.spec.overwrite)
    if plan.action in ("make", "redo"):
        if plan.action == "redo" or plan.changes:
            log(f"task {task.id} (job {task.job_id}): {plan.why}: {task.path}")
        if plan.left_told:
            log(f"task {task.id} (job {task.job_id}): {plan.left_told}")
        return claim
    outputs = list(task.outputs.values())
    if plan.action == "overwrite":
        if task.attempt == 1 or min(p.stat().st_mtime for p in outputs) < task.first_started:
            return claim
        note = "outputs written by an earlier attempt"  # it died after writing, before recording
    elif plan.blocked:
        reason = kept_outputs(plan, task.outputs)  # asked for, and not made: theirs are kept
        _released(claim, task.outputs)
        if store.fail(task, worker, reason):
            log(f"task {task.id} (job {task.job_id}) failed: {reason}")
        return None
    else:
        note = kept_outputs(plan, task.outputs) if plan.unrecorded else "outputs existed"
    _released(claim, task.outputs)
    if store.complete(task, worker, 0.0, note):
        log(f"task {task.id} (job {task.job_id}) done: {note}: {task.path}")
    return None


def _claimed(store: JobStore, task: ClaimedTask, worker: WorkerId, log: Log) -> OutputClaim | None:
    """The task's claim on its outputs, once no other run holds it (waited for, said so), in
    folders made for them and with room (`_output_folders_ready`); None where the task failed
    because they cannot be written."""
    from .output_claim import claim_outputs, names_too_long, wait_until_unclaimed

    if too_long := names_too_long(task.outputs):  # queued before `submit` refused such names
        if store.fail(task, worker, too_long):
            log(f"task {task.id} (job {task.job_id}) failed: {too_long}")
        return None
    if not _output_folders_ready(store, task, worker, log):
        return None
    told = False
    while True:
        try:
            claim = claim_outputs(task.outputs)
        except OSError as error:
            from asr.writers import why_unwritten

            reason = why_unwritten(error, task.outputs)
            if store.fail(task, worker, reason):
                log(f"task {task.id} (job {task.job_id}) failed: {reason}")
            return None
        if claim is not None:
            return claim
        if not told:
            log(
                f"task {task.id} (job {task.job_id}): another specscribe run is writing its "
                f"outputs; waiting for it: {task.path}"
            )
            told = True
        wait_until_unclaimed(task.outputs)


def _released(claim: OutputClaim | None, outputs: dict[str, Path] | None = None) -> None:
    """Ends `claim`. Without one, with `outputs`: removes a killed run's temporaries beside
    them where no run is writing them (a claim taken and ended at once removes them), and
    leaves them where one is or the folder cannot take a claim (read-only: nothing to tidy)."""
    from .output_claim import claim_outputs

    if claim is None and outputs is not None:
        with contextlib.suppress(OSError):
            claim = claim_outputs(outputs)
    if claim is not None:
        claim.release()


def finish(
    store: JobStore,
    task: ClaimedTask,
    worker: WorkerId,
    outcome: Outcome,
    log: Log,
    record: dict | None = None,
    place: str | None = None,
) -> None:
    """Step 4: outputs first, then the record, so `done` always means the outputs exist; the
    file's window journal (`app.unlabelled_cache.journal_path`), if a run left one, goes then.

    record: the option record the outputs carry (see `prepare`); place: where the file was
    decoded, when not in this process (a Ray node), named in the task's note."""
    from asr.writers import why_unwritten, write_outputs

    if outcome.transcript is None:
        if store.fail(task, worker, outcome.error or "unknown error", outcome.seconds):
            log(f"task {task.id} (job {task.job_id}) failed: {outcome.error}")
        return
    if not store.holds(task):
        # Another worker reclaimed it (this one stalled past its lease): leave it to that one.
        store.record_lost(task, worker, "lease lost before writing outputs")
        log(f"task {task.id} (job {task.job_id}): lease lost, result dropped")
        return
    try:
        if outcome.unlabelled is not None and record is not None:
            labelled = outcome.transcript if task.spec.options.diarize else None
            keep_unlabelled(task.outputs, record, outcome.unlabelled, outcome.passes, labelled)
        write_outputs(outcome.transcript, task.outputs, record, task.spec.layout)
        with contextlib.suppress(OSError):
            journal_path(task.outputs).unlink(missing_ok=True)
    except OSError as error:  # a full disk, a file where a folder must go: this task's failure
        reason = why_unwritten(error, task.outputs)
        if store.fail(task, worker, reason, outcome.seconds):
            log(f"task {task.id} (job {task.job_id}) failed: {reason}")
        # Its decoding may have taken long: the log keeps what it made.
        log(f"task {task.id} (job {task.job_id}) transcript: {outcome.transcript.text}")
        return
    done = "transcribed"
    if outcome.from_kept:
        done = (
            "speakers labelled again on the kept transcript"
            if outcome.relabelled
            else "written again from the kept transcript"
        )
    done = f"{done} on {place}" if place else done
    note = "; ".join((done, *outcome.transcript.warnings))
    if store.complete(task, worker, outcome.seconds, note):
        log(f"task {task.id} (job {task.job_id}) done in {outcome.seconds:.1f} s: {task.path}")
        for warning in outcome.transcript.warnings:  # as `transcribe` says them, beside `status`
            log(f"task {task.id} (job {task.job_id}): warning: {warning}")
    else:
        store.record_lost(task, worker, "lease lost after writing outputs")


class LeaseKeeper:
    """A daemon thread that renews the lease of every task a worker holds, every lease/3 s.

    It has its own store connection, so a long decode in the main thread never lets a lease run
    out; a renewal that fails means the task was reclaimed, which `finish` then notices."""

    def __init__(self, store_path: Path, lease: float) -> None:
        self.store_path, self.lease = store_path, lease
        self._held: dict[int, ClaimedTask] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def holding(self, task: ClaimedTask) -> Iterator[None]:
        self.hold(task)
        try:
            yield
        finally:
            self.drop(task)

    def hold(self, task: ClaimedTask) -> None:
        with self._lock:
            self._held[task.id] = task

    def drop(self, task: ClaimedTask) -> None:
        with self._lock:
            self._held.pop(task.id, None)

    def _run(self) -> None:
        store = JobStore(self.store_path)
        try:
            while not self._stop.wait(self.lease / 3):
                with self._lock:
                    held = list(self._held.values())
                for task in held:
                    if not store.renew(task, self.lease):
                        self.drop(task)
        finally:
            store.close()


def progress_recorder(store: JobStore, task: ClaimedTask, every: float = 1.0) -> ProgressHook:
    """A progress hook that records the stage in the store, at most once per `every` seconds
    (and always at a stage's end), so `specscribe status` can show it. Progress is for show:
    a store that cannot take it (its disk full) must not end the file's decoding, whose
    outcome is recorded, or fails to be, once it is done."""
    last = [0.0]

    def record(stage: str, completed: int, total: int) -> None:
        now = time.monotonic()
        if completed >= total or now - last[0] >= every:
            last[0] = now
            with contextlib.suppress(JobStoreError, sqlite3.Error):
                store.progress(task, stage, completed, total)

    return record


def store_replaced(store: JobStore) -> str:
    """Why an idle worker stops (a JobStoreError) once its store's file was replaced."""
    return (
        f"{store.path} is no longer the job store this worker opened (removed, or another file "
        "moved over it); start the worker again to run the jobs it holds"
    )


def tell_of_other_models(store: JobStore, model: str, log: Log) -> None:
    """An idle worker's word on the jobs it leaves queued for workers of another model."""
    for job, wanted in store.waiting_for_other_models(model).items():
        log(f"job {job} waits for a worker of model {wanted} (this one runs {model})")


def stop_on_signals() -> AbstractContextManager[None]:
    """SIGTERM (docker stop, systemd), SIGINT (Ctrl-C) and SIGHUP (the terminal closed) raise
    Shutdown in the main thread, so that the task in hand is handed back."""
    return raising_on((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), Shutdown)


# -- the embedded engine ------------------------------------------------------------------------


class LocalWorker:
    """Runs tasks one at a time in this process, with the service's models loaded once."""

    def __init__(
        self,
        store: JobStore,
        service: TranscriptionService,
        options: WorkerOptions = WorkerOptions(),
        log: Log = log_to_stderr,
    ) -> None:
        self.store, self.service, self.options, self.log = store, service, options.validate(), log
        self.worker = WorkerId.this_process("local")
        self.stopped_by: int | None = None  # the signal that stopped it, if one did

    def run(self) -> int:
        """Works until stopped (or, with until_idle, until the queue is empty). Returns the
        number of tasks this worker finished (done or failed); `stopped_by` says whether a
        signal stopped it."""
        self.service.load()
        self.log(f"{self.worker.name} ready ({self.service.asr_model_name}) on {self.store.path}")
        finished = 0
        with stop_on_signals(), LeaseKeeper(self.store.path, self.options.lease) as keeper:
            try:
                while task := self._next_task():
                    with keeper.holding(task):
                        self._run_one(task)
                    finished += 1
            except (Shutdown, KeyboardInterrupt) as stop:
                self.stopped_by = stopped_by(stop)
                self.log(f"stopped ({stop or 'interrupt'})")
        return finished

    def _next_task(self) -> ClaimedTask | None:
        """The next claim; waits while the queue is empty. None: idle, and until_idle is set."""
        while True:
            task = self.store.claim(
                self.worker,
                self.service.asr_model_name,
                lease=self.options.lease,
                max_attempts=self.options.max_attempts,
            )
            if task is not None:
                return task
            if self.options.until_idle and not self.store.has_work(self.service.asr_model_name):
                tell_of_other_models(self.store, self.service.asr_model_name, self.log)
                return None
            if self.store.replaced():
                raise JobStoreError(store_replaced(self.store))
            time.sleep(self.options.poll)

    def _run_one(self, task: ClaimedTask) -> None:
        self.log(f"task {task.id} (job {task.job_id}) running, attempt {task.attempt}: {task.path}")
        record = made_from(
            task.path, task.spec.record(self.service.output_record(task.spec.options))
        )
        claim = None
        try:
            if (claim := prepare(self.store, task, self.worker, self.log, record)) is None:
                return
            kept = None  # other speaker counts or formats than its outputs': its transcript
            if not task.spec.overwrite:
                kept = kept_unlabelled(task.outputs, record)
            journal = journal_path(task.outputs)
            outcome = execute(
                self.service,
                task.path,
                str(task.path),
                task.spec.options,
                progress_recorder(self.store, task),
                kept,
                journal,
            )
            finish(self.store, task, self.worker, outcome, self.log, record)
        except (Shutdown, KeyboardInterrupt) as stop:
            self.store.release(task, self.worker, f"worker stopped ({stop or 'interrupt'})")
            self.log(f"task {task.id} handed back: worker stopped")
            raise
        finally:
            _released(claim)
