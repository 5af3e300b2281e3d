"""A recording's decoded windows, kept on disk as they are decoded, so that a run stopped
part-way (killed, Ctrl-C, a power cut, a worker lost) goes on where it stopped.

The journal memoizes the model's work, not the transcription's state: each entry is one
window's `WindowResult` under what decided it (the window's frames, its prompt, language,
temperature and seed), and a rerun decodes the recording with the same code, reading a
window's result back instead of running the decoder where an entry has it. Everything built on
the results (segments, guards, fallback, warnings) is recomputed as it was, so the transcript
is the one an uninterrupted run gives. A journal made for other audio, model, precision,
options or code is not read: its first line names what it was made for (`identity`).

One JSON object per line, appended and flushed as each window is decoded; a line cut short by
a crash is ignored. Nothing here decides where journals live or when they are removed: the
caller that writes the transcript's outputs does (`app.file_run`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from asr.whisper_target import LanguageOdds
from asr.window_decoder import WindowResult

# Part of every journal's identity: change it whenever a window's result may decode otherwise.
FORMAT = "window-journal-1"

WindowKey = tuple  # (start frame, end frame, prompt tokens, language, temperature, seed)


def audio_digest(samples: np.ndarray) -> str:
    """The digest of a recording's samples, for `identity`."""
    return hashlib.blake2b(np.ascontiguousarray(samples).tobytes(), digest_size=20).hexdigest()


def window_key(
    window: tuple[int, int], prompt: tuple[int, ...], language: str | None, temperature: float,
    seed: int,
) -> WindowKey:  # fmt: skip
    """What decides a window's result, given the journal's identity."""
    return (window[0], window[1], tuple(prompt), language, float(temperature), seed)


class WindowJournal:
    """A file of decoded windows for one recording decoded one way (`identity`)."""

    def __init__(self, path: Path, identity: dict) -> None:
        """Reads the journal at `path` when it was made for `identity`; otherwise the journal
        starts empty and the file is replaced on the first window recorded."""
        self.path = Path(path)
        self.identity = {"format": FORMAT, **identity}
        self._header = json.dumps(self.identity, sort_keys=True)
        self._results: dict[WindowKey, WindowResult] = {}
        self._stream = None
        self.kept = 0  # windows found in the file when it was opened
        self.read_back = 0  # windows whose result came from the file
        unreadable = contextlib.suppress(OSError, UnicodeDecodeError)
        # O_NOFOLLOW: a link put where the journal goes is not the journal
        with unreadable, _opened(self.path, os.O_RDONLY) as lines:
            if lines.readline().rstrip("\n") != self._header:
                return
            for line in lines:
                entry = _parsed(line, self._header)
                if entry is not None:
                    self._results[entry[0]] = entry[1]
            self.kept = len(self._results)

    def result(self, key: WindowKey) -> WindowResult | None:
        """The result recorded under `key`, or None."""
        found = self._results.get(key)
        if found is not None:
            self.read_back += 1
        return found

    def record(self, key: WindowKey, result: WindowResult) -> None:
        """Appends one window's result (best effort: a journal that cannot be written only
        costs a stopped run its decoded windows)."""
        self._results[key] = result
        try:
            if self._stream is None:
                self._stream = self._opened()
            self._stream.write(json.dumps(_entry(key, result, self._header)) + "\n")
            self._stream.flush()
        except OSError:
            self._stream = None

    def _opened(self):
        """The file to append to: this one where it holds the same identity (no line of it
        cut short: `_parsed` skipped any), else a new one with the header. Whatever stood at
        the path (a journal of other options, a link) is replaced, never written through."""
        if self.kept:
            stream = _opened(self.path, os.O_WRONLY | os.O_APPEND)
            stream.write("\n")  # ends a line a crash may have cut short
            return stream
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        stream = _opened(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        stream.write(self._header + "\n")
        return stream

    def close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None


def _opened(path: Path, flags: int):
    """`path` opened as text with os.open's `flags`, never through a symbolic link."""
    handle = os.open(path, flags | os.O_NOFOLLOW, 0o644)
    mode = "r" if flags & (os.O_WRONLY | os.O_RDWR) == 0 else "a"
    return os.fdopen(handle, mode, encoding="utf-8")


def _check(key: list, result: dict, header: str) -> str:
    """A line's check: a line changed since it was written (a flipped bit, an edit) or
    written under another header is not read back."""
    content = json.dumps([header, key, result], sort_keys=True).encode()
    return hashlib.blake2b(content, digest_size=12).hexdigest()


def _entry(key: WindowKey, result: WindowResult, header: str) -> dict:
    stored = [*key[:2], list(key[2]), *key[3:]]
    fields = asdict(result)
    return {"key": stored, "result": fields, "check": _check(stored, fields, header)}


def _parsed(line: str, header: str) -> tuple[WindowKey, WindowResult] | None:
    """A line's (key, result), or None for a blank line, one cut short, or one whose check
    fails."""
    try:
        entry = json.loads(line)
        if entry["check"] != _check(entry["key"], entry["result"], header):
            return None
        start, end, prompt, language, temperature, seed = entry["key"]
        fields = dict(entry["result"])
        fields["tokens"] = tuple(fields["tokens"])
        if fields.get("language_odds") is not None:
            fields["language_odds"] = LanguageOdds(**fields["language_odds"])
        result = WindowResult(**fields)
    except (ValueError, KeyError, TypeError):
        return None
    return window_key((start, end), tuple(prompt), language, temperature, seed), result


def code_digest() -> str:
    """A digest of the decoding code (`asr` and `decoding`, as this install has them), for
    `identity`: a journal made by other code is not read, whatever its format says."""
    import asr
    import decoding

    digest = hashlib.blake2b(digest_size=16)
    for package in (asr, decoding):
        root = Path(package.__file__).parent
        for source in sorted(root.rglob("*.py")):
            digest.update(source.relative_to(root).as_posix().encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()
