"""Dense first stages: one query-independent vector per video, compared with the text vector.

The vector is the dense proxy, the masked mean of the video's frame features (Eq. 1 at
τ → ∞, :func:`dicosa.functional.video_proxy`). Both sides are L2-normalised, so the stage
ranks by cosine: DiCoSA's own score is a confidence-weighted sum of per-factor *cosines*
(Eq. 9), blind to the length of the pooled video vector, while a raw inner product would
favour videos whose frames agree (a long mean) over dynamic ones whose mean shrinks. The text
side's length never changes a ranking; normalising it only makes scores comparable.

``ExactStage`` is the reference (numpy, exhaustive) and the default for small collections;
``FaissStage`` is HNSW (default, 8-bit scalar-quantised vectors) or IVF-PQ through faiss-cpu.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import faiss
import numpy as np
import torch

from ..config import dataclass_from_dict
from ..files import fault_point, storage_error, write_bytes_atomic, write_text_atomic
from ..functional import video_proxy
from ..model import VideoFeatures
from .types import Candidates, EncodedQueries

__all__ = ["ExactStage", "FaissConfig", "FaissStage", "StageError", "proxy_vectors"]


class StageError(ValueError):
    """A first stage cannot do what was asked (wrong width, duplicate ids, unknown backend,
    unreachable server); the message is one sentence."""


# -- inputs ---------------------------------------------------------------------------------
def proxy_vectors(videos: object, dim: int, normalize: bool = True) -> np.ndarray:
    """What ``add`` accepts as ``videos`` -> float32 C-contiguous ``[n, D]`` (unit rows).

    ``videos`` is the dense proxy ``[n, D]`` (numpy or torch) or ``VideoFeatures`` (whose
    proxy is computed here). Zero rows stay zero rather than becoming NaN.
    """
    if isinstance(videos, VideoFeatures):
        videos = video_proxy(videos.frames.float(), videos.frame_mask)
    if isinstance(videos, torch.Tensor):
        videos = videos.detach().float().cpu().numpy()
    vectors = np.ascontiguousarray(np.asarray(videos, dtype=np.float32))
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise StageError(f"video vectors must be [n, {dim}], got shape {vectors.shape}")
    if not np.isfinite(vectors).all():
        raise StageError("video vectors contain NaN or infinity")
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, np.float32(1e-12))
    return np.ascontiguousarray(vectors, dtype=np.float32)


def query_vectors(queries: EncodedQueries, dim: int, normalize: bool = True) -> np.ndarray:
    """The query side as float32 ``[Q, D]`` (unit rows): ``queries.extra["dense"]`` when a
    caller put another query-independent summary in the stage (its query half goes there),
    else the DiCoSA text vectors T."""
    return proxy_vectors(queries.extra.get("dense", queries.text.text), dim, normalize)


def row_ids(ids: object, count: int | None = None) -> np.ndarray:
    """Row ids as int64 ``[n]``: non-negative, unique, ``count`` of them when given."""
    ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
    if count is not None and len(ids) != count:
        raise StageError(f"got {len(ids)} ids for {count} vectors")
    if (ids < 0).any():
        raise StageError("row ids must be non-negative")
    if len(np.unique(ids)) != len(ids):
        raise StageError("row ids repeat within one call")
    return ids


def check_new(ids: np.ndarray, known: np.ndarray) -> None:
    """Row ids are never reused: adding one already added (or added and removed) is an error."""
    if not len(ids) or not len(known) or ids.min() > known.max():
        return  # ids handed out in increasing order (the usual case): no set test needed
    seen = ids[np.isin(ids, known)]
    if len(seen):
        raise StageError(f"row id {int(seen[0])} was already added ({len(seen)} of {len(ids)} "
                         "ids); row ids are never reused")


def pad_candidates(ids: np.ndarray, scores: np.ndarray, k: int, stage: str) -> Candidates:
    """``Candidates`` of width ``k``: ``-1`` ids and ``-inf`` scores pad what is missing."""
    ids = np.asarray(ids, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float32).copy()
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    scores[ids < 0] = -np.inf
    return Candidates(ids=ids, scores=scores, stage=stage)


def candidates_of(found: list[tuple], k: int, stage: str) -> Candidates:
    """``Candidates`` of width ``k`` from each query's ``(ids, scores)``, best first (the first
    ``k`` of each kept; ``-1`` ids and ``-inf`` scores pad what is missing)."""
    ids = np.full((len(found), k), -1, dtype=np.int64)
    scores = np.full((len(found), k), -np.inf, dtype=np.float32)
    for q, (row_ids, row_scores) in enumerate(found):
        n = min(k, len(row_ids))
        ids[q, :n], scores[q, :n] = row_ids[:n], row_scores[:n]
    return Candidates(ids, scores, stage)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions ``[Q, min(k, n)]`` of the ``k`` best of each row of ``scores [Q, n]``, best
    first, ties to the smaller position (a stable descending argsort's first ``k``; NaN
    counts as -inf), without sorting all n: only the rows scoring at least the k-th best."""
    scores = np.where(np.isnan(scores), -np.inf, scores)
    count = min(k, scores.shape[1])
    if count == scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")
    kth = -np.partition(-scores, count - 1, axis=1)[:, count - 1]  # [Q] the k-th best score
    out = np.empty((len(scores), count), dtype=np.int64)
    for q, row in enumerate(scores):
        keep = np.flatnonzero(row >= kth[q])  # every row tied with the k-th best too
        out[q] = keep[np.argsort(-row[keep], kind="stable")[:count]]
    return out


