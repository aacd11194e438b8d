"""Fused scoring for incomplete entries: DiCoSA + β·(Mul2vec topic or title similarity).

Every indexed row may have a video (decodable frames, possibly with a fraction lost) and a
title. What the index stores per row for fusion (:class:`FusionRows`, built by
:func:`fusion_rows` when the row is added):

==============  ==============  =========================================================
array           shape / dtype   how it is computed
==============  ==============  =========================================================
``semantic``    [n, K] float32  Mul2vec's g (unit norm): the mean of the title view
                                f(title) and the video view f_v(proxy) weighted by
                                ``has_title`` and ``(1 - frames_lost)``
                                (:meth:`Mul2vecHead.entity_vectors`); absent without a head
``title_text``  [n, D] float32  DiCoSA's text vector of the title (unit norm), zeros where
                                there is none (late fusion; also what a text-only row
                                offers a dense first stage)
``title``       [n] str         the title as given ("" = none); metadata column
``text_only``   [n] bool        no decodable frame: DiCoSA cannot score the row
``frames_lost`` [n] float32     fraction of the frames that did not decode
==============  ==============  =========================================================

Fused score of query q and row v (:func:`fused_scores`)::

    S = S_DiCoSA(q, v) + β_sem·cos(θ_q, g_v) + β_title·cos(e_q, e_title(v))

A part a row lacks (DiCoSA for a text-only row, the title term for an untitled one) is
imputed from the part it has (:func:`fill_missing`): the query's mean of the missing part
plus ``trust`` x its spread x the row's z-score in the other part, so a text-only row whose
title matches the query as well as the best videos do ranks among them. (The plain mean,
trust = 0, left every text-only clip out of the top 10 on the synthetic benchmark.) Mul2vec
fusion is β_title = 0; late fusion is β_sem = 0; each β is chosen on the validation split
(``benchmarks/mul2vec.py``).

The titles' text vectors are encoded once and kept in the index folder
(``fusion.titles.npy``, float16, extended as rows arrive); the other arrays are recomputed on
each attach (a pass over the store's proxies and, with a head, one small MLP), and all of them
are held in RAM: fusion costs ~(D + K)·4 bytes per row of memory (2 GiB at 1M rows, D=512).

:func:`attach_fusion` given a head file (or no head: late fusion) records the choice in
``index.meta["fusion"]`` (``{"head": path or None, "beta_semantic", "beta_title", "trust"}``,
and the manifest), so that ``python -m dicosa search`` fuses the same way without the options.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .dense import top_k
from .row_cache import RowCache
from .types import Candidates, EncodedQueries

__all__ = ["FusionRerank", "FusionRows", "IndexFusion", "SemanticStage", "TitleStage",
           "TitlesError", "attach_fusion", "explain_hits", "fill_missing", "format_parts",
           "fused_scores", "fusion_rows", "read_titles"]


@dataclass(frozen=True)
class FusionRows:
    """The per-row fusion arrays of an index, indexed by row id (see the module table)."""

    title_text: np.ndarray  # float32 [n, D]
    title: list[str]  # [n]
    text_only: np.ndarray  # bool [n]
    frames_lost: np.ndarray  # float32 [n]
    semantic: np.ndarray | None = None  # float32 [n, K]

    @property
    def has_title(self) -> np.ndarray:
        return np.array([bool(t) for t in self.title], dtype=bool)

    def __len__(self) -> int:
        return len(self.title)

    def extend(self, new: FusionRows) -> FusionRows:
        """These rows followed by ``new`` (the next row ids), as an index appends them."""
        semantic = None
        if self.semantic is not None and new.semantic is not None:
            semantic = np.concatenate([self.semantic, new.semantic])
        return FusionRows(np.concatenate([self.title_text, new.title_text]),
                          self.title + new.title,
                          np.concatenate([self.text_only, new.text_only]),
                          np.concatenate([self.frames_lost, new.frames_lost]), semantic)


@torch.no_grad()
def fusion_rows(title: list[str], title_text: Tensor, proxy: Tensor, text_only: np.ndarray,
                frames_lost: np.ndarray, head=None) -> FusionRows:
    """The fusion arrays of new rows.

    Args:
        title: ``[n]`` titles ("" where none).
        title_text: DiCoSA text vectors of the titles ``[n, D]`` (any value where none).
        proxy: video proxies ``[n, D]`` (:func:`dicosa.functional.video_proxy` over the
            decodable frames; any value for text-only rows).
        text_only: ``[n]`` bool, the rows without a decodable frame.
        frames_lost: ``[n]`` fraction of each video's frames that did not decode.
        head: a :class:`dicosa.heads.mul2vec.Mul2vecHead` to fill ``semantic`` (or None).
    """
    has_title = torch.tensor([bool(t) for t in title])
    text_vectors = F.normalize(title_text.float(), dim=-1) * has_title[:, None]
    semantic = None
    if head is not None:
        semantic = head.entity_vectors(title_text.float(), has_title, proxy.float(),
                                       ~torch.as_tensor(text_only),
                                       torch.as_tensor(frames_lost)).numpy()
    return FusionRows(text_vectors.numpy().astype(np.float32), list(title),
                      np.asarray(text_only, dtype=bool),
                      np.asarray(frames_lost, dtype=np.float32), semantic)


def fill_missing(part: Tensor, present: Tensor, evidence: Tensor | None = None,
                 trust: float = 0.0) -> Tensor:
    """``part [Q, V]`` with the entries where ``present [V]`` (or ``[Q, V]``) is False imputed:
    the query's mean of ``part`` over the present rows, plus ``trust`` times its spread times
    the row's z-score in ``evidence [Q, V]`` (another score every row has).

    ``trust`` = 0 is "no evidence either way"; 1 places a row the other part ranks two
    deviations above the rest two deviations above the rest here too. It is chosen on the
    validation split with β.
    """
    present = present.expand_as(part)
    mean, std = _moments(part, present)
    guess = mean.expand_as(part)
    if evidence is not None and trust:
        e_mean, e_std = _moments(evidence, present)
        guess = mean + trust * std * (evidence - e_mean) / e_std.clamp_min(1e-6)
    return torch.where(present, part, guess)


def _moments(part: Tensor, present: Tensor) -> tuple[Tensor, Tensor]:
    """Per-query mean and standard deviation ``[Q, 1]`` of ``part`` over ``present``."""
    count = present.sum(dim=1, keepdim=True).clamp_min(1)
    mean = torch.where(present, part, 0).sum(dim=1, keepdim=True) / count
    var = torch.where(present, (part - mean) ** 2, 0).sum(dim=1, keepdim=True) / count
    return mean, var.sqrt()


def fused_scores(dicosa: Tensor, has_video: Tensor, semantic: Tensor | None = None,
                 title: Tensor | None = None, has_title: Tensor | None = None, *,
                 beta_semantic: float = 0.0, beta_title: float = 0.0,
                 trust: float = 0.0) -> dict[str, Tensor]:
    """The fused score and its parts, every one ``[Q, V]``.

    Args:
        dicosa: DiCoSA's S (any value, NaN included, where ``has_video`` is False).
        has_video: ``[V]`` or ``[Q, V]`` bool.
        semantic: cos(θ_q, g_v) (Mul2vec); present for every row.
        title: cos(e_q, e_title); ``has_title`` says where it exists.

    A text-only row's DiCoSA part is imputed (:func:`fill_missing` with ``trust``) from the
    semantic part (Mul2vec) or else the title part; an untitled row's title part from its
    DiCoSA part.

    Returns:
        ``{"dicosa", "semantic", "title"}`` (missing parts imputed, unweighted; absent when
        not given) and ``"fused"`` = dicosa + β_sem·semantic + β_title·title.
    """
    dicosa = torch.nan_to_num(dicosa)
    parts = {}
    if title is not None:
        has_title = (has_title if has_title is not None
                     else torch.ones(title.shape[-1], dtype=torch.bool)).expand_as(title)
        # Imputed from DiCoSA where the row has a video, else left at the title mean.
        parts["title"] = fill_missing(title, has_title, fill_missing(dicosa, has_video),
                                      trust)
    if semantic is not None:
        parts["semantic"] = semantic
    evidence = parts.get("semantic", parts.get("title"))
    parts["dicosa"] = fill_missing(dicosa, has_video, evidence, trust)
    fused = parts["dicosa"].clone()
    if semantic is not None:
        fused = fused + beta_semantic * semantic
    if title is not None:
        fused = fused + beta_title * parts["title"]
    parts["fused"] = fused
    return parts


class FusionRerank:
    """The :class:`~dicosa.search.types.RerankHook` of fused scoring.

    Args:
        rows: the index's fusion arrays, indexed by row id.
        head: the Mul2vec head (θ_q = f(e_q)); needed when ``beta_semantic`` is non-zero.
        beta_semantic, beta_title: the weights of the two extra parts.
        trust: how far a missing part follows the part a row has (:func:`fill_missing`).

    DiCoSA's rescored ``scores`` of text-only rows are ignored (pass NaN or anything); the
    missing parts are filled over the candidate list it is given, so the exhaustive path
    (every row a candidate) is :func:`fused_scores` exactly.
    """

    def __init__(self, rows: FusionRows, head=None, *, beta_semantic: float = 0.0,
                 beta_title: float = 0.0, trust: float = 0.0):
        if beta_semantic and (head is None or rows.semantic is None):
            raise ValueError("Mul2vec fusion (beta_semantic != 0) needs the head and the rows' "
                             "semantic vectors")
        self.rows, self.head = rows, head
        self.beta_semantic, self.beta_title, self.trust = beta_semantic, beta_title, trust

    def __call__(self, queries: EncodedQueries, ids: np.ndarray, scores: Tensor) -> Tensor:
        return self.explain(queries, ids, scores)["fused"]

    @torch.no_grad()
    def explain(self, queries: EncodedQueries, ids: np.ndarray,
                scores: Tensor) -> dict[str, Tensor]:
        """Every part of the fused score of the candidates ``ids [Q, k]`` (-1 pads, which
        keep -inf)."""
        valid = torch.as_tensor(ids >= 0)  # [Q, k]
        rows = torch.as_tensor(np.where(ids >= 0, ids, 0))
        has_video = valid & ~torch.as_tensor(self.rows.text_only)[rows]
        extra = {}
        if self.beta_semantic:
            theta = query_topics(queries, self.head)
            g = torch.as_tensor(self.rows.semantic)[rows]  # [Q, k, K]
            extra["semantic"] = torch.einsum("qk,qnk->qn", theta.float(), g)
        if self.beta_title:
            e_q = F.normalize(queries.text.text.float(), dim=-1)
            e_title = torch.as_tensor(self.rows.title_text)[rows]  # [Q, k, D]
            extra["title"] = torch.einsum("qd,qnd->qn", e_q, e_title)
            extra["has_title"] = valid & torch.as_tensor(self.rows.has_title)[rows]
        parts = fused_scores(scores.float(), has_video, beta_semantic=self.beta_semantic,
                             beta_title=self.beta_title, trust=self.trust, **extra)
        parts["fused"] = parts["fused"].masked_fill(~valid, float("-inf"))
        return parts


class IndexFusion(FusionRerank):
    """:class:`FusionRerank` over an index's rows, extended with the rows added since (a
    first stage asks for them as they are added; the hook for the candidates it meets)."""

    def __init__(self, index, head=None, **weights: float):
        self.index = index
        super().__init__(index_fusion_rows(index, head), head, **weights)

    @property
    def rows(self) -> FusionRows:
        if self.index.store.next_id > len(self._rows):
            self._rows = self._rows.extend(index_fusion_rows(self.index, self.head,
                                                             start=len(self._rows)))
        return self._rows

    @rows.setter
    def rows(self, rows: FusionRows) -> None:
        self._rows = rows


def query_topics(queries: EncodedQueries, head) -> Tensor:
    """θ_q ``[Q, K]``, computed once per batch and kept in ``queries.extra["mul2vec"]``."""
    if "mul2vec" not in queries.extra:
        queries.extra["mul2vec"] = head.query_vectors(queries.text.text.float())
    return queries.extra["mul2vec"]


class SemanticStage:
    """A :class:`~dicosa.search.types.FirstStage` over the rows' Mul2vec vectors g.

    A text-only row has no video proxy for the dense stage; this stage finds it (and any
    row) by cos(θ_q, g_v). Its candidates are meant to be merged with the dense stage's
    before DiCoSA rescores them. Exhaustive inner products: K = 50 floats per row.
    """

    name = "semantic"
    FILE = "semantic.npz"

    def __init__(self, head, topics: int):
        self.head = head
        self.ids = np.zeros(0, dtype=np.int64)
        self.vectors = np.zeros((0, topics), dtype=np.float32)

    def add(self, ids: np.ndarray, videos: np.ndarray) -> None:
        """``videos``: the rows' ``FusionRows.semantic`` ``[n, K]``."""
        self.ids = np.concatenate([self.ids, np.asarray(ids, dtype=np.int64)])
        self.vectors = np.concatenate([self.vectors, np.asarray(videos, dtype=np.float32)])

    def remove(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self.ids, ids)
        self.ids, self.vectors = self.ids[keep], self.vectors[keep]

    @torch.no_grad()
    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        theta = query_topics(queries, self.head).numpy()  # [Q, K]
        scores = theta @ self.vectors.T  # [Q, n]
        return _top_candidates(self.ids, scores, len(queries), k, self.name)

    def save(self, directory: str | os.PathLike) -> None:
        from ..checkpoint import write_bytes_atomic

        buffer = io.BytesIO()
        np.savez(buffer, ids=self.ids, vectors=self.vectors)
        write_bytes_atomic(Path(directory) / self.FILE, buffer.getvalue())

    @classmethod
    def load(cls, directory: str | os.PathLike, head) -> SemanticStage:
        with np.load(Path(directory) / cls.FILE) as stored:
            stage = cls(head, stored["vectors"].shape[1])
            stage.ids, stage.vectors = stored["ids"], stored["vectors"]
        return stage


