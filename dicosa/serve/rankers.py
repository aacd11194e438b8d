"""``dicosa serve --rankers N``: searches ranked by N processes that one batcher feeds.

A search's CPU time is torch's (the text tower, the first stage, the rerank, the moments) and
Python's (parsing the request, cutting the page, writing its JSON). In one process those
share one GIL: with two torch threads, one search at a time keeps part of the second core
spinning between torch's many small parallel regions; with two batching threads of one torch
thread each, the request threads and both batches wait for the GIL in turn (at 1M videos
37-38 searches/s against 54-58 for the same batches in a script without HTTP,
benchmarks/RESULTS.md). ``--workers N`` gives each process its own GIL but also its own
queue, and each client's keep-alive connection stays with the process that accepted it, so
one process can have five busy clients and the other three.

Here the server process keeps the HTTP side and the one :class:`~dicosa.serve.batching.
Batcher`, and N ranker processes (started with ``spawn``: none inherits the server's torch
threads) each open the index themselves with one torch thread, map the store in, and take
whole batches: rank them together (:meth:`Engine.rank`), cut each search's page
(:meth:`Engine.answer`), and send back the answers, which carry no tensors (a few kilobytes
each). A batch goes to whichever ranker is free, so every search waits in one queue. The
frame store's pages are in the page cache once for all processes; each process holds its own
model and first stage.

Each ranker looks for a finished change to the index between batches, at most every
``reload_interval_s``, and reopens it, as each process of ``--workers`` does (the server's
own snapshot, which answers the media routes and "more like this", reopens on its own
watcher): for about that long a search may be ranked on the new collection and its links
served from the old.

A ranker that dies (killed, out of memory) fails the searches of the batch it held with one
sentence, and a new one is started in its place before that slot takes another batch.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from .compute import freeze_heap
from .engine import Answer, Engine, SearchRequest, rank_requests
from .errors import ServeError

__all__ = ["RankerError", "RankerSettings", "Rankers"]

log = logging.getLogger("dicosa.serve")
OPEN_TIMEOUT_S = 1800.0  # a ranker opening a large index (1M videos: about a minute here)


class RankerError(RuntimeError):
    """A ranker process could not open the index or ended while ranking (one sentence)."""


@dataclass
class RankerSettings:
    """What each ranker process needs to open the index (as ``dicosa serve`` was given)."""

    index: str
    device: str | None = None
    media_roots: list[str] = field(default_factory=list)
    text_tower: str = "auto"
    query_cache: int = 0
    timeline_rows: int | None = None  # None: the engine's default
    reload_interval_s: float = 2.0
    threads: int = 1  # torch threads of a ranker while another ranker is busy too
    alone_threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # while none is


# What a ranker sends back for each search: its answer, or the exception its search raised.
Outcome = tuple[bool, "Answer | BaseException"]


class _Ranker:
    """One ranker process and the server's end of its pipe."""

    def __init__(self, context, settings: RankerSettings, number: int):
        self._context, self._settings, self.number = context, settings, number
        self.process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.stopping = False  # stop() was called: an ended process is not started again

    def start(self) -> None:
        mine, theirs = self._context.Pipe()
        self.process = self._context.Process(target=_serve_batches, args=(theirs, self._settings),
                                             name=f"dicosa-ranker-{self.number}", daemon=True)
        self.process.start()
        theirs.close()
        self._conn = mine

    def wait_ready(self, timeout: float = OPEN_TIMEOUT_S) -> None:
        """Until the process has opened the index; one sentence if it could not."""
        try:
            if not self._conn.poll(timeout):
                raise RankerError(f"ranker {self.number} did not open the index in {timeout:g} s")
            kind, text = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise RankerError(f"ranker {self.number} ended while opening the index (exit "
                              f"status {self.process.exitcode})") from None
        if kind != "ready":
            raise RankerError(text)

    def rank(self, requests: list[SearchRequest], threads: int) -> list[Outcome]:
        """Each request's outcome, ranked together in the process on ``threads`` torch
        threads; if the process ends meanwhile, a new one is started and this batch fails
        (:class:`RankerError`)."""
        try:
            self._conn.send((requests, threads))
            return self._conn.recv()
        except (EOFError, OSError):
            if self.stopping:
                raise RankerError("the service is stopping") from None
            self.process.join(5)
            status = self.process.exitcode
            log.error("ranker %d ended while ranking (exit status %s); starting another",
                      self.number, status)
            self.restart()
            raise RankerError(f"the process ranking this search ended (exit status {status}); "
                              "try again") from None

    def restart(self) -> None:
        self.stop(wait=0)
        self.stopping = False
        self.start()
        self.wait_ready()

    def stop(self, wait: float = 5.0) -> None:
        self.stopping = True
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._conn.close()
        if self.process is not None:
            self.process.join(wait)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)


