"""A search query as an FTS5 expression that user input cannot break or steer.

``"quoted words"`` match literally (an FTS5 phrase) and every quoted phrase must be in a line;
the other words are alternatives that BM25 ranks: ``red car "exit 42"`` finds lines holding
"exit 42", ranked higher where they also say red or car. An unquoted word of
:data:`STOP_WORDS` never matches a line on its own, and a query of stop words alone ("to be
or not to be") is searched as the phrase it is (docs/text.md, "Stop words").

Nothing of the user's text reaches SQLite as syntax: words are cut out of it as runs of
letters and digits (what FTS5's ``unicode61`` tokenizer keeps), each becomes an FTS5 string
(``"word"``, a double quote inside doubled), and the expression is a bound parameter, so
FTS5's operators typed by a user are words or nothing.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["MAX_TERMS", "SNIPPET_CHARS", "STOP_WORDS", "TextQuery", "snippet", "text_query",
           "words_of"]

MAX_TERMS = 64  # words and phrases a query keeps (the rest are ignored)
SNIPPET_CHARS = 240  # the most of a line an answer shows (around its first matched word)
# English function words (as words_of gives them: lower case, no accents, apostrophes cut).
_STOP_WORDS = """
a an the and or but nor so yet if then than as of at by for from in into on onto off out over
under up down to with without about above below between through during before after
again further once here there when where why how all any both each few more most other some
such no not only own same too very can will just should would could may might must shall
is am are was were be been being have has had having do does did doing i me my myself we us
our ours ourselves you your yours yourself yourselves he him his himself she her hers herself
it its itself they them their theirs themselves what which who whom whose this that these
those s t d ll m re ve don isn aren wasn weren hasn haven hadn doesn didn wouldn shan
shouldn couldn mustn
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())
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
        return set(self._words()).union(*self._phrases())

    def _words(self) -> tuple[str, ...]:
        """The words that may match alone: the stop words left out where another word or a
        phrase is there to match (module docstring)."""
        content = tuple(w for w in self.words if w not in STOP_WORDS)
        return content if content or self.phrases else ()

    def _phrases(self) -> tuple[tuple[str, ...], ...]:
        """The quoted phrases, or a query of stop words alone as one phrase."""
        if self.phrases or self._words() or not self.words:
            return self.phrases
        return (self.words,)

    def expression(self) -> str | None:
        """The FTS5 query (a bound parameter for ``MATCH``), None when nothing is left to
        search for."""
        required = [_string(p) for p in self._phrases()]
        optional = [_string((w,)) for w in self._words()]
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


def snippet(text: str, words: set[str] | list[str], limit: int = SNIPPET_CHARS) -> str:
    """At most ``limit`` characters of ``text`` around the first of ``words`` it holds (as
    :func:`words_of` compares them), an ellipsis where it was cut; a short text whole."""
    if len(text) <= limit:
        return text
    wanted = set(words)
    at = next((m.start() for m in _WORD.finditer(text) if words_of(m.group(0))
               and words_of(m.group(0))[0] in wanted), 0)
    start = max(0, min(at - limit // 4, len(text) - limit))
    part = text[start:start + limit]
    return ("\u2026" if start else "") + part.strip() + (
        "\u2026" if start + limit < len(text) else "")
