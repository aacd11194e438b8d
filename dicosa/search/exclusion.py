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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = [
    "ExclusionConfig",
    "ExclusionDimensions",
    "ExclusionExplanation",
    "active_dimensions",
    "demote",
    "exclusion_dimensions",
    "explain_exclusion",
    "magnitude_scores",
    "window_presence",
]


@dataclass(frozen=True)
class ExclusionConfig:
    """Settings of an exclusion search (defaults chosen on the synthetic validation split)."""

    top_k_results: int = 10          # K: results per label whose codes define D_A, D_B
    mass_fraction: float = 0.5       # t: D_A carries this share of their magnitude
    candidates: int = 30             # C: videos DiCoSA reranks
    window: int = 1                  # frames per window of the presence check
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
    scores = torch.full((len(text), *valid.shape), float("-inf"))
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