def top_candidates(ids: np.ndarray, scores: np.ndarray, k: int, stage: str) -> Candidates:
    """The ``k`` best of ``scores [Q, n]`` over rows ``ids [n]`` (:func:`top_k`), padded to
    width ``k``."""
    best = top_k(scores, min(k, len(ids)))  # [Q, min(k, n)]
    return pad_candidates(ids[best], np.take_along_axis(scores, best, axis=1), k, stage)


def array_bytes(*array: np.ndarray, **arrays: np.ndarray) -> bytes:
    """The file ``np.save`` writes of one ``array``, or ``np.savez`` of named ``arrays``."""
    buffer = io.BytesIO()
    if array:
        np.save(buffer, *array)
    else:
        np.savez(buffer, **arrays)
    return buffer.getvalue()


def check_k(k: int) -> int:
    if int(k) < 1:
        raise StageError(f"k must be at least 1, got {k}")
    return int(k)


# -- exact ----------------------------------------------------------------------------------
class ExactStage:
    """Exhaustive inner product over unit proxy vectors held in RAM: the reference.

    Memory is ``4·D`` bytes per video (2 GiB at 1M × 512); use :class:`FaissStage` beyond
    about 100k videos. Files: ``dense.exact.npz`` (ids and vectors).
    """

    name = "dense"
    backend = "exact"

    def __init__(self, dim: int, *, normalize: bool = True) -> None:
        self.dim, self.normalize = int(dim), bool(normalize)
        self.ids = np.zeros(0, dtype=np.int64)  # [n] live rows
        self.vectors = np.zeros((0, self.dim), dtype=np.float32)  # [n, D]
        self.removed = np.zeros(0, dtype=np.int64)  # ids removed, never reused

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids: np.ndarray, videos: object) -> None:
        vectors = proxy_vectors(videos, self.dim, self.normalize)
        ids = row_ids(ids, len(vectors))
        check_new(ids, np.concatenate([self.ids, self.removed]))
        self.ids = np.concatenate([self.ids, ids])
        self.vectors = np.concatenate([self.vectors, vectors])

    def remove(self, ids: np.ndarray) -> None:
        ids = row_ids(ids)
        keep = ~np.isin(self.ids, ids)
        self.removed = np.union1d(self.removed, ids)
        self.ids, self.vectors = self.ids[keep], self.vectors[keep]

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        k = check_k(k)
        scores = query_vectors(queries, self.dim, self.normalize) @ self.vectors.T  # [Q, n]
        return top_candidates(self.ids, scores, k, self.name)

    def describe(self) -> dict:
        return {"backend": self.backend, "name": self.name, "dim": self.dim,
                "normalize": self.normalize}

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(directory / "dense.exact.npz",
                           array_bytes(ids=self.ids, vectors=self.vectors, removed=self.removed))
        write_text_atomic(directory / STAGE_FILE, json.dumps(self.describe(), indent=2))

    @classmethod
    def open(cls, directory: str | os.PathLike, info: dict) -> ExactStage:
        stage = cls(info["dim"], normalize=info.get("normalize", True))
        stage.ids, stage.vectors, stage.removed = _read_arrays(
            Path(directory) / "dense.exact.npz", ("ids", "vectors", "removed"))
        return stage


