"""Independent chunks cut at silences ("silence" windows, `--batch-size`): `batch_size`
chunks per decoding pass, a chunk whose text stops early having its tail decoded again."""

from __future__ import annotations

import bisect
from collections import deque

from asr.guards import RepetitionGuard
from asr.segments import WindowSplit, without_overlaps
from asr.silence import has_no_signal, sounds_like_speech, split_at_silence
from asr.types import ProgressHook, Segment
from asr.whisper import FRAMES_PER_SECOND
from asr.window_decoder import WindowBatch, WindowResult
from asr.window_session import (
    MIN_TAIL_FRAMES,
    MIN_TAIL_SECONDS,
    MIN_TAIL_SECONDS_AT_A_CUT,
    TOO_SHORT_TO_TELL,
    Resumption,
    Session,
    decode_by_language,
    is_silent,
    segments_with_content,
    skipped_tail,
    speech_onset,
)


def silence_windows(session: Session, progress: ProgressHook) -> list[Segment]:
    """Independent chunks cut at silences, `batch_size` windows per decoding pass.

    A window padded with silence can end its text early, with a final timestamp seconds before
    its audio ends, although words follow: that tail is queued as a window of its own (as a
    sequential window would start there), unless it is no louder than a pause. Windows reach
    `on_window` in time order, so a tail is reported before the chunks after it, which were
    decoded first.
    """
    options, total = session.options, session.content_frames
    level = session.level
    chunks = split_at_silence(session.mel, total, session.pause_cuts, fill=not options.multilingual)
    # A chunk of digital silence is skipped, as a silent one is, without decoding it.
    queue = deque(chunk for chunk in chunks if not has_no_signal(session.mel, chunk))
    # What was said, per stretch between long cut-out pauses (`session.pause_cuts`, where the
    # chunks are cut too): a passage's, as in "seek" windows, so that a sentence said again
    # after a long pause is not taken for a copy.
    stretch_guards: dict[int, RepetitionGuard | None] = {}

    def guard_of(start: int) -> RepetitionGuard | None:
        stretch = bisect.bisect_right(session.pause_cuts, start)
        if stretch not in stretch_guards:
            stretch_guards[stretch] = session.new_guard()
        return stretch_guards[stretch]

    segments: list[Segment] = []
    decided: list[tuple[int, WindowResult, WindowSplit]] = []  # not yet reported
    resumed: dict[int, Resumption] = {}  # the tails queued, by their first frame
    # multilingual: windows queued in a language not told from the whole window (heard in
    # their first segment, `WindowSplit.language_after`, or their chunk's), by first frame
    told: dict[int, str] = {}
    reached = 0  # frames reported to `progress`: tails go back, the report does not
    while queue:
        group = [queue.popleft() for _ in range(min(options.batch_size, len(queue)))]
        encoded, draft_encoded = session.encode(group, padded=True)
        given = [start in told for start, _ in group]
        languages = [
            session.window_language(encoded, row, told.pop(start, None))
            for row, (start, _) in enumerate(group)
        ]
        prompts = tuple(session.prompt(session.initial_prompt, code) for code in languages)
        results = decode_by_language(
            WindowBatch(encoded, prompts, draft_encoded, tuple(group)),
            languages,
            seeds=[options.seed + s for s, _ in group],
            guards=[guard_of(start) for start, _ in group],
            owners=[session] * len(group),
        )
        spoken = [
            (row, (result, start, end - start))
            for row, ((start, end), result) in enumerate(zip(group, results, strict=True))
            if not is_silent(result, options)
        ]
        for (start, _), result in zip(group, results, strict=True):
            if is_silent(result, options):
                session.note_language_switch(result, start / FRAMES_PER_SECOND)
        if spoken:
            decoded = [window for _, window in spoken]
            spoken_languages = [languages[row] for row, _ in spoken]
            splits = session.split(
                session.words_view(encoded, [row for row, _ in spoken]),
                decoded,
                unfinished=True,
                languages=spoken_languages,
                guards=[guard_of(start) for _, start, _ in decoded],
                told=[given[row] for row, _ in spoken],
            )
            tails = []
            for (result, start, frames), heard, language in zip(
                decoded, splits, spoken_languages, strict=True
            ):
                if heard.language_after is not None:
                    # Its first segment heard in another language: decoded again in it. A
                    # later one: the audio from where speech resumes after the text before it,
                    # in its own.
                    rest = start
                    if not heard.decoded_again:
                        rest = speech_onset(level, (start, start + frames), start + heard.consumed)
                    told[rest] = heard.language_after
                    tails.append((rest, start + frames))
                    if heard.decoded_again:
                        session.retell(language)
                        continue
                split = resumed.pop(start).without_echo(heard) if start in resumed else heard
                kept = segments_with_content(split)
                segments.extend(kept)
                decided.append((start, result, split))
                if heard.language_after is not None:  # its rest is queued above
                    continue
                at_a_cut = start + frames < total and start + frames not in session.pause_cuts
                least = MIN_TAIL_SECONDS_AT_A_CUT if at_a_cut else MIN_TAIL_SECONDS
                tail = skipped_tail(heard, start, frames, session.model.special.eot, least)
                rest = (tail, start + frames)
                if (
                    tail is not None
                    and sounds_like_speech(level, (start, start + frames), tail, MIN_TAIL_FRAMES)
                    and not has_no_signal(session.mel, rest)
                ):
                    tails.append(rest)
                    resumed[tail] = Resumption(tail, segments_with_content(heard)[-1].text)
                    if options.multilingual and rest[1] - tail < TOO_SHORT_TO_TELL:
                        # too short to tell: its chunk's, as a passage's short last window
                        told[tail] = language
            queue.extendleft(reversed(tails))  # next, in time order
        # Everything before the first window still queued is final.
        decided.sort(key=lambda window: window[0])
        while decided and (not queue or decided[0][0] < queue[0][0]):
            start, result, split = decided.pop(0)
            session.report(result, start, split)
        reached = max(reached, *(end for _, end in group))
        progress("transcribe", reached, total)
    if reached < total:  # the last chunks were digital silence
        progress("transcribe", total, total)
    return without_overlaps(sorted(segments, key=lambda s: (s.start, s.end)))
