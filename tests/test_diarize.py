"""Speaker diarization: options, scoring, the CAM++ network, the embedded Diarizer on real
recordings, and the transcript end to end."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from app.cli import main
from app.service import speaker_count_warning, speakers_holding_words, wordless_speakers_warning
from asr.audio import load_audio
from asr.types import Segment, SpeakerTurn, Transcript, Word
from asr.writers import WRITERS
from diarize.pipeline import (
    DiarizeOptions,
    EmbeddedParams,
    speaker_names,
    turns_from_annotation,
)
from diarize.scoring import read_rttm, score, to_annotation
from tests.conftest import SAMPLES, SHARED_SPEECH, needs_speech

SAMPLE = SAMPLES / "pyannote_sample.wav"
AMI = SHARED_SPEECH / "multi" / "ami_es2004_1min_mixture.wav"
# Stated thresholds (pyannote.metrics, collar 0, overlap scored), a little above what the tuned
# defaults measure (5.6 % and 13.3 %, bench/diarize.py); the targets were 5 % and 10 %.
MAX_SAMPLE_DER = 0.06
MAX_AMI_DER = 0.15


def test_options_are_validated():
    assert DiarizeOptions(min_speakers=2, max_speakers=4).validate()
    with pytest.raises(ValueError, match="num_speakers excludes"):
        DiarizeOptions(num_speakers=2, max_speakers=3).validate()
    with pytest.raises(ValueError, match=r"min_speakers \(5\) exceeds max_speakers \(2\)"):
        DiarizeOptions(min_speakers=5, max_speakers=2).validate()
    with pytest.raises(ValueError, match=r"num_speakers must be in 1\.\.100"):
        DiarizeOptions(num_speakers=0).validate()
    with pytest.raises(ValueError, match=r"max_speakers must be in 1\.\.100, got 256"):
        DiarizeOptions(max_speakers=256).validate()  # pyannote's 8-bit counts would overflow
    with pytest.raises(ValueError, match="threshold"):
        EmbeddedParams(threshold=2.5).validate()
    with pytest.raises(ValueError, match="min_embedding_speech"):
        EmbeddedParams(min_embedding_speech=11.0).validate()


@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") != "1", reason="would reach the hub")
def test_hub_pipeline_offline_is_a_clear_error():
    from diarize.pipeline import Diarizer

    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=0"):
        Diarizer.from_pretrained("pyannote/speaker-diarization-community-1")


def test_a_local_pipeline_that_is_not_there_is_a_clear_error(tmp_path):
    from diarize.pipeline import Diarizer

    with pytest.raises(ValueError, match="no such pipeline folder or file"):
        Diarizer.from_pretrained(str(tmp_path / "missing" / "pipeline"))
    with pytest.raises(ValueError, match=r"holds no pyannote pipeline \(config.yaml\)"):
        Diarizer.from_pretrained(str(tmp_path))


def test_turns_are_sorted_filtered_and_named_by_first_appearance():
    turns = [
        SpeakerTurn(5.0, 6.0, "7"),
        SpeakerTurn(1.0, 3.0, "3"),
        SpeakerTurn(2.0, 2.05, "9"),  # shorter than min_duration_on
        SpeakerTurn(4.0, 4.5, "3"),
    ]
    result = turns_from_annotation(to_annotation(turns), min_duration_on=0.1)
    assert result == (
        SpeakerTurn(1.0, 3.0, "SPEAKER_00"),
        SpeakerTurn(4.0, 4.5, "SPEAKER_00"),
        SpeakerTurn(5.0, 6.0, "SPEAKER_01"),
    )
    # An exclusive annotation of the same recording keeps the names of the overlap-aware one,
    # even where it starts with another speaker.
    names = speaker_names(to_annotation(turns), min_duration_on=0.1)
    exclusive = [SpeakerTurn(0.5, 1.0, "7"), SpeakerTurn(1.0, 3.0, "3")]
    assert turns_from_annotation(to_annotation(exclusive), 0.1, names) == (
        SpeakerTurn(0.5, 1.0, "SPEAKER_01"),
        SpeakerTurn(1.0, 3.0, "SPEAKER_00"),
    )


def test_der_scoring_on_the_reference():
    reference = read_rttm(SAMPLES / "pyannote_sample.rttm")
    assert len({t.speaker for t in reference}) == 2
    assert score(reference, reference, 30.0).rate == 0.0
    assert score(reference, (), 30.0).rate == pytest.approx(1.0)  # all missed
    swapped = [SpeakerTurn(t.start, t.end, "A") for t in reference]
    assert 0.2 < score(reference, swapped, 30.0).rate < 0.8  # one speaker: confusion


@pytest.mark.slow
def test_campplus_loads_and_separates_the_two_speakers(registry):
    import torch

    from diarize.campplus import load_campplus

    network = load_campplus(registry.resolve("campplus-sv-zh-en"))  # strict state dict
    samples = torch.from_numpy(load_audio(SAMPLE))
    reference = read_rttm(SAMPLES / "pyannote_sample.rttm")
    by_speaker: dict[str, list[torch.Tensor]] = {}
    for turn in reference:
        if turn.end - turn.start >= 1.5:
            clip = samples[int(turn.start * 16_000) : int(turn.end * 16_000)]
            by_speaker.setdefault(turn.speaker, []).append(clip)
    speakers = [speaker for speaker, clips in by_speaker.items() for _ in clips]
    with torch.inference_mode():
        vectors = torch.cat(
            [network(clip[None]) for clips in by_speaker.values() for clip in clips]
        )
    assert vectors.shape == (len(speakers), 192)
    similarity = (lambda v: v @ v.T)(torch.nn.functional.normalize(vectors, dim=-1))
    same = torch.tensor([[a == b for b in speakers] for a in speakers])
    off_diagonal = ~torch.eye(len(speakers), dtype=torch.bool)
    # Reference turns overlap a little, so compare averages, and each clip's nearest other clip.
    assert similarity[same & off_diagonal].mean() > similarity[~same].mean() + 0.2
    nearest = similarity.masked_fill(~off_diagonal, -2.0).argmax(dim=1)
    assert all(speakers[i] == speakers[j] for i, j in enumerate(nearest.tolist()))


@pytest.mark.slow
def test_block_embeddings_match_pyannotes_per_chunk_ones(registry, diarizer):
    import torch

    from diarize.pipeline import EmbeddedSpeakerDiarization, audio_file

    model = diarizer.pipeline._embedding.model_
    segmentation = registry.resolve("pyannote-segmentation-3.0")
    one, many = (
        EmbeddedSpeakerDiarization(segmentation, model, 0.2, False, chunks_per_block=block)
        for block in (1, 32)
    )
    file = audio_file(load_audio(SAMPLE))
    masks = one.get_segmentations(file)
    per_chunk, blocked = one.get_embeddings(file, masks), many.get_embeddings(file, masks)

    # One chunk per block is exactly pyannote's own loop: the network on the 10 s chunk,
    # pooled under each speaker's mask.
    chunk = 5
    waveform, _ = one._audio.crop(file, masks.sliding_window[chunk], mode="pad")
    for speaker in range(3):
        mask = torch.from_numpy(np.nan_to_num(masks.data[chunk, :, speaker]).astype(np.float32))
        if mask.sum() > 0:
            expected = one._embedding(waveform[None], masks=mask[None])[0]
            np.testing.assert_allclose(per_chunk[chunk, speaker], expected, atol=1e-4)
    # Longer blocks change only the context the network sees.
    valid = ~np.isnan(per_chunk).any(-1)
    assert np.array_equal(valid, ~np.isnan(blocked).any(-1)) and valid.sum() > 10
    a, b = per_chunk[valid], blocked[valid]
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cosine.mean() > 0.95 and cosine.min() > 0.8


@pytest.mark.slow
def test_embedded_diarizer_on_the_pyannote_sample(diarizer):
    stages: dict[str, tuple[int, int]] = {}
    turns = diarizer.diarize(
        load_audio(SAMPLE),
        progress=lambda stage, done, total: stages.update({stage: (done, total)}),
    )

    reference = read_rttm(SAMPLES / "pyannote_sample.rttm")
    assert score(reference, turns, 30.0).rate < MAX_SAMPLE_DER
    assert {t.speaker for t in turns} == {"SPEAKER_00", "SPEAKER_01"}
    assert turns[0].speaker == "SPEAKER_00"
    assert list(turns) == sorted(turns, key=lambda t: (t.start, t.end, t.speaker))
    assert all(0.0 <= t.start < t.end <= 30.0 for t in turns)
    for stage in ("diarize segmentation", "diarize embeddings"):
        done, total = stages[stage]
        assert done == total > 0


@pytest.mark.slow
def test_the_speakers_do_not_hang_on_the_recordings_level(diarizer):
    # 3 dB louder (what a stereo file of two identical channels mixes to), the sample lost a
    # speaker: its filterbanks' floored values (digital silence) stayed while the rest moved.
    import torch

    from diarize.campplus import CAMPPlus

    samples = load_audio(SAMPLE)
    quiet, loud = (CAMPPlus.fbank(torch.from_numpy(samples * g)[None]) for g in (0.5, 2**0.5))
    torch.testing.assert_close(quiet, loud, rtol=0, atol=1e-3)
    reference = read_rttm(SAMPLES / "pyannote_sample.rttm")
    for gain in (0.5, 2**0.5, 4.0):
        turns = diarizer.diarize((samples * gain).astype(np.float32))
        assert {t.speaker for t in turns} == {"SPEAKER_00", "SPEAKER_01"}, gain
        assert score(reference, turns, 30.0).rate < MAX_SAMPLE_DER, gain


@pytest.mark.slow
def test_oracle_clustering_bound_on_the_pyannote_sample(registry, diarizer):
    from bench.diarize import oracle_diarizer, oracle_turns

    samples = load_audio(SAMPLE)
    reference = read_rttm(SAMPLES / "pyannote_sample.rttm")
    bound = oracle_turns(oracle_diarizer(registry), samples, reference)
    # The oracle names its speakers after the reference's (renamed SPEAKER_00.. by first turn)
    # and, with every local speaker given the right one, confuses less than our clustering.
    assert len({t.speaker for t in bound}) == 2
    bound_score = score(reference, bound, 30.0)
    ours_score = score(reference, diarizer.diarize(samples), 30.0)
    assert bound_score.confusion < ours_score.confusion
    assert bound_score.rate <= ours_score.rate


@pytest.mark.slow
def test_speaker_counts_are_obeyed(diarizer):
    one = diarizer.diarize(load_audio(SAMPLE), DiarizeOptions(num_speakers=1))
    assert {t.speaker for t in one} == {"SPEAKER_00"}
    if AMI.exists():
        at_most_two = diarizer.diarize(load_audio(AMI), DiarizeOptions(max_speakers=2))
        assert len({t.speaker for t in at_most_two}) == 2


@pytest.mark.slow
def test_silence_has_no_turns(diarizer):
    assert diarizer.diarize(np.zeros(5 * 16_000, dtype=np.float32)) == ()


@pytest.mark.slow
@pytest.mark.skipif(not AMI.exists(), reason="needs ../shared/speech")
def test_turns_end_with_the_recording(diarizer):
    # pyannote pads its last 10 s chunk past the end: on this 30 s AMI chunk a turn ran from
    # 30.659 s to 30.963 s, after the audio.
    samples = load_audio(SHARED_SPEECH / "multi" / "ami_pyannote_debug" / "trn00.flac")
    duration = len(samples) / 16_000
    turns = diarizer.diarize(samples)
    assert turns and max(turn.end for turn in turns) <= duration
    assert max(turn.end for turn in turns) > duration - 1.0  # they talk to the end


@pytest.mark.slow
@pytest.mark.skipif(not AMI.exists(), reason="needs ../shared/speech")
def test_ami_mixture_end_to_end(diarizer, whisper_base):
    from asr.transcribe import transcribe
    from bench.diarize import cpwer
    from diarize.merge import assign_speakers

    samples = load_audio(AMI)
    turns = diarizer.diarize(samples)
    assert score(read_rttm(AMI.with_suffix(".rttm")), turns, 60.0).rate < MAX_AMI_DER
    assert len({t.speaker for t in turns}) == 4

    transcript = transcribe(whisper_base, samples)
    segments = assign_speakers(transcript.segments, turns)
    assert [s.text for s in segments] == [s.text for s in transcript.segments]
    # Whisper gives no word times yet, so whole segments are assigned: the fourth speaker
    # (1.2 s of speech in all) never holds a segment of their own.
    assert {s.speaker for s in segments} <= {t.speaker for t in turns}
    assert len({s.speaker for s in segments}) >= 3
    # Words grouped by speaker against the per-speaker reference: far below one speaker (1.18).
    assert cpwer(segments, one_speaker=False)["cpwer"] < 0.25


@pytest.mark.slow
def test_cli_writes_speaker_labels_and_says_when_the_count_asked_is_not_found(tmp_path, capsys):
    # The wiring only (the AMI test above covers several speakers): 11 s, one speaker, so
    # three speakers cannot be found and the user is told so.
    command = ["transcribe", str(SAMPLES / "jfk.wav"), "--diarize", "--num-speakers", "3"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*command, "--output-dir", str(tmp_path), "--format", "txt,rttm,json"]) == 0
    # pyannote's own warning (printed as a stray "warnings.warn(" line) is ours to give.
    assert not [w for w in caught if "detected number of speakers" in str(w.message)]
    rttm = read_rttm(tmp_path / "jfk.rttm")
    assert rttm and {t.speaker for t in rttm} == {"SPEAKER_00"}
    assert (tmp_path / "jfk.txt").read_text().startswith("[SPEAKER_00] ")
    saved = json.loads((tmp_path / "jfk.json").read_text())
    assert saved["options"]["diarize"]["num_speakers"] == 3
    # Words were timed to assign speakers, but not asked for: the output has none.
    assert saved["options"]["word_timestamps"] is False
    assert saved["segments"] and all(s["words"] == [] for s in saved["segments"])
    shortfall = "exactly 3 speakers were asked for; 1 found in the audio"
    assert saved["warnings"] == [shortfall]
    captured = capsys.readouterr()
    assert f"warning: {SAMPLES / 'jfk.wav'}: {shortfall}" in captured.err
    assert "Found only" not in captured.out  # pyannote's print() kept off the transcript
    assert "\n[SPEAKER_00] And so my fellow Americans" in captured.out  # printed labelled


def test_a_speaker_count_not_met_is_described():
    assert speaker_count_warning(DiarizeOptions(num_speakers=2), 2) is None
    assert speaker_count_warning(DiarizeOptions(min_speakers=2, max_speakers=4), 3) is None
    assert speaker_count_warning(DiarizeOptions(), 7) is None
    assert "exactly 3 speakers" in speaker_count_warning(DiarizeOptions(num_speakers=3), 2)
    assert "at least 3 speakers" in speaker_count_warning(DiarizeOptions(min_speakers=3), 1)
    assert "at most 2 speakers" in speaker_count_warning(DiarizeOptions(max_speakers=2), 3)


def test_rttm_holds_the_diarizers_turns_overlaps_included(tmp_path):
    turns = (SpeakerTurn(0.0, 3.0, "SPEAKER_00"), SpeakerTurn(2.0, 4.5, "SPEAKER_01"))
    # The transcript's segments say who holds the words; the rttm says who speaks when.
    segments = (Segment(0.0, 4.5, " Hi there.", speaker="SPEAKER_00"),)
    transcript = Transcript(segments, "en", 5.0, turns=turns)
    text = WRITERS["rttm"](transcript, "my talk")
    assert text.splitlines() == [
        "SPEAKER my_talk 1 0.000 3.000 <NA> <NA> SPEAKER_00 <NA> <NA>",
        "SPEAKER my_talk 1 2.000 2.500 <NA> <NA> SPEAKER_01 <NA> <NA>",
    ]
    (tmp_path / "my_talk.rttm").write_text(text)
    assert read_rttm(tmp_path / "my_talk.rttm") == turns
    # The file id is one field whatever whitespace the name holds (a tab split it in two).
    tabbed = WRITERS["rttm"](transcript, "meeting\troom 2\nb")
    assert [line.split()[1] for line in tabbed.splitlines()] == ["meeting_room_2_b"] * 2


def test_a_clipped_request_keeps_only_the_turns_of_its_clip_ranges():
    from diarize.pipeline import Diarization

    turns = (SpeakerTurn(0.0, 3.0, "SPEAKER_00"), SpeakerTurn(2.0, 9.0, "SPEAKER_01"))
    diarization = Diarization(turns, turns[:1])
    assert diarization.within(None) is diarization
    clipped = diarization.within(((1.0, 2.5), (8.0, float("inf"))))
    assert clipped.turns == (
        SpeakerTurn(1.0, 2.5, "SPEAKER_00"),
        SpeakerTurn(2.0, 2.5, "SPEAKER_01"),
        SpeakerTurn(8.0, 9.0, "SPEAKER_01"),
    )
    assert clipped.exclusive == (SpeakerTurn(1.0, 2.5, "SPEAKER_00"),)
    assert diarization.within(((20.0, 30.0),)).turns == ()
    # Named again in order of first speech inside the ranges: SPEAKER_00 is heard only before
    # them, and the names had a gap (SPEAKER_01, SPEAKER_03 and no SPEAKER_02 in a clip).
    later = Diarization(
        (*turns, SpeakerTurn(9.0, 12.0, "SPEAKER_03")), (SpeakerTurn(10.0, 12.0, "SPEAKER_03"),)
    )
    assert later.within(((8.5, 20.0),)).turns == (
        SpeakerTurn(8.5, 9.0, "SPEAKER_00"),
        SpeakerTurn(9.0, 12.0, "SPEAKER_01"),
    )
    assert later.within(((8.5, 20.0),)).exclusive == (SpeakerTurn(10.0, 12.0, "SPEAKER_01"),)


def test_a_stretchs_diarization_moves_onto_the_recordings_timeline():
    from asr.vad import SpeechProbability
    from diarize.pipeline import Diarization

    turn = SpeakerTurn(1.0, 3.0, "SPEAKER_00")
    stretch = Diarization((turn,), (turn,), SpeechProbability(np.zeros(3), 0.02, 0.01))
    assert stretch.shifted(0.0) is stretch
    moved = stretch.shifted(20.0)
    assert moved.turns == moved.exclusive == (SpeakerTurn(21.0, 23.0, "SPEAKER_00"),)
    assert moved.speech.offset == pytest.approx(20.01)


def test_passes_tell_the_audio_they_were_made_over():
    # A kept file's passes over the whole minute must not be clustered for a clip of it.
    from diarize.passes import SpeakerPasses

    def passes(chunks: int) -> SpeakerPasses:
        return SpeakerPasses(np.zeros((chunks, 589, 3)), (0.0, 10.0, 1.0), np.zeros((chunks, 3, 2)))

    assert passes(51).cover(60.0) and not passes(51).cover(25.0)
    assert passes(16).cover(25.0) and passes(4).cover(12.5) and passes(1).cover(3.0)


@pytest.mark.slow
@needs_speech
def test_speaker_counts_describe_the_clip_ranges_transcribed(settings):
    # Two speakers asked for in 20-45 s of the AMI meeting (FEE013 until 29.8 s, then FEE016)
    # were counted over the whole minute: both went to people mostly outside the clip, and
    # every word of it to one speaker.
    from app.service import ServiceOptions, TranscriptionService

    service = TranscriptionService(settings)
    options = ServiceOptions(
        language="en", num_speakers=2, clip_timestamps="20-45", word_timestamps=True
    )
    transcript = service.run(load_audio(AMI), options)
    words = [w for segment in transcript.segments for w in segment.words]
    assert words and words[0].start >= 20.0 and words[-1].end <= 45.0
    assert {w.speaker for w in words} == {"SPEAKER_00", "SPEAKER_01"}
    before = {w.speaker for w in words if w.end < 29.0}
    after = {w.speaker for w in words if w.start > 31.0}
    assert before == {"SPEAKER_00"} and after == {"SPEAKER_01"}
    assert {t.speaker for t in transcript.turns} == {"SPEAKER_00", "SPEAKER_01"}
    assert all(t.start >= 20.0 and t.end <= 45.0 for t in transcript.turns)


def test_speakers_without_words_are_named():
    turns = (
        SpeakerTurn(0.0, 3.0, "SPEAKER_00"),
        SpeakerTurn(2.0, 2.5, "SPEAKER_01"),
        SpeakerTurn(3.0, 6.0, "SPEAKER_02"),
    )
    words = (Word(0.0, 1.0, " Hi", 0.9, "SPEAKER_00"), Word(3.0, 4.0, " yes", 0.9, "SPEAKER_02"))
    segments = (Segment(0.0, 4.0, " Hi yes", words=words, speaker="SPEAKER_00"),)
    holding = speakers_holding_words(segments)
    assert holding == {"SPEAKER_00", "SPEAKER_02"}  # by word, not by segment
    assert wordless_speakers_warning(turns, holding) == (
        "3 speakers found in the audio, 2 hold words of the transcript; no words for "
        "SPEAKER_01 (0.5 s of speech) (their turns are with the others': rttm, json's turns, "
        "verbose_json's speakers)"
    )
    assert wordless_speakers_warning(turns[:1], {"SPEAKER_00"}) is None
    two = (turns[0], turns[1])
    assert wordless_speakers_warning(two, {"SPEAKER_00"}).startswith(
        "2 speakers found in the audio, 1 holds words of the transcript; no words for SPEAKER_01"
    )


@pytest.mark.slow
@pytest.mark.skipif(not AMI.exists(), reason="needs ../shared/speech")
def test_cli_rttm_scores_as_the_diarizers_own_turns(tmp_path, diarizer):
    # The AMI mixture overlaps heavily: the rttm is the diarizer's annotation, overlaps and
    # all, so it scores exactly the diarizer's DER, whatever the transcript's segments are.
    command = ["transcribe", str(AMI), "--diarize", "--language", "en"]
    assert main([*command, "--output-dir", str(tmp_path), "--format", "rttm,json"]) == 0
    written = read_rttm(tmp_path / f"{AMI.stem}.rttm")
    turns = diarizer.diarize(load_audio(AMI))
    assert len(written) == len(turns)
    for ours, theirs in zip(written, sorted(turns, key=lambda t: (t.start, t.end)), strict=True):
        assert ours.speaker == theirs.speaker  # times written to the millisecond
        assert (ours.start, ours.end) == pytest.approx((theirs.start, theirs.end), abs=2e-3)
    assert any(
        a.speaker != b.speaker and a.start < b.end and b.start < a.end
        for a in written
        for b in written
    )  # overlapping speech is kept
    reference = read_rttm(AMI.with_suffix(".rttm"))
    assert score(reference, written, 60.0).rate == pytest.approx(
        score(reference, turns, 60.0).rate, abs=1e-3
    )
    saved = json.loads((tmp_path / f"{AMI.stem}.json").read_text())
    assert saved["stats"]["speakers"] == len({t.speaker for t in turns})
    assert saved["stats"]["speakers_with_words"] <= saved["stats"]["speakers"]
    if saved["stats"]["speakers_with_words"] < saved["stats"]["speakers"]:
        assert any("hold words" in warning for warning in saved["warnings"])


def test_der_can_leave_overlap_out_and_pools_a_set():
    from bench.diarize import set_totals

    reference = (SpeakerTurn(0.0, 4.0, "A"), SpeakerTurn(3.0, 5.0, "B"))  # both speak at 3-4 s
    hypothesis = (SpeakerTurn(0.0, 5.0, "x"),)  # one speaker throughout
    # B missed in the overlap (1 s) and confused at 4-5 s (1 s), of 6 s of reference speech;
    # without the overlap, the confusion alone of 4 s.
    assert score(reference, hypothesis, 5.0).rate == pytest.approx(2 / 6)
    assert score(reference, hypothesis, 5.0, skip_overlap=True).rate == pytest.approx(1 / 4)
    # A set pools seconds: the same file once wrong and once right halves the rate.
    totals = set_totals(
        {"a": reference, "b": reference}, {"a": hypothesis, "b": reference}, {"a": 5.0, "b": 5.0}
    )
    assert totals["der_collar_0.0"] == pytest.approx(2 / 12, abs=1e-4)
    assert totals["der_no_overlap"] == pytest.approx(1 / 8, abs=1e-4)


def test_word_times_computed_for_speakers_only_are_left_out():
    from app.service import _without_words, _words_removed
    from asr.types import DecidedWindow

    words = (Word(0.0, 1.0, " Hi", 0.9, "SPEAKER_00"), Word(1.0, 2.0, " you", 0.9, "SPEAKER_00"))
    segment = Segment(0.0, 2.0, " Hi you", words=words, speaker="SPEAKER_00")
    transcript = Transcript((segment,), "en", 2.0, options={"word_timestamps": True})
    plain = _words_removed(transcript)
    assert plain.segments == (Segment(0.0, 2.0, " Hi you", speaker="SPEAKER_00"),)
    assert plain.options == {"word_timestamps": False}
    assert transcript.segments[0].words == words  # input untouched

    seen = []
    hook = _without_words(seen.append)
    hook(DecidedWindow(0, 0.0, 1.0, (segment,), ((1, 2),)))
    assert seen[0].segments[0].words == () and seen[0].tokens == ((1, 2),)
    assert _without_words(None) is None


@pytest.mark.slow
@pytest.mark.skipif(not AMI.exists(), reason="needs ../shared/speech")
def test_service_splits_segments_where_the_exclusive_speaker_changes(settings):
    # Through the service as `--diarize --word-timestamps` runs it: no output segment holds a
    # run of words that the exclusive diarization gives another speaker, beyond a fragment of
    # a sentence (diarize.merge.Fragment); and cpWER against the per-speaker words stays where
    # measured.
    from app.service import ServiceOptions, TranscriptionService
    from bench.speaker_wer import cpwer, reference_words
    from diarize.merge import Fragment, assign_speakers

    service = TranscriptionService(settings)
    samples = load_audio(AMI)
    transcript = service.run(samples, ServiceOptions(diarize=True, word_timestamps=True))
    diarization = service.diarizer.diarization(samples)
    exclusive = diarization.exclusive
    fragment = Fragment()
    # A timed word starts where the diarizer hears someone, or has no turn starting inside it.
    for word in (w for segment in transcript.segments for w in segment.words):
        spoken = any(t.start <= word.start < t.end for t in diarization.turns)
        assert spoken or not any(word.start < t.start < word.end for t in diarization.turns)
    for segment in transcript.segments:
        assert segment.words and {w.speaker for w in segment.words} == {segment.speaker}
        per_word = assign_speakers([segment], exclusive, fragment=None)
        others = [piece for piece in per_word if piece.speaker != segment.speaker]
        assert all(fragment.holds(piece.words) for piece in others), segment.text
    # Measured 0.1681 (39 errors in 232 words) with fragments taken by sentence, 0.1767 (41)
    # by segment, when "And symbols" went to the wrong speaker (docs/diarization.md). Word
    # times move with the precision and its kernels: a word or two either way.
    assert cpwer(reference_words(AMI.stem), transcript.segments)["cpwer"] < 0.18
