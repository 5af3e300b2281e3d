"""The Dockerfile's structure: what it copies exists, what it runs is a real command.

Docker is not available where the tests run, so the image is not built here; these checks
catch the drift that would break a build (a renamed package, a dropped subcommand, a model
name that no longer exists, a pin that moved).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import tomllib

import pytest

from app.cli import _cmd_models, _models_action, build_parser
from asr.models import EMBEDDED
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            instruction, _, arguments = current.strip().partition(" ")
            logical.append((instruction.upper(), " ".join(arguments.split())))
        current = ""
    return logical


def _args() -> dict[str, str]:
    defaults = {}
    for instruction, arguments in _instructions():
        if instruction == "ARG" and "=" in arguments:
            name, value = arguments.split("=", 1)
            defaults[name] = shlex.split(value)[0]
    return defaults


def _runs() -> list[str]:
    return [arguments for instruction, arguments in _instructions() if instruction == "RUN"]


def _ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        or fnmatch.fnmatch(parts[i], pattern.removeprefix("**/"))
        for pattern in patterns
        for i, prefix in enumerate(prefixes)
    )


def test_base_image_is_a_build_argument_defaulting_to_python_311_slim():
    instructions = _instructions()
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")
    assert [a for i, a in instructions if i == "FROM"] == ["${BASE_IMAGE}"]


def test_every_copied_path_exists_and_is_in_the_build_context():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = []
    for instruction, arguments in _instructions():
        if instruction == "COPY":
            *sources, _destination = arguments.split()
            copied += sources
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"
    # `pip install .` needs every package and the readme that pyproject.toml names.
    setuptools = pyproject["tool"]["setuptools"]
    folders = setuptools.get("package-dir", {})  # specscribe is the app/ folder
    # A sub-package (specscribe.api) comes with its parent's folder.
    tops = {name.split(".")[0] for name in setuptools["packages"]}
    needed = [*{folders.get(top, top) for top in tops}, pyproject["project"]["readme"]]
    assert set(needed) <= set(copied), f"not copied: {set(needed) - set(copied)}"
    assert "requirements.lock" in copied


def test_dockerignore_keeps_out_the_environment_caches_and_history():
    for path in (".venv", ".git", "asr/__pycache__", ".pytest_cache", ".ruff_cache"):
        assert _ignored(path), path


def test_install_uses_the_lock_and_the_cpu_torch_index_by_default():
    (install,) = [run for run in _runs() if "pip install" in run]
    assert '--extra-index-url "${TORCH_INDEX_URL}" -c requirements.lock .' in install
    assert _args()["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    # The same torchaudio workaround as scripts/setup.sh.
    assert 'rm -f "$site"/torchaudio/lib/*.so' in install
    assert 'rm -f "$site"/torchaudio/lib/*.so' in (REPO / "scripts" / "setup.sh").read_text()
    assert any(re.search(r"apt-get install .*\bffmpeg\b", run) for run in _runs())


def test_models_pulled_at_build_time_are_embedded_models():
    (pull,) = [run for run in _runs() if "models pull" in run]
    assert pull == "specscribe models pull ${MODELS}"
    names = _args()["MODELS"].split()
    assert {"whisper-base", "pyannote-segmentation-3.0", "campplus-sv-zh-en"} <= set(names)
    assert set(names) <= set(EMBEDDED), f"unknown: {set(names) - set(EMBEDDED)}"
    args = build_parser().parse_args(["models", "pull", *names])
    assert args.run is _cmd_models and _models_action(args.names) == ("pull", names)


def test_default_command_serves_the_ui_on_the_exposed_port():
    instructions = dict(_instructions())
    command = json.loads(instructions["CMD"])
    assert command == ["specscribe", "serve", "--host", "0.0.0.0"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert command[0] in pyproject["project"]["scripts"]
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert instructions["EXPOSE"] == str(args.port) == "7860"
    assert "7860" in instructions["HEALTHCHECK"]


@pytest.mark.parametrize("name", ["torch", "gradio"])
def test_pins_the_image_installs_are_the_locked_ones(name):
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith(f"{name}==")]
    assert len(pins) == 1
    assert pins[0] in (REPO / "requirements.lock").read_text().splitlines()


def test_the_wheel_ships_what_users_import_and_no_benchmarks(tmp_path):
    # What `pip install .` (the Dockerfile's install) puts in site-packages: the four packages
    # and the shipped draft, not bench/, scripts/ or tests/.
    import subprocess
    import sys
    import zipfile

    # Built from what the Dockerfile copies, in a folder of its own (setuptools' build/ folder
    # in a checkout can hold packages of earlier builds).
    source = tmp_path / "source"
    source.mkdir()
    for instruction, arguments in _instructions():
        if instruction == "COPY":
            for name in arguments.split()[:-1]:
                copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
                copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("specscribe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    # The fronts install as `specscribe`: no generic `app` package in site-packages.
    assert tops == {"specscribe", "asr", "decoding", "diarize"}
    assert "asr/drafts/whisper-base-draft/model.safetensors" in names
    assert "specscribe/api/__init__.py" in names
    # Installed (here into a folder ahead of the environment's packages) and run from outside
    # the checkout, the command works and nothing named `app` can be imported.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    probe = (
        "import importlib.util, specscribe.cli;"
        "assert importlib.util.find_spec('app') is None;"
        "print(specscribe.cli.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(site / "specscribe" / "cli.py")
    usage = subprocess.run(
        [sys.executable, "-m", "specscribe.cli", "transcribe", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert usage.returncode == 0 and "--num-speakers" in usage.stdout, usage.stderr
