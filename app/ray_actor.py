"""The Ray actor: one decoding process on some node of a Ray cluster, models loaded once.

What to decode with (models, device, precision) is the driver's choice and travels in an
`ActorSpec`; where things are on the machine (the model cache, tokens) is the node's own, read
from the environment of the node's `ray start` process, which Ray workers inherit. So a node
needs specscribe installed and nothing from the driver's disk: it resolves, fetches and checks
its own models (`ModelRegistry.ensure`).

The actor is threaded (two calls at a time), so `progress` answers while `transcribe` runs; the
driver polls it and records the stage in the store, which only the driver can reach.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from .config import Settings
from .service import ServiceOptions, TranscriptionService
from .unlabelled_cache import Kept
from .worker import Outcome, execute


@dataclass(frozen=True)
class ActorSpec:
    """What every actor decodes with, settled once by the driver (names, not paths: a path on
    the driver's disk means nothing on another node)."""

    asr_model: str
    assistant_model: str
    diarization_model: str
    device: str
    precision: str
    threads: int  # torch threads: the CPUs the actor reserves from Ray

    @classmethod
    def choose(cls, settings: Settings, models: dict[str, str | None], threads: int) -> ActorSpec:
        """models: TranscriptionService's keyword arguments, None meaning the settings' choice."""
        defaults = {
            "asr_model": settings.asr_model,
            "assistant_model": settings.assistant_model,
            "diarization_model": settings.diarization_model,
            "device": settings.device,
            "precision": settings.precision,
        }
        chosen = {
            name: default if models.get(name) is None else models[name]
            for name, default in defaults.items()
        }
        return cls(**chosen, threads=threads)

    def service_arguments(self) -> dict[str, str]:
        return {
            "asr_model": self.asr_model,
            "assistant_model": self.assistant_model,
            "diarization_model": self.diarization_model,
            "device": self.device,
            "precision": self.precision,
        }


@dataclass(frozen=True)
class NodeInfo:
    """Where an actor runs and what it loaded: the driver logs it and names the node in each
    task's note, so `status` and the events say which machine decoded a file."""

    node_id: str
    host: str
    pid: int
    cache_dir: str
    model: str
    precision: str  # resolved on the node ("auto" may differ between machines)

    @property
    def label(self) -> str:
        return f"{self.host}/{self.node_id[:8]}"


@dataclass(frozen=True)
class Progress:
    """The stage the actor's current file is in: `progress(stage, completed, total)`."""

    stage: str
    completed: int
    total: int


class Transcriber:
    """The actor class (the driver wraps it in `ray.remote`)."""

    def __init__(self, spec: ActorSpec) -> None:
        import ray
        import torch

        torch.set_num_threads(spec.threads)
        settings = Settings.from_env()  # this node's environment: its cache, its tokens
        self.service = TranscriptionService(settings, **spec.service_arguments())
        self._ensure_models()
        self.service.load()
        self.info = NodeInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            cache_dir=str(settings.cache_dir),
            model=self.service.asr_model_name,
            precision=self.service.precision,
        )
        self._lock = threading.Lock()
        self._progress: Progress | None = None

    def _ensure_models(self) -> None:
        """Fetches what this node's cache lacks and re-hashes what it has, before loading."""
        from asr.models import EMBEDDED

        for name in (self.service.asr_model_name, self.service.draft_model_name):
            if name in EMBEDDED:
                self.service.registry.ensure(name)

    def describe(self) -> NodeInfo:
        return self.info

    def output_record(self, options: ServiceOptions) -> dict:
        """The option record this actor's outputs carry (its precision is its node's)."""
        return self.service.output_record(options)

    def transcribe(
        self, audio: bytes, label: str, options: ServiceOptions, kept: Kept | None = None
    ) -> Outcome:
        """kept: the file's kept transcript and passes, read by the driver beside the outputs
        (`app.unlabelled_cache.kept_unlabelled`): only its speakers are found again."""
        with self._lock:
            self._progress = None
        try:
            return execute(self.service, audio, label, options, self._record, kept)
        finally:
            with self._lock:
                self._progress = None

    def progress(self) -> Progress | None:
        """The current file's latest stage; None between files."""
        with self._lock:
            return self._progress

    def _record(self, stage: str, completed: int, total: int) -> None:
        with self._lock:
            self._progress = Progress(stage, completed, total)
