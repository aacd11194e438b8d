"""A search query as an FTS5 expression that user input cannot break or steer.

``"quoted words"`` in a query match literally: the words in that order, next to each other
(an FTS5 phrase), and every quoted phrase must be in a line; the other words are
alternatives (any of them matches) that BM25 ranks by how many, and how rare, they are. So
``red car "exit 42"`` finds lines holding "exit 42", ranked higher where they also say red or
car; ``red car`` finds lines holding either.

Nothing of the user's text reaches SQLite as syntax: words are cut out of it as runs of
letters and digits (what FTS5's ``unicode61`` tokenizer keeps), each becomes an FTS5 string
(``"word"``, a double quote inside doubled), and the expression is passed as a bound
parameter. FTS5's operators (``AND``, ``NEAR(``, ``*``, ``-``, ``^``, ``col:``) typed by a user
are therefore words or nothing, never syntax; NUL and control characters are not letters.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["MAX_TERMS", "TextQuery", "text_query", "words_of"]

MAX_TERMS = 64  # words and phrases a query keeps (the rest are ignored)
_WORD = re.compile(r"[^\W_]+")
_QUOTED = re.compile(r'"([^"]*)"')


def words_of(text: str) -> list[str]:
    """The words of ``text`` as FTS5's ``unicode61 remove_diacritics 2`` tokenizer compares
    them: runs of letters and digits, lower-cased, accents removed."""
    folded = unicodedata.normalize("NFD", text.lower())
    plain = "".join(ch for ch in folded if not unicodedata.combining(ch))
    return _WORD.findall(plain)


def _string(words: tuple[str, ...]) -> str:
    return '"' + " ".join(words).replace('"', '""') + '"'


@dataclass(frozen=True)
class TextQuery:
    """A query's quoted phrases (each must match) and its other words (any may)."""

    phrases: tuple[tuple[str, ...], ...]
    words: tuple[str, ...]

    @property
    def terms(self) -> set[str]:
        """Every word the query looks for (to show where a line matched)."""
        return set(self.words).union(*self.phrases)

    def expression(self) -> str | None:
        """The FTS5 query (a bound parameter for ``MATCH``), None when nothing is left to
        search for."""
        required = [_string(p) for p in self.phrases]
        optional = [_string((w,)) for w in self.words]
        if not required:
            return " OR ".join(optional) or None
        if not optional:
            return " AND ".join(required)
        # Every phrase must match; the words only rank (a phrase among them keeps the OR
        # group true for lines without any of the words).
        return " AND ".join(required) + " AND (" + " OR ".join([required[0], *optional]) + ")"


def text_query(text: str) -> TextQuery:
    """Parse ``text`` (module docstring); an unclosed quote is taken as plain words."""
    phrases, rest, at = [], [], 0
    for match in _QUOTED.finditer(text):
        rest.append(text[at:match.start()])
        words = tuple(words_of(match.group(1)))
        if words:
            phrases.append(words)
        at = match.end()
    rest.append(text[at:])
    words = [w for part in rest for w in words_of(part)]
    phrases = list(dict.fromkeys(phrases))[:MAX_TERMS]
    words = list(dict.fromkeys(words))[:max(0, MAX_TERMS - len(phrases))]
    return TextQuery(tuple(phrases), tuple(words))