# -- wiring into a VideoIndex ---------------------------------------------------------------
DEFAULT_BETA_SEMANTIC = 0.2  # the README's validation choice on the synthetic benchmark
DEFAULT_BETA_TITLE = 0.2  # late fusion: not tuned per collection; pass your own
DEFAULT_TRUST = 0.5
# The titles' DiCoSA text vectors, kept in the index folder (float16) for the model that
# encoded them: the text tower runs once per title, not on every attach.
TITLES_FILE = "fusion.titles"
_TITLE_BATCH = 256


class TitleStage(SemanticStage):
    """A first stage over the rows' title vectors e_title: cos(e_q, e_title), exhaustive.

    Late fusion's way to propose text-only rows (no proxy for the dense stage to match).
    Untitled rows hold zero vectors and score 0.
    """

    name = "title"
    FILE = "title.npz"

    def __init__(self, topics: int):
        super().__init__(None, topics)

    @torch.no_grad()
    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        if "title" not in queries.extra:
            queries.extra["title"] = F.normalize(queries.text.text.float().cpu(), dim=-1)
        scores = queries.extra["title"].numpy() @ self.vectors.T  # [Q, n]
        return _top_candidates(self.ids, scores, len(queries), k, self.name)


def _top_candidates(ids: np.ndarray, scores: np.ndarray, num_queries: int, k: int,
                    name: str) -> Candidates:
    count = min(k, len(ids))
    out = np.full((num_queries, k), -1, dtype=np.int64)
    best = np.full((num_queries, k), -np.inf, dtype=np.float32)
    if count:
        top = top_k(scores, count)  # [Q, count]
        out[:, :count] = ids[top]
        best[:, :count] = np.take_along_axis(scores, top, axis=1)
    return Candidates(out, best, name)


