"""What ffmpeg and ffprobe may open when they read a file: its own bytes, nothing it names.

Some of ffmpeg's input formats are lists of other inputs: an HLS playlist (m3u8) or an
ffconcat list names files by absolute path, and ffmpeg reads and decodes them as if they were
the file's own audio. Uploaded to the API, the web page or the endpoint, a three-line m3u8
naming a recording elsewhere on the server had it transcribed and returned to the uploader.
Every read therefore allows the demuxers of this ffmpeg build less those that open other
inputs (`format_whitelist`), and the file protocol alone (`protocol_whitelist`, which nested
opens inherit). A file of a refused format fails with an error that names it
(`refused_format`). A command-line user with a local playlist joins it into one file first.

Deny, not allow: the build's own demuxer list, less these, keeps every container and codec
ffmpeg reads today (an allowlist would refuse the rare formats users bring).
"""

from __future__ import annotations

import functools
import re
import subprocess

# Demuxers that open inputs other than the file they read: playlists and manifests (hls,
# dash, imf, webm_dash_manifest), lists of files (concat), numbered file sequences (image2),
# network sessions (sdp, rtsp, rtp, sap), scripts (avisynth, vapoursynth). The listing names
# devices (alsa, x11grab, ...) as demuxers too; they stay allowed, harmlessly: ffmpeg opens a
# device only where `-f` names it, never from a file's content.
OPENS_OTHER_INPUTS = frozenset(
    {
        "hls", "dash", "imf", "webm_dash_manifest", "concat", "image2", "sdp", "rtsp", "rtp",
        "sap", "avisynth", "vapoursynth",
    }
)  # fmt: skip

PLAYLIST_REMEDY = "join its parts into one file first (ffmpeg -i LIST -c copy joined.mka)"
_REFUSED = re.compile(r"\[(\w+) @ 0x[0-9a-f]+\](?: \[\w+\])? Format not on whitelist")


# Where this ffmpeg's listing cannot be read (another version's layout), reads keep to the
# containers and codecs people record and film speech in, rather than to none or to all.
COMMON_FORMATS = (
    "wav,w64,mp3,flac,ogg,mov,mp4,m4a,matroska,webm,aac,ac3,eac3,aiff,caf,amr,asf,avi,mpegts,"
    "mpeg,flv,wv,ape,tta,au,dts,truehd,mlp,mpc,mpc8,tak,shn,voc,xwma,dsf,gsm,nut,rm,oma,3gp"
)


@functools.cache
def readable_formats() -> str | None:
    """The comma-separated demuxers a read may use (`format_whitelist`): this build's, less
    `OPENS_OTHER_INPUTS`, or COMMON_FORMATS where its listing is not understood. None where
    ffmpeg does not run (its absence is reported where it is needed). About 0.1 s, once a
    process."""
    try:
        done = subprocess.run(
            ["ffmpeg", "-hide_banner", "-demuxers"], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    demuxers = _demuxers_listed(done.stdout)
    if "wav" not in demuxers:
        return COMMON_FORMATS
    return ",".join(
        name for name in demuxers if not OPENS_OTHER_INPUTS.intersection(name.split(","))
    )


def _demuxers_listed(listing: str) -> list[str]:
    """The names in `ffmpeg -demuxers`' listing: after its "--" line, a flags column ("D",
    "DE", "D."; a device's flag may stand apart) then one demuxer's names
    ("mov,mp4,m4a,3gp,3g2,mj2")."""
    names = []
    for line in listing.split("\n --\n", 1)[-1].splitlines():
        fields = line.split()
        if len(fields) >= 2 and "D" in fields[0] and set(fields[0]) <= set("DEd."):
            names.append(fields[2] if fields[1] == "d" and len(fields) > 2 else fields[1])
    return names


def input_options() -> dict[str, str]:
    """ffmpeg-python's options for an input that ffmpeg or ffprobe reads (see the module)."""
    formats = readable_formats()
    options = {"protocol_whitelist": "file"}
    if formats is not None:
        options["format_whitelist"] = formats
    return options


def refused_format(stderr: str) -> str | None:
    """The demuxer ffmpeg's `stderr` says it refused (`input_options`), e.g. "hls"; else None."""
    match = _REFUSED.search(stderr)
    return None if match is None else match.group(1)
