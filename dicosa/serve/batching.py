"""Concurrent searches run together: one text-encoder pass and one rerank for a batch.

Requests arrive on the server's worker threads. Each hands its search to one batching thread
and waits (:meth:`Batcher.answer`): that thread takes the first waiting search, waits for a
free slot of the service's :class:`~dicosa.serve.ranking.Ranking`, then takes every waiting
search that can share the batch (:meth:`_Waiting.key`: same index snapshot, search mode,
exclusions, options and candidate count), up to the slot's share, and submits them together.
Searches that cannot share wait for the next round.

Waiting for company is bounded and only for company that is coming: the service counts the
searches it has received that have not reached the queue yet (:meth:`Batcher.expect`, from
the moment the HTTP request arrives), and a batch short of its share waits for them, at most
``max_wait_s``, and not at all when none is on its way. A lone client's search is ranked at
once; under load a batch forms from the searches that queued while the previous one ran,
plus those already inside the server.

Every search waits in this one queue whichever process ranks it. In this process a slot
takes up to ``max_batch`` searches; a free ranker process takes its share of the searches in
the server, not all that wait (:func:`~dicosa.serve.ranking.fair_share`): taking all makes
the batches uneven, and uneven batches stay uneven, since a batch's searches come back
together: one ranker keeps ranking six at a time while the other ranks two, and the six wait
three times as long.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .engine import Answer, Engine, SearchRequest
from .ranking import InProcess, Outcome, Ranking

__all__ = ["Batcher", "Ticket"]

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    engine: Engine
    request: SearchRequest
    future: Future = field(default_factory=Future)
    since: float = field(default_factory=time.perf_counter)

    def key(self) -> tuple:
        request = self.request
        return (id(self.engine), request.mode, request.exclude, request.options,
                max(request.candidates, request.depth))


class Ticket:
    """A search the service has received and not yet queued (:meth:`Batcher.expect`)."""

    def __init__(self, batcher: Batcher):
        self._batcher, self._open = batcher, True

    def settle(self) -> None:
        """It reached the queue, or will not (failed, answered otherwise): no longer coming.
        Settling twice is settling once."""
        with self._batcher._lock:
            if self._open:
                self._open = False
                self._batcher._coming -= 1


class Batcher:
    """Ranks searches in batches on ``ranking`` (None: this process, on the batching
    thread; see the module docstring)."""

    _POLL_S = 0.0005  # how often a batch waiting for company looks whether any is still coming

    def __init__(self, max_batch: int = 8, max_wait_s: float = 0.002,
                 ranking: Ranking | None = None):
        self.max_batch, self.max_wait_s = max(1, max_batch), max_wait_s
        self.ranking = ranking if ranking is not None else InProcess()
        self._queue: queue.Queue[_Waiting | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._coming = 0  # searches received, not yet queued (open tickets)

    def expect(self) -> Ticket:
        """Count a search on its way (call when its request arrives; settle the ticket when it
        is queued or fails)."""
        with self._lock:
            self._coming += 1
        return Ticket(self)

    @property
    def coming(self) -> int:
        return self._coming

    def answer(self, engine: Engine, request: SearchRequest,
               ticket: Ticket | None = None) -> Answer:
        """``request``'s page, ranked in a batch (the caller has checked it with
        ``engine.check``); ``ticket``: its :meth:`expect` ticket, settled as it joins the
        queue."""
        waiting = _Waiting(engine, request)
        try:
            self._start()
            self._queue.put(waiting)
        finally:  # settled only once queued: a gathering batch that saw it coming finds it
            if ticket is not None:
                ticket.settle()
        return waiting.future.result()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dicosa-batcher",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        held: deque[_Waiting] = deque()  # searches that could not join the last batch
        while True:
            first = held.popleft() if held else self._queue.get()
            if first is None:
                return
            try:
                slot = self.ranking.acquire()
            except Exception as exc:  # the rankers could not open the index: say so
                first.future.set_exception(exc)
                continue
            batch = self._batch(first, held)
            quiet = self._coming <= 0 and self._queue.empty() and not held
            settle = _Settle(batch, time.perf_counter())
            try:
                self.ranking.submit(slot, first.engine, [w.request for w in batch], settle,
                                    quiet)
            except Exception as exc:  # a fault here must not leave requests waiting forever
                log.exception("the batching thread failed")
                settle(exc)

    def _batch(self, first: _Waiting, held: deque) -> list[_Waiting]:
        """``first`` and the searches that can share its batch: those held back from the
        last round, then what is queued and what is coming, up to the slot's share."""
        waiting = 1 + len(held) + self._queue.qsize() + max(0, self._coming)
        size = self.ranking.share(waiting, self.max_batch)
        batch = [first]
        for other in list(held):
            if len(batch) < size and other.key() == first.key():
                batch.append(other)
                held.remove(other)
        self._gather(first, batch, held, size)
        return batch

    def _gather(self, first: _Waiting, batch: list[_Waiting], held: deque,
                size: int) -> None:
        """Add to ``batch`` what is queued, then what is coming, up to ``size`` searches
        (module docstring)."""
        deadline = time.perf_counter() + self.max_wait_s
        while len(batch) < size:
            # Read before looking: a search settles its ticket after it is queued, so when
            # none is coming now, every one that was is already in the queue.
            none_coming = self._coming <= 0
            try:
                other = self._queue.get_nowait()
            except queue.Empty:
                left = deadline - time.perf_counter()
                if none_coming or left <= 0:
                    return
                try:
                    other = self._queue.get(timeout=min(left, self._POLL_S))
                except queue.Empty:
                    continue
            if other is None:
                self._queue.put(None)  # stop after this batch
                return
            (batch if other.key() == first.key() else held).append(other)


class _Settle:
    """Hands a batch's outcomes to its searches, each answer with the time it queued."""

    def __init__(self, batch: list[_Waiting], started: float):
        self.batch, self.started = batch, started

    def __call__(self, outcomes: list[Outcome] | BaseException) -> None:
        if isinstance(outcomes, BaseException):
            for waiting in self.batch:
                if not waiting.future.done():
                    waiting.future.set_exception(outcomes)
            return
        for waiting, (ok, value) in zip(self.batch, outcomes, strict=True):
            if not ok:
                waiting.future.set_exception(value)
                continue
            value.body["times_ms"]["queue"] = round(1000 * (self.started - waiting.since), 3)
            waiting.future.set_result(value)
