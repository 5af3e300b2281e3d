"""OpenAI's sequential long-form loop ("seek" windows): each passage's windows one after
another, each prompted with the passage's text so far; the next windows of several passages
(of one recording, or of several recordings) decode as one batch."""

from __future__ import annotations

from dataclasses import dataclass, field

from asr.guards import RepetitionGuard
from asr.segments import WindowSplit
from asr.silence import ONSET_MARGIN_FRAMES, has_no_signal, past_leading_silence, speech_after
from asr.types import ProgressHook, Segment
from asr.whisper import FRAMES_PER_SECOND, N_FRAMES, EncodedAudio
from asr.window_decoder import WindowBatch, WindowResult
from asr.window_session import (
    MIN_TAIL_FRAMES,
    TOO_SHORT_TO_TELL,
    Resumption,
    Session,
    audio_frames,
    consumed_frames,
    decode_by_language,
    encode_together,
    encoded_when_needed,
    is_silent,
    segments_with_content,
    skipped_tail,
    speech_after_a_seam,
    speech_onset,
    window_context,
)

# "seek" windows of this many passages decode as one batch (`asr.passages`).
PASSAGES_PER_PASS = 8


@dataclass
class Passage:
    """Where one passage's sequential decoding stands (`asr.passages`): frames [seek, end) are
    left, `previous` is its text so far that prompts its next window. A passage keeps its own
    record of what was said (`guard`), so that it decodes side by side with others exactly as
    it would alone; its windows have no prompt from another passage to copy."""

    end: int
    seek: int
    previous: list[int]
    last_speech: float  # where its last timed word ended (s)
    guard: RepetitionGuard | None
    segments: list[Segment] = field(default_factory=list)  # decided, in order
    language: str | None = None  # its last spoken window's (multilingual)
    # Its next window's language where the window before heard it in a segment of its own
    # (`WindowSplit.language_after`, multilingual): not told from the whole window again.
    told: str | None = None
    resumed: Resumption | None = None  # where its next window resumes after skipped speech

    @property
    def done(self) -> bool:
        return self.seek >= self.end


# A resumed window's first segment, this short (s) and starting this close to the window's


@dataclass
class _SeekState:
    """Where one recording's "seek" decoding stands: its passages, and its decided windows not
    yet reported (first frame, result, split)."""

    session: Session
    passages: list[Passage]
    decided: list[tuple[int, WindowResult, WindowSplit]] = field(default_factory=list)


