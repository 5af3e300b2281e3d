"""A file's transcript (a diarized file's before speakers) is kept, and labelled or written
again (not transcribed again) when only the speaker counts, the subtitle layout or the formats
change."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.unlabelled_cache import (
    Kept,
    keep_unlabelled,
    kept_unlabelled,
    passes_path,
    unlabelled_path,
)
from asr.transcribe import TranscribeOptions
from asr.types import Transcript
from asr.writers import output_paths
from diarize.passes import SpeakerPasses
from tests.conftest import SAMPLES
from tests.test_writers import TRANSCRIPT

RECORD = {"model": "whisper-base", "diarize": True, "num_speakers": None, "language": "en"}


def test_a_transcript_reads_back_as_written():
    assert Transcript.from_dict(json.loads(json.dumps(TRANSCRIPT.to_dict()))) == TRANSCRIPT
    # with the options transcription records (their temperatures a tuple, a list in JSON)
    recorded = replace(TRANSCRIPT, options=asdict(TranscribeOptions()))
    assert Transcript.from_dict(json.loads(json.dumps(recorded.to_dict()))) == recorded
    # Outputs written before words' text was keyed "word" (as openai-whisper's) read alike.
    older = json.loads(json.dumps(TRANSCRIPT.to_dict()))
    for segment in older["segments"]:
        segment["words"] = [{**w, "text": w.pop("word")} for w in segment["words"]]
    assert any(segment["words"] for segment in older["segments"])
    assert Transcript.from_dict(older) == TRANSCRIPT


def test_a_kept_transcript_serves_only_requests_that_differ_in_the_speaker_counts(tmp_path):
    outputs = output_paths(tmp_path, Path("call"), ["txt", "rttm"])
    assert kept_unlabelled(outputs, RECORD) is None  # none kept yet
    keep_unlabelled(outputs, RECORD, TRANSCRIPT)
    assert unlabelled_path(outputs) == tmp_path / ".call.specscribe-unlabelled.json"
    assert kept_unlabelled(outputs, RECORD) == Kept(TRANSCRIPT, None)
    assert kept_unlabelled(outputs, {**RECORD, "num_speakers": 2}) == Kept(TRANSCRIPT, None)
    assert kept_unlabelled(outputs, {**RECORD, "min_speakers": 2, "max_speakers": 3}) is not None
    # With diarization the labelled transcript is kept too, for the counts it was made with.
    labelled = replace(TRANSCRIPT, language="de")  # (any other transcript)
    keep_unlabelled(outputs, {**RECORD, "num_speakers": 2}, TRANSCRIPT, labelled=labelled)
    assert kept_unlabelled(outputs, {**RECORD, "num_speakers": 2}).labelled == labelled
    assert kept_unlabelled(outputs, RECORD) == Kept(TRANSCRIPT, None)
    assert kept_unlabelled(outputs, {**RECORD, "max_speakers": 2}).labelled is None
    keep_unlabelled(outputs, RECORD, TRANSCRIPT)
    # Nor does the subtitle layout change the transcript: only how it is written.
    layout = {"max_line_width": 30, "max_line_count": None}
    assert kept_unlabelled(outputs, {**RECORD, **layout}) == Kept(TRANSCRIPT, None)
    keep_unlabelled(outputs, {**RECORD, **layout}, TRANSCRIPT)
    assert kept_unlabelled(outputs, {**RECORD, "max_line_count": 1}) == Kept(TRANSCRIPT, None)
    # Anything else makes another transcript.
    assert kept_unlabelled(outputs, {**RECORD, "language": "de"}) is None
    assert kept_unlabelled(outputs, {**RECORD, "vad": False}) is None
    assert kept_unlabelled(outputs, {k: v for k, v in RECORD.items() if k != "diarize"}) is None
    assert kept_unlabelled({}, RECORD) is None  # printed, not written: nothing kept
    unlabelled_path(outputs).write_text('{"record": ')  # damaged: not used
    assert kept_unlabelled(outputs, RECORD) is None
    unlabelled_path(outputs).write_text(json.dumps({"record": RECORD, "transcript": {}}))
    assert kept_unlabelled(outputs, RECORD) is None
    # Valid JSON changed since it was written (a segment that is a number: the hunt's crash)
    # is not used either, nor one that is not an object.
    keep_unlabelled(outputs, RECORD, TRANSCRIPT)
    content = json.loads(unlabelled_path(outputs).read_text())
    content["transcript"]["segments"] = [1]
    unlabelled_path(outputs).write_text(json.dumps(content))
    assert kept_unlabelled(outputs, RECORD) is None
    unlabelled_path(outputs).write_text("[1]")
    assert kept_unlabelled(outputs, RECORD) is None


def test_a_kept_transcript_serves_only_the_recordings_very_bytes(tmp_path):
    """Another recording of the same size and time (a recorder's fixed-size chunks, a copy
    keeping times) was taken for the kept one, and the outputs' record then vouched for it."""
    import os

    from asr.source import Source

    recording = tmp_path / "r.wav"
    recording.write_bytes(b"first take " * 100)
    os.utime(recording, ns=(10**18, 10**18))
    outputs = output_paths(tmp_path, Path("r"), ["txt"])
    keep_unlabelled(outputs, {**RECORD, "source": Source.of(recording)}, TRANSCRIPT)
    assert kept_unlabelled(outputs, {**RECORD, "source": Source.of(recording)}) is not None
    recording.write_bytes(b"other take " * 100)  # the same size and time, other bytes
    os.utime(recording, ns=(10**18, 10**18))
    assert kept_unlabelled(outputs, {**RECORD, "source": Source.of(recording)}) is None
    recording.write_bytes(b"first take " * 100)  # the kept one's bytes at another time
    assert kept_unlabelled(outputs, {**RECORD, "source": Source.of(recording)}) is not None


