"""The decoding side of ingest: video files into items a DataLoader worker hands over.

:class:`VideoItems` is an iterable dataset: each DataLoader worker takes every W-th file and
yields, per file, either

- ``{"kind": "clip", ...}``: N frames picked by the frame protocol, a mask and the metadata
  row (every file of an index without segments, and a file no longer than one window of an
  index with them); or a *text-only* clip (an undecodable file that has a title);
- ``{"kind": "frames", ...}`` batches of a long video's run at the segment rate, then one
  ``{"kind": "end", ...}`` with its metadata and what the decode saw (shot cuts, lost
  stretches): the file is streamed (:class:`~dicosa.data.stream.FrameStream`), never held
  whole;
- ``{"kind": "error", ...}``: the file cannot be indexed (the reason).

Each row records the duration the container states (``expected_duration``) and, for a partial
video, what its decode lost (``damage``, :mod:`dicosa.data.damage`).

Every item carries ``seq``, the file's position in the list, so the encoding side can keep
the list's order however the workers interleave.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from .listing import file_stamp

__all__ = ["VideoItems", "header_duration"]


class VideoItems(IterableDataset):
    """See the module docstring. ``segments`` None decodes every file as a clip."""

    def __init__(self, paths: Sequence[str], num_frames: int, image_size: int,
                 frames: FrameProtocol, segments: SegmentPolicy | None = None,
                 titles: dict[str, str] | None = None):
        self.paths = list(paths)
        self.num_frames = num_frames
        self.image_size = image_size
        self.frames = frames
        self.segments = segments
        self.titles = titles or {}

    def __iter__(self) -> Iterator[dict]:
        worker = get_worker_info()
        first, step = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        for seq in range(first, len(self.paths), step):
            for item in self.items(self.paths[seq]):
                yield {**item, "seq": seq}

    def items(self, path: str) -> Iterator[dict]:
        """One file's items (without ``seq``): a clip or an error, or a long video's frame
        batches and its end."""
        # What the container states: a decode that ends well before it is recorded as partial.
        expected = header_duration(path)
        if self.segments is not None and not (expected is None
                                              or expected <= self.segments.span):
            yield from self._stream(path, expected)
        else:  # no longer than one window, or of unknown length: the clip decoder measures it
            yield self._clip(path, expected)

    def _clip(self, path: str, expected: float | None) -> dict:
        from ..data.damage import damage_sentence
        from ..data.video import load_clip
        from ..search.moment import row_frame_times

        stamp = dict(zip(("size", "mtime"), file_stamp(path), strict=True))
        try:
            # A damaged stretch costs its frames, not the video: the rest is indexed and the
            # row flagged with the fraction lost (fused search weighs its video view by it).
            clip = load_clip(path, self.num_frames, self.image_size,
                             pad_colour=self.frames.pad_colour, sampling=self.frames.sampling)
        except Exception as exc:  # any unreadable file is skipped, never fatal
            return self._unreadable(path, getattr(exc, "reason", None) or str(exc), stamp)
        valid = int(clip.mask.sum())
        damage = damage_sentence(clip.duration, expected, lost_picks=clip.picked - valid,
                                 picks=clip.picked)
        row = {"path": path, "duration": clip.duration, "fps": clip.fps,
               "num_frames": clip.num_frames, "valid_frames": valid,
               "title": self.titles.get(path, ""), "text_only": False,
               "frames_lost": clip.lost, **_partial(expected, damage), **stamp}
        times = row_frame_times(self.frames.sampling, self.num_frames, clip.num_frames,
                                clip.fps, valid, clip.lost)
        return {"kind": "clip", "path": path, "frames": clip.frames, "frame_mask": clip.mask,
                "times": times, "row": row}

    def _unreadable(self, path: str, reason: str, stamp: dict) -> dict:
        """An error item, or a text-only clip when the file has a title."""
        title = self.titles.get(path, "")
        if not title:
            return {"kind": "error", "path": path, "reason": reason}
        # Undecodable but titled: indexed from its title alone (no frame in the mask).
        shape = (self.num_frames, 3, self.image_size, self.image_size)
        return {"kind": "clip", "path": path, "frames": torch.zeros(shape, dtype=torch.uint8),
                "frame_mask": torch.zeros(self.num_frames, dtype=torch.bool),
                "times": None, "text_only": reason,
                "row": {"path": path, "valid_frames": 0, "title": title, "text_only": True,
                        "frames_lost": 1.0, **stamp}}

    def _stream(self, path: str, expected: float | None) -> Iterator[dict]:
        from ..data.damage import damage_sentence
        from ..data.stream import FrameStream

        stamp = dict(zip(("size", "mtime"), file_stamp(path), strict=True))
        policy = self.segments
        stream = FrameStream(path, policy.rate, self.image_size,
                             detector=None if policy.detector == "none" else policy.detector,
                             threshold=policy.threshold)
        try:
            for batch in stream:
                yield {"kind": "frames", "path": path, "frames": batch.frames,
                       "times": batch.times}
        except Exception as exc:
            if not stream.report.taken:
                yield self._unreadable(path, getattr(exc, "reason", None) or str(exc), stamp)
                return
            # the frames before it are indexed
            stream.report.ended_early = getattr(exc, "reason", None) or type(exc).__name__
        report = stream.report
        lost = report.lost_seconds / report.duration if report.duration > 0 else 0.0
        damage = damage_sentence(report.duration, expected, lost=report.lost,
                                 ended_early=report.ended_early, dropped=report.backwards)
        row = {"path": path, "duration": report.duration, "fps": report.fps,
               "num_frames": report.decoded, "valid_frames": report.taken,
               "title": self.titles.get(path, ""), "text_only": False,
               "frames_lost": round(min(1.0, lost), 6), **_partial(expected, damage), **stamp}
        yield {"kind": "end", "path": path, "row": row, "report": report}


def _partial(expected: float | None, damage: str) -> dict:
    """A row's record of what its container states and what its decode lost."""
    return {"expected_duration": float("nan") if expected is None else expected,
            "damage": damage}


def header_duration(path: str) -> float | None:
    """A file's duration in seconds as its container header says (None: unknown or not
    readable; the decoders then find out)."""
    import av

    try:
        with av.open(path) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            if stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                seconds = container.duration / 1_000_000  # av.time_base: microseconds
            else:
                return None
    except Exception:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None
