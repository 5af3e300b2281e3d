"""Transcript writers, as a registry: txt, srt, vtt, tsv, json, rttm.

Each writer turns a Transcript into text; `write_outputs` names files after their input
(`STEM.srt`, ...) and writes each one atomically, so a crash never leaves half a file.

Beside the outputs, a hidden record (`.STEM.specscribe.json`) keeps the options that made them,
so that a rerun skips a file only when its outputs exist *and* were made the way it asks.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from asr.types import Segment, Transcript

Writer = Callable[[Transcript, str], str]  # (transcript, input stem) -> file content
WRITERS: dict[str, Writer] = {}


def writer(extension: str) -> Callable[[Writer], Writer]:
    def register(function: Writer) -> Writer:
        WRITERS[extension] = function
        return function

    return register


def _timestamp(seconds: float, decimal_marker: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds_part, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds_part:02d}{decimal_marker}{milliseconds:03d}"


def _one_line(text: str) -> str:
    """Subtitle blocks end at a blank line, so a cue's text must not contain line breaks."""
    return " ".join(text.split())


def _labelled(segment: Segment) -> str:
    text = _one_line(segment.text)
    return f"[{segment.speaker}] {text}" if segment.speaker else text


@writer("txt")
def write_txt(transcript: Transcript, stem: str) -> str:
    return "".join(f"{_labelled(segment)}\n" for segment in transcript.segments)


@writer("srt")
def write_srt(transcript: Transcript, stem: str) -> str:
    blocks = [
        f"{index}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{_labelled(s)}\n"
        for index, s in enumerate(transcript.segments, start=1)
    ]
    return "\n".join(blocks)


@writer("vtt")
def write_vtt(transcript: Transcript, stem: str) -> str:
    def cue(segment: Segment) -> str:
        text = _one_line(segment.text)
        voice = f"<v {segment.speaker}>{text}" if segment.speaker else text
        return f"{_timestamp(segment.start, '.')} --> {_timestamp(segment.end, '.')}\n{voice}\n"

    return "WEBVTT\n\n" + "\n".join(cue(segment) for segment in transcript.segments)


@writer("tsv")
def write_tsv(transcript: Transcript, stem: str) -> str:
    """Seconds with millisecond precision; tabs and newlines in text become spaces."""
    lines = ["start\tend\tspeaker\ttext"]
    for s in transcript.segments:
        lines.append(f"{s.start:.3f}\t{s.end:.3f}\t{s.speaker or ''}\t{_one_line(s.text)}")
    return "\n".join(lines) + "\n"


@writer("json")
def write_json(transcript: Transcript, stem: str) -> str:
    return json.dumps(transcript.to_dict(), ensure_ascii=False, indent=2) + "\n"


@writer("rttm")
def write_rttm(transcript: Transcript, stem: str) -> str:
    """NIST RTTM of the diarizer's speaker turns, overlapping speech included, with the file's
    stem as its URI, as pyannote's pipelines write them: what pyannote.metrics, dscore and
    md-eval score. The speaker-labelled transcript is in txt, srt, vtt, tsv and json."""
    file_id = stem.replace(" ", "_")
    return "".join(
        f"SPEAKER {file_id} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n"
        for t in transcript.turns
    )


def output_paths(output_dir: Path, relative_stem: Path, formats: list[str]) -> dict[str, Path]:
    return {
        fmt: output_dir / relative_stem.with_name(f"{relative_stem.name}.{fmt}") for fmt in formats
    }


def write_atomically(path: Path, content: str) -> None:
    """Writes to a temporary file in the same folder, then renames it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())  # the rename must never publish a file still in cache
        # mkstemp creates the file 0600; outputs get the permissions a plain open() would give.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_outputs(
    transcript: Transcript, paths: dict[str, Path], record: dict | None = None
) -> None:
    """Each output, then (with `record`: the options that made them, JSON values) the record,
    last, so a record never vouches for outputs that were not written."""
    for fmt, path in paths.items():
        write_atomically(path, WRITERS[fmt](transcript, path.stem))
    if record is not None and paths:
        write_atomically(record_path(paths), json.dumps(record, sort_keys=True, indent=1) + "\n")


def record_path(paths: dict[str, Path]) -> Path:
    """The hidden record beside a file's outputs: .STEM.specscribe.json."""
    first = next(iter(paths.values()))
    return first.with_name(f".{first.stem}.specscribe.json")


def outputs_state(paths: dict[str, Path], record: dict | None = None) -> tuple[str, str]:
    """Whether a file's outputs are done: ("missing", ""), ("done", "") or ("changed", what).

    "changed": every output exists, but the record says other options made them (`what` names
    them: "diarize false -> true"). Outputs without a record (written by hand, or by a version
    that kept none) count as done: nothing says otherwise."""
    if not paths or not all(path.exists() for path in paths.values()):
        return "missing", ""
    if record is None:
        return "done", ""
    try:
        stored = json.loads(record_path(paths).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "done", ""
    except (OSError, ValueError):
        return "changed", "its record is unreadable"
    wanted = json.loads(json.dumps(record))  # tuples -> lists, as the stored record has them
    if stored == wanted:
        return "done", ""
    differences = [
        f"{key} {json.dumps(stored.get(key))} -> {json.dumps(wanted.get(key))}"
        for key in sorted(set(stored) | set(wanted))
        if stored.get(key) != wanted.get(key)
    ]
    return "changed", ", ".join(differences)
