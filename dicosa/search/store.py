"""The frame store: per-frame float16 features of every indexed video, memory-mapped.

DiCoSA's score pools the frames under the query (Eq. 1), so the rerank needs each candidate's
per-frame features; at 1M videos of ViT-B/32 size (N=12, D=512) they are 12 GiB, more than a
search process should hold. The store keeps them in shard files that are memory-mapped and
never concatenated: :meth:`FrameStore.gather` of C candidate rows reads only those rows'
pages, and resident memory does not grow with the number of shards opened.

Files, per shard (``shard-00000`` ...), each written whole then renamed:

    shard-00000.safetensors   "frames": float16 [n, N, D]; "frame_mask": bool [n, N];
                              "proxy": float32 [n, D], the dense proxy (masked frame mean,
                              :func:`dicosa.functional.video_proxy`) computed when written
    shard-00000.csv           one row per video: the :data:`COLUMNS`

A shard's name may also be a path relative to the index folder (``parts/rank-1/shard-00000``:
the shards a multi-process build's processes wrote, linked by :meth:`FrameStore.link`).

Row ids are store row numbers: shard ``s`` holds ids ``first_id .. first_id + count - 1``.
Removed rows are tombstoned (listed in the manifest) and their ids are never reused. The
store's part of the manifest is :meth:`FrameStore.manifest`; the index writes the file.

Version-1 indexes (shards without "proxy", five csv columns) are read as they are: their
proxies are computed when opened and the missing columns read as empty.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save as save_safetensors

from ..files import write_bytes_atomic
from ..functional import video_proxy
from ..model import VideoFeatures

__all__ = ["COLUMNS", "FrameStore", "StoreError"]

# path, duration (s), fps, num_frames (in the file), valid_frames (decoded, the rest padding);
# title, text_only, frames_lost are reserved for heads that read them (empty until then);
# size (bytes) and mtime (s) of the file when it was encoded: how a later add notices a
# changed file (empty in indexes written before they were kept).
COLUMNS = ("path", "duration", "fps", "num_frames", "valid_frames", "title", "text_only",
           "frames_lost", "size", "mtime")
_NUMERIC = ("duration", "fps", "size", "mtime")
_DTYPES = {"F16": np.float16, "F32": np.float32, "BOOL": np.bool_, "I64": np.int64}


class StoreError(ValueError):
    """A store file that is missing, damaged or does not match its manifest."""


@dataclass
class _Shard:
    first_id: int
    frames: np.ndarray  # float16 [n, N, D], a memory map once written
    frame_mask: np.ndarray  # bool [n, N]
    proxy: np.ndarray  # float32 [n, D]
    name: str | None = None  # file stem once written
    has_proxy_file: bool = True  # False for version-1 shards (proxy computed when opened)
    # sha256 of the written files, {"safetensors": hex, "csv": hex}; None where the manifest
    # recorded none (indexes written before checksums were kept)
    sha256: dict | None = None
    _rows: pd.DataFrame | None = field(default=None, repr=False)
    _directory: Path | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        return self.frames.shape[0]

    @property
    def rows(self) -> pd.DataFrame:
        """The shard's metadata, read from its csv on first use."""
        if self._rows is None:
            assert self._directory is not None and self.name is not None
            self._rows = _read_rows(self._directory / f"{self.name}.csv")
            if len(self._rows) != self.count:
                raise StoreError(f"{self._directory}: {self.name}.csv holds {len(self._rows)} "
                                 f"rows but its features {self.count}; rebuild the index")
        return self._rows


