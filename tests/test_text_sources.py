"""Text sources on generated media: subtitle files and streams, burnt-in text, speech.

Subtitle streams are muxed in with FFmpeg (imageio-ffmpeg's binary), burnt-in text is drawn
with Pillow in DejaVu Sans, speech is synthesised by espeak-ng (Debian packages; make test
installs them), OCR is Debian's Tesseract, speech recognition PocketSphinx's own English
model.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from dicosa.text.audio import audio_chunks
from dicosa.text.lines import assign, spans_of
from dicosa.text.ocr import screen_lines
from dicosa.text.speech import (
    SpeechModelError,
    group_words,
    make_recognizer,
    merge_spans,
    speech_lines,
)
from dicosa.text.subtitles import decode_text, sidecars, subtitle_lines

from ._system import needs
from ._text_media import mux_subtitles, say, silence, write_clip

SRT = ("1\n00:00:01,000 --> 00:00:02,000\nThe treasure is under the <i>oak</i>\n\n"
       "2\n00:00:02,500 --> 00:00:03,500\nSecond line\n")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A 4 s clip without sound."""
    return write_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 4.0, size=(64, 48))


# -- spans and assignment -----------------------------------------------------------------------
def test_spans_of_whole_videos_and_segments():
    """Rows without start/end columns cover 0..duration (unknown: infinity); with them, their
    segment (a missing cell falls back to the whole video)."""
    whole = pd.DataFrame({"path": ["/a.mp4", "/b.mp4"], "duration": [12.5, np.nan]})
    paths, start, end = spans_of(whole)
    assert paths == ["/a.mp4", "/b.mp4"]
    assert start.tolist() == [0.0, 0.0] and end.tolist() == [12.5, np.inf]
    segments = pd.DataFrame({"path": ["/a.mp4"] * 3, "duration": [30.0] * 3,
                             "video": [0, 0, 0], "start": [0.0, 10.0, np.nan],
                             "end": [10.0, 20.0, np.nan]})
    _, start, end = spans_of(segments)
    assert start.tolist() == [0.0, 10.0, 0.0] and end.tolist() == [10.0, 20.0, 30.0]


def test_a_line_belongs_to_every_row_it_overlaps():
    start, end = np.array([0.0, 10.0, 20.0, 8.0]), np.array([10.0, 20.0, 30.0, 12.0])
    assert assign(2.0, 4.0, start, end).tolist() == [0]  # inside one row
    assert assign(9.0, 12.0, start, end).tolist() == [0, 1, 3]  # 1 s, 2 s and 3 s of it
    assert assign(5.0, 25.0, start, end).tolist() == [0, 1, 2, 3]  # over all four
    assert assign(9.9, 15.0, start, end).tolist() == [1, 3]  # 0.1 s into row 0: jitter
    assert assign(9.9, 10.1, start, end).tolist() == [0, 1, 3]  # a short line: half of it
    assert assign(10.0, 10.0, start, end).tolist() == [0, 1, 3]  # an instant: every holder
    assert assign(40.0, 41.0, start, end).tolist() == []  # past every row
    # a 10-s cue over four 3-s segments reaches all four, read together or one by one
    start, end = np.array([0.0, 3.0, 6.0, 9.0]), np.array([3.0, 6.0, 9.0, 12.0])
    assert assign(1.0, 11.0, start, end).tolist() == [0, 1, 2, 3]
    assert [assign(1.0, 11.0, start[i:i + 1], end[i:i + 1]).tolist() for i in range(4)] == [
        [0]] * 4


# -- subtitles ----------------------------------------------------------------------------------
def test_sidecars_beside_a_video(tmp_path):
    video = write_clip(tmp_path / "film.mp4", 1.0, size=(32, 32))
    write_clip(tmp_path / "film.part2.mp4", 1.0, size=(32, 32))
    for name in ("film.srt", "film.en.vtt", "film.pt-BR.forced.ass", "film.part2.srt",
                 "film.a.b.c.srt", "filmx.srt", "film.txt"):
        (tmp_path / name).write_text(SRT)
    assert [p.name for p in sidecars(video)] == ["film.en.vtt", "film.pt-BR.forced.ass",
                                                 "film.srt"]
    assert [p.name for p in sidecars(tmp_path / "film.part2.mp4")] == ["film.part2.srt"]


def test_sidecar_lines_at_their_cue_times(clip, tmp_path):
    video = tmp_path / "v.mp4"
    video.write_bytes(clip.read_bytes())
    (tmp_path / "v.srt").write_text(SRT)
    lines, report = subtitle_lines(video)
    assert [(ln.start, ln.end, ln.text) for ln in lines] == [
        (1.0, 2.0, "The treasure is under the oak"), (2.5, 3.5, "Second line")]
    assert {ln.source for ln in lines} == {"subtitles"} and report.lines == 2
    assert report.found == 1 and not report.skipped


