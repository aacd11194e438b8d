"""Transactions of an index in a folder: the writer lock, the commit, refresh and rollback.

:class:`Transactional` is the part of :class:`~dicosa.index.VideoIndex` that keeps the
object and its folder in step: a write runs under the folder's writer lock
(:mod:`dicosa.index.lock`), first taking what other writers committed since this object read
the manifest (:meth:`Transactional._refresh`), and ends in one manifest commit
(:mod:`dicosa.index.manifest`); an exception reloads the last commit (rollback).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ..search.store import FrameStore
from .lock import WriterLock
from .manifest import MANIFEST, Manifest, read_reserved, write_reserved
from .stages import Registered, StageSet

__all__ = ["Transactional"]


class Transactional:
    """Mixed into :class:`~dicosa.index.VideoIndex` (whose attributes it reads and sets)."""

    @contextmanager
    def writing(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the folder's writer lock (re-entrant), first reloading what another writer
        committed since this object read the manifest. In memory: nothing to lock."""
        if self.directory is None:
            yield
            return
        if self._lock is None or self._lock.directory != self.directory:
            self._lock = WriterLock(self.directory)
        self._lock.timeout = self.lock_timeout if timeout is None else timeout
        first = not self._lock.held
        with self._lock:
            if first and self.changed():
                self._refresh()
            yield

    @contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator[None]:
        """One change: under :meth:`writing`, ending in one manifest commit (nested ones
        join the outermost). Any exception reloads the last committed state and is
        re-raised: the object stays usable and holds exactly what the folder holds."""
        with self.writing(timeout):
            self._in_transaction += 1
            try:
                yield
                if self._in_transaction == 1 and self.directory is not None:
                    self._commit()
            except BaseException:
                if (self._in_transaction == 1 and self.directory is not None
                        and (self.directory / MANIFEST).is_file()):
                    self._reload()  # else nothing was ever committed: nothing to return to
                raise
            finally:
                self._in_transaction -= 1

    def _commit(self) -> None:
        store = self.store.manifest()
        if store["num_frames"] is None:
            store["num_frames"] = (self._fingerprint or {}).get("config", {}).get("num_frames")
            store["dim"] = self.model.embed_dim if self.model is not None else None
        Manifest(self._fingerprint, store, self._stages.record(), list(self.skipped),
                 self.frames, self.meta, self._generation + 1, len(self),
                 self.segments).write(self.directory)
        self._generation += 1

    def changed(self) -> bool:
        """Whether another writer committed since this object read the manifest."""
        if self.directory is None or not (self.directory / MANIFEST).is_file():
            return False
        return Manifest.read(self.directory).generation != self._generation

    def reload(self) -> bool:
        """See what other writers committed (:meth:`_refresh`); returns whether anything
        changed. Not while searches run in other threads on this object: a service opens a
        new index and swaps it in (see ``dicosa serve``)."""
        if not self.changed():
            return False
        self._refresh()
        return True

    def _refresh(self) -> None:
        """Take another writer's commits in place: the store object every part holds is
        updated, each first stage gets the rows added and loses the rows removed since, and
        the plugins stay attached (their per-row data follow the store's ids)."""
        manifest = Manifest.read(self.directory)
        fresh = FrameStore.open(self.directory, manifest.store)
        # The stages made so far (one made later is filled from the refreshed store).
        registered = ([Registered(self._stages.dense, dense=True)]
                      if self._stages.dense is not None else []) + list(self._stages.extra)
        before = self.store.live()
        self.store.__dict__.update(fresh.__dict__)
        self.store.reserved = read_reserved(self.directory)
        gone, came = np.setdiff1d(before, self.store.live()), np.setdiff1d(self.store.live(),
                                                                           before)
        for entry in registered:
            if len(gone):
                entry.stage.remove(gone)
            if len(came):
                self._stages.add_rows(entry, came)
        self.frames, self._fingerprint = manifest.frames, manifest.fingerprint
        self.segments = manifest.segments
        self.meta, self.skipped = manifest.meta, list(manifest.skipped)
        self._generation = manifest.generation
        self._stages.synced = manifest.first_stage.get("synced")

    def _reload(self) -> None:
        """This object as the folder's last commit says, model and plugins kept."""
        manifest = Manifest.read(self.directory)
        for ctx in self._contexts.values():
            ctx.detach()
        self._apply(manifest)
        if self.model is not None:
            self._stages.model, self._stages.device = self.model, self.device
            for key, plugin in list(self.plugins.items()):
                self._attach_plugin(key, plugin)

    def _apply(self, manifest: Manifest) -> None:
        """Take the committed state ``manifest`` describes (no model or plugin work)."""
        spec = manifest.first_stage
        spec = {"backend": spec.get("backend"), "uri": spec.get("uri"),
                "options": spec.get("options") or {}, "summary": spec.get("summary",
                                                                          "confidence"),
                "calibration": spec.get("calibration"), "dim": spec.get("dim"),
                "synced": spec.get("synced")}
        self.frames = manifest.frames
        self.segments = manifest.segments
        self._fingerprint = manifest.fingerprint
        self.meta = manifest.meta
        self.skipped = list(manifest.skipped)
        self._generation = manifest.generation
        self.store = FrameStore.open(self.directory, manifest.store)
        self.store.reserved = read_reserved(self.directory)
        self._stages = StageSet(self.store, spec, self._stages._summary_head)
        self._stages.directory = self.directory
        self._stages.open_dense(self.directory)

    def _reserve(self, count: int) -> None:
        """Record the ids the next rows take before any file holds them (manifest.py)."""
        first = max(self.store.next_id, self.store.reserved)
        if self.directory is not None:
            write_reserved(self.directory, first + count)
        self.store.reserved = first  # the append starts here (a reload: after all of it)

