"""The two shard layouts of the frame store, and their files.

A shard is two files written once and never changed: ``NAME.safetensors`` (the arrays) and
``NAME.csv`` (one metadata row per video, :data:`COLUMNS`). The store's *rows* are what search
ranks; how a shard keeps them is its layout (docs/index-format.md, "Shards", lists the
tensors of each):

``clips`` (:class:`ClipShard`): one row per video, N frames each (``frames`` ``[n, N, D]``,
``frame_mask``, ``proxy``). What an index without segments writes (and
``VideoIndex.add_features``).

``runs`` (:class:`RunShard`): each video's frames once, as one run (``frames`` ``[F, D]``
with their validity and times), and rows that are *segments*, views of the run
(:mod:`dicosa.data.segments`: ``segment``, ``segment_video``, ``segment_time``, ``proxy``),
with the ``pad`` vector that fills the slots of a row with fewer than N frames.

:meth:`gather` gives every layout's rows the same shape, ``[r, N, D]`` with a mask, so
everything that scores rows (first stages, rerank, heads) is the same for both.

Every shard file written now also holds ``video_crc32``, each video's CRC32
(:mod:`dicosa.search.row_checksums`); a shard without it reads all the same.

Either layout may keep its frames as int8 (the store's ``frame_dtype``,
:mod:`dicosa.search.frame_codec`), with ``frame_scale`` float32 holding one scale per frame;
:meth:`gather` dequantises the rows it reads, and nothing else, and ``codes`` hands them over
as kept (the rerank's read). A ``runs`` shard of int8 frames fills its rows' empty slots with
the pad's int8 form, as a ``clips`` shard keeps its padding.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import logging
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save as save_safetensors

from ..files import write_bytes_atomic
from ..functional import video_proxy
from .frame_codec import dequantise, quantise
from .row_checksums import CRC_TENSOR, video_crcs

__all__ = ["COLUMNS", "ClipShard", "RunShard", "StoreError", "VideoRun", "open_shard",
           "populate", "populate_shards", "read_rows", "write_shard"]

# path, duration (s, as decoded), fps, num_frames (in the file), valid_frames (stored frames
# that are real, the rest padding); title, text_only, frames_lost are reserved for heads that
# read them (empty until then); size (bytes) and mtime (s) of the file when it was encoded: how
# a later add notices a changed file (empty in indexes written before they were kept);
# expected_duration (s, what the container states) and damage (what the decode lost, in one
# sentence, dicosa.data.damage; empty for a whole video), empty in indexes written before.
COLUMNS = ("path", "duration", "fps", "num_frames", "valid_frames", "title", "text_only",
           "frames_lost", "size", "mtime", "expected_duration", "damage")
_NUMERIC = ("duration", "fps", "size", "mtime", "expected_duration")
_DTYPES = {"F16": np.float16, "F32": np.float32, "BOOL": np.bool_, "I64": np.int64,
           "I8": np.int8}
_REBUILD = "rebuild the index with 'dicosa index'"

log = logging.getLogger(__name__)


class StoreError(ValueError):
    """A store file that is missing, damaged or does not match its manifest."""


@dataclass
class VideoRun:
    """One encoded video as a run shard stores it (what ingest hands the store)."""

    frames: np.ndarray  # float16 [F, D]
    valid: np.ndarray  # bool [F]
    times: np.ndarray  # float32 [F] seconds (NaN: padding or unknown)
    segments: np.ndarray  # int64 [S, 2] (first frame, count) within this run
    spans: np.ndarray  # float32 [S, 2] (start, end) seconds
    row: dict  # the video's metadata (COLUMNS)


@dataclass
class _Files:
    """What every shard has besides its arrays: where it lives and its checksums."""

    first_id: int
    name: str | None = None  # file stem once written
    # sha256 of the written files, {"safetensors": hex, "csv": hex}; None where the manifest
    # recorded none (indexes written before checksums were kept)
    sha256: dict | None = None
    # CRC32 of each video's bytes (dicosa.search.row_checksums), int64 [videos]; None in a
    # shard written before they were kept
    video_crc: np.ndarray | None = field(default=None, repr=False, compare=False)
    _rows: pd.DataFrame | None = field(default=None, repr=False)
    _directory: Path | None = field(default=None, repr=False)
    _columns: dict = field(default_factory=dict, repr=False, compare=False)  # column()'s

    @property
    def rows(self) -> pd.DataFrame:
        """The shard's per-video metadata, read from its csv on first use."""
        if self._rows is None:
            assert self._directory is not None and self.name is not None
            self._rows = read_rows(self._directory / f"{self.name}.csv")
            if len(self._rows) != self.videos:
                raise StoreError(f"{self._directory}: {self.name}.csv holds {len(self._rows)} "
                                 f"videos but its features {self.videos}; rebuild the index")
        return self._rows

    def column(self, name: str) -> np.ndarray | None:
        """Metadata column ``name`` as an array (None: this shard's csv has no such column),
        made once: a shard's rows never change after it is written, and a search reads a
        few values of a few columns per hit."""
        if name not in self._columns:
            column = self.rows.get(name)
            self._columns[name] = None if column is None else column.to_numpy()
        return self._columns[name]

    @property
    def frame_dtype(self) -> str:
        return "float16" if self.frame_scale is None else "int8"

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors a shard file holds (``frame_scale`` for int8 frames only)."""
        arrays = {name: getattr(self, name) for name in self.NAMES}
        return arrays if self.frame_scale is None else {**arrays, "frame_scale": self.frame_scale}

    def remap(self, tensors: dict[str, np.ndarray]) -> None:
        """Take the arrays of ``tensors`` (the maps of its written file) for its own."""
        for name in self.NAMES:
            setattr(self, name, tensors[name])
        self.frame_scale, self.video_crc = tensors.get("frame_scale"), tensors.get(CRC_TENSOR)


@dataclass
class ClipShard(_Files):
    """``clips`` layout: one row per video of N frames (module docstring)."""

    frames: np.ndarray = None  # float16 (or int8) [n, N, D], a memory map once written
    frame_mask: np.ndarray = None  # bool [n, N]
    proxy: np.ndarray = None  # float32 [n, D]
    has_proxy_file: bool = True  # False for version-1 shards (proxy computed when opened)
    frame_scale: np.ndarray | None = None  # float32 [n, N] for int8 frames, else None
    _all_framed: bool | None = field(default=None, repr=False, compare=False)  # None: unread
    layout = "clips"
    NAMES = ("frames", "frame_mask", "proxy")  # its tensors, besides frame_scale

    @classmethod
    def build(cls, first_id: int, frames: np.ndarray, mask: np.ndarray,
              frame_dtype: str = "float16") -> ClipShard:
        """The in-memory shard of float16 ``frames [n, N, D]`` kept as ``frame_dtype``, its
        proxies computed from the values kept."""
        shard = cls(first_id, frame_mask=mask)
        shard.frames, shard.frame_scale = _encode(frames, frame_dtype)
        kept = shard.gather(np.arange(len(frames)), frames.shape[1])[0]
        shard.proxy = video_proxy(torch.from_numpy(kept).float(),
                                  torch.from_numpy(mask)).numpy()
        return shard

    @property
    def count(self) -> int:
        return self.frames.shape[0]

    @property
    def videos(self) -> int:
        return self.count

    @property
    def shape(self) -> tuple[int, int]:
        """(N, D) of its rows."""
        return tuple(self.frames.shape[1:])

    def gather(self, rows: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Frames ``[r, N, D]`` (float16 as kept, or float32 dequantised) and mask of rows."""
        frames = self.frames[rows]
        if self.frame_scale is not None:
            frames = dequantise(frames, self.frame_scale[rows])
        return frames, self.frame_mask[rows]

    def codes(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An int8 shard's rows as kept: codes ``[r, N, D]``, scales ``[r, N]``, mask."""
        return self.frames[rows], self.frame_scale[rows], self.frame_mask[rows]

    def valid_any(self, rows: np.ndarray) -> np.ndarray:
        return self.frame_mask[rows].any(1)

    def all_rows_have_frames(self) -> bool:
        """Whether no row of this shard is text-only (read once: a shard's mask never
        changes after it is written)."""
        if self._all_framed is None:
            self._all_framed = bool(self.frame_mask.any(1).all())
        return self._all_framed

    def video_of(self, rows: np.ndarray) -> np.ndarray:
        """Each row's video, as its line in the csv."""
        return np.asarray(rows, dtype=np.int64)

    def first_row(self, videos: np.ndarray) -> np.ndarray:
        """The first row of each video (csv line)."""
        return np.asarray(videos, dtype=np.int64)

    def rows_of(self, video: int) -> np.ndarray:
        return np.array([video], dtype=np.int64)

    def times(self, rows: np.ndarray, num_frames: int) -> np.ndarray:
        """Stored frame times: none in this layout (NaN; see dicosa.search.moment)."""
        return np.full((len(rows), num_frames), np.nan)

    def spans(self, rows: np.ndarray) -> np.ndarray:
        """[start, end] of each row: the whole video, [0, duration] (NaN when unknown)."""
        duration = self.column("duration")[rows].astype(np.float64)
        return np.stack([np.where(np.isnan(duration), np.nan, 0.0), duration], axis=1)

    def remap(self, tensors: dict[str, np.ndarray]) -> None:
        super().remap(tensors)
        self.has_proxy_file = True


@dataclass
class RunShard(_Files):
    """``runs`` layout: each video's frames once, rows are segments (module docstring)."""

    frames: np.ndarray = None  # float16 [F, D]
    frame_valid: np.ndarray = None  # bool [F]
    frame_time: np.ndarray = None  # float32 [F]
    segment: np.ndarray = None  # int64 [S, 2]
    segment_video: np.ndarray = None  # int64 [S]
    segment_time: np.ndarray = None  # float32 [S, 2]
    proxy: np.ndarray = None  # float32 [S, D]
    pad: np.ndarray = None  # float16 [D]
    frame_scale: np.ndarray | None = None  # float32 [F] for int8 frames, else None
    # (pad, its codes [D], its scale []): the int8 pad, made once per pad array
    _pad_int8: tuple | None = field(default=None, repr=False, compare=False)
    # The segment table of the file points outside its frames (a damaged row): reads clamp
    # every position into the file until a repair removes the row.
    damaged_table: bool = field(default=False, repr=False, compare=False)
    layout = "runs"
    NAMES = ("frames", "frame_valid", "frame_time", "segment", "segment_video", "segment_time",
             "proxy", "pad")  # its tensors, besides frame_scale

    @classmethod
    def build(cls, first_id: int, runs: list[VideoRun], pad: np.ndarray,
              num_frames: int, frame_dtype: str = "float16") -> RunShard:
        """The in-memory shard of ``runs``, frames kept as ``frame_dtype`` (proxies computed
        here, from the values kept)."""
        offsets = np.cumsum([0] + [len(r.frames) for r in runs])
        frames, scale = _encode(np.concatenate([np.asarray(r.frames, np.float16)
                                                for r in runs]), frame_dtype)
        shard = cls(
            first_id,
            frames=frames,
            frame_scale=scale,
            frame_valid=np.concatenate([np.asarray(r.valid, bool) for r in runs]),
            frame_time=np.concatenate([np.asarray(r.times, np.float32) for r in runs]),
            segment=np.concatenate([np.asarray(r.segments, np.int64) + np.array([o, 0])
                                    for r, o in zip(runs, offsets, strict=False)]),
            segment_video=np.concatenate([np.full(len(r.segments), v, np.int64)
                                          for v, r in enumerate(runs)]),
            segment_time=np.concatenate([np.asarray(r.spans, np.float32) for r in runs]),
            pad=np.asarray(pad, np.float16))
        frames, mask = shard.gather(np.arange(shard.count), num_frames)
        shard.proxy = video_proxy(torch.from_numpy(frames).float(),
                                  torch.from_numpy(mask)).numpy()
        return shard

    @property
    def count(self) -> int:
        return self.segment.shape[0]

    @property
    def videos(self) -> int:
        """Its videos: as many as it keeps CRCs for (the file's own count), else the last
        row's video + 1."""
        if self.video_crc is not None:
            return len(self.video_crc)
        return int(self.segment_video[-1]) + 1 if self.count else 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.segment[:, 1].max(initial=0)), self.frames.shape[1])

    def _slots(self, rows: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame positions ``[r, N]`` of rows (clamped) and which slots hold a frame."""
        first, count = self.segment[rows, 0], self.segment[rows, 1]  # [r]
        slot = np.arange(num_frames)[None]  # [1, N]
        inside = slot < count[:, None]  # [r, N]
        positions = np.where(inside, first[:, None] + slot, 0)
        if self.damaged_table:  # a damaged row reads what lies in the file, never beyond
            inside &= (positions >= 0) & (positions < len(self.frames))
            positions = np.where(inside, positions, 0)
        return positions, inside

    def gather(self, rows: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Frames ``[r, N, D]`` (float16 as kept, or float32 dequantised; the pad vector in
        the slots past a row's frames, as kept: an int8 shard's dequantised) and mask of
        rows."""
        positions, inside = self._slots(rows, num_frames)
        frames = self._frames(positions.reshape(-1)).reshape(*positions.shape, -1)
        frames[~inside] = self.pad if self.frame_scale is None else dequantise(*self._pad_codes())
        return frames, inside & self.frame_valid[positions]

    def codes(self, rows: np.ndarray, num_frames: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An int8 shard's rows as kept: codes ``[r, N, D]``, scales ``[r, N]`` (the pad's
        int8 form in the slots past a row's frames), mask."""
        positions, inside = self._slots(rows, num_frames)
        codes, scale = self.frames[positions], self.frame_scale[positions]
        codes[~inside], scale[~inside] = self._pad_codes()
        return codes, scale, inside & self.frame_valid[positions]

    def _pad_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """The pad vector as an int8 shard keeps a frame: codes ``[D]``, scale ``[]``."""
        if self._pad_int8 is None or self._pad_int8[0] is not self.pad:
            self._pad_int8 = (self.pad, *quantise(self.pad))
        return self._pad_int8[1:]

    def _frames(self, positions: np.ndarray | slice) -> np.ndarray:
        """Frames at ``positions`` as kept (float16) or dequantised (float32)."""
        if self.frame_scale is None:
            return self.frames[positions]
        return dequantise(self.frames[positions], self.frame_scale[positions])

    def valid_any(self, rows: np.ndarray) -> np.ndarray:
        longest = min(int(self.segment[rows, 1].max(initial=0)), len(self.frames))
        positions, inside = self._slots(rows, longest)
        return (inside & self.frame_valid[positions]).any(1)

    def all_rows_have_frames(self) -> bool:
        """Not known without reading every segment: False (each lookup reads its rows)."""
        return False

    def video_of(self, rows: np.ndarray) -> np.ndarray:
        return self.segment_video[rows]

    def first_row(self, videos: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.segment_video, videos, side="left").astype(np.int64)

    def rows_of(self, video: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.segment_video, [video, video + 1])
        return np.arange(lo, hi, dtype=np.int64)

    def times(self, rows: np.ndarray, num_frames: int) -> np.ndarray:
        positions, inside = self._slots(rows, num_frames)
        return np.where(inside, self.frame_time[positions], np.nan).astype(np.float64)

    def spans(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.segment_time[rows], dtype=np.float64)

    def run(self, video: int, frames: bool = True) -> dict[str, np.ndarray]:
        """Video ``video``'s whole run: its frames ``[F_v, D]``, ``valid``, ``times``, and
        its rows' ``segments`` (first frame relative to the run, count) and ``spans``;
        ``frames=False``: only its rows, segments and spans (nothing decoded)."""
        rows = self.rows_of(video)
        lo = max(0, int(self.segment[rows, 0].min()))
        layout = {"rows": rows, "segments": self.segment[rows] - np.array([lo, 0]),
                  "spans": self.segment_time[rows]}
        if not frames:
            return layout
        hi = int((self.segment[rows, 0] + self.segment[rows, 1]).max())
        return {"frames": self._frames(slice(lo, hi)).astype(np.float16, copy=False),
                "valid": self.frame_valid[lo:hi], "times": self.frame_time[lo:hi], **layout}


Shard = ClipShard | RunShard


def _encode(frames: np.ndarray, frame_dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """float16 frames ``[..., D]`` as a shard keeps them: ``(frames, None)`` or, for int8,
    ``(codes, scales)``."""
    if frame_dtype == "int8":
        return quantise(frames)
    return np.asarray(frames, np.float16), None


def write_shard(directory: Path, shard: Shard, name: str) -> None:
    """Write ``shard`` as ``name`` (safetensors, then csv; each whole, fsync'ed, renamed),
    record their checksums (the files' sha256, and in the file each video's CRC32), and
    swap its arrays for maps of the file."""
    # Through write_bytes_atomic: the process umask applies (safetensors' save_file creates
    # 0600 files), and a killed writer leaves no half file under the real name.
    arrays = {**shard.arrays(), CRC_TENSOR: video_crcs(shard)}
    data = save_safetensors({k: _tensor(v) for k, v in arrays.items()})
    write_bytes_atomic(directory / f"{name}.safetensors", data, sync=True)
    buffer = io.StringIO()
    shard.rows.to_csv(buffer, index=False, columns=list(COLUMNS))
    text = buffer.getvalue().encode()
    write_bytes_atomic(directory / f"{name}.csv", text, sync=True)
    shard.sha256 = {"safetensors": hashlib.sha256(data).hexdigest(),
                    "csv": hashlib.sha256(text).hexdigest()}
    # The in-memory arrays give way to maps of the file: memory goes to the page cache.
    shard.remap(_map_safetensors(directory / f"{name}.safetensors"))
    shard.name, shard._directory = name, directory


def open_shard(directory: Path, name: str, count: int, first_id: int) -> Shard:
    """Map shard ``name`` of ``directory``, which the manifest says holds ``count`` rows."""
    tensors = _map_safetensors(directory / f"{name}.safetensors")
    if "segment" in tensors:
        return _open_runs(directory, name, count, first_id, tensors)
    frames, mask = tensors.get("frames"), tensors.get("frame_mask")
    if frames is None or mask is None or frames.shape[0] != count:
        raise StoreError(f"{directory}: shard {name} does not hold the {count} videos the "
                         f"manifest lists; {_REBUILD}")
    _check_scale(directory, name, tensors)
    proxy = tensors.get("proxy")
    if proxy is None:  # a version-1 shard
        proxy = video_proxy(torch.from_numpy(np.asarray(frames, dtype=np.float32)),
                            _tensor(mask)).numpy()
    return ClipShard(first_id, name, frames=frames, frame_mask=mask, proxy=proxy,
                     has_proxy_file="proxy" in tensors, _directory=directory,
                     frame_scale=tensors.get("frame_scale"),
                     video_crc=tensors.get(CRC_TENSOR))


def _open_runs(directory: Path, name: str, count: int, first_id: int,
               tensors: dict[str, np.ndarray]) -> RunShard:
    names = RunShard.NAMES
    missing = [k for k in names if k not in tensors]
    segment, crc = tensors["segment"], tensors.get(CRC_TENSOR)
    if missing or segment.shape != (count, 2) or tensors["segment_video"].shape != (count,):
        raise StoreError(f"{directory}: shard {name} does not hold the {count} segments the "
                         f"manifest lists; {_REBUILD}")
    table = _table_sound(tensors, crc)
    if not table and crc is None:  # nothing says which rows: the shard cannot be read
        raise StoreError(f"{directory}: shard {name}'s segment table points outside its "
                         f"frames; {_REBUILD}")
    if not table:
        log.warning("%s: shard %s's segment table is damaged (a row points outside its "
                    "frames or its videos); its damaged rows read as empty until 'dicosa "
                    "check --repair' encodes them again", directory, name)
    _check_scale(directory, name, tensors)
    return RunShard(first_id, name, _directory=directory, frame_scale=tensors.get(
        "frame_scale"), video_crc=crc, damaged_table=not table,
        **{k: tensors[k] for k in names})


def _table_sound(tensors: dict[str, np.ndarray], crc: np.ndarray | None) -> bool:
    """Whether every row of a ``runs`` shard points inside its frames, and its videos
    ascend from 0 (below the number of CRCs the file keeps, where it keeps them)."""
    segment, video = tensors["segment"], tensors["segment_video"]
    if not len(segment):
        return True
    inside = (segment[:, 0].min() >= 0 and segment[:, 1].min() >= 0
              and (segment[:, 0] + segment[:, 1]).max() <= len(tensors["frames"]))
    ascending = video[0] == 0 and bool(np.all(np.diff(video) >= 0))
    return bool(inside and ascending and (crc is None or video[-1] < len(crc)))


def _check_scale(directory: Path, name: str, tensors: dict[str, np.ndarray]) -> None:
    """int8 frames need one scale per frame (``frame_scale``, the frames' shape but D)."""
    frames, scale = tensors["frames"], tensors.get("frame_scale")
    if frames.dtype == np.int8 and (scale is None or scale.shape != frames.shape[:-1]):
        raise StoreError(f"{directory}: shard {name} holds int8 frames without their scales; "
                         f"{_REBUILD}")


def finite_rows(frames: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Whether every valid frame of each video is finite: bool [n] (padding is not read)."""
    finite = torch.isfinite(frames.float()).all(dim=-1) | ~mask.bool()  # [n, N]
    return finite.all(dim=1).numpy()


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
            # A plain ndarray over the map: numpy.memmap views cost microseconds per
            # indexing (subclass bookkeeping), and a rerank indexes every shard it touches.
            data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ),
                                 dtype=np.uint8)
    except FileNotFoundError:
        raise StoreError(f"{path} is missing; {_REBUILD}") from None
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is not a readable shard ({exc}); {_REBUILD}") from None
    out = {}
    start = 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        if start + end > data.size:
            raise StoreError(f"{path} is truncated; {_REBUILD}")
        out[name] = data[start + begin:start + end].view(dtype).reshape(info["shape"])
    return out


# Linux's madvise(MADV_POPULATE_READ) (5.14 and later); Python 3.11's mmap does not name it.
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def _file_map(array: np.ndarray) -> mmap.mmap | None:
    """The memory map under ``array`` (a view of :func:`_map_safetensors`), or None."""
    mapped = array.base
    while isinstance(mapped, np.ndarray):
        mapped = mapped.base
    if isinstance(mapped, memoryview):  # np.frombuffer's view of the map
        mapped = mapped.obj
    return mapped if isinstance(mapped, mmap.mmap) else None


def uncached(array: np.ndarray) -> int:
    """The bytes of the file under ``array`` that are not in the page cache now (mincore(2));
    ``array``'s own size where it is not a file map or the system cannot say."""
    mapped = _file_map(array)
    if mapped is None:
        return array.nbytes
    if not len(mapped):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        pages = np.zeros(-(-len(mapped) // page), dtype=np.uint8)
        address = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(mapped)),
                        ctypes.c_void_p(pages.ctypes.data)) != 0:
            return len(mapped)
    except (OSError, AttributeError):  # no libc or no mincore here
        return len(mapped)
    return max(0, len(mapped) - int(np.count_nonzero(pages & 1)) * page)


def populate(array: np.ndarray) -> int:
    """Map the whole file under ``array`` (a view of :func:`_map_safetensors`) into this
    process now, reading what the page cache lacks: the bytes mapped, 0 where ``array`` is
    not a file map or the system cannot (not Linux, a kernel before 5.14). A map costs a page
    fault on the first touch of each page, even of one in the page cache."""
    mapped = _file_map(array)
    if mapped is None or not hasattr(mapped, "madvise"):
        return 0
    try:
        mapped.madvise(_MADV_POPULATE_READ)
    except OSError:  # EINVAL: a kernel without it
        return 0
    return len(mapped)


def populate_shards(shards: list[Shard], max_bytes: int) -> int:
    """Map every written shard's frames into this process now (:func:`populate`), so that
    reading rows costs no page faults; nothing when the frames not yet in the page cache
    exceed ``max_bytes`` (the page cache could not keep them, and reading them all would only
    push out other pages; frames another process has mapped in cost nothing more). The bytes
    mapped."""
    if sum(uncached(shard.frames) for shard in shards) > max_bytes:
        return 0
    return sum(populate(shard.frames) for shard in shards)


def read_rows(path: Path | io.StringIO) -> pd.DataFrame:
    """A shard's csv (or the same text) as the metadata table, columns :data:`COLUMNS`."""
    # Only the numeric columns may hold NaN; a file may well be called "NA".
    try:
        table = pd.read_csv(path, dtype={"path": str, "title": str, "damage": str},
                            keep_default_na=False,
                            na_values={c: ["nan", ""] for c in _NUMERIC})
    except FileNotFoundError:
        raise StoreError(f"{path} is missing; {_REBUILD}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is damaged ({str(exc).splitlines()[0]}); run 'dicosa "
                         "check INDEX' or rebuild the index") from None
    for column in COLUMNS:  # version-1 files lack the reserved columns
        if column not in table:
            table[column] = ""
    return table[list(COLUMNS)]
