"""Audio in any container ffmpeg reads -> float32 mono samples at 16 kHz."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.ffmpeg_inputs import PLAYLIST_REMEDY, input_options, refused_format
from asr.flac import holds_several_streams, is_flac, stream_starts
from asr.ogg import ends_without_end_of_stream, is_chained, is_ogg

SAMPLE_RATE = 16_000
# Sound formats (and containers as often sound alone); a folder search picks up these and
# videos (`SEARCHED_EXTENSIONS`); a file named on the command line is read whatever its name.
AUDIO_EXTENSIONS = frozenset(
    {
        ".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".m4b", ".mp4", ".webm",
        ".aac", ".wma", ".mkv", ".mka", ".aiff", ".aif", ".aifc", ".amr", ".mpga", ".mp2",
        ".ac3", ".caf", ".wv", ".au", ".snd",
    }
)  # fmt: skip

# Containers that can hold pictures and several sound streams: ffprobe (about 50 ms) tells
# where their sound starts and which of its streams to decode (`_probe_audio_streams`).
# Sound-only formats are not probed, nor those soundfile reads; a file whose name says nothing
# (standard input's `stdin`, an unknown extension) is.
_MAY_HOLD_VIDEO = frozenset(
    {
        ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ts", ".mts", ".m2ts", ".3gp",
        ".flv", ".wmv", ".asf", ".mpg", ".mpeg", ".vob", ".ogv", ".mxf",
    }
)  # fmt: skip
_MAY_HOLD_STREAMS = _MAY_HOLD_VIDEO | {".m4a", ".m4b", ".mka"}
# A folder search takes videos too: a subtitler's folder of .mov footage was left out. A video
# beside the sound extracted from it (talk.mov, talk.wav) would write the same outputs, which
# a run refuses for both, naming them (`colliding_outputs`).
SEARCHED_EXTENSIONS = AUDIO_EXTENSIONS | _MAY_HOLD_VIDEO

# soundfile (libsndfile) decodes these in-process, which skips an ffmpeg start (about 0.1 s a
# file, most of it CPU) for the common case.
_SOUNDFILE_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".opus"})
_SOUNDFILE_FORMATS = frozenset({"WAV", "WAVEX", "FLAC", "OGG"})  # libsndfile's names for them
# Every path resamples with libsoxr at this quality (python-soxr in-process, ffmpeg's aresample
# with resampler=soxr, whose default precision is the same 20 bits): the same PCM resamples to
# the same samples whichever decoder read it (tests/test_audio.py).
_SOXR_QUALITY = "HQ"
_STEREO_GAIN = 0.5**0.5  # ffmpeg's stereo-to-mono coefficient (-3 dB)
# Below this a header's sample rate is not audio anyone records speech at, but a corrupt
# header: a 350 KB WAV claiming 1 Hz would resample to billions of samples.
MIN_SAMPLE_RATE = 1000
# libsoxr and numpy's indexing here hold a signal's length in 32 bits (37 h at 16 kHz).
_MAX_OUTPUT_SAMPLES = 2**31 - 1
# soundfile reads a file whole at its own rate and channel count before mixing and resampling:
# past this many samples (256 MB of float32; 11 minutes of 48 kHz stereo) ffmpeg decodes it
# instead, holding only the 16 kHz mono result. A 343 KB FLAC of 2 minutes at 655 kHz stereo
# took 2 GB here.
_MAX_SOUNDFILE_SAMPLES = 64 * 2**20
# Of a FLAC file joined from more streams than this, ffmpeg reads on through them (each is read
# apart otherwise: 30,000 streams of 98 bytes took a minute).
_MAX_FLAC_STREAMS = 256
# A mix nearly silent throughout is heard again as stereo over this much of its start, to tell
# whether its channels cancel out (`_unless_cancelled`); its louder channel is then decoded
# alone. Not the whole of it: an hour of stereo silence took 4.6 GB.
_CANCELLING_PROBE_SECONDS = 600.0
# Containers whose many-channel files name their layout (WAVE_FORMAT_EXTENSIBLE's mask; FLAC
# and Vorbis fix the order for up to 8 channels), which ffmpeg's downmix then weighs (centre
# louder than the rest, LFE left out). A plain WAV names none, and ffmpeg guesses one that
# can drop channels (3 become "2.1": the third is dropped as LFE) or refuses to mix at all
# (more than 8), so those channels are averaged here instead.
_NAMED_LAYOUT_FORMATS = frozenset({"WAVEX", "FLAC", "OGG"})
_MAX_NAMED_LAYOUT_CHANNELS = 8
_STDERR_TAIL = 1500
_STOP_POLL_SECONDS = 0.1  # how soon a stop set during decoding ends ffmpeg
# Float samples past _OVER_SCALE are out of full scale (`_in_full_scale`); where more than
# _WILD_SAMPLES_SHARE of them pass 1.0, the whole recording is at another scale.
_OVER_SCALE = 2.0
_WILD_SAMPLES_SHARE = 0.001
# A stereo mix this many times quieter than its louder channel is two channels cancelling
# out (`_unless_cancelled`); ffmpeg's mixes are checked where they peak below _QUIET_MIX.
_CANCELLED_MIX = 0.1
_QUIET_MIX = 0.01
# An audio stream's start past the file's start by at most this is taken as none (timestamps
# rounded to a container's time base).
_LEAD_TOLERANCE = 0.001
# "[wav @ 0x5624bb0a4980] ": how ffmpeg prefixes a component's messages.
# A filter's resampler prefixes two: "[Parsed_pan_0 @ 0x...] [SWR @ 0x...] ".
_FFMPEG_COMPONENT = re.compile(r"^(\[[^\]]* @ 0x[0-9a-f]+\]\s*)+")
# "[error] ": how "-loglevel level+warning" tags a line, after the component's prefix.
_FFMPEG_LEVEL = re.compile(r"^\[(\w+)\]\s*")
_FFMPEG_ERROR_LEVELS = frozenset({"error", "fatal", "panic"})
# What ffmpeg says as "errors" where one stream of a chained Ogg file (or a joined FLAC file)
# ends and the next begins (a new stream's header, a timestamp going back to 0): every sample
# is still decoded.
_CHAIN_SEAMS = ("failed to create or replace stream", "non monotonically increasing dts")
# What mp3's demuxer says where the frame count its header (Xing/Info) gives does not match
# the file's size by more than a tenth: most often a download or copy cut short. It is only
# a warning, so the decode succeeds with half the audio and nothing else said.
_HEADER_SIZE_MISMATCH = "filesize and duration do not match"
# A header's duration past the decoded audio's by more than this is a file cut short.
_CUT_SHORT_TOLERANCE_SECONDS = 1.0


class AudioLoadError(ValueError):
    """Input that is missing, empty, corrupt or not audio. The message names the source."""


class DecodingStopped(Exception):
    """`decode_audio`'s stop event was set while ffmpeg decoded: it was ended, nothing kept.
    Not an AudioLoadError: the input may be fine."""


class AudioTooLongError(AudioLoadError):
    """Audio longer than the caller allows (found without decoding the rest of it)."""


class AudioStreamError(AudioLoadError):
    """A file without the audio stream asked for (`AudioStream`); the message lists its own."""


class AudioChannelError(AudioLoadError):
    """A file without the channel asked for (`AudioChannel`); the message gives its count."""


# Which audio stream of a file to decode: its index among the file's audio streams, counted
# from 0 as ffmpeg's `-map 0:a:N` counts them, or the first whose language tag is this
# Whisper language code (containers tag ISO 639-2: "eng", "deu" or "ger" are "en", "de");
# None: the stream a player would play (`_probe_audio_streams`).
AudioStream = int | str | None
# Which channel of the stream to transcribe alone, counted from 0 (0: left, 1: right): a call
# recorded with each side on its own channel; None: every channel mixed (stereo at -3 dB a
# channel, as ffmpeg mixes it).
AudioChannel = int | None


@dataclass(frozen=True)
class DecodedAudio:
    """A decoded file: float32 mono samples at 16 kHz, shape = (n_samples,), and what went
    wrong without stopping the decoder (a truncated or damaged file decodes as far as it can:
    the user is told, not refused), each a sentence about this file that does not name it."""

    samples: np.ndarray
    warnings: tuple[str, ...] = ()


# Channel counts an array's shorter axis may hold; more, and it is not taken for channels.
_MAX_ARRAY_CHANNELS = 16


def samples_audio(
    samples: np.ndarray, name: str = "<samples>", channel: AudioChannel = None
) -> DecodedAudio:
    """Samples given as an array (16 kHz assumed: a rate cannot be read from an array), made
    what `decode_audio` gives a file of the same samples: float32 mono. Floats are taken as
    they are (in [-1, 1]); integer PCM is scaled by its type's range (int16 by 32768, uint8
    around 128), as a WAV of that type decodes. Channels, on either axis of a 2-D array
    (soundfile's (frames, channels) or librosa's (channels, frames)), mix as a file's do:
    stereo at -3 dB a channel, more channels averaged; NaN and infinite samples are read as
    silence, with a warning. channel: that channel alone (mono counts as one channel).
    Raises AudioLoadError for an empty array or one that is not real-valued audio, and
    AudioChannelError for a channel it does not have."""
    array = np.asarray(samples)
    if array.size == 0:
        raise AudioLoadError(f"{name}: contains no audio samples")
    if array.ndim == 2 and 1 < min(array.shape) <= _MAX_ARRAY_CHANNELS:
        array = array if array.shape[0] >= array.shape[1] else array.T  # (frames, channels)
    elif array.ndim == 1 or (array.ndim == 2 and 1 in array.shape):  # mono
        array = array.reshape(-1, 1)
    else:
        raise AudioLoadError(
            f"{name}: samples of shape {array.shape}: expected mono samples (n,) or channels "
            f"(n, channels) / (channels, n), at most {_MAX_ARRAY_CHANNELS} of them"
        )
    if array.dtype.kind in "iu":
        info = np.iinfo(array.dtype)
        middle = (int(info.max) + int(info.min) + 1) / 2  # 0 for signed types, 128 for uint8
        array = ((array.astype(np.float64) - middle) / (int(info.max) + 1 - middle)).astype(
            np.float32
        )
    elif array.dtype.kind == "f":
        array = array.astype(np.float32)
    else:
        raise AudioLoadError(
            f"{name}: samples of type {array.dtype}: expected float samples in [-1, 1] or "
            "integer PCM"
        )
    if channel is not None and channel >= array.shape[1]:
        raise _no_channel(name, channel, array.shape[1])
    if channel is not None:
        mono = array[:, channel]
    elif array.shape[1] > 2:  # as `_decode_with_soundfile` mixes a file's channels
        mono = array.mean(axis=1, dtype=np.float32)
    elif array.shape[1] == 2:
        mono = array.sum(axis=1) * np.float32(_STEREO_GAIN)
    else:
        mono = array[:, 0]
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    mono, damaged = _finite(mono)
    if damaged:  # the channels too, which `_unless_cancelled` compares
        array = np.nan_to_num(array, nan=0.0, posinf=0.0, neginf=0.0)
    warnings = ()
    if channel is None:
        mono, warnings = _unless_cancelled(mono, array)
    return _in_full_scale(DecodedAudio(mono, (*damaged, *warnings)))


def _finite(samples: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """`samples` with NaN and infinite values (a damaged float recording; every later stage
    would fail on them) read as silence, and the warning that says so, or none."""
    bad = ~np.isfinite(samples)
    if not bad.any():
        return samples, ()
    count = int(bad.sum())
    return np.where(bad, np.float32(0), samples).astype(np.float32), (
        f"{count} sample{'s' if count != 1 else ''} NaN or infinite (damaged float audio) "
        "read as silence",
    )


def _in_full_scale(audio: DecodedAudio) -> DecodedAudio:
    """`audio` brought into full scale where float samples go far past it, with a warning.

    Float audio lies in [-1, 1] (a stereo mix of full-scale channels reaches 1.41). Whisper's
    log-mel is not level-free: its floor is fixed, so a recording saved 90 dB too loud (int16
    values written as float, a common numpy slip) gave an empty transcript. A recording
    mostly past full scale is divided by its peak; one with a few wild samples (a 1e6
    spike) has them clipped, so the rest keeps its level."""
    samples = audio.samples
    peak = float(np.abs(samples).max()) if samples.size else 0.0
    if peak <= _OVER_SCALE:
        return audio
    if np.count_nonzero(np.abs(samples) > 1.0) > _WILD_SAMPLES_SHARE * samples.size:
        samples, done = samples / np.float32(peak), f"divided by {peak:.5g}"
    else:
        samples, done = np.clip(samples, -1.0, 1.0), "the samples past it clipped"
    # Past it: float samples written too loud, or surround channels that ffmpeg's matrix
    # adds up (a 16-bit 5.1 file with speech in every channel reaches 2.7).
    why = "float samples past [-1, 1], or many channels mixed into one"
    warning = f"its samples reach {peak:.5g}, past full scale ({why}): {done}"
    return DecodedAudio(samples.astype(np.float32, copy=False), (*audio.warnings, warning))


def load_audio(
    source: str | Path | bytes, name: str | None = None, max_seconds: float | None = None
) -> np.ndarray:
    """`decode_audio`'s samples alone."""
    return decode_audio(source, name, max_seconds).samples


