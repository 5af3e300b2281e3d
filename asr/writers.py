"""Transcript writers, as a registry: txt, srt, vtt, tsv, json, rttm.

Each writer turns a Transcript into text; `write_outputs` names files after their input
(`STEM.srt`, ...) and writes each one atomically, so a crash never leaves half a file.

Beside the outputs, a hidden record (`.STEM.specscribe.json`) keeps the options that made them,
so that a rerun skips a file only when its outputs exist *and* were made the way it asks.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from asr.source import Source, digest_of
from asr.types import Segment, Transcript, Word

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


@dataclass(frozen=True)
class SubtitleLayout:
    """How srt and vtt cues are shaped (OpenAI's --max_line_width / --max_line_count).

    None and None: one cue per segment, on one line. Otherwise a segment's words are laid into
    lines of at most `max_line_width` characters (a longer word gets a line of its own), and a
    cue holds at most `max_line_count` lines, or starts anew after a pause of MAX_CUE_GAP s;
    a cue runs from its first word's start to its last word's end (at least MIN_CUE_SECONDS
    where there is room). With both limits, as openai-whisper shapes them, a cue's words flow
    on from one segment into the next of the same speaker; with one, a cue never spans two
    segments. A line never breaks inside a hyphenated word. A segment without word times is
    wrapped the same way and its time shared among its cues by characters."""

    max_line_width: int | None = None
    max_line_count: int | None = None

    MAX_CUE_GAP = 3.0

    def validate(self) -> SubtitleLayout:
        if self.max_line_width is not None and not 10 <= self.max_line_width <= 1000:
            raise ValueError(f"max_line_width must be in 10..1000, not {self.max_line_width}")
        if self.max_line_count is not None and not 1 <= self.max_line_count <= 100:
            raise ValueError(f"max_line_count must be in 1..100, not {self.max_line_count}")
        return self

    @property
    def shaped(self) -> bool:
        return self.max_line_width is not None or self.max_line_count is not None

    def warning(self) -> str | None:
        """What a user should hear of this layout: a line count without a width leaves every
        cue one line of its segment's text (OpenAI's whisper warns of it too)."""
        if self.max_line_count is not None and self.max_line_width is None:
            return (
                "--max-line-count shapes nothing without --max-line-width: each cue stays one "
                "line of its whole text (a width of 42 characters is common)"
            )
        return None

    def check_formats(self, formats: list[str] | tuple[str, ...]) -> None:
        """A shaped layout needs a format it shapes: ValueError otherwise."""
        if self.shaped and not {"srt", "vtt"} & set(formats):
            raise ValueError(
                "--max-line-width and --max-line-count shape srt and vtt cues: "
                "ask for --format srt or vtt"
            )

    def recorded(self) -> dict[str, int | None]:
        """What an option record holds of the layout: its fields where it shapes cues (an
        unshaped layout records nothing, as records made before layouts were kept)."""
        if not self.shaped:
            return {}
        return {name: getattr(self, name) for name in LAYOUT_FIELDS}


# The option record's keys for the subtitle layout: they shape how a transcript is written,
# not the transcript, so a kept transcript serves any layout (app.unlabelled_cache).
LAYOUT_FIELDS = tuple(field.name for field in fields(SubtitleLayout))


@dataclass(frozen=True)
class _Cue:
    start: float
    end: float
    lines: tuple[str, ...]
    speaker: str | None


def _cues(
    transcript: Transcript, layout: SubtitleLayout, label: Callable[[str], str] | None = None
) -> list[_Cue]:
    """The transcript's cues, shaped by `layout`. label: the text a format puts before a
    speaker's cue's first line, shown on screen (srt's "[SPEAKER_00] "), which the line's
    width then includes."""
    if not layout.shaped:
        cues = [_Cue(s.start, s.end, (_one_line(s.text),), s.speaker) for s in transcript.segments]
        return _lasting(cues, transcript.duration)
    cues: list[_Cue] = []
    for run in _cue_runs(transcript.segments, layout):
        speaker = run[0].speaker
        shown = len(label(speaker)) if label and speaker else 0
        words = [w for segment in run for w in segment.words if w.text.strip()]
        if words:
            cues += _word_cues(words, layout, speaker, shown)
        elif run[0].text.strip():
            cues += _text_cues(run[0], layout, shown)
    return _lasting(cues, transcript.duration)


def _cue_runs(segments: Sequence[Segment], layout: SubtitleLayout) -> list[list[Segment]]:
    """The segments whose words share cues. With both a width and a line count, as
    openai-whisper lays them out, words flow from one segment into the next, so that a cue
    fills its lines rather than ending with each segment; but never from one speaker to
    another, nor into or out of a segment without word times. Otherwise a run is one
    segment."""
    runs: list[list[Segment]] = []
    flowing = layout.max_line_width is not None and layout.max_line_count is not None
    for segment in segments:
        previous = runs[-1][-1] if runs else None
        if (
            flowing
            and previous is not None
            and previous.words
            and segment.words
            and previous.speaker == segment.speaker
        ):
            runs[-1].append(segment)
        else:
            runs.append([segment])
    return runs


def _lasting(cues: list[_Cue], duration: float) -> list[_Cue]:
    """The cues, each one that would end as it starts (a cue of one word that word timing
    left without length: players drop or flash it) lasting up to MIN_CUE_SECONDS, as far as
    the next cue and the recording leave room. Where they leave none (the next cue starts at
    the same instant, or the recording ends there), it takes up to half of the next cue's
    time, or else the time since the cue before, or else up to half of that cue's time."""
    lasting = list(cues)
    for index, cue in enumerate(lasting):
        if cue.end > cue.start:
            continue
        after = lasting[index + 1] if index + 1 < len(lasting) else None
        room = duration if after is None else min(after.start, duration)
        end = max(min(cue.start + MIN_CUE_SECONDS, room), cue.end)
        if end <= cue.start and after is not None and after.end > after.start:
            end = round(cue.start + min(MIN_CUE_SECONDS, (after.end - after.start) / 2), 3)
            lasting[index + 1] = replace(after, start=end)
        start = cue.start
        before = lasting[index - 1] if index else None
        if end <= start and (before is None or before.end < start):
            start = max(start - MIN_CUE_SECONDS, 0.0 if before is None else before.end)
        elif end <= start and before.end > before.start:
            start = round(start - min(MIN_CUE_SECONDS, (before.end - before.start) / 2), 3)
            lasting[index - 1] = replace(before, end=start)
        lasting[index] = replace(cue, start=round(start, 3), end=round(end, 3))
    return lasting


MIN_CUE_SECONDS = 0.5


def _word_cues(
    words: list[Word], layout: SubtitleLayout, speaker: str | None, label_width: int = 0
) -> list[_Cue]:
    """Cues of whole words; a cue's first line leaves `label_width` characters for its label.
    A cue that the line count would leave with one word is given the word before it too
    (`_without_lone_words`)."""
    width = layout.max_line_width or 10**9
    count = layout.max_line_count or 10**9
    cues: list[list[list[list[Word]]]] = []  # cue -> lines -> whole words -> their pieces
    previous_end = None
    for whole in _whole_words(words):
        paused = previous_end is not None and whole[0].start - previous_end > layout.MAX_CUE_GAP
        lines = cues[-1] if cues and not paused else None
        length = len(_line_text(lines[-1])) if lines else 0
        room = width - label_width if lines is not None and len(lines) == 1 else width
        if lines is None or length + sum(len(w.text) for w in whole) > room:
            if lines is None or len(lines) == count:
                cues.append([])
            cues[-1].append([])
        cues[-1][-1].append(whole)
        previous_end = whole[-1].end
    _without_lone_words(cues, width - label_width, layout.MAX_CUE_GAP)
    return [
        _Cue(lines[0][0][0].start, lines[-1][-1][-1].end, tuple(map(_line_text, lines)), speaker)
        for lines in cues
    ]


def _line_text(line: list[list[Word]]) -> str:
    return "".join(w.text for whole in line for w in whole).strip()


def _without_lone_words(cues: list[list[list[list[Word]]]], room: int, max_gap: float) -> None:
    """Where the line count leaves a cue with a single word ("though." for 0.2 s, too short to
    read), the word before it moves into that cue, as long as the line it joins stays within
    `room` characters and the cue it leaves keeps two words. A word alone after a pause stays
    alone: it is a cue of its own."""
    for before, cue in itertools.pairwise(cues):
        if len(cue) != 1 or len(cue[0]) != 1 or sum(map(len, before)) < 3:
            continue
        if cue[0][0][0].start - before[-1][-1][-1].end > max_gap:
            continue
        moved = before[-1][-1]
        if len(_line_text([moved, *cue[0]])) <= room:
            before[-1].pop()
            if not before[-1]:
                before.pop()
            cue[0].insert(0, moved)


def _whole_words(words: list[Word]) -> list[list[Word]]:
    """The words, each with the pieces Whisper's word timing split off it ("self"
    "-substantial", "many" "-fledged"), which a line never breaks before."""
    wholes: list[list[Word]] = []
    for word in words:
        if wholes and word.text[:1] in _WORD_PIECE_STARTS:
            wholes[-1].append(word)
        else:
            wholes.append([word])
    return wholes


# How a word that Whisper's word timing split off the one before it begins (no space).
_WORD_PIECE_STARTS = frozenset("-\u2010\u2011'\u2019")


def _text_cues(segment: Segment, layout: SubtitleLayout, label_width: int = 0) -> list[_Cue]:
    """Cues of wrapped text; every line leaves `label_width` characters (any may start a cue).
    A word longer than a line gets a line of its own, never split."""
    width = max((layout.max_line_width or 10**9) - label_width, 1)
    lines = textwrap.wrap(
        _one_line(segment.text), width, break_long_words=False, break_on_hyphens=False
    ) or [""]
    count = layout.max_line_count or len(lines)
    groups = [lines[i : i + count] for i in range(0, len(lines), count)]
    total = sum(len(line) for line in lines) or 1
    cues, clock = [], segment.start
    for group in groups:
        share = sum(len(line) for line in group) / total * (segment.end - segment.start)
        cues.append(_Cue(round(clock, 3), round(clock + share, 3), tuple(group), segment.speaker))
        clock += share
    cues[-1] = replace(cues[-1], end=segment.end)  # the shares' rounding never moves the end
    return cues


@writer("srt")
def write_srt(transcript: Transcript, stem: str, layout: SubtitleLayout = SubtitleLayout()) -> str:
    def label(speaker: str) -> str:
        return f"[{speaker}] "

    def block(index: int, cue: _Cue) -> str:
        lines = list(cue.lines)
        if cue.speaker:
            lines[0] = label(cue.speaker) + lines[0]
        times = f"{_timestamp(cue.start, ',')} --> {_timestamp(cue.end, ',')}"
        return f"{index}\n{times}\n" + "\n".join(lines) + "\n"

    cues = _cues(transcript, layout, label)
    return "\n".join(block(i, cue) for i, cue in enumerate(cues, start=1))


@writer("vtt")
def write_vtt(transcript: Transcript, stem: str, layout: SubtitleLayout = SubtitleLayout()) -> str:
    """WebVTT cues; `&`, `<` and `>` in the text are escaped, as the format requires (a raw
    `<` starts a tag, a raw `&` an entity), and a speaker is a voice span."""

    def block(cue: _Cue) -> str:
        lines = [_vtt_escaped(line) for line in cue.lines]
        if cue.speaker:
            lines[0] = f"<v {cue.speaker}>{lines[0]}"
        times = f"{_timestamp(cue.start, '.')} --> {_timestamp(cue.end, '.')}"
        return f"{times}\n" + "\n".join(lines) + "\n"

    return "WEBVTT\n\n" + "\n".join(block(cue) for cue in _cues(transcript, layout))


def _vtt_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


SUBTITLE_FORMATS = ("srt", "vtt")


@writer("tsv")
def write_tsv(transcript: Transcript, stem: str) -> str:
    """openai-whisper's TSV: `start`, `end` in whole milliseconds and `text`, with a `speaker`
    column before the text where segments have speakers; tabs and newlines in text become
    spaces, and the text loses its leading space, as openai-whisper writes it."""
    speakers = any(s.speaker for s in transcript.segments)
    lines = ["start\tend\tspeaker\ttext" if speakers else "start\tend\ttext"]
    for s in transcript.segments:
        speaker = f"{s.speaker or ''}\t" if speakers else ""
        text = _one_line(s.text).strip()
        lines.append(f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{speaker}{text}")
    return "\n".join(lines) + "\n"


@writer("json")
def write_json(transcript: Transcript, stem: str) -> str:
    return json.dumps(transcript.to_dict(), ensure_ascii=False, indent=2) + "\n"


@writer("rttm")
def write_rttm(transcript: Transcript, stem: str) -> str:
    """NIST RTTM of the diarizer's speaker turns, overlapping speech included, with the file's
    stem as its URI, as pyannote's pipelines write them: what pyannote.metrics, dscore and
    md-eval score. The speaker-labelled transcript is in txt, srt, vtt, tsv and json."""
    file_id = "_".join(stem.split()) or "_"  # one field: tabs and line breaks too
    return "".join(
        f"SPEAKER {file_id} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n"
        for t in transcript.turns
    )


def output_paths(output_dir: Path, relative_stem: Path, formats: list[str]) -> dict[str, Path]:
    return {
        fmt: output_dir / relative_stem.with_name(f"{relative_stem.name}.{fmt}") for fmt in formats
    }


def outputs_over_recordings(
    files: list[tuple[Path, Path]], output_dir: Path, formats: list[str]
) -> dict[Path, str]:
    """The files among `asr.audio.find_audio_files`' (file, stem) whose outputs in `output_dir`
    would be one of those files, each with the reason: `rec.txt` holding audio, transcribed
    into its own folder, was replaced by its transcript under --overwrite. (os.path.realpath,
    not Path.resolve: a symbolic link loop among the files is that file's failure, when it is
    read, not an exception here.)"""
    recordings = {os.path.realpath(path) for path, _ in files}
    reasons = {}
    for path, stem in files:
        outputs = output_paths(output_dir, stem, formats).values()
        if over := [output for output in outputs if os.path.realpath(output) in recordings]:
            reasons[path] = f"{path}: its output {over[0]} is a recording given to transcribe"
    return reasons


# Free space below which a folder is taken as full: outputs are small (an hour's json with
# word times is about 1 MB), so a disk with less is full in practice, and decoding a file whose
# outputs cannot then be written wastes its whole decoding.
MIN_FREE_BYTES = 1 << 20


def file_in_the_way(folder: Path) -> Path | None:
    """What stands where `folder` or one of its parents must be a folder: a file (or a
    device: /dev/null/out), or None."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def no_room_for_outputs(folder: Path) -> str | None:
    """Why outputs cannot go to `folder` (or, where it does not exist yet, the folder it would
    be made in) for want of space: "only N kB free, less than the 1 MB a run needs for its
    outputs (the disk is nearly full)", or that no disk is behind it (/proc, /sys: 0 bytes in
    all, once read as a full disk), or None where there is room or it cannot be told."""
    existing = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
    if existing is None:
        return None
    try:
        usage = shutil.disk_usage(existing)
    except OSError:
        return None
    free = usage.free
    if usage.total == 0:
        return f"{existing} is on a virtual file system (0 bytes in all): files cannot be kept"
    if free >= MIN_FREE_BYTES:
        return None
    if free < 1024:
        return "no space left (the disk is full)"
    need = f"less than the {MIN_FREE_BYTES >> 20} MB a run needs for its outputs"
    return f"only {free // 1024} kB free, {need} (the disk is nearly full)"


def why_unwritten(error: OSError, outputs: dict[str, Path]) -> str:
    """Why a file's outputs could not be written, in a user's terms: the folder for a
    temporary file's error (outputs are written beside their final names first) or one that
    names no file, a file that stands where a folder must be, else the path and the system's
    words."""
    reason = error.strerror or str(error)
    if not error.filename:
        return f"cannot write its outputs in {next(iter(outputs.values())).parent}: {reason}"
    path = Path(error.filename)
    if path.name.startswith(".") and path.name.endswith(".tmp"):
        return f"cannot write its outputs in {path.parent}: {reason}"
    if error.errno in (errno.EEXIST, errno.ENOTDIR) and path.exists() and not path.is_dir():
        return f"cannot write its outputs: {path} is a file where a folder must be"
    return f"cannot write {path}: {reason}"


def write_atomically(path: Path, content: str | bytes) -> None:
    """Writes to a temporary file in the same folder, then renames it over `path` (text as
    UTF-8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        data = content.encode("utf-8") if isinstance(content, str) else content
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
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


def output_text(
    transcript: Transcript, fmt: str, stem: str, layout: SubtitleLayout = SubtitleLayout()
) -> str:
    """The content of `transcript`'s output in format `fmt` (a WRITERS name), for a file named
    `stem`; `layout` shapes srt and vtt cues."""
    if fmt in SUBTITLE_FORMATS:
        return WRITERS[fmt](transcript, stem, layout)
    return WRITERS[fmt](transcript, stem)


def write_outputs(
    transcript: Transcript,
    paths: dict[str, Path],
    record: dict | None = None,
    layout: SubtitleLayout = SubtitleLayout(),
) -> None:
    """Each output, then (with `record`: the options that made them, JSON values) the record,
    last, so a record never vouches for outputs that were not written; before them, the
    record marks them as being written (`_mark_writing`). `layout` shapes the srt and vtt
    cues.

    The record names the formats it vouches for (`RECORD_FORMATS`): those written now, and
    those it named before if they were made with the same options. A run that writes only
    srt with other options leaves a txt made before it unvouched for, so a later run that
    asks for the txt with the new options makes it again instead of skipping it."""
    if record is not None and paths:
        _mark_writing(paths)
    digests = {}
    for fmt, path in paths.items():
        data = output_text(transcript, fmt, path.stem, layout).encode("utf-8")
        write_atomically(path, data)
        digests[fmt] = digest_of(data)
    if record is not None and paths:
        source, wanted = _split(record)
        try:
            stored = _read_record(record_path(paths))
        except (OSError, ValueError):  # damaged: replaced by what was just written
            stored = None
        made_from = {RECORD_SOURCE: source.stored()} if source is not None else {}
        content = {**wanted, **made_from, RECORD_FORMATS: sorted(paths)}
        content[RECORD_WRITTEN] = sorted({*paths, *_written(stored)})
        same = isinstance(stored, dict) and _options(stored) == wanted
        if same and _same_source(source, stored):
            vouched = stored.get(RECORD_FORMATS)
            if RECORD_FORMATS not in stored:  # from before formats were named, same options:
                content = {**wanted, **made_from}  # it still vouches for every output, as it did
            elif isinstance(vouched, list):
                content[RECORD_FORMATS] = sorted({*paths, *map(str, vouched)})
        content[RECORD_DIGESTS] = {**_digests(stored), **digests}
        if earlier := _made_earlier(stored, source, paths):
            content[RECORD_EARLIER] = earlier
        write_atomically(record_path(paths), json.dumps(content, sort_keys=True, indent=1) + "\n")


def _made_earlier(stored: object, source: Source | None, paths: dict[str, Path]) -> dict:
    """`RECORD_EARLIER` once `paths` are written from `source`: the formats a stored record
    says were made from another recording (this one before it changed), but those just made."""
    if not isinstance(stored, dict):
        return {}
    earlier = stored.get(RECORD_EARLIER)
    earlier = {str(k): v for k, v in earlier.items()} if isinstance(earlier, dict) else {}
    if not _same_source(source, stored):  # the rest of what it wrote was made from that one
        earlier |= {fmt: stored[RECORD_SOURCE] for fmt in _written(stored)}
    return {fmt: made for fmt, made in earlier.items() if fmt not in paths}


def _mark_writing(paths: dict[str, Path]) -> None:
    """Before a file's outputs are replaced: its record names them as specscribe's
    (`RECORD_WRITTEN`), being written (`RECORD_WRITING`), and vouches for none of them, so
    that a run stopped among them (Ctrl-C, a kill) leaves outputs the next run knows as its
    own, to make again, not as someone else's files, to keep. The rest of the record stays
    as it was until `write_outputs` replaces it."""
    try:
        stored = _read_record(record_path(paths))
    except (OSError, ValueError):
        stored = None
    marked = dict(stored) if isinstance(stored, dict) else {}
    if not isinstance(stored, dict) or RECORD_FORMATS in stored:
        vouched = marked.get(RECORD_FORMATS)
        vouched = set(map(str, vouched)) if isinstance(vouched, list) else set()
        marked[RECORD_FORMATS] = sorted(vouched - set(paths))
        marked[RECORD_WRITTEN] = sorted({*paths, *_written(stored)})
    # else a record from before formats were named, which vouches for every output: the mark
    # alone says which are being replaced.
    marked[RECORD_WRITING] = sorted(paths)
    marked[RECORD_DIGESTS] = {k: v for k, v in _digests(stored).items() if k not in paths}
    write_atomically(record_path(paths), json.dumps(marked, sort_keys=True, indent=1) + "\n")


# The record's key that lists the formats its options made. Records written before it was
# kept lack it and vouch for every output of the file, as they were read then.
RECORD_FORMATS = "formats"
# The record's key that lists every format specscribe has written for the file, whatever the
# options: an output of another name (a reference .txt beside its audio) is someone else's,
# and is never replaced without --overwrite. Records without it: the formats they vouch for.
RECORD_WRITTEN = "written"


# The record's key that lists the outputs being written: there only while a run writes them,
# so a record that holds it was left by a run stopped among its outputs.
RECORD_WRITING = "writing"


# The record's key for the BLAKE2b digest of each output as specscribe wrote it: an output whose
# bytes differ was edited since (a corrected subtitle), and is kept, not made again.
RECORD_DIGESTS = "digests"


def _digests(stored: object) -> dict[str, str]:
    """The output digests a stored record holds (`RECORD_DIGESTS`)."""
    digests = stored.get(RECORD_DIGESTS) if isinstance(stored, dict) else None
    return {str(k): str(v) for k, v in digests.items()} if isinstance(digests, dict) else {}


def _edited(paths: dict[str, Path], existing: list[str], stored: object) -> list[str]:
    """The existing outputs whose bytes are not those the record says specscribe wrote."""
    recorded = _digests(stored)
    edited = []
    for fmt in existing:
        if fmt in recorded:
            try:
                data = paths[fmt].read_bytes()
            except OSError:
                continue  # reading it again will say why
            if digest_of(data) != recorded[fmt]:
                edited.append(fmt)
    return edited


# The record's key for outputs specscribe made from another recording than its record's
# (this one before it changed): format -> that recording's `RECORD_SOURCE`. A run that redoes
# some formats of a replaced recording leaves the others as they were, to be made again when
# they are next asked for, not vouched for as the new recording's transcript.
RECORD_EARLIER = "made_from_earlier"


# The record's key for the recording the outputs were made from (an asr.source.Source in the
# record a caller passes, its `stored()` in the file). Records without it are not checked.
RECORD_SOURCE = "source"


def record_path(paths: dict[str, Path]) -> Path:
    """The hidden record beside a file's outputs: .STEM.specscribe.json."""
    first = next(iter(paths.values()))
    return first.with_name(f".{first.stem}.specscribe.json")


def _read_record(path: Path) -> object:
    """The stored record's JSON value; None where there is none; raises ValueError or OSError
    where it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _as_stored(record: dict) -> dict:
    """`record` as JSON stores it (tuples become lists)."""
    return json.loads(json.dumps(record))


def _split(record: dict) -> tuple[Source | None, dict]:
    """A caller's record: the recording (`RECORD_SOURCE`), and the options as JSON stores them."""
    options = {k: v for k, v in record.items() if k != RECORD_SOURCE}
    return record.get(RECORD_SOURCE), _as_stored(options)


def _same_source(source: Source | None, stored: dict) -> bool:
    """Whether a stored record's outputs were made from `source` (True where either does not
    say: records from before sources were kept, callers that do not name one)."""
    return source is None or RECORD_SOURCE not in stored or source.made(stored[RECORD_SOURCE])


def _options(stored: dict) -> dict:
    """A stored record's options, without the formats it vouches for and has written, and the
    recording it was made from."""
    kept_apart = (
        RECORD_FORMATS,
        RECORD_WRITTEN,
        RECORD_WRITING,
        RECORD_DIGESTS,
        RECORD_SOURCE,
        RECORD_EARLIER,
    )
    return {k: v for k, v in stored.items() if k not in kept_apart}


def _written(stored: object) -> list[str]:
    """The formats a stored record says specscribe wrote (`RECORD_WRITTEN`)."""
    if not isinstance(stored, dict):
        return []
    written = stored.get(RECORD_WRITTEN, stored.get(RECORD_FORMATS))
    return [str(fmt) for fmt in written] if isinstance(written, list) else []


def _foreign(existing: list[str], stored: object) -> list[str]:
    """Which existing outputs specscribe did not write, by the stored record: all of them
    where there is none; none where it is damaged or from before formats were named (it
    vouched for every output then)."""
    if stored is None:
        return existing
    if not isinstance(stored, dict) or RECORD_FORMATS not in stored:
        return []
    written = set(_written(stored))
    return [fmt for fmt in existing if fmt not in written]


# Options added after records began, and the value every output made before each was made
# with: a record holds one only where it differs (`TranscriptionService.output_record`), so
# that those outputs still count as made that way; a record without one means this value.
RECORDED_SINCE = {
    "audio_stream": None,
    "channel": None,
    "initial_prompt": None,
    "condition_on_previous_text": True,
    "temperature": 0.0,
    "hotwords": None,
    "vad": False,
    "clip_timestamps": None,
    "repetition_ngram": None,
    "hallucination_silence_threshold": None,
    "passage_pause": None,
    "multilingual": False,
    # OpenAI's fallback settings, fixed at these values before they were options
    "temperature_increment_on_fallback": 0.2,
    "compression_ratio_threshold": 2.4,
    "logprob_threshold": -1.0,
    "no_speech_threshold": 0.6,
    "beam_size": 1,
    "patience": 1.0,
    "best_of": 1,
}

_ABSENT = object()  # an option a record leaves out (not the same as one it holds as null)
# Options whose null turns something off that is on by default (a guard, a fallback check).
_NULL_IS_OFF = frozenset(
    {
        "repetition_ngram",
        "passage_pause",
        "temperature_increment_on_fallback",
        "compression_ratio_threshold",
        "logprob_threshold",
        "no_speech_threshold",
    }
)


def _shown(record: dict, key: str) -> str:
    """A record's value as the user reads it: JSON; where the option is left out of the record,
    the value that means (`RECORDED_SINCE`: "vad false", not the default a run takes);
    "(default)" where that is null, or the option is unset (null: detected, none given); "off"
    where the record holds a null that turns it off (`_NULL_IS_OFF`)."""
    if key in record and record[key] is None and key in _NULL_IS_OFF:
        return "off"
    value = record.get(key, RECORDED_SINCE.get(key))
    return "(default)" if value is None else json.dumps(value)


def outputs_state(paths: dict[str, Path], record: dict | None = None) -> tuple[str, str]:
    """Whether a file's outputs are done: ("missing", what), ("done", ""), ("changed", what),
    ("replaced", what), ("elsewhere", what), ("unrecorded", formats) or ("edited", formats).

    "replaced": `record` names the recording the outputs are to be made from
    (`RECORD_SOURCE`), and they were made from it before it changed. "elsewhere": they were
    made from another recording, at another path (a recorder's REC001.WAV of another day):
    they are that one's transcript, which callers keep. `what` says which.

    "missing": an output asked for is missing (`what` names the options changed too, where
    the record says other options made the others). "changed": every output exists, but the
    record says other options made them (`what` names them: "diarize false -> true",
    "multilingual true -> (default)"), or does not vouch for
    some of them ("srt made with other options"). "unrecorded": some outputs exist that no
    record says specscribe wrote (written by hand, a reference transcript beside its audio, or
    by a version that kept no records; `formats` names them, "txt, srt"): callers keep them,
    as nothing says they are wrong, and say so, even when other outputs are missing.
    "edited": outputs that would be made again have bytes other than specscribe wrote
    (`RECORD_DIGESTS`: a corrected subtitle; `formats` names them): kept as unrecorded ones
    are."""
    existing = [fmt for fmt, path in paths.items() if path.exists()]
    complete = bool(paths) and len(existing) == len(paths)
    if not existing or record is None:
        return ("done" if complete else "missing"), ""
    try:
        stored = _read_record(record_path(paths))
    except (OSError, ValueError):
        return ("changed", "its record is unreadable") if complete else ("missing", "")
    foreign = _foreign(existing, stored)
    if foreign:
        return "unrecorded", ", ".join(foreign)
    state = _own_outputs_state(paths, record, stored, complete)
    if state[0] in ("missing", "changed", "replaced"):  # to be made again: unless edited
        edited = _edited(paths, existing, stored)
        if edited:
            return "edited", ", ".join(edited)
    return state


def _option_changes(options: dict, wanted: dict) -> str:
    """The options `wanted` changes from those a record holds ("diarize false -> true"), or
    "" where none differ."""
    if options == wanted:
        return ""
    differences = [
        (key, _shown(options, key), _shown(wanted, key))
        for key in sorted(set(options) | set(wanted))
        if options.get(key, _ABSENT) != wanted.get(key, _ABSENT)
    ]
    # Not "max_line_count (default) -> (default)": a key only one record holds, at the
    # value its absence means, is no change to name (unless nothing else differs).
    named = [change for change in differences if change[1] != change[2]] or differences
    return ", ".join(f"{key} {was} -> {now}" for key, was, now in named)


def _asked_made_earlier(paths: dict[str, Path], stored: object, source: Source | None) -> str:
    """Which existing outputs asked for were made from another recording than `source`
    (`RECORD_EARLIER`), and from which, as a rerun says it; "" where none were."""
    earlier = stored.get(RECORD_EARLIER) if isinstance(stored, dict) else None
    if source is None or not isinstance(earlier, dict):
        return ""
    made = {fmt: earlier[fmt] for fmt, path in paths.items() if fmt in earlier and path.exists()}
    if not made:
        return ""
    names, first = ", ".join(made), next(iter(made.values()))
    was = "was" if len(made) == 1 else "were"
    if source.elsewhere(first):
        return f"its {names} {was} made from another recording, {first.get('path')}"
    return f"its {names} {was} made before the recording changed"


def left_from_earlier(paths: dict[str, Path], record: dict | None) -> list[Path]:
    """Before `paths` are made from the recording `record` names: the other outputs
    specscribe made from it before it was replaced (or from another recording at another
    path), which making `paths` leaves as they are. Their record no longer vouches for them
    (`RECORD_EARLIER`), so they are made again when next asked for; the user is told now."""
    if not paths or record is None:
        return []
    source, _ = _split(record)
    try:
        stored = _read_record(record_path(paths))
    except (OSError, ValueError):
        return []
    if not isinstance(stored, dict):
        return []
    first = next(iter(paths.values()))
    stem = Path(first.name.removesuffix(first.suffix))
    others = output_paths(first.parent, stem, sorted(_made_earlier(stored, source, paths)))
    return [path for path in others.values() if path.exists()]


# Why outputs whose record says they were being written are redone (not their options).
UNFINISHED = "a run stopped or failed while it wrote them"


def _own_outputs_state(
    paths: dict[str, Path], record: dict, stored: object, complete: bool
) -> tuple[str, str]:
    """`outputs_state` of outputs that specscribe wrote, edited or not."""
    source, wanted = _split(record)
    if isinstance(stored, dict) and not _same_source(source, stored):
        # Whether or not all of them exist: a rerun asking another format of a replaced
        # recording is told it was replaced, not just that the format was missing.
        if source.elsewhere(stored[RECORD_SOURCE]):
            return "elsewhere", source.change(stored[RECORD_SOURCE])
        return "replaced", source.change(stored[RECORD_SOURCE])
    if earlier := _asked_made_earlier(paths, stored, source):
        return "replaced", earlier
    if not complete:  # the options that change too, said beside the outputs missing
        mended = isinstance(stored, dict) and not stored.get(RECORD_WRITING)
        return "missing", _option_changes(_options(stored), wanted) if mended else ""
    if not isinstance(stored, dict):
        return "changed", "its record is unreadable"
    if stored.get(RECORD_WRITING):
        return "changed", UNFINISHED
    if changes := _option_changes(_options(stored), wanted):
        return "changed", changes
    vouched = stored.get(RECORD_FORMATS)
    if isinstance(vouched, list):
        unvouched = [fmt for fmt in paths if fmt not in vouched]
        if unvouched:
            return "changed", f"{', '.join(unvouched)} made with other options"
    return "done", ""