def seek_windows(sessions: list[Session], progress: ProgressHook) -> list[list[Segment]]:
    """OpenAI's sequential loop in each passage: each window starts where the previous one's
    text ended, prompted with the passage's text so far. The next windows of up to
    PASSAGES_PER_PASS passages decode as one batch: passages of one recording, or of several
    recordings decoded together (`transcribe_many`; earlier recordings first, a finished
    passage's row taken by the next one), in one language at a time (with `multilingual`,
    windows are encoded first and split by their languages). A passage's windows, its text and
    its timing are the same as when passages and recordings decode one at a time. Returns each
    recording's segments."""
    options = sessions[0].options
    recordings = []
    for session in sessions:
        passages = [
            Passage(
                end=end,
                seek=start,
                previous=list(session.initial_prompt),
                last_speech=start / FRAMES_PER_SECOND,
                guard=session.new_guard(),
            )
            for start, end in session.passages
        ]
        recordings.append(_SeekState(session, passages))
        if len(sessions) > 1 and passages and not options.multilingual:
            # batches hold one language, known up front
            first = passages[0]
            session.detect_language((first.seek, min(first.seek + N_FRAMES, first.end)), False)
    total = sum(session.content_frames for session in sessions)
    while pending := [(r, p) for r in recordings for p in r.passages if not p.done]:
        if not options.multilingual:
            language = pending[0][0].session.language
            pending = [(r, p) for r, p in pending if r.session.language == language]
        active = pending[:PASSAGES_PER_PASS]
        windows = [(p.seek, min(p.seek + N_FRAMES, p.end)) for _, p in active]
        # A window of digital silence is skipped, as a silent one is, without decoding it.
        heard = []
        for (recording, passage), window in zip(active, windows, strict=True):
            if has_no_signal(recording.session.mel, window):
                passage.seek = window[1]
            else:
                heard.append(((recording, passage), window))
        if not heard:
            progress("transcribe", total - _frames_left(recordings), total)
            continue
        heard = _longest_first(heard)
        active, windows = [pair for pair, _ in heard], [window for _, window in heard]
        pieces: list[tuple[Session, list[tuple[int, int]]]] = []
        for (recording, _), window in zip(active, windows, strict=True):
            if not pieces or pieces[-1][0] is not recording.session:
                pieces.append((recording.session, []))
            pieces[-1][1].append(window)
        if all(session.encoding_can_wait() for session, _ in pieces):
            encoded, draft_encoded = encoded_when_needed(pieces, padded=False)
        else:
            encoded, draft_encoded = encode_together(pieces, padded=False)
        owners = [r.session for r, _ in active]
        languages = [
            owner.window_language(
                encoded,
                row,
                passage.told or (passage.language if end - start < TOO_SHORT_TO_TELL else None),
            )
            for row, (owner, (_, passage), (start, end)) in enumerate(
                zip(owners, active, windows, strict=True)
            )
        ]
        told = [passage.told is not None for _, passage in active]
        for _, passage in active:
            passage.told = None
        prompts = [
            r.session.prompt(p.previous, language)
            for (r, p), language in zip(active, languages, strict=True)
        ]
        results = decode_by_language(
            WindowBatch(encoded, tuple(prompts), draft_encoded, tuple(windows)),
            languages,
            seeds=[options.seed + start for start, _ in windows],
            guards=[p.guard for _, p in active],
            owners=owners,
        )
        spoken = [row for row, result in enumerate(results) if not is_silent(result, options)]
        for row in set(range(len(active))) - set(spoken):
            active[row][1].seek = windows[row][1]  # skipped: its text does not become context
            owners[row].note_language_switch(results[row], windows[row][0] / FRAMES_PER_SECOND)
        for recording in {id(r): r for r, _ in active}.values():
            rows = [row for row in spoken if active[row][0] is recording]
            if rows:
                passages = [active[r][1] for r in rows]
                _decided(
                    recording,
                    encoded,
                    rows,
                    passages,
                    windows,
                    results,
                    languages=[languages[r] for r in rows],
                    told=[told[r] for r in rows],
                )
        for recording in recordings:
            _report_decided(recording)
        progress("transcribe", total - _frames_left(recordings), total)
    return [[s for passage in r.passages for s in passage.segments] for r in recordings]


def _longest_first(heard: list[tuple[tuple[_SeekState, Passage], tuple[int, int]]]) -> list:
    """(passage, window) pairs reordered with the longest audio first: rows tend to finish
    shortest first, and a batch whose last rows finish keeps views of its cross-attention
    (`SlotCache.keep_rows`) instead of copying the rest (about 260 MB for 8 windows). A
    recording's windows stay together, to be encoded as one piece. A row's text does not
    depend on its place in the batch."""
    longest: dict[int, int] = {}
    for (recording, _), window in heard:
        frames = audio_frames(recording.session, window)
        longest[id(recording)] = max(longest.get(id(recording), 0), frames)
    first_seen = {key: index for index, key in enumerate(longest)}

    def order(item: tuple[tuple[_SeekState, Passage], tuple[int, int]]) -> tuple:
        (recording, _), window = item
        key = id(recording)
        return (-longest[key], first_seen[key], -audio_frames(recording.session, window))

    return sorted(heard, key=order)


def _frames_left(recordings: list[_SeekState]) -> int:
    return sum(p.end - min(p.seek, p.end) for r in recordings for p in r.passages)


