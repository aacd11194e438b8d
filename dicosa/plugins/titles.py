"""The titles plugin: DiCoSA fused with titles (late fusion) or a Mul2vec head.

:class:`TitlesPlugin` (``index.use(TitlesPlugin(HEAD or None))``, or ``search --mul2vec`` /
``--fusion``) gives an index the :class:`~dicosa.search.title_fusion.FusionRerank` hook over
its rows' fusion arrays and a first stage that finds text-only rows (a
:class:`~dicosa.search.title_fusion.SemanticStage` with a head, a
:class:`~dicosa.search.title_fusion.TitleStage` without one); see
:mod:`dicosa.search.title_fusion` for the score.

The titles' text vectors are encoded once and kept in the index folder
(``fusion.titles.npy``, float16, extended as rows arrive); the other arrays are recomputed on
each attach (a pass over the store's proxies and, with a head, one small MLP), and all of them
are held in RAM: fusion costs ~(D + K)·4 bytes per row of memory (2 GiB at 1M rows, D=512).

Its record (``meta["fusion"]``, the key indexes have always kept it under: ``{"head": path
or None, "beta_semantic", "beta_title", "trust"}``) is kept for a head file or no head (a head
object records nothing). Answers name its explanations ``fusion``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from ..index.plugins import IndexPlugin
from ..search.query import QueryError
from ..search.row_cache import RowCache
from ..search.title_fusion import (
    DEFAULT_BETA_SEMANTIC,
    DEFAULT_BETA_TITLE,
    DEFAULT_TRUST,
    FusionRerank,
    FusionRows,
    SemanticStage,
    TitleStage,
    fusion_rows,
)
from ..search.types import EncodedQueries

if TYPE_CHECKING:
    from ..index.searcher import Hit, SearchResult

__all__ = ["TITLES_FILE", "IndexFusion", "TitlesPlugin", "attach_titles", "explain_hits",
           "index_fusion_rows"]

# The titles' DiCoSA text vectors, kept in the index folder (float16) for the model that
# encoded them: the text tower runs once per title, not on every attach.
TITLES_FILE = "fusion.titles"
_TITLE_BATCH = 256
_WEIGHTS = ("beta_semantic", "beta_title", "trust")


class IndexFusion(FusionRerank):
    """:class:`FusionRerank` over an index's rows, extended with the rows added since (a
    first stage asks for them as they are added; the hook for the candidates it meets)."""

    def __init__(self, ctx, head=None, **weights: float):
        self.ctx = ctx
        self._lock = threading.Lock()  # concurrent searches extend the rows once
        super().__init__(index_fusion_rows(ctx, head), head, **weights)

    @property
    def rows(self) -> FusionRows:
        with self._lock:
            if self.ctx.store.next_id > len(self._rows):
                self._rows = self._rows.extend(index_fusion_rows(self.ctx, self.head,
                                                                 start=len(self._rows)))
            return self._rows

    @rows.setter
    def rows(self, rows: FusionRows) -> None:
        self._rows = rows


class TitlesPlugin(IndexPlugin):
    """Fused scoring at search time (:class:`~dicosa.index.plugins.IndexPlugin`).

    Args:
        head: a Mul2vec head, or the path of one (``heads train mul2vec``): Mul2vec fusion
            through a :class:`SemanticStage`. None: late fusion (title similarity) through a
            :class:`TitleStage`, the default where no head is trained.
        beta_semantic, beta_title: default :data:`DEFAULT_BETA_SEMANTIC` with a head (and no
            title term), :data:`DEFAULT_BETA_TITLE` without one.
        trust: how far a missing part follows the part a row has (default
            :data:`DEFAULT_TRUST`).
    """

    key = "fusion"
    api_name = "fusion"
    derived: ClassVar[dict] = {f"{TITLES_FILE}.npy": np.load,
                               "semantic.npz": lambda p: np.load(p).files,
                               "title.npz": lambda p: np.load(p).files}
    head_kind = "mul2vec"
    head_option = "--mul2vec"

    def __init__(self, head=None, *, beta_semantic: float | None = None,
                 beta_title: float | None = None, trust: float | None = None):
        super().__init__(head)
        self.late = head is None
        self.trust = DEFAULT_TRUST if trust is None else trust
        if self.late:
            self.beta_semantic = 0.0
            self.beta_title = DEFAULT_BETA_TITLE if beta_title is None else beta_title
        else:
            self.beta_semantic = (DEFAULT_BETA_SEMANTIC if beta_semantic is None
                                  else beta_semantic)
            self.beta_title = 0.0 if beta_title is None else beta_title
        self.hook: IndexFusion | None = None

    @classmethod
    def restore(cls, record: dict, ctx) -> TitlesPlugin:
        return cls(cls.recorded_head(record), **{name: record.get(name) for name in _WEIGHTS})

    @classmethod
    def from_options(cls, options: Mapping[str, object], record: dict | None
                     ) -> TitlesPlugin | bool | None:
        """``mul2vec`` (a head), ``fusion`` (late fusion) and the weights replace the
        recorded fusion (weights alone change the recorded one's; those not given are kept
        where the kind stays); ``no_fusion`` leaves it out."""
        head, late = options.get("mul2vec"), bool(options.get("fusion"))
        weights = {name: options.get(name) for name in _WEIGHTS}
        if options.get("no_fusion"):
            if head is not None or late:
                raise QueryError("--no-fusion searches without fusion: drop --mul2vec/--fusion, "
                                 "or --no-fusion")
            return False
        if head is None and not late:
            if record is None or all(w is None for w in weights.values()):
                return None  # nothing asked, or weights alone with nothing recorded to fuse
            head = cls.recorded_head(record)  # None: late fusion
        same_kind = record is not None and (record.get("head") is None) == (head is None)
        return cls(head, **{name: record.get(name) if value is None and same_kind else value
                            for name, value in weights.items()})

    def attach(self, ctx) -> None:
        hook = IndexFusion(ctx, self.head, beta_semantic=self.beta_semantic,
                           beta_title=self.beta_title, trust=self.trust)
        if self.head is not None:
            stage = SemanticStage(self.head, hook.rows.semantic.shape[1])
            ctx.add_stage(stage, videos=lambda ids, _: hook.rows.semantic[ids])
        else:
            stage = TitleStage(hook.rows.title_text.shape[1])
            ctx.add_stage(stage, videos=lambda ids, _: hook.rows.title_text[ids])
        ctx.add_hook(hook)
        self.hook = hook

    def record(self) -> dict | None:
        if not self.late and self.path is None:
            return None
        return {"head": self.path, "beta_semantic": self.beta_semantic,
                "beta_title": self.beta_title, "trust": self.trust}

    def explain(self, result: SearchResult, i: int) -> dict | None:
        return explain_hits(self.hook, result, [result.hits[i]])[0]

    def readable(self, said: dict) -> list[str]:
        """``fusion parts: dicosa 0.4123  title 0.1000*  fused 0.4450; frames lost 0.00``
        (unweighted parts; ``*`` an imputed one)."""
        parts = said.get("explain")
        if parts is None:
            return []
        cells = []
        for name in ("dicosa", "semantic", "title", "fused"):
            if name in parts:
                imputed = ((name == "dicosa" and parts["text_only"])
                           or (name == "title" and not parts["has_title"]))
                cells.append(f"{name} {parts[name]:.4f}{'*' if imputed else ''}")
        return [f"fusion parts: {'  '.join(cells)}; frames lost {parts['frames_lost']:.2f}"]

    def describe(self) -> dict:
        return {"kind": "late" if self.late else "mul2vec", "beta_semantic": self.beta_semantic,
                "beta_title": self.beta_title, "trust": self.trust}


def attach_titles(index, head=None, *, beta_semantic: float | None = None,
                  beta_title: float | None = None, trust: float | None = None
                  ) -> FusionRerank:
    """``index.use(TitlesPlugin(...))``; returns its hook. Rows added later join the fusion
    arrays when the first stage receives them (their titles encoded then)."""
    plugin = index.use(TitlesPlugin(head, beta_semantic=beta_semantic, beta_title=beta_title,
                                    trust=trust))
    return plugin.hook


@torch.no_grad()
def index_fusion_rows(ctx, head=None, start: int = 0) -> FusionRows:
    """:class:`FusionRows` of the row ids ``[start, next_id)`` of the index ``ctx`` lends
    (removed rows: untitled, text-only), the titles' text vectors from the index folder's
    cache (the missing ones encoded with the index's model)."""
    store = ctx.store
    end, dim = store.next_id, store.dim or ctx.model.embed_dim
    cache = RowCache(ctx.directory, TITLES_FILE, ctx.model_key, dim, np.float16)
    first = min(start, len(cache.array))  # the cache may need rows before start too
    live = store.live()
    live = live[live >= first]
    table = store.table.rows(live)
    title = [""] * (end - first)
    text_only = np.ones(end - first, dtype=bool)
    frames_lost = np.ones(end - first, dtype=np.float32)
    for i, t, only, lost in zip((live - first).tolist(), table["title"].tolist(),
                                table["text_only"].tolist(), table["frames_lost"].tolist(),
                                strict=True):
        title[i] = t if isinstance(t, str) else ""
        text_only[i] = _flag(only)
        frames_lost[i] = float(lost) if lost == lost and lost != "" else 0.0
    titled = np.array([i + first for i, t in enumerate(title) if t], dtype=np.int64)
    every = cache.extend(end, titled, lambda ids: _encode_titles(
        ctx, [title[i - first] for i in ids.tolist()]))
    live = live[live >= start]
    proxy = torch.zeros(end - start, dim)
    proxy[live - start] = torch.as_tensor(store.proxies(live))
    skip = start - first
    return fusion_rows(title[skip:], torch.from_numpy(every[start:end].astype(np.float32)),
                       proxy, text_only[skip:], frames_lost[skip:], head)


def _encode_titles(ctx, titles: list[str]) -> np.ndarray:
    """DiCoSA text vectors of ``titles`` ``[n, D]``, in batches of :data:`_TITLE_BATCH`."""
    parts = [ctx.encode_text(titles[start:start + _TITLE_BATCH]).text.float().cpu().numpy()
             for start in range(0, len(titles), _TITLE_BATCH)]
    return np.concatenate(parts)


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value) if value == value else False  # NaN (an empty cell): False


