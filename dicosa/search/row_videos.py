"""Rows and videos: which video each row of the frame store belongs to, a video's rows, and
where each row and frame lies in time.

A row is a whole short video or a segment of a long one (:mod:`dicosa.search.store`); the
rows of one video are consecutive ids and the video's id is its first row's. A
:class:`VideoMap` answers from the shards' own tables (:mod:`dicosa.search.shards`): it
reads only the store's id space, declared as :class:`Located`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from .shards import RunShard, Shard

__all__ = ["Located", "VideoMap"]


class Located(Protocol):
    """What the store's parts read of it: its shards in id order, where ids lie among them
    (:class:`~dicosa.search.store.FrameStore` is one)."""

    shards: list[Shard]
    num_frames: int | None
    next_id: int
    removed: set[int]
    segmented: bool

    def live(self) -> np.ndarray: ...
    def is_live(self, ids: np.ndarray) -> np.ndarray: ...
    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
    def by_shard(self, ids: np.ndarray) -> Iterator[tuple[Shard, np.ndarray, np.ndarray]]: ...


class VideoMap:
    """Row ↔ video and time for the store ``rows`` (module docstring)."""

    def __init__(self, rows: Located):
        self._rows = rows
        self._live: tuple[tuple[int, int], np.ndarray] | None = None  # (state, live videos)

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The video of each row ``ids`` [n]: the id of the video's first row, int64 [n]."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(len(ids), dtype=np.int64)
        for shard, where, rows in self._rows.by_shard(ids):
            out[where] = shard.first_id + shard.first_row(shard.video_of(rows))
        return out

    def live(self) -> np.ndarray:
        """Ids of the live videos (each its first row's id), ascending."""
        key = (self._rows.next_id, len(self._rows.removed))
        if self._live is None or self._live[0] != key:
            live = self._rows.live()
            if self._rows.segmented and len(live):
                live = live[self.of(live) == live]
            self._live = (key, live)
        return self._live[1]

    def __len__(self) -> int:
        """Live videos (a long video's segments count once)."""
        return len(self.live())

    def rows(self, video: int) -> np.ndarray:
        """The live row ids of video ``video`` (an id :meth:`of` gives), in time order."""
        shard, row = self._rows.locate(np.array([video]))
        part = self._rows.shards[int(shard[0])]
        rows = part.rows_of(int(part.video_of(row)[0])) + part.first_id
        return rows[self._rows.is_live(rows)]

    def spans(self, ids: np.ndarray) -> np.ndarray:
        """``[start, end]`` seconds of each row ``ids`` [n]: float64 ``[n, 2]`` (a whole
        video's row: ``[0, duration]``; NaN where the duration is unknown)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(ids), 2), dtype=np.float64)
        for shard, where, rows in self._rows.by_shard(ids):
            out[where] = shard.spans(rows)
        return out

    def times(self, ids: np.ndarray) -> np.ndarray:
        """The stored time of each frame slot of rows ``ids``: float64 ``[n, N]``, NaN for
        padding and for rows that keep no times (``clips`` shards:
        :func:`dicosa.search.moment.frame_times` recomputes theirs)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(ids), self._rows.num_frames), dtype=np.float64)
        for shard, where, rows in self._rows.by_shard(ids):
            out[where] = shard.times(rows, self._rows.num_frames)
        return out

    def run(self, video: int, frames: bool = True) -> dict[str, np.ndarray] | None:
        """Video ``video``'s whole run of frames (:meth:`RunShard.run`, rows as ids; without
        its frames, ``frames=False``); None for a video of a ``clips`` shard (its one row is
        its run)."""
        shard, row = self._rows.locate(np.array([video]))
        part = self._rows.shards[int(shard[0])]
        if not isinstance(part, RunShard):
            return None
        run = part.run(int(part.video_of(row)[0]), frames)
        run["rows"] = run["rows"] + part.first_id
        return run
