"""The batch worker's durable job store: one SQLite file (stdlib sqlite3, WAL) that the CLI, the
UI, Python callers and any number of worker processes on one machine share.

A job is what a user asked for: files and folders, the request options, an output folder and
formats. `submit` expands it at once into one task per audio file, so a rerun never redoes a
finished file and progress is counted in files. A worker claims one task at a time in a write
transaction (BEGIN IMMEDIATE, so two claims never interleave) and holds it under a lease that a
heartbeat thread renews. A task whose worker died is claimed again when its lease runs out, or at
once when the dead worker ran on this machine (its pid is gone). Each claim gets a fresh token;
every later write about the task (heartbeat, progress, done, failed) names it, so a worker that
lost its lease can no longer record anything. `events` keeps the history: every claim, reclaim,
completion, failure and release, one row each.

Times are unix seconds (float).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asr.writers import SubtitleLayout

from .service import ServiceOptions

SCHEMA_VERSION = 2  # 2: jobs.layout
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    sources TEXT NOT NULL,      -- JSON list of the paths as submitted
    output_dir TEXT NOT NULL,
    formats TEXT NOT NULL,      -- JSON list of writer names
    options TEXT NOT NULL,      -- JSON of ServiceOptions
    model TEXT,                 -- only a worker with this ASR model runs it; NULL: any worker
    overwrite INTEGER NOT NULL,
    layout TEXT                 -- JSON of the subtitle layout; NULL: cues as Whisper's segments
);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    path TEXT NOT NULL,
    stem TEXT NOT NULL,         -- outputs are OUTPUT_DIR/STEM.FORMAT
    output_key TEXT NOT NULL,   -- OUTPUT_DIR/STEM: no two running tasks share one
    state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    token TEXT,                 -- the current claim's; stale claims cannot write
    worker TEXT,
    worker_host TEXT,
    worker_pid INTEGER,
    lease_until REAL,
    first_started REAL,
    started REAL,
    finished REAL,
    seconds REAL,
    stage TEXT,                 -- progress(stage, completed, total) of the running attempt
    completed INTEGER,
    total INTEGER,
    note TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks(state, id);
CREATE INDEX IF NOT EXISTS tasks_by_output ON tasks(output_key, state);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    task_id INTEGER NOT NULL REFERENCES tasks(id),
    kind TEXT NOT NULL,         -- claimed | reclaimed | done | failed | released | lost | retried
    worker TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS events_by_task ON events(task_id);
"""


