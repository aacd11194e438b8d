"""The stage set: the first stages of an index, kept in step with its frame store.

One dense stage (the backend the manifest names, over a per-video *summary* of the stored
frames: :class:`~dicosa.search.proxy.Summary`) and the stages plugins register (a sparse
lexical stage, a title stage, ...). Every row the store gains or loses is given to, or taken
from, every stage here, so a search never meets a stage that lags the store; a dense stage
whose files lag the manifest (an interrupted write) is rebuilt from the stored proxies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model import DiCoSA, VideoFeatures
from ..search.proxy import Summary
from ..search.store import FrameStore
from ..search.types import FirstStage

__all__ = ["DEFAULT_BACKEND", "DEFAULT_SUMMARY", "FRAMES_OPTIONS", "SUMMARY_HEAD",
           "Registered", "StageSet", "default_summary_kind", "frames_options"]

log = logging.getLogger(__name__)

DEFAULT_BACKEND = "local"  # faiss HNSW, in the index folder
SUMMARY_HEAD = "summary_head.pt"  # the "distilled" summary's head (dicosa/heads/summary.py)
DEFAULT_SUMMARY = "frames"  # a new index without a trained head (milvus: "confidence")
# The per-frame stage on faiss: IVF-PQ. 1,024 lists train on 40k frames (3,300 videos of 12;
# the stage searches them exactly until then); nprobe 32 scans ~3% of the frames (raised by
# FaissStage when C x N frames need more). pq_m: frames_options.
FRAMES_OPTIONS = {"index": "ivfpq", "nlist": 1024, "nprobe": 32}
_FRAME_CHUNK = 2048  # videos whose per-frame vectors are computed at once


def default_summary_kind(backend: str | None) -> str:
    """The summary of a new index given no trained head: ``"frames"``, except on Milvus
    (which the per-frame stage does not run on): ``"confidence"``."""
    return "confidence" if backend == "milvus" else DEFAULT_SUMMARY


def frames_options(backend: str, options: dict, dim: int) -> dict:
    """The per-frame stage's settings: ``options`` over the defaults of ``backend`` (faiss:
    :data:`FRAMES_OPTIONS` and ``pq_m`` = dim/8 between 8 and 32 code bytes per frame, 40
    bytes with its id: 0.45 GiB at 12M frames) unless ``options`` picks another faiss index."""
    if backend not in ("local", "faiss") or options.get("index", "ivfpq") != "ivfpq":
        return dict(options)
    return {**FRAMES_OPTIONS, "pq_m": min(32, max(8, dim // 8)), **options}


@dataclass
class Registered:
    stage: FirstStage
    # What ``stage.add`` takes for new rows, from their ids and features (None: the proxies).
    videos: Callable[[np.ndarray, VideoFeatures], object] | None = None
    dense: bool = False  # the index's own dense stage: vectors and queries through the summary


class StageSet:
    """The dense stage (made once the store holds rows to calibrate its summary on) and the
    registered ones. ``spec`` is the manifest's ``first_stage`` record."""

    def __init__(self, store: FrameStore, spec: dict, summary_head=None):
        if spec.get("summary") == "frames":  # refused before anything is written
            from ..search.frames_stage import check_backend

            check_backend(spec.get("backend"))
        self.store = store
        self.spec = spec
        self.model: DiCoSA | None = None
        self.device = None
        self.directory: Path | None = None
        self.dense: FirstStage | None = None
        self.extra: list[Registered] = []
        self.synced: list[int] | None = spec.get("synced")  # [next_id, removed] at save
        self._summary: Summary | None = None
        self._summary_head = summary_head  # "distilled": the trained head, or its file

    # -- the stages -----------------------------------------------------------------------
    def all(self, make: bool = True) -> list[Registered]:
        """Every stage, the dense one first (with ``make``, made now if it can be)."""
        dense = self.dense_stage() if make else self.dense
        return ([Registered(dense, dense=True)] if dense is not None else []) + self.extra

    def dense_stage(self) -> FirstStage | None:
        """The dense stage, made (and filled from the store) once the store holds videos to
        calibrate its summary on and a model is attached."""
        if self.dense is None:
            if self.model is None or not len(self.store) or self.spec["backend"] is None:
                return None
            summary = self.summary()
            summary.calibrate(next(self.store.iter_proxies())[1])
            self.spec.update(calibration=summary.calibration, dim=summary.dim)
            if summary.per_frame:  # recorded, so that a rebuild makes the same stage
                self.spec["options"] = frames_options(self.spec["backend"],
                                                      self.spec["options"], summary.dim)
            spec = {**self.spec, "options": {"normalize": summary.normalize,
                                             **self.spec["options"]}}
            self.dense = _make_stage(spec, self.directory, summary.dim,
                                     self.store.num_frames if summary.per_frame else None)
            for ids, proxies in self.store.iter_proxies():
                self.add_rows(Registered(self.dense, dense=True), ids, proxies)
        return self.dense

    def open_dense(self, directory: Path) -> None:
        """Open the dense stage's files when they match the store; a stage that lags, or
        whose files cannot be read, is rebuilt from the stored proxies on first use."""
        if self.store.dim is None or self.synced != [self.store.next_id,
                                                     len(self.store.removed)]:
            return
        from ..search.backends import open_first_stage
        from ..search.frames_stage import FramesStage

        try:
            if self.spec.get("summary") == "frames":
                self.dense = FramesStage.open(directory)
            else:
                self.dense = open_first_stage(directory, uri=self.spec.get("uri"))
        except Exception as exc:
            if self.spec.get("backend") == "milvus":
                raise  # a server that cannot be reached is the user's to fix, not rebuilt
            log.warning("rebuilding the dense first stage of %s from the stored vectors: %s",
                        directory, exc)

    def register(self, stage: FirstStage,
                 videos: Callable[[np.ndarray, VideoFeatures], object] | None = None,
                 indexed: np.ndarray | None = None) -> None:
        """Register another stage; every live row it does not hold yet is added now, held
        rows that are no longer live are removed from it."""
        registered = Registered(stage, videos)
        held = np.asarray([] if indexed is None else indexed, dtype=np.int64)
        gone = held[~self.store.is_live(held)]
        if len(gone):
            stage.remove(gone)
        for ids, _ in self.store.iter_proxies():
            ids = ids[~np.isin(ids, held)]
            if len(ids):
                self.add_rows(registered, ids)
        self.extra.append(registered)

    def reset(self, spec: dict, directory: Path | None) -> None:
        """The stages as a commit records them (``spec``, its ``first_stage``), in place: the
        dense one opened from its files in ``directory`` (or rebuilt on first use), the
        registered ones gone (their plugins attach again)."""
        model, device = self.model, self.device
        self.__init__(self.store, spec, self._summary_head)
        self.model, self.device, self.directory = model, device, directory
        if directory is not None:
            self.open_dense(directory)

    def follow(self, before: np.ndarray) -> None:
        """Give every stage made so far the rows the store gained since it held the live rows
        ``before``, and take from it those it lost (another writer's commits)."""
        after = self.store.live()
        gone, came = np.setdiff1d(before, after), np.setdiff1d(after, before)
        for registered in self.all(make=False):
            if len(gone):
                registered.stage.remove(gone)
            if len(came):
                self.add_rows(registered, came)

    # -- changes --------------------------------------------------------------------------
    def extend(self, append: Callable[[], np.ndarray]) -> np.ndarray:
        """Run ``append`` (new store rows -> their ids), then give the rows to every stage
        and take from them the ids a failed earlier write had reserved (tombstones now)."""
        existing = self.all()  # before: a stage made afterwards is filled from the store
        removed = set(self.store.removed)
        ids = append()
        skipped = np.array(sorted(set(self.store.removed) - removed), dtype=np.int64)
        for registered in existing:
            if len(skipped):
                registered.stage.remove(skipped)
            self.add_rows(registered, ids)
        self.dense_stage()  # made now, from the store, if the width was unknown until now
        return ids

    def remove(self, ids: np.ndarray) -> None:
        for registered in self.all():
            registered.stage.remove(ids)

    def save(self, directory: Path) -> None:
        for registered in self.all():
            registered.stage.save(directory)
        if self.dense is not None:  # else the stage stays stale and is rebuilt when opened
            self.synced = [self.store.next_id, len(self.store.removed)]

    def record(self) -> dict:
        """The manifest's ``first_stage`` record."""
        return {**self.spec, "synced": self.synced}

    # -- the summary ----------------------------------------------------------------------
    def summary(self) -> Summary:
        if self._summary is None:
            if self.model is None:
                raise RuntimeError("this index was loaded without a model; pass "
                                   "VideoIndex.load(directory, model) to encode or search")
            head = self._distilled_head() if self.spec["summary"] == "distilled" else None
            self._summary = Summary(self.model, self.spec["summary"],
                                    self.spec.get("calibration"), head=head)
        return self._summary

    def _distilled_head(self):
        head = self._summary_head
        if head is None and self.directory is not None and (
                self.directory / SUMMARY_HEAD).is_file():
            head = self.directory / SUMMARY_HEAD
        if isinstance(head, (str, os.PathLike)):
            from ..heads.base import load_head

            head = load_head(head, self.model, kind="summary")
        if head is not None:
            head = head.to(self.device).eval()
        self._summary_head = head
        self.save_summary_head()
        return head

    def save_summary_head(self) -> None:
        """Keep the distilled summary's head in the index folder (atomic, fingerprinted)."""
        head = self._summary_head
        if (self.directory is None or head is None or isinstance(head, (str, os.PathLike))
                or self.model is None):
            return
        path = self.directory / SUMMARY_HEAD
        if not path.is_file():
            from ..heads.base import save_head

            save_head(head, path, self.model, getattr(head, "trained", None))

    def summary_vectors(self, ids: np.ndarray, proxies: np.ndarray | None = None
                        ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The dense stage's vectors of rows ``ids`` (from their frames for "distilled"); for
        "frames", every frame's: ``([n, N, dim] float32, [n, N] bool mask)``."""
        summary = self.summary()
        if summary.per_frame:
            return summary.frames(self.store.gather(ids))
        if summary.needs_frames:
            return np.concatenate([summary.videos(self.store.gather(ids[i:i + 8192]))
                                   for i in range(0, len(ids), 8192)]
                                  or [np.zeros((0, summary.dim), np.float32)])
        return summary.videos(self.store.proxies(ids) if proxies is None else proxies)

    def add_rows(self, registered: Registered, ids: np.ndarray,
                 proxies: np.ndarray | None = None) -> None:
        """Give rows ``ids`` to one stage (per-frame vectors: a few thousand videos at a time,
        as a shard of 8,192 videos x 12 frames x 1,024 floats would be 0.4 GB at once)."""
        if not registered.dense:  # what it takes: the proxies, or its own from the frames
            registered.stage.add(ids, self.store.proxies(ids) if registered.videos is None
                                 else registered.videos(ids, self.store.gather(ids)))
        elif not self.summary().per_frame:
            registered.stage.add(ids, self.summary_vectors(ids, proxies))
        else:
            for start in range(0, len(ids), _FRAME_CHUNK):
                part = ids[start:start + _FRAME_CHUNK]
                registered.stage.add(part, self.summary_vectors(part))


def _make_stage(spec: dict, directory: Path | None, dim: int,
                max_frames: int | None = None) -> FirstStage:
    """A new, empty dense first stage as ``spec`` ({backend, uri, options}) describes
    (``dicosa/search/backends.py``; ``directory`` None: an in-memory index, saved later);
    ``max_frames``: a per-frame stage of videos of that many frames."""
    from ..search.backends import make_first_stage

    if max_frames is not None:
        from ..search.frames_stage import FramesStage

        return FramesStage.create(spec["backend"], directory or Path("."), dim, max_frames,
                                  **spec.get("options", {}))

    return make_first_stage(spec["backend"], directory=directory or Path("."), dim=dim,
                            uri=spec.get("uri"), **spec.get("options", {}))