def decode_audio(
    source: str | Path | bytes,
    name: str | None = None,
    max_seconds: float | None = None,
    audio_stream: AudioStream = None,
    channel: AudioChannel = None,
    stop: threading.Event | None = None,
) -> DecodedAudio:
    """Decodes `source` (a path or the bytes of a file).

    Its samples are float32, mono at 16 kHz: in [-1, 1] for a mono source (a stereo mix, at
    -3 dB a channel as ffmpeg mixes it, can reach 1.41). `name` labels bytes input in error
    messages. max_seconds: longer audio raises AudioTooLongError once that much is decoded, so
    a small, highly compressed upload cannot make the decoder hold hours of samples. A file
    that decodes only in part (truncated, damaged frames) gives what decoded and a warning.
    audio_stream: which of several audio streams to decode (`AudioStream`); None: the one
    marked default, else the first, or the first with sound where that one is silent.
    channel: that channel of it alone (`AudioChannel`); AudioChannelError where it has fewer.
    stop: once set, ffmpeg is ended and DecodingStopped raised (an hour of mp3 takes it
    seconds: a web page's Stop pressed meanwhile waited for all of them); files soundfile
    reads are not interrupted.
    """
    limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    decoded = None
    if isinstance(source, bytes | bytearray | memoryview):
        label = name or "<bytes>"
        if len(source) == 0:
            raise AudioLoadError(f"{label}: empty input (0 bytes)")
        # Through a file, not a pipe: MP4/M4A often put their index at the end, which ffmpeg can
        # only reach by seeking, and MP3 gapless trimming needs it too.
        with tempfile.NamedTemporaryFile(prefix="specscribe-", suffix=".audio") as spooled:
            spooled.write(source)
            spooled.flush()
            # The formats a path with their extension would have read through soundfile, read
            # the same way (its header checks included); the rest through ffmpeg.
            header = _wav_header(Path(spooled.name))
            unsized = _unsized_audio(header)
            if unsized is not None:
                _one_stream_holds(audio_stream, label)
                decoded = _decode_with_ffmpeg(
                    spooled.name,
                    label,
                    max_seconds,
                    probe=channel is not None,
                    ignore_length=True,
                    channel=channel,
                    stop=stop,
                )
                decoded = DecodedAudio(
                    _audio_only(decoded.samples, header), (unsized, *decoded.warnings)
                )
            else:
                decoded = _decode_with_soundfile(
                    Path(spooled.name), label, limit, sniffed=True, channel=channel
                )
                if decoded is not None:
                    _one_stream_holds(audio_stream, label)
            if decoded is None:
                # An upload's name may not say what it is: probed, as a video would be.
                decoded = _decode_with_ffmpeg(
                    spooled.name,
                    label,
                    max_seconds,
                    probe=True,
                    audio_stream=audio_stream,
                    channel=channel,
                    stop=stop,
                )
            if limit is None or decoded.samples.size <= limit:  # else refused as too long
                decoded = _with_cut_short(decoded, Path(spooled.name), header)
    else:
        path = Path(source)
        label = name or str(source)
        if str(source).startswith(("http://", "https://")):
            raise AudioLoadError(f"{label}: a URL; specscribe reads files: download it first")
        _check_regular_file(path, label)
        if path.stat().st_size == 0:
            raise AudioLoadError(f"{label}: empty file (0 bytes)")
        header = _wav_header(path)
        unsized = _unsized_audio(header)
        with _utf8_named(path) as readable:
            if unsized is not None:  # ffmpeg reads past the data chunk's size; soundfile cannot
                _one_stream_holds(audio_stream, label)
                decoded = _decode_with_ffmpeg(
                    str(readable),
                    label,
                    max_seconds,
                    ignore_length=True,
                    channel=channel,
                    stop=stop,
                )
                decoded = DecodedAudio(
                    _audio_only(decoded.samples, header), (unsized, *decoded.warnings)
                )
            elif path.suffix.lower() in _SOUNDFILE_EXTENSIONS or is_flac(path):
                # FLAC by its content too: a pipe's spool has no name to go by, and ffmpeg
                # stops at a joined file's second stream where its sample rate differs. By its
                # absolute path: libsndfile reads a file named `-` as standard input.
                decoded = _decode_with_soundfile(readable.absolute(), label, limit, channel=channel)
                if decoded is not None:
                    _one_stream_holds(audio_stream, label)
            if decoded is None:
                decoded = _decode_with_ffmpeg(
                    str(readable),
                    label,
                    max_seconds,
                    audio_stream=audio_stream,
                    channel=channel,
                    stop=stop,
                )
        if limit is None or decoded.samples.size <= limit:  # else refused as too long
            decoded = _with_cut_short(decoded, path, header)
    samples = decoded.samples
    if limit is not None and samples.size > limit:
        raise AudioTooLongError(f"{label}: the audio lasts more than the {max_seconds:g} s allowed")
    if samples.size == 0:
        raise AudioLoadError(f"{label}: contains no audio samples")
    samples, damaged = _finite(samples)  # float files can hold them
    if damaged:
        decoded = DecodedAudio(samples, (*damaged, *decoded.warnings))
    return _in_full_scale(decoded)