def _unwritable(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite's error says the store cannot be written at all: a read-only file or file
    system, an immutable file, a full disk."""
    said = str(error)
    return "readonly" in said or "disk is full" in said or "disk I/O error" in said


def _statements(script: str) -> Iterator[str]:
    """The SQL statements of `script`, one at a time (`execute` takes one; `executescript`
    would commit the transaction they must run in). Semicolons in comments do not end one."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""


class JobStoreError(RuntimeError):
    """The store file cannot be used (made by a newer specscribe, not a database, ...)."""


def default_store_path() -> Path:
    """Per-user data (not cache) folder: the queue must survive a cache clean-up."""
    import platformdirs

    return Path(platformdirs.user_data_dir("specscribe")) / "jobs.sqlite3"


@dataclass(frozen=True)
class JobSpec:
    """Everything a job asks for besides its inputs. `validate` names the offending field."""

    output_dir: Path
    formats: tuple[str, ...] = ("txt",)
    options: ServiceOptions = field(default_factory=ServiceOptions)
    model: str | None = None  # None: whichever model the worker has loaded
    overwrite: bool = False  # False: a file whose outputs all exist is done without decoding
    layout: SubtitleLayout = field(default_factory=SubtitleLayout)  # srt and vtt cues

    def validate(self) -> JobSpec:
        """Checks the formats and the layout, as `transcribe` does; the options were checked
        when they were made."""
        from .request import check_formats

        check_formats(self.formats, self.options.diarize)
        self.layout.validate().check_formats(self.formats)
        if self.layout.shaped and not self.options.word_timestamps:  # cues timed by words
            raise ValueError("a subtitle layout needs word_timestamps")
        return self

    def record(self, service_record: dict) -> dict:
        """The option record of this job's outputs, from the service's for its options."""
        return service_record | self.layout.recorded()


@dataclass(frozen=True)
class WorkerId:
    """Who holds a claim. host + pid let a worker on the same machine see that it is dead."""

    host: str
    pid: int
    name: str

    @classmethod
    def this_process(cls, engine: str = "local") -> WorkerId:
        host, pid = socket.gethostname(), os.getpid()
        return cls(host, pid, f"{engine}@{host}:{pid}")


@dataclass(frozen=True)
class ClaimedTask:
    """One file a worker now holds; `token` proves the claim in every later write."""

    id: int
    job_id: int
    path: Path
    stem: Path
    spec: JobSpec
    attempt: int  # 1 for the first run, 2 after one reclaim, ...
    token: str
    first_started: float

    @property
    def outputs(self) -> dict[str, Path]:
        from asr.writers import output_paths

        return output_paths(self.spec.output_dir, self.stem, list(self.spec.formats))


@dataclass(frozen=True)
class TaskStatus:
    id: int
    job_id: int
    path: Path
    stem: Path
    state: str  # pending | running | done | failed
    attempts: int
    worker: str | None
    worker_host: str | None
    worker_pid: int | None
    lease_until: float | None
    started: float | None
    finished: float | None
    seconds: float | None
    stage: str | None
    completed: int | None
    total: int | None
    note: str | None
    error: str | None

    def stalled(self, now: float) -> bool:
        """Running, but nobody is working on it until a worker claims it again: its worker
        stopped renewing the lease (killed, or its machine gone), or ran on this machine and
        has exited, which is known at once (a `kill -9`), before its lease runs out."""
        if self.state != "running":
            return False
        lapsed = self.lease_until is not None and self.lease_until < now
        return lapsed or self.worker_exited()

    def worker_exited(self) -> bool:
        """Whether its worker ran on this machine and no longer does (any state)."""
        return (
            self.worker_host == socket.gethostname()
            and self.worker_pid is not None
            and _process_is_gone(self.worker_pid)
        )


@dataclass(frozen=True)
class JobStatus:
    id: int
    created: float
    sources: tuple[str, ...]
    output_dir: Path
    formats: tuple[str, ...]
    model: str | None
    counts: dict[str, int]  # state -> number of tasks

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def state(self) -> str:
        """queued (nothing started), running, done (every file), failed (finished, some failed)."""
        pending, running = self.counts.get("pending", 0), self.counts.get("running", 0)
        if running or (pending and pending < self.total):
            return "running"
        if pending:
            return "queued"
        return "failed" if self.counts.get("failed", 0) else "done"


@dataclass(frozen=True)
class Event:
    id: int
    at: float
    task_id: int
    kind: str
    worker: str | None
    detail: str | None


def _process_is_gone(pid: int) -> bool:
    """True when no live process has this pid (a zombie counts as gone: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # not Linux, or it just ended: the lease decides
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


@dataclass(frozen=True)
class PlannedJob:
    """A job checked and listed, before it touches a store: what `JobStore.enqueue` queues."""

    spec: JobSpec
    sources: tuple[Path, ...]  # the paths given, absolute (links kept)
    output_dir: Path  # resolved
    files: tuple[tuple[Path, Path], ...]  # (audio file, its outputs' stem under output_dir)


def _absolute(path: Path) -> Path:
    """`path` made absolute, its symbolic links kept: a link's outputs are named after the
    link, as `transcribe` names them (`links/monday.wav` -> `REC001.wav` makes monday.txt). A
    loop of symbolic links is a ValueError naming it (pathlib raises RuntimeError on Python
    3.11, OSError on later ones)."""
    try:
        path.resolve()
    except (RuntimeError, OSError):
        raise ValueError(f"{path}: a loop of symbolic links") from None
    return Path(os.path.abspath(path))


def plan_job(paths: Sequence[Path | str], spec: JobSpec) -> PlannedJob:
    """The job `paths` make with `spec`: every audio file under them (folders searched
    recursively). Raises ValueError naming a missing path, a folder without audio, an output
    folder that cannot be one, is not writable or whose disk is full, two inputs that would
    write the same outputs, an output that is one of the inputs, or a name the store cannot
    keep. Reads no store, so a refused job leaves none behind (`specscribe submit` makes its
    store only after this)."""
    from asr.audio import check_distinct_outputs, find_audio_files
    from asr.writers import (
        file_in_the_way,
        no_room_for_outputs,
        output_paths,
        outputs_over_recordings,
    )

    from .output_claim import names_too_long

    spec.validate()
    sources = [_absolute(Path(p).expanduser()) for p in paths]
    if not sources:
        raise ValueError("nothing to submit: give at least one file or folder")
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise ValueError(f"no such file or folder: {', '.join(missing)}")
    try:
        empty = [str(p) for p in sources if p.is_dir() and not find_audio_files([p])]
        files = find_audio_files(sources)
    except OSError as error:  # a folder that cannot be listed: nothing under it is skipped
        raise ValueError(f"cannot list {error.filename}: {error.strerror}") from None
    if empty:
        raise ValueError(f"no audio files in {', '.join(empty)}")
    output_dir = spec.output_dir.expanduser().resolve()
    # A file where a folder must go can never be written to (the folder itself is made by
    # the worker, which may run elsewhere): refused now, not after each file is decoded.
    if (blocking := file_in_the_way(output_dir)) is not None:
        raise ValueError(f"--output-dir {output_dir}: {blocking} is a file, not a folder")
    if output_dir.is_dir() and not os.access(output_dir, os.W_OK | os.X_OK):
        raise ValueError(f"--output-dir {output_dir}: not writable")  # read-only, immutable
    nearest = next(p for p in (output_dir, *output_dir.parents) if p.is_dir())
    if nearest != output_dir and not os.access(nearest, os.W_OK | os.X_OK):
        raise ValueError(f"--output-dir {output_dir}: cannot be made: {nearest} is not writable")
    if full := no_room_for_outputs(output_dir):
        raise ValueError(f"--output-dir {output_dir}: {full}")
    check_distinct_outputs(files, output_dir)
    for path, stem in files:
        if too_long := names_too_long(output_paths(output_dir, stem, list(spec.formats))):
            raise ValueError(f"{path}: {too_long}")
        try:  # the store keeps paths as SQLite text, which is UTF-8
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{path}: its name is not UTF-8 (a Latin-1 name?), which the job store cannot "
                "keep; rename it, or transcribe it with `specscribe transcribe`"
            ) from None
    if over := outputs_over_recordings(files, output_dir, list(spec.formats)):
        raise ValueError(next(iter(over.values())))
    by_stem = {stem: path for path, stem in files}
    return PlannedJob(
        spec=spec,
        sources=tuple(sources),
        output_dir=output_dir,
        files=tuple((path, stem) for stem, path in by_stem.items()),
    )


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, or None where there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class JobStore:
    """The queue. One object may be shared by threads: each thread gets its own connection."""

    def __init__(
        self,
        path: Path | str,
        *,
        busy_timeout: float = 60.0,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        """create=False: the store must exist already (a reader given a mistyped path must
        not make an empty store and report no jobs). Unless read_only, a store that cannot be
        written raises JobStoreError now, before a worker loads its models or claims work."""
        self.path = Path(path).expanduser()
        self.busy_timeout, self.read_only = busy_timeout, read_only
        self._local = threading.local()
        if self.path.is_dir():
            raise JobStoreError(f"{self.path} is a folder; the job store is an SQLite file")
        if not create and not self.path.is_file():
            raise JobStoreError(f"no job store at {self.path}")
        if self.path.is_file() and self.path.stat().st_size == 0:
            # SQLite takes an empty file for an empty database and writes one into it: a
            # mistyped --store naming some empty file would become a store.
            raise JobStoreError(
                f"{self.path} is an empty file, not a job store (an SQLite file); name another "
                "--store, or remove it"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            from asr.writers import file_in_the_way

            blocking = file_in_the_way(self.path.parent)
            reason = f"{blocking} is a file, not a folder" if blocking else error.strerror or error
            raise JobStoreError(f"{self.path}: {reason}") from None
        connection = self._connection()  # creates the schema, and fails now on a bad file
        if not read_only:
            with self._write(connection) as db:
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._identity = _file_identity(self.path)

    def replaced(self) -> bool:
        """Whether the path no longer names the file this store opened (removed, or another
        moved over it: a backup restored): its connections still read the old one, and jobs
        submitted to the path since would wait for a worker that never sees them."""
        return _file_identity(self.path) != self._identity

    # -- connection and transactions ----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            # isolation_level=None: no implicit transactions; every write below opens its own.
            try:
                connection = sqlite3.connect(
                    self.path, timeout=self.busy_timeout, isolation_level=None
                )
            except sqlite3.Error as error:  # a folder we may not write to, ...
                raise JobStoreError(f"{self.path}: cannot open the job store ({error})") from None
            connection.row_factory = sqlite3.Row
            try:
                self._prepare(connection)
            except sqlite3.DatabaseError as error:
                connection.close()
                if isinstance(error, sqlite3.OperationalError) and (
                    _unwritable(error) or "unable to open" in str(error)
                ):
                    connection = self._snapshot(error)
                else:
                    raise JobStoreError(f"{self.path}: not a usable job store ({error})") from None
            self._local.connection = connection
        return connection

    def _snapshot(self, error: sqlite3.OperationalError) -> sqlite3.Connection:
        """A reader's connection to a store whose disk is full or read-only, or in a folder the
        reader may not write to: SQLite cannot make the shared-memory file a WAL store's readers
        need, so `status` could not show the jobs. Where no write-ahead log holds changes the
        store file lacks, the file alone is the store, read as immutable. Anything else raises
        JobStoreError saying why."""
        log = self.path.with_name(f"{self.path.name}-wal")
        unlogged = not log.exists() or log.stat().st_size == 0
        if not (self.read_only and unlogged):
            why = "is its disk full or read-only, or its folder not writable?"
            raise JobStoreError(f"{self.path}: cannot open the job store ({error}: {why})")
        uri = f"{self.path.resolve().as_uri()}?immutable=1"
        connection = sqlite3.connect(uri, uri=True, isolation_level=None)
        connection.row_factory = sqlite3.Row
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:  # too old to read (a reader cannot upgrade it) or too new
            connection.close()
            raise JobStoreError(f"{self.path}: a job store of schema {version}, cannot be read")
        return connection

    def _prepare(self, connection: sqlite3.Connection) -> None:
        # WAL: readers (status, heartbeats) never block the writer that claims.
        # synchronous=FULL: a submitted job or a recorded completion survives a power cut too.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA foreign_keys=ON")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise JobStoreError(
                f"{self.path}: made by a newer specscribe (schema {version} > {SCHEMA_VERSION})"
            )
        if version < SCHEMA_VERSION:
            self._upgrade(connection)

    @staticmethod
    def _upgrade(connection: sqlite3.Connection) -> None:
        """Makes the schema (a new store), or adds what schema 2 added (a store of schema 1),
        in one transaction under the write lock: of two processes upgrading at once, the second
        finds the column there and adds nothing."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(SCHEMA):
                connection.execute(statement)
            columns = {row["name"] for row in connection.execute("PRAGMA table_info(jobs)")}
            if "layout" not in columns:
                connection.execute("ALTER TABLE jobs ADD COLUMN layout TEXT")
            connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _write(self, connection: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the database's write lock at its start, so the
        read-then-update of a claim is atomic across processes."""
        connection = connection or self._connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except sqlite3.OperationalError as error:
            connection.execute("ROLLBACK")
            if _unwritable(error):
                unwritten = f"{self.path}: the job store cannot be written ({error})"
                raise JobStoreError(unwritten) from None
            raise
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        try:
            connection.execute("COMMIT")
        except sqlite3.OperationalError as error:
            if not _unwritable(error):
                raise
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                connection.execute("ROLLBACK")
            raise JobStoreError(f"{self.path}: the job store cannot be written ({error})") from None

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    @staticmethod
    def _event(db: sqlite3.Connection, task_id: int, kind: str, worker: str | None, detail=None):
        db.execute(
            "INSERT INTO events (at, task_id, kind, worker, detail) VALUES (?, ?, ?, ?, ?)",
            (time.time(), task_id, kind, worker, detail),
        )

    # -- submitting -----------------------------------------------------------------------------

    def submit(self, paths: Sequence[Path | str], spec: JobSpec) -> int:
        """Queues one job: every audio file in `paths` (folders searched recursively) becomes a
        task. Returns the job id. Raises ValueError as `plan_job` does, queueing nothing."""
        return self.enqueue(plan_job(paths, spec))

    def enqueue(self, job: PlannedJob) -> int:
        """Queues a job `plan_job` made (each of its files a pending task); returns its id."""
        spec = job.spec
        with self._write() as db:
            job_id = db.execute(
                "INSERT INTO jobs"
                " (created, sources, output_dir, formats, options, model, overwrite, layout)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    json.dumps([str(p) for p in job.sources]),
                    str(job.output_dir),
                    json.dumps(list(spec.formats)),
                    spec.options.to_json(),
                    spec.model,
                    int(spec.overwrite),
                    json.dumps(dataclasses.asdict(spec.layout)) if spec.layout.shaped else None,
                ),
            ).lastrowid
            db.executemany(
                "INSERT INTO tasks (job_id, path, stem, output_key, state) "
                "VALUES (?, ?, ?, ?, 'pending')",
                [(job_id, str(p), str(s), str(job.output_dir / s)) for p, s in job.files],
            )
        return job_id

    def retry(self, job_ids: Sequence[int]) -> dict[int, int]:
        """Queues the failed files of the jobs `job_ids` again, as new: pending, their attempts
        (which count towards a worker's max_attempts) and errors cleared, a "retried" event
        each. Job id -> files queued again. Raises ValueError naming ids that are no job."""
        with self._write() as db:
            known = {
                row[0]
                for row in db.execute(
                    f"SELECT id FROM jobs WHERE id IN ({','.join('?' * len(job_ids))})",
                    list(job_ids),
                )
            }
            missing = [str(job) for job in job_ids if job not in known]
            if missing:
                raise ValueError(f"no job {', '.join(missing)} in {self.path}")
            retried = {}
            for job in dict.fromkeys(job_ids):
                ids = [
                    row[0]
                    for row in db.execute(
                        "SELECT id FROM tasks WHERE job_id = ? AND state = 'failed'", (job,)
                    )
                ]
                db.executemany(
                    "UPDATE tasks SET state = 'pending', attempts = 0, error = NULL,"
                    " first_started = NULL, finished = NULL, seconds = NULL, stage = NULL,"
                    " completed = NULL, total = NULL, note = 'retried' WHERE id = ?",
                    [(task,) for task in ids],
                )
                for task in ids:
                    self._event(db, task, "retried", None)
                retried[job] = len(ids)
        return retried

    # -- claiming and holding -------------------------------------------------------------------

    def claim(
        self, worker: WorkerId, model: str, *, lease: float = 30.0, max_attempts: int = 3
    ) -> ClaimedTask | None:
        """Takes the oldest task this worker may run: pending, or running under a lease that ran
        out (or whose worker on this host is gone). None when there is none.

        A task is not handed out while another running task writes the same outputs, and one
        whose workers died `max_attempts` times fails instead of killing a fifth worker.
        """
        now = time.time()
        with self._write() as db:
            # 1. Claims of dead workers on this machine end now instead of at lease expiry.
            local = db.execute(
                "SELECT id, worker_pid FROM tasks WHERE state = 'running' AND worker_host = ?"
                " AND lease_until >= ?",
                (worker.host, now),
            ).fetchall()
            dead = [row["id"] for row in local if _process_is_gone(row["worker_pid"])]
            db.executemany("UPDATE tasks SET lease_until = 0 WHERE id = ?", [(i,) for i in dead])
            # 2. A task that has already taken down max_attempts workers fails.
            for row in db.execute(
                "SELECT id, attempts, worker FROM tasks WHERE state = 'running'"
                " AND lease_until < ? AND attempts >= ?",
                (now, max_attempts),
            ).fetchall():
                error = (
                    f"the worker running it stopped {row['attempts']} times without finishing "
                    f"(crash, kill or lost lease; last {row['worker']})"
                )
                db.execute(
                    "UPDATE tasks SET state = 'failed', error = ?, finished = ?, token = NULL"
                    " WHERE id = ?",
                    (error, now, row["id"]),
                )
                self._event(db, row["id"], "failed", worker.name, error)
            # 3. The oldest runnable task whose outputs nobody is writing right now.
            row = db.execute(
                """
                SELECT t.*, j.output_dir, j.formats, j.options, j.model, j.overwrite, j.layout
                FROM tasks t JOIN jobs j ON j.id = t.job_id
                WHERE (t.state = 'pending' OR (t.state = 'running' AND t.lease_until < :now))
                  AND (j.model IS NULL OR j.model = :model)
                  AND NOT EXISTS (
                      SELECT 1 FROM tasks r
                      WHERE r.output_key = t.output_key AND r.id != t.id
                        AND r.state = 'running' AND r.lease_until >= :now)
                ORDER BY t.id LIMIT 1
                """,
                {"now": now, "model": model},
            ).fetchone()
            if row is None:
                return None
            token = uuid.uuid4().hex
            first_started = row["first_started"] or now
            db.execute(
                "UPDATE tasks SET state = 'running', attempts = attempts + 1, token = ?,"
                " worker = ?, worker_host = ?, worker_pid = ?, lease_until = ?,"
                " first_started = ?, started = ?, stage = NULL, completed = NULL, total = NULL"
                " WHERE id = ?",
                (
                    token,
                    worker.name,
                    worker.host,
                    worker.pid,
                    now + lease,
                    first_started,
                    now,
                    row["id"],
                ),
            )
            kind = "reclaimed" if row["state"] == "running" else "claimed"
            detail = f"from {row['worker']}" if kind == "reclaimed" else None
            self._event(db, row["id"], kind, worker.name, detail)
        spec = JobSpec(
            output_dir=Path(row["output_dir"]),
            formats=tuple(json.loads(row["formats"])),
            options=ServiceOptions.from_json(row["options"]),
            model=row["model"],
            overwrite=bool(row["overwrite"]),
            layout=SubtitleLayout(**json.loads(row["layout"]))
            if row["layout"]
            else SubtitleLayout(),
        )
        return ClaimedTask(
            id=row["id"],
            job_id=row["job_id"],
            path=Path(row["path"]),
            stem=Path(row["stem"]),
            spec=spec,
            attempt=row["attempts"] + 1,
            token=token,
            first_started=first_started,
        )

    def renew(self, task: ClaimedTask, lease: float) -> bool:
        """Heartbeat: extends the lease. False when the claim was lost (reclaimed elsewhere)."""
        cursor = self._connection().execute(
            "UPDATE tasks SET lease_until = ? WHERE id = ? AND token = ? AND state = 'running'",
            (time.time() + lease, task.id, task.token),
        )
        return cursor.rowcount == 1

    def holds(self, task: ClaimedTask) -> bool:
        """Whether this claim is still the task's current one and its lease has not run out."""
        row = (
            self._connection()
            .execute(
                "SELECT 1 FROM tasks WHERE id = ? AND token = ? AND state = 'running'"
                " AND lease_until >= ?",
                (task.id, task.token, time.time()),
            )
            .fetchone()
        )
        return row is not None

    def progress(self, task: ClaimedTask, stage: str, completed: int, total: int) -> None:
        self._connection().execute(
            "UPDATE tasks SET stage = ?, completed = ?, total = ? WHERE id = ? AND token = ?",
            (stage, completed, total, task.id, task.token),
        )

    # -- finishing ------------------------------------------------------------------------------

    def _finish(
        self, task: ClaimedTask, state: str, kind: str, worker: str, fields: dict[str, Any]
    ) -> bool:
        """One transition out of `running`, recorded with its event in one transaction; only the
        current claim can make it, so a task completes at most once per claim."""
        assignments = ", ".join(f"{name} = :{name}" for name in fields)
        with self._write() as db:
            cursor = db.execute(
                f"UPDATE tasks SET state = :state, token = NULL, {assignments}"
                " WHERE id = :id AND token = :token AND state = 'running'",
                {**fields, "state": state, "id": task.id, "token": task.token},
            )
            if cursor.rowcount != 1:
                return False
            detail = fields.get("note") or fields.get("error")
            self._event(db, task.id, kind, worker, detail)
        return True

    def complete(self, task: ClaimedTask, worker: WorkerId, seconds: float, note: str) -> bool:
        """Marks the task done (its outputs are written). False when the claim was lost."""
        fields = {"finished": time.time(), "seconds": round(seconds, 3), "note": note}
        return self._finish(task, "done", "done", worker.name, {**fields, "error": None})

    def fail(self, task: ClaimedTask, worker: WorkerId, error: str, seconds: float = 0.0) -> bool:
        """Marks the task failed with its reason; it is not tried again by itself (`retry`)."""
        fields = {"finished": time.time(), "seconds": round(seconds, 3), "error": error}
        return self._finish(task, "failed", "failed", worker.name, fields)

    def release(
        self, task: ClaimedTask, worker: WorkerId, reason: str, *, count_attempt: bool = False
    ) -> bool:
        """Hands the task back: pending again. A worker shutting down does not count the attempt
        towards max_attempts; a decoder process that died (count_attempt) does."""
        attempts = task.attempt if count_attempt else task.attempt - 1
        fields = {"attempts": attempts, "lease_until": None, "note": reason}
        return self._finish(task, "pending", "released", worker.name, fields)

    def record_lost(self, task: ClaimedTask, worker: WorkerId, detail: str) -> None:
        with self._write() as db:
            self._event(db, task.id, "lost", worker.name, detail)

    # -- status ---------------------------------------------------------------------------------

    def failed_by(self, worker: WorkerId) -> dict[int, int]:
        """Job id -> how many of its tasks are failed by this worker's hand (their failure
        event is its)."""
        rows = (
            self._connection()
            .execute(
                "SELECT t.job_id, COUNT(DISTINCT t.id) FROM events e JOIN tasks t"
                " ON t.id = e.task_id WHERE e.kind = 'failed' AND e.worker = ?"
                " AND t.state = 'failed' GROUP BY t.job_id ORDER BY t.job_id",
                (worker.name,),
            )
            .fetchall()
        )
        return {int(job): int(count) for job, count in rows}

    def has_work(self, model: str) -> bool:
        """Whether a task this model's workers could run is pending or running anywhere."""
        row = (
            self._connection()
            .execute(
                "SELECT 1 FROM tasks t JOIN jobs j ON j.id = t.job_id"
                " WHERE t.state IN ('pending', 'running') AND (j.model IS NULL OR j.model = ?)"
                " LIMIT 1",
                (model,),
            )
            .fetchone()
        )
        return row is not None

    def waiting_for_other_models(self, model: str) -> dict[int, str]:
        """The jobs with files pending for workers of another model than `model`: job id ->
        the model it asks for (`submit --model`), which a worker of `model` never runs."""
        rows = (
            self._connection()
            .execute(
                "SELECT DISTINCT j.id, j.model FROM tasks t JOIN jobs j ON j.id = t.job_id"
                " WHERE t.state = 'pending' AND j.model IS NOT NULL AND j.model != ?"
                " ORDER BY j.id",
                (model,),
            )
            .fetchall()
        )
        return {row[0]: row[1] for row in rows}

    def jobs(self, ids: Sequence[int] = ()) -> list[JobStatus]:
        """Jobs (all, or those with these ids) with their task counts, oldest first."""
        db = self._connection()
        where = f"WHERE id IN ({','.join('?' * len(ids))})" if ids else ""
        rows = db.execute(f"SELECT * FROM jobs {where} ORDER BY id", tuple(ids)).fetchall()
        counts: dict[int, dict[str, int]] = {}
        for job_id, state, number in db.execute(
            "SELECT job_id, state, COUNT(*) FROM tasks GROUP BY job_id, state"
        ):
            counts.setdefault(job_id, {})[state] = number
        return [
            JobStatus(
                id=row["id"],
                created=row["created"],
                sources=tuple(json.loads(row["sources"])),
                output_dir=Path(row["output_dir"]),
                formats=tuple(json.loads(row["formats"])),
                model=row["model"],
                counts=counts.get(row["id"], {}),
            )
            for row in rows
        ]

    def tasks(self, job_id: int | None = None) -> list[TaskStatus]:
        where, arguments = ("WHERE job_id = ?", (job_id,)) if job_id is not None else ("", ())
        rows = self._connection().execute(f"SELECT * FROM tasks {where} ORDER BY id", arguments)
        names = {item.name for item in dataclasses.fields(TaskStatus)}
        return [
            TaskStatus(
                **{
                    **{name: row[name] for name in names},
                    "path": Path(row["path"]),
                    "stem": Path(row["stem"]),
                }
            )
            for row in rows
        ]

    def events(self, task_id: int | None = None) -> list[Event]:
        where, arguments = ("WHERE task_id = ?", (task_id,)) if task_id is not None else ("", ())
        rows = self._connection().execute(f"SELECT * FROM events {where} ORDER BY id", arguments)
        return [Event(**dict(row)) for row in rows]
