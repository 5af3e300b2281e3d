"""The driver's pool of Ray actors: a fixed number of them, started and replaced without waiting.

An actor is *starting* (created, its models loading, perhaps waiting for a node with a free CPU)
until its `describe()` answers, then *idle* or *busy*. One that dies (its process killed, its
node lost) is replaced by a fresh one that Ray places wherever CPUs are free; while the cluster
has no room, the replacement waits in Ray's queue, and a node that joins or comes back gets it.
The driver never blocks on a start, so the actors that live keep decoding meanwhile.
"""

from __future__ import annotations

from typing import Any

from .ray_actor import ActorSpec, NodeInfo, Transcriber
from .worker import Log


class ActorStartError(RuntimeError):
    """An actor's constructor raised (its models cannot be fetched or loaded): a fault of the
    configuration or the node, not a lost node, so starting another would fail the same way."""


class ActorPool:
    """`size` Transcriber actors, each starting, idle or busy; the driver takes an idle one per
    file and gives it back, or replaces it when it died."""

    def __init__(self, ray: Any, spec: ActorSpec, size: int, log: Log) -> None:
        self.ray, self.spec, self.size, self.log = ray, spec, size, log
        self._class = ray.remote(num_cpus=spec.threads, max_restarts=0, max_concurrency=2)(
            Transcriber
        )
        self._starting: dict[Any, Any] = {}  # describe() ref -> actor
        self._idle: list[Any] = []
        self.nodes: dict[Any, NodeInfo] = {}  # every started actor -> where it runs
        self.started = 0  # actors created, replacements included

    def start(self) -> None:
        for _ in range(self.size):
            self._launch()

    def _launch(self) -> None:
        actor = self._class.remote(self.spec)
        self._starting[actor.describe.remote()] = actor
        self.started += 1

    @property
    def waiting(self) -> list[Any]:
        """The refs that answer when a starting actor is ready, for the driver's `ray.wait`."""
        return list(self._starting)

    def has_idle(self) -> bool:
        return bool(self._idle)

    def take(self) -> Any:
        return self._idle.pop()

    def give_back(self, actor: Any) -> None:
        self._idle.append(actor)

    def settle(self, ready: list[Any]) -> None:
        """Moves the actors whose start answered (refs in `ready`) to idle; replaces those that
        died while starting; raises ActorStartError where a constructor failed."""
        for ref in [ref for ref in ready if ref in self._starting]:
            actor = self._starting.pop(ref)
            try:
                info = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as error:
                if error.actor_init_failed:
                    raise ActorStartError(
                        f"a Ray actor could not load the models: {error}"
                    ) from None
                self.log(f"a starting Ray actor was lost ({first_line(error)}); starting another")
                self._launch()
                continue
            if info.model != self.spec.asr_model:
                raise ActorStartError(
                    f"the actor loaded {info.model}, the driver claims for {self.spec.asr_model}"
                )
            self.nodes[actor] = info
            self._idle.append(actor)
            self.log(
                f"Ray actor ready on {info.label} (pid {info.pid}; {info.model}, "
                f"{info.precision}; models from {info.cache_dir})"
            )

    def replace(self, actor: Any) -> None:
        """Drops an actor that died (or must not be trusted) and starts another."""
        self.ray.kill(actor, no_restart=True)  # harmless when it is dead already
        self._launch()

    def where(self, actor: Any) -> NodeInfo:
        return self.nodes[actor]


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
