"""Concurrent searches run together: one text-encoder pass and one rerank for a batch.

Requests arrive on the server's worker threads. With batching on, each hands its search to one
batching thread and waits: that thread takes the first waiting search and every waiting one
that can share it (same index snapshot, search mode, exclusions and candidate count; up to
``max_batch`` of them), and ranks them with one :meth:`Engine.rank` call, deep enough for the
deepest page. Searches that cannot share wait for the next round. A batch that fails is run
again one search at a time, so a query that fails fails alone.

Waiting for company is bounded and only for company that is coming: the service counts the
searches it has received that have not reached the queue yet (:meth:`Batcher.expect`, from
the moment the HTTP request arrives), and a batch short of ``max_batch`` waits for them, at
most ``max_wait_s``, and not at all when none is on its way. A lone client's search is
ranked at once; under load a batch forms from the searches that queued while the previous
one ran, plus those already inside the server.

Each search's own page (its moments and explanations) is then cut for its own request.
``max_batch=1`` turns batching off: every search is ranked on its own. Rankings run on the
service's :class:`~dicosa.serve.compute.ComputeThread` when it is given one (the service
always does: :mod:`dicosa.serve.compute` says why), else on the batching thread.

With :class:`~dicosa.serve.rankers.Rankers` (``dicosa serve --rankers N``) a batch goes to
whichever ranker process is free, which ranks it and cuts its pages (:meth:`Batcher.answer`):
the batching thread waits for a free ranker first, then gathers the batch from what queued
meanwhile, so every search waits in this one queue whichever process ranks it. A free
ranker takes its share of the searches in the server, not all that wait: the searches
waiting or on their way plus those the busy rankers hold, divided by the rankers (at most
``max_batch``). Taking all makes the batches uneven, and uneven batches stay uneven, since
a batch's searches come back together: one ranker keeps ranking six at a time while the
other ranks two, and the six wait three times as long.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .compute import ComputeThread
from .engine import Answer, Engine, Ranked, SearchRequest, rank_requests
from .rankers import Outcome, Rankers

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
        return (id(self.engine), request.mode, request.exclude, request.source,
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
    """Ranks searches alone or in batches (see the module docstring)."""

    _POLL_S = 0.0005  # how often a batch waiting for company looks whether any is still coming

    def __init__(self, max_batch: int = 8, max_wait_s: float = 0.002,
                 compute: ComputeThread | None = None, rankers: Rankers | None = None):
        self.max_batch, self.max_wait_s = max(1, max_batch), max_wait_s
        self._compute = compute  # where rankings run (None: on the calling thread)
        self.rankers = rankers  # the processes that rank and cut pages (None: this one)
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

    def rank(self, engine: Engine, request: SearchRequest,
             ticket: Ticket | None = None) -> Ranked:
        """``request``'s ranked hits (the caller has checked it with ``engine.check``);
        ``ticket``: its :meth:`expect` ticket, settled as it joins the queue."""
        if self.max_batch == 1:
            if ticket is not None:
                ticket.settle()
            return self._on_compute(rank_requests, engine, [request])[0]
        return self._wait(engine, request, ticket)

    def answer(self, engine: Engine, request: SearchRequest,
               ticket: Ticket | None = None) -> Answer:
        """``request``'s answer from the rankers (as :meth:`rank`, page cut there too)."""
        if self.rankers is None:
            raise RuntimeError("this batcher has no rankers: use rank()")
        return self._wait(engine, request, ticket)

    def _wait(self, engine: Engine, request: SearchRequest, ticket: Ticket | None):
        waiting = _Waiting(engine, request)
        try:
            self._start()
            self._queue.put(waiting)
        finally:  # settled only once queued: a gathering batch that saw it coming finds it
            if ticket is not None:
                ticket.settle()
        return waiting.future.result()

    def _on_compute(self, fn, *args):
        return fn(*args) if self._compute is None else self._compute.run(fn, *args)

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
                ranker = None if self.rankers is None else self.rankers.acquire()
            except Exception as exc:  # the rankers could not open the index: say so
                first.future.set_exception(exc)
                continue
            size = self.max_batch if ranker is None else self._share(len(held))
            batch = [first]
            for other in list(held):
                if len(batch) < size and other.key() == first.key():
                    batch.append(other)
                    held.remove(other)
            self._gather(first, batch, held, size)
            if ranker is not None:
                quiet = self._coming <= 0 and self._queue.empty() and not held
                self.rankers.submit(ranker, [w.request for w in batch],
                                    _Settle(batch, time.perf_counter()), quiet)
                continue
            try:
                self._run(batch)
            except Exception as exc:  # a fault here must not leave requests waiting forever
                log.exception("the batching thread failed")
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(exc)

    def _share(self, held: int) -> int:
        """The most searches a free ranker takes: its share of those in the server, counting
        the batches the other rankers are ranking (module docstring)."""
        waiting = 1 + held + self._queue.qsize() + max(0, self._coming)
        share = -(-(waiting + self.rankers.busy) // len(self.rankers))  # ceil
        return max(1, min(self.max_batch, share))

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

    def _run(self, batch: list[_Waiting]) -> None:
        started = time.perf_counter()
        try:
            ranked = self._on_compute(_together, batch)
        except Exception:
            if len(batch) > 1:
                log.debug("a batch of %d searches failed; running them one by one", len(batch))
            ranked = None
        if ranked is None:
            for waiting in batch:
                try:
                    _deliver(waiting, self._on_compute(rank_requests, waiting.engine,
                                                       [waiting.request])[0], started)
                except Exception as exc:  # the search's own error, for its request to raise
                    waiting.future.set_exception(exc)
            return
        for waiting, result in zip(batch, ranked, strict=True):
            _deliver(waiting, result, started)


def _together(batch: list[_Waiting]) -> list[Ranked]:
    return rank_requests(batch[0].engine, [w.request for w in batch])


class _Settle:
    """Hands a ranker's outcomes to the searches of its batch."""

    def __init__(self, batch: list[_Waiting], started: float):
        self.batch, self.started = batch, started

    def __call__(self, outcomes: list[Outcome] | BaseException) -> None:
        if isinstance(outcomes, BaseException):
            for waiting in self.batch:
                waiting.future.set_exception(outcomes)
            return
        for waiting, (ok, value) in zip(self.batch, outcomes, strict=True):
            if not ok:
                waiting.future.set_exception(value)
                continue
            value.body["times_ms"]["queue"] = round(1000 * (self.started - waiting.since), 3)
            waiting.future.set_result(value)


def _deliver(waiting: _Waiting, ranked: Ranked, started: float) -> None:
    ranked.times = {**ranked.times, "queue_s": started - waiting.since}
    waiting.future.set_result(ranked)
