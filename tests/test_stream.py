"""Decoding a whole video at a fixed rate: the run's frames are the ones a player shows at
each tick, with the decoder's own times; lost stretches, cuts and bad files."""

import av
import numpy as np
import pytest

from dicosa.data.stream import FrameStream
from dicosa.errors import VideoDecodeError

from ._videos import damage, write_scenes, write_timed, write_video


def _decoded(path) -> tuple[np.ndarray, np.ndarray]:
    """Every frame's time from the stream's start, and its mean level, as PyAV decodes it."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        start = float(stream.start_time * stream.time_base)
        pairs = [(float(f.time) - start, f.to_ndarray(format="rgb24").mean())
                 for f in container.decode(stream)]
    times, levels = np.array(pairs).T
    return times, levels


def _run(path, rate=1.0, **kwargs):
    stream = FrameStream(path, rate, 32, **kwargs)
    batches = list(stream)
    times = np.concatenate([b.times for b in batches])
    levels = np.concatenate([b.frames.float().mean(dim=(1, 2, 3)).numpy() for b in batches])
    return stream.report, times, levels


def test_variable_frame_rate_and_a_late_start_give_the_decoders_times(tmp_path):
    """Frames at irregular times, the stream starting at 1.5 s: each tick takes the frame
    shown then, with the time the decoder gives it (from the stream's start)."""
    times = np.cumsum([0, 0.1, 0.1, 0.7, 0.05, 1.3, 0.2, 0.2, 2.0, 0.1])
    levels = 10 + 20 * np.arange(len(times))
    path = write_timed(tmp_path / "vfr.mkv", levels, times, start=1.5)
    decoded_times, decoded_levels = _decoded(path)
    np.testing.assert_allclose(decoded_times, times, atol=1e-3)  # the file is what we meant
    report, got_times, got_levels = _run(path, detector=None)
    # ticks 0, 1, 3 s: the frames shown then (0, 0.95, 2.65); 2 s shows 0.95 again (kept
    # once), 4 s 2.65 again; the frames at 4.65 and 4.75 s are shown at no tick.
    np.testing.assert_allclose(got_times, [0.0, 0.95, 2.65], atol=1e-3)
    for t, level in zip(got_times, got_levels, strict=True):
        expected = decoded_levels[np.argmin(abs(decoded_times - t))]
        assert abs(level - expected) < 4, (t, level, expected)
    assert report.decoded == 10 and report.taken == 3 and not report.lost


def test_constant_rate_run_takes_one_frame_a_second_and_finds_the_cuts(tmp_path):
    colours = [(200, 30, 30), (30, 200, 30), (20, 20, 90), (230, 230, 230)]
    path = write_scenes(tmp_path / "scenes.mp4", colours, seconds=3.0, fps=8)
    # The content detector: the square that wraps round each scene at 2.5 s is no cut to it
    # (the adaptive one, shown every frame, also reports those jumps: layout_run keeps the
    # stronger cut of a gap, tests/test_real_cuts.py).
    report, times, _ = _run(path, detector="content")
    np.testing.assert_allclose(times, np.arange(12.0))
    assert report.cuts == [3.0, 6.0, 9.0] and report.detector_error is None
    assert len(report.cut_changes) == 3 and min(report.cut_changes) > 50
    assert report.duration == pytest.approx(12.0) and report.fps == 8
    _, times, _ = _run(path, rate=2.0, detector=None)
    np.testing.assert_allclose(times, np.arange(0, 12, 0.5))


def test_a_damaged_stretch_is_a_counted_hole(tmp_path):
    path = write_video(tmp_path / "v.avi", 50, fps=5)  # 10 s, frame i at level 10 + 5 i
    damage(path, 20, 26)
    report, times, levels = _run(path, detector=None)
    assert report.failed_packets > 0 and len(report.lost) == 1
    lost_from, lost_to = report.lost[0]
    assert 3.5 <= lost_from <= 4.5 and 5.0 <= lost_to <= 6.0
    assert not ((times > lost_from) & (times < lost_to)).any()
    assert times[0] == 0 and times[-1] >= 9.0  # the frames before and after are kept
    assert report.holes == [int(np.searchsorted(times, lost_to - 1e-6))]
    # each kept frame is the frame of its time (the level encodes the frame number)
    np.testing.assert_allclose(np.rint((levels - 10) / 5), np.rint(times * 5), atol=1)


def test_files_that_give_no_frame_say_why(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    audio = tmp_path / "audio.m4a"
    with av.open(str(audio), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), dtype=np.float32),
                                           format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        container.mux(stream.encode())
    for path, reason in [(empty, "empty file"), (audio, "no video stream"),
                         (tmp_path / "missing.mp4", "not found")]:
        with pytest.raises(VideoDecodeError, match=reason):
            list(FrameStream(path, 1.0, 32))


def test_a_detector_that_fails_leaves_windows(tmp_path, monkeypatch):
    from dicosa.data import shots

    def broken(self, kind, threshold):
        raise RuntimeError("no such detector here")

    monkeypatch.setattr(shots.ShotDetector, "_make", broken)
    path = write_scenes(tmp_path / "scenes.mp4", [(200, 30, 30), (30, 200, 30)], fps=8)
    report, times, _ = _run(path)
    assert len(times) == 6 and report.cuts == []
    assert "unavailable (no such detector here)" in report.detector_error
