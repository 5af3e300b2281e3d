"""A faster-whisper model folder (CTranslate2: model.bin, config.json, tokenizer.json) given as
`--model` or `--assistant`: converted once into the model cache, then loaded like any other
checkpoint.

faster-whisper users hold their models in this shape (Systran/faster-whisper-*, or their own
`ct2-transformers-converter` output). `asr.convert_whisper` already turns the embedded
whisper-base from it; here the result is kept under `<cache>/converted/`, named by the folder
and keyed by its path and its files' sizes and modification times, so replaced weights are
converted again; a conversion damaged since it was made (its own files' stamps) is made again.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

from asr.file_stamps import read_stamp, stamp_of, write_stamp
from asr.int8_store import fingerprint
from asr.types import ProgressHook, no_progress

# The files a CTranslate2 Whisper folder must hold for a conversion.
_REQUIRED = ("model.bin", "config.json", "tokenizer.json")
SOURCE = "specscribe-source.json"  # in a conversion: the folder it was made from
CHECKED = "specscribe-checked.json"  # in a conversion: its files' stamps as made


def is_ct2_whisper(directory: Path) -> bool:
    """Whether `directory` looks like a CTranslate2 Whisper model: a config.json that names
    no transformers model type but carries CTranslate2's Whisper fields (lang_ids,
    suppress_ids, alignment_heads). Its model.bin may be missing (a download not finished):
    `converted_ct2_whisper` names what is."""
    config_file = directory / "config.json"
    if not config_file.is_file():
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
    folder = directory.resolve()
    source = f"{folder}|{fingerprint(*(directory / name for name in _REQUIRED))}"
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    converted_dir = cache_dir / "converted"
    target = converted_dir / f"{folder.name or 'model'}-{key}"
    if _intact(target):
        return target
    if target.exists():  # damaged since (cut short, edited): made again
        progress(f"{target} changed since it was made: converting again", 0, 1)
        shutil.rmtree(target, ignore_errors=True)
    from asr.convert_whisper import convert_whisper

    converted_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=converted_dir, prefix=f".{target.name}-") as work:
        staged = Path(work) / "model"
        step = f"convert {folder} (CTranslate2) into {converted_dir}"
        progress(step, 0, 1)
        try:
            convert_whisper(directory, staged)
        except (KeyError, OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(
                f"{directory}: not a CTranslate2 Whisper model specscribe can convert "
                f"({type(error).__name__}: {error})"
            ) from None
        (staged / SOURCE).write_text(json.dumps({"folder": str(folder)}))
        write_stamp(staged / CHECKED, _stamps(staged))
        if not target.exists():  # else made meanwhile by another process: keep theirs
            staged.rename(target)
        progress(step, 1, 1)
    _remove_older_conversions(converted_dir, folder, keep=target)
    return target


def _stamps(converted: Path) -> dict[str, list[int] | None]:
    """Each file's [size, mtime_ns] in a conversion, its stamp file aside."""
    return {
        path.name: stamp_of(path)
        for path in sorted(converted.iterdir())
        if path.is_file() and path.name != CHECKED
    }


def _intact(converted: Path) -> bool:
    """Whether a conversion's files are as they were made (a stat each): one cut short or
    edited since is made again rather than failing every load."""
    stamps = read_stamp(converted / CHECKED)
    return stamps is not None and stamps == _stamps(converted)


def _remove_older_conversions(converted_dir: Path, folder: Path, keep: Path) -> None:
    """Drops the conversions made from `folder` (resolved) with other files (its weights
    replaced since), so the cache keeps one conversion per folder. Another folder of the same
    name keeps its own."""
    ours = re.compile(re.escape(folder.name or "model") + r"-[0-9a-f]{16}")
    for older in converted_dir.iterdir():
        if older == keep or not older.is_dir() or not ours.fullmatch(older.name):
            continue
        if read_stamp(older / SOURCE) == {"folder": str(folder)}:
            shutil.rmtree(older, ignore_errors=True)