def test_a_recording_named_in_latin1_keeps_its_transcript(tmp_path):
    """Its name reaches Python with a lone surrogate, which UTF-8 cannot hold: keeping the
    transcript raised UnicodeEncodeError after the file was decoded, so every run failed it
    (and left the diarizer's passes behind)."""
    import os

    from asr.source import Source

    recording = tmp_path / os.fsdecode(b"caf\xe9.wav")
    recording.write_bytes(b"take " * 100)
    outputs = output_paths(tmp_path, Path(recording.stem), ["txt"])
    record = {**RECORD, "source": Source.of(recording)}
    keep_unlabelled(outputs, record, TRANSCRIPT)
    assert kept_unlabelled(outputs, record) == Kept(TRANSCRIPT, None)
    assert os.fsencode(unlabelled_path(outputs).name) == b".caf\xe9.specscribe-unlabelled.json"
    json.loads(unlabelled_path(outputs).read_text(encoding="utf-8"))  # UTF-8 JSON


def _passes(segmentations: np.ndarray) -> SpeakerPasses:
    embeddings = np.random.default_rng(0).normal(size=(3, 3, 4)).astype(np.float32)
    embeddings[1, 2] = np.nan  # a local speaker silent in a chunk
    return SpeakerPasses(segmentations, (0.0, 10.0, 1.0), embeddings)


