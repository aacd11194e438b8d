"""Segments: how a long video's frame run is cut into the clips DiCoSA scores.

An index decodes a long video at :attr:`SegmentPolicy.rate` into one run of frames and cuts
the run into *shots*: at the detector's cuts (:mod:`dicosa.data.shots`) and after every
stretch the decode lost, a shot under :attr:`SegmentPolicy.min_shot` seconds joined to its
shorter neighbour (never across a hole). A shot of at most N frames is one *segment*; a
longer one is covered by windows of N frames every :attr:`SegmentPolicy.stride` frames, the
last one ending at the shot's end (``docs/search.md``, "Long videos: segments and
moments"). A segment is a view of the run ``(first frame, frame count)``: no frame is stored
twice. The temporal transformer runs over *chunks*, each shot cut into near-equal pieces of
at most N frames (:func:`chunk_shots`), so a frame is contextualised once, by its own shot.

Everything here is a pure function of frame times and cut positions.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..integers import as_int

__all__ = ["DETECTORS", "RunLayout", "SegmentPolicy", "chunk_shots", "layout_run", "segment_run",
           "segment_spans", "shots_of"]

DETECTORS = ("content", "adaptive", "none")


@dataclass(frozen=True)
class SegmentPolicy:
    """How an index decodes and cuts long videos (recorded in its manifest as ``moments``).

    ``window`` is N, the frames of one segment at most: the model's ``num_frames``, so a
    segment spans what a training clip spans at this rate (N / rate seconds). A video no
    longer than that is decoded as a clip (N frames picked by the frame protocol, exactly as
    an index without segments does) and is one segment.
    """

    window: int  # N: the most frames one segment holds
    rate: float = 1.0  # frames per second decoded from a long video
    stride: int | None = None  # frames between two windows of one long shot (None: ceil(N/2))
    # Seconds: a shorter shot is joined to a neighbour, so that a detector's false cut does
    # not leave a one-frame segment (1 s: chosen on the validation sets of benchmarks/cuts.py).
    min_shot: float = 1.0
    detector: str = "adaptive"  # "adaptive" / "content" (PySceneDetect) or "none" (windows)
    threshold: float | None = None  # the detector's threshold (None: its default)

    def __post_init__(self) -> None:
        window = as_int(self.window)
        if window is None or window < 1:
            raise ValueError(f"the segment window must be a positive number of frames, got "
                             f"{self.window!r}")
        object.__setattr__(self, "window", window)  # numpy's integers as Python's
        if not (isinstance(self.rate, numbers.Real) and not isinstance(self.rate, bool)
                and math.isfinite(self.rate) and 0 < self.rate <= 60):
            raise ValueError(f"the frame rate must be above 0 and at most 60 frames/s, got "
                             f"{self.rate!r}")
        if self.stride is not None and not (1 <= self.stride <= self.window):
            raise ValueError(f"the window stride must be 1..{self.window} frames, got "
                             f"{self.stride!r}")
        if self.min_shot < 0:
            raise ValueError(f"min_shot must be >= 0 seconds, got {self.min_shot!r}")
        if self.detector not in DETECTORS:
            raise ValueError(f"the shot detector must be one of {', '.join(DETECTORS)}, got "
                             f"{self.detector!r}")

    @property
    def step(self) -> int:
        """Frames between the starts of two windows of one shot."""
        return self.stride or math.ceil(self.window / 2)

    @property
    def span(self) -> float:
        """Seconds one window covers: a video at most this long is decoded as one clip."""
        return self.window / self.rate

    @property
    def min_frames(self) -> int:
        return max(1, round(self.min_shot * self.rate))

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> SegmentPolicy:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(f"unknown segment settings {unknown}; this dicosa knows "
                             f"{sorted(known)}")
        return cls(**record)


def shots_of(length: int, cuts: Sequence[int], holes: Sequence[int] = (),
             min_frames: int = 1) -> list[tuple[int, int]]:
    """The shots of a run of ``length`` frames: ``[(first, end)]`` (end exclusive), in order.

    Args:
        cuts: frame indices where the detector saw a new shot begin.
        holes: frame indices after a stretch the decoder lost (always a boundary).
        min_frames: a shot shorter than this is joined to its shorter neighbour within the
            same hole-free part (a part that is itself shorter stays one shot).
    """
    if length <= 0:
        return []
    fixed = sorted({int(h) for h in holes if 0 < h < length})
    loose = {int(c) for c in cuts if 0 < c < length} - set(fixed)
    out: list[tuple[int, int]] = []
    for first, end in zip([0, *fixed], [*fixed, length], strict=True):
        edges = [first, *sorted(c for c in loose if first < c < end), end]
        out.extend(_join_short(list(itertools.pairwise(edges)), min_frames))
    return out


def _join_short(shots: list[tuple[int, int]], min_frames: int) -> list[tuple[int, int]]:
    """Join each shot under ``min_frames`` to its shorter neighbour, shortest first."""
    shots = list(shots)
    while len(shots) > 1:
        short = [i for i, (a, b) in enumerate(shots) if b - a < min_frames]
        if not short:
            break
        i = min(short, key=lambda j: (shots[j][1] - shots[j][0], j))
        if i == 0:
            other = 1
        elif i == len(shots) - 1:
            other = i - 1
        else:
            before, after = shots[i - 1], shots[i + 1]
            other = i - 1 if before[1] - before[0] <= after[1] - after[0] else i + 1
        lo, hi = sorted((i, other))
        shots[lo:hi + 1] = [(shots[lo][0], shots[hi][1])]
    return shots


def segment_run(shots: Sequence[tuple[int, int]], window: int, step: int) -> np.ndarray:
    """The segments of a run cut into ``shots``: int64 ``[S, 2]`` rows ``(first, count)``.

    A shot of at most ``window`` frames is one segment; a longer one is covered by windows of
    ``window`` frames starting every ``step`` frames, the last one ending at the shot's end.
    """
    out: list[tuple[int, int]] = []
    for first, end in shots:
        length = end - first
        if length <= window:
            out.append((first, length))
            continue
        starts = list(range(first, end - window, step))
        if not starts or starts[-1] != end - window:
            starts.append(end - window)
        out.extend((s, window) for s in starts)
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def chunk_shots(shots: Sequence[tuple[int, int]], window: int) -> np.ndarray:
    """The temporal transformer's chunks: each shot as near-equal consecutive pieces of at
    most ``window`` frames, int64 ``[C, 2]`` rows ``(first, count)``."""
    out: list[tuple[int, int]] = []
    for first, end in shots:
        pieces = math.ceil((end - first) / window)
        edges = np.linspace(first, end, pieces + 1).round().astype(np.int64)
        out.extend((int(a), int(b - a)) for a, b in itertools.pairwise(edges))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def segment_spans(segments: np.ndarray, times: np.ndarray, frame_span: float,
                  duration: float | None = None, cuts: Sequence[float] = ()) -> np.ndarray:
    """``[start, end]`` seconds of each segment ``[S, 2]`` of a run with frame ``times [F]``:
    float64 ``[S, 2]``. A frame stands for ``frame_span`` seconds (1 / rate), cut short by
    the next frame and by the video's ``duration``.

    ``cuts``: the times of the shot boundaries (the first frame of each new shot, as the
    detector saw it at the file's full rate). A segment whose first frame follows a cut
    starts at the cut, and one whose last frame precedes a cut ends there: at 1 frame/s a cut
    at 5.3 s is first sampled at 6 s, but the new shot, and its row, begin at 5.3 s. Where two
    cuts fall between the same two frames (a shot shorter than a frame's span), the row
    begins at the earlier one, where the previous frame's picture ends."""
    segments = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
    times = np.asarray(times, dtype=np.float64)
    first, last = segments[:, 0], segments[:, 0] + segments[:, 1] - 1
    start = times[first]
    end = times[last] + frame_span
    following = last + 1 < len(times)
    end[following] = np.minimum(end[following], times[last[following] + 1])
    if duration is not None and math.isfinite(duration):
        end = np.minimum(end, max(duration, float(times[-1]) if len(times) else 0.0))
    cuts = np.sort(np.asarray(cuts, dtype=np.float64))
    if len(cuts) and len(segments):
        before = np.where(first > 0, times[np.maximum(first - 1, 0)], -np.inf)
        j = np.minimum(np.searchsorted(cuts, before, side="right"), len(cuts) - 1)
        moved = (cuts[j] > before) & (cuts[j] <= start)  # [S] the first cut after the frame
        start = np.where(moved, cuts[j], start)  # before: two cuts in one gap, the earlier
        k = np.searchsorted(cuts, times[last], side="right")  # [S] the first cut > last frame
        stops = (k < len(cuts)) & (cuts[np.minimum(k, len(cuts) - 1)] < end)
        end = np.where(stops, cuts[np.minimum(k, len(cuts) - 1)], end)
    return np.stack([start, np.maximum(end, start)], axis=1)


@dataclass(frozen=True)
class RunLayout:
    """A long video's run cut up (:func:`layout_run`): each an int64 array of rows."""

    shots: list[tuple[int, int]]  # (first, end) frames, end exclusive
    chunks: np.ndarray  # [C, 2] (first, count): the temporal transformer's pieces
    segments: np.ndarray  # [S, 2] (first, count): the rows
    spans: np.ndarray  # float64 [S, 2] (start, end) seconds of the rows


def layout_run(times: np.ndarray, cuts: Sequence[float], holes: Sequence[int],
               policy: SegmentPolicy, duration: float | None = None,
               changes: Sequence[float] | None = None) -> RunLayout:
    """The shots, chunks, segments and spans of a run of frames at ``times [F]`` (seconds)
    given the detector's ``cuts`` (seconds: a new shot's first frame) and the run positions
    that follow a lost stretch (``holes``).

    A cut belongs to the first run frame at or after it (the frame a player shows at that
    tick is already the new shot's); the spans of the rows on either side of a cut that
    remains a shot boundary meet at the cut's own time (:func:`segment_spans`). Of several
    cuts between the same two run frames the boundary is the one where the picture changed
    most (``changes``, one per cut; without them the first): the others bound a shot no
    run frame shows."""
    times = np.asarray(times, dtype=np.float64)
    cuts = np.asarray(cuts, dtype=np.float64)
    at = np.searchsorted(times, cuts - 1e-6)  # [cuts] each cut's first run frame
    shots = shots_of(len(times), at, holes, policy.min_frames)
    strength = -np.arange(len(cuts), dtype=np.float64) if changes is None else np.asarray(
        changes, dtype=np.float64)
    chosen: dict[int, int] = {}  # run frame -> the cut that bounds it
    for i, a in enumerate(at.tolist()):
        if a not in chosen or strength[i] > strength[chosen[a]]:
            chosen[a] = i
    kept = [float(cuts[chosen[first]]) for first, _ in shots[1:] if first in chosen]
    segments = segment_run(shots, policy.window, policy.step)
    spans = segment_spans(segments, times, 1.0 / policy.rate, duration, kept)
    return RunLayout(shots, chunk_shots(shots, policy.window), segments, spans)
