"""The query vectors of the service's last searches, for the timelines asked after them.

The page shows a search's hits with a timeline of each hit's best segment only
(``timeline_rows=1``: a page of 10 hour-long hits costs what one of short clips does), then
asks ``POST /api/timelines`` for the rest of each strip. That request names the query, not its
vector; encoding it again would cost as much as the text tower did in the search (~12 ms on
two CPU cores), so the service keeps the vector each search's answer carries here, by the
text it encoded (the query without its exclusions), and the timelines request finds it. A
text not here (an old search, another worker process) is encoded again: the same vector
within float tolerance, never a wrong one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

__all__ = ["RecentVectors"]


class RecentVectors:
    """The last ``capacity`` query texts' vectors (least recently used first out)."""

    def __init__(self, capacity: int = 256):
        if capacity < 1:
            raise ValueError(f"keep at least one vector, got capacity {capacity}")
        self.capacity = capacity
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, text: str, vector: np.ndarray | None) -> None:
        """Keep ``vector`` ``[D]`` as ``text``'s (None: nothing to keep)."""
        if vector is None:
            return
        with self._lock:
            self._vectors[text] = vector
            self._vectors.move_to_end(text)
            while len(self._vectors) > self.capacity:
                self._vectors.popitem(last=False)

    def recall(self, text: str) -> np.ndarray | None:
        """``text``'s vector if a recent search encoded it, else None."""
        with self._lock:
            vector = self._vectors.get(text)
            if vector is not None:
                self._vectors.move_to_end(text)
            return vector

    def __len__(self) -> int:
        return len(self._vectors)
