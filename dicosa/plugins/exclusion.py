"""The exclusion plugin: answer "A without B" with a concepts head.

:class:`ExclusionPlugin` (``index.use(ExclusionPlugin(HEAD))``, or ``--concepts HEAD``)
gives an index what :class:`~dicosa.search.exclusion.ExclusionRerank` needs:

- the head's code of every row (:class:`RowCodes`), kept in the index folder as
  ``concepts.codes.npy`` (a :class:`~dicosa.search.row_cache.RowCache`: one array indexed by
  row id), rows added later coded the first time a search asks for them;
- the per-frame check's frames, read from the store for the candidates only;
- the rerank hook and its query encoder (:meth:`~ExclusionRerank.prepare`);
- its record (``meta["concepts"]``): the head's path and the settings that differ from
  :class:`~dicosa.search.exclusion.ExclusionConfig`'s defaults (the presence threshold chosen
  on validation, say), so that they need not be passed on every search.

:meth:`ExclusionPlugin.explain` says, for a hit, which concept dimensions matched A and which
of B's were empty; answers name it ``exclusion``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import Tensor

from ..heads.base import head_key
from ..index.plugins import IndexPlugin
from ..search.exclusion import ExclusionConfig, ExclusionRerank
from ..search.exclusion_explained import ExclusionExplanation, describe_evidence
from ..search.row_cache import RowCache
from ..search.store import FrameStore

if TYPE_CHECKING:
    from ..heads.concepts import ConceptCodesHead
    from ..index.searcher import Hit, SearchResult

__all__ = ["ExclusionPlugin", "RowCodes", "attach_exclusion", "explain_hits",
           "recorded_config"]

log = logging.getLogger(__name__)

CODES = "concepts.codes"  # RowCache name: concepts.codes.npy + .json (which head made them)
CODES_FILE = f"{CODES}.npy"
_CHUNK = 256  # rows per head forward when computing codes


class RowCodes:
    """The head's concept code of every store row, ``ids [n] int64 -> [n, d]`` float32,
    filled lazily for rows the array does not cover yet and written back to the index
    folder."""

    def __init__(self, store: FrameStore, directory: Path | None, head: ConceptCodesHead):
        self.store, self.head = store, head
        self.cache = RowCache(directory, CODES, head_key(head), head.config.dim)
        self._lock = threading.Lock()  # concurrent searches extend it once

    @property
    def codes(self) -> np.ndarray:
        return self.cache.array  # [rows covered, d]

    def __call__(self, ids: np.ndarray) -> Tensor:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and ids.max() >= len(self.codes):
            self.update()
        return torch.from_numpy(self.codes[ids])

    def update(self) -> int:
        """Compute the codes of rows added since the array was made; returns how many."""
        with self._lock:
            start = len(self.codes)
            todo = self.store.live()
            todo = todo[todo >= start]
            self.cache.extend(self.store.next_id, todo, self._encode)
            return len(todo)

    @torch.no_grad()
    def _encode(self, ids: np.ndarray) -> np.ndarray:
        parts = []
        for i in range(0, len(ids), _CHUNK):
            video = self.store.gather(ids[i:i + _CHUNK]).to(dtype=torch.float32)
            parts.append(self.head.encode_videos(video).cpu().numpy())  # the head is on CPU
        return np.concatenate(parts)


class ExclusionPlugin(IndexPlugin):
    """The concepts head at search time (:class:`~dicosa.index.plugins.IndexPlugin`).

    Args:
        head: a concepts head file or a loaded head (:class:`IndexPlugin`).
        config: K, t, C, the window and the presence threshold (the per-frame check is off
            while the threshold is infinite, the default). None: the settings the index
            recorded (:func:`recorded_config`), else the defaults.
    """

    key = "concepts"
    api_name = "exclusion"
    leaves_out = True
    how = ("a concepts head: add --concepts HEAD.pt (train one with 'dicosa heads train "
           "concepts')")
    derived: ClassVar[dict] = {CODES_FILE: np.load}
    head_kind = "concepts"
    head_option = "--concepts"

    def __init__(self, head: str | os.PathLike | ConceptCodesHead,
                 config: ExclusionConfig | None = None):
        super().__init__(head)
        self.config = config
        self.rerank: ExclusionRerank | None = None
        self._rows = 0

    @classmethod
    def restore(cls, record: dict, ctx) -> ExclusionPlugin:
        """The recorded head with the recorded settings."""
        return cls(cls.recorded_head(record), settings_config(record))

    @classmethod
    def from_options(cls, options: Mapping[str, object], record: dict | None
                     ) -> ExclusionPlugin | None:
        """``concepts`` (a head file) and ``exclusion_set`` (ExclusionConfig fields, on top
        of the recorded settings) replace the recorded exclusion."""
        head, settings = options.get("concepts"), options.get("exclusion_set") or {}
        if head is None and not settings:
            return None
        record = record or {}
        head = head or cls.recorded_head(record)
        if head is None:
            raise ValueError("--exclusion-set changes a concepts head's settings: add "
                             "--concepts HEAD.pt")
        return cls(head, settings_config(record, **settings) if settings else None)

    def attach(self, ctx) -> None:
        head = self.head.to("cpu").eval()
        codes = RowCodes(ctx.store, ctx.directory, head)
        codes.update()
        self.config = self.config or settings_config(ctx.meta.get("concepts") or {})
        self.rerank = ExclusionRerank(self.config, head=head, video_codes=codes,
                                      model=ctx.model, video_frames=ctx.frames)
        rerank = self.rerank
        ctx.add_hook(rerank)
        ctx.add_query_encoder(lambda encoded: rerank.prepare(
            encoded, ctx.model, lambda texts: ctx.tokenizer(texts).to(ctx.device)))
        self._rows = len(ctx.store)

    def record(self) -> dict | None:
        """The head's file and the settings that are not the defaults."""
        if self.path is None:
            return None
        default = asdict(ExclusionConfig())
        settings = {k: v for k, v in asdict(self.config).items() if v != default[k]}
        return {"head": self.path, **({"settings": settings} if settings else {})}

    def explain(self, result: SearchResult, i: int) -> dict | None:
        """The D_A \\ D_B dimensions hit ``i`` matched, the D_B dimensions empty in it (each
        named by its words) and B's best window score; None for a query without exclusion."""
        explained = explain_hits(self, result, [result.hits[i]])
        return explained[0] if explained else None

    def readable(self, said: dict, limit: int = 3) -> list[str]:
        """The evidence of B and what it cost (``demoted by 0.112: "a blue square" in frames
        2-3 ...`` or ``kept its place: ...``), then the concept dimensions (``matched A on 12
        (red, circle); B empty on 7 (blue, square)``)."""
        explained = said.get("explain")
        if explained is None:
            return []

        def some(named: list[dict]) -> str:
            items = [f"{d['dimension']} ({', '.join(d['words'])})" if d["words"]
                     else str(d["dimension"]) for d in named]
            more = f" +{len(items) - limit}" if len(items) > limit else ""
            return "; ".join(items[:limit]) + more if items else "none"

        line = explained["why"]
        if explained["matched_words"] or explained["excluded_empty_words"]:
            line += (f"; matched A on {some(explained['matched_words'])}; "
                     f"B empty on {some(explained['excluded_empty_words'])}")
        return [line]

    def describe(self) -> dict:
        return {"method": self.config.method if self.config is not None else None}

    def report(self, before: IndexPlugin | None) -> list[str]:
        return [f"concept codes of {self._rows} rows, for 'A without B' searches"]


