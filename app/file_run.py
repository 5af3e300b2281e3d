"""Step 4 of `specscribe transcribe`: the files left to do, decoded up to `batch_files` at a
time, their outputs written, and each file's outcome counted.

A file's failure is reported and the rest go on. Before a file is decoded, its outputs are
claimed (`app.output_claim`), so several runs on one folder share its files. A file another
run holds is put off to the end; the run then waits for the other to let go of it and does
what the other did not (other formats or options), so every run ends with all it asked for.
A stop (Ctrl-C, SIGTERM, SIGHUP) says what was finished before it
unwinds: outputs are written atomically, so a rerun does the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from asr.audio import SAMPLE_RATE, AudioLoadError, DecodedAudio, decode_audio
from asr.types import ProgressHook
from asr.writers import SubtitleLayout, output_text, why_unwritten, write_outputs

from .out_of_memory import ADVICE as MEMORY_ADVICE
from .out_of_memory import FEWER_FILES, out_of_memory
from .out_of_memory import said as said_out_of_memory
from .output_claim import OutputClaim, claim_outputs, wait_until_unclaimed
from .output_plan import fingerprinted, plan_outputs
from .service import Labelled, TranscriptionService
from .status_lines import one_line, tell
from .unlabelled_cache import Kept, journal_path, keep_unlabelled, reused

# Write errors that every later file's outputs would meet too: a full disk or quota, a
# file system mounted read-only.
_DISK_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})

# The most audio one batch of files holds: a batch's outputs are written when all of it is
# decoded, so a short file waits at most for 10 min of audio beside it.
BATCH_AUDIO_SECONDS = 600.0

Job = tuple[Path, dict[str, Path], dict]  # (file, its outputs by format, their record)


class OutputsUnwritable(RuntimeError):
    """A file's outputs cannot be written (or their lock file made); says why in a user's
    terms (`asr.writers.why_unwritten`)."""


def kept_count(paths: Sequence[Path]) -> str:
    """The summary's count of files whose outputs were written from their kept transcripts:
    ", 2 from kept transcripts"; "" for none (nothing to say)."""
    if not paths:
        return ""
    return f", {len(paths)} from {'its kept transcript' if len(paths) == 1 else 'kept transcripts'}"


def stopped_summary(
    finished: int,
    kept: Sequence[Path],
    not_done: int,
    skipped: int,
    failures: Sequence[tuple[Path, str]],
) -> str:
    """What a run stopped by Ctrl-C (or a stop signal) says it did before it re-raises."""
    return (
        f"\nspecscribe: {finished} transcribed{kept_count(kept)}, {not_done} not done, "
        f"{skipped} skipped (outputs exist), {len(failures)} failed (a rerun does the rest)"
    )


class FileRun:
    """One run over the files. failures starts with what was refused before (folders that
    could not be listed, outputs that stand in the way); skipped with the files whose outputs
    exist. After `run`: finished (transcribed, outputs written), from_kept (outputs written
    from a kept transcript: other formats or speaker counts, no transcription), failures and
    skipped, as the summary counts them."""

    def __init__(
        self,
        service: TranscriptionService,
        options,
        layout: SubtitleLayout,
        overwrite: bool,
        batch_files: int,
        failures: list[tuple[Path, str]],
        skipped: int,
        printed_format: str | None = None,
    ) -> None:
        """printed_format: the output format stdout shows each transcript in (`--format`
        without `--output-dir`); None: its text."""
        self.service, self.options, self.layout = service, options, layout
        self.printed_format = printed_format
        self._headed = True  # each printed transcript under its "== FILE" line
        self.overwrite, self.batch_files = overwrite, batch_files
        self.failures, self.skipped = failures, skipped
        self.finished: list[Path] = []
        self.from_kept: list[Path] = []
        # Finished files' warnings (a damaged file decoded as far as it goes), summed up at
        # the end: in a folder's run they had scrolled away among the transcripts.
        self.warned: list[tuple[Path, str]] = []
        # Jobs another run held when this one came to them: (relabel or not, the job), done
        # at the end, once the other run lets go of them.
        self._put_off: list[tuple[bool, tuple]] = []
        self._came_back_to: set[Path] = set()
        self._claims: dict[Path, OutputClaim] = {}  # held until a file's outputs are written
        self._settled = 0  # files done with, whatever the outcome
        self._bar = None
        # Why outputs can no longer be written anywhere (a full disk): the run stops there.
        self.unwritable: str | None = None
        self._stop_advice = "(a rerun does them once there is room)"  # where `unwritable` is
        self.not_done = 0  # files left when it stopped

    def run(self, jobs: list[Job], relabels: list[tuple[Path, dict[str, Path], dict, Kept]]):
        """Transcribes `jobs` and labels the kept transcripts of `relabels` again (only the
        speakers asked for changed). On a stop, releases its claims, says what was done and
        re-raises."""
        from tqdm import tqdm

        total = len(jobs) + len(relabels)
        # A format printed for one file is that file's content alone (`> talk.srt`).
        self._headed = self.printed_format is None or total > 1
        self._bar = tqdm(total=total, unit="file", disable=None, file=sys.stderr)
        try:
            for path, outputs, record, kept in relabels:
                self._relabel(path, outputs, record, kept)
                if self.unwritable:
                    break
            for group in self._batches(jobs) if not self.unwritable else ():
                self._transcribe(group)
                if self.unwritable:
                    break
            while self._put_off and not self.unwritable:
                self._come_back_to_put_off()
        except KeyboardInterrupt:
            self._bar.close()
            for path in list(self._claims):
                self._release(path)
            left = total - self._settled
            print(
                stopped_summary(
                    len(self.finished), self.from_kept, left, self.skipped, self.failures
                ),
                file=sys.stderr,
            )
            raise
        self._bar.close()
        if self.unwritable and total > self._settled:
            for path in list(self._claims):
                self._release(path)
            self.not_done = total - self._settled
            files = "file" if self.not_done == 1 else "files"
            print(
                f"specscribe: stopped: {self.unwritable}; {self.not_done} {files} not done "
                f"{self._stop_advice}",
                file=sys.stderr,
            )

    def _come_back_to_put_off(self) -> None:
        """Waits for the other runs to let go of the files put off, then does each as if met
        for the first time: skipped where the other run made what this one asks for, else
        transcribed (or relabelled). A file yet another run took meanwhile is put off again.
        No claim is held while waiting, so runs waiting on each other cannot deadlock."""
        put_off, self._put_off = self._put_off, []
        self._came_back_to.update(path for _, (path, *_) in put_off)
        files = "file" if len(put_off) == 1 else "files"
        self._say(f"specscribe: waiting for another run to finish {len(put_off)} {files}")
        for _, (_, outputs, *_) in put_off:
            wait_until_unclaimed(outputs)
        for path, outputs, record, kept in (job for relabel, job in put_off if relabel):
            self._relabel(path, outputs, record, kept)
        jobs = [job for relabel, job in put_off if not relabel]
        for group in self._batches(jobs) if not self.unwritable else ():
            self._transcribe(group)
            if self.unwritable:
                break

    # -- one file's steps ---------------------------------------------------------------------

    def _relabel(self, path: Path, outputs: dict[str, Path], record: dict, kept: Kept) -> None:
        self._bar.set_postfix_str(path.name)
        try:
            if not self._claimed(path, outputs, record, relabel=kept):
                return
            as_it_was = kept.as_it_was(self.options.diarize)
            if as_it_was is None:
                audio = self._decoded(path, record)
                transcript = self.service.relabel(
                    audio, kept.unlabelled, self.options, passes=kept.passes
                )
                # Kept again, labelled with these counts: the next run asking them writes it.
                result = Labelled(transcript, kept.unlabelled, kept.passes)
            else:  # only the outputs differ: nothing to decode, the record names the bytes
                fingerprinted(path, record)
                # None: the transcript kept beside the outputs stays as it is
                result = Labelled(reused(as_it_was), None)
        except Exception as error:
            self._failed(path, error)
            return
        self._written(path, outputs, record, result, from_kept=True)

    def _decoded(self, path: Path, record: dict) -> DecodedAudio:
        """The file's audio, once its record has read the bytes' digest (`fingerprinted`), from
        the audio stream (and channel) the request names where the file holds several."""
        return decode_audio(
            fingerprinted(path, record),
            audio_stream=self.options.audio_stream,
            channel=self.options.channel,
        )

    def _transcribe(self, group: list) -> None:
        more = f" +{len(group) - 1}" if len(group) > 1 else ""
        name = group[0][0].name + more
        self._bar.set_postfix_str(name)
        progress = shown_progress(self._bar, name)
        # Each file keeps its decoded windows as it goes (a long one: the service decides), in
        # case this run is stopped before it is done.
        journals = [journal_path(outputs) if outputs else None for _, outputs, *_ in group]
        results = _transcribe_batch(self.service, group, self.options, progress, journals)
        together = [  # whose decoding costs the stats of these files are (files with speech)
            str(path)
            for (path, *_), result in zip(group, results, strict=True)
            if not isinstance(result, Exception) and "decoded_together" in result.transcript.stats
        ]
        for (path, outputs, record, _), result in zip(group, results, strict=True):
            if isinstance(result, Exception):
                self._failed(path, result)
                continue
            if read_back := result.transcript.stats.get("journal_windows"):
                self._say(
                    f"specscribe: {path}: went on from an earlier run that stopped part-way "
                    f"({read_back} decoded window{'s' if read_back != 1 else ''} read back)"
                )
            if "decoded_together" in result.transcript.stats:
                stats = {**result.transcript.stats, "decoded_with": together}
                transcript = dataclasses.replace(result.transcript, stats=stats)
                result = dataclasses.replace(result, transcript=transcript)
            self._written(path, outputs, record, result)

    def _batches(self, jobs: list[Job]) -> Iterator[list]:
        """The jobs in order, their audio loaded, in batches of up to `batch_files` files and
        BATCH_AUDIO_SECONDS of audio (a longer file goes alone); a file another run holds is
        left out, and so is one that does not load (a failure). Yields lists of (path,
        outputs, record, asr.audio.DecodedAudio)."""
        batch: list = []
        for path, outputs, record in jobs:
            if self.unwritable:
                return  # what is decoded could not be kept
            try:
                if not self._claimed(path, outputs, record):
                    continue
                audio = self._decoded(path, record)
            except Exception as error:
                self._failed(path, error)
                continue
            held = sum(len(loaded.samples) for *_, loaded in batch) + len(audio.samples)
            if batch and held > BATCH_AUDIO_SECONDS * SAMPLE_RATE:
                yield batch
                batch = []
            batch.append((path, outputs, record, audio))
            if len(batch) == self.batch_files:
                yield batch
                batch = []
        if batch:
            yield batch

    # -- outcomes -----------------------------------------------------------------------------

    def _claimed(
        self, path: Path, outputs: dict[str, Path], record: dict, relabel: Kept | None = None
    ) -> bool:
        """Claims a file's outputs before it is decoded (relabel: the kept transcript of a
        file to label again); False where another run holds them (the file put off) or made
        them since the plan was made (the file counted). Raises OutputsUnwritable where the
        lock file cannot be made."""
        if not outputs:
            return True  # printed only
        try:
            claim = claim_outputs(outputs)  # a lock file beside them: a first write
        except OSError as error:
            self._stop_if_disk_unwritable(error, outputs)
            raise OutputsUnwritable(why_unwritten(error, outputs)) from error
        if claim is None:
            self._say(
                f"specscribe: {path}: another specscribe run is transcribing it; this run comes "
                "back to it at the end"
            )
            job = (path, outputs, record) if relabel is None else (path, outputs, record, relabel)
            self._put_off.append((relabel is not None, job))
            return False
        plan = plan_outputs(outputs, record, self.overwrite)
        if plan.decode:
            if plan.action == "redo" and path in self._came_back_to:  # as a rerun says it
                self._say(f"specscribe: redoing {path}: another run made it meanwhile; {plan.why}")
            self._claims[path] = claim
            return True
        else:  # another run made them since this one looked
            claim.release()
            self.skipped += 1
        self._settle()
        return False

    def _stop_if_disk_unwritable(self, error: OSError, outputs: dict[str, Path]) -> None:
        """Stops the run (`unwritable`) where `error` says no output can be written there."""
        if error.errno in _DISK_UNWRITABLE:
            folder = next(iter(outputs.values())).parent
            self.unwritable = f"{folder}: {error.strerror}"

    def _release(self, path: Path) -> None:
        if (claim := self._claims.pop(path, None)) is not None:
            claim.release()

    def _failed(self, path: Path, error: Exception) -> None:
        self._release(path)
        if isinstance(error, AudioLoadError):
            reason = str(error)  # names the file
        elif isinstance(error, OutputsUnwritable):
            reason = f"{path}: {error}"
        elif isinstance(error, FileNotFoundError):  # listed, then moved or deleted
            reason = f"{path}: no such file (it was moved or deleted during the run)"
        elif out_of_memory(error):
            fewer = f", {FEWER_FILES}" if self.batch_files > 1 else ""
            reason = f"{path}: {said_out_of_memory(error)}; {MEMORY_ADVICE}{fewer}"
        elif isinstance(error, OSError) and error.strerror:
            reason = f"{path}: {error.strerror}"
        else:  # one file's failure must not end the run
            reason = f"{path}: {type(error).__name__}: {error}"
        self.failures.append((path, reason))
        self._say(f"specscribe: failed {reason}")
        self._settle()

    def _written(
        self, path: Path, outputs: dict[str, Path], record: dict, result, from_kept: bool = False
    ) -> None:
        """Writes a decoded file's outputs, and keeps its transcript before speakers beside
        them (`Labelled.unlabelled`, for other layouts, formats and speaker counts); from_kept:
        the transcript is a kept one (counted apart: no transcription ran). Where they
        cannot be written, its transcript is printed all the same (decoding it may have taken
        long), the file fails, and a disk that is full or read-only stops the run: every later
        file would fail the same way, after its decoding."""
        transcript, unlabelled = result.transcript, result.unlabelled
        try:
            if unlabelled is not None and outputs:  # printed: nothing to keep it beside
                labelled = transcript if self.options.diarize else None
                keep_unlabelled(outputs, record, unlabelled, result.passes, labelled)
            write_outputs(transcript, outputs, record, self.layout)
            if outputs:  # its decoded windows, kept in case this run or one before stopped
                with contextlib.suppress(OSError):
                    journal_path(outputs).unlink(missing_ok=True)
        except OSError as error:
            self._bar.write(
                f"{one_line(f'== {path} (its outputs could not be written)')}\n{shown(transcript)}"
            )
            self._failed(path, OutputsUnwritable(why_unwritten(error, outputs)))
            self._stop_if_disk_unwritable(error, outputs)
            return
        except Exception as error:
            self._failed(path, error)
            return
        self._release(path)
        for warning in transcript.warnings:
            self._say(f"specscribe: warning: {path}: {warning}")
            self.warned.append((path, warning))
        self._print(path, transcript)
        lost = getattr(sys.stdout, "failure", None) if not outputs else None
        if lost:  # its one output was not shown (`> out.srt` on a full disk): not done
            self._failed(path, OutputsUnwritable(f"standard output: {lost}"))
        else:
            (self.from_kept if from_kept else self.finished).append(path)
            self._settle()
        if not outputs and getattr(sys.stdout, "reader_gone", False):
            # Printing was all this run did (`transcribe DIR | head`): the rest would go nowhere.
            self.unwritable = "standard output is closed, and no --output-dir was given"
            self._stop_advice = "(a rerun with --output-dir writes them)"

    def _print(self, path: Path, transcript) -> None:
        """Shows a finished transcript on stdout: its text, or its `printed_format` output."""
        if self.printed_format is None:
            shown_text = shown(transcript)
        else:
            shown_text = output_text(transcript, self.printed_format, path.stem, self.layout)
            shown_text = shown_text.removesuffix("\n")  # the line's end is written after it
        self._bar.write(f"{one_line(f'== {path}')}\n{shown_text}" if self._headed else shown_text)

    def _settle(self) -> None:
        self._settled += 1
        self._bar.update()

    def _say(self, line: str) -> None:
        self._bar.write(one_line(line), file=sys.stderr)


def shown(transcript) -> str:
    """What the terminal shows of a transcript: its text, or with speakers, its segments one
    a line, each labelled as in the txt output."""
    if not any(segment.speaker for segment in transcript.segments):
        return transcript.text
    from asr.writers import write_txt

    return write_txt(transcript, "").rstrip("\n")


# Where stderr is no terminal (a log: nohup, cron, a service), seconds between the lines that
# say how far a file is: a long recording showed no sign of life until it was done.
LOGGED_PROGRESS_EVERY = 60.0


def shown_progress(
    bar, name: str, every: float = LOGGED_PROGRESS_EVERY, clock=time.monotonic
) -> ProgressHook:
    """A progress hook that shows how far the files being decoded are: on a terminal as the
    file bar's postfix ("talk.mp3: transcribe 40%"), a long file would otherwise show nothing
    for minutes; elsewhere, where the bar is off, as a line on stderr at most once every
    `every` seconds ("specscribe: talk.mp3: transcribe 40% after 60 s"), so a file done
    within a minute adds none."""
    started = last_line = clock()

    def progress(stage: str, completed: int, total: int) -> None:
        nonlocal last_line
        if total <= 0:
            return
        shown = f"{name}: {stage} {100 * min(completed, total) // total}%"
        if not bar.disable:
            bar.set_postfix_str(shown)
        elif (now := clock()) - last_line >= every:
            last_line = now
            tell(f"specscribe: {shown} after {now - started:.0f} s")

    return progress


def _transcribe_batch(
    service: TranscriptionService,
    batch: list,
    options,
    progress: ProgressHook,
    journals: list[Path | None],
) -> list:
    """Each file's app.service.Labelled, or the exception it raised. A batch whose decoding
    fails is decoded again one file at a time, so that only the file at fault fails, each
    going on from the windows its journal (`journal_path`) kept in the batch's try."""
    audios = [audio for *_, audio in batch]
    if len(batch) > 1:
        try:
            return service.run_keeping_unlabelled(audios, options, progress, journals)
        except Exception:
            pass
    results: list = []
    for audio, journal in zip(audios, journals, strict=True):
        try:
            results.append(service.run_keeping_unlabelled([audio], options, progress, [journal])[0])
        except Exception as error:
            results.append(error)
    return results