def read_titles(path: str | os.PathLike) -> dict[str, str]:
    """A titles sidecar: CSV with columns ``path,title`` or JSON ``{path: title}``.

    Relative paths are taken relative to the sidecar's folder. Raises :class:`TitlesError`.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise TitlesError(f"titles file {path} does not exist")
    try:
        if path.suffix.lower() == ".json":
            table = json.loads(path.read_text())
            if not isinstance(table, dict):
                raise TitlesError(f"{path} must hold one JSON object {{path: title}}")
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
            if not {"path", "title"} <= set(frame.columns):
                raise TitlesError(f"{path} must have the columns 'path' and 'title'")
            table = dict(zip(frame["path"], frame["title"], strict=True))
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, TitlesError):
            raise
        raise TitlesError(f"{path} is not a readable titles file: {exc}") from None
    return {str((path.parent / p).resolve()): str(t).strip() for p, t in table.items()}


class TitlesError(ValueError):
    """A titles sidecar that cannot be read (one sentence for the CLI)."""


def normalise_titles(titles: dict | str | os.PathLike | None) -> dict[str, str]:
    """``titles`` (a dict path→title or a sidecar file) keyed by absolute path."""
    if titles is None:
        return {}
    if isinstance(titles, (str, os.PathLike)):
        return read_titles(titles)
    return {str(Path(p).resolve()): str(t).strip() for p, t in titles.items()}


@torch.no_grad()
def index_fusion_rows(index, head=None, start: int = 0) -> FusionRows:
    """:class:`FusionRows` of the row ids ``[start, next_id)`` of ``index`` (removed rows:
    untitled, text-only), the titles' text vectors from the index folder's cache (the
    missing ones encoded with the index's model)."""
    model = index._require_model()
    end, dim = index.store.next_id, index.store.dim or model.embed_dim
    cache = RowCache(index.directory, TITLES_FILE, index.model_key, dim, np.float16)
    first = min(start, len(cache.array))  # the cache may need rows before start too
    live = index.store.live()
    live = live[live >= first]
    table = index.store.rows(live)
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
        index, [title[i - first] for i in ids.tolist()]))
    live = live[live >= start]
    proxy = torch.zeros(end - start, dim)
    proxy[live - start] = torch.as_tensor(index.store.proxies(live))
    skip = start - first
    return fusion_rows(title[skip:], torch.from_numpy(every[start:end].astype(np.float32)),
                       proxy, text_only[skip:], frames_lost[skip:], head)


