"""Where the batcher's batches of searches are ranked and their pages cut: a :class:`Ranking`,
:class:`InProcess` (this process, on its compute thread) or
:class:`~dicosa.serve.rankers.Rankers` (ranker processes). Both run :func:`answers`: the batch
ranked together, each search's page cut where it was ranked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from .compute import ComputeThread
from .engine import Answer, Engine, SearchRequest, rank_requests

__all__ = ["Done", "InProcess", "Outcome", "Ranking", "answers", "fair_share"]

# A search's answer, or the exception its search raised (for its request to raise).
Outcome = tuple[bool, "Answer | BaseException"]
# What a batch's ranking hands back: each search's outcome, or the error that ended the batch.
Done = Callable[["list[Outcome] | BaseException"], None]


class Ranking(Protocol):
    """What ranks the batcher's batches (module docstring)."""

    threads: int  # torch threads of whoever ranks (a ranker's while another ranker is busy)

    def __len__(self) -> int:
        """Batches that can be ranked at once (slots)."""

    def acquire(self) -> object:
        """A free slot (waits for one)."""

    def share(self, waiting: int, max_batch: int) -> int:
        """The most searches a free slot takes while ``waiting`` searches are in the server
        (queued, on their way, and the one that asked), at most ``max_batch``."""

    def submit(self, slot: object, engine: Engine, requests: list[SearchRequest], done: Done,
               quiet: bool = False) -> None:
        """Rank ``requests`` together on ``slot`` and cut their pages; ``done`` gets the
        outcomes, and the slot is free again after. ``engine``: the snapshot they were
        checked on; ``quiet``: nothing else is queued or on its way."""

    def close(self) -> None:
        """No more batches; stop what was started."""


def answers(engine: Engine, requests: list[SearchRequest]) -> list[Outcome]:
    """Each request ranked with the others (:func:`~dicosa.serve.engine.rank_requests`) and
    its page cut (:meth:`Engine.answer`); a batch that fails is run again one search at a
    time (:meth:`Engine.search`), so a search that fails fails alone."""
    try:
        ranked = rank_requests(engine, requests)
    except Exception:
        return [_outcome(engine.search, request) for request in requests]
    return [_outcome(engine.answer, request, one)
            for request, one in zip(requests, ranked, strict=True)]


def fair_share(waiting: int, busy: int, slots: int, max_batch: int) -> int:
    """The most searches one of ``slots`` free rankers takes: its share of those in the
    server, the ``waiting`` ones and the ``busy`` ones the other rankers hold (a ceiling
    division), between 1 and ``max_batch`` (:mod:`dicosa.serve.batching` says why)."""
    return max(1, min(max_batch, -(-(waiting + busy) // slots)))


def _outcome(fn: Callable[..., Answer], *args) -> Outcome:
    try:
        return True, fn(*args)
    except Exception as exc:  # the search's own error, for its request
        return False, exc


class InProcess:
    """Batches ranked in this process one at a time, on ``compute`` (None: on the batching
    thread). A slot takes up to ``max_batch`` searches: the batch waits only for searches
    already on their way (:mod:`dicosa.serve.batching`)."""

    def __init__(self, compute: ComputeThread | None = None):
        self.compute = compute

    @property
    def threads(self) -> int:
        return (torch.get_num_threads() if self.compute is None
                else self.compute.run(torch.get_num_threads))

    def __len__(self) -> int:
        return 1

    def acquire(self) -> object:
        return self

    def share(self, waiting: int, max_batch: int) -> int:
        return max_batch

    def submit(self, slot: object, engine: Engine, requests: list[SearchRequest], done: Done,
               quiet: bool = False) -> None:
        try:
            outcomes = (answers(engine, requests) if self.compute is None
                        else self.compute.run(answers, engine, requests))
        except Exception as exc:  # handed to the batch's searches
            outcomes = exc
        done(outcomes)

    def close(self) -> None:
        pass
