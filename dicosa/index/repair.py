"""Rows whose stored features cannot be trusted, encoded again from their videos
(``dicosa check --repair``; ``docs/data-safety.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model import DiCoSA
from .listing import file_changed, file_stamp
from .manifest import Manifest
from .video_index import VideoIndex, open_index

__all__ = ["Repair", "repair_rows"]

log = logging.getLogger(__name__)


@dataclass
class Repair:
    """What :func:`repair_rows` did."""

    removed: int = 0  # rows removed
    encoded: list[str] = field(default_factory=list)  # videos encoded again
    not_encoded: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def repair_rows(directory: str | Path, ids: np.ndarray, model: DiCoSA | None = None
                ) -> Repair:
    """Remove every row of the videos of rows ``ids`` and, in the same transaction, encode
    again, with the index's model, frame protocol, segments and plugins, each video whose
    file is still where its row says and unchanged (size and mtime; an index that recorded
    none takes it as unchanged). ``model``: the index's own, in place of the one its
    manifest records."""
    index, why_not = _open(Path(directory), model)
    done = Repair()
    with index.writing():
        videos = np.unique(index.store.videos.of(np.asarray(ids, dtype=np.int64)))
        table = index.store.table.rows(videos)
        todo = []
        for path, size, mtime in zip(table["path"], table["size"], table["mtime"],
                                     strict=True):
            why = why_not or _why_not(str(path), (size, mtime))
            if why:
                done.not_encoded.append((str(path), why))
            else:
                todo.append(str(path))
        with index.transaction():
            done.removed = index.remove(videos)
            if todo:
                index.add(todo, only_new=False, progress=False,
                          num_workers=0 if len(todo) <= 4 else None)
        failed = dict(index.skipped)
    for path in todo:
        if path in failed:
            done.not_encoded.append((path, f"it no longer decodes ({failed[path]})"))
        else:
            done.encoded.append(path)
    return done


def _open(directory: Path, model: DiCoSA | None) -> tuple[VideoIndex, str | None]:
    """The index with its model and plugins, or, where they cannot be loaded, the index
    alone and why (its rows can then only be removed)."""
    if model is None and not Manifest.read(directory).meta.get("model"):
        return (VideoIndex.load(directory, None, verify=False),
                "the index records no model to encode it with (built in Python without "
                "meta={'model': ...}: check_index(..., model=MODEL) gives one)")
    try:
        return open_index(directory, model, verify=False), None
    except Exception as exc:  # a checkpoint or head that is gone, another machine's path
        log.warning("the damaged rows are removed but not encoded again: %s", exc)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (VideoIndex.load(directory, None, verify=False),
                f"the index's model cannot be loaded ({reason})")


def _why_not(path: str, recorded: tuple) -> str | None:
    """Why the file at ``path`` cannot give its row again (None: it can)."""
    now = file_stamp(path)
    if now[0] != now[0]:  # NaN: no such file (or it cannot be read)
        return "the file is gone"
    if file_changed(recorded, now):
        return "the file changed since it was indexed (size or modification time)"
    return None
