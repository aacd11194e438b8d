"""Exclusion ranking: videos with A and without B (paper 003, Sec. 4.3, plus a per-frame check).

The pieces are pure functions over tensors, so an index only has to call them in order:

1. :func:`exclusion_dimensions` — D_A: the concept dimensions that carry ``mass_fraction``
   of the magnitude of the top-K videos for A (by code similarity); D_B the same for each B;
   keep D_A \\ D_B.
2. :func:`magnitude_scores` — rank videos by the magnitude of their codes on D_A \\ D_B.
3. DiCoSA reranks the best ``candidates`` of them by S(A, v) (any scorer; the index's).
4. :func:`window_presence` — for each candidate, DiCoSA's score of B on every window of
   ``window`` consecutive frames; B is present where the best window reaches the threshold
   chosen on validation. :func:`demote` moves those candidates behind the others.
5. :func:`explain_exclusion` — per result, the dimensions of D_A \\ D_B it matched, the
   B-dimensions that were empty in it, and B's best window score.

The codes come from :class:`dicosa.heads.concepts.ConceptCodesHead` (unit length, sparse).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..model import DiCoSA, TextFeatures, VideoFeatures
from .types import EncodedQueries

if TYPE_CHECKING:
    from ..heads.concepts import ConceptCodesHead

__all__ = [
    "ExcludedTexts",
    "ExclusionConfig",
    "ExclusionDimensions",
    "ExclusionExplanation",
    "ExclusionRerank",
    "active_dimensions",
    "demote",
    "describe_dimensions",
    "exclusion_dimensions",
    "explain_exclusion",
    "magnitude_scores",
    "window_presence",
]


@dataclass(frozen=True)
class ExclusionConfig:
    """Settings of an exclusion search. K, t, C and the window are what the synthetic
    benchmark's validation split chose most often; the presence threshold is on DiCoSA's score
    scale, which differs per model, so it is off until chosen on validation for the model
    (``benchmarks/exclusion.py`` prints it)."""

    top_k_results: int = 5           # K: results per label whose codes define D_A, D_B
    mass_fraction: float = 0.3       # t: D_A carries this share of their magnitude
    candidates: int = 50             # C: videos DiCoSA reranks
    window: int = 2                  # frames per window of the presence check
    presence_threshold: float = float("inf")  # B present at S(B, window) >= this; inf: off


@dataclass(frozen=True)
class ExclusionDimensions:
    """D_A, D_B (the union over every B) and D_A \\ D_B as ``[d]`` bool masks."""

    positive: Tensor
    excluded: Tensor

    @property
    def kept(self) -> Tensor:
        return self.positive & ~self.excluded


def active_dimensions(codes: Tensor, mass_fraction: float) -> Tensor:
    """The fewest dimensions carrying ``mass_fraction`` of the mean magnitude of ``codes
    [n, d]`` (the top results of one label): ``[d]`` bool.

    The paper takes "the dimensions contributing t% of the embedding's magnitude" of the
    top-K results; we pool the K results first (mean |code|), so one odd result cannot add
    its dimensions on its own.
    """
    if not 0 < mass_fraction <= 1:
        raise ValueError(f"mass_fraction must be in (0, 1], got {mass_fraction}")
    magnitude = codes.abs().float().mean(dim=0)  # [d]
    values, order = magnitude.sort(descending=True)
    cumulative = values.cumsum(0)
    # Smallest prefix whose cumulative magnitude reaches the fraction (never a zero entry).
    count = int((cumulative < mass_fraction * cumulative[-1]).sum()) + 1
    count = min(count, int((values > 0).sum()))
    mask = torch.zeros_like(magnitude, dtype=torch.bool)
    mask[order[:count]] = True
    return mask


def _top_results(video_codes: Tensor, query_code: Tensor, k: int) -> Tensor:
    scores = video_codes.float() @ query_code.float()  # [V]
    return video_codes[scores.topk(min(k, len(scores))).indices]


def exclusion_dimensions(video_codes: Tensor, positive_code: Tensor, excluded_codes: Tensor,
                         top_k_results: int, mass_fraction: float) -> ExclusionDimensions:
    """Sec. 4.3, step 1: D_A from the top-K videos for A, D_B from the top-K for each B.

    Args:
        video_codes: ``[V, d]`` codes of the collection (or of a first stage's candidates).
        positive_code: ``[d]`` the code of A.
        excluded_codes: ``[B, d]`` the codes of B₁..B_n.
    """
    positive = active_dimensions(_top_results(video_codes, positive_code, top_k_results),
                                 mass_fraction)
    excluded = torch.zeros_like(positive)
    for code in excluded_codes:
        excluded |= active_dimensions(_top_results(video_codes, code, top_k_results),
                                      mass_fraction)
    return ExclusionDimensions(positive, excluded)


def magnitude_scores(video_codes: Tensor, dimensions: Tensor) -> Tensor:
    """Sec. 4.3, step 2: each video's magnitude on ``dimensions`` (D_A \\ D_B): ``[V]``."""
    return video_codes.abs().float() @ dimensions.float()


@torch.no_grad()
def window_presence(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                    window: int = 1) -> Tensor:
    """DiCoSA's score of each text on each video's best window: ``[B_t, B_v]``.

    A video contains B if any stretch of it does, so each window of ``window`` consecutive
    frames is scored as a video of its own (pooling over its frames only) and the best window
    counts. Windows made only of padding are left out.
    """
    frames, mask = video.frames, video.frame_mask  # [B_v, N, D], [B_v, N]
    width = min(window, frames.shape[1])
    windows = frames.unfold(1, width, 1).movedim(-1, 2)  # [B_v, W, width, D]
    window_mask = mask.unfold(1, width, 1)  # [B_v, W, width]
    valid = window_mask.any(-1)  # [B_v, W]
    scores = torch.full((len(text), *valid.shape), float("-inf"), device=frames.device)
    scores[:, valid] = model.score(text, VideoFeatures(windows[valid], window_mask[valid])).float()
    return scores.amax(dim=-1)


def demote(order: Tensor, present: Tensor) -> Tensor:
    """``order`` (video ids, best first) with the videos where ``present`` (aligned with
    ``order``) moved behind the others, each group keeping its order."""
    return torch.cat([order[~present], order[present]])


@dataclass(frozen=True)
class ExclusionExplanation:
    """Why one video answered "A without B".

    Attributes:
        matched: ``(dimension, value)`` of D_A \\ D_B active in the video's code, largest first.
        excluded_empty: dimensions of D_B where the video's code is zero.
        excluded_active: ``(dimension, value)`` of D_B active in the video's code.
        presence: B's best window score (None: the per-frame check did not run).
        demoted: True if the per-frame check found B and moved the video back.
    """

    matched: list[tuple[int, float]]
    excluded_empty: list[int]
    excluded_active: list[tuple[int, float]]
    presence: float | None = None
    demoted: bool = False


def _active(code: Tensor, dimensions: Tensor) -> list[tuple[int, float]]:
    ids = torch.nonzero(dimensions & (code != 0)).flatten()
    pairs = [(int(i), float(code[i])) for i in ids]
    return sorted(pairs, key=lambda p: -abs(p[1]))


def explain_exclusion(codes: Tensor, dimensions: ExclusionDimensions,
                      presence: Tensor | None = None,
                      threshold: float = float("inf")) -> list[ExclusionExplanation]:
    """One :class:`ExclusionExplanation` per row of ``codes [R, d]`` (the results, in order),
    with ``presence [R]`` from :func:`window_presence` if it ran."""
    out = []
    for row, code in enumerate(codes):
        score = None if presence is None else float(presence[row])
        out.append(ExclusionExplanation(
            matched=_active(code, dimensions.kept),
            excluded_empty=torch.nonzero(dimensions.excluded & (code == 0)).flatten().tolist(),
            excluded_active=_active(code, dimensions.excluded),
            presence=score,
            demoted=score is not None and score >= threshold))
    return out


def describe_dimensions(dimensions: Sequence[int], words_of) -> list[str]:
    """``"12 (red, circle)"`` for each dimension, naming it by ``words_of(dim)`` (e.g.
    :meth:`ConceptCodesHead.dimension_words`)."""
    return [f"{d} ({', '.join(words_of(d)) or '-'})" for d in dimensions]


# ---------------------------------------------------------------- the rerank hook


@dataclass(frozen=True)
class ExcludedTexts:
    """What :meth:`ExclusionRerank.prepare` stores in ``EncodedQueries.extra["exclude"]``.

    Attributes:
        text: DiCoSA vectors of every exclusion of the batch, ``[E, D]``.
        owner: ``[E]`` long, the query each exclusion belongs to.
        codes: ``[E, d]`` concept codes of the exclusions (None without a concepts head).
        positive_codes: ``[Q, d]`` concept codes of the queries' own text (None likewise).
    """

    text: TextFeatures
    owner: Tensor
    codes: Tensor | None = None
    positive_codes: Tensor | None = None


class ExclusionRerank:
    """"A without B" as a :class:`~dicosa.search.types.RerankHook` over DiCoSA's rescored
    candidates: the concept codes' D_A \\ D_B (Sec. 4.3), the per-frame presence check, or both.

    Each candidate of a query with exclusions gets a tier, and the adjusted scores order the
    tiers first and DiCoSA's score within a tier:

    - +1 if the codes are on and the candidate is not among the ``config.candidates`` largest
      magnitudes on D_A \\ D_B (the paper's retrieval; DiCoSA then reranks those, as the issue
      asks);
    - +2 if the per-frame check is on and B's best window reaches ``config.presence_threshold``
      (a video that shows B ranks behind every video that does not).

    D_A and D_B are taken from the top ``config.top_k_results`` of the candidates the hook is
    given (the paper takes them over the whole collection: pass every video, as the exhaustive
    :meth:`rerank_matrix` does, or let the first stage return a few times K candidates).
    Queries without exclusions keep their scores.

    Args:
        config: K, t, C, the window and the presence threshold (choose them on validation;
            ``benchmarks/exclusion.py`` does).
        head: the trained concepts head (``load_head(path, model, kind="concepts")``).
        video_codes: ``ids [n] int64 -> [n, d]`` the head's codes of those rows, i.e. what the
            index stored per row from ``head.encode_videos(VideoFeatures)``.
        model: the frozen DiCoSA, for the per-frame check.
        video_frames: ``ids [n] int64 -> VideoFeatures [n, N, D]`` from the frame store.
    """

    name = "exclusion"

    def __init__(self, config: ExclusionConfig = ExclusionConfig(), *,
                 head: ConceptCodesHead | None = None,
                 video_codes: Callable[[np.ndarray], Tensor] | None = None,
                 model: DiCoSA | None = None,
                 video_frames: Callable[[np.ndarray], VideoFeatures] | None = None):
        if (head is None) != (video_codes is None):
            raise ValueError("the codes need both head and video_codes")
        if (model is None) != (video_frames is None):
            raise ValueError("the per-frame check needs both model and video_frames")
        if head is None and (video_frames is None or math.isinf(config.presence_threshold)):
            raise ValueError("ExclusionRerank needs the codes (head, video_codes) or the "
                             "per-frame check (model, video_frames, a finite presence_threshold)")
        self.config, self.head, self.video_codes = config, head, video_codes
        self.model, self.video_frames = model, video_frames

    @property
    def uses_frames(self) -> bool:
        return self.video_frames is not None and not math.isinf(self.config.presence_threshold)

    @torch.no_grad()
    def prepare(self, queries: EncodedQueries, model: DiCoSA,
                tokenizer: Callable[[list[str]], Tensor]) -> None:
        """Encode every exclusion of the batch once into ``queries.extra["exclude"]``."""
        strings = [b for q in queries.queries for b in q.exclude]
        owner = torch.tensor([i for i, q in enumerate(queries.queries) for _ in q.exclude],
                             dtype=torch.long)
        if strings:
            text = model.encode_text(tokenizer(strings))
        else:
            text = TextFeatures(queries.text.text.new_zeros(0, queries.text.text.shape[1]))
        codes = positive = None
        if self.head is not None:
            # The head and the stored codes live on the CPU; DiCoSA may not.
            codes = self.head.text_codes(text.text.cpu(), strings)
            positive = self.head.text_codes(queries.text.text.cpu(),
                                            [q.text for q in queries.queries])
        queries.extra["exclude"] = ExcludedTexts(text, owner, codes, positive)

    @torch.no_grad()
    def __call__(self, queries: EncodedQueries, ids: np.ndarray, scores: Tensor) -> Tensor:
        """``ids`` int64 ``[Q, k]`` (-1 pads), ``scores [Q, k]`` -> adjusted scores ``[Q, k]``."""
        excluded = self._excluded(queries)
        adjusted = scores.clone()
        for q in range(len(queries)):
            mine = excluded.owner == q
            valid = np.asarray(ids[q]) >= 0
            if not mine.any() or not valid.any():
                continue
            tiers = self._tiers(excluded, q, mine, np.asarray(ids[q])[valid])  # [n]
            where = torch.from_numpy(valid).to(scores.device)
            ranked = scores[q, where]
            finite = ranked[ranked.isfinite()]
            spread = float(finite.max() - finite.min()) + 1.0 if len(finite) else 1.0
            adjusted[q, where] = ranked - tiers.to(ranked) * spread
        return adjusted

    def rerank_matrix(self, queries: EncodedQueries, scores: Tensor) -> Tensor:
        """The exhaustive path: DiCoSA's ``scores [Q, V]`` over rows 0..V-1, adjusted."""
        ids = np.broadcast_to(np.arange(scores.shape[1], dtype=np.int64), scores.shape)
        return self(queries, ids, scores)

    @torch.no_grad()
    def explain(self, queries: EncodedQueries, q: int, candidates: np.ndarray,
                results: np.ndarray) -> list[ExclusionExplanation]:
        """Why each of ``results`` answered query ``q``: the D_A \\ D_B dimensions it carries,
        the D_B dimensions empty in it, and B's best window score. D_A and D_B come from
        ``candidates`` (the ids the hook ranked, as in ``__call__``). Needs the codes."""
        excluded = self._excluded(queries)
        if self.head is None:
            raise ValueError("explanations need the concepts head")
        mine = excluded.owner == q
        dims = exclusion_dimensions(self.video_codes(np.asarray(candidates)),
                                    excluded.positive_codes[q], excluded.codes[mine],
                                    self.config.top_k_results, self.config.mass_fraction)
        results = np.asarray(results)
        presence = self._presence(excluded, mine, results) if self.uses_frames else None
        return explain_exclusion(self.video_codes(results), dims, presence,
                                 self.config.presence_threshold)

    def _excluded(self, queries: EncodedQueries) -> ExcludedTexts:
        excluded = queries.extra.get("exclude")
        if not isinstance(excluded, ExcludedTexts):
            raise ValueError('call ExclusionRerank.prepare(queries, model, tokenizer) first: '
                             'queries.extra["exclude"] is missing')
        return excluded

    def _tiers(self, excluded: ExcludedTexts, q: int, mine: Tensor, rows: np.ndarray) -> Tensor:
        cfg = self.config
        tiers = torch.zeros(len(rows), dtype=torch.long)
        if self.head is not None:
            codes = self.video_codes(rows)  # [n, d]
            dims = exclusion_dimensions(codes, excluded.positive_codes[q], excluded.codes[mine],
                                        cfg.top_k_results, cfg.mass_fraction)
            magnitude = magnitude_scores(codes, dims.kept)  # [n]
            inside = torch.zeros(len(rows), dtype=torch.bool)
            inside[magnitude.topk(min(cfg.candidates, len(rows))).indices] = True
            tiers += (~inside).long()
        if self.uses_frames:
            tiers += 2 * (self._presence(excluded, mine, rows) >= cfg.presence_threshold).long()
        return tiers

    def _presence(self, excluded: ExcludedTexts, mine: Tensor, rows: np.ndarray) -> Tensor:
        """B's best window score in each row, the largest over the query's exclusions: [n]."""
        video = self.video_frames(rows)
        return window_presence(self.model, excluded.text[mine], video,
                               self.config.window).amax(dim=0).cpu()
