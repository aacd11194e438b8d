"""Exclusion ranking: videos with A and without B.

The default rule, "demote" (ours), starts from the plain ranking of A (the same first stage
and DiCoSA rerank as the query "A" alone) and only moves down the candidates that show
evidence of B, so a clip without evidence keeps its score and can only rise:

    adjusted(v) = S(A, v) - λ · max(0, S_w(B, v) - ρ · max_c S(A, c))
                          - λ_c · max(0, code(v) · code(B) - τ_c)

summed over the exclusions B₁..B_n. S_w(B, v) is DiCoSA's score of B on v's best window of
``window`` consecutive frames (:func:`best_windows`), max_c S(A, c) the best plain score among
the candidates, and the optional second term the concepts head's code similarity to B (off by
default); docs/heads.md explains each term and how the values were chosen
(``benchmarks/exclusion.py``). :func:`demotions` computes the penalties,
:class:`Demotions` keeps them with their evidence for the explanation.

The paper's rule (003, Sec. 4.3) is ``method="tiers"``, pure functions called in order:

1. :func:`exclusion_dimensions` — D_A: the concept dimensions that carry ``mass_fraction``
   of the magnitude of the top-K videos for A (by code similarity); D_B the same for each B;
   keep D_A \\ D_B.
2. :func:`magnitude_scores` — rank videos by the magnitude of their codes on D_A \\ D_B.
3. DiCoSA reranks the best ``candidates`` of them by S(A, v) (any scorer; the index's).
4. :func:`window_presence` — B is present where the best window reaches the absolute
   ``presence_threshold``; :func:`demote` moves those candidates behind the others.
5. :func:`explain_exclusion` — per result, the dimensions of D_A \\ D_B it matched, the
   B-dimensions that were empty in it, and B's best window score (its types:
   :mod:`dicosa.search.exclusion_explained`).

The codes come from :class:`dicosa.heads.concepts.ConceptCodesHead` (unit length, sparse).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from ..model import DiCoSA, TextFeatures, VideoFeatures
from .exclusion_explained import Evidence, ExclusionExplanation
from .types import EncodedQueries

__all__ = [
    "ConceptCodes",
    "Demotions",
    "ExcludedTexts",
    "ExclusionConfig",
    "ExclusionDimensions",
    "ExclusionRerank",
    "active_dimensions",
    "best_windows",
    "demote",
    "demotions",
    "exclusion_dimensions",
    "explain_exclusion",
    "magnitude_scores",
    "window_presence",
    "with_evidence",
]


class ConceptCodes(Protocol):
    """What the rerank asks of a concepts head (:class:`dicosa.heads.concepts.
    ConceptCodesHead` is one): the sparse unit-length codes of texts."""

    def text_codes(self, text: Tensor, sentences: Sequence[str]) -> Tensor:
        """``T [B_t, D]`` and the texts' strings -> codes ``[B_t, d]``."""
        ...


