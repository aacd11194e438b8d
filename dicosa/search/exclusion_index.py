"""Exclusion queries on a :class:`~dicosa.index.VideoIndex`: attach a concepts head.

:func:`attach_exclusion` gives an index what :class:`~dicosa.search.exclusion.ExclusionRerank`
needs and registers it:

- the head's code of every row (:class:`ConceptCodes`), computed from the store's frames in
  chunks and kept in the index folder as ``concepts.codes.npy`` (+ ``concepts.codes.json``:
  which head made them; :class:`~dicosa.search.row_cache.RowCache`), so reopening the index
  reuses them. Row ids are never reused, so the codes
  are one array indexed by row id; rows added later get their codes the first time a search
  asks for them (lazily), and removed rows' codes are simply never read again;
- the per-frame check's frames, read from the store for the candidates only;
- the hook in ``index.hooks`` and its :meth:`~ExclusionRerank.prepare` in
  ``index.query_encoders``;
- the head's path in ``index.meta["concepts"]`` (and the manifest), so that
  ``python -m dicosa search`` reattaches it without ``--concepts``, with the settings that
  differ from :class:`~dicosa.search.exclusion.ExclusionConfig`'s defaults (the presence
  threshold chosen on validation, say), so that they need not be passed on every search.

:func:`explain_hits` then says, for each result of the last search, which concept dimensions
matched A and which of B's were empty (``python -m dicosa search ... --explain``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..heads.base import head_key, load_head
from ..model import VideoFeatures
from .exclusion import ExclusionConfig, ExclusionExplanation, ExclusionRerank, describe_dimensions
from .row_cache import RowCache
from .types import EncodedQueries

if TYPE_CHECKING:
    from ..heads.concepts import ConceptCodesHead
    from ..index import Hit, VideoIndex

__all__ = ["ConceptCodes", "IndexExclusion", "attach_exclusion", "explain_hits",
           "format_explanation", "recorded_config"]

log = logging.getLogger(__name__)

CODES = "concepts.codes"  # RowCache name: concepts.codes.npy + .json (which head made them)
CODES_FILE = f"{CODES}.npy"
_CHUNK = 256  # rows per head forward when computing codes


class ConceptCodes:
    """The head's code of every store row, ``ids [n] int64 -> [n, d]`` float32, filled lazily
    for rows the array does not cover yet and written back to the index folder."""

    def __init__(self, index: VideoIndex, head: ConceptCodesHead):
        self.index, self.head = index, head
        self.cache = RowCache(index.directory, CODES, head_key(head), head.config.dim)

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
        store, start = self.index.store, len(self.codes)
        todo = store.live()
        todo = todo[todo >= start]
        self.cache.extend(store.next_id, todo, self._encode)
        return len(todo)

    @torch.no_grad()
    def _encode(self, ids: np.ndarray) -> np.ndarray:
        parts = []
        for i in range(0, len(ids), _CHUNK):
            video = self.index.store.gather(ids[i:i + _CHUNK]).to(dtype=torch.float32)
            parts.append(self.head.encode_videos(video).cpu().numpy())  # the head is on CPU
        return np.concatenate(parts)


class IndexExclusion(ExclusionRerank):
    """:class:`ExclusionRerank` that remembers the queries and candidates of its last call,
    so that :func:`explain_hits` can take D_A and D_B from the same candidates."""

    last: tuple[EncodedQueries, np.ndarray] | None = None

    def __call__(self, queries: EncodedQueries, ids: np.ndarray, scores: Tensor) -> Tensor:
        self.last = (queries, np.asarray(ids))
        return super().__call__(queries, ids, scores)


def attach_exclusion(index: VideoIndex, head: str | os.PathLike | ConceptCodesHead,
                     config: ExclusionConfig | None = None) -> IndexExclusion:
    """Let ``index`` answer "A without B": codes for every row, the hook, its query encoder.

    Args:
        index: an index with a model attached.
        head: a concepts head file (checked against the index's model with
            :func:`~dicosa.heads.base.load_head`; its path is recorded in
            ``index.meta["concepts"]``, and the manifest in a folder) or a loaded head.
        config: K, t, C, the window and the presence threshold (the per-frame check is off
            while the threshold is infinite, the default). None: the settings the index
            recorded (:func:`recorded_config`); given with a head file, they are recorded.

    Returns:
        The registered hook (its :attr:`~IndexExclusion.last` call feeds :func:`explain_hits`).
    """
    model = index.model
    if model is None:
        raise RuntimeError("attach_exclusion needs an index with a model: "
                           "VideoIndex.load(directory, model)")
    path = None
    if isinstance(head, (str, os.PathLike)):
        path = str(Path(head).resolve())
        head = load_head(Path(path), model, kind="concepts")
    head = head.to("cpu").eval()
    codes = ConceptCodes(index, head)
    codes.update()
    dtype = next(model.parameters()).dtype

    def frames(ids: np.ndarray) -> VideoFeatures:
        return index.store.gather(np.asarray(ids)).to(index.device, dtype)

    config = config or recorded_config(index)
    rerank = IndexExclusion(config, head=head, video_codes=codes, model=model,
                            video_frames=frames)
    index.hooks.append(rerank)
    index.query_encoders.append(
        lambda encoded: rerank.prepare(encoded, model, _on(index.tokenizer, index.device)))
    _record(index, path, config)
    return rerank


def recorded_config(index: VideoIndex, **overrides) -> ExclusionConfig:
    """The exclusion settings ``index`` recorded (defaults where it recorded none), with
    ``overrides`` (``ExclusionConfig`` field names; unknown ones are one sentence) on top."""
    from ..config import dataclass_from_dict

    settings = (index.meta.get("concepts") or {}).get("settings") or {}
    return dataclass_from_dict(ExclusionConfig, {**settings, **overrides}, "exclusion.")


def _record(index: VideoIndex, path: str | None, config: ExclusionConfig) -> None:
    """Keep the head's file and the settings that are not the defaults in
    ``index.meta["concepts"]``; the manifest is written only when that changes (a search that
    reattaches the recorded head with the recorded settings writes nothing)."""
    default = asdict(ExclusionConfig())
    settings = {k: v for k, v in asdict(config).items() if v != default[k]}
    recorded = {"head": path, **({"settings": settings} if settings else {})}
    if path is not None:
        index.remember("concepts", recorded)


def _on(tokenizer, device):
    return lambda texts: tokenizer(texts).to(device)


def explain_hits(rerank: IndexExclusion, hits: list[Hit], q: int = 0) -> list[dict]:
    """For each hit of query ``q`` of the last search: the D_A \\ D_B dimensions it matched,
    the D_B dimensions empty in it (each named by its words) and B's best window score.
    Plain dicts (for JSON); empty when the query had no exclusion."""
    if rerank.last is None:
        raise ValueError("explain_hits explains the last search: search first")
    queries, ids = rerank.last
    if not queries.queries[q].exclude or not hits:
        return []
    candidates = ids[q][ids[q] >= 0]
    explained = rerank.explain(queries, q, candidates, np.array([h.id for h in hits]))
    return [_as_dict(e, rerank.head) for e in explained]


def _as_dict(e: ExclusionExplanation, head: ConceptCodesHead) -> dict:
    out = asdict(e)
    out["matched_words"] = describe_dimensions([d for d, _ in e.matched], head.dimension_words)
    out["excluded_empty_words"] = describe_dimensions(e.excluded_empty, head.dimension_words)
    return out


def format_explanation(explained: dict, limit: int = 3) -> str:
    """One readable line: ``matched A on 12 (red, circle); B empty on 7 (blue, square)``."""
    def some(items: list[str]) -> str:
        more = f" +{len(items) - limit}" if len(items) > limit else ""
        return "; ".join(items[:limit]) + more if items else "none"

    line = (f"matched A on {some(explained['matched_words'])}; "
            f"B empty on {some(explained['excluded_empty_words'])}")
    if explained["excluded_active"]:
        line += f"; B active on {len(explained['excluded_active'])} dim(s)"
    if explained["presence"] is not None:
        line += f"; B best window {explained['presence']:.3f}"
        line += " (demoted)" if explained["demoted"] else ""
    return line
