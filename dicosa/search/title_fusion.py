"""Fused scoring for incomplete entries: DiCoSA + β·(Mul2vec topic or title similarity).

Every indexed row may have a video (decodable frames, possibly with a fraction lost) and a
title. What the index stores per row for fusion is :class:`FusionRows` (built by
:func:`fusion_rows` when the row is added; docs/heads.md lists its arrays).

Fused score of query q and row v (:func:`fused_scores`)::

    S = S_DiCoSA(q, v) + β_sem·cos(θ_q, g_v) + β_title·cos(e_q, e_title(v))

A part a row lacks (DiCoSA for a text-only row, the title term for an untitled one) is
imputed from the part it has (:func:`fill_missing`): the query's mean of the missing part
plus ``trust`` x its spread x the row's z-score in the other part, so a text-only row whose
title matches the query as well as the best videos do ranks among them (docs/heads.md says
why the plain mean is not enough). Mul2vec fusion is β_title = 0; late fusion is β_sem = 0.

The index side (the arrays built from an index's rows, the plugin that attaches them) is
:mod:`dicosa.plugins.titles`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .dense import array_bytes, top_candidates
from .types import Candidates, EncodedQueries

__all__ = ["DEFAULT_BETA_SEMANTIC", "DEFAULT_BETA_TITLE", "DEFAULT_TRUST", "FusionRerank",
           "FusionRows", "SemanticStage", "TitleStage", "TitlesError", "fill_missing",
           "fused_scores", "fusion_rows", "normalise_titles", "query_topics", "read_titles"]


@dataclass(frozen=True)
class FusionRows:
    """The per-row fusion arrays of an index, indexed by row id."""

    title_text: np.ndarray  # float32 [n, D] DiCoSA's unit vector of the title, zeros: none
    title: list[str]  # [n] "" = none
    text_only: np.ndarray  # bool [n] no decodable frame: DiCoSA cannot score the row
    frames_lost: np.ndarray  # float32 [n] fraction of the frames that did not decode
    semantic: np.ndarray | None = None  # float32 [n, K] Mul2vec's g (None without a head)

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
        return top_candidates(self.ids, scores, k, self.name)

    def save(self, directory: str | os.PathLike) -> None:
        from ..files import write_bytes_atomic

        write_bytes_atomic(Path(directory) / self.FILE,
                           array_bytes(ids=self.ids, vectors=self.vectors))

    @classmethod
    def load(cls, directory: str | os.PathLike, head) -> SemanticStage:
        with np.load(Path(directory) / cls.FILE) as stored:
            stage = cls(head, stored["vectors"].shape[1])
            stage.ids, stage.vectors = stored["ids"], stored["vectors"]
        return stage


DEFAULT_BETA_SEMANTIC = 0.2  # chosen on validation on the synthetic benchmark (docs/heads.md)
DEFAULT_BETA_TITLE = 0.2  # late fusion: not tuned per collection; pass your own
DEFAULT_TRUST = 0.5


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
        return top_candidates(self.ids, scores, k, self.name)


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
