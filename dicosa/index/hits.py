"""Hits: a search's scored rows assembled into videos and moments, in one place.

The candidates are rows: whole short videos and segments of long ones. A video ranks by its
best row, and its hit carries its best moments that do not overlap: time ranges, each its
best row joined with the matching rows next to it, with their scores
(:func:`dicosa.search.moment.best_moments`), found among the query's candidates of that video
(:func:`_moments`, which :func:`top_moments` uses too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from torch import Tensor

from ..search.moment import Moment, best_moments
from ..search.store import FrameStore

__all__ = ["MOMENTS_PER_HIT", "Hit", "top_hits", "top_moments"]

MOMENTS_PER_HIT = 3  # a hit's best non-overlapping moments


@dataclass(frozen=True)
class Hit:
    """One search result: a video, at its best moments."""

    path: str
    score: float  # the ranking score: DiCoSA's S after the rerank hooks (= dicosa without hooks)
    #               of the video's best row
    dicosa: float  # DiCoSA's S (Eq. 9) of the query and the video's best row
    stage: str  # what proposed it: a first stage ("dense", "lexical", "bow", "dense+lexical"),
    #             "all" (every row reranked, candidates >= len(index)) or "exhaustive"
    #             (candidates=None)
    stage_score: float | None  # the first listed stage's own score; None for "all"/"exhaustive"
    id: int  # the video's id (the store id of its first row)
    # every proposing stage's own score, e.g. {"dense": 0.31, "lexical": 2.7} for
    # "dense+lexical" (their scales differ); None for "all"/"exhaustive"
    stage_scores: dict[str, float] | None = field(default=None, hash=False)
    row: int | None = None  # the store row that scored best (None: the video's id)
    # the video's best moments that do not overlap, best first (the first one's row is ``row``)
    moments: tuple[Moment, ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        if self.row is None:
            object.__setattr__(self, "row", self.id)

    @property
    def start(self) -> float | None:
        """Where the best moment starts, in seconds (None: unknown)."""
        return self.moments[0].start if self.moments else None

    @property
    def end(self) -> float | None:
        return self.moments[0].end if self.moments else None

    def as_dict(self) -> dict:
        return asdict(self)


def top_hits(store: FrameStore, scores: Tensor, dicosa: Tensor, ids: np.ndarray,
             proposed: tuple, k: int) -> list[list[Hit]]:
    """The ``k`` best videos per query among candidates ``ids [Q, C]`` ranked by
    ``scores [Q, C]`` (``dicosa``: DiCoSA's S before the hooks), each at its best row with
    its best moments among the query's candidates (:func:`_moments`); ``proposed``: the
    candidates' stage labels, first stage scores and per-stage scores
    (:meth:`Searcher.candidates <dicosa.index.searcher.Searcher.candidates>`)."""
    ranked = scores.numpy()  # [Q, C]
    usable = (ids >= 0) & np.isfinite(ranked)
    videos = np.full(ids.shape, -1, dtype=np.int64)
    videos[usable] = store.videos.of(ids[usable])
    picked = [_best_per_video(ranked[q], videos[q], usable[q], k) for q in range(len(ids))]
    paths = iter(store.table.paths(np.concatenate(
        [np.zeros(0, np.int64)] + [videos[q, row] for q, row in enumerate(picked)])))
    results = []
    for q, row in enumerate(picked):
        own = usable[q] & np.isin(videos[q], videos[q, row])  # [C] the hits' videos' rows
        # what a row that does not match scores: the median of the query's candidates
        background = float(np.median(ranked[q, usable[q]])) if usable[q].any() else 0.0
        moments = _moments(store, ids[q, own], videos[q, own], ranked[q, own],
                           MOMENTS_PER_HIT, background)
        hits = []
        for c in row:
            label, first, parts = _proposed(proposed, q, c)
            hits.append(Hit(path=next(paths), score=float(ranked[q, c]),
                            dicosa=float(dicosa[q, c]), id=int(videos[q, c]), stage=label,
                            stage_score=first, stage_scores=parts, row=int(ids[q, c]),
                            moments=tuple(moments[int(videos[q, c])])))
        results.append(hits)
    return results


def _moments(store: FrameStore, rows: np.ndarray, videos: np.ndarray, scores: np.ndarray,
             limit: int, background: float, join: float | None = None
             ) -> dict[int, list[Moment]]:
    """Each video's best ``limit`` moments among its rows ``rows [m]`` (of ``videos [m]``)
    scored ``scores [m]`` (:func:`~dicosa.search.moment.best_moments`), videos ascending."""
    spans = store.videos.spans(rows)
    order = np.argsort(videos, kind="stable")  # the rows, video by video
    edges = np.flatnonzero(np.diff(videos[order])) + 1
    return {int(videos[own[0]]): best_moments(rows[own], spans[own], scores[own], limit,
                                              background, join)
            for own in (np.split(order, edges) if len(order) else [])}


def _proposed(proposed: tuple, q: int, c: int) -> tuple[str, float | None, dict | None]:
    """Candidate ``(q, c)``'s stage label, first stage score and every proposing stage's
    score (a :class:`Hit`'s ``stage``, ``stage_score`` and ``stage_scores``)."""
    stage, stage_scores, by_stage = proposed
    label = stage if isinstance(stage, str) else str(stage[q, c])
    first = None if stage_scores is None else float(stage_scores[q, c])
    parts = (by_stage[q, c] if by_stage is not None
             else None if first is None else {label: first})
    return label, first, parts


def _best_per_video(scores: np.ndarray, videos: np.ndarray, usable: np.ndarray,
                    k: int) -> list[int]:
    """Columns of the ``k`` best videos' best rows, best first (ties: the earlier column)."""
    columns = np.flatnonzero(usable)
    order = columns[np.argsort(-scores[columns], kind="stable")]
    _, first = np.unique(videos[order], return_index=True)
    return order[np.sort(first)][:k].tolist()


def top_moments(store: FrameStore, ids: np.ndarray, scores: np.ndarray, k: int,
                join: float | None = None) -> list[tuple[str, int, Moment]]:
    """The ``k`` best moments of the rows ``ids [C]`` scored ``scores [C]``, as ``(path,
    video id, moment)``: each video's (:func:`_moments`, the query's background the
    median of all ``scores``), best first, several from one video but never two that
    overlap."""
    usable = (ids >= 0) & np.isfinite(scores)
    rows, values = ids[usable], scores[usable]
    background = float(np.median(values)) if len(values) else 0.0
    found = _moments(store, rows, store.videos.of(rows), values, k,
                     background, join)
    picked = [(video, m) for video, moments in found.items() for m in moments]
    picked.sort(key=lambda vm: -vm[1].score)  # stable: equal scores keep video order
    picked = picked[:k]
    paths = store.table.paths(np.array([v for v, _ in picked], dtype=np.int64))
    return [(path, video, moment) for path, (video, moment) in zip(paths, picked,
                                                                   strict=True)]
