"""Out of memory is said as such, in the CLI and per file (app.out_of_memory)."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

from app.out_of_memory import out_of_memory, said
from tests.conftest import REPO, SAMPLES


def test_each_librarys_words_for_a_refused_allocation_are_out_of_memory():
    torch_words = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 5856000 bytes. Error code 12 (Cannot allocate memory)"
    )
    refused = [
        MemoryError(),
        torch_words,
        RuntimeError(
            "unable to mmap 145215824 bytes from file <model.safetensors>: Cannot "
            "allocate memory (12)"
        ),
        ImportError("libtorch_cpu.so: failed to map segment from shared object"),
        RuntimeError("could not create a primitive"),
        OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)),
    ]
    assert all(out_of_memory(error) for error in refused)
    others = [RuntimeError("shape mismatch"), ValueError("out of memory"), OSError(2, "gone")]
    assert not any(out_of_memory(error) for error in others)
    assert said(torch_words) == "out of memory (torch could not allocate 5.9 MB)"
    assert said(MemoryError()) == "out of memory"
    long = said(RuntimeError("could not create a primitive " + "descriptor " * 40))
    assert len(long) < 200 and long.endswith("descriptor ...)")


def test_a_run_under_a_memory_limit_says_out_of_memory_instead_of_a_traceback(tmp_path):
    def limited():  # address space far below what torch and the model map
        resource.setrlimit(resource.RLIMIT_AS, (600 << 20, 600 << 20))

    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(SAMPLES / "jfk.wav")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*command, "--language", "en"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.startswith("specscribe: error: out of memory"), run.stderr
    assert "give the process more memory" in run.stderr


def test_a_request_the_server_has_no_memory_for_is_a_503_not_a_500():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.api.errors import install_handlers

    app = FastAPI()
    install_handlers(app)

    @app.get("/memory")
    def memory():
        raise MemoryError

    @app.get("/bug")
    def bug():
        raise RuntimeError("a bug")

    client = TestClient(app, raise_server_exceptions=False)
    answer = client.get("/memory")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "out_of_memory"
    assert answer.json()["error"]["message"].startswith("out of memory: the server has too little")
    assert client.get("/bug").status_code == 500
