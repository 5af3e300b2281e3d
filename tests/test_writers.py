"""Each writer against a golden file; atomic writes; output naming."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from asr.types import Segment, SpeakerTurn, Transcript, Word
from asr.writers import (
    WRITERS,
    SubtitleLayout,
    output_paths,
    outputs_state,
    write_atomically,
    write_outputs,
    write_srt,
    write_vtt,
)

GOLDEN = Path(__file__).parent / "golden"

TRANSCRIPT = Transcript(
    segments=(
        Segment(
            start=0.0,
            end=2.5,
            text=" Hello there.",
            words=(Word(0.0, 1.1, " Hello", 0.9, "SPEAKER_00"), Word(1.1, 2.5, " there.", 0.8)),
            avg_logprob=-0.25,
            no_speech_prob=0.01,
            speaker="SPEAKER_00",
            language="en",
        ),
        Segment(
            start=3661.042,
            end=3663.5,
            text=" Tabs\tand\nnewlines, «unicode».",
            avg_logprob=-0.5,
            no_speech_prob=0.02,
            speaker="SPEAKER_01",
            language="de",
        ),
        Segment(start=3664.0, end=3665.999, text=" No speaker here."),
    ),
    language="en",
    duration=3670.0,
    options={"task": "transcribe"},
    stats={"target_calls": 12, "draft_calls": 30, "generated_tokens": 40},
    # The diarizer's turns: SPEAKER_01 starts before SPEAKER_00 stops (overlapped speech).
    turns=(
        SpeakerTurn(0.0, 2.6, "SPEAKER_00"),
        SpeakerTurn(2.4, 3663.5, "SPEAKER_01"),
    ),
)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_writer_matches_golden_file(fmt):
    expected = (GOLDEN / f"meeting.{fmt}").read_text(encoding="utf-8")
    assert WRITERS[fmt](TRANSCRIPT, "meeting") == expected


def test_output_names_follow_the_input(tmp_path):
    paths = output_paths(tmp_path, Path("sub/talk.v2"), ["txt", "srt"])
    assert paths == {"txt": tmp_path / "sub/talk.v2.txt", "srt": tmp_path / "sub/talk.v2.srt"}
    write_outputs(TRANSCRIPT, paths)
    assert paths["txt"].read_text(encoding="utf-8").startswith("[SPEAKER_00] Hello there.\n")
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["talk.v2.srt", "talk.v2.txt"]


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    with pytest.raises(TypeError):
        write_atomically(target, 12345)  # not text: fails inside the write
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_record_beside_the_outputs_tells_finished_work_from_work_made_otherwise(tmp_path):
    paths = output_paths(tmp_path, Path("talk"), ["txt", "srt"])
    made = {"model": "whisper-base", "diarize": False, "num_speakers": None}
    assert outputs_state(paths, made) == ("missing", "")
    write_outputs(TRANSCRIPT, paths, made)
    assert (tmp_path / ".talk.specscribe.json").is_file()
    assert outputs_state(paths, made) == ("done", "")
    assert outputs_state(paths, None) == ("done", "")  # no record asked for: existence decides
    asked = {**made, "diarize": True, "num_speakers": 2}
    assert outputs_state(paths, asked) == (
        "changed",
        "diarize false -> true, num_speakers (default) -> 2",
    )
    # an option a record leaves out, like one it holds as null, is shown as at its default, or
    # where it was recorded only later, at the value that means (VAD is on by default, and a
    # record without it was made without it)
    later = {"model": "whisper-base", "num_speakers": None, "multilingual": True, "vad": True}
    assert outputs_state(paths, later) == (
        "changed",
        "diarize false -> (default), multilingual false -> true, vad false -> true",
    )
    # a key only the new record holds, at the value its absence means, is no change to name
    shaped = {**made, "max_line_width": 30, "max_line_count": None}
    assert outputs_state(paths, shaped) == ("changed", "max_line_width (default) -> 30")
    # a guard or check turned off is shown as off, not as at its default
    guarded = {**made, "repetition_ngram": 6}
    write_outputs(TRANSCRIPT, paths, guarded)
    unguarded = {**made, "repetition_ngram": None}
    assert outputs_state(paths, unguarded) == ("changed", "repetition_ngram 6 -> off")
    write_outputs(TRANSCRIPT, paths, unguarded)
    assert outputs_state(paths, guarded) == ("changed", "repetition_ngram off -> 6")
    assert outputs_state(paths, made) == ("changed", "repetition_ngram off -> (default)")
    write_outputs(TRANSCRIPT, paths, made)
    (tmp_path / ".talk.specscribe.json").unlink()  # outputs written by hand, or before records
    assert outputs_state(paths, asked) == ("unrecorded", "txt, srt")
    paths["txt"].unlink()  # the srt left is still not specscribe's to replace
    assert outputs_state(paths, made) == ("unrecorded", "srt")
    paths["srt"].unlink()
    assert outputs_state(paths, made) == ("missing", "")


def test_an_output_specscribe_did_not_write_is_never_taken_for_its_own(tmp_path):
    """A reference transcript beside its audio stays someone else's file, whether other
    outputs are missing, made, or made with other options later."""
    txt, srt, both = (
        output_paths(tmp_path, Path("talk"), f) for f in (["txt"], ["srt"], ["txt", "srt"])
    )
    txt["txt"].write_text("a reference transcript")
    english, german = {"language": "en"}, {"language": "de"}
    assert outputs_state(both, english) == ("unrecorded", "txt")  # srt missing: still kept
    write_outputs(TRANSCRIPT, srt, english)  # the srt alone, as asked
    assert outputs_state(both, english) == ("unrecorded", "txt")
    assert outputs_state(both, german) == ("unrecorded", "txt")  # not "txt made otherwise"
    assert outputs_state(srt, german) == ("changed", 'language "en" -> "de"')
    write_outputs(TRANSCRIPT, srt, german)
    assert outputs_state(both, german) == ("unrecorded", "txt")
    record = json.loads((tmp_path / ".talk.specscribe.json").read_text())
    assert set(record.pop("digests")) == {"srt"}  # each output's bytes as written
    assert record == {**german, "formats": ["srt"], "written": ["srt"]}
    # What specscribe wrote once stays its own, whatever options it was written with.
    write_outputs(TRANSCRIPT, both, english)
    write_outputs(TRANSCRIPT, srt, german)
    assert outputs_state(both, german) == ("changed", "txt made with other options")


def test_a_run_stopped_among_its_outputs_leaves_them_its_own_to_make_again(tmp_path, monkeypatch):
    # Ctrl-C or a kill after the txt was written, before the srt and the record: the rerun
    # took the txt for someone else's file and failed the recording until --overwrite.
    import asr.writers as writers

    both = output_paths(tmp_path, Path("talk"), ["txt", "srt"])
    english, german = {"language": "en"}, {"language": "de"}
    written = writers.write_atomically

    def stopped_after_the_txt(path: Path, content) -> None:
        if path.suffix == ".srt":
            raise KeyboardInterrupt
        written(path, content)

    monkeypatch.setattr(writers, "write_atomically", stopped_after_the_txt)
    with pytest.raises(KeyboardInterrupt):
        write_outputs(TRANSCRIPT, both, english)
    monkeypatch.setattr(writers, "write_atomically", written)
    assert both["txt"].exists() and not both["srt"].exists()
    assert outputs_state(both, english) == ("missing", "")  # made again, not kept
    write_outputs(TRANSCRIPT, both, english)
    assert outputs_state(both, english) == ("done", "")
    record = json.loads((tmp_path / ".talk.specscribe.json").read_text())
    assert set(record.pop("digests")) == {"srt", "txt"}
    assert record == {**english, "formats": ["srt", "txt"], "written": ["srt", "txt"]}
    # Stopped with every output rewritten (in German) but before the final record: none of
    # them is vouched for by the options the record still names, English.
    records = []

    def stopped_before_the_record(path: Path, content) -> None:
        if path == writers.record_path(both):
            records.append(path)
            if len(records) == 2:  # the mark went first; this is the final record
                raise KeyboardInterrupt
        written(path, content)

    monkeypatch.setattr(writers, "write_atomically", stopped_before_the_record)
    with pytest.raises(KeyboardInterrupt):
        write_outputs(TRANSCRIPT, both, german)
    monkeypatch.setattr(writers, "write_atomically", written)
    assert outputs_state(both, english) == ("changed", writers.UNFINISHED)
    write_outputs(TRANSCRIPT, both, german)
    assert outputs_state(both, german) == ("done", "")


def test_an_output_edited_since_it_was_written_is_kept_not_made_again(tmp_path):
    # A subtitle corrected by hand, then a rerun asking for json too, or with other options:
    # the correction was overwritten without a word.
    from app.output_plan import kept_outputs, plan_outputs

    both = output_paths(tmp_path, Path("talk"), ["txt", "srt"])
    with_json = {**both, "json": tmp_path / "talk.json"}
    english, german = {"language": "en"}, {"language": "de"}
    write_outputs(TRANSCRIPT, both, english)
    both["srt"].write_text(both["srt"].read_text().replace("Hello", "Hallo"))
    assert outputs_state(both, english) == ("done", "")  # nothing to redo: nothing to say
    assert outputs_state(with_json, english) == ("edited", "srt")
    assert outputs_state(both, german) == ("edited", "srt")
    plan = plan_outputs(with_json, english, overwrite=False)
    assert (plan.action, plan.kept, plan.blocked) == ("skip", ("srt",), ("srt", "json"))
    assert kept_outputs(plan, with_json) == (
        f"{both['srt']} has changed since specscribe wrote it, so {with_json['json']} was not "
        "made either (--overwrite replaces them)"
    )
    # Every output asked for is there, but made with other options: the edit kept the file
    # from being done (it was counted done, exit 0, beside "has its outputs").
    srt = {"srt": both["srt"]}
    plan = plan_outputs(srt, german, overwrite=False)
    assert (plan.action, plan.kept, plan.blocked) == ("skip", ("srt",), ("srt",))
    assert kept_outputs(plan, srt) == (
        f"{both['srt']} has changed since specscribe wrote it (--overwrite replaces it)"
    )
    assert plan_outputs(with_json, english, overwrite=True).action == "overwrite"
    # Unedited outputs are made again as before.
    write_outputs(TRANSCRIPT, both, english)
    assert outputs_state(with_json, english) == ("missing", "")
    assert outputs_state(both, german)[0] == "changed"


def test_a_record_vouches_only_for_the_formats_its_options_made(tmp_path):
    txt, srt, both = (
        output_paths(tmp_path, Path("talk"), f) for f in (["txt"], ["srt"], ["txt", "srt"])
    )
    english, german = {"language": "en"}, {"language": "de"}
    write_outputs(TRANSCRIPT, txt, english)
    write_outputs(TRANSCRIPT, srt, german)  # other options, another format
    assert outputs_state(srt, german) == ("done", "")
    # The txt was made in English: asked for in German, it is made again, not skipped.
    assert outputs_state(txt, german) == ("changed", "txt made with other options")
    assert outputs_state(txt, english) == ("changed", 'language "de" -> "en"')
    write_outputs(TRANSCRIPT, txt, german)  # same options: the record keeps vouching for srt
    assert outputs_state(both, german) == ("done", "")
    record = json.loads((tmp_path / ".talk.specscribe.json").read_text())
    record.pop("digests")
    assert record == {**german, "formats": ["srt", "txt"], "written": ["srt", "txt"]}
    # A record from before formats were named vouches for every output, as it did then, and
    # goes on doing so when another format is made with the same options.
    (tmp_path / ".talk.specscribe.json").write_text(json.dumps(german))
    assert outputs_state(both, german) == ("done", "")
    vtt = output_paths(tmp_path, Path("talk"), ["vtt"])
    write_outputs(TRANSCRIPT, vtt, german)
    assert outputs_state({**both, **vtt}, german) == ("done", "")
    # A damaged record is replaced by the one the outputs just written deserve.
    (tmp_path / ".talk.specscribe.json").write_bytes(b'{"language": "d\xff')
    assert outputs_state(txt, german) == ("changed", "its record is unreadable")
    write_outputs(TRANSCRIPT, txt, german)
    assert outputs_state(txt, german) == ("done", "")


def _spoken(words: str, start: float = 0.0, step: float = 0.5) -> tuple[Word, ...]:
    return tuple(
        Word(start + i * step, start + (i + 1) * step - 0.1, f" {w}", 0.9)
        for i, w in enumerate(words.split())
    )


def test_subtitle_lines_are_shaped_by_width_and_count_and_timed_by_their_words():
    words = _spoken("one two three four five six seven eight nine ten")
    transcript = Transcript(
        segments=(Segment(0.0, 5.0, "".join(w.text for w in words), words, speaker="S1"),),
        language="en",
        duration=5.0,
    )
    srt = write_srt(transcript, "x", SubtitleLayout(max_line_width=14, max_line_count=2))
    assert srt == (  # the label shown before a cue counts in its first line's width
        "1\n00:00:00,000 --> 00:00:01,900\n[S1] one two\nthree four\n\n"
        "2\n00:00:02,000 --> 00:00:03,900\n[S1] five six\nseven eight\n\n"
        "3\n00:00:04,000 --> 00:00:04,900\n[S1] nine ten\n"
    )
    assert max(len(line) for line in srt.splitlines() if "-->" not in line) <= 14
    vtt = write_vtt(transcript, "x", SubtitleLayout(max_line_count=1))  # no width: one line
    assert vtt.count("-->") == 1 and "<v S1>one two three" in vtt
    # ... which the user is told of, as OpenAI's whisper tells it.
    assert "shapes nothing without --max-line-width" in SubtitleLayout(max_line_count=1).warning()
    assert SubtitleLayout(max_line_width=14, max_line_count=2).warning() is None
    assert SubtitleLayout(max_line_width=14).warning() is None


def test_a_cue_is_never_left_with_one_word_by_the_line_count():
    # "one two / three four", then "five" alone for 0.4 s: it takes "four" along.
    words = _spoken("one two three four five")
    transcript = Transcript(
        segments=(Segment(0.0, 2.5, "".join(w.text for w in words), words),),
        language="en",
        duration=2.5,
    )
    srt = write_srt(transcript, "x", SubtitleLayout(max_line_width=10, max_line_count=2))
    assert srt == (
        "1\n00:00:00,000 --> 00:00:01,400\none two\nthree\n\n"
        "2\n00:00:01,500 --> 00:00:02,400\nfour five\n"
    )
    # Where the word before would make the line too wide, or a pause parts them, it stays.
    long_word = _spoken("abcd efgh ijklmn")
    last = Transcript((Segment(0.0, 1.5, " x", long_word),), "en", 2.0)
    narrow = write_srt(last, "x", SubtitleLayout(max_line_width=10, max_line_count=1))
    assert narrow.endswith("\nabcd efgh\n\n2\n00:00:01,000 --> 00:00:01,400\nijklmn\n")
    paused = _spoken("one two three four") + _spoken("five", 10.0)
    apart = Transcript((Segment(0.0, 10.4, " x", paused),), "en", 11.0)
    srt = write_srt(apart, "x", SubtitleLayout(max_line_width=10, max_line_count=2))
    assert srt.endswith("00:00:10,000 --> 00:00:10,400\nfive\n")


def test_with_width_and_count_a_cue_fills_its_lines_across_segments_of_one_speaker():
    # Whisper's segments of two and three words: openai-whisper's layout flows them into
    # full cues; another speaker's words start a cue of their own; one limit alone keeps
    # each segment's cues apart.
    first, second = _spoken("one two"), _spoken("three four five", 1.0)
    third = _spoken("six seven", 2.5)

    def segment(words, speaker):
        text = "".join(w.text for w in words)
        return Segment(words[0].start, words[-1].end, text, words, speaker=speaker)

    one_voice = Transcript(
        (segment(first, None), segment(second, None), segment(third, None)), "en", 4.0
    )
    srt = write_srt(one_voice, "x", SubtitleLayout(max_line_width=14, max_line_count=2))
    assert srt == (
        "1\n00:00:00,000 --> 00:00:02,400\none two three\nfour five\n\n"
        "2\n00:00:02,500 --> 00:00:03,400\nsix seven\n"
    )
    apart = write_srt(one_voice, "x", SubtitleLayout(max_line_width=14))
    assert apart.count("-->") == 3
    two_voices = Transcript(
        (segment(first, "A"), segment(second, "A"), segment(third, "B")), "en", 4.0
    )
    srt = write_srt(two_voices, "x", SubtitleLayout(max_line_width=20, max_line_count=2))
    assert srt.count("-->") == 2 and "[B] six seven" in srt and "seven" not in srt.split("[B]")[0]


def test_a_long_pause_starts_a_new_cue_and_text_without_words_is_wrapped():
    words = _spoken("before", 0.0) + _spoken("after", 10.0)
    timed = Segment(0.0, 10.4, " before after", words)
    untimed = Segment(20.0, 30.0, " " + "word " * 12)
    transcript = Transcript(segments=(timed, untimed), language="en", duration=30.0)
    srt = write_srt(transcript, "x", SubtitleLayout(max_line_width=20, max_line_count=1))
    blocks = srt.strip().split("\n\n")
    assert [b.splitlines()[2] for b in blocks[:2]] == ["before", "after"]
    untimed_blocks = blocks[2:]
    assert all(len(b.splitlines()[2]) <= 20 for b in untimed_blocks)
    assert untimed_blocks[0].splitlines()[1].startswith("00:00:20,000")
    assert untimed_blocks[-1].splitlines()[1].endswith("00:00:30,000")


@pytest.mark.parametrize(
    "layout", [SubtitleLayout(max_line_width=5), SubtitleLayout(max_line_count=0)]
)
def test_bad_subtitle_layouts_are_refused(layout):
    with pytest.raises(ValueError):
        layout.validate()


def test_vtt_escapes_what_the_format_would_read_as_markup():
    segment = Segment(0.0, 2.0, " Q&A at AT&T: x < y > z", speaker="S1")
    vtt = write_vtt(Transcript((segment,), "en", 2.0), "x")
    assert "<v S1>Q&amp;A at AT&amp;T: x &lt; y &gt; z" in vtt
    assert "Q&A at AT&T" in write_srt(Transcript((segment,), "en", 2.0), "x")  # srt is plain


def test_a_label_wider_than_the_line_never_splits_words():
    segment = Segment(0.0, 3.0, " Thank you everyone.", speaker="SPEAKER_00")  # no word times
    srt = write_srt(Transcript((segment,), "en", 3.0), "x", SubtitleLayout(max_line_width=16))
    assert "[SPEAKER_00] Thank\n" in srt and "everyone." in srt


def test_outputs_made_from_another_recording_are_made_again(tmp_path):
    from asr.source import Source
    from asr.writers import RECORD_SOURCE

    audio = tmp_path / "talk.wav"
    audio.write_bytes(b"RIFF one recording")
    outputs = output_paths(tmp_path / "out", Path("talk"), ["txt"])

    def made_from(path: Path) -> dict:
        return {"language": "en", RECORD_SOURCE: Source.of(path)}

    write_outputs(TRANSCRIPT, outputs, made_from(audio))
    stored = json.loads((tmp_path / "out" / ".talk.specscribe.json").read_text())
    assert stored[RECORD_SOURCE]["size"] == audio.stat().st_size
    assert stored[RECORD_SOURCE]["path"] == str(audio.resolve())
    assert outputs_state(outputs, made_from(audio)) == ("done", "")
    # A copy elsewhere (another path, another time, the same bytes) is the same recording.
    copy = tmp_path / "copy" / "talk.wav"
    copy.parent.mkdir()
    copy.write_bytes(audio.read_bytes())
    os.utime(copy, ns=(1, 1))
    assert outputs_state(outputs, made_from(copy)) == ("done", "")
    # Another recording of the same name, or this one replaced, is not.
    other = tmp_path / "other" / "talk.wav"
    other.parent.mkdir()
    other.write_bytes(b"RIFF two recording")  # the same size
    assert outputs_state(outputs, made_from(other)) == (
        "elsewhere",
        f"its outputs were made from another recording, {audio.resolve()}",
    )
    # ... even where an output asked for is missing (the others are still that one's).
    with_json = {**outputs, "json": tmp_path / "out" / "talk.json"}
    assert outputs_state(with_json, made_from(other))[0] == "elsewhere"
    audio.write_bytes(b"RIFF a new recording, longer")
    assert outputs_state(outputs, made_from(audio)) == (
        "replaced",
        "the recording changed since its outputs were made",
    )
    # ... and where an output asked for is missing, so that a rerun says so (it said nothing).
    assert outputs_state(with_json, made_from(audio))[0] == "replaced"
    # Options still count, and a record from before sources were kept is taken as made from it.
    write_outputs(TRANSCRIPT, outputs, made_from(audio))
    assert outputs_state(outputs, {**made_from(audio), "language": "de"})[0] == "changed"
    del stored[RECORD_SOURCE]
    (tmp_path / "out" / ".talk.specscribe.json").write_text(json.dumps(stored))
    assert outputs_state(outputs, made_from(other)) == ("done", "")


def _one_word_cues(words: tuple[Word, ...], duration: float) -> str:
    """The srt of one segment of `words`, in cues of lines of at most 10 characters, one line
    each."""
    text = "".join(w.text for w in words)
    transcript = Transcript((Segment(words[0].start, words[-1].end, text, words),), "en", duration)
    return write_srt(transcript, "x", SubtitleLayout(max_line_width=10, max_line_count=1))


def test_a_cue_of_a_word_without_length_lasts_as_long_as_there_is_room():
    # Word timing can leave a word without length (" smiling," at 7.784-7.784 s): its cue
    # would end as it starts, which players drop or flash.
    words = (
        Word(7.0, 7.784, " were", 0.9),
        Word(7.784, 7.784, " smiling,", 0.9),
        Word(8.0, 8.5, " and", 0.9),
        Word(20.0, 20.0, " preserved", 0.9),
    )
    srt = _one_word_cues(words, duration=20.2)
    assert "00:00:07,784 --> 00:00:08,000\nsmiling," in srt  # up to the next cue
    assert "00:00:20,000 --> 00:00:20,200\npreserved" in srt  # up to the recording's end
    untimed = Transcript((Segment(3.0, 3.0, " Hm."),), "en", 10.0)
    assert "00:00:03.000 --> 00:00:03.500\nHm." in write_vtt(untimed, "x")
    # No room after it (the next cue starts as it does): half of the next cue's time, at most
    # MIN_CUE_SECONDS; none at the recording's end, nor before it: half of the cue before's.
    stacked = (
        Word(20.588, 21.008, " work", 0.9),
        Word(21.008, 21.008, " that's", 0.9),
        Word(21.008, 21.588, " been", 0.9),
        Word(21.9, 22.5, " done", 0.9),
        Word(22.5, 22.5, " here.", 0.9),
    )
    srt = _one_word_cues(stacked, duration=22.5)
    assert "00:00:21,008 --> 00:00:21,508\nthat's" in srt
    assert "00:00:21,508 --> 00:00:22,004\nbeen done" in srt
    assert "00:00:22,004 --> 00:00:22,500\nhere." in srt
    starts_and_ends = re.findall(r"(\S+) --> (\S+)", srt)
    assert all(start < end for start, end in starts_and_ends), srt


def test_lines_never_break_inside_a_hyphenated_word():
    # Whisper's word timing splits "self-substantial" into " self" and "-substantial".
    words = _spoken("feed thy light's flame with self")
    piece = Word(words[-1].end, words[-1].end + 0.4, "-substantial", 0.9)
    words += (piece, Word(piece.end + 0.1, piece.end + 0.5, " fuel,", 0.9))
    transcript = Transcript(
        segments=(Segment(0.0, 4.0, "".join(w.text for w in words), words),),
        language="en",
        duration=4.0,
    )
    srt = write_srt(transcript, "x", SubtitleLayout(max_line_width=20, max_line_count=1))
    lines = [line for line in srt.splitlines() if line and "-->" not in line and not line.isdigit()]
    assert lines == ["feed thy light's", "flame with", "self-substantial", "fuel,"]


def test_a_transcript_without_segments_has_no_cues():
    empty = Transcript((), "en", 20.0)
    layout = SubtitleLayout(max_line_width=20)
    assert write_srt(empty, "x") == write_srt(empty, "x", layout) == ""
    assert write_vtt(empty, "x") == "WEBVTT\n\n"


def test_outputs_left_from_a_replaced_recording_are_not_vouched_for(tmp_path):
    from asr.source import Source
    from asr.writers import RECORD_SOURCE, left_from_earlier

    audio = tmp_path / "talk.wav"
    audio.write_bytes(b"RIFF one recording")
    both = output_paths(tmp_path / "out", Path("talk"), ["txt", "srt"])
    txt = {"txt": both["txt"]}

    def made_from(path: Path) -> dict:
        return {"language": "en", RECORD_SOURCE: Source.of(path)}

    write_outputs(TRANSCRIPT, both, made_from(audio))
    audio.write_bytes(b"RIFF a new recording, longer")
    assert left_from_earlier(txt, made_from(audio)) == [both["srt"]]
    write_outputs(TRANSCRIPT, txt, made_from(audio))  # only the txt made from the new one
    assert outputs_state(txt, made_from(audio)) == ("done", "")
    assert outputs_state({"srt": both["srt"]}, made_from(audio)) == (
        "replaced",
        "its srt was made before the recording changed",
    )
    assert outputs_state(both, made_from(audio))[0] == "replaced"
    assert left_from_earlier(txt, made_from(audio)) == [both["srt"]]  # still the old one's
    write_outputs(TRANSCRIPT, both, made_from(audio))
    assert outputs_state(both, made_from(audio)) == ("done", "")
    assert left_from_earlier(txt, made_from(audio)) == []
    # Another recording at another path, written over one format with --overwrite.
    other = tmp_path / "other" / "talk.wav"
    other.parent.mkdir()
    other.write_bytes(b"RIFF two")
    write_outputs(TRANSCRIPT, txt, made_from(other))
    assert outputs_state({"srt": both["srt"]}, made_from(other)) == (
        "replaced",
        f"its srt was made from another recording, {audio.resolve()}",
    )


def test_tsv_is_openai_whispers_without_speakers():
    """openai-whisper's writer: a header of start, end and text, times in whole milliseconds,
    the text stripped; a speaker column only where segments have speakers (hunt: seconds and
    an empty speaker column broke readers made for openai-whisper's files)."""
    unlabelled = replace(
        TRANSCRIPT, segments=tuple(replace(s, speaker=None) for s in TRANSCRIPT.segments)
    )
    assert WRITERS["tsv"](unlabelled, "meeting").splitlines() == [
        "start\tend\ttext",
        "0\t2500\tHello there.",
        "3661042\t3663500\tTabs and newlines, «unicode».",
        "3664000\t3665999\tNo speaker here.",
    ]