@pytest.mark.parametrize("codec,suffix", [("srt", ".mkv"), ("mov_text", ".mp4"),
                                          ("webvtt", ".mkv"), ("ass", ".mkv")])
def test_embedded_subtitle_streams(clip, tmp_path, codec, suffix):
    """A stream muxed into the file is read at its cue times; the sidecar of the same cues
    beside it is not counted twice."""
    source = tmp_path / "cues.srt"
    source.write_text(SRT)
    video = mux_subtitles(clip, source, tmp_path / f"muxed{suffix}", codec)
    lines, report = subtitle_lines(video)
    assert [(round(ln.start, 3), round(ln.end, 3), ln.text) for ln in lines] == [
        (1.0, 2.0, "The treasure is under the oak"), (2.5, 3.5, "Second line")]
    (tmp_path / f"muxed{'.srt'}").write_text(SRT)
    again, report = subtitle_lines(video)
    assert len(again) == 2 and report.skipped["duplicate cues"] == 2


def test_encodings_latin1_and_bom(clip, tmp_path):
    text = "1\n00:00:01,000 --> 00:00:02,000\nCafé à Noël\n"
    assert decode_text(text.encode("latin-1")) == (text, "cp1252")
    assert decode_text(b"\xef\xbb\xbf" + text.encode()) == (text, "utf-8-sig")
    assert decode_text(text.encode("utf-16")) == (text, "utf-16")
    for name, data in (("latin", text.encode("latin-1")),
                       ("bom", b"\xef\xbb\xbf" + text.encode())):
        video = tmp_path / f"{name}.mp4"
        video.write_bytes(clip.read_bytes())
        (tmp_path / f"{name}.srt").write_bytes(data)
        assert [ln.text for ln in subtitle_lines(video)[0]] == ["Café à Noël"]


def test_bad_cues_are_counted_by_reason(clip, tmp_path):
    """Out of order and overlapping cues are kept (sorted); a broken timestamp, an empty cue,
    one ending before it starts and one after the video's end (4 s) are skipped and counted;
    one running past the end is cut there."""
    video = tmp_path / "bad.mp4"
    video.write_bytes(clip.read_bytes())
    (tmp_path / "bad.srt").write_text(
        "1\n00:00:03,000 --> 00:00:03,500\nlate\n\n"
        "2\n00:00:01,000 --> 00:00:02,500\nearly\n\n"
        "3\n00:00:02,000 --> 00:00:03,000\noverlapping\n\n"
        "4\n00:00:0x,000 --> 00:00:02,000\nbroken\n\n"
        "5\n00:00:01,000 --> 00:00:02,000\n\n\n"
        "6\n00:00:02,000 --> 00:00:01,000\nbackwards\n\n"
        "7\n00:00:09,000 --> 00:00:10,000\nafter the end\n\n"
        "8\n00:00:03,800 --> 00:00:09,000\nrunning over\n")
    lines, report = subtitle_lines(video)
    assert [(ln.start, ln.end, ln.text) for ln in lines] == [
        (1.0, 2.5, "early"), (2.0, 3.0, "overlapping"), (3.0, 3.5, "late"),
        (3.8, pytest.approx(4.0, abs=0.11), "running over")]
    assert report.skipped == {"cues with unreadable timestamps": 1, "empty cues": 1,
                              "cues ending before they start": 1,
                              "cues after the video's end": 1}


@pytest.mark.parametrize("content,reason", [
    (b"", "empty files"), (b"   \n\n", "empty files"),
    (b"this is not a subtitle file\n", "files without a readable cue"),
    (b"\x00\x01\x02\xff\xfe garbage", "files without a readable cue")])
def test_unusable_files_are_a_counted_skip(clip, tmp_path, content, reason):
    video = tmp_path / "v.mp4"
    video.write_bytes(clip.read_bytes())
    (tmp_path / "v.srt").write_bytes(content)
    lines, report = subtitle_lines(video)
    assert lines == [] and report.skipped == {reason: 1}
    assert all("\n" not in note for note in report.notes)


def test_a_video_that_does_not_open_keeps_its_sidecar(tmp_path):
    video = tmp_path / "broken.mp4"
    video.write_bytes(b"not a video")
    (tmp_path / "broken.srt").write_text(SRT)
    lines, report = subtitle_lines(video)
    assert len(lines) == 2 and len(report.notes) == 1