def attach_exclusion(index, head: str | os.PathLike | ConceptCodesHead,
                     config: ExclusionConfig | None = None) -> ExclusionPlugin:
    """``index.use(ExclusionPlugin(head, config))``: codes for every row, the hook and its
    query encoder; a head file is recorded with the settings."""
    return index.use(ExclusionPlugin(head, config))


def recorded_config(index, **overrides) -> ExclusionConfig:
    """The exclusion settings ``index`` recorded (defaults where it recorded none), with
    ``overrides`` (``ExclusionConfig`` field names; unknown ones are one sentence) on top."""
    return settings_config(index.meta.get("concepts") or {}, **overrides)


def settings_config(record: dict, **overrides) -> ExclusionConfig:
    from ..config import dataclass_from_dict

    settings = record.get("settings") or {}
    return dataclass_from_dict(ExclusionConfig, {**settings, **overrides}, "exclusion.")


def explain_hits(plugin: ExclusionPlugin, result: SearchResult,
                 hits: list[Hit] | None = None) -> list[dict]:
    """For each hit (default: the result's): the D_A \\ D_B dimensions it matched, the D_B
    dimensions empty in it (each named by its words) and B's best window score, taken from
    the same candidates the search reranked. Plain dicts (for JSON); empty when the query
    had no exclusion."""
    hits = result.hits if hits is None else hits
    queries, q = result.encoded, result.position
    if not queries.queries[q].exclude or not hits:
        return []
    candidates = result.ids[result.ids >= 0]
    explained = plugin.rerank.explain(queries, q, candidates, np.array([h.row for h in hits]))
    return [_as_dict(e, plugin.head) for e in explained]


def _as_dict(e: ExclusionExplanation, head: ConceptCodesHead) -> dict:
    """An explanation as plain values, its evidence in words and each concept dimension as
    ``{"dimension", "words"}``."""
    def named(dims) -> list[dict]:
        return [{"dimension": int(d), "words": head.dimension_words(int(d))} for d in dims]

    return {**asdict(e), "why": describe_evidence(e),
            "matched_words": named(d for d, _ in e.matched),
            "excluded_empty_words": named(e.excluded_empty)}
