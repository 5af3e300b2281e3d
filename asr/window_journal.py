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
        with unreadable, open(self.path, encoding="utf-8") as lines:
            if lines.readline().rstrip("\n") != self._header:
                return
            for line in lines:
                entry = _parsed(line)
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
            self._stream.write(json.dumps(_entry(key, result)) + "\n")
            self._stream.flush()
        except OSError:
            self._stream = None

    def _opened(self):
        """The file to append to: this one where it holds the same identity (no line of it
        cut short: `_parsed` skipped any), else a new one with the header."""
        if self.kept:
            stream = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held open)
            stream.write("\n")  # ends a line a crash may have cut short
            return stream
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (held open)
        stream.write(self._header + "\n")
        return stream

    def close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None

    def discard(self) -> None:
        """Closes and removes the file: its transcript is written."""
        self.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _entry(key: WindowKey, result: WindowResult) -> dict:
    fields = asdict(result)
    return {"key": [*key[:2], list(key[2]), *key[3:]], "result": fields}


def _parsed(line: str) -> tuple[WindowKey, WindowResult] | None:
    """A line's (key, result), or None for a blank line or one cut short."""
    try:
        entry = json.loads(line)
        start, end, prompt, language, temperature, seed = entry["key"]
        fields = dict(entry["result"])
        fields["tokens"] = tuple(fields["tokens"])
        if fields.get("language_odds") is not None:
            fields["language_odds"] = LanguageOdds(**fields["language_odds"])
        result = WindowResult(**fields)
    except (ValueError, KeyError, TypeError):
        return None
    return window_key((start, end), tuple(prompt), language, temperature, seed), result
