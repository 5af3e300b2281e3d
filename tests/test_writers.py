"""Each writer against a golden file; atomic writes; output naming."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr.types import Segment, SpeakerTurn, Transcript, Word
from asr.writers import WRITERS, output_paths, outputs_state, write_atomically, write_outputs

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
        ),
        Segment(
            start=3661.042,
            end=3663.5,
            text=" Tabs\tand\nnewlines, «unicode».",
            avg_logprob=-0.5,
            no_speech_prob=0.02,
            speaker="SPEAKER_01",
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
        "diarize false -> true, num_speakers null -> 2",
    )
    (tmp_path / ".talk.specscribe.json").unlink()  # outputs from before records were kept
    assert outputs_state(paths, asked) == ("done", "")
    paths["txt"].unlink()
    assert outputs_state(paths, made) == ("missing", "")