STAGE_FILE = "first_stage.json"  # what make/open_first_stage read: backend, config, dim


# -- faiss ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FaissConfig:
    """A faiss first stage. ``index="hnsw"`` (default): a graph over all vectors in RAM,
    ``storage`` choosing how each vector is kept: ``sq8`` (default, D bytes + 8-bit scalar
    quantiser), ``fp16`` (2·D bytes) or ``flat`` (4·D bytes; docs/search.md compares them).
    ``index="ivfpq"``: inverted lists of product-quantised codes (``pq_m`` bytes per vector),
    for collections beyond RAM. Indexes that learn from the data (sq8, ivfpq) keep the first
    vectors aside and search them exactly until ``train_min`` (ivfpq: at least 39·nlist) have
    arrived, then train on them (at most ``train_size``) and move them in.
    """

    index: Literal["hnsw", "ivfpq"] = "hnsw"
    storage: Literal["flat", "fp16", "sq8"] = "sq8"
    hnsw_m: int = 32  # graph neighbours per node (M)
    ef_construction: int = 200
    ef_search: int = 256  # search breadth; raised to k when k is larger
    nlist: int = 1024  # IVF lists
    pq_m: int = 64  # PQ sub-quantisers (bytes per vector at 8 bits); D is zero-padded to a multiple
    pq_bits: int = 8
    nprobe: int = 32  # IVF lists visited per query
    train_min: int = 10_000
    train_size: int = 100_000
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.index not in ("hnsw", "ivfpq"):
            raise StageError(f"faiss index must be 'hnsw' or 'ivfpq', got {self.index!r}")
        if self.storage not in ("flat", "fp16", "sq8"):
            raise StageError(f"faiss storage must be 'flat', 'fp16' or 'sq8', got "
                             f"{self.storage!r}")
        for key in ("hnsw_m", "ef_construction", "ef_search", "nlist", "pq_m", "pq_bits",
                    "nprobe", "train_min", "train_size"):
            if getattr(self, key) < 1:
                raise StageError(f"faiss {key} must be at least 1, got {getattr(self, key)}")


_STORAGE = {"fp16": "QT_fp16", "sq8": "QT_8bit"}


