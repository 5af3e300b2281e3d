"""VAD and hallucination guards as users meet them: whole `specscribe transcribe` processes
with and without `--no-vad`, interleaved passes, medians.

Three folders, each a separate process per configuration and pass:
- speech: every file of ../shared/speech/en_single and en_longform (bench.cli's 59 files):
  WER with and without VAD, all files and the long-form readings alone, and seconds;
- hallucination: the generated set of bench.hallucination_set (silence, noise, tones, speech
  with spliced pauses, speech in noise), with word timestamps: words per minute on the files
  where nobody speaks, words placed inside a spliced pause, WER on the files with speech;
- half_silence: that one file alone (the sonnets, each followed by as long a pause), for the
  time VAD saves end to end, model load included.

    python -m bench.vad --repeats 3 [--configs "vad,vad batched,no vad"] [--save]

prints one line per configuration and set, then one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench import positive_int, prog
from bench.asr_data import SPEECH, user_files
from bench.cli import Config, _command, _run, publish
from bench.hallucination_set import AdversarialFile, build

CONFIGS = {
    "vad": (),
    # The speech regions cut at silences and decoded 8 at a time (docs/vad.md).
    "vad batched": ("--batch-size", "8"),
    "no vad": ("--no-vad",),
}


def _transcribe(folder: Path, out: Path, options: tuple[str, ...], threads: int) -> float:
    """Seconds of one `specscribe transcribe FOLDER --language en --format json` process."""
    return _run(_command(Config("vad", options), folder, out, Path(), threads), threads).seconds


def _words(output: dict) -> list[dict]:
    return [word for segment in output["segments"] for word in segment.get("words", [])]


def _inside(word: dict, spans: list[tuple[float, float]]) -> bool:
    middle = (word["start"] + word["end"]) / 2
    return any(start <= middle <= end for start, end in spans)


def hallucination_row(files: list[AdversarialFile], outputs: dict[str, dict]) -> dict:
    """Insertions where nobody speaks, and WER where someone does."""
    from bench.asr import word_error_rate

    silent = [f for f in files if not f.speech]
    minutes = sum(f.duration for f in silent) / 60
    inserted = {f.name: len(outputs[f.name]["text"].split()) for f in silent}
    in_pauses = {
        f.name: sum(_inside(w, f.pauses()) for w in _words(outputs[f.name]))
        for f in files
        if f.speech and f.pauses()
    }
    spoken = [f for f in files if f.speech]
    rate = round(sum(inserted.values()) / minutes, 2) if minutes else None
    return {
        "words_per_minute_without_speech": rate,
        "words_without_speech": inserted,
        "words_inside_pauses": in_pauses,
        "wer": {
            f.name: round(100 * word_error_rate([f.reference], [outputs[f.name]["text"]]), 2)
            for f in spoken
        },
    }


def speech_row(outputs: dict[str, dict]) -> dict:
    from bench.asr import word_error_rate

    files = user_files(SPEECH)
    long_form = [u for u in files if "en_longform" in str(u.audio)]

    def wer(group) -> float:
        return round(
            100
            * word_error_rate(
                [u.reference for u in group], [outputs[u.name]["text"] for u in group]
            ),
            2,
        )

    return {"wer": wer(files), "wer_long_form": wer(long_form), "files": len(files)}


SETS = ("speech", "hallucination", "half_silence")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("vad"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--sets", default=",".join(SETS), help=f"of: {', '.join(SETS)}")
    parser.add_argument("--configs", default="vad,no vad", help=f"of: {', '.join(CONFIGS)}")
    parser.add_argument("--save", action="store_true", help="also write bench/results/vad-*.json")
    args = parser.parse_args(argv)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not sets or any(s not in SETS for s in sets):
        parser.error(f"--sets: one or more of {', '.join(SETS)} (got {args.sets!r})")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "no vad" not in configs:
        parser.error(f"--configs: {', '.join(CONFIGS)}, with 'no vad' (got {args.configs!r})")

    import app.config  # noqa: F401  (offline before anything loads)

    report: dict = {"benchmark": "bench.vad", "date": datetime.date.today().isoformat()}
    with tempfile.TemporaryDirectory(prefix="specscribe-bench-vad-") as work:
        root = Path(work)
        generated = build(root / "generated")
        folders: dict[str, tuple[Path, tuple[str, ...]]] = {}
        if "speech" in sets:
            speech = root / "speech"
            speech.mkdir()
            for utterance in user_files(SPEECH):
                (speech / utterance.audio.name).symlink_to(utterance.audio)
            folders["speech"] = (speech, ())
        if "hallucination" in sets:
            adversarial = root / "hallucination"
            adversarial.mkdir()
            for f in generated:
                if f.name != "half_silence":
                    (adversarial / f.path.name).symlink_to(f.path)
            folders["hallucination"] = (adversarial, ("--word-timestamps",))
        if "half_silence" in sets:
            half = root / "half_silence"
            half.mkdir()
            (half / "half_silence.wav").symlink_to(root / "generated" / "half_silence.wav")
            folders["half_silence"] = (half, ("--word-timestamps",))

        seconds = {(s, c): [] for s in folders for c in configs}
        outputs: dict[tuple[str, str], dict[str, dict]] = {}
        for index in range(args.repeats):
            for set_name, (folder, extra) in folders.items():
                turn = index % len(configs)
                order = configs[turn:] + configs[:turn]
                for config in order:
                    out = root / f"out-{set_name}-{config.replace(' ', '_')}-{index}"
                    took = _transcribe(folder, out, CONFIGS[config] + extra, args.threads)
                    seconds[(set_name, config)].append(took)
                    outputs[(set_name, config)] = {
                        p.stem: json.loads(p.read_text()) for p in out.glob("*.json")
                    }
                    print(f"pass {index + 1}: {set_name} / {config}: {took:.2f} s", file=sys.stderr)

        rows: dict[str, dict] = {}
        for set_name in folders:
            for config in configs:
                found = outputs[(set_name, config)]
                row: dict = {"seconds": round(statistics.median(seconds[(set_name, config)]), 2)}
                row["passes"] = [round(s, 2) for s in seconds[(set_name, config)]]
                if set_name == "speech":
                    row.update(speech_row(found))
                else:
                    row.update(hallucination_row([f for f in generated if f.name in found], found))
                rows[f"{set_name} / {config}"] = row
                print(f"{set_name} / {config}: {json.dumps(row)}")
        for set_name in folders:
            plain = rows[f"{set_name} / no vad"]
            for config in configs:
                if config != "no vad":
                    row = rows[f"{set_name} / {config}"]
                    row["speedup_vs_no_vad"] = round(plain["seconds"] / row["seconds"], 3)
    report.update({"repeats": args.repeats, "threads": args.threads, "rows": rows})
    publish(report, f"vad-{report['date']}-cpu{args.threads}.json", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
