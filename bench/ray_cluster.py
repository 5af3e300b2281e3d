"""A real multi-node Ray cluster on this machine, for tests and bench.ray_nodes: every node is
its own `ray start`.

Each node gets its own temporary directory, its own model cache (through SPECSCRIBE_CACHE_DIR
in the environment of its `ray start`, which its workers inherit), a custom resource naming it
and explicit ports (other people's Ray instances may run on this machine). Each `ray start` runs
in a new session, so a node is killed by its process group plus the descendants of its raylet
(Ray's workers start sessions of their own); `ray stop` is never used, because it stops every
Ray process of the user, not only this cluster's.

The cluster runs with token authentication and a token of its own: `ray start` does not pick
up ~/.ray/auth_token the way `ray.init` does, and a token-less cluster would be open to anyone
on the machine. Drivers join with `env()`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
# The head notices a lost node within ~3 s instead of Ray's default ~30 s.
FAST_FAILURE_DETECTION = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each probe stays bound until all are chosen (ports taken
    one after another, each probe closed first, can repeat: a node's two agent ports were the
    same once, and `ray start` refused them)."""
    with contextlib.ExitStack() as probes:
        ports = []
        for _ in range(count):
            probe = probes.enter_context(socket.socket())
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
        return ports


@dataclass(frozen=True)
class RayNode:
    name: str  # also its custom resource: {name: 1}
    temp_dir: Path
    cache_dir: Path
    pgid: int  # the session of its `ray start`: every process it started but the workers


def hard_linked_cache(source: Path, target: Path, models: tuple[str, ...]) -> Path:
    """A model cache holding `models` from `source`, hard-linked where the filesystem allows (a
    node's own cache, as `specscribe models pull` would leave it, without the download)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in models:

        def link(src: str, dst: str) -> None:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(source / name, target / name, copy_function=link)
    return target


class LocalCluster:
    """A head and any number of worker nodes; `close` kills whatever is left of them."""

    def __init__(self, log_dir: Path) -> None:
        # Short paths: Ray's Unix sockets live under the temp dir (at most 107 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="ss-ray-", dir="/tmp"))
        self.log_dir = log_dir
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[RayNode] = []

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a driver (or a node) needs to join this cluster."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, **extra}

    def start_node(self, name: str, cache_dir: Path, head: bool = False, cpus: int = 1) -> RayNode:
        temp_dir = self.root / f"{name}-{len(self.nodes)}"
        client, dashboard, agent_http, agent_grpc, metrics, runtime_env = map(str, free_ports(6))
        head_only = [
            *("--head", f"--port={self.port}", "--include-dashboard=false"),
            *("--ray-client-server-port", client, "--dashboard-port", dashboard),
        ]
        where = head_only if head else [f"--address={self.address}"]
        ports = [
            *("--dashboard-agent-listen-port", agent_http),
            *("--dashboard-agent-grpc-port", agent_grpc),
            *("--metrics-export-port", metrics),
            *("--runtime-env-agent-port", runtime_env),
        ]
        command = [
            str(RAY), "start", *where, *ports, "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
            f"--resources={{\"{name}\": 1}}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        ]  # fmt: skip
        env = self.env(SPECSCRIBE_CACHE_DIR=str(cache_dir.parent), OMP_NUM_THREADS="1")
        if head:
            env.update(FAST_FAILURE_DETECTION)
        log = self.log_dir / f"ray-start-{temp_dir.name}.log"
        with log.open("wb") as out:
            started = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            code = started.wait(timeout=120)
        node = RayNode(name, temp_dir, cache_dir, pgid=started.pid)
        self.nodes.append(node)
        if code != 0:
            raise AssertionError(f"ray start {name} failed ({code}):\n{log.read_text()[-3000:]}")
        return node

    def kill(self, node: RayNode) -> list[int]:
        """SIGKILLs every process of `node` at once (a machine that loses power); returns them."""
        doomed = _session_and_descendants(node.pgid)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in doomed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return doomed

    def close(self) -> None:
        for node in reversed(self.nodes):
            self.kill(node)
        shutil.rmtree(self.root, ignore_errors=True)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) for every process on the machine."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def _session_and_descendants(pgid: int) -> list[int]:
    table = _processes()
    found = {pid for pid, (_, group) in table.items() if group == pgid}
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in found} - found
        found |= children
        grew = bool(children)
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
