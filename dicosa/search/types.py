"""The contracts between the parts of search: first stages, rerank hooks, encoded queries.

Search is two-stage because DiCoSA's score depends on the query: a query-independent first
stage (dense ANN over a per-video vector, or a sparse inverted index over a head's lexical
vector) returns ``Candidates``; DiCoSA rescores them from the frame store; rerank hooks
(exclusion, fusion with titles, explanations) adjust the rescored list last.

Row ids are the store's row numbers (``int64``, stable for the life of an index; removed rows
are never reused), so every part refers to a video the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from ..model import TextFeatures
from .query import Query

__all__ = ["Candidates", "EncodedQueries", "FirstStage", "RerankHook"]


@dataclass(frozen=True)
class Candidates:
    """The ``k`` best rows per query of one stage, best first; ``-1`` pads short lists."""

    ids: np.ndarray  # int64 [Q, k] store row ids, -1 where fewer than k were found
    scores: np.ndarray  # float32 [Q, k] the stage's own score (higher is better), -inf pads
    stage: str  # which stage produced them: "dense", "lexical", "bow", "hybrid", "dicosa", ...

    def __post_init__(self) -> None:
        if self.ids.shape != self.scores.shape or self.ids.ndim != 2:
            raise ValueError(f"ids {self.ids.shape} and scores {self.scores.shape} must be "
                             "the same [Q, k] shape")


@dataclass
class EncodedQueries:
    """A batch of parsed queries with the DiCoSA text features of their positive parts.

    ``extra`` holds what heads computed once per batch (e.g. ``"lexical"``: a sparse query
    vector, ``"exclude"``: text features of the exclusions), keyed by the head's kind, so no
    stage encodes the same text twice.
    """

    queries: list[Query]
    text: TextFeatures  # [Q, D] DiCoSA text vectors of query.text
    extra: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.queries)


@runtime_checkable
class FirstStage(Protocol):
    """A query-independent candidate generator over the store's rows."""

    name: str

    def add(self, ids: np.ndarray, videos: object) -> None:
        """Index rows ``ids`` [n]; ``videos`` is what this stage needs per video (a dense
        proxy ``[n, D]``, a head's sparse vectors, ...)."""

    def remove(self, ids: np.ndarray) -> None:
        """Stop returning rows ``ids``."""

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        """The ``k`` best rows per query."""

    def save(self, directory: str | os.PathLike) -> None:
        """Write this stage's files into the index folder (atomically)."""


class RerankHook(Protocol):
    """Adjusts DiCoSA's rescored candidates: exclusion, fusion with titles, explanations."""

    def __call__(self, queries: EncodedQueries, ids: np.ndarray, scores: Tensor) -> Tensor:
        """``ids`` int64 [Q, k] rows, ``scores`` float32 [Q, k] → adjusted scores [Q, k]."""
