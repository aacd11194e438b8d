"""One query's text side: which sources it looks at, how its matching rows rank, and what
answers say of it.

:data:`SOURCE` is the search option the text plugin registers (``source=``: the pictures and
each text source, :func:`~dicosa.text.rrf.parse_sources`); :data:`WITHOUT_TEXT` stands in for
it where an index has no text plugin (the pictures alone). A :class:`TextRanking` holds a
query's matching rows, best first, with their text ranks and shares of the best BM25 (what
:func:`~dicosa.text.rrf.fuse` reads), and says a matched line as answers give it;
:func:`ranked_by` says what ranked a search's hits, :func:`line_text` a line for a person.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..index.plugins import PICTURES, QueryOption
from ..search.query import QueryError
from ..search.store import FrameStore
from ..text.fts import Match
from ..text.lines import held
from ..text.query import snippet, words_of
from ..text.rrf import ALL_SOURCES, VISUAL, competition_ranks, fuse, parse_sources

if TYPE_CHECKING:
    from ..index.searcher import SearchResult

__all__ = ["SOURCE", "TEXT_RANKED", "WITHOUT_TEXT", "TextRanking", "line_text", "ranked_by",
           "ranking_of"]

TEXT_RANKED = 1000  # rows of the text ranking each query keeps (the first stage's C at most)
_TOKEN = re.compile(r"[^\W_]+")


def _sources(value: object, text: bool = True) -> list[str]:
    """``source=`` checked: the sources a search looks at (:func:`~dicosa.text.rrf
    .parse_sources`); text sources need this plugin (``text``: it is attached)."""
    try:
        sources = parse_sources(value)
    except ValueError as exc:
        raise QueryError(str(exc)) from None
    if not text and sources - {VISUAL}:
        raise QueryError("this index has no text lines to search: read them with "
                         "'dicosa index FOLDER --out INDEX' (subtitles, --speech, --ocr) or "
                         "dicosa.plugins.text.attach_text(index)")
    return sorted(sources)


def _sources_schema(names: tuple[str, ...], said: str) -> dict:
    """``source``'s JSON Schema: names separated by commas (spaces around them allowed);
    empty: every source the index has."""
    name = r"\s*(?:" + "|".join(names) + r")\s*"
    return {"type": "string", "pattern": f"^(?:{name}(?:,{name})*)?$",
            "description": said + "; empty: everything the index has"}


_NAMES = (*ALL_SOURCES, "text", "all")
SOURCE = QueryOption("source", _sources, _sources_schema(
    _NAMES, "what the query is matched against: " + ", ".join(_NAMES)
    + ", or several separated by commas"))
WITHOUT_TEXT = QueryOption("source", lambda value: _sources(value, text=False),
                           _sources_schema((VISUAL,), "this index has no text lines: visual only"))


@dataclass
class TextRanking:
    """One query's text side: the sources it looks at and its matching rows, best first."""

    visual: bool  # the pictures count
    sources: tuple[str, ...]  # the text sources searched
    terms: set[str]
    matches: list[Match] = field(default_factory=list)
    ranks: dict[int, int] = field(default_factory=dict)  # row -> 1-based text rank (ties shared)
    shares: dict[int, float] = field(default_factory=dict)  # row -> BM25 / the best BM25
    by_row: dict[int, Match] = field(default_factory=dict)  # row -> its best line
    held: tuple[str, ...] = ()  # the searched sources the index holds lines of
    # row -> its rank by DiCoSA among the candidates (competition ranks; made on first need)
    picture_ranks: dict[int, int] | None = field(default=None, repr=False)

    @property
    def text(self) -> bool:
        return bool(self.sources)

    def take(self, found: list[Match], store: FrameStore) -> None:
        """Its matches, text ranks and shares from ``found``, the best line of each matching
        row of ``store`` (removed rows left out): BM25 times the part of the line the row
        holds (:func:`~dicosa.text.lines.held`: a segment that holds a cue's last 0.3 s
        ranks below the one holding the rest)."""
        live = store.is_live(np.array([m.row for m in found], np.int64))
        self.matches = [m for m, ok in zip(found, live, strict=True) if ok][:TEXT_RANKED]
        rows = np.array([m.row for m in self.matches], np.int64)
        spans = store.videos.spans(rows)  # [n, 2]
        scores = np.array([m.score for m in self.matches]) * held(
            np.array([m.start for m in self.matches]),
            np.array([m.end for m in self.matches]), spans[:, 0], spans[:, 1])
        ranks = competition_ranks(scores)
        best = scores.max(initial=0.0)
        self.ranks = {int(r): int(k) for r, k in zip(rows, ranks, strict=True)}
        self.shares = {int(r): float(v / best) if best > 0 else 1.0
                       for r, v in zip(rows, scores, strict=True)}
        self.by_row = {m.row: m for m in self.matches}

    def fused(self, ids: np.ndarray, scores, k: float, weight: float) -> np.ndarray | None:
        """The scores ``[C]`` of candidates ``ids [C]`` (-1: padding) fused with this ranking
        (:func:`~dicosa.text.rrf.fuse`); None where the query looks at no text, or looks at
        the pictures too and matches none of the candidates (their scores stay)."""
        if not self.text:
            return None
        text_rank = np.array([self.ranks.get(int(i), 0) if i >= 0 else 0 for i in ids],
                             dtype=np.int64)
        if self.visual and not text_rank.any():
            return None
        share = np.array([self.shares.get(int(i), 0.0) for i in ids])
        visual = np.where(ids >= 0, scores.double().numpy(), -np.inf)
        return fuse(visual, text_rank, share, use_visual=self.visual, k=k, weight=weight)

    def decides(self, row: int, result: SearchResult, k: float, weight: float) -> bool:
        """Whether row ``row``'s matched line decided its place in ``result``: the search
        ranks by words alone, or the line's term of the fused score is at least the
        pictures' (``w * s / s_best / (k + r_text)`` against ``1 / (k + r_visual)``,
        ``r_visual`` the row's rank by DiCoSA among the candidates, made once per search)."""
        if not self.visual:
            return True
        if self.picture_ranks is None:
            dicosa = np.where(result.ids >= 0, result.dicosa.double().numpy(), -np.inf)
            self.picture_ranks = dict(zip(result.ids.tolist(),
                                          competition_ranks(dicosa).tolist(), strict=True))
        rank = self.picture_ranks.get(row, 0)
        picture = 1.0 / (k + rank) if rank > 0 else 0.0
        return weight * self.shares[row] / (k + self.ranks[row]) >= picture

    def said(self, found: Match) -> dict:
        """A matched line as answers give it: a snippet of its text around the query's
        words (at most :data:`~dicosa.text.query.SNIPPET_CHARS`), its time, source, BM25,
        row, the row's text rank and the query's words in it (stop words never among
        them)."""
        words = sorted(set(words_of(found.text)) & self.terms)
        return {"text": snippet(found.text, words), "start": found.start, "end": found.end,
                "source": found.source, "bm25": found.score, "row": found.row,
                "text_rank": self.ranks.get(found.row), "words": words}


