"""A per-row array kept in an index folder and extended as rows arrive.

Row ids are never reused, so an array over every row id (removed rows included) stays valid as
the index grows: a later session computes only the rows added since it was written. The array
is stored as ``NAME.npy`` with ``NAME.json`` naming what made it (a model's or head's
weights); another maker's array is computed again, never reused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..files import write_bytes_atomic, write_text_atomic
from .dense import array_bytes

__all__ = ["RowCache"]

log = logging.getLogger(__name__)


class RowCache:
    """``array [rows covered, width]`` of ``dtype``, one row per row id, for ``key``'s maker.

    ``folder=None``: kept in memory only (an index without a folder).
    """

    def __init__(self, folder: str | Path | None, name: str, key: str, width: int,
                 dtype: np.dtype | type = np.float32) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.name, self.key, self.dtype = name, key, np.dtype(dtype)
        self._stored_key: str | None = None  # the maker the files on disk name
        self.array = self._read(width)

    def _read(self, width: int) -> np.ndarray:
        empty = np.zeros((0, width), dtype=self.dtype)
        if self.folder is None or not (self.folder / f"{self.name}.json").is_file():
            return empty
        try:
            info = json.loads((self.folder / f"{self.name}.json").read_text())
        except ValueError:
            log.warning("%s.json in %s is damaged: computing %s again", self.name,
                        self.folder, self.name)
            return empty
        self._stored_key = info.get("key")
        path = self.folder / f"{self.name}.npy"
        if info.get("key") != self.key or not path.is_file():
            log.info("%s in %s was made by another model or head: computing it again",
                     self.name, self.folder)
            return empty
        try:
            array = np.load(path)
        except (ValueError, OSError, EOFError) as exc:  # truncated or damaged: derivable
            log.warning("%s is damaged (%s): computing it again", path,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return empty
        if array.ndim != 2 or array.shape[1] != width or array.dtype != self.dtype:
            log.warning("%s in %s has shape %s %s, not [*, %d] %s: computing it again",
                        self.name, self.folder, array.shape, array.dtype, width, self.dtype)
            return empty
        return array

    def extend(self, next_id: int, live: np.ndarray,
               compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The array over row ids ``[0, next_id)``: rows from the covered count on are
        ``compute(ids)`` for the ``live`` ones among them (zeros for removed ones), then the
        file is rewritten. Returns the whole array."""
        start = len(self.array)
        if next_id <= start:
            return self.array[:next_id]
        new = np.zeros((next_id - start, self.array.shape[1]), dtype=self.dtype)
        todo = np.asarray(live, dtype=np.int64)
        todo = todo[todo >= start]
        if len(todo):
            new[todo - start] = compute(todo)
        self.array = np.concatenate([self.array, new])
        self._write()
        return self.array

    def _write(self) -> None:
        if self.folder is None:
            return
        info = self.folder / f"{self.name}.json"
        if self._stored_key not in (None, self.key):  # another maker's files: disown them
            write_text_atomic(info, json.dumps({"key": None}))
        # The array before its key: a crash between the two never leaves one maker's key
        # on another maker's rows.
        write_bytes_atomic(self.folder / f"{self.name}.npy", array_bytes(self.array))
        write_text_atomic(info, json.dumps({"key": self.key, "rows": len(self.array)},
                                           indent=1))
        self._stored_key = self.key
