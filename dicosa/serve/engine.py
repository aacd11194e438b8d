"""The service's view of one opened index: search, "more like this", moments, media files.

The routes (``app.py``) call only this module (docs/architecture.md walks a request through
it). An :class:`Engine` is a snapshot: nothing in it changes once it is open, and every request
passes its parameters along (no shared search settings), so any number of requests use one at
once; a grown collection is opened again as a new Engine and swapped in whole
(``service.Service``).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..data.datasets import VIDEO_EXTENSIONS
from ..index import Hit, SearchResult, VideoIndex, open_index
from ..index.plugins import how_to_get
from ..index.searcher import Searcher
from ..integers import as_int
from ..model import DiCoSA
from ..search.evidence import best_within, evidence_window
from ..search.query import Query, parse_query
from ..search.query_text import QueryText
from ..search.shards import populate_shards
from .errors import ServeError, UnknownMoment, UnknownVideo
from .machine import available_bytes
from .spec import TIMELINE_ROWS, EngineSpec

__all__ = ["MEDIA_TYPES", "Answer", "Engine", "Ranked", "SearchRequest", "VideoFile",
           "rank_requests"]

# the metadata a hit shows (_row_facts)
_FACTS = ("path", "title", "duration", "fps", "expected_duration", "damage")
TIMELINE_POINTS = 240  # frames a hit's timeline sends at most (a long video's are thinned)
# What <video> is told a file is; Chromium plays webm (VP8/VP9/AV1) and H.264 mp4.
MEDIA_TYPES = {".mp4": "video/mp4", ".m4v": "video/mp4", ".webm": "video/webm",
               ".mkv": "video/x-matroska", ".mov": "video/quicktime", ".avi": "video/x-msvideo",
               ".mpg": "video/mpeg", ".mpeg": "video/mpeg", ".3gp": "video/3gpp",
               ".ogv": "video/ogg"}


@dataclass(frozen=True)
class SearchRequest:
    """One search as the routes received it (already checked against the service's limits)."""

    text: str
    k: int = 10
    offset: int = 0
    candidates: int = 1000
    exclude: tuple[str, ...] = ()
    mode: str | None = None
    explain: bool = False
    # the plugins' search options as asked (the text plugin's source), as (name, value)
    options: tuple[tuple[str, object], ...] = ()

    @property
    def depth(self) -> int:
        """Hits to rank so that this page can be cut from them."""
        return self.offset + self.k


@dataclass
class Ranked:
    """One query's ranked hits before paging, with what the page needs from its search."""

    hits: list[Hit]
    reranked: int  # rows reranked
    times: dict[str, float]  # seconds per stage of the search it ran in
    stage: str
    result: SearchResult | None = None  # the search (None: none ran, the index is empty)
    batch: int = 1  # queries searched together with it
    worded: bool = True  # a query of words (False: "more like this", a video's vector)

    @classmethod
    def of(cls, result: SearchResult, batch: int, worded: bool = True) -> Ranked:
        return cls(result.hits, result.candidates, dict(result.times), result.stage, result,
                   batch, worded)


@dataclass(frozen=True)
class VideoFile:
    """A video the service may stream: its file checked to lie where its row says."""

    id: int
    path: Path
    media_type: str
    size: int
    mtime: float


@dataclass
class Answer:
    """A page of hits as the service answers it, and each hit's file to link to."""

    body: dict  # JSON: the query, the times, the hits (never a path)
    files: list[VideoFile | None]  # per hit; None: its file may not be served


class Engine:
    """One index with its model and plugins, searched by the service (see the module doc).

    Args:
        index: an index with its model attached and its plugins in ``index.plugins``
            (the engine asks them through ``index.annotations``).
        media_roots: folders whose videos may be streamed; empty: each video's own folder as
            its row names it (a file reached through a link to elsewhere is refused).
    """

    def __init__(self, index: VideoIndex, *,
                 media_roots: tuple[str | os.PathLike, ...] = (),
                 query_text: QueryText | None = None, timeline_rows: int = TIMELINE_ROWS):
        if index.model is None:
            raise ValueError("the service needs an index with its model attached")
        rows = as_int(timeline_rows)
        if rows is None or rows < 1:
            raise ValueError(f"a timeline scores at least 1 row of a video, got "
                             f"{timeline_rows!r}")
        if query_text is not None:  # a reopened snapshot keeps the tower and its cache
            index.query_text = query_text
        self.index = index
        self.parts = index.snapshot()  # what every search and page of this snapshot reads
        self.model: DiCoSA = index.model
        self.said = index.annotations  # what the plugins add to answers
        self.directory = index.directory
        self.media_roots = tuple(Path(r).resolve() for r in media_roots)
        self.default_mode = index.default_mode
        self.opened_at = datetime.datetime.now(datetime.timezone.utc)
        self.spec: EngineSpec | None = None  # what open() opened (None: made around an index)
        self.timeline_rows = rows  # the most rows of a video a hit's timeline scores
        if len(index):  # lazily made parts (the dense summary, codes) made now, not racing
            index.search("warm up", k=1)

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def open(cls, spec: EngineSpec | str | os.PathLike, *, model: DiCoSA | None = None,
             query_text: QueryText | None = None) -> Engine:
        """Open the index ``spec`` names (a folder alone: :class:`EngineSpec`'s defaults)
        with the model its manifest recorded (or ``model``: reopening after a change reuses
        the weights) and its recorded plugins, as ``spec`` says; queries are encoded by
        ``spec.text_tower`` (:mod:`dicosa.search.query_text`), or by ``query_text`` (a
        reopened snapshot's, with its cache)."""
        if not isinstance(spec, EngineSpec):
            spec = EngineSpec(spec)
        index = open_index(spec.index, model, device=spec.device, towers="text")
        if query_text is None:
            query_text = index.configure_queries(spec.text_tower, spec.query_cache)
        if spec.populate:
            populate_shards(index.store.shards, available_bytes() // 2)
        engine = cls(index, media_roots=spec.media_roots, query_text=query_text,
                     timeline_rows=spec.timeline_rows)
        engine.spec = spec
        return engine

    @property
    def populated(self) -> bool:
        """Whether the store was mapped in when this snapshot was opened (:meth:`open`)."""
        return self.spec is not None and self.spec.populate

    def reopen(self) -> Engine:
        """The same index opened again (another process may have added videos) as its spec
        says (one made around an index: its folder, media roots and timeline rows), with the
        same model, text tower and query cache."""
        spec = self.spec or EngineSpec(self.directory, media_roots=self.media_roots,
                                       timeline_rows=self.timeline_rows)
        return Engine.open(spec, model=self.model, query_text=self.index.query_text)

    def changed(self) -> bool:
        """Whether another writer committed since this snapshot was opened."""
        return self.index.writer.changed()

    def outdated(self) -> bool:
        """Whether another writer has committed and finished since this snapshot was opened:
        the manifest describes its dense first stage saved for exactly the rows of its store
        (a write in progress leaves it behind). Then :meth:`reopen` gets the new snapshot."""
        if not self.changed() or self.directory is None:
            return False
        try:
            manifest = json.loads((Path(self.directory) / "manifest.json").read_text())
        except (OSError, ValueError):
            return False
        stage = manifest.get("first_stage") or {}
        if stage.get("backend") is None:
            return True
        return stage.get("synced") == [manifest.get("next_id"), len(manifest.get("removed", []))]

    # -- facts ----------------------------------------------------------------------------
    def info(self) -> dict:
        index, config = self.index, self.model.config
        source = index.meta.get("model") or {}
        named = source.get("checkpoint") or source.get("config")
        return {
            "videos": len(index),
            "model": {"source": Path(named).name if named else None, "arch": config.arch,
                      "frames": config.num_frames, "dim": self.model.embed_dim,
                      "max_words": config.max_words},
            "plugins": self._plugins,
            "modes": {name: mode.help for name, mode in self.parts.modes.items()},
            "default_mode": self.default_mode,
            "backend": index.stages.spec.get("backend"),
            "summary": index.stages.spec.get("summary"),
            "frame_protocol": index.frames.as_dict(),
            "frame_dtype": index.store.frame_dtype,
            "timeline_rows": self.timeline_rows,
            "text": index.query_text.stats(),
            "frame_times": "from the frame protocol and each video's frame count and rate",
            "opened_at": self.opened_at.isoformat(timespec="seconds"),
        }

    @functools.cached_property
    def _plugins(self) -> dict:
        """What each plugin gives this index, by its API name; made once per snapshot."""
        return self.said.describe()

    # -- search ---------------------------------------------------------------------------
    def check(self, request: SearchRequest) -> Query:
        """The parsed query, or one sentence on why it cannot be searched here."""
        query = parse_query(request.text, request.exclude)
        self.index.check_request(request.exclude, request.mode, **dict(request.options))
        return query

    def rank(self, texts: list[str], *, depth: int, candidates: int,
             exclude: tuple[str, ...] = (), mode: str | None = None,
             options: tuple[tuple[str, object], ...] = ()) -> list[Ranked]:
        """The ``depth`` best hits of each text, searched together (one batch)."""
        mode = mode or self.default_mode
        if not len(self.index):
            return [Ranked([], 0, {}, "none") for _ in texts]
        results = self.index.query(list(texts), k=depth, candidates=max(candidates, depth),
                                   exclude=list(exclude), mode=mode, **dict(options))
        return [Ranked.of(result, len(texts)) for result in results]

    def answer(self, request: SearchRequest, ranked: Ranked) -> Answer:
        """The page ``[offset, offset + k)`` of ``ranked``: hits with their moments (and
        explanations when asked), and the time each step took."""
        started = time.perf_counter()
        page = ranked.hits[request.offset:request.depth]
        ids = np.array([h.id for h in page], dtype=np.int64)
        facts = self.parts.store.table.columns(ids, _FACTS)  # the one metadata read of the page
        rows = [{name: facts[name][i] for name in _FACTS} for i in range(len(ids))]
        result = ranked.result if ranked.worded else None  # what the plugins may speak of
        said = self._said(result, request.offset, page)
        found = self.timelines(ranked.result, range(request.offset, request.offset + len(page)),
                               [w for _, w in said])
        times = {**ranked.times, "moments_s": time.perf_counter() - started}
        explained = [{} for _ in page]
        if request.explain and ranked.result is not None and page:
            started = time.perf_counter()
            explained = [self.said.explain(ranked.result, request.offset + i)
                         for i in range(len(page))]
            times["explain_s"] = time.perf_counter() - started
        hits = [_hit(request.offset + i + 1, hit, row, moment, why, added)
                for i, (hit, row, moment, why, (added, _)) in enumerate(
                    zip(page, rows, found, explained, said, strict=True))]
        query = result.encoded.queries[result.position] if result is not None else None
        return Answer({
            "query": {"q": request.text, "exclude": list(request.exclude),
                      "text": query.text if query else None,
                      "without": list(query.exclude) if query else [],
                      "mode": request.mode or self.default_mode, "k": request.k,
                      "offset": request.offset, "candidates": request.candidates,
                      "explain": request.explain,
                      **{name: None for name in self.index.plugins.query_options},
                      **dict(request.options)},
            "videos": len(self.index),
            "reranked": ranked.reranked,
            "stage": ranked.stage,
            **self.said.answer(result),
            "truncated": bool(result is not None and result.truncated),
            "batch": ranked.batch,
            "more": len(ranked.hits) >= request.depth and ranked.reranked > request.depth,
            "times_ms": {key[:-2]: round(1000 * value, 3) for key, value in times.items()},
            "notes": self._notes(query),
            "hits": hits,
        }, [self._file(h.id, h.path) for h in page])

    def _said(self, result: SearchResult | None, offset: int, page: list[Hit]
              ) -> list[tuple[dict, tuple[str, tuple[float, float] | None]]]:
        """Per hit of the page: the keys the plugins add to it (the matched lines) and where
        its best frame is taken from: ``(by, a time range)``, a plugin's evidence (the line
        that decided it, within its best moment) or ``("pictures", its best moment)``
        (:mod:`dicosa.search.evidence`)."""
        out = []
        for i, hit in enumerate(page):
            by, line = self.said.evidence(result, offset + i)
            added = self.said.hit(result, offset + i) if result is not None else {}
            out.append((added, (by, evidence_window((hit.start, hit.end), line))))
        return out

    def search(self, request: SearchRequest) -> Answer:
        """:meth:`check`, :meth:`rank` alone and :meth:`answer`: one request, unbatched."""
        self.check(request)
        return self.answer(request, rank_requests(self, [request])[0])

    # -- more like this -------------------------------------------------------------------
    def similar(self, video_id: object, *, row: object = None, k: int = 10, offset: int = 0,
                candidates: int = 1000) -> Answer:
        """Videos like video ``video_id``, or like one of its moments (``row``, a row id its
        hit's ``moments`` name): the seed's dense proxy (a long video's: its rows' mean) is
        the query vector of a search that leaves the seed's own video out."""
        seed = self.live_id(video_id)
        store = self.parts.store
        rows = store.videos.rows(seed)
        if row is not None:
            number = _digits(row)
            if number is None:
                raise ServeError(f"row must be a row id (digits), got {row!r}")
            rows = rows[rows == number]
            if not len(rows):
                raise UnknownMoment(number, seed)
        depth = offset + k
        proxy = torch.from_numpy(store.proxies(rows).mean(0, keepdims=True))  # [1, D]
        result = Searcher(self.parts).run(proxy, depth, max(candidates, depth + 1),
                                          skip_videos=[seed])[0]
        like = f"more like video {seed}" + ("" if row is None else f" at row {int(rows[0])}")
        request = SearchRequest(like, k=k, offset=offset, candidates=candidates, mode="dense")
        answer = self.answer(request, Ranked.of(result, 1, worded=False))
        answer.body["query"].update(like=seed, like_row=None if row is None else int(rows[0]),
                                    q=None, mode=None)
        return answer

    # -- the moment -----------------------------------------------------------------------
    def timelines(self, result: SearchResult | None, hits: range,
                  shown: list[tuple[str, tuple[float, float] | None]]) -> list[dict | None]:
        """Hits ``hits`` of ``result`` drawn as timelines (:meth:`SearchResult.timelines` on at
        most ``timeline_rows`` rows of a video). ``shown``: per hit, what its best frame is
        taken from and the time range (:func:`~dicosa.search.evidence.best_within`), said in
        ``best.by``."""
        if result is None or not len(hits):
            return []
        out = []
        found = result.timelines(hits, self.timeline_rows)
        for timeline, (by, window) in zip(found, shown, strict=True):
            if timeline is None:
                out.append(None)
                continue
            drawn = best_within(timeline, window).as_dict(TIMELINE_POINTS)
            drawn["best"]["by"] = by
            out.append(drawn)
        return out

    def _notes(self, query: Query | None) -> list[str]:
        if query is not None and query.exclude and not self.index.plugins.leaves_out:
            return [f"'{', '.join(query.exclude)}' was not left out: that takes "
                    f"{how_to_get(lambda plugin: plugin.leaves_out)}"]
        return []

    # -- videos ---------------------------------------------------------------------------
    def live_id(self, video_id: object) -> int:
        """``video_id`` as a live video's id: digits only (no sign, no path), else
        UnknownVideo."""
        number = _digits(video_id)
        store = self.parts.store
        if number is None or not store.is_live(np.array([number]))[0] or store.videos.of(
                np.array([number]))[0] != number:  # a video is named by its first row
            raise UnknownVideo(video_id)
        return number

    def video(self, video_id: object) -> VideoFile:
        """The file of video ``video_id`` if it may be served: its row's path, resolved, a
        regular file with a video extension inside the media roots (class docstring)."""
        number = self.live_id(video_id)
        file = self._file(number, self.parts.store.table.paths(np.array([number]))[0])
        if file is None:
            raise UnknownVideo(video_id)
        return file

    def _file(self, number: int, path: str) -> VideoFile | None:
        recorded = Path(path)
        try:
            real = recorded.resolve(strict=True)
            roots = self.media_roots or (recorded.parent.resolve(),)
            if (not any(real.is_relative_to(root) for root in roots) or not real.is_file()
                    or real.suffix.lower() not in VIDEO_EXTENSIONS):
                return None
            stat = real.stat()
        except (OSError, RuntimeError):
            return None
        return VideoFile(number, real, MEDIA_TYPES.get(real.suffix.lower(),
                                                       "application/octet-stream"),
                         stat.st_size, stat.st_mtime)

    def details(self, video_id: object) -> dict:
        """A video's metadata, without its path."""
        number = self.live_id(video_id)
        row = self.parts.store.table.rows(np.array([number])).iloc[0]
        return {"id": number, **_row_facts(row)}


def rank_requests(engine: Engine, requests: list[SearchRequest]) -> list[Ranked]:
    """``requests`` ranked in one :meth:`Engine.rank` pass, deep enough for the deepest page;
    they share their mode, exclusions, options and candidate count (a batch: see
    :mod:`dicosa.serve.batching`), which the first one gives."""
    first = requests[0]
    return engine.rank([r.text for r in requests], depth=max(r.depth for r in requests),
                       candidates=max(first.candidates, first.depth), exclude=first.exclude,
                       mode=first.mode, options=first.options)


def _digits(value: object) -> int | None:
    """``value`` as an id when it is 1 to 18 ASCII digits (no sign, no path), else None."""
    text = str(value)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _row_facts(row: dict | pd.Series) -> dict:
    duration = _finite(row["duration"])
    title = row["title"] if isinstance(row["title"], str) else ""
    damage = row.get("damage")  # what a partial video's decode lost (None: it decoded whole)
    partial = ({"decoded": duration, "expected": _finite(row.get("expected_duration")),
                "damage": damage} if isinstance(damage, str) and damage else None)
    return {"name": Path(str(row["path"])).name, "title": title, "duration": duration,
            "fps": _finite(row["fps"]), "partial": partial}


def _finite(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return round(number, 4) if math.isfinite(number) else None


def _hit(rank: int, hit: Hit, row: dict, moment: dict | None, explained: dict,
         added: dict) -> dict:
    out = {"rank": rank, "id": hit.id, **_row_facts(row), "score": hit.score,
           "dicosa": hit.dicosa, "stage": hit.stage, "stage_score": hit.stage_score,
           "stage_scores": hit.stage_scores, "row": hit.row,
           "moments": [m.as_dict() for m in hit.moments], "moment": moment}
    if explained:
        out["explain"] = explained
    out.update(added)  # the plugins' keys (the text plugin's: the lines that matched)
    return out
