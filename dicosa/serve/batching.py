"""Concurrent searches run together: one text-encoder pass and one rerank for a batch.

Requests arrive on the server's worker threads. With batching on, each hands its search to one
batching thread and waits: that thread takes the first waiting search, gathers for up to
``max_wait_s`` the searches that can share it (same index snapshot, search mode, exclusions
and candidate count; up to ``max_batch`` of them), and ranks them with one
:meth:`Engine.rank` call, deep enough for the deepest page. Searches that cannot share wait
for the next round. A batch that fails is run again one search at a time, so a query that
fails fails alone.

Each search's own page (its moments and explanations) is then cut on its own worker thread.
``max_batch=1`` turns batching off: every worker thread searches on its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .engine import Engine, Ranked, SearchRequest

__all__ = ["Batcher"]

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


class Batcher:
    """Ranks searches alone or in batches (see the module docstring)."""

    def __init__(self, max_batch: int = 8, max_wait_s: float = 0.002):
        self.max_batch, self.max_wait_s = max(1, max_batch), max_wait_s
        self._queue: queue.Queue[_Waiting | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def rank(self, engine: Engine, request: SearchRequest) -> Ranked:
        """``request``'s ranked hits (the caller has checked it with ``engine.check``)."""
        if self.max_batch == 1:
            return _alone(engine, [request])[0]
        waiting = _Waiting(engine, request)
        self._start()
        self._queue.put(waiting)
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
            batch = [first]
            for other in list(held):
                if len(batch) < self.max_batch and other.key() == first.key():
                    batch.append(other)
                    held.remove(other)
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch:
                try:
                    other = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if other is None:
                    self._queue.put(None)  # stop after this batch
                    break
                (batch if other.key() == first.key() else held).append(other)
            try:
                self._run(batch)
            except Exception as exc:  # a fault here must not leave requests waiting forever
                log.exception("the batching thread failed")
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(exc)

    def _run(self, batch: list[_Waiting]) -> None:
        started = time.perf_counter()
        try:
            ranked = _together(batch)
        except Exception:
            if len(batch) > 1:
                log.debug("a batch of %d searches failed; running them one by one", len(batch))
            ranked = None
        if ranked is None:
            for waiting in batch:
                try:
                    _deliver(waiting, _alone(waiting.engine, [waiting.request])[0], started)
                except Exception as exc:  # the search's own error, for its request to raise
                    waiting.future.set_exception(exc)
            return
        for waiting, result in zip(batch, ranked, strict=True):
            _deliver(waiting, result, started)


def _together(batch: list[_Waiting]) -> list[Ranked]:
    first = batch[0].request
    return batch[0].engine.rank([w.request.text for w in batch],
                                depth=max(w.request.depth for w in batch),
                                candidates=max(first.candidates, first.depth),
                                exclude=first.exclude, mode=first.mode, source=first.source)


def _alone(engine: Engine, requests: list[SearchRequest]) -> list[Ranked]:
    request = requests[0]
    return engine.rank([request.text], depth=request.depth, candidates=request.candidates,
                       exclude=request.exclude, mode=request.mode, source=request.source)


def _deliver(waiting: _Waiting, ranked: Ranked, started: float) -> None:
    ranked.times = {**ranked.times, "queue_s": started - waiting.since}
    waiting.future.set_result(ranked)
