"""The writer of an index folder: its lock, its transactions (each ending in one manifest
commit; an exception takes the last commit back) and the rows of the frame store and every
first stage changed in them. ``docs/data-safety.md`` says what is guaranteed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..model import VideoFeatures
from ..search.shards import VideoRun
from ..search.store import FrameStore
from .lock import WriterLock
from .manifest import MANIFEST, Manifest, write_reserved
from .stages import StageSet

__all__ = ["Writer"]


class Writer:
    """Transactions of one index object in its folder, and the rows of its ``store`` and
    ``stages`` changed in them.

    Args:
        record: the manifest of the object's state now, as generation ``generation``.
        take: puts a committed ``manifest`` into the object, in place: another writer's
            commits (``False``: what is attached stays), or the whole of the last commit
            after a failed write (``True``).
        lock_timeout: seconds a write waits for another writer (None: as long as it takes;
            0: fail at once with :class:`~dicosa.index.lock.IndexBusyError`).
    """

    def __init__(self, store: FrameStore, stages: StageSet, record: Callable[[int], Manifest],
                 take: Callable[[Manifest, bool], None], lock_timeout: float | None = None):
        self.store, self.stages = store, stages
        self.record, self.take = record, take
        self.lock_timeout = lock_timeout
        self.directory: Path | None = None  # None: an index in memory, nothing to lock
        self.generation = 0  # of the last commit this object read or wrote
        self._lock: WriterLock | None = None
        self._depth = 0  # transactions open (nested ones join the outermost)

    @contextmanager
    def writing(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the folder's writer lock (re-entrant), first taking what another writer
        committed since this object read the manifest. In memory: nothing to lock."""
        if self.directory is None:
            yield
            return
        if self._lock is None or self._lock.directory != self.directory:
            self._lock = WriterLock(self.directory)
        self._lock.timeout = self.lock_timeout if timeout is None else timeout
        first = not self._lock.held
        with self._lock:
            if first:
                self.reload()
            yield

    @contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator[None]:
        """One change: under :meth:`writing`, ending in one manifest commit (nested ones
        join the outermost). Any exception takes the last commit back and is re-raised: the
        object stays usable and holds exactly what the folder holds."""
        with self.writing(timeout):
            self._depth += 1
            try:
                yield
                if self._depth == 1 and self.directory is not None:
                    self.record(self.generation + 1).write(self.directory)
                    self.generation += 1
            except BaseException:
                if (self._depth == 1 and self.directory is not None
                        and (self.directory / MANIFEST).is_file()):
                    # else nothing was ever committed: nothing to return to
                    self.take(Manifest.read(self.directory), True)
                raise
            finally:
                self._depth -= 1

    def holds(self) -> bool:
        """Whether this object may write the folder now: it holds the writer lock (or the
        index is in memory)."""
        return self.directory is None or (self._lock is not None and self._lock.held
                                           and self._lock.directory == self.directory)

    def changed(self) -> bool:
        """Whether another writer committed since this object read the manifest."""
        if self.directory is None or not (self.directory / MANIFEST).is_file():
            return False
        return Manifest.read(self.directory).generation != self.generation

    def reload(self) -> bool:
        """Take what other writers committed, in place; returns whether anything changed.
        Not while searches run in other threads on this object: a service opens a new index
        and swaps it in (see ``dicosa serve``)."""
        if not self.changed():
            return False
        self.take(Manifest.read(self.directory), False)
        return True

    # -- rows ---------------------------------------------------------------------------
    def add_features(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """One ``clips`` shard of already encoded videos (:meth:`VideoIndex.add_features`)."""
        return self._replace([r["path"] for r in rows], len(rows),
                             lambda: self.store.append(video, rows))

    def add_runs(self, runs: list[VideoRun], pad: np.ndarray, window: int) -> np.ndarray:
        """One ``runs`` shard of frame runs cut into segments of at most ``window`` frames
        (:meth:`VideoIndex.add_runs`)."""
        return self._replace([r.row["path"] for r in runs],
                             sum(len(r.segments) for r in runs),
                             lambda: self.store.append_runs(runs, pad, window))

    def _replace(self, paths: list[str], count: int, append: Callable[[], np.ndarray]
                 ) -> np.ndarray:
        with self.transaction():
            replaced = self.live_ids_of(paths)
            if len(replaced):
                self.store.remove(replaced)
                self.stages.remove(replaced)
            self._reserve(count)
            return self.stages.extend(append)

    def link(self, shards: list[tuple[str, int, dict | None]], window: int | None
             ) -> np.ndarray:
        """Shard files already in the folder, ``(name, count, sha256)``, appended as new rows
        in one transaction (:meth:`VideoIndex.link_shards`); ``window``: the rows' width when
        the store does not know it yet."""
        with self.transaction():
            if self.store.num_frames is None and window is not None:
                # a runs shard's own width is its longest segment's, maybe under N
                self.store.num_frames = window
            self._reserve(sum(count for _, count, _ in shards))
            return self.stages.extend(lambda: np.concatenate(
                [np.zeros(0, np.int64)] + [self.store.link(name, count, sha256)
                                           for name, count, sha256 in shards]))

    def remove(self, videos: str | Iterable[str] | np.ndarray | Sequence[int]) -> int:
        """Every row of ``videos`` (paths, or ids: a video's or any of its rows') out of the
        store and every stage, in one transaction; returns how many rows were live."""
        items = [videos] if isinstance(videos, str) else list(np.asarray(videos).reshape(-1)
                                                              if isinstance(videos, np.ndarray)
                                                              else videos)
        with self.transaction():
            if items and isinstance(items[0], (str, os.PathLike)):
                ids = self.live_ids_of(items)
            else:
                ids = self._rows_of_videos(np.asarray(items, dtype=np.int64))
            ids = self.store.remove(ids)
            if len(ids):
                self.stages.remove(ids)
                if self.directory is not None:
                    self.stages.save(self.directory)
        return len(ids)

    def _reserve(self, count: int) -> None:
        """Record the ids the next ``count`` rows take before any file holds them; the
        append starts at the first (a reload starts after all of them)."""
        first = max(self.store.next_id, self.store.reserved)
        if self.directory is not None:
            write_reserved(self.directory, first + count)
        self.store.reserved = first

    def _rows_of_videos(self, ids: np.ndarray) -> np.ndarray:
        """Every live row of the videos that rows ``ids`` belong to (unknown ids ignored)."""
        ids = ids[(ids >= 0) & (ids < self.store.next_id)]
        if not self.store.segmented:
            return ids
        return np.concatenate([np.zeros(0, np.int64)] + [
            self.store.videos.rows(int(v)) for v in np.unique(self.store.videos.of(ids))])

    def live_ids_of(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
        """The live rows of the videos at ``paths``."""
        if not len(self.store):
            return np.zeros(0, dtype=np.int64)
        table = self.store.table.all()
        wanted = {str(Path(p).resolve()) for p in paths} | {str(p) for p in paths}
        return table.index[table["path"].isin(wanted)].to_numpy(np.int64)
