"""The lexical plugin: search an index by words with a VDR or Dense2Sparse head.

:class:`LexicalPlugin` (``index.use(LexicalPlugin(HEAD))``, or ``dicosa index
--head HEAD``) gives an index what word-level search needs:

- a :class:`~dicosa.search.sparse.SparseStage` holding each row's sparse word vector
  (``head.encode_videos`` of the stored frames), kept in the index folder as
  ``sparse-lexical.npz`` (+ ``lexical.json``: which head made it) and saved by the index
  with its other stages, so reopening the index reuses the vectors (the index keeps it in
  step with the store: :meth:`~dicosa.index.plugins.IndexContext.add_stage`);
- a query encoder: ``head.prepare(queries, "bow")`` in the ``"bow"`` search mode, the head's
  parametric query (``"lexical"``) otherwise;
- the search modes ``"lexical"`` (sparse stage only), ``"bow"`` (sparse stage, bag-of-words
  query) and ``"hybrid"`` (dense and sparse candidates united);
- its record (``meta["lexical"]``): the head's path and kind; with ``backend="seismic"``
  (:mod:`dicosa.search.seismic`, approximate, for large collections) also ``"sparse":
  {"backend", "options"}``, so it reopens the same backend. Both backends keep the same rows
  file, so switching reuses the stored vectors.

:func:`explain_words` splits each hit's sparse score into words; answers name it ``words``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from ..files import write_text_atomic
from ..heads.base import HeadMismatchError, head_key, load_head
from ..heads.lexical import LexicalHead, TokenStates, to_csr
from ..index.plugins import IndexPlugin
from ..index.searcher import SearchMode
from ..model import TextFeatures, VideoFeatures
from ..search.seismic import SeismicConfig, SeismicStage, import_seismic, seismic_config
from ..search.sparse import SparseIndexError, SparseStage
from ..search.types import EncodedQueries

if TYPE_CHECKING:
    from ..index.searcher import Hit, SearchResult

__all__ = ["SPARSE_BACKENDS", "LexicalPlugin", "attach_lexical", "check_sparse_backend",
           "explain_words"]

STAGE = "lexical"  # the SparseStage's name: its file is sparse-lexical.npz
INFO_FILE = "lexical.json"
SPARSE_BACKENDS = ("exact", "seismic")
_CHUNK = 256  # rows per head forward when computing video vectors

log = logging.getLogger(__name__)


class _HeadRecord:
    """Records, beside a sparse stage's files, which head made its vectors (``lexical.json``),
    so that only that head reuses them."""

    key = ""  # head_key of the head whose vectors the stage holds

    def save(self, directory: str | os.PathLike) -> None:
        info = Path(directory) / INFO_FILE
        # The key goes last: a crash between the writes leaves no key, so the vectors are
        # computed again rather than trusted as another head's.
        info.unlink(missing_ok=True)
        super().save(directory)
        write_text_atomic(info, json.dumps({"head": self.key, "rows": len(self)}, indent=1))


class LexicalStage(_HeadRecord, SparseStage):
    """The index's sparse stage on the exact inverted index."""


class LexicalSeismicStage(_HeadRecord, SeismicStage):
    """The index's sparse stage on seismic (approximate)."""


def check_sparse_backend(backend: str, options: dict | None = None) -> SeismicConfig | None:
    """The settings of sparse ``backend`` (None for exact), checked before any work: an
    unknown backend, an option the backend does not take, or seismic not installed is one
    sentence."""
    if backend not in SPARSE_BACKENDS:
        raise SparseIndexError(f"unknown sparse backend {backend!r}; known: "
                               f"{', '.join(SPARSE_BACKENDS)}")
    if backend == "exact":
        if options:
            raise SparseIndexError("the exact sparse backend takes no options (got "
                                   f"{', '.join(sorted(options))})")
        return None
    import_seismic()
    return seismic_config(options)


