"""Metrics of moment retrieval: which *time range* of which video answers a caption.

Three tasks, as TVR defines them (Lei et al., "TVR: A Large-Scale Dataset for Video-Subtitle
Moment Retrieval", ECCV 2020, Sec. 4 and its standalone evaluation), all read from one ranked
list of predicted moments ``(video_id, start, end[, score])`` per query:

- **VCMR** (video-corpus moment retrieval): R@k at tIoU >= t is the percentage of queries
  with at least one *hit* among the first k moments of the list; a hit is a moment of the
  right video whose temporal IoU with the ground truth reaches t. Moments of other videos
  never count, whatever their times.
- **SVMR** (single-video moment retrieval, "within-video"): the same list restricted to the
  right video's moments, in their order; R@1 at tIoU >= t asks whether the first of them is a
  hit. A list that holds no moment of the right video is a miss (counted apart as
  ``num_right_video_absent``): a ranking cut short is not forgiven.
- **VR** (video retrieval): the list read as videos, each at the position of its first
  moment (duplicates dropped); R@k is the percentage of queries whose right video is among
  the first k distinct videos.

Several annotators (DiDeMo)
---------------------------
DiDeMo (Hendricks et al., "Localizing Moments in Video with Natural Language", ICCV 2017)
gives each caption about four annotators' ranges. Its own single-video protocol ranks 21
fixed candidate moments and averages the best three of the four annotators' ranks, which
does not extend to free time ranges in a corpus. The corpus variant (Escorcia et al.,
"Temporal Localization of Moments in Video Collections with Natural Language", 2019, and
TVR's DiDeMo evaluation) is the rule used here: with A >= 2 annotations a moment is a hit
when its tIoU reaches t with **at least two** of them; with a single annotation, with that
one. ``min(2, A)`` agreeing annotators, in short.

Temporal IoU
------------
``|a ∩ b| / |a ∪ b|`` of closed ranges in seconds. A zero-length range has IoU 0 with every
range, itself included (its measure is zero, and a point can never reach a positive
threshold), so an empty prediction never counts. Disjoint ranges have IoU exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "MOMENT_KS",
    "MOMENT_THRESHOLDS",
    "evaluate_moments",
    "evaluate_rankings",
    "format_moment_table",
    "moment_hits",
    "temporal_iou",
]

MOMENT_KS: tuple[int, ...] = (1, 5, 10)
MOMENT_THRESHOLDS: tuple[float, ...] = (0.5, 0.7)

# One predicted moment: (video_id, start, end) or (video_id, start, end, score), best first.
Prediction = tuple[str, float, float] | tuple[str, float, float, float]
# One query's ground truth: (video_id, start, end), or (video_id, [(start, end), ...]) with
# one range per annotator.
Truth = tuple[str, float, float] | tuple[str, Sequence[tuple[float, float]]]
Ranker = Callable[[list[str]], list[list[tuple[str, float, float, float]]]]


# ---------------------------------------------------------------- temporal IoU


def _iou(a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray,
         b_end: np.ndarray) -> np.ndarray:
    """Broadcast IoU of ranges ``[a_start, a_end]`` and ``[b_start, b_end]`` (any shapes)."""
    inter = np.clip(np.minimum(a_end, b_end) - np.maximum(a_start, b_start), 0.0, None)
    union = (a_end - a_start) + (b_end - b_start) - inter
    # union == 0 only when both ranges are zero-length: IoU 0 (see the module docstring).
    return np.divide(inter, union, out=np.zeros(np.broadcast(inter, union).shape),
                     where=union > 0)


def _as_ranges(ranges: np.ndarray | Sequence, what: str) -> np.ndarray:
    """``[n, 2]`` float64 of ``ranges`` (one ``(start, end)`` pair or a list of them), checked."""
    out = np.asarray(ranges, dtype=np.float64)
    if out.size == 0:
        out = out.reshape(0, 2)
    elif out.shape == (2,):
        out = out[None]
    if out.ndim != 2 or out.shape[1] != 2:
        raise ValueError(f"{what} must have shape [n, 2], got {out.shape}")
    if not np.isfinite(out).all():
        raise ValueError(f"{what} holds a NaN or infinite time")
    if (out[:, 1] < out[:, 0]).any():
        i = int(np.argmax(out[:, 1] < out[:, 0]))
        raise ValueError(f"{what}[{i}] ends before it starts: {out[i].tolist()}")
    return out


def temporal_iou(a: np.ndarray | Sequence, b: np.ndarray | Sequence) -> np.ndarray:
    """Temporal IoU of every range of ``a`` with every range of ``b``.

    Args:
        a: ``[n, 2]`` ``(start, end)`` in seconds, ``end >= start``.
        b: ``[m, 2]`` likewise.

    Returns:
        ``[n, m]`` float64 in [0, 1]; zero-length ranges and disjoint pairs give exactly 0,
        equal ranges of positive length exactly 1.
    """
    a, b = _as_ranges(a, "a"), _as_ranges(b, "b")
    return _iou(a[:, None, 0], a[:, None, 1], b[None, :, 0], b[None, :, 1])


# ---------------------------------------------------------------- hits of padded rankings


def moment_hits(
    pred_video: np.ndarray,
    pred_range: np.ndarray,
    true_video: np.ndarray,
    true_range: np.ndarray,
    threshold: float,
) -> np.ndarray:
    """Which predicted moments are hits (right video, tIoU >= threshold with enough annotators).

    Args:
        pred_video: ``[Q, L]`` int, the video of each ranked moment; ``-1`` is an empty slot.
        pred_range: ``[Q, L, 2]`` float, its ``(start, end)`` in seconds.
        true_video: ``[Q]`` int, the right video of each query (>= 0).
        true_range: ``[Q, A, 2]`` float, the annotators' ranges; a row of NaN is no annotator
            (queries with fewer than A annotations are padded so).

    Returns:
        ``[Q, L]`` bool: the moment is in the right video and its tIoU reaches ``threshold``
        with at least ``min(2, a_q)`` of the query's ``a_q`` annotations.
    """
    present = ~np.isnan(true_range[..., 0])  # [Q, A]
    need = np.minimum(2, present.sum(1))  # [Q]
    iou = _iou(pred_range[:, :, None, 0], pred_range[:, :, None, 1],
               np.nan_to_num(true_range[:, None, :, 0]), np.nan_to_num(true_range[:, None, :, 1]))
    agree = ((iou >= threshold) & present[:, None, :]).sum(2)  # [Q, L]
    return (pred_video == true_video[:, None]) & (agree >= need[:, None]) & (need[:, None] > 0)


def _video_ranks(pred_video: np.ndarray, true_video: np.ndarray) -> np.ndarray:
    """``[Q]`` float: 1-based rank of the right video among each list's distinct videos, in
    the order of their first moments; ``inf`` when absent."""
    q, length = pred_video.shape
    if length == 0:
        return np.full(q, np.inf)
    order = np.argsort(pred_video, axis=1, kind="stable")  # equal videos keep list order
    sorted_video = np.take_along_axis(pred_video, order, 1)
    first_sorted = np.ones_like(sorted_video, dtype=bool)
    first_sorted[:, 1:] = sorted_video[:, 1:] != sorted_video[:, :-1]
    first = np.zeros_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, 1)
    first &= pred_video >= 0
    distinct_rank = np.cumsum(first, 1)  # [Q, L]
    right = pred_video == true_video[:, None]
    where = right.argmax(1)
    rank = distinct_rank[np.arange(q), where].astype(np.float64)
    return np.where(right.any(1), rank, np.inf)


# ---------------------------------------------------------------- from python lists to arrays


def _truth_ranges(truth: Truth, i: int) -> tuple[str, np.ndarray]:
    if len(truth) == 3:
        video, start, end = truth
        ranges = [(start, end)]
    elif len(truth) == 2:
        video, ranges = truth
    else:
        raise ValueError(f"truth {i} must be (video, start, end) or (video, ranges)")
    ranges = _as_ranges(ranges, f"truth {i} ({video!r})")
    if len(ranges) == 0:
        raise ValueError(f"truth {i} ({video!r}) has no time range")
    return str(video), ranges


def _ranking_arrays(ranking: Sequence[Prediction], i: int) -> tuple[list[str], np.ndarray]:
    videos = [str(p[0]) for p in ranking]
    times = _as_ranges([p[1:3] for p in ranking], f"ranking {i}")
    scores = np.asarray([p[3] for p in ranking if len(p) > 3], dtype=np.float64)
    if len(scores) not in (0, len(ranking)):
        raise ValueError(f"ranking {i} mixes moments with and without a score")
    if np.isnan(scores).any():
        raise ValueError(f"ranking {i} holds a NaN score")
    if (np.diff(scores) > 0).any():
        j = int(np.argmax(np.diff(scores) > 0)) + 1
        raise ValueError(f"ranking {i} is not best first: moment {j} scores {scores[j]:.6g}, "
                         f"above moment {j - 1}'s {scores[j - 1]:.6g}")
    return videos, times


def _pad(rankings: Sequence[Sequence[Prediction]], truths: Sequence[Truth]):
    """Lists -> (pred_video [Q, L], pred_range [Q, L, 2], true_video [Q], true_range [Q, A, 2])."""
    if len(rankings) != len(truths):
        raise ValueError(f"{len(rankings)} rankings for {len(truths)} truths")
    ids: dict[str, int] = {}
    q = len(truths)
    parsed_truths = [_truth_ranges(t, i) for i, t in enumerate(truths)]
    parsed_rankings = [_ranking_arrays(r, i) for i, r in enumerate(rankings)]
    length = max((len(v) for v, _ in parsed_rankings), default=0)
    annotators = max((len(r) for _, r in parsed_truths), default=1)
    pred_video = np.full((q, length), -1, dtype=np.int64)
    pred_range = np.zeros((q, length, 2))
    true_video = np.empty(q, dtype=np.int64)
    true_range = np.full((q, annotators, 2), np.nan)
    for i, ((video, ranges), (videos, times)) in enumerate(
            zip(parsed_truths, parsed_rankings, strict=True)):
        true_video[i] = ids.setdefault(video, len(ids))
        true_range[i, : len(ranges)] = ranges
        pred_video[i, : len(videos)] = [ids.setdefault(v, len(ids)) for v in videos]
        pred_range[i, : len(videos)] = times
    return pred_video, pred_range, true_video, true_range


# ---------------------------------------------------------------- metrics


def _label(k: int, threshold: float) -> str:
    return f"R@{k},IoU>={threshold:g}"


def evaluate_rankings(
    rankings: Sequence[Sequence[Prediction]],
    truths: Sequence[Truth],
    ks: Sequence[int] = MOMENT_KS,
    thresholds: Sequence[float] = MOMENT_THRESHOLDS,
) -> dict[str, Any]:
    """VCMR, SVMR and VR recalls of ranked moment lists (definitions: the module docstring).

    Args:
        rankings: ``[Q]`` lists of ``(video_id, start, end[, score])``, best first; when
            scores are given they must not increase down the list (the list's order is the
            ranking; equal scores keep their list order).
        truths: ``[Q]`` ``(video_id, start, end)`` or ``(video_id, [(start, end), ...])``,
            one range per annotator.
        ks: the cut-offs of VCMR and VR.
        thresholds: the tIoU thresholds of VCMR and SVMR.

    Returns:
        ``{"num_queries", "num_multi_annotator", "num_right_video_absent", "ks",
        "thresholds", "VCMR": {"R@k,IoU>=t": %}, "SVMR": {"R@1,IoU>=t": %},
        "VR": {"R@k": %}}``; percentages of all queries.
    """
    if not truths:
        raise ValueError("no queries to evaluate")
    if any(int(k) < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {list(ks)}")
    pred_video, pred_range, true_video, true_range = _pad(rankings, truths)
    q = len(truths)
    right = pred_video == true_video[:, None]
    first_right = right.argmax(1) if right.shape[1] else np.zeros(q, dtype=np.int64)
    has_right = right.any(1)
    vcmr, svmr = {}, {}
    for t in thresholds:
        hits = moment_hits(pred_video, pred_range, true_video, true_range, float(t))
        for k in ks:
            vcmr[_label(k, t)] = 100.0 * float(hits[:, :k].any(1).mean())
        within = has_right & hits[np.arange(q), first_right] if hits.shape[1] else has_right
        svmr[_label(1, t)] = 100.0 * float(within.mean())
    video_rank = _video_ranks(pred_video, true_video)
    annotators = (~np.isnan(true_range[..., 0])).sum(1)
    return {
        "num_queries": q,
        "num_multi_annotator": int((annotators > 1).sum()),
        "num_right_video_absent": int((~has_right).sum()),
        "ks": [int(k) for k in ks],
        "thresholds": [float(t) for t in thresholds],
        "VCMR": vcmr,
        "SVMR": svmr,
        "VR": {f"R@{k}": 100.0 * float((video_rank <= k).mean()) for k in ks},
    }


def evaluate_moments(
    rank: Ranker,
    queries: Sequence[str],
    truths: Sequence[Truth],
    ks: Sequence[int] = MOMENT_KS,
    thresholds: Sequence[float] = MOMENT_THRESHOLDS,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Rank every query with ``rank`` and measure the lists (see :func:`evaluate_rankings`).

    Args:
        rank: captions -> for each caption its ranked ``(video_id, start, end, score)``
            moments, best first, over the whole collection. It should return at least
            ``max(ks)`` moments, and enough of them that the right video's moments appear
            (SVMR reads the right video's moments from this list).
        queries: ``[Q]`` captions.
        truths: ``[Q]`` ground truths, as :func:`evaluate_rankings` takes them.
        ks, thresholds: as :func:`evaluate_rankings`.
        batch_size: captions per ``rank`` call.

    Returns:
        :func:`evaluate_rankings`'s dict plus ``"min_list_length"``, the shortest list
        ``rank`` returned.
    """
    if len(queries) != len(truths):
        raise ValueError(f"{len(queries)} queries for {len(truths)} truths")
    rankings: list[list] = []
    for start in range(0, len(queries), batch_size):
        batch = list(queries[start : start + batch_size])
        ranked = rank(batch)
        if len(ranked) != len(batch):
            raise ValueError(f"rank returned {len(ranked)} lists for {len(batch)} captions")
        rankings.extend(ranked)
    out = evaluate_rankings(rankings, truths, ks, thresholds)
    out["min_list_length"] = min((len(r) for r in rankings), default=0)
    return out


