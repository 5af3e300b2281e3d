"""A faster-whisper model folder (CTranslate2: model.bin, config.json, tokenizer.json) given as
`--model` or `--assistant`: converted once into the model cache, then loaded like any other
checkpoint.

faster-whisper users hold their models in this shape (Systran/faster-whisper-*, or their own
`ct2-transformers-converter` output). `asr.convert_whisper` already turns the embedded
whisper-base from it; here the result is kept under `<cache>/converted/`, named by the folder
and keyed by its files' sizes and modification times, so replaced weights are converted again.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

from asr.int8_store import fingerprint
from asr.types import ProgressHook, no_progress

# The files a CTranslate2 Whisper folder must hold for a conversion.
_REQUIRED = ("model.bin", "config.json", "tokenizer.json")


def is_ct2_whisper(directory: Path) -> bool:
    """Whether `directory` looks like a CTranslate2 Whisper model: a model.bin beside a
    config.json that names no transformers model type but carries CTranslate2's Whisper
    fields (lang_ids, suppress_ids, alignment_heads)."""
    config_file = directory / "config.json"
    if not (directory / "model.bin").is_file() or not config_file.is_file():
        return False
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return (
        isinstance(config, dict)
        and "model_type" not in config
        and any(key in config for key in ("lang_ids", "suppress_ids", "alignment_heads"))
    )


def converted_ct2_whisper(
    directory: Path, cache_dir: Path, progress: ProgressHook = no_progress
) -> Path:
    """The transformers checkpoint converted from the CTranslate2 folder `directory`, made
    now (told to `progress`) unless the cache holds it for these very files. Raises
    ValueError, naming the file, for a folder that cannot be converted."""
    missing = [name for name in _REQUIRED if not (directory / name).is_file()]
    if missing:
        raise ValueError(
            f"{directory} is a CTranslate2 (faster-whisper) folder without {', '.join(missing)}"
        )
    source = f"{directory.resolve()}|{fingerprint(*(directory / name for name in _REQUIRED))}"
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    converted_dir = cache_dir / "converted"
    target = converted_dir / f"{directory.name}-{key}"
    if (target / "config.json").is_file():
        return target
    from asr.convert_whisper import convert_whisper

    converted_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=converted_dir, prefix=f".{target.name}-") as work:
        staged = Path(work) / "model"
        step = f"convert {directory.name} (CTranslate2) into {converted_dir}"
        progress(step, 0, 1)
        try:
            convert_whisper(directory, staged)
        except (KeyError, OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(
                f"{directory}: not a CTranslate2 Whisper model specscribe can convert "
                f"({type(error).__name__}: {error})"
            ) from None
        if not target.exists():  # else made meanwhile by another process: keep theirs
            staged.rename(target)
        progress(step, 1, 1)
    _remove_older_conversions(converted_dir, directory.name, keep=target)
    return target


def _remove_older_conversions(converted_dir: Path, name: str, keep: Path) -> None:
    """Drops the conversions of a folder of this name made from other files (its weights
    replaced since), so the cache keeps one conversion per folder name."""
    ours = re.compile(re.escape(name) + r"-[0-9a-f]{16}")  # not another name's ("base-v2-...")
    for older in converted_dir.iterdir():
        if older != keep and older.is_dir() and ours.fullmatch(older.name):
            shutil.rmtree(older, ignore_errors=True)