class LexicalPlugin(IndexPlugin):
    """The lexical head at search time (:class:`~dicosa.index.plugins.IndexPlugin`).

    Args:
        head: a lexical head file or a loaded head (:class:`IndexPlugin`).
        backend: the sparse stage's engine: ``"exact"`` (scipy CSR inverted index, the
            default) or ``"seismic"`` (approximate, ``pyseismic-lsr``; see
            :mod:`dicosa.search.seismic`). None: what the index recorded, else exact.
        options: seismic's settings (:class:`~dicosa.search.seismic.SeismicConfig` fields);
            None: what the index recorded, else the defaults.
    """

    key = "lexical"
    api_name = "words"
    modes: ClassVar[dict] = {
        "lexical": SearchMode((STAGE,), "the lexical head's query against the sparse stage"),
        "bow": SearchMode((STAGE,), "the query's own words (no network) against the sparse "
                          "stage"),
        "hybrid": SearchMode(("dense", STAGE), "dense and lexical candidates united")}
    how = "a lexical head: build it with 'dicosa index FOLDER --out INDEX --head HEAD.pt'"
    derived: ClassVar[dict] = {f"sparse-{STAGE}.npz": lambda p: np.load(p).files}
    head_option = "--head"

    def __init__(self, head: str | os.PathLike | LexicalHead, backend: str | None = None,
                 options: dict | SeismicConfig | None = None):
        super().__init__(head)
        self.backend, self.options = backend, options
        self.stage: LexicalStage | LexicalSeismicStage | None = None
        self.config: SeismicConfig | None = None
        self._ctx = None

    @classmethod
    def restore(cls, record: dict, ctx) -> LexicalPlugin:
        sparse = record.get("sparse") or {}
        return cls(cls.recorded_head(record), sparse.get("backend"), sparse.get("options"))

    @classmethod
    def from_options(cls, options: Mapping[str, object], record: dict | None
                     ) -> LexicalPlugin | None:
        """``head`` (a head file) replaces the recorded one, on the sparse backend
        ``sparse_backend`` with ``sparse_option`` (a dict) or the recorded one; a backend or
        its options without a head, an unknown backend or seismic not installed are one
        sentence."""
        backend, settings = options.get("sparse_backend"), options.get("sparse_option") or None
        if options.get("head") is None:
            if backend or settings:
                raise SparseIndexError("--sparse-backend and --sparse-option set up the sparse "
                                       "stage of a lexical head: add --head HEAD.pt")
            return None
        if backend or settings:
            check_sparse_backend(backend or "exact", settings)
        return cls(options["head"], backend, settings)

    def read_head(self, model) -> LexicalHead:
        """A VDR (``lexical``) or Dense2Sparse (``d2s``) head file, checked against ``model``."""
        head = load_head(Path(self.path), model)
        if not isinstance(head, LexicalHead):
            raise HeadMismatchError(f"{self.path} holds a '{head.kind}' head, not a lexical one "
                                    "(train one with 'dicosa heads train lexical' or d2s)")
        return head

    def attach(self, ctx) -> None:
        stored = (ctx.meta.get("lexical") or {}).get("sparse") or {}
        backend = self.backend or stored.get("backend", "exact")
        options = (stored.get("options") if self.options is None
                   and backend == stored.get("backend") else self.options)
        self.config = check_sparse_backend(backend, options)
        head = self.head.to("cpu").eval()
        self.head, self._ctx = head, ctx
        stage, held = _open_stage(ctx.directory, head, self.config)
        ctx.add_stage(stage, videos=lambda ids, video: video_vectors(head, video), indexed=held)
        ctx.add_query_encoder(lambda encoded: _encode_queries(ctx, head, encoded))
        ctx.add_modes(default="hybrid", **self.modes)
        self.stage = stage
        # Only what changed is written: reattaching the recorded head writes nothing. A
        # switch of backend saves, so that the files of the one left behind are removed.
        switched = stage.backend != stored.get("backend", "exact")
        if ctx.directory is not None and (held is None or switched
                                          or not np.array_equal(np.sort(held),
                                                                np.sort(stage.ids))
                                          or getattr(stage, "unsaved", False)):
            stage.save(ctx.directory)

    def record(self) -> dict | None:
        if self.path is None:
            return None
        recorded = {"head": self.path, "kind": self.head.kind}
        if self.config is not None:
            recorded["sparse"] = {"backend": self.stage.backend, "options": asdict(self.config)}
        return recorded

    def explain(self, result: SearchResult, i: int) -> dict | None:
        """The words hit ``i`` shares with the query and what each adds to its sparse score
        (they sum to it), in the query the search's mode used."""
        return explain_words(self, result, [result.hits[i]])[0]

    def readable(self, said: dict, limit: int = 5) -> list[str]:
        """``words red 0.412, square 0.201 (+1) = sparse 0.650``."""
        explained = said.get("explain")
        if explained is None:
            return []
        words = list(explained["words"].items())
        more = f" (+{len(words) - limit})" if len(words) > limit else ""
        shown = ", ".join(f"{w} {c:.3f}" for w, c in words[:limit]) or "none shared"
        return [f"words {shown}{more} = sparse {explained['sparse_score']:.3f}"]

    def describe(self) -> dict:
        return {"head": self.head.kind, "backend": self.stage.backend,
                "words": len(self.head.words)}

    def report(self, before: IndexPlugin | None) -> list[str]:
        backend = "" if self.stage.backend == "exact" else f" ({self.stage.backend})"
        return [f"sparse {self.head.kind} stage{backend}: {len(self.stage)} videos, "
                f"{len(self.head.words)} words"]


