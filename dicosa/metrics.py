"""Retrieval metrics for text-video retrieval.

All functions take a similarity matrix ``sim`` of shape ``[N_t, N_v]`` (captions x videos,
higher = more similar) and ``caption_video`` of shape ``[N_t]`` (long): the index of the
video each caption describes.  One caption per video (MSR-VTT 1k-A) is simply
``caption_video = arange(N_v)``; MSVD has ~40 captions per test video.

Rank convention
---------------
Ranks are 1-based.  With ``ties="optimistic"`` (the default) the rank of a target is
``1 + #{candidates scoring strictly higher}``, so a target tied with other candidates gets the
best position of the tie group.  With ``ties="pessimistic"`` it is
``#{candidates scoring higher or equal}`` (the target included), i.e. the worst position of the
tie group.  Sort-based implementations (argsort of -sim, then find the target) break ties by
whatever order the sort leaves them in, which lies between the two; with continuous
similarities ties are rare and both conventions agree.  Reporting both is a cheap way to see
whether a model collapses many scores onto one value.

Video-to-text with several captions per video
---------------------------------------------
Both conventions in use are reported (``"v2t"`` and ``"v2t_groups"``, docs/training.md):
:func:`ranks_v2t` ranks a video's best caption among *all* captions (ranks up to N_t);
:func:`ranks_v2t_groups` ranks the video's caption *group* among the V groups, each group
scored by its best caption (ranks up to V: the CLIP4Clip / DiCoSA evaluation).

Neither convention needs a full sort: counting the candidates above a threshold is one
comparison per matrix entry, done in row chunks so that memory stays bounded for
27k x 670 (MSVD) or 5k x 5k matrices.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Ties = Literal["optimistic", "pessimistic"]

# Elements of the boolean comparison buffer per chunk (16M -> 16 MiB), independent of N_t.
_DEFAULT_CHUNK_ELEMS = 1 << 24

RECALL_KS: tuple[int, ...] = (1, 5, 10, 50)


def _check_inputs(sim: Tensor, caption_video: Tensor) -> None:
    if sim.dim() != 2:
        raise ValueError(f"sim must be 2-D [N_t, N_v], got shape {tuple(sim.shape)}")
    if caption_video.dim() != 1 or caption_video.shape[0] != sim.shape[0]:
        raise ValueError(
            f"caption_video must have shape [N_t]={sim.shape[0]}, got {tuple(caption_video.shape)}"
        )
    if caption_video.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"caption_video must be an integer tensor, got {caption_video.dtype}")
    if caption_video.numel() and (
        int(caption_video.min()) < 0 or int(caption_video.max()) >= sim.shape[1]
    ):
        raise ValueError("caption_video contains indices outside [0, N_v)")
    # NaN compares False with everything, which would silently give a perfect rank.
    if torch.isnan(sim).any():
        raise ValueError("sim contains NaN")


def _rows_per_chunk(n_cols: int, max_chunk_elems: int) -> int:
    return max(1, max_chunk_elems // max(1, n_cols))


def _count_rank(above: Tensor, ties: Ties) -> Tensor:
    """Turn per-query counts into ranks.

    above: [Q] long — number of candidates with score > target (optimistic) or >= target
        (pessimistic; the target itself is among them).
    """
    return above + 1 if ties == "optimistic" else above


def ranks_t2v(
    sim: Tensor,
    caption_video: Tensor,
    *,
    ties: Ties = "optimistic",
    max_chunk_elems: int = _DEFAULT_CHUNK_ELEMS,
) -> Tensor:
    """Rank of each caption's own video among all videos.

    Args:
        sim: [N_t, N_v] caption x video similarities.
        caption_video: [N_t] long, the ground-truth video of each caption.
        ties: "optimistic" (1 + #strictly higher) or "pessimistic" (#higher-or-equal).
        max_chunk_elems: upper bound on the elements of the temporary comparison buffer.

    Returns:
        [N_t] long, 1-based ranks (1 = own video scored best).
    """
    _check_inputs(sim, caption_video)
    caption_video = caption_video.long()
    target = sim.gather(1, caption_video[:, None])  # [N_t, 1]
    step = _rows_per_chunk(sim.shape[1], max_chunk_elems)
    counts = []
    for start in range(0, sim.shape[0], step):
        rows, tgt = sim[start : start + step], target[start : start + step]
        cmp = rows > tgt if ties == "optimistic" else rows >= tgt
        counts.append(cmp.sum(dim=1))
    if not counts:
        return torch.zeros(0, dtype=torch.long, device=sim.device)
    return _count_rank(torch.cat(counts), ties)


def ranks_v2t(
    sim: Tensor,
    caption_video: Tensor,
    *,
    ties: Ties = "optimistic",
    max_chunk_elems: int = _DEFAULT_CHUNK_ELEMS,
) -> Tensor:
    """For each video, the rank of the best-ranked of its own captions among all captions.

    With several captions per video (MSVD) a video query counts as retrieved at rank r if
    any of its captions is at rank r.  That best caption is the one with the highest score
    for the video, so the rank is computed against ``best[v] = max_{c: video(c)=v} sim[c, v]``.
    (The pessimistic rank of the best caption, #{captions >= best}, is also the minimum of
    the pessimistic ranks of all own captions, since any other own caption scores <= best.)

    Args:
        sim: [N_t, N_v] caption x video similarities (NOT transposed).
        caption_video: [N_t] long, the ground-truth video of each caption; every video must
            have at least one caption.
        ties: see :func:`ranks_t2v`.
        max_chunk_elems: upper bound on the elements of the temporary comparison buffer.

    Returns:
        [N_v] long, 1-based ranks.
    """
    _check_inputs(sim, caption_video)
    caption_video = caption_video.long()
    n_t, n_v = sim.shape
    n_caps = torch.bincount(caption_video, minlength=n_v)
    if (n_caps == 0).any():
        missing = torch.nonzero(n_caps == 0).flatten()[:10].tolist()
        raise ValueError(f"videos without any caption (first few): {missing}")
    own = sim.gather(1, caption_video[:, None]).squeeze(1)  # [N_t]
    best = torch.full((n_v,), float("-inf"), dtype=sim.dtype, device=sim.device)
    best = best.scatter_reduce(0, caption_video, own, reduce="amax", include_self=True)
    step = _rows_per_chunk(n_v, max_chunk_elems)
    above = torch.zeros(n_v, dtype=torch.long, device=sim.device)
    for start in range(0, n_t, step):
        rows = sim[start : start + step]
        cmp = rows > best[None, :] if ties == "optimistic" else rows >= best[None, :]
        above += cmp.sum(dim=0)
    return _count_rank(above, ties)


def ranks_v2t_groups(sim: Tensor, caption_video: Tensor, *, ties: Ties = "optimistic") -> Tensor:
    """For each video, the rank of its own caption group among the V groups, every group
    scored by its best caption for that video (the CLIP4Clip / DiCoSA multi-caption rule).

    Args:
        sim: [N_t, N_v] caption x video similarities (NOT transposed).
        caption_video: [N_t] long; every video must have at least one caption.
        ties: see :func:`ranks_t2v`.

    Returns:
        [N_v] long, 1-based ranks (at most N_v).
    """
    _check_inputs(sim, caption_video)
    caption_video = caption_video.long()
    n_v = sim.shape[1]
    if (torch.bincount(caption_video, minlength=n_v) == 0).any():
        raise ValueError("videos without any caption cannot form a caption group")
    # group_scores[g, v]: the best caption of video g's group for query video v.
    group_scores = torch.full((n_v, n_v), float("-inf"), dtype=sim.dtype, device=sim.device)
    group_scores = group_scores.scatter_reduce(0, caption_video[:, None].expand(-1, n_v), sim,
                                               reduce="amax")
    own = group_scores.diagonal()[None, :]  # [1, N_v]
    above = (group_scores > own if ties == "optimistic" else group_scores >= own).sum(dim=0)
    return _count_rank(above, ties)


def retrieval_metrics(ranks: Tensor) -> dict[str, float | int]:
    """Standard retrieval summary of 1-based ranks.

    Args:
        ranks: [Q] integer ranks, one per query.

    Returns:
        dict with "R@1", "R@5", "R@10", "R@50" (percent of queries with rank <= k),
        "MdR" (median rank; mean of the two middle ranks when Q is even, as numpy does),
        "MnR" (mean rank) and "num_queries".
    """
    if ranks.dim() != 1 or ranks.numel() == 0:
        raise ValueError(f"ranks must be a non-empty 1-D tensor, got shape {tuple(ranks.shape)}")
    r = ranks.double()
    out: dict[str, float | int] = {
        f"R@{k}": float((r <= k).double().mean() * 100.0) for k in RECALL_KS
    }
    s, n = r.sort().values, r.numel()
    # torch.median returns the lower middle element; the literature uses numpy's mean.
    out["MdR"] = float(s[n // 2]) if n % 2 else float((s[n // 2 - 1] + s[n // 2]) / 2)
    out["MnR"] = float(r.mean())
    out["num_queries"] = int(n)
    return out


def evaluate_similarity(
    sim: Tensor,
    caption_video: Tensor | None = None,
    *,
    ties: Ties = "optimistic",
) -> dict[str, dict[str, float | int]]:
    """Text-to-video and video-to-text metrics of one similarity matrix.

    Args:
        sim: [N_t, N_v] caption x video similarities.
        caption_video: [N_t] long ground-truth video per caption; None means one caption per
            video in the same order (requires N_t == N_v).
        ties: see :func:`ranks_t2v`.

    Returns:
        ``{"t2v": retrieval_metrics(...), "v2t": retrieval_metrics(...)}``, and
        ``"v2t_groups"`` (:func:`ranks_v2t_groups`) when some video has several captions.
    """
    if caption_video is None:
        if sim.dim() != 2 or sim.shape[0] != sim.shape[1]:
            raise ValueError("caption_video=None needs a square sim matrix")
        caption_video = torch.arange(sim.shape[0], device=sim.device)
    out = {
        "t2v": retrieval_metrics(ranks_t2v(sim, caption_video, ties=ties)),
        "v2t": retrieval_metrics(ranks_v2t(sim, caption_video, ties=ties)),
    }
    if caption_video.unique().numel() < caption_video.numel():  # several captions a video
        out["v2t_groups"] = retrieval_metrics(ranks_v2t_groups(sim, caption_video, ties=ties))
    return out



# ---------------------------------------------------------------- ranked lists, binary relevance


def ranked_list_metrics(ranking: Tensor, relevant: Tensor, k: int = 10) -> dict[str, float]:
    """MRR@k, NDCG@k and AP@k of ranked lists against binary relevance, averaged over queries.

    Args:
        ranking: ``[Q, L]`` long, item ids best first (L >= k; ids < 0 are empty slots).
        relevant: ``[Q, N]`` bool, the relevant items of each query (each query needs one).
        k: the cut-off.

    With hits h_i (i = 1..k) and R relevant items: MRR@k = 1 / (rank of the first hit) or 0;
    NDCG@k = Σ h_i / log2(i + 1) divided by its best value, Σ_{i <= min(k, R)} 1 / log2(i + 1);
    AP@k = Σ h_i · P@i / min(k, R), so a list holding min(k, R) hits on top scores 1.
    """
    if ranking.dim() != 2 or relevant.dim() != 2 or ranking.shape[0] != relevant.shape[0]:
        raise ValueError(f"ranking [Q, L] and relevant [Q, N] needed, got "
                         f"{tuple(ranking.shape)} and {tuple(relevant.shape)}")
    num_relevant = relevant.sum(1)
    if (num_relevant == 0).any():
        raise ValueError("every query needs at least one relevant item")
    hits = hit_matrix(ranking[:, :k], relevant).double()  # [Q, k]
    position = torch.arange(1, hits.shape[1] + 1, dtype=torch.float64)
    first = torch.where(hits.any(1), hits.argmax(1).double() + 1, torch.inf)
    discount = 1 / torch.log2(position + 1)
    ideal = (discount[None] * (position[None] <= num_relevant[:, None])).sum(1)
    depth = num_relevant.clamp(max=k).double()
    precision = hits.cumsum(1) / position
    return {f"MRR@{k}": float((1 / first).mean()),
            f"NDCG@{k}": float(((hits * discount).sum(1) / ideal).mean()),
            f"AP@{k}": float(((hits * precision).sum(1) / depth).mean())}


def hit_matrix(ranking: Tensor, items: Tensor) -> Tensor:
    """``[Q, L]`` bool: whether each ranked id is among the query's ``items [Q, N]`` (ids < 0,
    empty slots, are never hits)."""
    filled = ranking >= 0
    return items.gather(1, ranking.clamp_min(0)) & filled
