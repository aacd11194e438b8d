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

__all__ = ["EXCLUSION_MARKERS", "QUERY_PATTERN", "Query", "QueryError", "parse_query"]

EXCLUSION_MARKERS = ("without", "but not", "excluding", "except")


def _caseless(word: str) -> str:
    """``word`` as a pattern of either case, letter by letter (a JSON Schema pattern has no
    flags); a space stands for any run of whitespace."""
    return "".join(r"\s+" if c == " " else f"[{c.lower()}{c.upper()}]" for c in word)


_MARKERS = r"\b(?:" + "|".join(_caseless(m) for m in EXCLUSION_MARKERS) + r")\b"
_MARKER = re.compile(_MARKERS)
# Exactly the texts :func:`parse_query` accepts (without ``exclude``): the first non-space
# character does not start a marker (something to find comes first), and no marker is
# followed only by whitespace before the end or the next marker (something after each).
# Python's ``re`` dialect, as JSON Schema validators in Python read it; the service
# publishes it as the ``q`` parameter's pattern.
QUERY_PATTERN = rf"^(?![\s\S]*{_MARKERS}\s*(?:{_MARKERS}|$))\s*(?!{_MARKERS})\S"


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
        raise QueryError(f"a query must be text (str), got {type(text).__name__}")
    exclude = [exclude] if isinstance(exclude, str) else list(exclude)
    for item in exclude:
        if not isinstance(item, str):
            raise QueryError(f"what to exclude must be text (str), got {type(item).__name__}")
    parts = _MARKER.split(text)
    positive = _clean(parts[0])
    negatives = [_clean(p) for p in parts[1:]] + [_clean(e) for e in exclude]
    if not text.strip():
        raise QueryError("the query is empty: give the text of what to find")
    if not positive:
        marker = _MARKER.search(text).group(0)
        raise QueryError(f"the query '{_clean(text)}' has nothing before '{_clean(marker)}': "
                         "give the text of what to find first")
    if any(not n for n in negatives):
        raise QueryError(f"the query '{_clean(text)}' has an empty exclusion: say what to "
                         "exclude after 'without' / 'but not' (or in --exclude)")
    return Query(positive, tuple(dict.fromkeys(negatives)))