@pytest.mark.parametrize("binary", [True, False])
def test_the_diarizers_passes_read_back_exactly(tmp_path, binary):
    rng = np.random.default_rng(1)
    activations = rng.random((3, 589, 3)).astype(np.float32)
    passes = _passes((activations > 0.5).astype(np.float32) if binary else activations)
    outputs = output_paths(tmp_path, Path("call"), ["txt"])
    keep_unlabelled(outputs, RECORD, TRANSCRIPT, passes)
    kept = kept_unlabelled(outputs, RECORD)
    assert kept.unlabelled == TRANSCRIPT and kept.passes.chunk_window == (0.0, 10.0, 1.0)
    assert np.array_equal(kept.passes.segmentations, passes.segmentations)
    assert np.array_equal(kept.passes.embeddings, passes.embeddings, equal_nan=True)
    # Passes that are not the ones the transcript names are not read with it.
    keep_unlabelled(outputs, RECORD, TRANSCRIPT, None)
    assert kept_unlabelled(outputs, RECORD) == Kept(TRANSCRIPT, None)
    keep_unlabelled(outputs, RECORD, TRANSCRIPT, passes)
    passes_path(outputs).write_bytes(passes_path(outputs).read_bytes()[:-10])
    assert kept_unlabelled(outputs, RECORD) == Kept(TRANSCRIPT, None)


def _assert_reused_as_made(reused: Path, fresh: Path) -> None:
    """A json written from a kept transcript says so in its stats, and else equals the json a
    fresh run wrote (stats aside: timings)."""
    written, made = (json.loads(path.read_text()) for path in (reused, fresh))
    assert written["stats"].pop("transcript_reused") is True
    for saved in (written, made):
        del saved["stats"]
    assert written == made


@pytest.mark.slow
def test_other_speaker_counts_label_the_kept_transcript_as_a_new_run_would(
    tmp_path, capsys, monkeypatch
):
    from pyannote.audio.pipelines import SpeakerDiarization

    from app.service import TranscriptionService
    from diarize.campplus import CAMPPlus

    def command(output_dir: Path, *counts: str, formats: str = "txt,rttm,json") -> list[str]:
        audio = str(SAMPLES / "pyannote_sample.wav")
        written = ["--format", formats, "--output-dir", str(output_dir)]
        return ["transcribe", audio, "--diarize", "--language", "en", *counts, *written]

    assert main(command(tmp_path / "again", "--num-speakers", "1")) == 0
    assert main(command(tmp_path / "fresh", "--num-speakers", "2")) == 0
    one_speaker = (tmp_path / "again" / "pyannote_sample.txt").read_text()
    capsys.readouterr()

    def no_transcription(*args, **kwargs):
        raise AssertionError("transcribed again")

    monkeypatch.setattr(TranscriptionService, "run_keeping_unlabelled", no_transcription)
    # Nor are the diarizer's networks run again: only its clustering.
    monkeypatch.setattr(SpeakerDiarization, "get_segmentations", no_transcription)
    monkeypatch.setattr(CAMPPlus, "frame_features", no_transcription)
    assert main(command(tmp_path / "again", "--num-speakers", "2")) == 0
    told = capsys.readouterr().err
    assert "labelling its kept transcript again" in told and "num_speakers 1 -> 2" in told
    assert "0 transcribed, 1 from its kept transcript, 0 skipped" in told  # not transcribed
    again, fresh = tmp_path / "again", tmp_path / "fresh"
    for name in ("pyannote_sample.txt", "pyannote_sample.rttm"):
        assert (again / name).read_text() == (fresh / name).read_text()
    assert (again / "pyannote_sample.txt").read_text() != one_speaker  # two speakers now
    _assert_reused_as_made(again / "pyannote_sample.json", fresh / "pyannote_sample.json")
    # Without other counts nothing is left to do; --overwrite transcribes again.
    assert main(command(again, "--num-speakers", "2")) == 0
    assert "pyannote_sample.wav has its outputs in" in capsys.readouterr().err
    assert main([*command(again, "--num-speakers", "2"), "--overwrite"]) == 1
    assert "transcribed again" in capsys.readouterr().err
    # --overwrite transcribes again where an output is missing too (it wrote the kept one).
    (again / "pyannote_sample.rttm").unlink()
    assert main([*command(again, "--num-speakers", "2"), "--overwrite"]) == 1
    assert "transcribed again" in capsys.readouterr().err
    # Another format with the counts it was labelled with: the labelled transcript is kept
    # too, so not even the diarizer is loaded (it reran its clustering, and importing
    # pyannote.audio took seconds).
    monkeypatch.setattr(TranscriptionService, "diarizer", property(no_transcription))
    made = {
        name: (fresh / name).read_text() for name in ("pyannote_sample.txt", "pyannote_sample.json")
    }
    assert main(command(fresh, "--num-speakers", "2", formats="txt,rttm,json,srt")) == 0
    told = capsys.readouterr().err
    assert "writing its kept transcript again" in told and "srt missing" in told
    # A relabelled one is kept with its new counts too.
    assert main(command(again, "--num-speakers", "2", formats="txt,rttm,json,srt")) == 0
    told = capsys.readouterr().err
    assert "writing its kept transcript again" in told and "srt missing" in told
    assert (again / "pyannote_sample.txt").read_text() == (
        fresh / "pyannote_sample.txt"
    ).read_text()
    assert (fresh / "pyannote_sample.txt").read_text() == made["pyannote_sample.txt"]
    srt = (fresh / "pyannote_sample.srt").read_text()
    assert "[SPEAKER_00]" in srt and "[SPEAKER_01]" in srt
    written = json.loads((fresh / "pyannote_sample.json").read_text())
    assert written["stats"].pop("transcript_reused") is True
    assert written == json.loads(made["pyannote_sample.json"]) | {"stats": written["stats"]}