def _encode_titles(index, titles: list[str]) -> np.ndarray:
    """DiCoSA text vectors of ``titles`` ``[n, D]``, in batches of :data:`_TITLE_BATCH`."""
    model, parts = index._require_model(), []
    for start in range(0, len(titles), _TITLE_BATCH):
        tokens = index.tokenizer(titles[start:start + _TITLE_BATCH]).to(index.device)
        parts.append(model.encode_text(tokens).text.float().cpu().numpy())
    return np.concatenate(parts)


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value) if value == value else False  # NaN (an empty cell): False


def attach_fusion(index, head=None, *, beta_semantic: float | None = None,
                  beta_title: float | None = None, trust: float | None = None
                  ) -> FusionRerank:
    """Wire fused scoring into ``index``: a first stage that finds text-only rows and the
    :class:`FusionRerank` hook (appended to ``index.hooks``); returns the hook.

    Args:
        head: a Mul2vec head, or the path of one (``heads train mul2vec``): Mul2vec fusion
            through a :class:`SemanticStage`. None: late fusion (title similarity) through a
            :class:`TitleStage`, the default where no head is trained.
        beta_semantic, beta_title: default :data:`DEFAULT_BETA_SEMANTIC` with a head (and no
            title term), :data:`DEFAULT_BETA_TITLE` without one.
        trust: how far a missing part follows the part a row has (default
            :data:`DEFAULT_TRUST`).

    With a head file or no head, the choice and the weights are recorded in
    ``index.meta["fusion"]`` (and the manifest of an index in a folder); a head object is not.

    Rows added later join the fusion arrays when the first stage receives them (their titles
    encoded then). Attach once per index: each call registers another first stage.
    """
    path = None
    if isinstance(head, (str, os.PathLike)):
        from ..heads.base import load_head

        path = str(Path(head).resolve())
        head = load_head(path, index._require_model(), kind="mul2vec")
    record = head is None or path is not None
    trust = DEFAULT_TRUST if trust is None else trust
    if head is not None:
        beta_semantic = DEFAULT_BETA_SEMANTIC if beta_semantic is None else beta_semantic
        beta_title = 0.0 if beta_title is None else beta_title
    else:
        beta_semantic = 0.0
        beta_title = DEFAULT_BETA_TITLE if beta_title is None else beta_title
    hook = IndexFusion(index, head, beta_semantic=beta_semantic, beta_title=beta_title,
                       trust=trust)
    if head is not None:
        stage = SemanticStage(head, hook.rows.semantic.shape[1])
        index.add_first_stage(stage, videos=lambda ids, _: hook.rows.semantic[ids])
    else:
        stage = TitleStage(hook.rows.title_text.shape[1])
        index.add_first_stage(stage, videos=lambda ids, _: hook.rows.title_text[ids])
    index.hooks.append(hook)
    if record:
        index.remember("fusion", {"head": path, "beta_semantic": beta_semantic,
                                  "beta_title": beta_title, "trust": trust})
    return hook


