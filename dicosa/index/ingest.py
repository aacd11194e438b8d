"""Ingest: list video files, decode them, encode them, and hand them on shard by shard.

:func:`ingest` runs the loop :meth:`~dicosa.index.VideoIndex.add` is made of. DataLoader
workers decode (:mod:`dicosa.index.decode`: a file as one clip, or a long video streamed as a
run of frames at the segment rate); this process encodes (:mod:`dicosa.index.encode`) and,
every ``shard_size`` rows, hands what is encoded to the ``commit`` callable it is given (the
index stores it and commits its manifest). It knows no index: its only state is what is
encoded and not yet handed on. Each row carries the file's ``size`` and ``mtime``, by which a
later ``add`` notices that a file changed and encodes it again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from ..model import DiCoSA
from ..progress import progress as show_progress
from ..search.shards import VideoRun
from .decode import VideoItems
from .encode import Clip, Encoder
from .listing import file_stamp, list_videos, new_or_changed

__all__ = ["Clip", "IngestReport", "file_stamp", "ingest", "list_videos", "new_or_changed"]

log = logging.getLogger(__name__)

# A shard holds at most this many frames (float16 at D = 512: 64 MiB), so that hours of video
# are committed in steps rather than all at the end.
_SHARD_FRAMES = 1 << 16


@dataclass
class IngestReport:
    added: int = 0  # videos stored
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    text_only: list[tuple[str, str]] = field(default_factory=list)
    partial: list[tuple[str, str]] = field(default_factory=list)  # (path, what was lost)
    rows: int = 0  # rows stored (a long video's segments each count)
    frames: int = 0  # frames stored
    seconds: float = 0.0  # seconds of video stored (where durations are known)


def ingest(model: DiCoSA, device: torch.device, todo: list[str], frames: FrameProtocol,
           commit: Callable[[list[Clip] | list[VideoRun], np.ndarray | None], None], *,
           segments: SegmentPolicy | None = None, batch_size: int = 16,
           num_workers: int | None = None, shard_size: int = 256, progress: bool = True,
           titles: dict[str, str] | None = None) -> IngestReport:
    """Decode and encode ``todo``; every ``shard_size`` rows (or :data:`_SHARD_FRAMES`
    frames), and at the end or when interrupted (what is encoded is already paid for),
    ``commit(encoded, pad)`` stores them: :class:`Clip` s without ``segments``, else
    :class:`~dicosa.search.shards.VideoRun` s and the vector that pads their short segments
    (:meth:`Encoder.pad`)."""
    if num_workers is None:
        num_workers = min(4, os.cpu_count() or 1)
    items = VideoItems(todo, model.config.num_frames, model.image_size, frames, segments,
                       titles)
    loader = DataLoader(items, batch_size=None, num_workers=min(num_workers, len(todo)))
    encoder = Encoder(model, device, frames, segments, batch_size)
    report, pending = IngestReport(), []
    bar = show_progress(total=len(todo), desc="indexing videos", unit="video", enabled=progress)

    def hand_on(force: bool = False) -> None:
        nonlocal pending
        pending += encoder.ready()
        if pending and (force or _rows(pending) >= shard_size
                        or _frames(pending) >= _SHARD_FRAMES):
            commit(pending, encoder.pad() if segments is not None else None)
            _count(report, pending)
            pending = []

    try:
        with bar:
            for item in loader:
                encoder.take(item)
                if item["kind"] in ("frames", "end"):
                    bar.set_postfix(frames=report.frames + encoder.frames_waiting,
                                    skipped=len(encoder.skipped), refresh=False)
                if item["kind"] != "frames":
                    bar.update(1)
                hand_on()
            encoder.flush()
    finally:
        encoder.flush()
        hand_on(force=True)
        report.skipped, report.text_only = encoder.skipped, encoder.text_only
        report.partial = encoder.partial
    return report


def _rows(pending: list) -> int:
    return sum(len(p.segments) if isinstance(p, VideoRun) else 1 for p in pending)


def _frames(pending: list) -> int:
    return sum(len(p.frames) if isinstance(p, VideoRun) else len(p.mask) for p in pending)


def _count(report: IngestReport, stored: list) -> None:
    report.added += len(stored)
    report.rows += _rows(stored)
    report.frames += sum(int(np.asarray(p.valid if isinstance(p, VideoRun) else p.mask).sum())
                         for p in stored)
    durations = [float(p.row.get("duration") or 0.0) for p in stored]
    report.seconds += sum(d for d in durations if d == d)
