"""Search queries: the text to find, and what must not be in the video.

Grammar (case-insensitive, on word boundaries)::

    query    := positive ( marker negative )*
    marker   := "without" | "but not" | "excluding" | "except"
    negative := any text up to the next marker (may be several words: "a blue square")

``"a red circle without a blue square"`` asks for videos with a red circle and no blue
square; ``"a dog but not a cat without people"`` excludes both. Exclusions may also be
given explicitly (``exclude=["a blue square"]``, ``--exclude``); they are added to those in
the text. "not" alone is *not* a marker: captions such as "a red circle does not move"
describe what happens in the video and stay one positive query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["EXCLUSION_MARKERS", "Query", "QueryError", "parse_query"]

EXCLUSION_MARKERS = ("without", "but not", "excluding", "except")
_MARKER = re.compile(r"\b(?:" + "|".join(m.replace(" ", r"\s+") for m in EXCLUSION_MARKERS)
                     + r")\b", re.IGNORECASE)


class QueryError(ValueError):
    """A query that cannot be searched (empty text, an empty exclusion)."""


@dataclass(frozen=True)
class Query:
    """``text``: what to find; ``exclude``: texts that must not be in the video."""

    text: str
    exclude: tuple[str, ...] = field(default=())

    @property
    def is_exclusion(self) -> bool:
        return bool(self.exclude)


def _clean(text: str) -> str:
    return " ".join(text.split())


def parse_query(text: str, exclude: Iterable[str] = ()) -> Query:
    """Split ``text`` into what to find and what to exclude (module docstring's grammar).

    Raises:
        QueryError: the text to find is empty or whitespace, or an exclusion is empty
            ("a dog without").
    """
    if not isinstance(text, str):
        raise QueryError(f"a query must be a string, got {type(text).__name__}")
    parts = _MARKER.split(text)
    positive = _clean(parts[0])
    negatives = [_clean(p) for p in parts[1:]] + [_clean(e) for e in exclude]
    if not positive:
        what = "empty" if not text.strip() else f"'{_clean(text)}' has nothing before its marker"
        raise QueryError(f"the query is {what}: give the text of what to find")
    if any(not n for n in negatives):
        raise QueryError(f"the query '{_clean(text)}' has an empty exclusion: say what to "
                         "exclude after 'without' / 'but not' (or in --exclude)")
    return Query(positive, tuple(dict.fromkeys(negatives)))
