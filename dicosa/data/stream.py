"""Decode a whole video at a fixed rate, streaming: frames with their times, in batches.

An index keeps a long video as a run of frames at ``rate`` frames a second
(:mod:`dicosa.data.segments`). :class:`FrameStream` decodes the file once with PyAV, from the
first packet to the last, and yields the frames due at that rate in small batches, so a
ten-hour file never sits in memory (the encoder consumes each batch before the next is
decoded). Alongside it feeds a :class:`~dicosa.data.shots.ShotDetector` a small copy of every
decoded frame.

Times are the decoder's own: each frame's presentation timestamp (``pts × time_base``)
minus the stream's start, so variable frame rates and streams that do not start at zero give
the times a player shows. A frame is taken at the first decoded frame at or after each tick
``k / rate`` (half a frame early counts), so at 1 frame/s the run holds the frames shown at
0 s, 1 s, 2 s, ... A frame without a timestamp is placed one frame interval after the
previous one; a timestamp that goes backwards is dropped (counted). An AVI's frames are timed
by counting them (it has no presentation timestamps), until a packet fails to decode.
Frames are as a player shows them: square pixels, turned upright (:mod:`.display`).

A packet that fails to decode is skipped; the stretch between the frames decoded on either
side of it is a *lost range*: reported, a hole in the run that no segment spans.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import torch

from ..errors import VideoDecodeError
from .display import display_of, shown_pixels
from .shots import DETECT_WIDTH, ShotDetector
from .unreadable import plain_reason
from .video import _decode_size, _fps, _open_container, _resize_crop, _timed_by_count

__all__ = ["FrameBatch", "FrameStream", "StreamReport"]


@dataclass
class FrameBatch:
    """Consecutive frames of the run: uint8 ``frames [b, 3, S, S]`` and ``times [b]`` (s)."""

    frames: torch.Tensor
    times: np.ndarray


@dataclass
class StreamReport:
    """What one decode saw of a file (complete once the stream is exhausted)."""

    fps: float = 0.0  # the stream's average rate (0: unknown)
    duration: float = 0.0  # seconds: the last decoded frame's time plus one frame
    decoded: int = 0  # frames decoded (all of them, not only the run's)
    taken: int = 0  # frames in the run
    lost: list[tuple[float, float]] = field(default_factory=list)  # (from, to) seconds
    failed_packets: int = 0
    backwards: int = 0  # frames dropped because their time went backwards
    holes: list[int] = field(default_factory=list)  # run positions that follow a lost range
    cuts: list[float] = field(default_factory=list)  # shot starts (s) from the detector
    cut_changes: list[float] = field(default_factory=list)  # the picture's change at each
    detector_error: str | None = None
    ended_early: str | None = None  # why the decode stopped before the file's end

    @property
    def lost_seconds(self) -> float:
        return float(sum(b - a for a, b in self.lost))


class FrameStream:
    """Iterate to get :class:`FrameBatch` es; :attr:`report` is complete afterwards.

    Args:
        rate: frames a second taken into the run.
        image_size: S, the side of the square frames (short side resized, centre crop, as
            :func:`dicosa.data.video.load_video` does).
        detector: a shot detector kind (``"content"``, ``"adaptive"``) or None.
        threshold: the detector's threshold (None: its default).
        batch: frames per yielded batch.

    Raises (when iterated):
        VideoDecodeError: the file is missing, empty, has no video stream, or no frame of it
            decodes.
    """

    def __init__(self, path: str | Path, rate: float, image_size: int, *,
                 detector: str | None = "adaptive", threshold: float | None = None,
                 batch: int = 32):
        self.path = Path(path)
        self.rate = float(rate)
        self.image_size = image_size
        self.detector_kind = detector
        self.threshold = threshold
        self.batch = batch
        self.report = StreamReport()

    def __iter__(self) -> Iterator[FrameBatch]:
        container, stream = _open_container(self.path)
        with container:
            stream.thread_type = "AUTO"
            fps = self.report.fps = _fps(stream)
            detector = (ShotDetector(self.detector_kind, fps, self.threshold)
                        if self.detector_kind not in (None, "none") else None)
            yield from self._run(container, stream, fps, detector)
        if detector is not None:
            self.report.cuts = detector.cuts()
            self.report.cut_changes = detector.changes()
            self.report.detector_error = detector.error
        if not self.report.taken:
            raise VideoDecodeError(self.path, "no frame decodes" if not self.report.decoded
                                   else "no frame has a usable time")

    def _run(self, container, stream, fps: float, detector: ShotDetector | None
             ) -> Iterator[FrameBatch]:
        report = self.report
        interval = 1.0 / fps if 1.0 <= fps <= 240.0 else 1.0 / 30  # a plausible frame time
        # Frames are scaled to square pixels by the decoder and turned upright afterwards.
        width, height = _decode_size(*display_of(stream).unturned_size(), self.image_size)
        detect_size = (DETECT_WIDTH, max(2, round(DETECT_WIDTH * stream.codec_context.height
                                                  / max(1, stream.codec_context.width))))
        origin = _origin(stream)
        counted = _timed_by_count(container)
        sampler = _Ticks(self.rate)
        pending: list[np.ndarray] = []
        times: list[float] = []
        last, failed_since = None, False
        for frame in self._frames(container, stream):
            if frame is None:  # a packet failed between the previous frame and the next
                failed_since = True
                continue
            if origin is None and frame.pts is not None and frame.time_base is not None:
                origin = float(frame.pts * frame.time_base)  # no start time: the first frame's
            time = _frame_time(frame, origin, last, interval,
                               counted and not failed_since)
            if last is not None and time <= last:
                report.backwards += 1
                continue
            report.decoded += 1
            if failed_since and last is not None:
                report.lost.append((last + interval, time))
                report.holes.append(report.taken)
                sampler.restart(time)  # no tick inside the lost stretch
            failed_since = False
            last = time
            if detector is not None and detector.wants():
                detector.push(time, frame.to_ndarray(format="bgr24", width=detect_size[0],
                                                     height=detect_size[1]))
            for chosen, chosen_time in sampler.push(frame, time):
                pending.append(shown_pixels(chosen, width=width, height=height,
                                            interpolation="BICUBIC"))
                times.append(chosen_time)
                report.taken += 1
                if len(pending) == self.batch:
                    yield self._batch(pending, times)
                    pending, times = [], []
        if pending:
            yield self._batch(pending, times)
        report.duration = (last + min(interval, 1.0 / self.rate)) if last is not None else 0.0

    def _frames(self, container, stream):
        """Decoded frames in order; None where a packet failed to decode. A container that
        cannot be read further ends the run there (:attr:`StreamReport.ended_early`)."""
        packets = container.demux(stream)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                return
            except (av.error.FFmpegError, ValueError) as exc:
                self.report.ended_early = plain_reason(self.path, exc, "reading")
                return
            try:
                decoded = packet.decode()
            except (av.error.FFmpegError, ValueError):
                self.report.failed_packets += 1
                yield None
                continue
            yield from decoded

    def _batch(self, frames: list[np.ndarray], times: list[float]) -> FrameBatch:
        pixels = _resize_crop(np.stack(frames), self.image_size)
        return FrameBatch(pixels, np.asarray(times, dtype=np.float64))


class _Ticks:
    """Which decoded frames enter a run at ``rate`` frames a second: for each tick k / rate
    the frame a player shows then, the last one whose time is at or before it (or, before the
    first frame, the first), each frame once. One frame of look-ahead: a tick is settled
    when a frame after it arrives."""

    _EPS = 1e-4  # seconds: a frame this close after a tick is at the tick

    def __init__(self, rate: float):
        self.rate = rate
        self.tick = 0
        self.previous: tuple[object, float] | None = None
        self.taken = -np.inf  # the time of the last frame taken

    def push(self, frame, time: float) -> list[tuple[object, float]]:
        out = []
        while self.tick / self.rate <= time + self._EPS:
            at = self.tick / self.rate
            chosen = (frame, time) if (time <= at + self._EPS or self.previous is None
                                       ) else self.previous
            if chosen[1] > self.taken:
                out.append(chosen)
                self.taken = chosen[1]
            self.tick += 1
        self.previous = (frame, time)
        return out

    def restart(self, time: float) -> None:
        """The stretch before ``time`` was lost: the next tick is the first at or after it."""
        self.previous = None
        self.tick = max(self.tick, math.ceil(time * self.rate - self._EPS))


def _origin(stream) -> float | None:
    """The stream's start time in seconds (None: unknown; the first frame's time is used)."""
    if stream.start_time is None or stream.time_base is None:
        return None
    return float(stream.start_time * stream.time_base)


def _frame_time(frame, origin: float | None, last: float | None, interval: float,
                counted: bool = False) -> float:
    """A frame's time in seconds from the stream's start (see the module docstring)."""
    if counted:  # the next frame on the grid of frame times (no rounding error builds up)
        return 0.0 if last is None else (round(last / interval) + 1) * interval
    if frame.pts is None or frame.time_base is None or origin is None:
        return 0.0 if last is None else last + interval
    return float(frame.pts * frame.time_base) - origin
