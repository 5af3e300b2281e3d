"""app.output_claim: one run at a time per file's outputs, on real flock locks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.output_claim import claim_outputs, claim_path, wait_until_unclaimed
from tests.conftest import REPO


def outputs_in(folder, stem="talk [2]"):
    return {fmt: folder / f"{stem}.{fmt}" for fmt in ("txt", "srt")}


def test_a_claim_is_held_by_one_run_until_released(tmp_path):
    outputs = outputs_in(tmp_path / "out")
    first = claim_outputs(outputs)  # makes the folder
    assert first is not None and claim_path(outputs).is_file()
    # Another open file description (as another process has) is refused while it is held.
    assert claim_outputs(outputs) is None
    first.release()
    assert not claim_path(outputs).exists()  # no lock file left beside the outputs
    again = claim_outputs(outputs)
    assert again is not None
    again.release()
    again.release()  # a second release does nothing


def test_waiting_for_a_claim_returns_when_it_is_released_and_takes_none(tmp_path):
    import threading
    import time

    outputs = outputs_in(tmp_path / "out")
    wait_until_unclaimed(outputs)  # never claimed: at once
    held = claim_outputs(outputs)
    started = time.monotonic()
    threading.Timer(0.3, held.release).start()
    wait_until_unclaimed(outputs)  # blocks on the lock, not a poll
    assert time.monotonic() - started >= 0.3
    claim = claim_outputs(outputs)  # the waiter holds nothing
    assert claim is not None
    claim.release()


def test_a_killed_runs_claim_is_free_and_its_temporaries_are_removed(tmp_path):
    outputs = outputs_in(tmp_path)
    # A process that claims the outputs, starts writing them, and is killed (SIGKILL).
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from app.output_claim import claim_outputs
        outputs = {{"txt": Path({str(outputs["txt"])!r}), "srt": Path({str(outputs["srt"])!r})}}
        assert claim_outputs(outputs) is not None
        Path({str(tmp_path)!r}, ".talk [2].txt.x1y2.tmp").write_text("half a transcr")
        Path({str(tmp_path)!r}, "..talk [2].specscribe.json.k3.tmp").write_text("{{")
        print("held", flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert done.stdout == "held\n" and done.returncode == -9, done.stderr
    assert claim_path(outputs).exists()  # left behind, but no longer locked
    kept = tmp_path / ".other.txt.x1y2.tmp"  # another file's: not this claim's to remove
    kept.write_text("")
    claim = claim_outputs(outputs)
    assert claim is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.txt.x1y2.tmp",
        ".talk [2].specscribe.lock",
    ]
    claim.release()


def test_a_lock_file_removed_between_open_and_lock_is_not_held(tmp_path, monkeypatch):
    # A run that opened the lock file just before its holder released (and removed) it locks
    # a file no one else can see; it must notice, and lock the file now at that path instead.
    import app.output_claim as module

    outputs = outputs_in(tmp_path)
    holder = claim_outputs(outputs)
    real_flock, calls = module.fcntl.flock, []

    def flock_after_release(descriptor, operation):
        calls.append(operation)
        if len(calls) == 1:
            holder.release()  # removes the file this run has open
        return real_flock(descriptor, operation)

    monkeypatch.setattr(module.fcntl, "flock", flock_after_release)
    claim = claim_outputs(outputs)
    assert claim is not None and len(calls) == 2  # tried again on the new file
    monkeypatch.setattr(module.fcntl, "flock", real_flock)
    assert claim_outputs(outputs) is None  # and it is the claim others see
    claim.release()


def test_names_too_long_for_the_folder_are_said_before_a_file_is_decoded(tmp_path):
    # A 220-byte name decoded, then failed: its kept transcript's temporary,
    # .STEM.specscribe-unlabelled.json.XXXXXXXX.tmp, is 42 bytes longer than the stem.
    from app.jobs import JobSpec, plan_job
    from app.output_claim import names_too_long
    from asr.writers import output_paths

    formats = ["txt", "srt", "json"]
    assert names_too_long(output_paths(tmp_path, Path("a" * 213), formats)) is None
    told = names_too_long(output_paths(tmp_path / "new", Path("a" * 214), formats))
    assert told == (
        f"its outputs' names would be too long for {tmp_path / 'new'} (256 bytes, more than the "
        "255 its file system takes); rename the recording, shorter by 1 byte or more"
    )
    recording = tmp_path / f"{'é' * 107}.wav"  # 214 bytes of UTF-8
    recording.write_bytes(b"RIFF")
    with pytest.raises(ValueError, match=r"outputs. names would be too long"):
        plan_job([recording], JobSpec(tmp_path / "out"))
