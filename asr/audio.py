"""Audio in any container ffmpeg reads -> float32 mono samples at 16 kHz."""

from __future__ import annotations

import functools
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".mp4", ".webm", ".aac", ".wma", ".mkv"}
)
# soundfile (libsndfile) decodes these in-process, which skips an ffmpeg start (about 0.1 s a
# file, most of it CPU) for the common case.
_SOUNDFILE_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".opus"})
# Every path resamples with libsoxr at this quality (python-soxr in-process, ffmpeg's aresample
# with resampler=soxr, whose default precision is the same 20 bits): the same PCM resamples to
# the same samples whichever decoder read it (tests/test_audio.py).
_SOXR_QUALITY = "HQ"
_STEREO_GAIN = 0.5**0.5  # ffmpeg's stereo-to-mono coefficient (-3 dB)
_STDERR_TAIL = 1500


class AudioLoadError(ValueError):
    """Input that is missing, empty, corrupt or not audio. The message names the source."""


class AudioTooLongError(AudioLoadError):
    """Audio longer than the caller allows (found without decoding the rest of it)."""


def load_audio(
    source: str | Path | bytes, name: str | None = None, max_seconds: float | None = None
) -> np.ndarray:
    """Decodes `source` (a path or the bytes of a file).

    Returns float32 samples, shape = (n_samples,), mono at 16 kHz: in [-1, 1] for a mono
    source (a stereo mix, at -3 dB a channel as ffmpeg mixes it, can reach 1.41).
    `name` labels bytes input in error messages. max_seconds: longer audio raises
    AudioTooLongError once that much is decoded, so a small, highly compressed upload cannot
    make the decoder hold hours of samples.
    """
    limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    if isinstance(source, bytes | bytearray | memoryview):
        label = name or "<bytes>"
        if len(source) == 0:
            raise AudioLoadError(f"{label}: empty input (0 bytes)")
        # Through a file, not a pipe: MP4/M4A often put their index at the end, which ffmpeg can
        # only reach by seeking, and MP3 gapless trimming needs it too.
        with tempfile.NamedTemporaryFile(prefix="specscribe-", suffix=".audio") as spooled:
            spooled.write(source)
            spooled.flush()
            samples = _decode_with_ffmpeg(spooled.name, label, max_seconds)
    else:
        path = Path(source)
        label = name or str(path)
        if not path.is_file():
            raise AudioLoadError(f"{label}: no such file")
        if path.stat().st_size == 0:
            raise AudioLoadError(f"{label}: empty file (0 bytes)")
        samples = (
            _decode_with_soundfile(path, limit)
            if path.suffix.lower() in _SOUNDFILE_EXTENSIONS
            else None
        )
        if samples is None:
            samples = _decode_with_ffmpeg(str(path), label, max_seconds)
    if limit is not None and samples.size > limit:
        raise AudioTooLongError(f"{label}: the audio lasts more than the {max_seconds:g} s allowed")
    if samples.size == 0:
        raise AudioLoadError(f"{label}: contains no audio samples")
    if not np.isfinite(samples).all():  # float files can hold them; every later stage would fail
        raise AudioLoadError(f"{label}: contains NaN or infinite samples")
    return samples


def _decode_with_soundfile(path: Path, limit: int | None = None) -> np.ndarray | None:
    """The fast path for files soundfile can read, resampled in-process; None hands over to
    ffmpeg. limit: read at least one 16 kHz sample more than this (enough to tell the audio is
    too long), not the whole file."""
    import soundfile

    try:
        rate = soundfile.info(str(path)).samplerate
        frames = -1 if limit is None else math.ceil((limit + 1) * rate / SAMPLE_RATE) + 1
        samples, _ = soundfile.read(str(path), frames=frames, dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError):
        return None  # ffmpeg gives the better error message
    if samples.shape[1] > 2:
        return None  # ffmpeg's channel matrix (centre and LFE levels) for surround layouts
    # Stereo mixes as ffmpeg mixes it (each channel at -3 dB), so a file mixes the same
    # whichever decoder reads it.
    mono = (
        samples.sum(axis=1) * np.float32(_STEREO_GAIN) if samples.shape[1] == 2 else samples[:, 0]
    )
    if rate != SAMPLE_RATE and mono.size:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality=_SOXR_QUALITY)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _decode_with_ffmpeg(path: str, label: str, max_seconds: float | None = None) -> np.ndarray:
    import ffmpeg

    # With a limit, ffmpeg stops a little past it: enough to tell that the audio is longer.
    limit = {} if max_seconds is None else {"t": f"{max_seconds + 1:.3f}"}
    resampler = {"af": f"aresample={SAMPLE_RATE}:resampler=soxr"} if _ffmpeg_has_soxr() else {}
    stream = (
        ffmpeg.input(path, threads=0)
        .output(
            "pipe:", format="f32le", acodec="pcm_f32le", ac=1, ar=SAMPLE_RATE, **resampler, **limit
        )
        .global_args("-nostdin", "-hide_banner", "-loglevel", "error")
    )
    try:
        # The decoded samples arrive once, as bytes that frombuffer wraps without a copy.
        out, _ = stream.run(cmd="ffmpeg", capture_stdout=True, capture_stderr=True, quiet=True)
    except ffmpeg.Error as error:
        stderr = error.stderr.decode("utf-8", errors="replace").strip().replace(path, label)
        raise AudioLoadError(
            f"{label}: ffmpeg could not decode it: {stderr[-_STDERR_TAIL:]}"
        ) from None
    except FileNotFoundError:
        raise AudioLoadError(
            f"{label}: the ffmpeg program is not installed (apt-get install ffmpeg)"
        ) from None
    return np.frombuffer(out, dtype=np.float32)


def find_audio_files(paths: list[Path]) -> list[tuple[Path, Path]]:
    """(file, name for its outputs): files as given, and the audio files under each folder.

    Folders are searched recursively, by extension, in sorted order; a file found in a folder
    keeps its path relative to that folder, so `a/x.wav` and `b/x.wav` get distinct outputs.
    """
    found: list[tuple[Path, Path]] = []
    for path in paths:
        if path.is_dir():
            audio = sorted(
                p for p in path.rglob("*") if p.suffix.lower() in AUDIO_EXTENSIONS and p.is_file()
            )
            found.extend((p, p.relative_to(path).with_suffix("")) for p in audio)
        else:
            found.append((path, Path(path.stem)))
    return found


def check_distinct_outputs(files: list[tuple[Path, Path]], output_dir: Path) -> None:
    """Raises ValueError when two of `find_audio_files`' files would write the same outputs
    (`a/talk.wav` and `b/talk.mp3` given as files, or `talk.wav` beside `talk.flac`)."""
    by_stem: dict[Path, Path] = {}
    for path, stem in files:
        if stem in by_stem:
            raise ValueError(
                f"{by_stem[stem]} and {path} would both write {output_dir / stem}.*; "
                "transcribe them into different output folders"
            )
        by_stem[stem] = path


@functools.cache
def _ffmpeg_has_soxr() -> bool:
    """Whether the installed ffmpeg was built with libsoxr (Debian's and most builds are);
    without it ffmpeg's own resampler is used, and files it reads resample a little
    differently from those soundfile reads."""
    try:
        done = subprocess.run(
            ["ffmpeg", "-hide_banner", "-buildconf"], capture_output=True, text=True, check=False
        )
    except OSError:
        return False  # no ffmpeg: its absence is reported where it is needed
    return "--enable-libsoxr" in done.stdout