class FrameStore:
    """Append-only shards of per-frame features with tombstones; see the module docstring."""

    def __init__(self, num_frames: int | None = None, dim: int | None = None):
        self.num_frames = num_frames
        self.dim = dim
        self.directory: Path | None = None
        self.shards: list[_Shard] = []
        self.removed: set[int] = set()
        # Ids below this may have been handed to rows of a write that never committed (see
        # dicosa/index/manifest.py, "reserved ids"); the next append starts at or after it.
        self.reserved = 0
        self._starts = np.zeros(0, dtype=np.int64)

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

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, row within the shard) of each id."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.next_id):
            raise KeyError(f"row ids outside 0..{self.next_id - 1}")
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        return shard, ids - self._starts[shard]

    def _by_shard(self, ids: np.ndarray):
        """Yield (shard, positions in ``ids``, rows in the shard), one shard at a time."""
        shard, row = self._locate(ids)
        for s in np.unique(shard):
            where = np.flatnonzero(shard == s)
            yield self.shards[s], where, row[where]

    def gather(self, ids: np.ndarray) -> VideoFeatures:
        """Features of rows ``ids`` [n] (any order, repeats allowed): float16 ``[n, N, D]``.

        Only the requested rows are read from the memory-mapped shards.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        frames = np.empty((len(ids), self.num_frames, self.dim), dtype=np.float16)
        mask = np.empty((len(ids), self.num_frames), dtype=bool)
        for shard, where, rows in self._by_shard(ids):
            order = np.argsort(rows, kind="stable")  # ascending rows read pages in file order
            frames[where[order]] = shard.frames[rows[order]]
            mask[where[order]] = shard.frame_mask[rows[order]]
        return VideoFeatures(torch.from_numpy(frames), torch.from_numpy(mask))

    def has_frames(self, ids: np.ndarray) -> np.ndarray:
        """Whether each row ``ids`` [n] has a valid frame: bool [n] (False: a row indexed from
        its title alone)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(len(ids), dtype=bool)
        for shard, where, rows in self._by_shard(ids):
            out[where] = shard.frame_mask[rows].any(1)
        return out

    def proxies(self, ids: np.ndarray) -> np.ndarray:
        """Dense proxies of rows ``ids``: float32 ``[n, D]``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for shard, where, rows in self._by_shard(ids):
            out[where] = shard.proxy[rows]
        return out

    def iter_proxies(self):
        """``(ids [n], proxies [n, D])`` per shard, live rows only: what a first stage indexes."""
        for shard in self.shards:
            ids = np.arange(shard.first_id, shard.first_id + shard.count, dtype=np.int64)
            keep = self.is_live(ids)
            if keep.any():
                yield ids[keep], np.asarray(shard.proxy[keep], dtype=np.float32)

    def rows(self, ids: np.ndarray) -> pd.DataFrame:
        """Metadata of rows ``ids``, in that order (index = the ids)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts, positions = [], []
        for shard, where, rows in self._by_shard(ids):
            parts.append(shard.rows.iloc[rows])
            positions.append(where)
        if not parts:
            return pd.DataFrame(columns=list(COLUMNS))
        table = pd.concat(parts).iloc[np.argsort(np.concatenate(positions), kind="stable")]
        return table.set_axis(ids, axis=0)

    def paths(self, ids: np.ndarray) -> list[str]:
        return self.rows(ids)["path"].tolist()

    def metadata(self) -> pd.DataFrame:
        """Metadata of every live row (index = the ids)."""
        return self.rows(self.live())

    # -- changes --------------------------------------------------------------------------
    def append(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """Add one shard of videos; returns their new ids [n]. Written at once when the store
        has a directory."""
        frames = video.frames.detach().to("cpu", torch.float16)
        mask = video.frame_mask.detach().to("cpu", torch.bool)
        if len(rows) != frames.shape[0]:
            raise ValueError(f"{frames.shape[0]} videos but {len(rows)} metadata rows")
        if self.num_frames is None:
            self.num_frames, self.dim = frames.shape[1], frames.shape[2]
        if tuple(frames.shape[1:]) != (self.num_frames, self.dim):
            raise ValueError(f"features [n, {frames.shape[1]}, {frames.shape[2]}] do not fit "
                             f"this store's [n, {self.num_frames}, {self.dim}]")
        bad = np.flatnonzero(~finite_rows(frames, mask))
        if len(bad):
            raise ValueError(f"{len(bad)} of {len(rows)} videos have non-finite features "
                             f"(first: {rows[bad[0]].get('path', bad[0])}); they are never "
                             "stored, since they would rank first or last for every query")
        proxy = video_proxy(frames.float(), mask)  # [n, D] from the float16 values stored
        # Through the csv form, so that the columns have the types a reopened store reads.
        table = _read_rows(io.StringIO(pd.DataFrame(rows, columns=list(COLUMNS))
                                       .to_csv(index=False)))
        first = max(self.next_id, self.reserved)
        self.removed.update(range(self.next_id, first))  # ids of a write that never committed
        shard = _Shard(first, frames.numpy(), mask.numpy(), proxy.numpy(), _rows=table)
        self.shards.append(shard)
        self._starts = np.array([s.first_id for s in self.shards], dtype=np.int64)
        if self.directory is not None:
            self._write_shard(self.directory, shard, len(self.shards) - 1)
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
                self._write_shard(directory, shard, number)
        self.directory = directory

    def manifest(self) -> dict:
        """The store's fields of the index manifest."""
        return {"num_frames": self.num_frames, "dim": self.dim, "next_id": self.next_id,
                "removed": sorted(self.removed),
                "shards": [{"name": s.name, "first_id": s.first_id, "count": s.count,
                            "proxy": s.has_proxy_file,
                            **({"sha256": s.sha256} if s.sha256 else {})}
                           for s in self.shards]}

    @classmethod
    def open(cls, directory: str | os.PathLike, manifest: dict) -> FrameStore:
        """Map the shards a manifest lists (version 1 or 2); nothing is read but headers
        (and, for version-1 shards, the frames once to compute their proxies)."""
        directory = Path(directory)
        store = cls(manifest.get("num_frames"), manifest.get("dim"))
        store.directory = directory
        first = 0
        for entry in manifest["shards"]:
            first = entry.get("first_id", first)
            shard = _open_shard(directory, entry["name"], entry["count"], first)
            shard.sha256 = entry.get("sha256")
            store.shards.append(shard)
            first += entry["count"]
        if store.shards and store.num_frames is None:
            store.num_frames, store.dim = store.shards[0].frames.shape[1:]
        store._starts = np.array([s.first_id for s in store.shards], dtype=np.int64)
        store.removed = set(manifest.get("removed", []))
        return store

    def link(self, name: str, count: int) -> np.ndarray:
        """Append a shard file already in :attr:`directory` (``name`` relative to it, e.g.
        ``parts/rank-1/shard-00000``: a shard one process of a multi-process build wrote) as
        the next rows, without copying it; returns their new ids [count]."""
        if self.directory is None:
            raise ValueError("only a store with a directory can link shard files")
        shard = _open_shard(self.directory, name, count, self.next_id)
        if self.num_frames is None:
            self.num_frames, self.dim = shard.frames.shape[1:]
        if tuple(shard.frames.shape[1:]) != (self.num_frames, self.dim):
            raise StoreError(f"{self.directory}: shard {name} holds features of another "
                             "shape than the index; rebuild the index")
        self.shards.append(shard)
        self._starts = np.array([s.first_id for s in self.shards], dtype=np.int64)
        return np.arange(shard.first_id, shard.first_id + count, dtype=np.int64)

    def verify(self) -> list[str]:
        """Read every shard file whose checksum the manifest recorded and compare: one
        sentence per file that differs (empty: all match). Reads the whole store."""
        return [problem for shard in self.shards for problem in self._shard_problems(shard)]

    def damaged_shards(self) -> list[tuple[str, np.ndarray]]:
        """``(file, live row ids)`` of each shard whose files differ from their recorded
        checksums (reads those shards whole)."""
        out = []
        for shard in self.shards:
            if self._shard_problems(shard):
                ids = np.arange(shard.first_id, shard.first_id + shard.count)
                out.append((f"{shard.name}.safetensors", ids[self.is_live(ids)]))
        return out

    def _shard_problems(self, shard: _Shard) -> list[str]:
        """One sentence per file of ``shard`` that differs from its checksum; none for a
        shard without checksums or without live rows (a repair removes a damaged one's)."""
        if shard.sha256 is None or shard._directory is None or shard.name is None:
            return []
        ids = np.arange(shard.first_id, shard.first_id + shard.count)
        if not self.is_live(ids).any():
            return []
        problems = []
        for suffix, expected in shard.sha256.items():
            path = shard._directory / f"{shard.name}.{suffix}"
            got = _file_sha256(path)
            if got != expected:
                what = "is missing" if got is None else "does not match its checksum"
                problems.append(f"{path} {what} (rows {shard.first_id}.."
                                f"{shard.first_id + shard.count - 1})")
        return problems

    def _write_shard(self, directory: Path, shard: _Shard, number: int) -> None:
        name = f"shard-{number:05d}"
        # Through write_bytes_atomic: the process umask applies (safetensors' save_file
        # creates 0600 files), and a killed writer leaves no half file under the real name.
        data = save_safetensors({
            "frames": _tensor(shard.frames), "frame_mask": _tensor(shard.frame_mask),
            "proxy": _tensor(shard.proxy)})
        write_bytes_atomic(directory / f"{name}.safetensors", data, sync=True)
        buffer = io.StringIO()
        shard.rows.to_csv(buffer, index=False, columns=list(COLUMNS))
        text = buffer.getvalue().encode()
        write_bytes_atomic(directory / f"{name}.csv", text, sync=True)
        shard.sha256 = {"safetensors": hashlib.sha256(data).hexdigest(),
                        "csv": hashlib.sha256(text).hexdigest()}
        # Swap the in-memory arrays for maps of the file: memory is released to the page cache.
        tensors = _map_safetensors(directory / f"{name}.safetensors")
        shard.frames, shard.frame_mask = tensors["frames"], tensors["frame_mask"]
        shard.proxy, shard.name, shard.has_proxy_file = tensors["proxy"], name, True
        shard._directory = directory


def _open_shard(directory: Path, name: str, count: int, first_id: int) -> _Shard:
    """Map shard ``name`` of ``directory``, which the manifest says holds ``count`` rows."""
    tensors = _map_safetensors(directory / f"{name}.safetensors")
    frames, mask = tensors.get("frames"), tensors.get("frame_mask")
    if frames is None or mask is None or frames.shape[0] != count:
        raise StoreError(f"{directory}: shard {name} does not hold the {count} videos the "
                         "manifest lists; rebuild the index with 'python -m dicosa index'")
    proxy = tensors.get("proxy")
    if proxy is None:  # a version-1 shard
        proxy = video_proxy(torch.from_numpy(np.asarray(frames, dtype=np.float32)),
                            _tensor(mask)).numpy()
    return _Shard(first_id, frames, mask, proxy, name, has_proxy_file="proxy" in tensors,
                  _directory=directory)


def finite_rows(frames: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Whether every valid frame of each video is finite: bool [n] (padding is not read)."""
    finite = torch.isfinite(frames.float()).all(dim=-1) | ~mask.bool()  # [n, N]
    return finite.all(dim=1).numpy()


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 22):
                digest.update(block)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor of ``array`` (copied when it is a read-only map, as torch wants)."""
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _map_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read-only numpy views of a safetensors file's tensors over one memory map.

    safetensors' layout is an 8-byte little-endian header length, a JSON header of
    ``{name: {dtype, shape, data_offsets}}``, then the data; mapping the file once and viewing
    the ranges costs one file descriptor per shard and reads nothing until a row is touched.
    """
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except FileNotFoundError:
        raise StoreError(f"{path} is missing; rebuild the index with 'python -m dicosa "
                         "index'") from None
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is not a readable shard ({exc}); rebuild the index with "
                         "'python -m dicosa index'") from None
    out = {}
    start = 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        if start + end > data.size:
            raise StoreError(f"{path} is truncated; rebuild the index with 'python -m dicosa "
                             "index'")
        out[name] = data[start + begin:start + end].view(dtype).reshape(info["shape"])
    return out


def _read_rows(path: Path | io.StringIO) -> pd.DataFrame:
    # Only the numeric columns may hold NaN; a file may well be called "NA".
    try:
        table = pd.read_csv(path, dtype={"path": str, "title": str}, keep_default_na=False,
                            na_values={c: ["nan", ""] for c in _NUMERIC})
    except FileNotFoundError:
        raise StoreError(f"{path} is missing; rebuild the index with 'python -m dicosa "
                         "index'") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is damaged ({str(exc).splitlines()[0]}); run 'python -m "
                         "dicosa check INDEX' or rebuild the index") from None
    for column in COLUMNS:  # version-1 files lack the reserved columns
        if column not in table:
            table[column] = ""
    return table[list(COLUMNS)]
