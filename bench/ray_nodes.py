"""Throughput of `specscribe worker --engine ray` on one Ray node against two, on this machine.

Each configuration gets a fresh cluster of real `ray start` nodes (bench.ray_cluster: own
temporary directory and own model cache per node, hard-linked from this user's cache), one
job of the first `--max-files` files of the benchmark folder (bench.asr_data.user_files), and
one `specscribe worker --engine ray --ray-address ... --until-idle` process, timed from its
start (Ray connection and actors' model loading included) to its exit. Decode seconds run from
the first task's start to the last one's end, as the store recorded them.

Configurations: `1x1` one node, one actor of one CPU (the baseline); `2x1` two nodes, one actor
each; `1x2` one node with two CPUs and two actors (what two nodes give, without a second
raylet). Two nodes on one machine share its cores: this measures the overhead and the
scheduling of a second node, not the speed of a second machine. Passes are interleaved (every
configuration once, in a rotated order, then again) and each figure is the median over passes.

    python -m bench.ray_nodes [--repeats 2] [--max-files 16] [--model whisper-base] [--save]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.config import Settings
from app.jobs import JobSpec, JobStore
from app.service import ServiceOptions
from bench import positive_int, prog
from bench.asr_data import user_files
from bench.ray_cluster import LocalCluster, hard_linked_cache

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
CONFIGS = {"1x1": (1, 1), "2x1": (2, 1), "1x2": (1, 2)}  # name -> (nodes, CPUs and actors each)


def audio_seconds(paths: list[Path]) -> float:
    from asr.audio import load_audio

    return sum(len(load_audio(path)) / 16000 for path in paths)


def run_config(name: str, files: list[Path], model: str, folder: Path) -> dict:
    nodes, cpus = CONFIGS[name]
    inputs = folder / "in"
    inputs.mkdir(parents=True)
    for path in files:
        shutil.copyfile(path, inputs / path.name)
    store = JobStore(folder / "jobs.db")
    spec = JobSpec(folder / "out", ("json",), ServiceOptions(language="en"), model)
    job = store.submit([inputs], spec)
    cluster = LocalCluster(folder)
    try:
        source = Settings.from_env().cache_dir
        for index in range(nodes):
            node = f"node_{'ab'[index]}"
            cache = hard_linked_cache(source, folder / node / "models", (model,))
            cluster.start_node(node, cache, head=index == 0, cpus=cpus)
        actors = nodes * cpus
        command = [
            sys.executable, "-m", "specscribe.cli", "worker", "--engine", "ray",
            "--ray-address", cluster.address, "--actors", str(actors), "--store", str(store.path),
            "--model", model, "--until-idle", "--poll", "0.2",
        ]  # fmt: skip
        started = time.perf_counter()
        with (folder / "worker.log").open("wb") as log:
            code = subprocess.run(command, cwd=REPO, env=cluster.env(), stdout=log, stderr=log)
        wall = time.perf_counter() - started
    finally:
        cluster.close()
    if code.returncode != 0:
        raise SystemExit(f"{name}: worker failed, see {folder / 'worker.log'}")
    tasks = store.tasks(job)
    if {task.state for task in tasks} != {"done"}:
        raise SystemExit(f"{name}: not every file done: {[t.error for t in tasks if t.error]}")
    decode = max(t.finished for t in tasks) - min(t.started for t in tasks)
    per_node = {}
    for task in tasks:
        where = (task.note or "").removeprefix("transcribed on Ray node ").split(";")[0]
        per_node[where] = per_node.get(where, 0) + 1
    return {
        "config": name,
        "nodes": nodes,
        "actors": actors,
        "wall_s": round(wall, 2),
        "decode_s": round(decode, 2),
        "files_per_node": sorted(per_node.values()),
    }


def _median(runs: list[dict], audio_s: float) -> dict:
    """One configuration's passes -> medians of the seconds, every pass's figures kept."""
    wall = statistics.median(run["wall_s"] for run in runs)
    return {
        **{key: runs[0][key] for key in ("config", "nodes", "actors")},
        "wall_s": round(wall, 2),
        "decode_s": round(statistics.median(run["decode_s"] for run in runs), 2),
        "audio_s_per_s": round(audio_s / wall, 2),
        "passes": [{k: run[k] for k in ("wall_s", "decode_s", "files_per_node")} for run in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("ray_nodes"), description=__doc__.splitlines()[0])
    parser.add_argument("--max-files", type=positive_int, default=16)
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    files = [utterance.audio for utterance in user_files()][: args.max_files]
    seconds = audio_seconds(files)
    load_before = os.getloadavg()[0]  # other users of this machine, before the first run
    names = args.configs.split(",")
    passes: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="ray-nodes-") as work:
        for repeat in range(args.repeats):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                row = run_config(name, files, args.model, Path(work) / f"{name}-{repeat}")
                passes[name].append(row)
                print(json.dumps(row), flush=True)
    rows = [_median(passes[name], seconds) for name in names]
    for row in rows:
        row["speed_vs_first"] = round(rows[0]["wall_s"] / row["wall_s"], 2)
    result = {
        "benchmark": "ray_nodes",
        "date": datetime.date.today().isoformat(),
        "cpu_count": os.cpu_count(),
        "load_before": round(load_before, 2),
        "repeats": args.repeats,
        "files": len(files),
        "audio_s": round(seconds, 1),
        "model": args.model,
        "rows": rows,
    }
    if args.save:
        path = RESULTS / f"ray-nodes-{result['date']}-cpu{os.cpu_count()}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