# -- on-screen text -----------------------------------------------------------------------------
@needs("tesseract", "fonts")
def test_burnt_in_text_is_read_at_its_time(tmp_path):
    """'GATE 42' drawn over 2.5-6 s of a 6 s clip: OCR on 3 frames (at 1, 3, 5 s) reads it
    on the last two, one line over their parts (2-6 s), within half a part (1 s) of when it
    was shown; nothing is read where nothing was drawn."""
    video = write_clip(tmp_path / "sign.mp4", 6.0, text=("GATE 42", 2.5, 6.0))
    lines, report = screen_lines(video, [(0.0, 6.0)], 3)
    assert report.frames == 3 and len(lines) == 1
    line = lines[0]
    assert line.text == "GATE 42" and line.source == "screen"
    assert (line.start, line.end) == (pytest.approx(2.0), pytest.approx(6.0))
    assert abs(line.start - 2.5) <= 1.0
    blank = write_clip(tmp_path / "blank.mp4", 2.0)
    assert screen_lines(blank, [(0.0, 2.0)], 2)[0] == []


# -- speech -------------------------------------------------------------------------------------
def test_audio_chunks_are_contiguous_and_timed(tmp_path):
    """Chunks of a span start at its start, follow one another without a gap, and hold the
    samples of exactly the span (16 kHz, within a frame of AAC's priming)."""
    video = write_clip(tmp_path / "tone.mp4", 3.0, size=(32, 32),
                       sound=(8000 * np.sin(np.arange(48000) / 5)).astype(np.int16))
    chunks = list(audio_chunks(video, 16000, 0.5, 2.5, chunk_s=0.6))
    assert chunks[0][0] == pytest.approx(0.5, abs=1e-3)
    for (t0, a), (t1, _) in itertools.pairwise(chunks):
        assert t1 == pytest.approx(t0 + len(a) / 16000) and len(a) == 9600
    total = sum(len(a) for _, a in chunks)
    assert total == pytest.approx(32000, abs=1024)
    assert all(a.dtype == np.int16 for _, a in chunks)


def test_words_grouped_into_lines():
    words = [("a", 0.0, 0.3), ("b", 0.4, 0.6), ("c", 2.0, 2.2), ("d", 2.3, 11.0)]
    assert list(group_words(words)) == [(0.0, 0.6, "a b"), (2.0, 2.2, "c"), (2.3, 11.0, "d")]
    assert merge_spans(np.array([5.0, 0.0, 8.0]), np.array([9.0, 4.0, 10.0])) == [
        (0.0, 4.0), (5.0, 10.0)]


@needs("espeak-ng")
def test_speech_is_transcribed_at_its_time(tmp_path):
    """espeak-ng says 'the secret number is seven' from 2 s into a 6 s clip (2.26 s of
    speech); PocketSphinx hears 'seven' in a line starting within 0.3 s of 2 s and ending
    within 0.8 s of the speech's end."""
    speech = say("the secret number is seven")
    video = write_clip(tmp_path / "said.mp4", 6.0, size=(64, 48),
                       sound=np.concatenate([silence(2.0), speech]))
    lines, report = speech_lines(video, [(0.0, 6.0)], make_recognizer("pocketsphinx"))
    said = [ln for ln in lines if "seven" in ln.text.split()]
    assert said, [ln.text for ln in lines]
    assert abs(said[0].start - 2.0) <= 0.3
    assert abs(said[0].end - (2.0 + len(speech) / 16000)) <= 0.8
    assert report.seconds == pytest.approx(6.0, abs=0.1) and report.found == 1


def test_no_sound_and_silence_are_not_errors(tmp_path):
    recognizer = make_recognizer("pocketsphinx")
    mute = write_clip(tmp_path / "mute.mp4", 1.0, size=(32, 32))
    lines, report = speech_lines(mute, [(0.0, 1.0)], recognizer)
    assert lines == [] and report.skipped == {"videos without sound": 1}
    assert report.notes == [f"{mute} has no audio stream"]
    quiet = write_clip(tmp_path / "quiet.mp4", 2.0, size=(32, 32), sound=silence(2.0))
    lines, report = speech_lines(quiet, [(0.0, 2.0)], recognizer)
    assert lines == [] and not report.skipped and report.seconds > 1.5


def test_a_model_that_cannot_load_is_one_sentence(tmp_path):
    """A whisper model that is neither a local folder nor fetchable (no network here, or
    faster-whisper not installed): one sentence, raised again at once on the next use."""
    recognizer = make_recognizer(f"whisper:{tmp_path / 'no-such-model'}")
    quiet = write_clip(tmp_path / "quiet.mp4", 1.0, size=(32, 32), sound=silence(1.0))
    with pytest.raises(SpeechModelError) as failed:
        speech_lines(quiet, [(0.0, 1.0)], recognizer)
    assert "\n" not in str(failed.value) and "whisper" in str(failed.value)
    with pytest.raises(SpeechModelError) as again:
        speech_lines(quiet, [(0.0, 1.0)], recognizer)
    assert again.value is failed.value
    with pytest.raises(ValueError, match="unknown speech engine"):
        make_recognizer("espeak")