def format_moment_table(result: dict[str, Any], title: str | None = None) -> str:
    """A plain-text table of :func:`evaluate_rankings`/:func:`evaluate_moments`' result, each
    block saying what it measures and over how many queries."""
    ks, thresholds, q = result["ks"], result["thresholds"], result["num_queries"]
    multi = result["num_multi_annotator"]
    rule = (f"; {multi} with several annotators: a hit agrees with >= 2 of them" if multi
            else "")
    head = "".join(f"{'R@' + str(k):>8}" for k in ks)
    lines = [title] if title else []
    lines += [
        f"{q} queries{rule}",
        "Video-corpus moment retrieval (VCMR): a hit is a moment of the right video whose",
        "temporal IoU with the ground truth reaches the threshold; % of queries with a hit "
        "in the top k",
        f"{'':12}{head}",
    ]
    for t in thresholds:
        row = "".join(f"{result['VCMR'][_label(k, t)]:8.1f}" for k in ks)
        lines.append(f"{'IoU >= ' + format(t, 'g'):12}{row}")
    svmr = "  ".join(f"IoU >= {t:g}: {result['SVMR'][_label(1, t)]:.1f}" for t in thresholds)
    lines += [
        "Within the right video (SVMR R@1): the first of the right video's moments in the list",
        f"{'':12}{svmr}",
        f"{'':12}({result['num_right_video_absent']} of {q} lists hold no moment of the right "
        "video: counted as misses)",
        "Video retrieval (VR): the right video among the first k distinct videos",
        f"{'':12}{head}",
        f"{'':12}" + "".join(f"{result['VR'][f'R@{k}']:8.1f}" for k in ks),
    ]
    if "min_list_length" in result:
        lines.append(f"shortest ranked list: {result['min_list_length']} moments")
    return "\n".join(lines)
