"""A file's transcript before speakers, and with diarization the diarizer's passes over the
file, kept beside its outputs, so that asking for other outputs of the same transcript writes
them without running Whisper (or the diarizer's networks) again. With diarization the
transcript labelled with the speaker counts it was made with is kept too: asking for another
layout or format with the same counts writes it without loading the diarizer (importing
pyannote.audio alone takes seconds).

What a kept transcript serves: any request whose option record
(`TranscriptionService.output_record`, with the CLI's subtitle layout) equals the one it was
made with but for what only shapes the outputs, from the same recording:
- the speaker counts (`SPEAKER_COUNTS`): the transcript does not depend on them
  (`TranscriptionService.relabel`): the VAD reads the diarizer's segmentation pass, and only
  clustering comes after the passes;
- the subtitle layout (`asr.writers.LAYOUT_FIELDS`) and the formats, which the writers apply
  to the transcript: a run with another --max-line-width, or one adding --format vtt, only
  writes.
It lives in the hidden .STEM.specscribe-unlabelled.json beside the record, with that record,
and the passes in the .npz of the same name (`diarize.passes`), which the json names by
digest; a file that cannot be read, that was made otherwise, or that is not as it was written
(its own digest) is not used (the file is transcribed again, and both are replaced).
"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path

from asr.source import digest_of
from asr.types import Transcript
from asr.writers import LAYOUT_FIELDS, RECORD_SOURCE, record_path, write_atomically
from diarize.passes import SpeakerPasses

from .request import SPEAKER_COUNTS

_RECORD, _TRANSCRIPT, _PASSES, _DIGEST = "record", "transcript", "passes", "digest"
_LABELLED, _COUNTS = "labelled", "speaker_counts"


@dataclass(frozen=True)
class Kept:
    """A file's kept transcript before speakers (without diarization: its transcript), and the
    diarizer's passes over the file where they were kept too (None: the diarizer runs in
    full)."""

    unlabelled: Transcript
    passes: SpeakerPasses | None
    # With diarization, the transcript labelled with the counts of the request that found
    # it (None: other counts, or none kept): what a new run would give, as clustering the
    # same passes with the same counts finds the same speakers.
    labelled: Transcript | None = None

    def as_it_was(self, diarize: bool) -> Transcript | None:
        """The transcript a request writes as it is kept (with diarization: labelled with the
        request's counts), or None: its speakers are to be found again."""
        return self.labelled if diarize else self.unlabelled


def unlabelled_path(outputs: dict[str, Path]) -> Path:
    """Where a file's kept transcript lives: beside its record (`asr.writers.record_path`)."""
    record = record_path(outputs)
    return record.with_name(record.name.removesuffix(".json") + "-unlabelled.json")


def journal_path(outputs: dict[str, Path]) -> Path:
    """Where a long file's decoded windows are kept while it is transcribed
    (`asr.window_journal`, `TranscriptionService.run_keeping_unlabelled`): beside its record,
    hidden, and removed once its outputs are written. A run stopped part-way leaves it, and
    the next run on the file goes on from it."""
    record = record_path(outputs)
    return record.with_name(record.name.removesuffix(".json") + "-windows.jsonl")


def passes_path(outputs: dict[str, Path]) -> Path:
    """Where the diarizer's passes over a file live, beside its kept transcript."""
    return unlabelled_path(outputs).with_suffix(".npz")


def _transcription_record(record: dict) -> dict:
    """What makes the transcript: the record without the speaker counts, the subtitle layout
    and the recording, as JSON stores it."""
    apart = (*SPEAKER_COUNTS, *LAYOUT_FIELDS, RECORD_SOURCE)
    kept = {k: v for k, v in record.items() if k not in apart}
    return json.loads(json.dumps(kept))


def reused(transcript: Transcript) -> Transcript:
    """A kept transcript as a request's result: its stats say it was not decoded again."""
    return dataclasses.replace(transcript, stats={**transcript.stats, "transcript_reused": True})


def _speaker_counts(record: dict) -> dict:
    return {name: record.get(name) for name in SPEAKER_COUNTS}


def keep_unlabelled(
    outputs: dict[str, Path],
    record: dict,
    unlabelled: Transcript,
    passes: SpeakerPasses | None = None,
    labelled: Transcript | None = None,
) -> None:
    """Keeps `unlabelled` (a `Labelled.unlabelled`, or without diarization the transcript
    itself), the diarizer's `passes` and the `labelled` transcript (with diarization: the
    request's, labelled with its speaker counts) as made with `record` (and from the
    recording it names, `asr.writers.RECORD_SOURCE`), each file atomically; the transcript's
    names the passes' digest, so that passes left from another run are never read with it."""
    digest = None
    if passes is not None:
        stream = io.BytesIO()
        passes.save(stream)
        write_atomically(passes_path(outputs), stream.getvalue())
        digest = digest_of(stream.getvalue())
    source = record.get(RECORD_SOURCE)
    content = {
        _RECORD: _transcription_record(record),
        RECORD_SOURCE: source.stored() if source is not None else None,
        _PASSES: digest,
        _TRANSCRIPT: unlabelled.to_dict(),
    }
    if labelled is not None:
        content[_LABELLED] = {_COUNTS: _speaker_counts(record), _TRANSCRIPT: labelled.to_dict()}
    content = json.loads(json.dumps(content))  # as it reads back (string keys, lists)
    content[_DIGEST] = _digest(content)
    write_atomically(unlabelled_path(outputs), _utf8_json(content) + b"\n")


def _digest(content: dict) -> str:
    """The digest of a kept file's content (but its own), as it was written."""
    kept = {k: v for k, v in content.items() if k != _DIGEST}
    return digest_of(_utf8_json(kept, sort_keys=True))


def _utf8_json(value: object, sort_keys: bool = False) -> bytes:
    """`value` as JSON in UTF-8. A recording's name that is not UTF-8 (caf\xe9.wav from an
    old device) reaches Python with lone surrogates, which UTF-8 cannot hold: each is written
    as JSON's escape (\\udce9), which reads back as the same string."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)
    return text.encode("utf-8", "backslashreplace")


def kept_unlabelled(outputs: dict[str, Path], record: dict) -> Kept | None:
    """The kept transcript, where one was made with `record` but for what only shapes the
    outputs (module docstring), from the recording `record` names (if it names one: its very
    bytes, `Source.holds`, as the outputs' record will vouch for them), with the passes kept
    beside it and the labelled transcript where `record`'s speaker counts are the ones it was
    labelled with; None where there is none, it was made otherwise, or it is not as written
    (a file that cannot be read, or was changed since: its digest)."""
    if not outputs:
        return None
    try:
        content = json.loads(unlabelled_path(outputs).read_text(encoding="utf-8"))
        if not isinstance(content, dict) or content.get(_DIGEST) != _digest(content):
            return None
        if content[_RECORD] != _transcription_record(record):
            return None
        source = record.get(RECORD_SOURCE)
        if source is not None and not source.holds(content[RECORD_SOURCE]):
            return None
        unlabelled = Transcript.from_dict(content[_TRANSCRIPT])
        labelled = content.get(_LABELLED)
        same_counts = labelled is not None and labelled[_COUNTS] == _speaker_counts(record)
        labelled = Transcript.from_dict(labelled[_TRANSCRIPT]) if same_counts else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Kept(unlabelled, _kept_passes(passes_path(outputs), content.get(_PASSES)), labelled)


def _kept_passes(path: Path, digest: object) -> SpeakerPasses | None:
    """The passes at `path`, if their bytes have `digest`; None otherwise."""
    if not isinstance(digest, str):
        return None
    try:
        data = path.read_bytes()
        if digest_of(data) != digest:
            return None
        return SpeakerPasses.load(io.BytesIO(data))
    except (OSError, ValueError, KeyError):
        return None