@torch.no_grad()
def explain_hits(hook: FusionRerank, result: SearchResult,
                 hits: list[Hit] | None = None) -> list[dict]:
    """The fused score's parts for each hit (default: the result's): one dict per hit
    ``{"dicosa", "semantic"?, "title"?, "fused", "text_only", "frames_lost", "has_title"}``
    (parts unweighted, missing ones imputed as in
    :func:`~dicosa.search.title_fusion.fused_scores`; computed over the listed hits, so the
    imputation's moments are those of these rows). Uses the search's encoded query."""
    hits = result.hits if hits is None else hits
    if not hits:
        return []
    q = result.position
    encoded = EncodedQueries([result.encoded.queries[q]],
                             type(result.encoded.text)(result.encoded.text.text[q:q + 1]), {})
    ids = np.array([[h.row for h in hits]], dtype=np.int64)
    dicosa = torch.tensor([[h.dicosa for h in hits]], dtype=torch.float32)
    parts, rows = hook.explain(encoded, ids, dicosa), hook.rows
    return [{**{name: float(value[0, c]) for name, value in parts.items()},
             "text_only": bool(rows.text_only[hit.row]),
             "frames_lost": float(rows.frames_lost[hit.row]),
             "has_title": bool(rows.has_title[hit.row])} for c, hit in enumerate(hits)]
