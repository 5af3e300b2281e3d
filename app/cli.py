"""specscribe command line: `specscribe transcribe | models`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.config import Settings


def _print_progress(stage: str, completed: int, total: int) -> None:
    print(f"specscribe: {stage}: {completed}/{total}", file=sys.stderr, flush=True)


def _cmd_models(args: argparse.Namespace, settings: Settings) -> int:
    from asr.models import EMBEDDED, ModelRegistry

    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    if args.action == "list":
        print(f"cache: {settings.cache_dir}")
        for name, model in EMBEDDED.items():
            state = "ready" if registry.is_ready(name) else "not fetched"
            print(f"{name:28} {model.kind:18} {state:12} {model.description} [{model.licence}]")
        return 0
    names = args.names or list(EMBEDDED)
    failed = []
    for name in names:
        path = registry.pull(name, force=args.force)
        bad = registry.verify(name)
        if bad:
            failed.append(name)
            print(f"{name}: checksum mismatch in {', '.join(bad)} (run with --force)")
        else:
            print(f"{name}: ready at {path}")
    return 1 if failed else 0


def _formats(value: str) -> list[str]:
    from asr.writers import WRITERS

    names = list(WRITERS) if value == "all" else [v.strip() for v in value.split(",")]
    unknown = [name for name in names if name not in WRITERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown format {', '.join(unknown)}; choose from {', '.join(WRITERS)} or all"
        )
    return names


def _cmd_transcribe(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from app.service import ServiceOptions, TranscriptionService
    from asr.audio import AudioLoadError, find_audio_files
    from asr.writers import output_paths, write_outputs

    # 1. What to do: the files, and which of them already have every output.
    files = find_audio_files([Path(p) for p in args.paths])
    if not files:
        print("specscribe: no audio files found", file=sys.stderr)
        return 2
    jobs, skipped = [], 0
    for path, stem in files:
        outputs = output_paths(args.output_dir, stem, args.format) if args.output_dir else {}
        if outputs and not args.overwrite and all(p.exists() for p in outputs.values()):
            skipped += 1
            continue
        jobs.append((path, outputs))

    if not jobs:
        print(
            f"specscribe: all {skipped} files have their outputs (--overwrite redoes them)",
            file=sys.stderr,
        )
        return 0

    # 2. The models, loaded once; options checked against them before any work.
    if args.diarization_pipeline and not args.diarize:
        raise ValueError("--diarization-pipeline needs --diarize")
    options = ServiceOptions(
        language=args.language,
        task=args.task,
        word_timestamps=args.word_timestamps,
        diarize=args.diarize,
        num_speakers=args.num_speakers,
        min_speakers=args.min_speakers,
        max_speakers=args.max_speakers,
        batch_size=args.batch_size,
    ).validate()
    service = TranscriptionService(
        settings,
        asr_model=args.model,
        assistant_model=args.assistant,
        diarization_model=args.diarization_pipeline,
        device=args.device,
        progress=_print_progress,
    )
    options.transcribe_options().validate(service.model)
    service.load(diarization=options.diarize)

    # 3. Each file: a bad one is reported and skipped, the rest go on.
    failures: list[tuple[Path, str]] = []  # (file, reason)
    bar = tqdm(jobs, unit="file", disable=None, file=sys.stderr)
    for path, outputs in bar:
        bar.set_postfix_str(path.name)
        try:
            transcript = service.run(path, options)
        except AudioLoadError as error:
            failures.append((path, str(error)))
            tqdm.write(f"specscribe: skipped {error}", file=sys.stderr)
            continue
        write_outputs(transcript, outputs)
        tqdm.write(f"== {path}\n{transcript.text}")
    bar.close()

    # 4. Summary; non-zero exit when any file failed.
    done = len(jobs) - len(failures)
    print(
        f"specscribe: {done} transcribed, {skipped} skipped (outputs exist), "
        f"{len(failures)} failed",
        file=sys.stderr,
    )
    for _, reason in failures:
        print(f"  failed: {reason}", file=sys.stderr)
    return 1 if failures else 0


def _cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from app.llm import DraftOptions, load_language_model, run_generation
    from asr.models import ModelRegistry
    from decoding import SamplingOptions

    options = DraftOptions(
        assistant=args.assistant,
        prompt_lookup=args.prompt_lookup,
        ngram=args.ngram,
        early_exit=args.early_exit,
        policy=args.policy,
        k=args.k,
    ).validate()
    sampling = None
    if args.sample:
        sampling = SamplingOptions(args.temperature, args.top_k, args.top_p, args.seed).validate()
    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    target = load_language_model(registry, args.model or settings.llm_model)
    assistant = load_language_model(registry, args.assistant) if args.assistant else None
    result = run_generation(
        target, [args.prompt], options, assistant, sampling, max_new_tokens=args.max_new_tokens
    )
    print(target.tokenizer.decode(result.tokens[0], skip_special_tokens=True), flush=True)
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


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    import importlib

    return importlib.import_module(f"bench.{args.suite}").main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specscribe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    transcribe = commands.add_parser("transcribe", help="transcribe audio files and folders")
    transcribe.add_argument(
        "paths", nargs="+", help="audio files or folders (searched recursively)"
    )
    transcribe.add_argument("--model", help="embedded name, local directory or hub id")
    transcribe.add_argument("--language", help="language code (default: detected)")
    transcribe.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    transcribe.add_argument(
        "--word-timestamps", action="store_true", help="time every word (alignment heads + DTW)"
    )
    transcribe.add_argument(
        "--assistant",
        help="draft model for speculative decoding (embedded name, directory or hub id; "
        "another tokenizer is re-encoded), or none; default: $ASSISTANT_MODEL, else none. "
        "The output does not change.",
    )
    transcribe.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="decode this many windows at once (cuts at silences, no cross-window prompt)",
    )
    transcribe.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cpu)")
    transcribe.add_argument(
        "--output-dir", type=Path, help="write STEM.FORMAT files here (default: print only)"
    )
    transcribe.add_argument(
        "--format",
        type=_formats,
        default=["txt"],
        help="txt, srt, vtt, tsv, json, rttm, a comma-separated list, or all (default: txt)",
    )
    transcribe.add_argument(
        "--overwrite", action="store_true", help="transcribe files whose outputs exist"
    )
    transcribe.add_argument(
        "--diarize", action="store_true", help="label speakers (offline: segmentation-3.0 + CAM++)"
    )
    transcribe.add_argument("--num-speakers", type=int, metavar="N", help="exactly N speakers")
    transcribe.add_argument("--min-speakers", type=int, metavar="N", help="at least N speakers")
    transcribe.add_argument("--max-speakers", type=int, metavar="N", help="at most N speakers")
    transcribe.add_argument(
        "--diarization-pipeline",
        metavar="ID",
        help="a pyannote pipeline (hub id or folder) instead of the embedded one",
    )
    transcribe.set_defaults(run=_cmd_transcribe)

    gen = commands.add_parser("generate", help="generate text with a causal LM, speculatively")
    gen.add_argument("prompt")
    gen.add_argument("--model", help="target LM (default: gemma-3-270m); NAME:int8 quantizes it")
    drafts = gen.add_mutually_exclusive_group()
    drafts.add_argument("--assistant", help="draft LM; another tokenizer is re-encoded")
    drafts.add_argument(
        "--prompt-lookup", type=int, metavar="N", help="draft N tokens by n-gram lookup"
    )
    drafts.add_argument(
        "--early-exit", type=int, metavar="L", help="draft with the target's first L layers"
    )
    gen.add_argument(
        "--policy", default="heuristic", choices=("constant", "heuristic", "confidence", "adaptive")
    )
    gen.add_argument("--k", type=int, default=4, help="draft length (start / maximum)")
    gen.add_argument("--ngram", type=int, default=3, help="longest n-gram for --prompt-lookup")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--sample", action="store_true", help="sample instead of greedy")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.set_defaults(run=_cmd_generate)

    bench = commands.add_parser("bench", help="run a benchmark (bench/SUITE.py)")
    bench.add_argument("suite", choices=("text", "diarize"))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the suite")
    bench.set_defaults(run=_cmd_bench)

    models = commands.add_parser("models", help="list or fetch the embedded models")
    models.add_argument("action", choices=("list", "pull"))
    models.add_argument("names", nargs="*", help="models to pull (default: all)")
    models.add_argument("--force", action="store_true", help="fetch and convert again")
    models.set_defaults(run=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from asr.models import ModelFetchError

    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        return args.run(args, settings)
    except (ValueError, ModelFetchError) as error:
        print(f"specscribe: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
