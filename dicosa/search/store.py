"""The frame store: the per-frame features of every indexed video, memory-mapped.

DiCoSA's score pools the frames under the query (Eq. 1), so the rerank needs each candidate's
per-frame features; at 1M videos of ViT-B/32 size (N=12, D=512) they are 12 GiB, more than a
search process should hold. The store keeps them in shard files that are memory-mapped and
never concatenated: :meth:`FrameStore.gather` of C candidate rows reads only those rows'
pages, and resident memory does not grow with the number of shards opened.

A *row* is what search ranks: a whole short video, or one segment (a time range) of a long
one, in either of the shards' layouts (:mod:`dicosa.search.shards`). The rows of one video
are consecutive ids; the video's id is the id of its first row (``store.videos.of``), and
removing a video removes all of them.

A shard's name may also be a path relative to the index folder (``parts/rank-1/shard-00000``:
the shards a multi-process build's processes wrote, linked by :meth:`FrameStore.link`).

Row ids are store row numbers: shard ``s`` holds ids ``first_id .. first_id + count - 1``.
Removed rows are tombstoned (listed in the manifest) and their ids are never reused. The
store's part of the manifest is :meth:`FrameStore.manifest`; the index writes the file.

:class:`FrameStore` keeps the shards, the id space and the frames (read, appended, linked,
saved); it composes the rest, each a module with one job: ``store.videos`` (row ↔ video and
time, :mod:`dicosa.search.row_videos`) and ``store.table`` (the metadata,
:mod:`dicosa.search.row_table`); checking its files is :mod:`dicosa.search.store_check`,
mapping them in :func:`~dicosa.search.shards.populate_shards`.

Version-1 indexes (shards without "proxy", five csv columns) are read as they are: their
proxies are computed when opened and the missing columns read as empty.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..model import VideoFeatures
from .frame_codec import check_frame_dtype, dequantise
from .row_table import COLUMNS, ROW_COLUMNS, RowTable
from .row_videos import VideoMap
from .shards import (
    ClipShard,
    RunShard,
    Shard,
    StoreError,
    VideoRun,
    finite_rows,
    open_shard,
    read_rows,
    write_shard,
)

__all__ = ["COLUMNS", "ROW_COLUMNS", "FrameStore", "StoreError", "VideoRun", "finite_rows"]


class FrameStore:
    """Append-only shards of per-frame features with tombstones; see the module docstring."""

    def __init__(self, num_frames: int | None = None, dim: int | None = None,
                 frame_dtype: str = "float16"):
        self.num_frames = num_frames
        self.dim = dim
        self.frame_dtype = check_frame_dtype(frame_dtype)  # how new shards keep frames
        self.directory: Path | None = None
        self.shards: list[Shard] = []
        self.removed: set[int] = set()
        # Ids below this may have been handed to rows of a write that never committed (see
        # dicosa/index/manifest.py, "reserved ids"); the next append starts at or after it.
        self.reserved = 0
        self._starts = np.zeros(0, dtype=np.int64)
        self._compose()

    def _compose(self) -> None:
        self.videos = VideoMap(self)  # row <-> video and time
        self.table = RowTable(self, self.videos)  # the rows' metadata

    # -- contents -------------------------------------------------------------------------
    @property
    def next_id(self) -> int:
        """The id the next appended row gets (ids are never reused)."""
        last = self.shards[-1] if self.shards else None
        return last.first_id + last.count if last else 0

    def __len__(self) -> int:
        """Live (not removed) rows."""
        return self.next_id - len(self.removed)

    def live(self) -> np.ndarray:
        """Ids of the live rows, ascending: int64 [len(self)]."""
        alive = np.ones(self.next_id, dtype=bool)
        alive[list(self.removed)] = False
        return np.flatnonzero(alive).astype(np.int64)

    def is_live(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < self.next_id)
        if self.removed:
            ok &= ~np.isin(ids, np.fromiter(self.removed, dtype=np.int64))
        return ok

    @property
    def segmented(self) -> bool:
        """Whether any shard keeps runs (rows that are segments of longer videos)."""
        return any(isinstance(s, RunShard) for s in self.shards)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, row within the shard) of each id."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.next_id):
            raise KeyError(f"row ids outside 0..{self.next_id - 1}")
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        return shard, ids - self._starts[shard]

    def by_shard(self, ids: np.ndarray):
        """Yield (shard, positions in ``ids``, rows in the shard), one shard at a time, the
        rows ascending (pages are read in file order). One sort of ``ids`` groups them all."""
        ids = np.asarray(ids, dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        shard, row = self.locate(ids[order])
        bounds = np.flatnonzero(np.diff(shard)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)], strict=True):
            if hi > lo:
                yield self.shards[shard[lo]], order[lo:hi], row[lo:hi]

    def gather(self, ids: np.ndarray, dtype: torch.dtype = torch.float16) -> VideoFeatures:
        """Features of rows ``ids`` [n] (any order, repeats allowed): ``[n, N, D]`` of
        ``dtype`` and the mask ``[n, N]``.

        Only the requested rows are read from the memory-mapped shards, and only they are
        dequantised (int8 shards). Each shard's rows are written straight into the answer in
        float16 or float32 (for float32, what the rerank computes in, no float16 copy is
        made); another ``dtype`` is converted from float16.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts = list(self.by_shard(ids))
        if _all_int8(parts):
            # int8 rows of every shard side by side, dequantised in one pass (per shard,
            # the many small conversions cost more than the bytes)
            codes, scale, mask = self._codes(ids, parts)
            frames = torch.from_numpy(dequantise(codes, scale))
            return VideoFeatures(frames.to(dtype), torch.from_numpy(mask))
        mask = np.empty((len(ids), self.num_frames), dtype=bool)
        kind = np.float32 if dtype == torch.float32 else np.float16
        frames = np.empty((len(ids), self.num_frames, self.dim), dtype=kind)
        for shard, where, rows in parts:
            frames[where], mask[where] = shard.gather(rows, self.num_frames)
        return VideoFeatures(torch.from_numpy(frames).to(dtype), torch.from_numpy(mask))

    def gather_codes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Rows ``ids`` [n] as int8 shards keep them, not dequantised: codes ``[n, N, D]``
        int8, scales ``[n, N]`` float32 (frame = scale × codes) and the mask ``[n, N]``;
        None when any of the rows lies in a float16 shard. Ascending ids are read fastest:
        each shard's rows are copied straight into their place in the answer."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts = list(self.by_shard(ids))
        return self._codes(ids, parts) if _all_int8(parts) else None

    def _codes(self, ids: np.ndarray, parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        codes = np.empty((len(ids), self.num_frames, self.dim), dtype=np.int8)
        scale = np.empty((len(ids), self.num_frames), dtype=np.float32)
        mask = np.empty((len(ids), self.num_frames), dtype=bool)
        ascending = bool(np.all(ids[1:] > ids[:-1]))
        for shard, where, rows in parts:
            if isinstance(shard, RunShard):  # rows are slots of its frames, read slot by slot
                codes[where], scale[where], mask[where] = shard.codes(rows, self.num_frames)
            elif ascending:  # this shard's rows fill one slice of the answer, in order
                part = slice(where[0], where[-1] + 1)
                np.take(shard.frames, rows, axis=0, out=codes[part])
                np.take(shard.frame_scale, rows, axis=0, out=scale[part])
                np.take(shard.frame_mask, rows, axis=0, out=mask[part])
            else:
                codes[where], scale[where], mask[where] = shard.codes(rows)
        return codes, scale, mask

    def has_frames(self, ids: np.ndarray) -> np.ndarray:
        """Whether each row ``ids`` [n] has a valid frame: bool [n] (False: a row indexed from
        its title alone)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if all(shard.all_rows_have_frames() for shard in self.shards):
            return np.ones(len(ids), dtype=bool)  # the usual store: no lookup per query
        out = np.empty(len(ids), dtype=bool)
        for shard, where, rows in self.by_shard(ids):
            out[where] = shard.valid_any(rows)
        return out

    def proxies(self, ids: np.ndarray) -> np.ndarray:
        """Dense proxies of rows ``ids``: float32 ``[n, D]``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for shard, where, rows in self.by_shard(ids):
            out[where] = shard.proxy[rows]
        return out

    def iter_proxies(self):
        """``(ids [n], proxies [n, D])`` per shard, live rows only: what a first stage indexes."""
        for shard in self.shards:
            ids = np.arange(shard.first_id, shard.first_id + shard.count, dtype=np.int64)
            keep = self.is_live(ids)
            if keep.any():
                yield ids[keep], np.asarray(shard.proxy[keep], dtype=np.float32)

    # -- changes --------------------------------------------------------------------------
    def append(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """Add one ``clips`` shard: one row per video, float16 ``[n, N, D]`` features (kept as
        :attr:`frame_dtype`) and their metadata rows; returns the new ids [n]. Written at once
        when the store has a directory."""
        frames = video.frames.detach().to("cpu", torch.float16)
        mask = video.frame_mask.detach().to("cpu", torch.bool)
        if len(rows) != frames.shape[0]:
            raise ValueError(f"{frames.shape[0]} videos but {len(rows)} metadata rows")
        self._check_shape(frames.shape[1], frames.shape[2])
        bad = np.flatnonzero(~finite_rows(frames, mask))
        if len(bad):
            raise ValueError(f"{len(bad)} of {len(rows)} videos have non-finite features "
                             f"(first: {rows[bad[0]].get('path', bad[0])}); they are never "
                             "stored, since they would rank first or last for every query")
        shard = ClipShard.build(self._first_new(), frames.numpy(), mask.numpy(),
                                self.frame_dtype)
        shard._rows = _table(rows)
        return self._add(shard)

    def append_runs(self, runs: list[VideoRun], pad: np.ndarray, num_frames: int
                    ) -> np.ndarray:
        """Add one ``runs`` shard: each video's frame run and its segments (rows of at most
        ``num_frames`` frames, N); ``pad`` [D] fills the slots of rows under N frames.
        Returns the new row ids."""
        if not runs:
            return np.zeros(0, dtype=np.int64)
        if self.num_frames is None:
            self.num_frames = num_frames
        for run in runs:
            self._check_run(run)
        shard = RunShard.build(self._first_new(), runs, pad, self.num_frames,
                               self.frame_dtype)
        shard._rows = _table([r.row for r in runs])
        return self._add(shard)

    def _check_shape(self, num_frames: int, dim: int) -> None:
        if self.num_frames is None or self.dim is None:
            self.num_frames, self.dim = self.num_frames or num_frames, dim
        if (num_frames, dim) != (self.num_frames, self.dim):
            raise ValueError(f"features [n, {num_frames}, {dim}] do not fit this store's "
                             f"[n, {self.num_frames}, {self.dim}]")

    def _check_run(self, run: VideoRun) -> None:
        frames = np.asarray(run.frames)
        self._check_shape(self.num_frames, frames.shape[1])
        segments = np.asarray(run.segments)
        if (not len(segments) or segments[:, 1].max() > self.num_frames
                or segments[:, 1].min() < 1 or segments[:, 0].min() < 0
                or (segments.sum(1)).max() > len(frames)):
            raise ValueError(f"{run.row.get('path')}: its segments do not fit its "
                             f"{len(frames)} frames (at most {self.num_frames} each)")
        if not np.isfinite(frames[np.asarray(run.valid, bool)].astype(np.float32)).all():
            raise ValueError(f"{run.row.get('path')} has non-finite features; they are never "
                             "stored, since they would rank first or last for every query")

    def _first_new(self) -> int:
        first = max(self.next_id, self.reserved)
        self.removed.update(range(self.next_id, first))  # ids of a write that never committed
        return first

    def _add(self, shard: Shard) -> np.ndarray:
        self.shards.append(shard)
        self._starts = np.array([s.first_id for s in self.shards], dtype=np.int64)
        if self.directory is not None and shard.name is None:  # a linked one is written
            write_shard(self.directory, shard, f"shard-{len(self.shards) - 1:05d}")
        return np.arange(shard.first_id, shard.first_id + shard.count, dtype=np.int64)

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Tombstone rows ``ids``; returns those that were live (the others are ignored)."""
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        ids = ids[self.is_live(ids)]
        self.removed.update(ids.tolist())
        return ids

    # -- files ----------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> None:
        """Write every shard not yet in ``directory`` there; later appends write there too."""
        directory = Path(directory)
        same = self.directory is not None and directory.resolve() == self.directory.resolve()
        for number, shard in enumerate(self.shards):
            if not (same and shard.name is not None):
                write_shard(directory, shard, f"shard-{number:05d}")
        self.directory = directory

    def manifest(self) -> dict:
        """The store's fields of the index manifest."""
        return {"num_frames": self.num_frames, "dim": self.dim,
                "frame_dtype": self.frame_dtype, "next_id": self.next_id,
                "removed": sorted(self.removed),
                "shards": [_entry(s) for s in self.shards]}

    def take(self, other: FrameStore) -> None:
        """Become ``other`` (this store reopened after a commit), in place: whoever holds
        this store sees the committed rows."""
        self.__dict__.update(other.__dict__)
        self._compose()  # parts that answer for this store, not for ``other``

    @classmethod
    def open(cls, directory: str | os.PathLike, manifest: dict) -> FrameStore:
        """Map the shards a manifest lists (version 1 to 4); nothing is read but headers
        (and, for version-1 shards, the frames once to compute their proxies)."""
        directory = Path(directory)
        store = cls(manifest.get("num_frames"), manifest.get("dim"),
                    manifest.get("frame_dtype", "float16"))
        store.directory = directory
        first = 0
        for entry in manifest["shards"]:
            first = entry.get("first_id", first)
            shard = open_shard(directory, entry["name"], entry["count"], first)
            shard.sha256 = entry.get("sha256")
            store.shards.append(shard)
            first += entry["count"]
        if store.shards and store.num_frames is None:
            store.num_frames, store.dim = store.shards[0].shape
        store._starts = np.array([s.first_id for s in store.shards], dtype=np.int64)
        store.removed = set(manifest.get("removed", []))
        return store

    def link(self, name: str, count: int, sha256: dict | None = None) -> np.ndarray:
        """Append a shard file already in :attr:`directory` (``name`` relative to it, e.g.
        ``parts/rank-1/shard-00000``: a shard one process of a multi-process build wrote) as
        the next rows, without copying it; returns their new ids [count]. ``sha256``: the
        checksums its writer recorded, kept for :meth:`verify`."""
        if self.directory is None:
            raise ValueError("only a store with a directory can link shard files")
        shard = open_shard(self.directory, name, count, self._first_new())
        shard.sha256 = sha256
        num_frames, dim = shard.shape
        self.num_frames = num_frames if self.num_frames is None else self.num_frames
        self.dim = dim if self.dim is None else self.dim
        if dim != self.dim or (isinstance(shard, ClipShard) and num_frames != self.num_frames):
            raise StoreError(f"{self.directory}: shard {name} holds features of another "
                             "shape than the index; rebuild the index")
        return self._add(shard)


def _entry(shard: Shard) -> dict:
    """A shard's record in the manifest."""
    entry = {"name": shard.name, "first_id": shard.first_id, "count": shard.count}
    if isinstance(shard, RunShard):
        entry.update(layout="runs", videos=shard.videos)
    else:
        entry["proxy"] = shard.has_proxy_file
    if shard.frame_dtype != "float16":
        entry["frames"] = shard.frame_dtype
    if shard.sha256:
        entry["sha256"] = shard.sha256
    return entry


def _table(rows: list[dict]) -> pd.DataFrame:
    """Metadata rows as the table a reopened store reads (through the csv form, so that the
    columns have the same types)."""
    return read_rows(io.StringIO(pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False)))


def _all_int8(parts: list) -> bool:
    """Whether every shard of ``FrameStore.by_shard``'s parts keeps int8 frames."""
    return bool(parts) and all(shard.frame_scale is not None for shard, _, _ in parts)
