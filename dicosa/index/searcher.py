"""The query path: encode once → first stage(s) → C candidates → DiCoSA rerank → hooks →
videos → top-k (docs/architecture.md walks it).

:class:`Searcher` runs one batch of queries over a :class:`SearchParts` snapshot and returns
one :class:`SearchResult` per query, which keeps what the search computed (the encoded
queries, the candidates and their scores) so that explanations and timelines reuse it. It
keeps nothing between calls: concurrent searches share no mutable state.

A query is text, or a vector in the text tower's space (a video's dense proxy asks "more like
this"). A vector has no words: no query encoder or rerank hook reads it, only the dense stage
proposes for it, and DiCoSA alone ranks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..data.protocol import FrameProtocol
from ..integers import as_int
from ..model import DiCoSA, TextFeatures
from ..search.moment import Moment, Timeline, video_timelines
from ..search.query import Query, QueryError, parse_query
from ..search.query_text import QueryText
from ..search.rerank import QuantisedVideo, pair_scores
from ..search.store import FrameStore
from ..search.types import Candidates, EncodedQueries, RerankHook
from .hits import MOMENTS_PER_HIT, Hit, top_hits, top_moments
from .stages import Registered, StageSet

__all__ = ["DEFAULT_CANDIDATES", "MOMENTS_PER_HIT", "Hit", "SearchMode", "SearchParts",
           "SearchResult", "Searcher", "check_search"]

log = logging.getLogger(__name__)

DEFAULT_CANDIDATES = 1000
# The rerank's frames per forward, [chunk, N, D] float32: each block is one read of the store
# (whose cost is partly per shard touched), small enough for the CPU's caches to keep it
# between Eq. 1's two reads.
_RERANK_BLOCK_BYTES = 16 << 20
_MIN_PAIRS_PER_CHUNK = 64


@dataclass(frozen=True)
class SearchMode:
    """A named choice of first stages for a search (``mode=``).

    A search in this mode unites the candidates of the registered stages named in ``stages``
    and of every stage that no mode names (a fusion stage that finds text-only rows stays on
    in every mode). The query encoders read the mode's name in ``EncodedQueries.extra["mode"]``
    (a lexical head encodes its query as bag of words in ``"bow"``, with the network otherwise).
    """

    stages: tuple[str, ...]  # FirstStage.name of the stages this mode searches
    help: str = ""


@dataclass(frozen=True)
class SearchParts:
    """What a search reads of an index, taken at one moment (:meth:`VideoIndex.snapshot`):
    the hooks, encoders and modes as they were then, so that a plugin attached later changes
    no search that already holds these parts."""

    model: DiCoSA
    device: torch.device
    store: FrameStore
    stages: StageSet
    modes: Mapping[str, SearchMode]
    hooks: tuple[RerankHook, ...]
    encoders: tuple[Callable[[EncodedQueries], None], ...]  # run in order on each batch
    explainers: Mapping[str, Callable]  # a plugin's key -> its explain(result, i)
    frames: FrameProtocol  # how the index decoded (a timeline's frame times)
    text: QueryText  # the text tower and its cache


@dataclass
class SearchResult:
    """One query's answer and what the search computed for it."""

    query: str  # the text ("" for a query given as a vector)
    hits: list[Hit]
    times: dict[str, float]  # seconds: encode_s, first_stage_s, rerank_s, hooks_s, top_s
    #                          (and what encoders timed apart, e.g. words_s)
    stage: str  # "exhaustive", "all", or the first stage(s) that proposed ("first stage")
    mode: str | None
    candidates: int  # rows reranked
    truncated: bool  # the query had more tokens than the model reads (max_words)
    encoded: EncodedQueries  # the batch this query was encoded in
    position: int  # this query's row in ``encoded``
    ids: np.ndarray  # int64 [C] this query's candidates (-1 pads)
    dicosa: Tensor  # float32 [C] DiCoSA's S of each candidate (-inf at pads)
    explainers: Mapping[str, Callable[[SearchResult, int], dict | None]] = field(
        default_factory=dict, repr=False)
    scores: Tensor | None = None  # float32 [C] the ranking score of each candidate (hooks)
    searcher: Searcher | None = field(default=None, repr=False)  # what made it

    def timelines(self, hits: Sequence[int], max_rows: int | None = None
                  ) -> list[Timeline | None]:
        """Hits ``hits``' relevance over their whole videos, frame by frame
        (:func:`dicosa.search.moment.video_timelines`), the rerank's scores reused for the
        rows it scored. ``max_rows``: a video of more rows is scored on that many, the hit's
        best row and moments' rows among them (None: every row)."""
        if not len(hits):
            return []
        picked = [self.hits[i] for i in hits]
        keep = [np.array([h.row, *(m.row for m in h.moments)], np.int64) for h in picked]
        text = self.encoded.text.text[self.position:self.position + 1]
        searcher = self._searcher()
        return video_timelines(searcher.model, searcher.store, searcher.parts.frames, text,
                               [h.id for h in picked], max_rows, keep,
                               (self.ids, self.dicosa.numpy()))

    def top_moments(self, k: int, join: float | None = None) -> list[tuple[str, int, Moment]]:
        """The ``k`` best moments among the candidates, best first, as ``(path, video id,
        moment)``: several may come from one video, never two that overlap. ``join``: as
        :func:`~dicosa.search.moment.best_moments` takes it (None: its default)."""
        scores = self.dicosa if self.scores is None else self.scores
        return top_moments(self._searcher().store, self.ids, scores.numpy(), k, join)

    def _searcher(self) -> Searcher:
        if self.searcher is None:
            raise RuntimeError("this result was made without the index's parts")
        return self.searcher

    def explain(self, i: int) -> dict:
        """Why hit ``i`` ranks where it does: one entry per attached plugin that has
        something to say (e.g. ``"words"``, ``"exclusion"``, ``"fusion"``)."""
        return {key: said for key, explain in self.explainers.items()
                if (said := explain(self, i)) is not None}

    def as_dict(self) -> dict:
        return {"query": self.query, "mode": self.mode, "stage": self.stage,
                "candidates": self.candidates, "truncated": self.truncated,
                "times": self.times, "hits": [h.as_dict() for h in self.hits]}