@pytest.mark.slow
def test_another_layout_or_format_writes_the_kept_transcript_as_a_new_run_would(
    tmp_path, capsys, monkeypatch
):
    from app.service import TranscriptionService

    def command(output_dir: Path, formats: str, width: str) -> list[str]:
        audio = str(SAMPLES / "jfk.wav")
        written = ["--format", formats, "--output-dir", str(output_dir)]
        return ["transcribe", audio, "--language", "en", "--max-line-width", width, *written]

    again, fresh = tmp_path / "again", tmp_path / "fresh"
    assert main(command(again, "srt", "20")) == 0
    assert main(command(fresh, "srt,vtt,json", "42")) == 0
    narrow = (again / "jfk.srt").read_text()
    capsys.readouterr()

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(TranscriptionService, "load", loaded)
    monkeypatch.setattr(TranscriptionService, "run_keeping_unlabelled", loaded)
    monkeypatch.setattr(TranscriptionService, "model", property(loaded))
    monkeypatch.setattr(TranscriptionService, "diarizer", property(loaded))
    assert main(command(again, "srt", "42")) == 0  # another width
    told = capsys.readouterr().err
    assert "writing its kept transcript again" in told and "max_line_width 20 -> 42" in told
    assert (again / "jfk.srt").read_text() == (fresh / "jfk.srt").read_text() != narrow
    assert main(command(again, "srt,vtt,json", "42")) == 0  # more formats
    told = capsys.readouterr().err
    assert "writing its kept transcript again" in told and "vtt, json missing" in told
    assert "0 transcribed, 1 from its kept transcript, 0 skipped" in told  # not transcribed
    assert (again / "jfk.vtt").read_text() == (fresh / "jfk.vtt").read_text()
    _assert_reused_as_made(again / "jfk.json", fresh / "jfk.json")
    # Without other options nothing is left to do; other decoding options transcribe again.
    assert main(command(again, "srt,vtt,json", "42")) == 0
    assert "jfk.wav has its outputs in" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="a model was loaded"):
        main([*command(again, "srt", "42"), "--no-vad"])
    # Both at once: the options changed are said beside the output missing (they were not).
    assert main(command(again, "srt,vtt,json,tsv", "30")) == 0
    told = capsys.readouterr().err
    assert "tsv missing; options changed (max_line_width 42 -> 30)" in told, told
    cues = (again / "jfk.srt").read_text().split("\n\n")
    assert all(len(line) <= 30 for cue in cues for line in cue.splitlines()[2:])