@contextlib.contextmanager
def _utf8_named(path: Path) -> Iterator[Path]:
    """`path`, or, where its name is not UTF-8 (a Latin-1 name from an old archive or a
    Samba share, which Python holds as surrogate escapes), a symbolic link to it with a UTF-8
    name for as long as the context lasts: soundfile and ffmpeg-python encode names strictly
    and failed on such files."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        yield path
        return
    suffix = path.suffix if path.suffix.isascii() else ""
    with tempfile.TemporaryDirectory(prefix="specscribe-") as folder:
        link = Path(folder) / f"audio{suffix}"
        link.symlink_to(path.absolute())
        yield link


def _check_regular_file(path: Path, label: str) -> None:
    """Raises AudioLoadError saying what `path` is where it is not a file that can be read
    from its start: a pipe or device would block the reader (a FIFO in a folder hung a whole
    run) or be consumed by the first read (the recording's digest, `asr.source`)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise AudioLoadError(f"{label}: a symbolic link to a file that is gone") from None
        if str(path) == "-":  # `./-` on the command line, or "-" given to load_audio
            raise AudioLoadError(
                "-: no such file (a file named -; standard input is read by `specscribe "
                "transcribe -`, not by load_audio)"
            ) from None
        raise AudioLoadError(f"{label}: no such file") from None
    except OSError as error:  # a symbolic link loop (ELOOP), a name too long, ...
        raise AudioLoadError(f"{label}: {error.strerror or error}") from None
    if stat.S_ISDIR(mode):
        raise AudioLoadError(f"{label}: a folder, not a file")
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"))
        what = next((name for test, name in kinds if test(mode)), "a device")
        raise AudioLoadError(f"{label}: {what}, not a file: save the audio to a file first")


def _decode_with_soundfile(
    path: Path,
    label: str,
    limit: int | None = None,
    sniffed: bool = False,
    channel: AudioChannel = None,
) -> DecodedAudio | None:
    """The fast path for files soundfile can read, resampled in-process; None hands over to
    ffmpeg. limit: read at least one 16 kHz sample more than this (enough to tell the audio is
    too long), not the whole file. sniffed: the file's name says nothing (uploaded bytes), so
    only the containers `_SOUNDFILE_EXTENSIONS` name are read here. Raises AudioLoadError for
    a sample rate no recording has (`MIN_SAMPLE_RATE`) or a length this decoder cannot hold,
    and AudioChannelError for a `channel` the file does not have."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except (RuntimeError, soundfile.LibsndfileError):
        return None  # ffmpeg gives the better error message
    if sniffed and info.format not in _SOUNDFILE_FORMATS:
        return None
    if info.frames == 0:
        # An unfinished WAV (a recorder that stopped before writing its sizes) says 0 frames
        # and libsndfile reads none; ffmpeg reads the samples that follow its header.
        return None
    if info.format == "OGG" and is_chained(path):
        # libsndfile reads a chained Ogg's first stream only (or takes its length for
        # millions of hours); ffmpeg reads every stream in turn.
        return None
    if info.format == "FLAC":
        starts = stream_starts(Path(path))
        if len(starts) > _MAX_FLAC_STREAMS:
            return None
        if len(starts) > 1:  # files joined with cat: libsndfile reads the first alone
            return _decode_flac_streams(Path(path), starts, label, limit, channel)
    rate = info.samplerate
    if rate < MIN_SAMPLE_RATE:
        raise AudioLoadError(
            f"{label}: its header gives a sample rate of {rate} Hz (at least {MIN_SAMPLE_RATE} "
            "expected): the file is corrupt"
        )
    if info.frames * SAMPLE_RATE / rate > _MAX_OUTPUT_SAMPLES:
        hours = info.frames / rate / 3600
        raise AudioLoadError(f"{label}: {hours:.0f} h of audio is more than one file may hold")
    if channel is not None and channel >= info.channels:
        raise _no_channel(label, channel, info.channels)
    if channel is None and info.channels > 2 and _layout_named(path, info):
        return None  # ffmpeg's channel matrix (centre and LFE levels) for surround layouts
    frames = -1 if limit is None else math.ceil((limit + 1) * rate / SAMPLE_RATE) + 1
    read = info.frames if frames < 0 else min(info.frames, frames)
    if read * info.channels > _MAX_SOUNDFILE_SAMPLES:
        return None
    try:
        samples, _ = soundfile.read(str(path), frames=frames, dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError):
        return None
    warnings = ()
    if channel is not None:
        mono = samples[:, channel]
    elif samples.shape[1] > 2:  # no layout named: every channel counts the same
        mono = samples.mean(axis=1, dtype=np.float32)
    elif samples.shape[1] == 2:
        # Stereo mixes as ffmpeg mixes it (each channel at -3 dB), so a file mixes the same
        # whichever decoder reads it.
        mono = samples.sum(axis=1) * np.float32(_STEREO_GAIN)
    else:
        mono = samples[:, 0]
    if channel is None:
        mono, warnings = _unless_cancelled(mono, samples)
    if rate != SAMPLE_RATE and mono.size:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality=_SOXR_QUALITY)
    return DecodedAudio(np.ascontiguousarray(mono, dtype=np.float32), warnings)


def _decode_flac_streams(
    path: Path, starts: list[int], label: str, limit: int | None, channel: AudioChannel
) -> DecodedAudio | None:
    """A FLAC file of several streams (`asr.flac`), each read apart through
    `_decode_with_soundfile` and joined at 16 kHz; None (ffmpeg) where one cannot be read."""
    pieces, warnings, held = [], [], 0
    with path.open("rb") as stream, tempfile.TemporaryDirectory(prefix="specscribe-") as folder:
        for index, (start, end) in enumerate(zip(starts, [*starts[1:], None], strict=True)):
            stream.seek(start)
            part = Path(folder) / f"stream{index}.flac"
            part.write_bytes(stream.read(None if end is None else end - start))
            left = None if limit is None else limit - held
            try:
                decoded = _decode_with_soundfile(part, label, left, channel=channel)
            except AudioChannelError as error:
                # The file's first stream may hold the channel: say which one lacks it.
                heard = held / SAMPLE_RATE
                raise AudioChannelError(
                    f"{error} in stream {index + 1} of the {len(starts)} FLAC streams joined"
                    f" in it (from {heard:.2f} s)"
                ) from None
            part.unlink()
            if decoded is None:
                return None
            pieces.append(decoded.samples)
            held += decoded.samples.size
            warnings.extend(w for w in decoded.warnings if w not in warnings)
            if left is not None and decoded.samples.size > left:
                break  # too long already: the caller refuses it
    return DecodedAudio(np.concatenate(pieces), tuple(warnings))


def _unless_cancelled(mono: np.ndarray, channels: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """`mono`, or where a stereo recording's channels cancel out in it (`_cancelling_side`),
    its louder channel, with a warning. channels: shape = (frames, channels), the samples
    `mono` was mixed from."""
    louder = _cancelling_side(mono, channels)
    if louder is None:
        return mono, ()
    return np.ascontiguousarray(channels[:, louder], dtype=np.float32), (_cancelled(louder),)


def _cancelling_side(mono: np.ndarray, channels: np.ndarray) -> int | None:
    """The louder channel (0 left, 1 right) where a stereo recording's channels cancel out in
    `mono`, its mix; else None. channels: shape = (frames, channels).

    One channel wired or saved inverted (R = -L) mixes to nothing: "no speech found", an
    empty transcript, from two clear channels. A mix `_CANCELLED_MIX` times quieter than the
    louder channel is taken for that; only stereo is checked (speech on one of many channels
    is quiet in their average without anything cancelling)."""
    if channels.ndim != 2 or channels.shape[1] != 2 or not mono.size:
        return None
    levels = [_rms(channels[:, side]) for side in (0, 1)]
    louder = int(np.argmax(levels))
    if levels[louder] == 0.0 or _rms(mono) >= _CANCELLED_MIX * levels[louder]:
        return None
    return louder


def _cancelled(side: int) -> str:
    return (
        f"its two channels cancel out when mixed (one is inverted?): the "
        f"{('left', 'right')[side]} one was transcribed alone"
    )


def _rms(samples: np.ndarray) -> float:
    """Root mean square, summed in float64 a block at a time: no float64 copy of the whole."""
    block = 2**20
    total = sum(
        float(np.dot(part, part))
        for part in (
            samples[at : at + block].astype(np.float64) for at in range(0, len(samples), block)
        )
    )
    return math.sqrt(total / max(len(samples), 1))


def _layout_named(path: Path, info) -> bool:
    """Whether a many-channel file names its channel layout for ffmpeg's downmix: FLAC and Vorbis
    fix it up to 8 channels; a WAV names it only in WAVE_FORMAT_EXTENSIBLE's channel mask, which
    writers (libsndfile among them) often leave 0."""
    if info.channels > _MAX_NAMED_LAYOUT_CHANNELS or info.format not in _NAMED_LAYOUT_FORMATS:
        return False
    if info.format == "WAVEX":
        header = _wav_header(path)
        return header is not None and bool(header.channel_mask)
    return True


@dataclass(frozen=True)
class _WavHeader:
    """What a RIFF WAV's header says. seconds: what its data chunk holds by its size (None for
    a streamed header, size 0 or 0xFFFFFFFF); channel_mask: WAVE_FORMAT_EXTENSIBLE's
    dwChannelMask (None in other formats); unsized_seconds: how much audio the bytes after the
    data chunk would hold where they are not a chunk (a header whose sizes a recorder wrote
    early and never updated), else 0."""

    seconds: float | None
    channel_mask: int | None
    unsized_seconds: float = 0.0


def _wav_header(path: Path) -> _WavHeader | None:
    """The header of a RIFF WAV whose fmt and data chunks start in its first 64 KB; None for
    anything else. Decoders count the samples a file still has, so a truncated file looks
    whole to them: the data chunk's size says what it should hold."""
    with path.open("rb") as stream:
        head = stream.read(65536)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    fmt, at = None, 12
    while at + 8 <= len(head):
        chunk, size = head[at : at + 4], int.from_bytes(head[at + 4 : at + 8], "little")
        body = head[at + 8 : at + 8 + size]
        if chunk == b"fmt " and len(body) >= 16:
            fmt = body
        elif chunk == b"data" and fmt is not None:
            rate, block = int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[12:14], "little")
            extensible = int.from_bytes(fmt[0:2], "little") == 0xFFFE and len(fmt) >= 24
            mask = int.from_bytes(fmt[20:24], "little") if extensible else None
            streamed = size in (0, 0xFFFFFFFF) or not rate or not block
            if streamed:
                return _WavHeader(None, mask)
            after = _unsized_bytes(path, at + 8 + size + (size & 1))
            return _WavHeader(size // block / rate, mask, after // block / rate)
        at += 8 + size + (size & 1)
    return None


def _unsized_bytes(path: Path, end: int) -> int:
    """How many bytes follow a WAV's data chunk (ending at `end`) where they are neither a
    chunk (8 bytes: an id of printable ASCII, a size that fits the file) nor zeros (a writer's
    padding to a block's end): audio up to the chunks that end the file, if any (a recorder
    that never updated its sizes may still append its LIST chunk when it stops)."""
    total = path.stat().st_size
    if total - end < 8:
        return 0
    with path.open("rb") as stream:
        stream.seek(end)
        head = stream.read(_PADDING_CHECKED)
        if _is_chunk(head, end, total) or not any(head):  # metadata or padding: a whole file
            return 0
        tail_start = max(end, total - _PADDING_CHECKED)
        stream.seek(tail_start)
        tail = stream.read()
    offsets = range(len(tail) - 7)
    trailing = next((at for at in offsets if _chunks_reach_the_end(tail, at)), len(tail))
    return tail_start + trailing - end


def _is_chunk(head: bytes, at: int, total: int) -> bool:
    """Whether `head`, read at byte `at` of a file of `total` bytes, starts with a chunk."""
    size = int.from_bytes(head[4:8], "little")
    return _chunk_id(head[:4]) and at + 8 + size <= total


def _chunk_id(four: bytes) -> bool:
    """Whether four bytes can be a RIFF chunk's id (printable ASCII)."""
    return all(32 <= byte < 127 for byte in four)


def _chunks_reach_the_end(tail: bytes, offset: int) -> bool:
    """Whether RIFF chunks (printable ids; word-aligned sizes) run from `offset` exactly to
    the end of `tail`."""
    while offset + 8 <= len(tail):
        if not _chunk_id(tail[offset : offset + 4]):
            return False
        size = int.from_bytes(tail[offset + 4 : offset + 8], "little")
        offset += 8 + size
        if offset == len(tail) or offset + (size & 1) == len(tail):
            return True
        offset += size & 1
    return False


def _audio_only(samples: np.ndarray, header: _WavHeader | None) -> np.ndarray:
    """A WAV read to its end (`ignore_length`) without what follows its audio: the chunks
    that end the file, which ffmpeg reads as samples too."""
    if header is None or header.seconds is None:
        return samples
    return samples[: round((header.seconds + header.unsized_seconds) * SAMPLE_RATE)]


# How much of what follows a WAV's data chunk is read to tell padding from samples, and how
# much of the file's end is searched for the chunks that end it.
_PADDING_CHECKED = 1 << 16


def _unsized_audio(header: _WavHeader | None) -> str | None:
    """A warning where a RIFF WAV (whatever its name: .wave, .bwf, none; `_wav_header`) holds
    at least `_UNSIZED_AUDIO` s more audio than its header gives (its sizes written early and
    never updated), which decoders would leave out; None for any other file."""
    if header is None or header.seconds is None or header.unsized_seconds < _UNSIZED_AUDIO:
        return None
    whole = header.seconds + header.unsized_seconds
    return (
        f"its header gives {header.seconds:.2f} s of audio, but {whole:.2f} s follow it (a "
        "recording whose sizes were never updated?): transcribed all of it"
    )


# Less than this after a WAV's data chunk is taken for padding or junk, not audio.
_UNSIZED_AUDIO = 0.1


def _cut_short(header: _WavHeader | None, samples: np.ndarray) -> tuple[str, ...]:
    """A warning when a RIFF WAV (whatever its name; `_wav_header`) holds less audio than its
    header gives (a recording cut off)."""
    decoded = len(samples) / SAMPLE_RATE
    if header is None or header.seconds is None or decoded >= header.seconds - 0.01:
        return ()
    return (_ends_early(decoded, header.seconds),)


def _with_cut_short(decoded: DecodedAudio, path: Path, header: _WavHeader | None) -> DecodedAudio:
    """`decoded` with a warning where the file at `path` holds less than it should: a WAV
    whose header promises more (`_cut_short`), an Ogg without its last page
    (`_ogg_cut_short`)."""
    cut = _cut_short(header, decoded.samples) + _ogg_cut_short(path, decoded.samples)
    return DecodedAudio(decoded.samples, decoded.warnings + cut)


def _chained(path: str) -> bool:
    """Whether `path` is a chained Ogg file or a FLAC file of several streams (False for
    other files, whatever their name says)."""
    try:
        return is_chained(Path(path)) or holds_several_streams(Path(path))
    except OSError:
        return False


def _ogg_cut_short(path: Path, samples: np.ndarray) -> tuple[str, ...]:
    """A warning when an Ogg file (whatever its name) stops before its stream's last page
    (`asr.ogg`): nothing else tells that such a file lost its end."""
    if not is_ogg(path) or not ends_without_end_of_stream(path):
        return ()
    return (
        f"the Ogg stream stops after {len(samples) / SAMPLE_RATE:.2f} s without its last page "
        "(truncated?); transcribed what is there",
    )


def _ends_early(decoded: float, promised: float) -> str:
    """The warning for a file whose header promises `promised` seconds and holds `decoded`."""
    return (
        f"the file ends after {decoded:.2f} s of the {promised:.2f} s its header gives "
        "(truncated?); transcribed what is there"
    )


def _decode_with_ffmpeg(
    path: str,
    label: str,
    max_seconds: float | None = None,
    probe: bool | None = None,
    ignore_length: bool = False,
    audio_stream: AudioStream = None,
    channel: AudioChannel = None,
    stop: threading.Event | None = None,
) -> DecodedAudio:
    """probe: whether to ask ffprobe where the sound starts and which of its streams to decode
    (`_probe_audio_streams`); None: where the file's extension is a container's that may hold
    several streams, or says nothing of it (`_MAY_HOLD_STREAMS`, `AUDIO_EXTENSIONS`), or a
    stream is asked for. ignore_length: a WAV's samples run to the file's end, whatever its
    data chunk's size. audio_stream, channel: as `decode_audio`'s (a channel is always
    probed for, to name the count where a stream lacks it)."""
    if probe is None:
        suffix = Path(path).suffix.lower()
        probe = (
            suffix in _MAY_HOLD_STREAMS
            or suffix not in AUDIO_EXTENSIONS
            or audio_stream is not None
            or channel is not None
        )
    probed = _probe_audio_streams(path) if probe else None
    if probed is not None and probed.count == 0:
        raise _no_audio_stream(label)
    warnings = []
    if audio_stream is None:
        chosen = None if probed is None else probed.chosen  # the stream the warnings name
    else:
        chosen, told = _asked_stream(probed, audio_stream, label)
        warnings.extend(told)
    if channel is not None and probed is not None:
        held = probed.channels[chosen or 0]
        if held and channel >= held:  # 0: ffprobe did not say (ffmpeg then reads silence)
            raise _no_channel(label, channel, held)
    samples, said, cautions = _run_ffmpeg(
        path, label, max_seconds, 1, chosen, ignore_length, channel, stop
    )
    if said and _chained(path):
        said = [line for line in said if not any(seam in line for seam in _CHAIN_SEAMS)]
    # Whatever ffmpeg reports as an error on a run that succeeds is damage it decoded past.
    if said:
        last = _ffmpeg_said(said[-1], path, label)
        errors = f"{len(said)} decoding error{'s' if len(said) > 1 else ''}"
        warnings.append(
            f"ffmpeg met {errors} (the last: {last}); the audio may be cut short or damaged"
        )
    elif any(_HEADER_SIZE_MISMATCH in line for line in cautions):
        warnings.extend(_shorter_than_header(path, samples.size / SAMPLE_RATE, max_seconds))
    if samples.size and _nearly_silent(samples) and channel is None:
        # Perhaps two channels that cancel out, heard again apart over its start.
        probe = _CANCELLING_PROBE_SECONDS
        stereo, _, _ = _run_ffmpeg(path, label, probe, 2, chosen, ignore_length, stop=stop)
        start = min(stereo.size // 2, samples.size)
        side = _cancelling_side(samples[:start], stereo[: 2 * start].reshape(-1, 2))
        if side is not None and stereo.size == 2 * samples.size:
            samples = np.ascontiguousarray(stereo.reshape(-1, 2)[:, side])
        elif side is not None:  # longer than the probe: that channel alone, to its end
            samples, _, _ = _run_ffmpeg(
                path, label, max_seconds, 1, chosen, ignore_length, side, stop=stop
            )
        if side is not None:
            warnings.append(_cancelled(side))
    heard = chosen
    if probed is not None and probed.count > 1 and audio_stream is None:
        # A channel asked for is of the stream a player would play: never another one's.
        silent = _nearly_silent(samples) and channel is None
        undecodable = []
        if silent:
            # A silent default stream (a muted or effects-only track first): the first of the
            # others with sound, rather than no subtitles. One that does not decode (damaged)
            # is passed over: the file still decodes.
            for other in (i for i in range(probed.count) if i != chosen):
                try:
                    candidate, _, _ = _run_ffmpeg(
                        path, label, max_seconds, 1, other, ignore_length, stop=stop
                    )
                except AudioLoadError:
                    undecodable.append(other)
                    continue
                if not _nearly_silent(candidate):
                    samples, heard = candidate, other
                    break
        warnings.append(_streams_said(probed, heard, silent, tuple(undecodable)))
    if probed is not None and probed.leads[heard] > 0.0:
        lead = np.zeros(round(probed.leads[heard] * SAMPLE_RATE), dtype=np.float32)
        samples = np.concatenate([lead, samples])
    return DecodedAudio(samples, tuple(warnings))


def _nearly_silent(samples: np.ndarray) -> bool:
    return float(np.abs(samples).max(initial=0.0)) < _QUIET_MIX


def _ffmpeg_file(path: str) -> str:
    """`path` as ffmpeg and ffprobe must be given a file: through the file protocol, by its
    absolute path. Given as it is, `-` is standard input to them and `rec:1.wav` a URL of the
    protocol `rec` (a file named `./-` is `-` once Python's pathlib has read it)."""
    return "file:" + os.path.abspath(path)


def _run_ffmpeg(
    path: str,
    label: str,
    max_seconds: float | None,
    channels: int,
    audio_stream: int | None,
    ignore_length: bool = False,
    channel: AudioChannel = None,
    stop: threading.Event | None = None,
) -> tuple[np.ndarray, list[str], list[str]]:
    """The file's samples at 16 kHz as float32, `channels` interleaved (1: mixed as ffmpeg
    mixes), then the error lines and the warning lines ffmpeg wrote on a run that succeeded
    (each without its level's tag). audio_stream: the audio stream to decode, counted from 0
    among the file's audio streams (None: ffmpeg's choice); ignore_length: as
    `_decode_with_ffmpeg`'s; channel: that channel alone (with `channels` 1); stop: as
    `decode_audio`'s. Raises AudioLoadError where it fails."""
    import ffmpeg

    # With a limit, ffmpeg stops a little past it: enough to tell that the audio is longer.
    limit = {} if max_seconds is None else {"t": f"{max_seconds + 1:.3f}"}
    # channelmap, not pan: pan warns that it leaves the other channels out.
    filters = [] if channel is None else [f"channelmap=map={channel}:channel_layout=mono"]
    if _ffmpeg_has_soxr():
        filters.append(f"aresample={SAMPLE_RATE}:resampler=soxr")
    resampler = {"af": ",".join(filters)} if filters else {}
    source = ffmpeg.input(
        _ffmpeg_file(path),
        threads=0,
        **input_options(),
        **({"ignore_length": 1} if ignore_length else {}),
    )
    stream = (
        (source if audio_stream is None else source[f"a:{audio_stream}"])
        .output(
            "pipe:",
            format="f32le",
            acodec="pcm_f32le",
            ac=channels,
            ar=SAMPLE_RATE,
            **resampler,
            **limit,
        )
        .global_args("-nostdin", "-hide_banner", "-loglevel", "level+warning")
    )
    try:
        # The decoded samples arrive once, as bytes that frombuffer wraps without a copy.
        out, err, status = _until_stopped(stream.compile(cmd="ffmpeg"), stop)
    except FileNotFoundError:
        raise AudioLoadError(
            f"{label}: the ffmpeg program is not installed (apt-get install ffmpeg)"
        ) from None
    if status != 0:
        stderr = err.decode("utf-8", errors="replace")
        refused = refused_format(stderr)
        if refused is not None:
            raise AudioLoadError(
                f"{label}: a playlist ({refused}) of other files or streams; specscribe reads "
                f"only the audio a file holds itself: {PLAYLIST_REMEDY}"
            )
        errors, cautions = _by_level(stderr)
        said = _ffmpeg_said("\n".join(errors or cautions), path, label)
        if "does not contain any stream" in said:  # ffmpeg's words for "no audio stream"
            raise _no_audio_stream(label)
        raise AudioLoadError(f"{label}: ffmpeg could not decode it: {said[-_STDERR_TAIL:]}")
    errors, cautions = _by_level(err.decode("utf-8", errors="replace"))
    return np.frombuffer(out, dtype=np.float32), errors, cautions


def _until_stopped(command: list[str], stop: threading.Event | None) -> tuple[bytes, bytes, int]:
    """`command`'s standard output, standard error and exit status; where `stop` is set
    before it ends, it is killed and DecodingStopped raised."""
    pipe = subprocess.PIPE
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
    if stop is None:
        out, err = process.communicate()
        return out, err, process.returncode
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.extend(process.communicate()), daemon=True)
    reader.start()
    reader.join(_STOP_POLL_SECONDS)
    while reader.is_alive():
        if stop.is_set():
            process.kill()
            reader.join()
            raise DecodingStopped("stopped while ffmpeg decoded the audio")
        reader.join(_STOP_POLL_SECONDS)
    out, err = read
    return out, err, process.returncode


def _by_level(stderr: str) -> tuple[list[str], list[str]]:
    """ffmpeg's lines (written with -loglevel level+warning) as (errors, warnings), each
    without its component's prefix and level's tag; an untagged line (a message's
    continuation) counts as an error, as everything did at -loglevel error."""
    errors, cautions = [], []
    for line in stderr.splitlines():
        line = _FFMPEG_COMPONENT.sub("", line).strip()
        if not line:
            continue
        tagged = _FFMPEG_LEVEL.match(line)
        if tagged is None:
            errors.append(line)
        elif tagged.group(1) in _FFMPEG_ERROR_LEVELS:
            errors.append(line[tagged.end() :])
        else:
            cautions.append(line[tagged.end() :])
    return errors, cautions


def _shorter_than_header(path: str, decoded: float, max_seconds: float | None) -> tuple[str, ...]:
    """A warning where the file's header (an mp3's Xing/Info frame count) promises audio past
    what decoded: a file cut short, worded as a WAV's (`_cut_short`). Nothing where a
    length limit stopped the decode or ffprobe cannot say."""
    import ffmpeg

    if max_seconds is not None and decoded >= max_seconds:
        return ()
    try:
        header = float(
            ffmpeg.probe(_ffmpeg_file(path), cmd="ffprobe", **input_options())["format"]["duration"]
        )
    except (ffmpeg.Error, FileNotFoundError, KeyError, ValueError):
        return ()
    if header <= decoded + _CUT_SHORT_TOLERANCE_SECONDS:
        return ()
    return (_ends_early(decoded, header),)


@dataclass(frozen=True)
class _AudioStreams:
    """What ffprobe says of a file's audio streams, counted from 0. count: how many; chosen:
    the one to decode (the first marked default, else the first); languages: each one's
    language tag ("" where it has none); marked_default: whether the default mark tells the
    streams apart (some are marked, not all); leads: how long after the file's start (its
    earliest stream: a video's picture) each one starts."""

    count: int
    chosen: int = 0
    languages: tuple[str, ...] = ()
    marked_default: bool = False
    leads: tuple[float, ...] = ()
    channels: tuple[int, ...] = ()  # each one's channel count (0 where ffprobe gives none)


def _probe_audio_streams(path: str) -> _AudioStreams | None:
    """The file's audio streams; None where ffprobe cannot read the file (decoding it then
    says why). A video whose sound starts late (2.9 s into an edited mp4) decodes from its
    first sample, so without the lead every subtitle would be that much early. The stream
    marked default is the one a player plays: a film's first track may be music alone, or
    another language, with the dialogue marked default after it."""
    import ffmpeg

    try:
        probed = ffmpeg.probe(_ffmpeg_file(path), cmd="ffprobe", **input_options())
    except (ffmpeg.Error, FileNotFoundError):
        return None
    audio = [s for s in probed.get("streams", ()) if s.get("codec_type") == "audio"]
    if not audio:
        return _AudioStreams(0)
    defaults = [i for i, s in enumerate(audio) if s.get("disposition", {}).get("default") == 1]

    def lead(stream: dict) -> float:
        try:
            seconds = float(stream["start_time"]) - float(probed["format"]["start_time"])
        except (KeyError, ValueError):
            return 0.0
        return seconds if seconds > _LEAD_TOLERANCE else 0.0

    def language(stream: dict) -> str:
        tag = str(stream.get("tags", {}).get("language", ""))
        return "" if tag == "und" else tag

    return _AudioStreams(
        len(audio),
        defaults[0] if defaults else 0,
        tuple(language(stream) for stream in audio),
        bool(defaults) and len(defaults) < len(audio),
        tuple(lead(stream) for stream in audio),
        tuple(_int_or_zero(stream.get("channels")) for stream in audio),
    )


def _int_or_zero(value: object) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _asked_stream(
    streams: _AudioStreams | None, asked: int | str, label: str
) -> tuple[int | None, tuple[str, ...]]:
    """The stream to decode where one is asked for (`AudioStream`), and what to tell of it;
    raises AudioStreamError, listing the file's streams, where none is the one asked for. A
    language no stream is tagged with takes a file's only stream, told where it is tagged
    with another: a folder of films and sound files is transcribed with one choice. streams:
    None where ffprobe could not read the file (ffmpeg then says why it cannot decode it)."""
    if streams is None:
        return (asked if isinstance(asked, int) else None), ()
    if isinstance(asked, int):
        if asked < streams.count:
            return asked, ()
        raise AudioStreamError(f"{label}: asked for audio stream {asked}, but {_listing(streams)}")
    tagged = [i for i, tag in enumerate(streams.languages) if _tagged_code(tag) == asked]
    if tagged:
        return tagged[0], ()
    if streams.count > 1:
        raise AudioStreamError(
            f"{label}: no audio stream is tagged with language {asked}: {_listing(streams)}"
        )
    tag = streams.languages[0]
    if not tag:
        return 0, ()
    return 0, (f"its only audio stream is tagged {tag}, not {asked}: transcribed it",)


def _tagged_code(tag: str) -> str:
    """A stream's language tag ("eng", "ger", "en") as a Whisper code ("en", "de"), else as
    it is."""
    from asr.languages import OTHER_CODES

    text = tag.strip().lower()
    return OTHER_CODES.get(text, text)


def _listing(streams: _AudioStreams) -> str:
    """The file's audio streams, as a user picks one: "it holds 2 audio streams, counted from
    0: 0 (eng, marked default), 1 (deu)"."""

    def shown(index: int) -> str:
        details = [streams.languages[index]] if streams.languages[index] else []
        if streams.marked_default and index == streams.chosen:
            details.append("marked default")
        return str(index) + (f" ({', '.join(details)})" if details else "")

    if streams.count == 1:
        return f"it holds one audio stream: {shown(0)}"
    listed = ", ".join(shown(index) for index in range(streams.count))
    return f"it holds {streams.count} audio streams, counted from 0: {listed}"


def _one_stream_holds(asked: AudioStream, label: str) -> None:
    """For a file decoded as one stream (a WAV, FLAC or Ogg file read in-process): raises
    AudioStreamError where a later stream is asked for. A language takes the one stream."""
    if isinstance(asked, int) and asked > 0:
        raise AudioStreamError(
            f"{label}: asked for audio stream {asked}, but it holds one audio stream: 0"
        )


def _streams_said(
    streams: _AudioStreams, heard: int, silent: bool, undecodable: tuple[int, ...] = ()
) -> str:
    """The warning for a file of several audio streams where none was asked for: which one was
    transcribed (`heard`), and where the chosen one was (nearly) silent (`silent`), that it
    was, and which of the others would not decode (`undecodable`), and how to ask for another
    (specscribe decodes one: a second language or microphone would be transcribed into the
    same text)."""

    def named(index: int, marked: bool) -> str:
        ordinal = _ORDINALS[index] if index < len(_ORDINALS) else None
        which = f"the {ordinal}" if ordinal else f"stream {index + 1}"
        details = [streams.languages[index]] if streams.languages[index] else []
        if marked:
            details.append("marked default")
        return which + (f" ({', '.join(details)})" if details else "")

    chosen = named(streams.chosen, streams.marked_default)
    said = f"it holds {streams.count} audio streams: "
    if heard != streams.chosen:
        return said + f"{chosen} is (nearly) silent, so {named(heard, False)} was transcribed"
    said += f"{chosen} was transcribed"
    if silent and undecodable:
        failed = ", ".join(named(index, False) for index in undecodable)
        said += f"; it is (nearly) silent, and {failed} would not decode"
    elif silent:
        said += ", and every one is (nearly) silent"
    else:
        other = 1 if streams.chosen == 0 else 0
        said += (
            f"; to transcribe another, name it by its index, counted from 0, or its language "
            f"(--audio-stream {other} on the command line, audio_stream in a request, the "
            f"Audio stream box on the web page)"
        )
    return said


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _no_channel(label: str, channel: int, held: int) -> AudioChannelError:
    return AudioChannelError(
        f"{label}: asked for channel {channel} (counted from 0), but its audio has "
        f"{held} channel{'s' if held != 1 else ''}"
    )


def _no_audio_stream(label: str) -> AudioLoadError:
    return AudioLoadError(f"{label}: no audio stream in it (not audio, or a video without sound)")


def _ffmpeg_said(stderr: str, path: str, label: str) -> str:
    """ffmpeg's error output as one line of a message: the file named as the user named it,
    its lines joined, and the "[wav @ 0x5624bb0a4980] " that prefixes a component's lines
    left out (a memory address tells a user nothing), as is the file's name that starts a
    line (the message that quotes it starts with the name already)."""
    text = stderr.replace(_ffmpeg_file(path), label).replace(path, label)
    lines = (_FFMPEG_COMPONENT.sub("", line).strip() for line in text.splitlines())
    return "; ".join(line.removeprefix(f"{label}: ") for line in lines if line)


def find_audio_files(
    paths: list[Path],
    unreadable: Callable[[Path, OSError], None] | None = None,
    same_file: Callable[[tuple[Path, Path], tuple[Path, Path]], None] | None = None,
) -> list[tuple[Path, Path]]:
    """(file, name for its outputs): files as given, and the audio and video files under each
    folder (`SEARCHED_EXTENSIONS`).

    Folders are searched recursively (symbolic links followed, each folder once, hidden files
    and folders left out: a file named itself is read whatever its name), by extension, in
    sorted order; a file found in a folder keeps its path relative to that
    folder, so `a/x.wav` and `b/x.wav` get distinct outputs. A file given or found twice
    (the same file by its real path: a link, a folder and a file in it) is listed once, by
    its first path, or by the first that is not a symbolic link (the file itself rather than
    a link to it). unreadable: called with each folder that cannot be listed (permissions)
    and its error; without it such a folder raises the error, so none is ever skipped unsaid.
    same_file: called with the (file, name for its outputs) left out and the one listed, for
    each file left out under another name for its outputs, which a user may expect outputs
    of its own for.
    """
    found: list[tuple[Path, Path]] = []
    listed: dict[Path, tuple[Path, Path]] = {}  # real path -> (file, stem) listed
    for path in paths:
        if path.is_dir():
            files = [
                (f, f.relative_to(path).with_suffix("")) for f in _audio_under(path, unreadable)
            ]
        else:
            files = [(path, Path(path.stem))]
        for file, stem in files:
            key = Path(os.path.realpath(file))
            first = listed.get(key)
            if first is None:
                listed[key] = (file, stem)
                found.append((file, stem))
                continue
            left = (file, stem)
            if first[0].is_symlink() and not file.is_symlink():  # the file, not a link to it
                found[found.index(first)] = listed[key] = left
                first, left = left, first
            if first[1] != left[1] and same_file is not None:
                same_file(left, first)
    return found


def _audio_under(folder: Path, unreadable: Callable[[Path, OSError], None] | None) -> list[Path]:
    """The files with an audio or video extension under `folder`, sorted. A link to a file
    that is gone is kept: reading it reports it."""

    def failed(error: OSError) -> None:
        if unreadable is None:
            raise error
        unreadable(Path(error.filename), error)

    audio, visited = [], set()
    for root, folders, names in os.walk(folder, onerror=failed, followlinks=True):
        folders.sort()  # a folder reached twice (a link) is named by its first path, sorted
        real = os.path.realpath(root)
        if real in visited:  # a link back up the tree, or beside its target: listed already
            folders.clear()
            continue
        visited.add(real)
        # Hidden entries are left out, as `ls` leaves them: macOS's ._NAME.wav resource files
        # (not audio: every run failed on them), .Trash, .git, and specscribe's own records.
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in sorted(n for n in names if not n.startswith(".")):
            if Path(name).suffix.lower() in SEARCHED_EXTENSIONS:
                audio.append(Path(root, name))
    return sorted(audio)


def colliding_outputs(files: list[tuple[Path, Path]], output_dir: Path) -> dict[Path, str]:
    """The files among `find_audio_files`' that would write the same outputs as another
    (`a/talk.wav` and `b/talk.mp3` given as files, or `talk.wav` beside `talk.flac`), each with
    the reason, naming the others. Every file of a colliding group is named: none of them can
    have outputs of its own there, and which one a run would favour is no rule a user knows."""
    by_stem: dict[Path, list[Path]] = {}
    for path, stem in files:
        by_stem.setdefault(stem, []).append(path)
    reasons: dict[Path, str] = {}
    for stem, paths in by_stem.items():
        if len(paths) > 1:
            for path in paths:
                others = " and ".join(str(p) for p in paths if p != path)
                reasons[path] = (
                    f"{path}: {others} would write the same outputs ({output_dir / stem}.*); "
                    "transcribe them into different output folders"
                )
    return reasons


def check_distinct_outputs(files: list[tuple[Path, Path]], output_dir: Path) -> None:
    """Raises ValueError when two of `find_audio_files`' files would write the same outputs
    (`colliding_outputs`)."""
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
