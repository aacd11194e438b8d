"""``dicosa serve --rankers N``: searches ranked by N processes that one batcher feeds
(docs/serve.md, "One multi-process topology: rankers").

In one process the request threads and the batches share one GIL. Here the server process
keeps the HTTP side and the one :class:`~dicosa.serve.batching.Batcher`, and N ranker
processes (started with ``spawn``: none inherits the server's torch threads) each open the
index from the service's :class:`~dicosa.serve.spec.EngineSpec` and take whole batches: rank
them and cut each search's page (:func:`~dicosa.serve.ranking.answers`), and send back the
answers, which carry no tensors. A batch goes to whichever ranker is free, so every search
waits in one queue. :class:`Rankers` is a :class:`~dicosa.serve.ranking.Ranking`.

Each ranker reopens a changed index between batches (:meth:`Service.reload_if_due
<dicosa.serve.service.Service.reload_if_due>`). A ranker that dies fails the searches of the
batch it held with one sentence, and a new one is started in its place.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pickle
import queue
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

from .compute import freeze_heap, keep_freed_buffers
from .engine import Engine, SearchRequest
from .errors import ServeError
from .machine import cores
from .ranking import Done, Outcome, answers, fair_share
from .service import Service
from .spec import EngineSpec

__all__ = ["RankerError", "Rankers"]

log = logging.getLogger("dicosa.serve")
OPEN_TIMEOUT_S = 1800.0  # a ranker opening a large index (1M videos: about a minute here)


class RankerError(RuntimeError):
    """A ranker process could not open the index or ended while ranking (one sentence)."""


@dataclass(frozen=True)
class _Job:
    """What a ranker process is started with: the index to open, how often to look for a
    change, its torch threads."""

    spec: EngineSpec
    reload_interval_s: float
    threads: int


class _Ranker:
    """One ranker process and the server's end of its pipe."""

    def __init__(self, context, job: _Job, number: int):
        self._context, self._job, self.number = context, job, number
        self.process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.stopping = False  # stop() was called: an ended process is not started again

    def start(self) -> None:
        mine, theirs = self._context.Pipe()
        self.process = self._context.Process(target=_serve_batches, args=(theirs, self._job),
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
    """``count`` ranker processes opening ``spec`` (module docstring), each ranking on
    ``threads`` torch threads while another ranker is busy and on ``alone_threads`` (None:
    every core) while it ranks alone; each looks for a change to the index every
    ``reload_interval_s`` between batches (0: never)."""

    def __init__(self, count: int, spec: EngineSpec, *, threads: int = 1,
                 alone_threads: int | None = None, reload_interval_s: float = 2.0):
        if count < 1:
            raise ValueError(f"there must be at least 1 ranker, got {count}")
        context = multiprocessing.get_context("spawn")
        self.threads, self.alone_threads = threads, alone_threads or cores()
        job = _Job(spec, reload_interval_s, threads)
        self._all = [_Ranker(context, job, n) for n in range(count)]
        self._free: queue.Queue[_Ranker] = queue.Queue()
        self.busy, self._lock = 0, threading.Lock()  # searches the rankers hold now
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
        except BaseException as exc:
            self.close()
            if isinstance(exc, RankerError):
                self._failed = exc  # every later search is told the same
            raise
        for ranker in self._all:
            self._free.put(ranker)
        self._ready = True

    def __len__(self) -> int:
        return len(self._all)

    @property
    def pids(self) -> list[int]:
        return [ranker.process.pid for ranker in self._all]

    def acquire(self) -> _Ranker:
        """A free ranker (waits for one; :meth:`wait_ready` first)."""
        self.wait_ready()
        return self._free.get()

    def share(self, waiting: int, max_batch: int) -> int:
        """A free ranker's share of the searches in the server (:func:`fair_share`)."""
        return fair_share(waiting, self.busy, len(self._all), max_batch)

    def submit(self, ranker: _Ranker, engine: Engine, requests: list[SearchRequest],
               done: Done, quiet: bool = False) -> None:
        """:meth:`~.ranking.Ranking.submit`, waited for on a thread of this process (``ranker``
        ranks on its own snapshot, not ``engine``). A ``quiet`` batch ranks on ``alone_threads``
        when every other ranker is idle too (a lone search gets the cores), else on
        ``threads``."""
        alone = quiet and self._free.qsize() == len(self._all) - 1
        threads = self.alone_threads if alone else self.threads
        with self._lock:
            self.busy += len(requests)

        def run() -> None:
            try:
                outcome = ranker.rank(requests, threads)
            except Exception as exc:  # handed to the batch's searches
                outcome = exc
            finally:
                with self._lock:
                    self.busy -= len(requests)
                self._free.put(ranker)
            done(outcome)

        threading.Thread(target=run, name=f"dicosa-ranker-{ranker.number}-wait",
                         daemon=True).start()

    def close(self) -> None:
        for ranker in self._all:
            ranker.stop()


# -- in the ranker process ---------------------------------------------------------------------
def _serve_batches(conn: Connection, job: _Job) -> None:
    """A ranker process: open the index, say so, then rank batches until told to stop."""
    import torch

    from ..errors import USER_ERRORS

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its rankers itself
    torch.set_num_threads(job.threads)
    keep_freed_buffers()  # a search's buffers stay for the next (compute.py)
    try:
        service = Service.open(job.spec, job.reload_interval_s, freeze_heap=True)
    except USER_ERRORS as exc:
        conn.send(("failed", str(exc)))
        return
    freeze_heap()  # the open index out of the collector's walks (compute.py)
    conn.send(("ready", str(len(service.engine.index))))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):  # the server has gone
            return
        if batch is None:
            return
        requests, threads = batch
        service.reload_if_due()  # the old snapshot, if replaced, collected and refrozen
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        with torch.inference_mode():
            outcomes = answers(service.engine, requests)
        conn.send([(ok, value if ok else _sendable(value)) for ok, value in outcomes])


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