@torch.no_grad()
def explain_hits(index, hook: FusionRerank, query: str, hits) -> list[dict]:
    """The fused score's parts for each hit of ``query``: one dict per hit
    ``{"id", "path", "dicosa", "semantic"?, "title"?, "fused", "text_only", "frames_lost",
    "has_title"}``
    (parts unweighted, missing ones imputed as in :func:`fused_scores`; computed over the
    hits, so the imputation's moments are those of the listed rows)."""
    if not hits:
        return []
    encoded = index.encode_queries([query])
    ids = np.array([[h.id for h in hits]], dtype=np.int64)
    dicosa = torch.tensor([[h.dicosa for h in hits]], dtype=torch.float32)
    parts = hook.explain(encoded, ids, dicosa)
    out = []
    for c, hit in enumerate(hits):
        entry = {"id": hit.id, "path": hit.path}
        entry.update({name: float(value[0, c]) for name, value in parts.items()})
        entry["text_only"] = bool(hook.rows.text_only[hit.id])
        entry["frames_lost"] = float(hook.rows.frames_lost[hit.id])
        entry["has_title"] = bool(hook.rows.has_title[hit.id])
        out.append(entry)
    return out


def format_parts(parts: list[dict]) -> str:
    """:func:`explain_hits`'s dicts as a small table (unweighted parts; fused = ranking)."""
    names = [n for n in ("dicosa", "semantic", "title", "fused") if parts and n in parts[0]]
    lines = ["fusion parts (unweighted; missing parts imputed, marked *):",
             f"{'rank':>4}  " + "  ".join(f"{n:>8}" for n in names) + "  frames_lost  path"]
    for rank, entry in enumerate(parts, 1):
        cells = []
        for n in names:
            imputed = ((n == "dicosa" and entry["text_only"])
                       or (n == "title" and not entry["has_title"]))
            cells.append(f"{entry[n]:>7.4f}{'*' if imputed else ' '}")
        lines.append(f"{rank:>4}  " + "  ".join(cells)
                     + f"  {entry['frames_lost']:>11.2f}  {entry['path']}")
    return "\n".join(lines)