class Rankers:
    """``count`` ranker processes on one index (module docstring). :meth:`acquire` waits for
    a free one; :meth:`submit` ranks a batch on it in the background and frees it after."""

    def __init__(self, count: int, settings: RankerSettings):
        if count < 1:
            raise ValueError(f"there must be at least 1 ranker, got {count}")
        context = multiprocessing.get_context("spawn")
        self._settings = settings
        self._all = [_Ranker(context, settings, n) for n in range(count)]
        self._free: queue.Queue[_Ranker] = queue.Queue()
        self._busy, self._lock = 0, threading.Lock()  # searches the rankers hold now
        for ranker in self._all:
            ranker.start()
        self._ready, self._failed = False, None

    def wait_ready(self) -> None:
        """Until every ranker has opened the index (they open it at once, beside whatever
        this process does meanwhile); if one cannot, all stop and :class:`RankerError` says
        why."""
        if self._ready:
            return
        if self._failed is not None:
            raise self._failed
        try:
            for ranker in self._all:
                ranker.wait_ready()
        except RankerError as exc:
            self.close()
            self._failed = exc  # every later search is told the same
            raise
        except BaseException:
            self.close()
            raise
        for ranker in self._all:
            self._free.put(ranker)
        self._ready = True

    def __len__(self) -> int:
        return len(self._all)

    @property
    def busy(self) -> int:
        """The searches being ranked now, in all rankers."""
        return self._busy

    @property
    def pids(self) -> list[int]:
        return [ranker.process.pid for ranker in self._all]

    def acquire(self) -> _Ranker:
        """A free ranker (waits for one; :meth:`wait_ready` first)."""
        self.wait_ready()
        return self._free.get()

    def submit(self, ranker: _Ranker, requests: list[SearchRequest],
               done: Callable[[list[Outcome] | BaseException], None],
               quiet: bool = False) -> None:
        """Rank ``requests`` on ``ranker`` (from :meth:`acquire`) in a thread of this process
        that waits for the answers; ``done`` gets the outcomes, or the error that ended the
        batch; the ranker is free again after. ``quiet``: no other search is queued or on its
        way; then, when every other ranker is idle too, the batch ranks on
        ``settings.alone_threads`` (a lone search gets the cores), else on ``threads``."""
        alone = quiet and self._free.qsize() == len(self._all) - 1
        threads = self._settings.alone_threads if alone else self._settings.threads
        with self._lock:
            self._busy += len(requests)

        def run() -> None:
            try:
                outcome = ranker.rank(requests, threads)
            except Exception as exc:  # handed to the batch's searches
                outcome = exc
            finally:
                with self._lock:
                    self._busy -= len(requests)
                self._free.put(ranker)
            done(outcome)

        threading.Thread(target=run, name=f"dicosa-ranker-{ranker.number}-wait",
                         daemon=True).start()

    def close(self) -> None:
        for ranker in self._all:
            ranker.stop()


# -- in the ranker process ---------------------------------------------------------------------
def _serve_batches(conn: Connection, settings: RankerSettings) -> None:
    """A ranker process: open the index, say so, then rank batches until told to stop."""
    import torch

    from ..errors import USER_ERRORS

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its rankers itself
    torch.set_num_threads(settings.threads)
    try:
        engine = Engine.open(settings.index, device=settings.device,
                             media_roots=tuple(settings.media_roots),
                             text_tower=settings.text_tower, query_cache=settings.query_cache,
                             timeline_rows=settings.timeline_rows, populate=True)
    except USER_ERRORS as exc:
        conn.send(("failed", str(exc)))
        return
    freeze_heap()  # the open index out of the collector's walks (compute.py)
    conn.send(("ready", str(len(engine.index))))
    interval, looked = settings.reload_interval_s, time.monotonic()
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):  # the server has gone
            return
        if batch is None:
            return
        requests, threads = batch
        if interval > 0 and time.monotonic() - looked >= interval:
            new, looked = _reopened(engine), time.monotonic()
            if new is not engine:
                engine = new
                del new
                freeze_heap(again=True)  # the old snapshot collected, the new one frozen
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        with torch.inference_mode():
            conn.send(_answers(engine, requests))


def _reopened(engine: Engine) -> Engine:
    """``engine`` opened again if another process finished changing the index."""
    try:
        return engine.reopen() if engine.outdated() else engine
    except Exception as exc:  # keep ranking on the previous snapshot; look again later
        log.warning("a ranker could not reopen the index (still ranking the previous one): %s",
                    exc)
        return engine


def _answers(engine: Engine, requests: list[SearchRequest]) -> list[Outcome]:
    """Each request ranked with the others and its page cut; a batch that fails is run again
    one search at a time, so a search that fails fails alone."""
    try:
        ranked = rank_requests(engine, requests)
        return [_outcome(engine.answer, request, r)
                for request, r in zip(requests, ranked, strict=True)]
    except Exception:
        return [_outcome(engine.search, request) for request in requests]


def _outcome(fn: Callable[..., Answer], *args) -> Outcome:
    try:
        return True, fn(*args)
    except Exception as exc:  # the search's own error, for its request
        return False, _sendable(exc)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it survives the pipe as it is, else its sentence as a :class:`ServeError`
    (a refused request) or :class:`RankerError`."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # any failure to pickle
        pass
    kind = ServeError if isinstance(exc, ValueError) else RankerError
    return kind(str(exc))