def ranking_of(result: SearchResult) -> TextRanking | None:
    rankings = result.encoded.extra.get("text")
    return rankings[result.position] if rankings else None


def ranked_by(result: SearchResult) -> dict:
    """What ranked a search's hits: ``{"by": "pictures" | "words" | "pictures and words",
    "sources": the text sources searched that the index holds lines of}``. Words count
    where a candidate matched a line (a query that matched none keeps DiCoSA's scores); a
    search of words alone is ranked by them even where nothing matched (it has no hits)."""
    ranking = ranking_of(result)
    if ranking is None or not ranking.text:
        return dict(PICTURES)
    sources = list(ranking.held)
    if not ranking.visual:
        return {"by": "words", "sources": sources or list(ranking.sources)}
    matched = any(int(row) in ranking.ranks for row in result.ids.tolist() if row >= 0)
    return {"by": "pictures and words" if matched else "pictures", "sources": sources}


def line_text(line: dict) -> str:
    """A matched line for a person: ``speech 0:03.0-0:05.2 "the [secret] number"`` (the
    line's ``words``, as :func:`~dicosa.text.query.words_of` gives them, in brackets)."""
    wanted = set(line["words"])
    marked = _TOKEN.sub(lambda m: f"[{m.group(0)}]"
                        if words_of(m.group(0)) and words_of(m.group(0))[0] in wanted
                        else m.group(0), line["text"])
    return f"{line['source']} {_clock(line['start'])}-{_clock(line['end'])} \"{marked}\""


def _clock(seconds: float) -> str:
    minutes, rest = divmod(max(0.0, seconds), 60)
    return f"{int(minutes)}:{rest:04.1f}"