def _decided(
    recording: _SeekState,
    encoded: EncodedAudio,
    rows: list[int],
    owners: list[Passage],
    windows: list[tuple[int, int]],
    results: list[WindowResult],
    languages: list[str | None],
    told: list[bool],
) -> None:
    """Spoken windows of one recording (these rows of the batch, of these passages, in these
    languages; `told`: as `Session.split` takes it) split into segments; each passage moves
    on past what its window used up."""
    session, level = recording.session, recording.session.level
    options = session.options
    decoded = [(results[r], windows[r][0], windows[r][1] - windows[r][0]) for r in rows]
    splits = session.split(
        session.words_view(encoded, rows),
        decoded,
        unfinished=False,
        guards=[passage.guard for passage in owners],
        passages=owners,
        languages=languages,
        told=told,
    )
    spoken = zip(decoded, splits, owners, languages, strict=True)
    for (result, seek, frames), heard, passage, language in spoken:
        # A window's first segment heard in another language: the window is decoded again in
        # it. Text cut before a later one: the passage goes on in that language from there.
        passage.told = heard.language_after
        if heard.decoded_again:
            session.retell(language)
            continue
        if heard.language_after is None and (
            skipped := session.skipped_before_first_segment(heard, seek, frames)
        ):
            # Speech Whisper skipped before the window's first segment: the passage ends
            # there, its next window decoding only the skipped speech, and a new passage
            # (without the text before as its prompt) goes on from that segment.
            after = Passage(
                end=passage.end,
                seek=skipped,
                previous=list(session.initial_prompt),
                last_speech=skipped / FRAMES_PER_SECOND,
                guard=session.new_guard(),
            )
            at = next(i for i, p in enumerate(recording.passages) if p is passage)
            recording.passages.insert(at + 1, after)
            passage.end = skipped
            continue
        split = heard  # its segments as kept; `heard`'s times say where its text ends
        if passage.resumed is not None and passage.resumed.frame == seek:
            split = passage.resumed.without_echo(heard)
        passage.resumed = None
        kept = segments_with_content(split)
        passage.segments.extend(kept)
        passage.language = language
        recording.decided.append((seek, result, split))
        consumed = consumed_frames(heard, seek, passage.end, options.word_timestamps)
        if heard.language_after is not None:  # not from the pause before the other language
            consumed = speech_onset(level, (seek, seek + frames), seek + consumed) - seek
        # A window can close its text seconds before its audio ends although words follow
        # (OpenAI's rule then skips the rest of the window): a padded one (a passage's last)
        # as "silence" chunks do, above all where speech after a pause was packed behind it,
        # and any window where the language changes (Whisper stops at the switch: speech of
        # a second language was lost whole). The passage goes on with those words, from just
        # before the first loud frame after its text (a window that began in the quiet
        # before a cut would time its first segment from there, in the audio before the cut).
        # Or from where speech resumes after a cut-out pause, however quiet: the VAD heard
        # speech there (whispering after JFK's loud sentence, below the window's median level,
        # was lost).
        tail = (
            skipped_tail(heard, seek, frames, session.model.special.eot)
            if consumed >= frames
            else None
        )
        if tail is not None:
            resumptions = []
            if (
                loud := speech_after(level, (seek, seek + frames), tail, MIN_TAIL_FRAMES)
            ) is not None:
                resumptions.append(max(loud - ONSET_MARGIN_FRAMES, tail))
            if (
                after_seam := speech_after_a_seam(session.seam_silences, tail, seek + frames)
            ) is not None:
                resumptions.append(after_seam)
            if resumptions:
                consumed = min(resumptions) - seek
                if said := segments_with_content(heard):
                    passage.resumed = Resumption(seek + consumed, said[-1].text)
        elif heard.resumed_early and (said := segments_with_content(heard)):
            passage.resumed = Resumption(seek + consumed, said[-1].text)
        passage.seek += max(consumed, 1)
        if passage.resumed is None and not passage.done:
            passage.seek = past_leading_silence(level, passage.seek, passage.end, MIN_TAIL_FRAMES)
        # Text sampled hot is a poor prompt: OpenAI resets the context after it.
        if options.condition_on_previous_text and result.prompt_temperature <= 0.5:
            passage.previous.extend(window_context(heard))  # an echo too: the same prompt
        else:
            passage.previous = []


def _report_decided(recording: _SeekState) -> None:
    """Reports a recording's decided windows that are final: no passage of it can still decode
    audio before them."""
    total = recording.session.content_frames
    frontier = min((p.seek for p in recording.passages if not p.done), default=total)
    recording.decided.sort(key=lambda window: window[0])
    while recording.decided and recording.decided[0][0] < frontier:
        seek, result, split = recording.decided.pop(0)
        recording.session.report(result, seek, split)
