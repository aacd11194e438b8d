"""What the service opens: one index with its model, the same in every process that searches.

An :class:`EngineSpec` is built once from ``dicosa serve``'s options and handed to
:meth:`Engine.open <dicosa.serve.engine.Engine.open>` by the server and by each ranker
process (:mod:`dicosa.serve.rankers`); a reopened snapshot keeps it. It is frozen and
picklable: a ranker process receives it as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TIMELINE_ROWS", "EngineSpec"]

# Rows (segments) a hit's timeline scores at most by default (``dicosa serve --timeline-rows``;
# dicosa.search.moment.timeline_rows): scoring every row of long videos costs more than the
# rerank; 16 is a row every ~4 min of an hour.
TIMELINE_ROWS = 16


@dataclass(frozen=True)
class EngineSpec:
    """One index as the service opens it. ``text_tower``: how queries are encoded
    (:mod:`dicosa.search.query_text`; ``auto``: ``packed`` on a CPU, ``float`` on a GPU);
    ``populate``: map the frame store in when opening, where what the page cache lacks of it
    fits in half the memory available (:func:`~dicosa.search.shards.populate_shards`)."""

    index: str  # the index folder
    device: str | None = None  # where to search (None: CUDA if present)
    media_roots: tuple[str, ...] = ()  # folders whose videos may be streamed (empty: each
    # video's own folder)
    text_tower: str = "auto"
    query_cache: int = 1024  # query texts whose encodings are kept (0: none)
    timeline_rows: int = TIMELINE_ROWS  # the most rows of a hit's video its timeline scores
    populate: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", os.fspath(self.index))
        object.__setattr__(self, "media_roots", tuple(os.fspath(r) for r in self.media_roots))
