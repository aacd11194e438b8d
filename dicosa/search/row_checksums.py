"""A CRC32 per video of a shard, beside the shard's sha256: which rows a damaged file lost.

The manifest's sha256 of a shard file says *whether* it changed, not where. Each shard file
therefore also keeps ``video_crc32`` (int64 ``[videos]``): the CRC32 of every byte that
belongs to one video, in a fixed order (:func:`video_arrays`; docs/index-format.md,
"Per-video checksums", lists it), so a flipped byte fails the CRC of the video holding it.
What belongs to no video (the file's header, a ``runs`` shard's ``pad``) is covered by the
sha256 alone: damage there fails no video's CRC, and the whole shard is then suspect.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np

__all__ = ["CRC_TENSOR", "damaged_videos", "video_arrays", "video_crcs"]

CRC_TENSOR = "video_crc32"


def _run_bounds(shard) -> tuple[np.ndarray, np.ndarray]:
    """A ``runs`` shard's ``(frame bounds [V + 1], row bounds [V + 1])``: video v holds
    frames ``fb[v]:fb[v + 1]`` and rows ``rb[v]:rb[v + 1]`` (its csv line v). Both ascend
    and stay inside the file even where one damaged entry of the segment table says
    otherwise (:func:`_ascending`): the bounds it moves are its own video's and a
    neighbour's, so those fail their CRCs, the damaged one among them."""
    videos, count, frames = shard.videos, shard.count, len(shard.frames)
    owner = np.clip(_ascending(np.asarray(shard.segment_video)), 0, videos)
    rows = np.searchsorted(owner, np.arange(videos + 1), side="left")
    rows[-1] = count
    starts = np.array([shard.segment[a:b, 0].min(initial=frames)
                       for a, b in itertools.pairwise(rows)], dtype=np.int64)
    bounds = np.clip(np.concatenate([[0], _ascending(starts[1:]), [frames]]), 0, frames)
    return np.maximum.accumulate(bounds).astype(np.int64), rows.astype(np.int64)


def _ascending(values: np.ndarray) -> np.ndarray:
    """``values`` (ascending when sound) made ascending with the fewest entries changed of
    two ways: the running maximum (which undoes one entry that fell) or the running minimum
    from the end (which undoes one that rose)."""
    if not len(values):
        return values
    rising = np.maximum.accumulate(values)
    falling = np.minimum.accumulate(values[::-1])[::-1]
    return rising if (rising != values).sum() <= (falling != values).sum() else falling


def video_arrays(shard, video: int, bounds=None) -> list[np.ndarray]:
    """The views of ``shard``'s arrays that hold video ``video`` (its csv line), in the order
    their bytes are checksummed; ``bounds``: a ``runs`` shard's :func:`_run_bounds`."""
    scale = [] if shard.frame_scale is None else [shard.frame_scale]
    if shard.layout == "clips":
        return [a[video] for a in (shard.frames, shard.frame_mask, shard.proxy, *scale)]
    frames, rows = bounds if bounds is not None else _run_bounds(shard)
    f, r = slice(frames[video], frames[video + 1]), slice(rows[video], rows[video + 1])
    return ([a[f] for a in (shard.frames, shard.frame_valid, shard.frame_time, *scale)]
            + [a[r] for a in (shard.segment, shard.segment_video, shard.segment_time,
                              shard.proxy)])


def video_crcs(shard) -> np.ndarray:
    """The CRC32 of each video's bytes (:func:`video_arrays`): int64 ``[videos]``."""
    bounds = _run_bounds(shard) if shard.layout == "runs" else None
    out = np.empty(shard.videos, dtype=np.int64)
    for video in range(shard.videos):
        crc = 0
        for part in video_arrays(shard, video, bounds):
            crc = zlib.crc32(np.ascontiguousarray(part).data, crc)
        out[video] = crc
    return out


def damaged_videos(shard) -> np.ndarray | None:
    """The videos (csv lines, ascending) whose bytes no longer give their recorded CRC32;
    None for a shard that keeps no per-video checksums (written before them). Reads the
    whole shard."""
    recorded = shard.video_crc
    if recorded is None or recorded.shape != (shard.videos,):
        return None
    return np.flatnonzero(video_crcs(shard) != recorded).astype(np.int64)
