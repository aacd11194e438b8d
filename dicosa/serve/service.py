"""The engine the service's requests use now, and its reopening after another process
changed the index (``dicosa index`` into the same folder): once the change is complete
(:meth:`Engine.outdated`) the index is opened again beside the old one
(:meth:`Engine.reopen`) and the whole engine swapped in, so each search sees the old
collection or the new one.
"""

from __future__ import annotations

import logging
import threading
import time

from .compute import ComputeThread, freeze_heap
from .engine import Engine
from .errors import NotReady
from .spec import EngineSpec

__all__ = ["Service"]

log = logging.getLogger("dicosa.serve")


class Service:
    """The engine requests use now; it looks for a change every ``reload_interval_s`` on a
    watching thread (:meth:`start`), or between a ranker's batches (:meth:`reload_if_due`)."""

    def __init__(self, engine: Engine, reload_interval_s: float = 2.0,
                 compute: ComputeThread | None = None, freeze_heap: bool = False):
        self._engine = engine
        self.compute = compute  # where the index is reopened (None: the watching thread)
        self.reload_interval_s = reload_interval_s
        self.freeze_heap = freeze_heap  # compute.freeze_heap after a reopening (a service
        # process that froze its heap once the index was open)
        self.reloads = 0
        self.last_reload: str | None = None
        self.reload_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._looked = time.monotonic()  # when reload_if_due last looked

    @classmethod
    def open(cls, spec: EngineSpec, reload_interval_s: float = 2.0, *,
             compute: ComputeThread | None = None, freeze_heap: bool = False) -> Service:
        """The index ``spec`` names, opened (:meth:`Engine.open`) on ``compute`` (None: this
        thread), the thread that runs the process's torch work from then on: how the server
        and each ranker process open it."""
        engine = Engine.open(spec) if compute is None else compute.run(Engine.open, spec)
        return cls(engine, reload_interval_s, compute, freeze_heap)

    @property
    def engine(self) -> Engine:
        engine = self._engine  # one read: a request keeps the snapshot it started with
        if engine is None:
            raise NotReady("the index is not open yet")
        return engine

    @property
    def current(self) -> Engine | None:
        """The engine now, or None while the index is still being opened."""
        return self._engine

    def check_reload(self) -> bool:
        """Open the index again if another process finished changing it; True if swapped."""
        with self._lock:
            old = self._engine
            if not old.outdated():
                return False
            started = time.perf_counter()
            try:
                new = old.reopen() if self.compute is None else self.compute.run(old.reopen)
            except Exception as exc:  # keep serving the old snapshot; try again later
                self.reload_error = f"{type(exc).__name__}: {exc}"
                log.warning("could not reopen the index (still serving the previous one): %s",
                            exc)
                return False
            self._engine, self.reloads, self.reload_error = new, self.reloads + 1, None
            self.last_reload = new.opened_at.isoformat(timespec="seconds")
            log.info("reopened the index: %d videos (was %d), in %.1f s", len(new.index),
                     len(old.index), time.perf_counter() - started)
            del old
            if self.freeze_heap:
                freeze_heap(again=True)
            return True

    def start(self) -> None:
        if self.reload_interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="dicosa-reload",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def reload_if_due(self) -> bool:
        """:meth:`look` at most once every ``reload_interval_s`` (never at 0): for a process
        that looks between its own jobs instead of on a watching thread."""
        now = time.monotonic()
        if self.reload_interval_s <= 0 or now - self._looked < self.reload_interval_s:
            return False
        self._looked = now
        return self.look()

    def look(self) -> bool:
        """:meth:`check_reload`, a failure logged, never raised."""
        try:
            return self.check_reload()
        except Exception:  # never let the watcher (or a ranker) die of it
            log.exception("checking the index for changes failed")
            return False

    def _watch(self) -> None:
        while not self._stop.wait(self.reload_interval_s):
            self.look()
