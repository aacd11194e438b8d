"""A per-frame (multi-vector) first stage: every valid frame is a row, a video scores by its
best frame.

DiCoSA pools a video's frames under the text (Eq. 1): softmax_i(Tᵀ f_i / τ). A single
query-independent vector per video can only be the τ → ∞ limit (the frame mean), which
misses videos that match the text in a few frames. Scoring each frame alone and keeping a
video's best frame is the other limit (τ → 0): ``max_i q(t) · u(f_i)``, where u is any
query-independent summary applied to one frame (``"confidence"``, or the unit frame itself
for the ``zero-shot`` preset, whose S is then approximated by the best frame cosine).

The frames live in an inner dense stage (exact or faiss, :mod:`dicosa.search.backends`)
under frame row ids ``video_id * max_frames + i``; a search asks it for ``k * expand``
frames and keeps the ``k`` best distinct videos, each scored by its best frame found.
Memory is N vectors per video: at 1M videos of 12 frames, faiss IVF-PQ codes
(``{"index": "ivfpq"}``) are what keeps it in RAM.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from .backends import make_first_stage, open_first_stage
from .dense import StageError, check_k, pad_candidates
from .types import Candidates, EncodedQueries, FirstStage

__all__ = ["FRAMES_DIR", "FramesStage", "frame_rows"]

FRAMES_DIR = "frames"  # the inner stage's files, under the index folder


def frame_rows(ids: np.ndarray, mask: np.ndarray, max_frames: int) -> np.ndarray:
    """The frame row ids of videos ``ids`` [n] whose valid frames ``mask`` [n, N] marks."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = ids[:, None] * max_frames + np.arange(mask.shape[1])[None]  # [n, N]
    return rows[np.asarray(mask, dtype=bool)]


class FramesStage:
    """See the module. ``add(ids, (vectors [n, N, dim], mask [n, N]))``; the query vector is
    ``queries.extra["frames"]`` when set, else what the inner stage reads (the dense
    summary's query or T)."""

    name = "frames"

    def __init__(self, inner: FirstStage, max_frames: int, expand: int | None = None):
        if max_frames < 1:
            raise StageError(f"max_frames must be at least 1, got {max_frames}")
        self.inner = inner
        self.max_frames = int(max_frames)
        self.expand = int(expand or max_frames)  # frames fetched per wanted video
        self.masks: dict[int, np.ndarray] = {}  # video id -> its valid frames [N]

    @classmethod
    def create(cls, backend: str, directory: str | os.PathLike | None, dim: int,
               max_frames: int, **options) -> FramesStage:
        inner = make_first_stage(backend, directory=_inner_dir(directory), dim=dim, **options)
        return cls(inner, max_frames)

    def __len__(self) -> int:
        return len(self.masks)

    def add(self, ids: np.ndarray, videos: object) -> None:
        vectors, mask = videos
        vectors, mask = np.asarray(vectors, dtype=np.float32), np.asarray(mask, dtype=bool)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if vectors.ndim != 3 or mask.shape != vectors.shape[:2] or len(ids) != len(mask):
            raise StageError(f"frame vectors must be [n, N, dim] with a [n, N] mask for n ids, "
                             f"got {vectors.shape}, {mask.shape} and {len(ids)} ids")
        if mask.shape[1] > self.max_frames:
            raise StageError(f"{mask.shape[1]} frames per video but the stage holds "
                             f"{self.max_frames}")
        rows = frame_rows(ids, mask, self.max_frames)
        self.inner.add(rows, vectors[mask])
        self.masks.update(zip(ids.tolist(), mask, strict=True))

    def remove(self, ids: np.ndarray) -> None:
        ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) in self.masks]
        if ids:
            masks = np.stack([self.masks.pop(i) for i in ids])
            self.inner.remove(frame_rows(np.asarray(ids), masks, self.max_frames))

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        k = check_k(k)
        if "frames" in queries.extra:
            extra = {**queries.extra, "dense": queries.extra["frames"]}
            queries = dataclasses.replace(queries, extra=extra)
        found = self.inner.search(queries, k * self.expand)  # frames, best first
        videos = np.where(found.ids >= 0, found.ids // self.max_frames, -1)
        ids = np.full((len(videos), k), -1, dtype=np.int64)
        scores = np.full((len(videos), k), -np.inf, dtype=np.float32)
        for q, (row, row_scores) in enumerate(zip(videos, found.scores, strict=True)):
            valid = row >= 0
            _, first = np.unique(row[valid], return_index=True)
            order = np.sort(first)[:k]  # each video at its best (first) frame
            ids[q, :len(order)] = row[valid][order]
            scores[q, :len(order)] = row_scores[valid][order]
        return pad_candidates(ids, scores, k, self.name)

    def save(self, directory: str | os.PathLike) -> None:
        inner = _inner_dir(directory)
        inner.mkdir(parents=True, exist_ok=True)
        self.inner.save(inner)
        ids = np.fromiter(self.masks, dtype=np.int64, count=len(self.masks))
        masks = (np.stack(list(self.masks.values())) if self.masks else
                 np.zeros((0, self.max_frames), dtype=bool))
        from ..checkpoint import write_bytes_atomic
        from .dense import _npz_bytes

        write_bytes_atomic(inner / "frames.npz",
                           _npz_bytes(ids=ids, masks=masks,
                                      meta=np.array([self.max_frames, self.expand])))

    @classmethod
    def open(cls, directory: str | os.PathLike) -> FramesStage:
        inner = _inner_dir(directory)
        with np.load(inner / "frames.npz") as data:
            max_frames, expand = (int(v) for v in data["meta"])
            stage = cls(open_first_stage(inner), max_frames, expand)
            stage.masks = dict(zip(data["ids"].tolist(), data["masks"], strict=True))
        return stage


def _inner_dir(directory: str | os.PathLike | None) -> Path | None:
    return None if directory is None else Path(directory) / FRAMES_DIR