@dataclass(frozen=True)
class ExclusionConfig:
    """Settings of an exclusion search.

    ``method="demote"`` (the default) keeps the plain ranking of A and demotes evidence of B:
    ``window``, ``presence_ratio`` (ρ), ``demotion`` (λ), ``code_threshold`` and
    ``code_weight`` (the codes' term, off while the threshold is infinite) and ``depth``
    (docs/heads.md says how the defaults were chosen, and how to choose them for a model).

    ``method="tiers"`` is the paper's retrieval (Sec. 4.3) plus the per-frame filter: K, t,
    C (``top_k_results``, ``mass_fraction``, ``candidates``) and the absolute
    ``presence_threshold`` (off while infinite).
    """

    method: Literal["demote", "tiers"] = "demote"
    window: int = 1                  # frames per window of the per-frame check
    presence_ratio: float = 0.45     # ρ: B's best window counts above ρ · best S(A)
    demotion: float = 8.0            # λ: score taken off per unit of S(B) above that
    code_threshold: float = 0.05     # τ_c on code(v) · code(B) (with a head); inf: off
    code_weight: float = 1.0         # λ_c
    depth: int = 100                 # demote: the best `depth` candidates by S(A) are checked
    top_k_results: int = 5           # K: results per label whose codes define D_A, D_B
    mass_fraction: float = 0.3       # t: D_A carries this share of their magnitude
    candidates: int = 50             # C: videos DiCoSA reranks
    presence_threshold: float = float("inf")  # tiers: B present at S(B, window) >= this

    def __post_init__(self) -> None:
        if self.method not in ("demote", "tiers"):
            raise ValueError(f"exclusion method must be 'demote' or 'tiers', got {self.method!r}")
        if self.window < 1 or self.depth < 1:
            raise ValueError("exclusion window and depth must be at least 1")
        if not (self.demotion >= 0 and self.code_weight >= 0 and math.isfinite(self.demotion)
                and math.isfinite(self.code_weight)):
            raise ValueError("exclusion demotion and code_weight must be finite and >= 0")
        if not math.isfinite(self.presence_ratio):
            raise ValueError("exclusion presence_ratio must be finite")


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
def best_windows(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                 window: int = 1) -> tuple[Tensor, Tensor]:
    """DiCoSA's score of each text on each video's best window, and where that window
    starts (frame index): ``[B_t, B_v]`` float and ``[B_t, B_v]`` long.

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
    best = scores.max(dim=-1)
    return best.values, best.indices


def window_presence(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                    window: int = 1) -> Tensor:
    """DiCoSA's score of each text on each video's best window: ``[B_t, B_v]``
    (:func:`best_windows` without the positions)."""
    return best_windows(model, text, video, window)[0]


def demote(order: Tensor, present: Tensor) -> Tensor:
    """``order`` (video ids, best first) with the videos where ``present`` (aligned with
    ``order``) moved behind the others, each group keeping its order."""
    return torch.cat([order[~present], order[present]])


def demotions(positive: Tensor, presence: Tensor | None, config: ExclusionConfig,
              code_similarity: Tensor | None = None) -> tuple[Tensor, Tensor, float]:
    """The demote rule: what each piece of evidence of B takes off each candidate's score.

    Args:
        positive: ``[n]`` DiCoSA's S(A) of the candidates (their plain ranking).
        presence: ``[E, n]`` each exclusion's best window score in each candidate, or None
            (the per-frame check did not run).
        config: ρ (``presence_ratio``), λ (``demotion``), τ_c and λ_c.
        code_similarity: ``[E, n]`` code(v) · code(B) per exclusion, or None.

    Returns:
        ``(frames [E, n], codes [E, n], threshold)``: the penalties from the windows and from
        the codes (zeros where a source is off), and the presence threshold
        ``ρ · max S(A)``. ``adjusted = positive - frames.sum(0) - codes.sum(0)``: a candidate
        without evidence keeps its score.
    """
    count = len(presence) if presence is not None else (
        len(code_similarity) if code_similarity is not None else 0)
    zeros = positive.new_zeros(count, len(positive))
    finite = positive[positive.isfinite()]
    threshold = config.presence_ratio * float(finite.max()) if len(finite) else float("inf")
    frames = codes = zeros
    if presence is not None:
        frames = config.demotion * (presence.to(positive) - threshold).clamp_min(0)
    if code_similarity is not None and math.isfinite(config.code_threshold):
        codes = config.code_weight * (code_similarity.to(positive)
                                      - config.code_threshold).clamp_min(0)
    return frames, codes, threshold


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


def with_evidence(base: ExclusionExplanation, record: Demotions, names: list[str], row: int,
                  window: int, code_threshold: float) -> ExclusionExplanation:
    """``base`` with the demote rule's evidence for store row ``row`` (``names``: the query's
    exclusions; ``window``: the frames of the windows checked)."""
    found = np.flatnonzero(record.rows == row)
    if not len(found):  # below the checked depth: its plain score, unexamined
        return replace(base, penalty=0.0)
    i = int(found[0])
    evidence = []
    for e, name in enumerate(names):
        if record.presence is not None:
            start = int(record.starts[e, i])
            evidence.append(Evidence("frames", name, float(record.presence[e, i]),
                                     record.threshold, float(record.frames[e, i]),
                                     (start, start + window - 1)))
        if record.similarity is not None:
            evidence.append(Evidence("codes", name, float(record.similarity[e, i]),
                                     code_threshold, float(record.codes[e, i])))
    penalty = float(record.penalty[i])
    presence = None if record.presence is None else float(record.presence[:, i].max())
    return replace(base, presence=presence, demoted=penalty > 0, penalty=penalty,
                   evidence=evidence)


# ---------------------------------------------------------------- the rerank hook


@dataclass(frozen=True)
class ExcludedTexts:
    """What :meth:`ExclusionRerank.prepare` stores in ``EncodedQueries.extra["exclude"]``.

    Attributes:
        text: DiCoSA vectors of every exclusion of the batch, ``[E, D]``.
        owner: ``[E]`` long, the query each exclusion belongs to (in the query's order).
        codes: ``[E, d]`` concept codes of the exclusions (None without a concepts head).
        positive_codes: ``[Q, d]`` concept codes of the queries' own text (None likewise).
    """

    text: TextFeatures
    owner: Tensor
    codes: Tensor | None = None
    positive_codes: Tensor | None = None


@dataclass(frozen=True)
class Demotions:
    """What the demote rule found among one query's checked candidates; the hook keeps one
    per query in ``EncodedQueries.extra["exclusion"]`` so that explaining a result reads it
    instead of scoring the windows again.

    Attributes:
        rows: ``[n]`` int64 the checked candidates (store row ids).
        frames: ``[E_q, n]`` penalty from each exclusion's best window (zeros: check off).
        codes: ``[E_q, n]`` penalty from each exclusion's code similarity (zeros: off).
        presence: ``[E_q, n]`` each exclusion's best window score (None: check off).
        starts: ``[E_q, n]`` where that window starts (frame index).
        similarity: ``[E_q, n]`` code(v) · code(B) (None: codes' term off).
        threshold: the presence threshold, ρ · the best S(A) among the candidates.
    """

    rows: np.ndarray
    frames: Tensor
    codes: Tensor
    presence: Tensor | None
    starts: Tensor | None
    similarity: Tensor | None
    threshold: float

    @property
    def penalty(self) -> Tensor:
        """``[n]`` what the rule took off each checked candidate's score."""
        return self.frames.sum(0) + self.codes.sum(0)


class ExclusionRerank:
    """"A without B" as a :class:`~dicosa.search.types.RerankHook` over DiCoSA's rescored
    candidates.

    ``config.method="demote"`` (default): the ``config.depth`` best candidates by DiCoSA's
    S(A) are checked for B (each exclusion's best window; the codes' similarity if its
    threshold is finite) and lose what :func:`demotions` says; every other score is left as
    it was, so the ranking is the plain query's wherever there is no evidence of B.

    ``config.method="tiers"``: each candidate gets a tier and the adjusted scores order the
    tiers first and DiCoSA's score within a tier: +1 if the codes are on and the candidate is
    not among the ``config.candidates`` largest magnitudes on D_A \\ D_B (the paper's
    retrieval, D_A and D_B from the top ``config.top_k_results`` of the candidates given);
    +2 if B's best window reaches ``config.presence_threshold``.

    Queries without exclusions keep their scores.

    Args:
        config: the method and its settings (choose them on validation;
            ``benchmarks/exclusion.py`` does).
        head: the trained concepts head (``load_head(path, model, kind="concepts")``).
        video_codes: ``ids [n] int64 -> [n, d]`` the head's codes of those rows, i.e. what the
            index stored per row from ``head.encode_videos(VideoFeatures)``.
        model: the frozen DiCoSA, for the per-frame check.
        video_frames: ``ids [n] int64 -> VideoFeatures [n, N, D]`` from the frame store.
    """

    name = "exclusion"

    def __init__(self, config: ExclusionConfig = ExclusionConfig(), *,
                 head: ConceptCodes | None = None,
                 video_codes: Callable[[np.ndarray], Tensor] | None = None,
                 model: DiCoSA | None = None,
                 video_frames: Callable[[np.ndarray], VideoFeatures] | None = None):
        if (head is None) != (video_codes is None):
            raise ValueError("the codes need both head and video_codes")
        if (model is None) != (video_frames is None):
            raise ValueError("the per-frame check needs both model and video_frames")
        self.config, self.head, self.video_codes = config, head, video_codes
        self.model, self.video_frames = model, video_frames
        if config.method == "demote" and video_frames is None and not self.uses_codes:
            raise ValueError("the demote rule needs the per-frame check (model, video_frames) "
                             "or the codes (head, video_codes, a finite code_threshold)")
        if config.method == "tiers" and head is None and not self.uses_frames:
            raise ValueError("ExclusionRerank needs the codes (head, video_codes) or the "
                             "per-frame check (model, video_frames, a finite presence_threshold)")

    @property
    def uses_frames(self) -> bool:
        """Whether the per-frame check runs (tiers: only with a finite presence threshold)."""
        if self.video_frames is None:
            return False
        return self.config.method == "demote" or not math.isinf(self.config.presence_threshold)

    @property
    def uses_codes(self) -> bool:
        """Whether the demote rule's codes term runs."""
        return self.head is not None and not math.isinf(self.config.code_threshold)

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
        records: dict[int, Demotions] = {}
        for q in range(len(queries)):
            mine = excluded.owner == q
            row_ids = np.asarray(ids[q])
            valid = row_ids >= 0
            if not mine.any() or not scores[q][torch.from_numpy(valid).to(
                    scores.device)].isfinite().any():
                continue
            if self.config.method == "demote":
                records[q] = self._demote(excluded, mine, row_ids, scores[q], adjusted[q])
            else:
                self._tier(excluded, q, mine, row_ids, valid, scores[q], adjusted[q])
        queries.extra["exclusion"] = records
        return adjusted

    def rerank_matrix(self, queries: EncodedQueries, scores: Tensor) -> Tensor:
        """The exhaustive path: DiCoSA's ``scores [Q, V]`` over rows 0..V-1, adjusted."""
        ids = np.broadcast_to(np.arange(scores.shape[1], dtype=np.int64), scores.shape)
        return self(queries, ids, scores)

    def _demote(self, excluded: ExcludedTexts, mine: Tensor, row_ids: np.ndarray,
                scores: Tensor, adjusted: Tensor) -> Demotions:
        """Check the ``depth`` best candidates of one query; lower ``adjusted`` in place."""
        ranked = scores.masked_fill(torch.from_numpy(row_ids < 0).to(scores.device),
                                    float("-inf"))
        finite = int(ranked.isfinite().sum())
        cols = ranked.topk(min(self.config.depth, finite)).indices  # [n] columns, best first
        rows = row_ids[cols.cpu().numpy()]
        positive = scores[cols].float().cpu()  # [n]
        presence = starts = similarity = None
        if self.video_frames is not None:
            presence, starts = best_windows(self.model, excluded.text[mine],
                                            self.video_frames(rows), self.config.window)
            presence, starts = presence.cpu(), starts.cpu()
        if self.uses_codes:
            similarity = excluded.codes[mine].float() @ self.video_codes(rows).float().T
        frames, codes, threshold = demotions(positive, presence, self.config, similarity)
        record = Demotions(rows, frames, codes, presence, starts, similarity, threshold)
        adjusted[cols] = scores[cols] - record.penalty.to(scores)
        return record

    def _tier(self, excluded: ExcludedTexts, q: int, mine: Tensor, row_ids: np.ndarray,
              valid: np.ndarray, scores: Tensor, adjusted: Tensor) -> None:
        """The paper's tiers for one query (class docstring); lowers ``adjusted`` in place."""
        cfg, rows = self.config, row_ids[valid]
        tiers = torch.zeros(len(rows), dtype=torch.long)  # [n]
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
        where = torch.from_numpy(valid).to(scores.device)
        ranked = scores[where]
        finite = ranked[ranked.isfinite()]
        spread = float(finite.max() - finite.min()) + 1.0 if len(finite) else 1.0
        adjusted[where] = ranked - tiers.to(ranked) * spread

    @torch.no_grad()
    def explain(self, queries: EncodedQueries, q: int, candidates: np.ndarray,
                results: np.ndarray) -> list[ExclusionExplanation]:
        """Why each of ``results`` answered query ``q`` of the last call.

        Every explanation carries the evidence of each B (best window with its frames, code
        similarity), its threshold and the penalty it cost (demote), or B's best window and
        whether the filter's tier moved it (tiers). With the concepts head it also names the
        D_A \\ D_B dimensions the result carries and the D_B dimensions empty in it, D_A and
        D_B taken from ``candidates`` (the ids the hook ranked)."""
        excluded = self._excluded(queries)
        mine = excluded.owner == q
        results = np.asarray(results)
        base = self._dimensions(excluded, q, mine, np.asarray(candidates), results)
        if self.config.method == "demote":
            record = (queries.extra.get("exclusion") or {}).get(q)
            if record is None:
                raise ValueError("explain explains the hook's last ranking: call the hook on "
                                 "these queries first")
            names = list(queries.queries[q].exclude)
            return [with_evidence(e, record, names, r, self.config.window,
                                  self.config.code_threshold)
                    for e, r in zip(base, results, strict=True)]
        if not self.uses_frames:
            return base
        presence = self._presence(excluded, mine, results)
        threshold = self.config.presence_threshold
        return [replace(e, presence=float(p), demoted=bool(p >= threshold))
                for e, p in zip(base, presence, strict=True)]

    def _dimensions(self, excluded: ExcludedTexts, q: int, mine: Tensor,
                    candidates: np.ndarray, results: np.ndarray) -> list[ExclusionExplanation]:
        """The codes' part of the explanations (empty lists without the head)."""
        if self.head is None:
            return [ExclusionExplanation([], [], []) for _ in results]
        dims = exclusion_dimensions(self.video_codes(candidates), excluded.positive_codes[q],
                                    excluded.codes[mine], self.config.top_k_results,
                                    self.config.mass_fraction)
        return explain_exclusion(self.video_codes(results), dims)

    def _excluded(self, queries: EncodedQueries) -> ExcludedTexts:
        excluded = queries.extra.get("exclude")
        if not isinstance(excluded, ExcludedTexts):
            raise ValueError('call ExclusionRerank.prepare(queries, model, tokenizer) first: '
                             'queries.extra["exclude"] is missing')
        return excluded

    def _presence(self, excluded: ExcludedTexts, mine: Tensor, rows: np.ndarray) -> Tensor:
        """B's best window score in each row, the largest over the query's exclusions: [n]."""
        video = self.video_frames(rows)
        return window_presence(self.model, excluded.text[mine], video,
                               self.config.window).amax(dim=0).cpu()
