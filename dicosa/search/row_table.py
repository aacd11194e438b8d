"""The metadata of the frame store's rows: each video's columns (:data:`COLUMNS`: path,
title, duration, ...) and each row's own (its video, start and end), read from the shards'
tables without building more of a table than asked for."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .row_videos import Located, VideoMap
from .shards import COLUMNS

__all__ = ["COLUMNS", "ROW_COLUMNS", "RowTable"]

# What RowTable.rows gives per row: the video's metadata, then the row's own: ``video`` (the
# id of the video's first row: how the rows of one video are told apart from another's) and
# the row's ``start``/``end`` in seconds.
ROW_COLUMNS = (*COLUMNS, "video", "start", "end")


class RowTable:
    """Metadata of the store ``rows`` (whose live videos ``videos`` knows)."""

    def __init__(self, rows: Located, videos: VideoMap):
        self._rows, self._videos = rows, videos

    def columns(self, ids: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The metadata columns ``names`` (of :data:`COLUMNS`) of rows ``ids`` [n], each an
        array [n] in that order: what :meth:`rows` gives for them, without building a table
        (a page's moments read three numbers a row)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = {name: np.empty(len(ids), dtype=object) for name in names}
        for shard, where, rows in self._rows.by_shard(ids):
            videos = shard.video_of(rows)
            for name in names:  # a column an older shard lacks reads as unknown
                column = shard.column(name)
                out[name][where] = np.nan if column is None else column[videos]
        return out

    def rows(self, ids: np.ndarray) -> pd.DataFrame:
        """Metadata of rows ``ids``, in that order (index = the ids): the video's
        :data:`COLUMNS`, then the row's ``video``, ``start`` and ``end`` (:data:`ROW_COLUMNS`)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts, positions, videos, spans = [], [], [], []
        for shard, where, rows in self._rows.by_shard(ids):
            own = shard.video_of(rows)
            parts.append(shard.rows.iloc[own])  # a new frame: ``take`` copies
            videos.append(shard.first_id + shard.first_row(own))
            spans.append(shard.spans(rows))
            positions.append(where)
        if not parts:
            return pd.DataFrame(columns=list(ROW_COLUMNS))
        # One concat and one assignment of the row columns: a page of hits is read per
        # answer, so pandas' per-call costs are what this takes, not the bytes.
        table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        span = np.concatenate(spans)
        table = table.assign(video=np.concatenate(videos), start=span[:, 0], end=span[:, 1])
        order = np.argsort(np.concatenate(positions), kind="stable")
        return table.iloc[order].set_axis(ids, axis=0)

    def paths(self, ids: np.ndarray) -> list[str]:
        """The file path of each row's video (a column read, no table built)."""
        return self.columns(ids, ("path",))["path"].tolist()

    def all(self) -> pd.DataFrame:
        """Metadata of every live row (index = the ids)."""
        return self.rows(self._rows.live())

    def videos(self) -> pd.DataFrame:
        """Metadata of every live video (index = the video ids), :data:`COLUMNS` only."""
        return self.rows(self._videos.live())[list(COLUMNS)]
