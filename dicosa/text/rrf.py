"""Fusing DiCoSA's ranking of the pictures with BM25's ranking of the words.

A search may look at the pictures (``visual``) and at the lines of any text source
(``subtitles``, ``speech``, ``screen``); :func:`parse_sources` reads the choice. The two
rankings are fused by weighted reciprocal-rank fusion (Cormack, Clarke and Büttcher, SIGIR
2009) whose text term is scaled by the row's BM25 over the query's best::

    fused(v) = 1 / (k + r_visual(v)) + w * (s(v) / s_best) / (k + r_text(v))

``r_visual`` is the row's rank among the candidates by the score the rerank produced,
``r_text`` its rank among the rows whose lines match (by its best line's BM25 ``s(v)``); a row
absent from a ranking gets nothing from it, and ties share the best rank. Ranks need no
calibration between the two scales; ``s / s_best`` keeps a row matching only a common word
from the text term of one matching a rare name. docs/text.md ("Fusion") says how ``k`` and
``w`` were chosen and what the fusion cannot do.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["ALL_SOURCES", "DEFAULT_RRF_K", "DEFAULT_TEXT_WEIGHT", "TEXT_SOURCES", "VISUAL",
           "competition_ranks", "fuse", "parse_sources"]

VISUAL = "visual"
TEXT_SOURCES = ("subtitles", "speech", "screen")
ALL_SOURCES = (VISUAL, *TEXT_SOURCES)
# Chosen on a validation collection (docs/text.md): every k with w >= 1 tied there, and the
# tie goes to RRF's published k = 60.
DEFAULT_RRF_K = 60.0
DEFAULT_TEXT_WEIGHT = 1.0


def parse_sources(source: str | Iterable[str] | None) -> frozenset[str]:
    """The sources a search looks at: None or ``"all"`` every one; ``"text"`` the three text
    sources; else names from :data:`ALL_SOURCES`, as a list or comma-separated.

    Raises:
        ValueError: an unknown name (one sentence).
    """
    if source is None:
        return frozenset(ALL_SOURCES)
    names = source.split(",") if isinstance(source, str) else list(source)
    out: set[str] = set()
    for name in (str(n).strip().lower() for n in names):
        if name == "all":
            out.update(ALL_SOURCES)
        elif name == "text":
            out.update(TEXT_SOURCES)
        elif name in ALL_SOURCES:
            out.add(name)
        else:
            raise ValueError(f"unknown source {name!r}: use {', '.join(ALL_SOURCES)}, text "
                             "(the three text sources) or all")
    if not out:
        raise ValueError("no source to search: use visual, subtitles, speech, screen, text "
                         "or all")
    return frozenset(out)


def competition_ranks(scores: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """1-based ranks of ``scores`` (higher is better), equal scores (within ``rtol``)
    sharing the best rank; 0 for scores that are not finite (not ranked)."""
    scores = np.asarray(scores, dtype=np.float64)
    ranks = np.zeros(len(scores), dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(scores))
    if not len(finite):
        return ranks
    values = scores[finite]
    order = np.argsort(-values, kind="stable")
    ordered = values[order]
    # a new rank starts where a score drops by more than the tolerance
    drops = np.r_[True, ordered[:-1] - ordered[1:] > rtol * np.maximum(1.0, np.abs(ordered[:-1]))]
    positions = np.arange(1, len(ordered) + 1)
    ranks[finite[order]] = np.maximum.accumulate(np.where(drops, positions, 0))
    return ranks


def fuse(visual: np.ndarray, text_rank: np.ndarray, text_share: np.ndarray, *,
         use_visual: bool, k: float, weight: float) -> np.ndarray:
    """Fused scores of candidates (module docstring): ``visual`` their scores (-inf where the
    row has none: padding, a row without frames), ``text_rank`` their 1-based text ranks (0:
    no matching line), ``text_share`` their BM25 over the query's best (0..1). Without
    ``use_visual`` the text term alone, -inf where none."""
    share = np.clip(np.nan_to_num(text_share), 0.0, 1.0)
    text = np.where(text_rank > 0, weight * share / (k + np.maximum(text_rank, 1)), 0.0)
    if not use_visual:
        return np.where(text_rank > 0, text, -np.inf)
    ranks = competition_ranks(visual)
    picture = np.where(ranks > 0, 1.0 / (k + np.maximum(ranks, 1)), 0.0)
    fused = picture + text
    return np.where(np.isfinite(visual) | (text_rank > 0), fused, -np.inf)
