"""The writing methods of :class:`~dicosa.index.VideoIndex`: add, add_runs, add_features,
link_shard and remove, each a transaction (:mod:`dicosa.index.transactions`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..integers import as_int
from ..model import VideoFeatures
from ..search.shards import VideoRun
from .encode import clips_as_features
from .ingest import Clip, ingest, list_videos, new_or_changed

__all__ = ["Adding"]

log = logging.getLogger("dicosa.index.video_index")


class Adding:
    """Mixed into :class:`~dicosa.index.VideoIndex`."""

    def add(self, videos: str | os.PathLike | Iterable[str | os.PathLike], *,
            batch_size: int = 16, num_workers: int | None = None, shard_size: int = 256,
            progress: bool = True, titles: dict[str, str] | str | os.PathLike | None = None,
            only_new: bool = True) -> int:
        """Encode and store the videos not yet indexed, and those whose file changed (size
        or modification time) since it was indexed; returns how many were stored.

        Files that cannot be decoded are logged, counted in :attr:`skipped` and left out,
        unless ``titles`` gives them a title: then they are indexed text-only (no frame in
        the mask; :attr:`text_only`); those whose decode lost part of them are indexed from
        what decodes and listed in :attr:`partial`. Each full shard is one transaction:
        stored, given to every first stage, committed. ``only_new=False`` encodes every
        listed video (each process of a multi-process build has decided itself what is new).
        The writer lock is held from the listing to the end, so two writers never encode the
        same video.
        """
        from ..search.title_fusion import normalise_titles

        batch_size, shard_size = _count(batch_size, "batch_size"), _count(shard_size,
                                                                         "shard_size")
        if num_workers is not None:
            num_workers = _count(num_workers, "num_workers", least=0)
        model = self._require_model()
        listed = list(dict.fromkeys(list_videos(videos)))
        with self.writing():
            todo = (new_or_changed(listed, self.store.video_metadata()) if only_new
                    else listed)
            if not todo:
                return 0
            retried = set(todo)
            with self.transaction():
                self.skipped = [(p, r) for p, r in self.skipped if p not in retried]
            report = ingest(model, self.device, todo, self.frames, self._store_pending,
                            segments=self.segments, batch_size=batch_size,
                            num_workers=num_workers,
                            shard_size=shard_size, progress=progress,
                            titles=normalise_titles(titles))
            with self.transaction():
                self.skipped += report.skipped
                self.text_only += report.text_only
                self.partial += report.partial
                if self.directory is not None:
                    self._stages.save(self.directory)
        if report.skipped:
            log.warning("skipped %d of %d video files that could not be indexed (see "
                        "index.skipped)", len(report.skipped), len(todo))
        return report.added

    def _store_pending(self, pending: list[Clip] | list[VideoRun], pad: np.ndarray) -> None:
        if isinstance(pending[0], VideoRun):
            self.add_runs(pending, pad)
            return
        self.add_features(*clips_as_features(pending))

    def add_runs(self, runs: list[VideoRun], pad: np.ndarray) -> np.ndarray:
        """Store already encoded videos as frame runs cut into segments (one ``runs``
        shard, :mod:`dicosa.search.shards`), in one transaction; returns their row ids. The
        live rows of the same paths are replaced."""
        with self.transaction():
            replaced = self._live_ids_of([r.row["path"] for r in runs])
            if len(replaced):
                self.store.remove(replaced)
                self._stages.remove(replaced)
            self._reserve(sum(len(r.segments) for r in runs))
            return self._stages.extend(lambda: self.store.append_runs(
                runs, pad, self.segments.window))

    def add_features(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """Store already encoded videos (float16 ``[n, N, D]`` frames and their metadata rows,
        at least ``path``) as one shard, in one transaction; returns their row ids. A live
        row of the same path is replaced (a changed file encoded again)."""
        with self.transaction():
            replaced = self._live_ids_of([r["path"] for r in rows])
            if len(replaced):
                self.store.remove(replaced)
                self._stages.remove(replaced)
            self._reserve(len(rows))
            return self._stages.extend(lambda: self.store.append(video, rows))

    def link_shard(self, name: str, count: int, sha256: dict | None = None) -> np.ndarray:
        """Append a shard file already in the index folder (``name`` relative to it, holding
        ``count`` rows; ``sha256`` its files' checksums where the writer recorded them) as
        new rows, without copying it (one transaction); returns their ids."""
        return self.link_shards([(name, count, sha256)])

    def link_shards(self, shards: list[tuple[str, int, dict | None]]) -> np.ndarray:
        """:meth:`link_shard` for several shards ``(name, count, sha256)`` in one
        transaction, the first stages given every new row at once; returns their ids. The
        merge of a multi-process or Ray build links its workers' shards this way."""
        with self.transaction():
            if self.store.num_frames is None and self.segments is not None:
                # a runs shard's own width is its longest segment's, maybe under N
                self.store.num_frames = self.segments.window
            self._reserve(sum(count for _, count, _ in shards))
            return self._stages.extend(lambda: np.concatenate(
                [np.zeros(0, np.int64)] + [self.store.link(name, count, sha256)
                                           for name, count, sha256 in shards]))

    def remove(self, videos: str | Iterable[str] | np.ndarray | Sequence[int]) -> int:
        """Remove videos (paths, or ids: a video's id or any of its rows' ids) from the store
        and every first stage, every row of each, in one transaction; returns how many rows
        were live. Their ids are never reused."""
        items = [videos] if isinstance(videos, str) else list(np.asarray(videos).reshape(-1)
                                                              if isinstance(videos, np.ndarray)
                                                              else videos)
        with self.transaction():
            if items and isinstance(items[0], (str, os.PathLike)):
                ids = self._live_ids_of(items)
            else:
                ids = self._rows_of_videos(np.asarray(items, dtype=np.int64))
            ids = self.store.remove(ids)
            if len(ids):
                self._stages.remove(ids)
                if self.directory is not None:
                    self._stages.save(self.directory)
        return len(ids)

    def _rows_of_videos(self, ids: np.ndarray) -> np.ndarray:
        """Every live row of the videos that rows ``ids`` belong to (unknown ids ignored)."""
        ids = ids[(ids >= 0) & (ids < self.store.next_id)]
        if not self.store.segmented:
            return ids
        return np.concatenate([np.zeros(0, np.int64)] + [
            self.store.video_rows(int(v)) for v in np.unique(self.store.videos_of(ids))])

    def _live_ids_of(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
        if not len(self.store):
            return np.zeros(0, dtype=np.int64)
        table = self.store.metadata()
        wanted = {str(Path(p).resolve()) for p in paths} | {str(p) for p in paths}
        return table.index[table["path"].isin(wanted)].to_numpy(np.int64)


def _count(value: object, name: str, least: int = 1) -> int:
    """``value`` as an int of at least ``least`` (numpy's integers too), else one sentence."""
    number = as_int(value)
    if number is None or number < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return number