class Searcher:
    """The query path over one :class:`SearchParts` (see the module docstring)."""

    def __init__(self, parts: SearchParts):
        self.parts = parts
        self.model, self.device, self.store = parts.model, parts.device, parts.store
        self.stages = parts.stages

    # -- encode ---------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], exclude: Sequence[str] = (),
               mode: str | None = None) -> tuple[EncodedQueries, list[bool]]:
        """Parse ("A without B"; ``exclude`` adds exclusions to every query), encode the
        positive text once, run the query encoders; and which queries were cut short."""
        if mode is not None and mode not in self.parts.modes:
            raise QueryError(f"this index has no '{mode}' search mode (it has "
                             f"{', '.join(self.parts.modes)}); lexical, bow and hybrid need "
                             "a lexical head: index.use(LexicalPlugin(HEAD)), or 'dicosa "
                             "index' with --head HEAD.pt")
        queries = [parse_query(t, exclude) for t in texts]
        vectors, cut = self.parts.text.encode([q.text for q in queries])
        encoded = EncodedQueries(queries, TextFeatures(vectors), {"mode": mode})
        for encoder in self.parts.encoders:
            encoder(encoded)
        return encoded, cut

    # -- the whole path -------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, queries: Sequence[str] | Tensor, k: int, candidates: int | None, *,
            exclude: Sequence[str] = (), mode: str | None = None, chunk: int = 1024,
            skip_videos: Sequence[int] = ()) -> list[SearchResult]:
        """One :class:`SearchResult` per query: texts, or vectors ``[Q, D]`` (module
        docstring); ``skip_videos``: videos whose rows are never candidates (a "more like
        this" seed)."""
        clock = _Clock()
        texts, encoded, cut, hooks = self._asked(queries, exclude, mode)
        clock.lap("encode_s")
        # an encoder that searched on its own (the text plugin's words) says how long
        for name, seconds in encoded.extra.get("encoder_times", {}).items():
            clock.times[name] = seconds
            clock.times["encode_s"] -= seconds
        if candidates is not None:
            candidates = max(candidates, k)  # fewer than k could not fill the answer
        ids, stage, stage_scores, by_stage = self.candidates(encoded, candidates, mode)
        clock.lap("first_stage_s")
        if isinstance(stage, str) and stage == "exhaustive":
            scores = self.exhaustive(encoded.text, ids[0], chunk).expand(len(texts), -1)
        else:
            scores = self.rerank(encoded, ids)
        ids, scores = self._without_videos(ids, scores, skip_videos)
        clock.lap("rerank_s")
        scores = self._without_text_only(ids, _skip_non_finite(scores, ids))
        dicosa = scores.clone()
        for hook in hooks:
            scores = hook(encoded, ids, scores)
        clock.lap("hooks_s")
        hits = top_hits(self.store, scores, dicosa, ids, (stage, stage_scores, by_stage), k)
        clock.lap("top_s")
        label = stage if isinstance(stage, str) else "first stage"
        return [SearchResult(texts[q], hits[q], dict(clock.times), label, mode,
                             int((ids[q] >= 0).sum()), cut[q], encoded, q, ids[q], dicosa[q],
                             self.parts.explainers, scores[q], self)
                for q in range(len(texts))]

    def _asked(self, queries: Sequence[str] | Tensor, exclude: Sequence[str],
               mode: str | None) -> tuple[list[str], EncodedQueries, list[bool], tuple]:
        """``(texts, the encoded batch, which queries were cut short, the hooks to run)``:
        texts encoded (:meth:`encode`); vectors as given, with no words for an encoder or a
        hook to read (their texts empty)."""
        if not isinstance(queries, Tensor):
            texts = list(queries)
            encoded, cut = self.encode(texts, exclude, mode)
            if not self.parts.hooks and any(q.exclude for q in encoded.queries):
                log.warning("the query's exclusions (%s) are ignored: no exclusion hook is "
                            "attached to this index",
                            ", ".join(e for q in encoded.queries for e in q.exclude))
            return texts, encoded, cut, self.parts.hooks
        texts = [""] * len(queries)
        vectors = queries.to(self.device, next(self.model.parameters()).dtype)
        encoded = EncodedQueries([Query(t) for t in texts], TextFeatures(vectors),
                                 {"mode": mode, "vectors": True})
        return texts, encoded, [False] * len(texts), ()

    def _without_videos(self, ids: np.ndarray, scores: Tensor, videos: Sequence[int]
                        ) -> tuple[np.ndarray, Tensor]:
        """``ids [Q, C]`` and ``scores [Q, C]`` with the rows of ``videos`` as pads (-1,
        -inf)."""
        if not len(videos):
            return ids, scores
        found = ids >= 0
        theirs = np.zeros(ids.shape, dtype=bool)
        theirs[found] = np.isin(self.store.videos.of(ids[found]), videos)
        return (np.where(theirs, -1, ids),
                scores.masked_fill(torch.from_numpy(theirs), float("-inf")))

    # -- first stages ---------------------------------------------------------------------
    def searched(self, mode: str | None, vectors: bool = False) -> list[Registered]:
        """The stages a search in ``mode`` unites (see :class:`SearchMode`); for queries
        given as vectors, the dense stage alone."""
        stages = self.stages.all()
        if vectors:
            return [r for r in stages if r.dense]
        if mode is None:
            return stages
        named = {name for m in self.parts.modes.values() for name in m.stages}
        wanted = set(self.parts.modes[mode].stages)
        return [r for r in stages if r.stage.name in wanted or r.stage.name not in named]

    def candidates(self, encoded: EncodedQueries, candidates: int | None, mode: str | None):
        """``(ids [Q, C] int64 with -1 pads, stage: str or [Q, C] labels, the first listed
        stage's scores [Q, C], and {stage: score} per candidate [Q, C] where several stages
        searched)`` (the last three None or a label for every row reranked)."""
        stages = self.searched(mode, bool(encoded.extra.get("vectors")))
        # Reranking every row is what the dense stage would propose anyway once C covers the
        # index; a sparse stage alone proposes only rows sharing a word, so it still runs.
        covered = candidates is not None and candidates >= len(self.store) and (
            any(r.dense for r in stages))
        if candidates is None or covered or not stages:
            label = "exhaustive" if candidates is None else "all"
            live = self.store.live()  # only here: not read per two-stage query
            return np.broadcast_to(live, (len(encoded), len(live))), label, None, None
        dense = (EncodedQueries(encoded.queries, TextFeatures(self.stages.summary().queries(
            encoded.text.text)), encoded.extra) if any(r.dense for r in stages) else None)
        found = [r.stage.search(dense if r.dense else encoded, candidates) for r in stages]
        if len(found) == 1:
            ids = found[0].ids.copy()
            ids[~self.store.is_live(ids)] = -1  # a stage that lags never returns a removed row
            return ids, found[0].stage, found[0].scores, None
        return _union(found, self.store)

    # -- DiCoSA ---------------------------------------------------------------------------
    def rerank(self, encoded: EncodedQueries, ids: np.ndarray) -> Tensor:
        """DiCoSA S of each query with its candidates: ``[Q, C]`` float32, -inf at pads.

        An int8 store's candidates are read query by query in ascending row order (the
        store's fastest read) and handed over as kept (:class:`~dicosa.search.rerank.
        QuantisedVideo`); a float16 store's in blocks of ``_RERANK_BLOCK_BYTES`` (as
        float32), straight into the dtype the model computes in. The text side of each query
        is computed once per block (:func:`~dicosa.search.rerank.pair_scores` with
        ``pairs``)."""
        dtype = next(self.model.parameters()).dtype
        out = torch.full(ids.shape, float("-inf"))
        text = TextFeatures(encoded.text.text.to(self.device, dtype))
        for q in range(len(ids)):
            columns = np.flatnonzero(ids[q] >= 0)
            if not len(columns):
                continue
            columns = columns[np.argsort(ids[q, columns], kind="stable")]
            found = self.store.gather_codes(ids[q, columns])
            if found is None:  # float16 frames in some shard: the blocks below
                return self._rerank_float(text, ids, out, dtype)
            video = QuantisedVideo(*(torch.from_numpy(a).to(self.device) for a in found))
            pairs = torch.full((len(columns),), q, device=self.device)
            out[q, columns] = pair_scores(self.model, text, video, pairs=pairs).cpu()
        return out

    def _rerank_float(self, text: TextFeatures, ids: np.ndarray, out: Tensor,
                      dtype: torch.dtype) -> Tensor:
        query, column = np.nonzero(ids >= 0)
        per_pair = 4 * (self.store.num_frames or 1) * (self.store.dim or 1)
        step = max(_MIN_PAIRS_PER_CHUNK, _RERANK_BLOCK_BYTES // per_pair)
        for start in range(0, len(query), step):
            q, c = query[start:start + step], column[start:start + step]
            video = self.store.gather(ids[q, c], dtype).to(self.device)
            pairs = torch.from_numpy(q).to(self.device)
            out[q, c] = pair_scores(self.model, text, video, pairs=pairs).cpu()
        return out

    @torch.inference_mode()
    def exhaustive(self, text: TextFeatures, ids: np.ndarray, chunk: int) -> Tensor:
        """:meth:`DiCoSA.score` of ``text`` with rows ``ids``, ``chunk`` rows at a time."""
        dtype = next(self.model.parameters()).dtype
        out = [torch.zeros(len(text), 0)]
        for start in range(0, len(ids), chunk):
            video = self.store.gather(ids[start:start + chunk], dtype).to(self.device)
            out.append(self.model.score(text, video).float().cpu())
        return torch.cat(out, dim=1)

    def _without_text_only(self, ids: np.ndarray, scores: Tensor) -> Tensor:
        """DiCoSA cannot score a row without frames: -inf there (a fusion hook imputes it)."""
        flat = np.unique(ids[ids >= 0])
        if not len(flat):
            return scores
        # A text-only row is stored with no valid frame; the frame mask answers from the
        # memory map, far faster than the metadata's text_only column.
        flags = ~self.store.has_frames(flat)
        if not flags.any():
            return scores
        blank = np.isin(ids, flat[flags])
        return scores.masked_fill(torch.from_numpy(blank), float("-inf"))


def _skip_non_finite(scores: Tensor, ids: np.ndarray) -> Tensor:
    """A NaN score (damaged stored features) is a logged skip, never rank 1."""
    bad = torch.isnan(scores)
    if bad.any():
        rows = sorted({int(i) for i in ids[bad.numpy()]})
        log.warning("skipped %d candidate row(s) whose DiCoSA score is NaN (damaged stored "
                    "features; run 'dicosa check INDEX'): ids %s", len(rows),
                    rows[:10])
        scores = scores.masked_fill(bad, float("-inf"))
    return scores


def _union(found: list[Candidates], store: FrameStore):
    """United candidate lists of several stages: ids [Q, C], labels ("dense+lexical"), the
    first listed stage's score of each row and every proposing stage's ({stage: score})."""
    rows = []
    for q in range(len(found[0].ids)):
        merged: dict[int, dict[str, float]] = {}  # row id -> {stage: its score}, in order
        for cand in found:
            for i, s in zip(cand.ids[q].tolist(), cand.scores[q].tolist(), strict=True):
                if i >= 0:
                    merged.setdefault(i, {})[cand.stage] = s
        rows.append(merged)
    width = max(1, max(len(r) for r in rows))
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    labels = np.full((len(rows), width), "", dtype=object)
    scores = np.full((len(rows), width), -np.inf, dtype=np.float32)
    by_stage = np.full((len(rows), width), None, dtype=object)
    for q, merged in enumerate(rows):
        for c, (i, parts) in enumerate(merged.items()):
            ids[q, c], labels[q, c], by_stage[q, c] = i, "+".join(parts), parts
            scores[q, c] = next(iter(parts.values()))
    ids[~store.is_live(ids)] = -1
    return ids, labels, scores, by_stage


class _Clock:
    def __init__(self):
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = now - self._last
        self._last = now


def check_search(text: str | Sequence[str], k: int, candidates: int | None
                 ) -> tuple[int, int | None]:
    """Refuse what has no meaningful answer instead of ranking it anyway; ``(k,
    candidates)`` as Python ints (numpy's integers are whole numbers too)."""
    if isinstance(text, (bytes, bytearray)):
        raise QueryError("a query must be text (str), got bytes: decode them first "
                         "(query.decode('utf-8'))")
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise QueryError("no query was given")
    for t in texts:
        if not isinstance(t, str):
            raise QueryError(f"a query must be text (str), got {type(t).__name__}")
        if not t.strip():
            raise QueryError("the query is empty: give the text of what to find")
    count = as_int(k)
    if count is None or count < 1:
        raise QueryError(f"k must be a positive number of results, got {k!r}")
    if candidates is None:
        return count, None
    rows = as_int(candidates)
    if rows is None or rows < 1:
        raise QueryError(f"candidates must be a positive number of rows to rerank (or None "
                         f"for exhaustive search), got {candidates!r}")
    return count, rows
