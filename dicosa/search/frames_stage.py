"""A per-frame (multi-vector) first stage: every valid frame is a row, a video scores by its
best frame.

DiCoSA pools a video's frames under the text (Eq. 1): softmax_i(Tᵀ f_i / τ). A single
query-independent vector per video can only be the τ → ∞ limit (the frame mean), which
misses videos that match the text in a few frames. Scoring each frame alone and keeping a
video's best frame is the other limit (τ → 0): ``max_i q(t) · u(f_i)``, where u is any
query-independent summary applied to one frame (``"confidence"``, or the unit frame itself
for the ``zero-shot`` preset, whose S is then approximated by the best frame cosine).

The frames live in an inner dense stage (exact or faiss, :mod:`dicosa.search.backends`)
under frame row ids ``video_id * max_frames + i``; a search asks it for ``k * max_frames``
frames, enough to hold ``k`` distinct videos even when every video's frames all rank
first, and keeps the ``k`` best videos, each scored by its best frame found.

Memory is N vectors per video: at 1M videos of 12 frames, faiss IVF-PQ codes
(``{"index": "ivfpq"}``) are what keeps it in RAM. Beside the inner stage only the live
video ids are kept (8 bytes per video): no frame mask, since removing a video removes all
``max_frames`` of its possible frame rows (inner stages ignore rows they never held).
Milvus is not offered as the inner stage (:func:`check_backend`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from ..files import write_bytes_atomic
from .backends import make_first_stage, open_first_stage
from .dense import StageError, array_bytes, candidates_of, check_k
from .types import Candidates, EncodedQueries, FirstStage

__all__ = ["FRAMES_DIR", "FRAMES_FILE", "FramesStage", "check_backend", "frame_rows"]

FRAMES_DIR = "frames"  # the inner stage's files, under the index folder
FRAMES_FILE = "frames.npz"  # the live video ids and max_frames, in FRAMES_DIR


def frame_rows(ids: np.ndarray, mask: np.ndarray, max_frames: int) -> np.ndarray:
    """The frame row ids of videos ``ids`` [n] whose frames ``mask`` [n, N] marks."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = ids[:, None] * max_frames + np.arange(mask.shape[1])[None]  # [n, N]
    return rows[np.asarray(mask, dtype=bool)]


def check_backend(backend: str | None) -> None:
    """Refuse Milvus in one sentence: a Milvus search returns at most 16,384 rows, fewer than
    the C x N frames a search of C videos needs."""
    if backend == "milvus":
        raise StageError("the per-frame ('frames') first stage runs on the local (faiss) or "
                         "exact backend, not milvus; choose summary 'confidence' or "
                         "'distilled' for a Milvus index")


class FramesStage:
    """See the module. ``add(ids, (vectors [n, N, dim], mask [n, N]))``; the query vector is
    ``queries.extra["frames"]`` when set, else what the inner stage reads (the dense
    summary's query or T)."""

    name = "dense"  # the index's dense stage (search modes name it so)
    backend = "frames"

    def __init__(self, inner: FirstStage, max_frames: int):
        if max_frames < 1:
            raise StageError(f"max_frames must be at least 1, got {max_frames}")
        self.inner = inner
        self.max_frames = int(max_frames)
        self._ids = [np.zeros(0, dtype=np.int64)]  # live video ids, in chunks as added

    @classmethod
    def create(cls, backend: str, directory: str | os.PathLike | None, dim: int,
               max_frames: int, **options) -> FramesStage:
        check_backend(backend)
        inner = make_first_stage(backend, directory=_inner_dir(directory) or Path("."),
                                 dim=dim, **options)
        return cls(inner, max_frames)

    @property
    def ids(self) -> np.ndarray:
        """The live video ids [n] int64."""
        if len(self._ids) > 1:
            self._ids = [np.concatenate(self._ids)]
        return self._ids[0]

    def __len__(self) -> int:
        return sum(len(part) for part in self._ids)

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
        if not len(ids):
            return
        self.inner.add(frame_rows(ids, mask, self.max_frames), vectors[mask])
        self._ids.append(ids)

    def remove(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        held = ids[np.isin(ids, self.ids)]
        if len(held):
            self.inner.remove(frame_rows(held, np.ones((len(held), self.max_frames), bool),
                                         self.max_frames))
            self._ids = [self.ids[~np.isin(self.ids, held)]]

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        k = check_k(k)
        if "frames" in queries.extra:
            extra = {**queries.extra, "dense": queries.extra["frames"]}
            queries = dataclasses.replace(queries, extra=extra)
        found = self.inner.search(queries, k * self.max_frames)  # frames, best first
        videos = np.where(found.ids >= 0, found.ids // self.max_frames, -1)
        best = []
        for row, row_scores in zip(videos, found.scores, strict=True):
            valid = row >= 0
            _, first = np.unique(row[valid], return_index=True)
            order = np.sort(first)[:k]  # each video at its best (first) frame
            best.append((row[valid][order], row_scores[valid][order]))
        return candidates_of(best, k, self.name)

    def save(self, directory: str | os.PathLike) -> None:
        """The inner stage's files, then the video ids: a crash between them leaves ids that
        disagree with the manifest's ``synced``, and the stage is rebuilt."""
        inner = _inner_dir(directory)
        inner.mkdir(parents=True, exist_ok=True)
        self.inner.save(inner)
        write_bytes_atomic(inner / FRAMES_FILE,
                           array_bytes(ids=self.ids, max_frames=np.array(self.max_frames)))

    @classmethod
    def open(cls, directory: str | os.PathLike) -> FramesStage:
        inner = _inner_dir(directory)
        try:
            with np.load(inner / FRAMES_FILE) as data:
                ids, max_frames = data["ids"], int(data["max_frames"])
        except FileNotFoundError:
            raise FileNotFoundError(f"{directory}: the per-frame first stage's "
                                    f"{FRAMES_DIR}/{FRAMES_FILE} is missing") from None
        except (OSError, ValueError, KeyError) as exc:
            raise StageError(f"{directory}: the per-frame first stage's {FRAMES_FILE} cannot "
                             f"be read ({type(exc).__name__})") from None
        stage = cls(open_first_stage(inner), max_frames)
        stage._ids = [np.asarray(ids, dtype=np.int64)]
        return stage

    def describe(self) -> dict:
        inner = getattr(self.inner, "describe", dict)()
        return {"backend": self.backend, "max_frames": self.max_frames, "inner": inner}


def _inner_dir(directory: str | os.PathLike | None) -> Path | None:
    return None if directory is None else Path(directory) / FRAMES_DIR