def attach_lexical(index, head: str | os.PathLike | LexicalHead, backend: str | None = None,
                   options: dict | SeismicConfig | None = None) -> LexicalPlugin:
    """``index.use(LexicalPlugin(head, backend, options))``: the sparse stage, its query
    encoder and the lexical/bow/hybrid search modes; a head file is recorded."""
    return index.use(LexicalPlugin(head, backend, options))


def _open_stage(folder: Path | None, head: LexicalHead, config: SeismicConfig | None
                ) -> tuple[LexicalStage | LexicalSeismicStage, np.ndarray | None]:
    """The stage this head stored in the index folder (in ``config``'s backend: seismic, or
    exact for None), with the rows it holds; else a new, empty one (None: it holds nothing
    yet)."""
    key = head_key(head)
    kind, settings = (LexicalStage, ()) if config is None else (LexicalSeismicStage, (config,))
    stage, held = kind(head.words, STAGE, *settings), None
    if folder is not None and _stored_key(folder) == key:
        try:
            stage = kind.load(folder, STAGE, *settings)
            held = stage.ids
        except (FileNotFoundError, SparseIndexError) as exc:
            log.warning("computing the lexical vectors again: %s", exc)
    stage.key = key
    return stage, held


def _stored_key(folder: Path) -> str | None:
    info = folder / INFO_FILE
    return json.loads(info.read_text()).get("head") if info.is_file() else None


@torch.no_grad()
def video_vectors(head: LexicalHead, video: VideoFeatures) -> sp.csr_matrix:
    """The head's sparse vectors ``[n, |V|]`` of stored features (float16 ``[n, N, D]``),
    ``_CHUNK`` rows per forward (the head runs on the CPU in float32)."""
    parts = [to_csr(head.encode_videos(video[i:i + _CHUNK].to("cpu", torch.float32)))
             for i in range(0, len(video), _CHUNK)]
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, len(head.words)))


@torch.no_grad()
def _encode_queries(ctx, head: LexicalHead, encoded: EncodedQueries) -> None:
    """Fill ``encoded.extra["lexical"]`` for the search mode in ``extra["mode"]``."""
    mode = encoded.extra.get("mode")
    if mode == "dense":
        return  # the sparse stage is not searched
    query = "bow" if mode == "bow" else "lexical"
    # The head runs on the CPU: a CPU view of the queries shares the same extra dict.
    view = EncodedQueries(encoded.queries, TextFeatures(encoded.text.text.float().cpu()),
                          encoded.extra)
    if query == "lexical" and getattr(head.config, "text_states", "eot") == "tokens":
        view.extra["token_states"] = _token_states(ctx, [q.text for q in encoded.queries])
    head.prepare(view, query)


def _token_states(ctx, texts: list[str]) -> TokenStates:
    """Every token's state for a VDR head that reads them (``text_states=tokens``)."""
    from ..clip import encode_text_token_states

    tokens = ctx.tokenizer(texts).to(ctx.device)
    _, states, valid = encode_text_token_states(ctx.model.clip, tokens)
    return TokenStates(states.float().cpu(), valid.cpu())


def explain_words(plugin: LexicalPlugin, result: SearchResult, hits: list[Hit] | None = None
                  ) -> list[dict]:
    """For each hit (default: the result's): ``{"sparse_score", "words": {word:
    contribution}}``, the words the query and the video share, largest first, summing to
    ``sparse_score``, the sparse stage's score of the pair (in the search mode's query:
    ``"bow"`` the query's words, else the head's parametric query).
    The query's sparse vector is the one the search computed, or made now from the encoded
    query (no text tower run) when the search did not need it."""
    hits = result.hits if hits is None else hits
    if not hits:
        return []
    query_vector = torch.from_numpy(_query_vector(plugin, result))  # [|V|]
    videos = plugin.stage.vectors(np.array([h.row for h in hits])).toarray()  # [H, |V|]
    return [{"sparse_score": float(query_vector @ video),
             "words": plugin.head.explain(query_vector, video)}
            for video in torch.from_numpy(videos)]


def _query_vector(plugin: LexicalPlugin, result: SearchResult) -> np.ndarray:
    encoded = result.encoded
    if result.mode == "dense" or "lexical" not in encoded.extra:
        mode = "bow" if result.mode == "bow" else "lexical"
        one = EncodedQueries([encoded.queries[result.position]],
                             TextFeatures(encoded.text.text[result.position:result.position + 1]),
                             {"mode": mode})
        _encode_queries(plugin._ctx, plugin.head, one)
        return one.extra["lexical"].toarray()[0]
    return encoded.extra["lexical"][result.position].toarray()[0]