class FaissStage:
    """faiss HNSW (default, SQ8 storage) or IVF-PQ over unit proxies, inner product (= cosine).

    Ids are the store's row ids (``IndexIDMap2`` around HNSW; IVF stores ids natively).
    Removal: IVF removes the codes; HNSW cannot remove from its graph, so removed ids become
    tombstones that an ``IDSelector`` skips during the graph search (results stay exactly
    ``k`` live rows; the graph still routes through removed nodes, so recall holds until
    many are removed — :meth:`compact` then). Until a trained index is trained (see
    :class:`FaissConfig`), rows wait in an exact ``pending`` stage. Files: ``dense.faiss``,
    ``dense.removed.npy`` and ``dense.pending.npz``.
    """

    name = "dense"
    backend = "faiss"

    def __init__(self, dim: int, config: FaissConfig | None = None) -> None:
        self.dim, self.config = int(dim), config or FaissConfig()
        self.index = self._new_index()
        self.removed = np.zeros(0, dtype=np.int64)  # tombstones, sorted
        self.pending = ExactStage(self.dim, normalize=self.config.normalize)  # before training
        self._selector = None

    def _new_index(self) -> faiss.Index:
        cfg, metric = self.config, faiss.METRIC_INNER_PRODUCT
        if cfg.index == "ivfpq":
            # PQ cuts a vector into pq_m equal parts: zero columns up to a multiple of pq_m
            # change no inner product (the 129-d distilled summary works with pq_m=64).
            width = -(-self.dim // cfg.pq_m) * cfg.pq_m
            quantizer = faiss.IndexFlatIP(width)
            index = faiss.IndexIVFPQ(quantizer, width, cfg.nlist, cfg.pq_m, cfg.pq_bits, metric)
            index.own_fields = True
            quantizer.this.disown()  # the IVF index frees its quantizer
            return index
        if cfg.storage == "flat":
            graph = faiss.IndexHNSWFlat(self.dim, cfg.hnsw_m, metric)
        else:
            kind = getattr(faiss.ScalarQuantizer, _STORAGE[cfg.storage])
            graph = faiss.IndexHNSWSQ(self.dim, kind, cfg.hnsw_m, metric)
        graph.hnsw.efConstruction = cfg.ef_construction
        index = faiss.IndexIDMap2(graph)
        index.own_fields = True
        graph.this.disown()
        return index

    @property
    def _hnsw(self) -> bool:
        return self.config.index == "hnsw"

    def _widen(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors [n, D]`` zero-padded to the faiss index's width (IVF-PQ's padding)."""
        extra = self.index.d - vectors.shape[1]
        return np.ascontiguousarray(np.pad(vectors, ((0, 0), (0, extra)))) if extra else vectors

    def __len__(self) -> int:
        """Live rows (added minus removed)."""
        indexed = int(self.index.ntotal)
        if self._hnsw:
            indexed -= int(np.isin(self.removed, faiss.vector_to_array(self.index.id_map)).sum())
        return indexed + len(self.pending)

    def _indexed_ids(self) -> np.ndarray:
        if self._hnsw:
            return faiss.vector_to_array(self.index.id_map)
        return _ivf_ids(self.index)

    def known_ids(self) -> np.ndarray:
        """Every id ever added (live or removed)."""
        return np.concatenate([self._indexed_ids(), self.pending.ids, self.removed])

    @property
    def train_min(self) -> int:
        cfg = self.config
        return max(cfg.train_min, 39 * cfg.nlist) if cfg.index == "ivfpq" else cfg.train_min

    def add(self, ids: np.ndarray, videos: object) -> None:
        vectors = proxy_vectors(videos, self.dim, self.config.normalize)
        ids = row_ids(ids, len(vectors))
        if len(ids) == 0:
            return
        check_new(ids, self.known_ids())
        if self.index.is_trained:
            self.index.add_with_ids(self._widen(vectors), ids)
            return
        self.pending.add(ids, vectors)
        if len(self.pending) >= self.train_min:
            self._train_and_move()

    def _train_and_move(self) -> None:
        """Train on the pending rows (a sample of ``train_size``) and index them all."""
        vectors, ids, cfg = self.pending.vectors, self.pending.ids, self.config
        sample = vectors
        if len(vectors) > cfg.train_size:
            rng = np.random.default_rng(0)
            sample = vectors[np.sort(rng.choice(len(vectors), cfg.train_size, replace=False))]
        self.index.train(self._widen(sample))
        self.index.add_with_ids(self._widen(vectors), ids)
        self.pending = ExactStage(self.dim, normalize=cfg.normalize)

    def remove(self, ids: np.ndarray) -> None:
        ids = row_ids(ids)
        present = ids[np.isin(ids, self.known_ids())]
        self.pending.remove(present)
        if not self._hnsw and len(present):
            self.index.remove_ids(faiss.IDSelectorBatch(len(present), faiss.swig_ptr(present)))
        self.removed = np.union1d(self.removed, present)
        self._selector = None

    def compact(self) -> None:
        """Rebuild an HNSW graph without its tombstoned rows (from the stored codes: no store
        access, and re-encoding decoded fp16/SQ8 values loses nothing further). Worth it once a
        large share of the rows was removed; IVF-PQ removes rows for real and needs none."""
        if not self._hnsw or not self.index.is_trained:
            return
        ids = faiss.vector_to_array(self.index.id_map)
        live = ids[~np.isin(ids, self.removed)]
        vectors = self.index.reconstruct_batch(live) if len(live) else None
        self.index = self._new_index()
        if vectors is not None:
            self.pending.ids, self.pending.vectors = live, vectors
            self._train_and_move()

    def _search_parameters(self, k: int):
        cfg = self.config
        if not self._hnsw:
            # Enough lists to hold about 2k rows on average: a large k (the per-frame stage
            # asks for C x N frames) still fills its answer in a collection of short lists.
            needed = -(-2 * k * cfg.nlist // max(1, int(self.index.ntotal)))
            return faiss.SearchParametersIVF(nprobe=min(cfg.nlist, max(cfg.nprobe, needed)))
        params = faiss.SearchParametersHNSW(efSearch=max(cfg.ef_search, k))
        if len(self.removed):
            if self._selector is None:  # built once per set of tombstones
                batch = faiss.IDSelectorBatch(len(self.removed), faiss.swig_ptr(self.removed))
                self._selector = (faiss.IDSelectorNot(batch), batch)
            params.sel = self._selector[0]
        return params

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        k = check_k(k)
        if not self.index.is_trained:  # only pending rows so far
            return self.pending.search(queries, k)
        texts = query_vectors(queries, self.dim, self.config.normalize)
        if self.index.ntotal == 0:
            return pad_candidates(np.zeros((len(texts), 0)), np.zeros((len(texts), 0)), k,
                                  self.name)
        scores, ids = self.index.search(self._widen(texts), k,
                                        params=self._search_parameters(k))
        return pad_candidates(ids, scores, k, self.name)

    def describe(self) -> dict:
        return {"backend": self.backend, "name": self.name, "dim": self.dim,
                "config": asdict(self.config)}

    def save(self, directory: str | os.PathLike) -> None:
        """Tombstones first, then the index, then the description: a crash between the
        renames leaves tombstones that are a superset of the index's removals, never a removed
        row that comes back."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(directory / "dense.removed.npy", array_bytes(self.removed))
        write_bytes_atomic(directory / "dense.pending.npz",
                           array_bytes(ids=self.pending.ids, vectors=self.pending.vectors))
        _write_index_atomic(self.index, directory / "dense.faiss")
        write_text_atomic(directory / STAGE_FILE, json.dumps(self.describe(), indent=2))

    @classmethod
    def open(cls, directory: str | os.PathLike, info: dict) -> FaissStage:
        directory = Path(directory)
        config = dataclass_from_dict(FaissConfig, info.get("config", {}))
        stage = cls(info["dim"], config)
        stage.index = _read(directory / "dense.faiss", lambda p: faiss.read_index(str(p)))
        stage.removed = _read(directory / "dense.removed.npy", np.load)
        stage.pending.ids, stage.pending.vectors = _read_arrays(
            directory / "dense.pending.npz", ("ids", "vectors"))
        return stage

    def set_search(self, **changes: int) -> None:
        """Change search-time parameters (``ef_search``, ``nprobe``) without rebuilding."""
        from dataclasses import replace

        unknown = set(changes) - {"ef_search", "nprobe"}
        if unknown:
            raise StageError(f"only ef_search and nprobe change at search time, not "
                             f"{', '.join(sorted(unknown))}")
        self.config = replace(self.config, **changes)


def _read(path: Path, read):
    """``read(path)``; a file that is there but cannot be read is one StageError naming it
    (a missing one stays FileNotFoundError)."""
    try:
        return read(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # numpy, zipfile and faiss each raise their own kinds
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StageError(f"{path} cannot be read ({reason})") from None


def _read_arrays(path: Path, names: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """Arrays ``names`` of the ``.npz`` file ``path``, read whole; a damaged file (or one
    without them) is one StageError naming it."""
    def read(file: Path) -> tuple[np.ndarray, ...]:
        with np.load(file) as data:
            return tuple(data[name] for name in names)

    return _read(path, read)


def _write_index_atomic(index: faiss.Index, path: Path) -> None:
    """faiss writes the file itself (no second copy in memory); a temporary name in the same
    folder, then a rename, makes it whole or absent. ``fopen`` honours the umask."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fault_point(path.name)
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # faiss reports a failed fwrite as RuntimeError
        err = exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc).splitlines()[0])
        if not isinstance(exc, OSError) and shutil.disk_usage(path.parent).free < 1 << 20:
            err = OSError(errno.ENOSPC, "no space")
        raise storage_error(err, path, "writing") from None
    finally:
        tmp.unlink(missing_ok=True)


def _ivf_ids(index: faiss.Index) -> np.ndarray:
    """The ids stored in an IVF index's inverted lists."""
    lists = index.invlists
    parts = [faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
             for i in range(index.nlist) if lists.list_size(i)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
