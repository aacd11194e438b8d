"""Moment annotations: captions with the time ranges of the videos they describe.

:class:`MomentSplit` is what the moment benchmarks load (DiDeMo here, the long-video synthetic
benchmark in :mod:`dicosa.data.long_synthetic`); its :meth:`MomentSplit.truths` are the ground
truths :func:`dicosa.moment_metrics.evaluate_moments` takes. DiDeMo (Hendricks et al., ICCV
2017) marks a moment by the inclusive pair of 5-s segments holding its start and its end, one
pair per annotator (:func:`didemo_range`; ``docs/DATA.md`` gives the files); all are kept, and
the metrics count a hit when it agrees with two of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..integers import as_int
from .datasets import _index_videos, _need, _read_json, _read_list, _strip_video_ext
from .video import VideoDecodeError, video_info

__all__ = [
    "DIDEMO_NUM_SEGMENTS",
    "DIDEMO_SEGMENT_SECONDS",
    "MomentSplit",
    "didemo_range",
    "load_didemo_moments",
]

log = logging.getLogger(__name__)

DIDEMO_SEGMENT_SECONDS = 5.0
DIDEMO_NUM_SEGMENTS = 6

Range = tuple[float, float]


@dataclass
class MomentSplit:
    """Captions of moments, each with its video and one time range per annotator.

    Attributes:
        name: ``"<benchmark>/<split>"``.
        video_ids: ``[V]`` ids.
        video_paths: ``[V]`` files (a missing file is reported when decoded, not here).
        durations: ``[V]`` seconds, or None where the file could not be probed.
        captions: ``[Q]`` non-empty captions.
        caption_video: ``[Q]`` index into the video lists.
        ranges: ``[Q]`` tuples of ``(start, end)`` seconds, one per annotator (at least one).
        annotation_ids: ``[Q]`` the annotation files' ids of the captions.
        num_skipped_ranges: annotator ranges dropped (malformed, or past the video's end).
        num_skipped_captions: captions dropped (empty, or no usable range left).
    """

    name: str
    video_ids: list[str]
    video_paths: list[Path]
    durations: list[float | None]
    captions: list[str]
    caption_video: list[int]
    ranges: list[tuple[Range, ...]]
    annotation_ids: list[str]
    num_skipped_ranges: int = field(default=0, compare=False)
    num_skipped_captions: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        n, q = len(self.video_ids), len(self.captions)
        if len(self.video_paths) != n or len(self.durations) != n:
            raise ValueError("video_ids, video_paths and durations must have equal length")
        if not len(self.caption_video) == len(self.ranges) == len(self.annotation_ids) == q:
            raise ValueError("captions, caption_video, ranges and annotation_ids must have "
                             "equal length")
        if any(not 0 <= v < n for v in self.caption_video):
            raise ValueError("caption_video holds an index outside the video list")
        if any(not r for r in self.ranges):
            raise ValueError("every caption needs at least one time range")

    @property
    def num_queries(self) -> int:
        return len(self.captions)

    def truths(self) -> list[tuple[str, tuple[Range, ...]]]:
        """``[Q]`` ``(video_id, ranges)``, as :func:`dicosa.moment_metrics.evaluate_moments`
        takes them."""
        return [(self.video_ids[v], r) for v, r in zip(self.caption_video, self.ranges,
                                                       strict=True)]


def didemo_range(first: int, last: int, duration: float | None = None) -> Range | None:
    """Seconds of DiDeMo's inclusive segment pair ``[first, last]``.

    Returns:
        ``(5 * first, 5 * (last + 1))``, its end clipped at ``duration`` when given; None when
        the range starts at or after ``duration`` (a segment the video does not have).

    Raises:
        ValueError: not integers with ``0 <= first <= last < 6``.
    """
    if as_int(first) is None or as_int(last) is None:
        raise ValueError(f"DiDeMo segments must be integers, got {[first, last]}")
    first, last = as_int(first), as_int(last)
    if not 0 <= first <= last < DIDEMO_NUM_SEGMENTS:
        raise ValueError(f"DiDeMo segments must satisfy 0 <= first <= last < "
                         f"{DIDEMO_NUM_SEGMENTS}, got {[first, last]}")
    start = DIDEMO_SEGMENT_SECONDS * first
    end = DIDEMO_SEGMENT_SECONDS * (last + 1)
    if duration is not None:
        if start >= duration:
            return None
        end = min(end, float(duration))
    return start, end


def _probe_duration(path: Path) -> float | None:
    try:
        return float(video_info(path)["duration"])
    except VideoDecodeError as exc:
        log.debug("no duration for %s: %s", path, exc)
        return None


def _entry_ranges(times, duration: float | None) -> tuple[list[Range], int]:
    """(usable ranges, number dropped) of one entry's ``times``."""
    kept: list[Range] = []
    if not isinstance(times, list):
        return kept, 1
    for pair in times:
        try:
            first, last = pair
            span = didemo_range(first, last, duration)
        except (TypeError, ValueError):
            span = None
        if span is not None:
            kept.append(span)
    return kept, len(times) - len(kept)


def load_didemo_moments(
    root: str | Path,
    split: str,
    video_dir: str | Path | None = None,
    probe_durations: bool = True,
) -> MomentSplit:
    """DiDeMo's moment annotations of one split (``"train"``, ``"val"`` or ``"test"``).

    Reads ``<root>/<split>_data.json`` and ``<root>/<split>_list.txt`` (the layout of
    ``docs/DATA.md``); videos are those of the list file, in its order, that have an
    annotation. Every entry is one caption with its annotators' ranges (module docstring).

    Args:
        root: folder of the annotation files.
        split: the files' prefix.
        video_dir: folder of the videos (any depth, any known extension); default
            ``<root>/videos``.
        probe_durations: read each found file's duration to clip the last segment; without
            it (or for a file that cannot be opened) ranges end at the 5-s grid.

    Malformed or out-of-video annotator ranges are dropped and counted, as are entries with
    an empty description or no range left; entries of videos missing from the list file are
    counted and left out. Each count is logged once.

    Raises:
        AnnotationError: a file is missing or not valid JSON.
    """
    root = Path(root)
    video_dir = root / "videos" if video_dir is None else Path(video_dir)
    listed = list(dict.fromkeys(_strip_video_ext(v) for v in
                                _read_list(_need(root, f"{split}_list.txt"))))
    entries = _read_json(_need(root, f"{split}_data.json"))
    by_video: dict[str, list[dict]] = {}
    for entry in entries:
        by_video.setdefault(_strip_video_ext(str(entry.get("video", ""))), []).append(entry)
    video_ids = [v for v in listed if v in by_video]
    files = _index_videos(video_dir)
    paths = [files.get(v, video_dir / f"{v}.mp4") for v in video_ids]
    durations = [_probe_duration(files[v]) if probe_durations and v in files else None
                 for v in video_ids]

    captions, caption_video, ranges, ids = [], [], [], []
    dropped_ranges = dropped_captions = 0
    for index, (vid, duration) in enumerate(zip(video_ids, durations, strict=True)):
        for entry in by_video[vid]:
            kept, dropped = _entry_ranges(entry.get("times"), duration)
            dropped_ranges += dropped
            caption = str(entry.get("description", "")).strip()
            if not caption or not kept:
                dropped_captions += 1
                continue
            captions.append(caption)
            caption_video.append(index)
            ranges.append(tuple(kept))
            ids.append(str(entry.get("annotation_id", len(ids))))
    kept_videos = set(video_ids)
    unlisted = sum(len(v) for k, v in by_video.items() if k not in kept_videos)
    name = f"didemo/{split}"
    _log_counts(name, dropped_ranges, dropped_captions, unlisted,
                sum(v not in files for v in video_ids), len(video_ids))
    return MomentSplit(name, video_ids, paths, durations, captions, caption_video, ranges, ids,
                       num_skipped_ranges=dropped_ranges, num_skipped_captions=dropped_captions)


def _log_counts(name: str, ranges: int, captions: int, unlisted: int, missing: int,
                videos: int) -> None:
    if ranges:
        log.warning("%s: dropped %d annotator range(s): malformed or past the video's end",
                    name, ranges)
    if captions:
        log.warning("%s: skipped %d caption(s): empty, or no usable range", name, captions)
    if unlisted:
        log.warning("%s: %d annotation(s) of videos not in the list file left out", name,
                    unlisted)
    if missing:
        log.warning("%s: %d of %d video files not found", name, missing, videos)
