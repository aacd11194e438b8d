"""Moment-retrieval metrics: temporal IoU, VCMR / SVMR / VR recalls on hand-made rankings with
known answers, and the vectorised code against a naive loop on random rankings."""

from __future__ import annotations

import numpy as np
import pytest

from dicosa.moment_metrics import (
    evaluate_moments,
    evaluate_rankings,
    format_moment_table,
    moment_hits,
    temporal_iou,
)

# ---------------------------------------------------------------- temporal IoU


def test_temporal_iou_known_values():
    a = [(0, 10), (2, 4), (3, 3), (0, 1)]
    b = [(5, 15), (0, 10), (3, 3), (1, 2)]
    expected = np.array([
        [5 / 15, 1.0, 0.0, 0.1],  # overlap; equal; a point inside; contained (1 of 10 s)
        [0.0, 0.2, 0.0, 0.0],     # disjoint; contained (2 of 10 s); a point on it; disjoint
        [0.0, 0.0, 0.0, 0.0],     # a zero-length range has IoU 0, with itself too
        [0.0, 0.1, 0.0, 0.0],     # disjoint; contained; disjoint; touching at 1 s
    ])
    iou = temporal_iou(a, b)
    assert iou.shape == (4, 4) and iou.dtype == np.float64
    np.testing.assert_allclose(iou, expected, rtol=1e-15, atol=0)
    assert (iou[expected == 0] == 0).all() and iou[0, 1] == 1.0  # exact, no epsilon
    np.testing.assert_allclose(temporal_iou(b, a), expected.T, rtol=1e-15, atol=0)
    assert temporal_iou([], b).shape == (0, 4) and temporal_iou(a, []).shape == (4, 0)
    assert temporal_iou((1.0, 3.0), (2.0, 4.0)).tolist() == [[1 / 3]]  # one pair


@pytest.mark.parametrize("bad, match", [
    ([(5, 4)], r"a\[0\] ends before it starts"),
    ([(0, float("nan"))], "NaN or infinite"),
    ([(0, 1, 2)], r"shape \[n, 2\]"),
])
def test_temporal_iou_refuses_bad_ranges(bad, match):
    with pytest.raises(ValueError, match=match):
        temporal_iou(bad, [(0, 1)])


# ---------------------------------------------------------------- hand-made rankings

TRUTHS = [
    ("A", 0, 10),
    ("B", 10, 20),
    ("C", [(0, 5), (0, 10), (20, 25), (0, 5)]),  # four annotators
    ("E", 0, 4),
    ("F", 0, 10),
]
RANKINGS = [
    # q0: the right moment first.
    [("A", 0, 10, 0.9), ("B", 10, 20, 0.5)],
    # q1: right times in a wrong video; the right video touching (IoU 0); then IoU 0.8 at 3.
    [("A", 10, 20, 0.9), ("B", 0, 10, 0.8), ("B", 12, 20, 0.7)],
    # q2: [20, 25] agrees with one annotator only (a miss); [0, 6] with three at 0.5
    # (5/6, 0.6, 5/6) and two at 0.7: a hit at rank 3 at both thresholds.
    [("C", 20, 25, 0.9), ("D", 0, 5, 0.8), ("C", 0, 6, 0.7)],
    # q3: nothing returned.
    [],
    # q4: IoU 0.6: a hit at 0.5, not at 0.7.
    [("F", 0, 6, 1.0)],
]


def test_hand_made_rankings_give_the_known_recalls():
    out = evaluate_rankings(RANKINGS, TRUTHS)
    assert out["num_queries"] == 5 and out["num_multi_annotator"] == 1
    assert out["num_right_video_absent"] == 1  # q3
    assert out["VCMR"] == pytest.approx({
        "R@1,IoU>=0.5": 40.0, "R@5,IoU>=0.5": 80.0, "R@10,IoU>=0.5": 80.0,  # q0 q4 | +q1 q2
        "R@1,IoU>=0.7": 20.0, "R@5,IoU>=0.7": 60.0, "R@10,IoU>=0.7": 60.0,  # q0 | +q1 q2
    })
    # Within the right video the first moment decides: q1's is [0, 10], q2's [20, 25].
    assert out["SVMR"] == pytest.approx({"R@1,IoU>=0.5": 40.0, "R@1,IoU>=0.7": 20.0})
    # Distinct videos: q0 A; q1 A, B (rank 2); q2 C; q3 none; q4 F.
    assert out["VR"] == pytest.approx({"R@1": 60.0, "R@5": 80.0, "R@10": 80.0})


def test_two_of_several_annotators_must_agree():
    truth = [("v", [(0, 10), (0, 10), (30, 40), (50, 60)])]
    one = evaluate_rankings([[("v", 30, 40)]], truth, ks=(1,), thresholds=(0.5,))
    two = evaluate_rankings([[("v", 0, 10)]], truth, ks=(1,), thresholds=(0.5,))
    assert one["VCMR"]["R@1,IoU>=0.5"] == 0.0 and two["VCMR"]["R@1,IoU>=0.5"] == 100.0
    # One annotation: that one decides; a threshold reached exactly counts.
    single = evaluate_rankings([[("v", 0, 5)]], [("v", [(0, 10)])], ks=(1,), thresholds=(0.5,))
    assert single["VCMR"]["R@1,IoU>=0.5"] == 100.0


def test_moment_hits_pads_annotators_and_empty_slots():
    pred_video = np.array([[0, -1], [1, 1]])
    pred_range = np.array([[[0, 10], [0, 0]], [[0, 10], [5, 10]]], dtype=float)
    nan = float("nan")
    true_range = np.array([[[0, 10], [nan, nan]], [[0, 10], [5, 10]]])
    hits = moment_hits(pred_video, pred_range, np.array([0, 1]), true_range, 0.5)
    # q1's [0, 10] meets annotator 0 (1.0) and 1 (0.5); [5, 10] meets 1 (1.0) and 0 (0.5).
    assert hits.tolist() == [[True, False], [True, True]]
    assert not moment_hits(pred_video, pred_range, np.array([0, 1]), true_range, 0.51)[1, 0]


# ---------------------------------------------------------------- a naive loop as reference


def _naive(rankings, truths, ks, thresholds):
    def iou(p, g):  # TVR's hull form: the same value wherever the ranges overlap
        inter = max(0.0, min(p[1], g[1]) - max(p[0], g[0]))
        hull = max(p[1], g[1]) - min(p[0], g[0])
        return inter / hull if hull > 0 and inter > 0 else 0.0

    vcmr = {(k, t): 0 for k in ks for t in thresholds}
    svmr = {t: 0 for t in thresholds}
    vr = {k: 0 for k in ks}
    for ranking, truth in zip(rankings, truths, strict=True):
        video, ranges = (truth[0], [truth[1:]]) if len(truth) == 3 else truth

        def hit(p, t, video=video, ranges=ranges):
            agree = sum(iou(p[1:3], r) >= t for r in ranges)
            return p[0] == video and agree >= min(2, len(ranges))

        for t in thresholds:
            for k in ks:
                vcmr[k, t] += any(hit(p, t) for p in ranking[:k])
            within = [p for p in ranking if p[0] == video]
            svmr[t] += bool(within) and hit(within[0], t)
        distinct = list(dict.fromkeys(p[0] for p in ranking))
        for k in ks:
            vr[k] += video in distinct[:k]
    q = len(truths)
    return ({f"R@{k},IoU>={t:g}": 100 * n / q for (k, t), n in vcmr.items()},
            {f"R@1,IoU>={t:g}": 100 * n / q for t, n in svmr.items()},
            {f"R@{k}": 100 * n / q for k, n in vr.items()})


def _random_case(rng: np.random.Generator, num_queries: int):
    videos = [f"v{i}" for i in range(6)]
    half = lambda n: rng.integers(0, 40, size=n) / 2  # noqa: E731 — times on a 0.5-s grid
    truths, rankings = [], []
    for _ in range(num_queries):
        starts = half(int(rng.integers(1, 5)))
        ranges = [(s, s + float(rng.integers(0, 12)) / 2) for s in starts]
        video = videos[int(rng.integers(len(videos)))]
        truths.append((video, ranges) if len(ranges) > 1 or rng.random() < 0.5
                      else (video, *ranges[0]))
        length = int(rng.integers(0, 14))
        moments = [(videos[int(rng.integers(len(videos)))], float(s),
                    float(s + rng.integers(0, 12) / 2)) for s in half(length)]
        for _ in range(int(rng.integers(0, 3)) if length else 0):  # near misses and hits
            s, e = ranges[int(rng.integers(len(ranges)))]
            s, e = s + rng.integers(-2, 3) / 2, e + rng.integers(-2, 3) / 2
            moments[int(rng.integers(length))] = (video, float(min(s, e)), float(max(s, e)))
        scores = np.sort(rng.random(length))[::-1]
        rankings.append([(*m, float(c)) for m, c in zip(moments, scores, strict=True)])
    return rankings, truths


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_metrics_equal_a_naive_loop(seed):
    rankings, truths = _random_case(np.random.default_rng(seed), 60)
    ks, thresholds = (1, 3, 5, 10), (0.3, 0.5, 0.7)
    out = evaluate_rankings(rankings, truths, ks, thresholds)
    vcmr, svmr, vr = _naive(rankings, truths, ks, thresholds)
    assert out["VCMR"] == pytest.approx(vcmr, abs=1e-9)
    assert out["SVMR"] == pytest.approx(svmr, abs=1e-9)
    assert out["VR"] == pytest.approx(vr, abs=1e-9)
    assert 0 < out["VCMR"]["R@10,IoU>=0.3"] < 100  # the random case is not degenerate


# ---------------------------------------------------------------- the driver and bad input


def test_evaluate_moments_calls_rank_in_batches_and_prints_honest_labels():
    captions = [f"caption {i}" for i in range(5)]
    answers = dict(zip(captions, RANKINGS, strict=True))
    calls = []

    def rank(batch: list[str]):
        calls.append(list(batch))
        return [answers[c] for c in batch]

    out = evaluate_moments(rank, captions, TRUTHS, batch_size=2)
    assert calls == [captions[:2], captions[2:4], captions[4:]]
    assert out["VCMR"] == evaluate_rankings(RANKINGS, TRUTHS)["VCMR"]
    assert out["min_list_length"] == 0
    table = format_moment_table(out, title="hand-made")
    assert table.startswith("hand-made\n5 queries; 1 with several annotators")
    assert "IoU >= 0.5      40.0    80.0    80.0" in table
    assert "IoU >= 0.7      20.0    60.0    60.0" in table
    assert "IoU >= 0.5: 40.0  IoU >= 0.7: 20.0" in table
    assert "1 of 5 lists hold no moment of the right video" in table
    assert table.splitlines()[-2].split() == ["60.0", "80.0", "80.0"]  # VR

    with pytest.raises(ValueError, match="rank returned 1 lists for 2 captions"):
        evaluate_moments(lambda b: [[]], captions[:2], TRUTHS[:2])


@pytest.mark.parametrize("rankings, truths, match", [
    ([[("A", 0, 1, 0.1), ("A", 1, 2, 0.2)]], [("A", 0, 1)], "not best first: moment 1"),
    ([[("A", 0, 1, float("nan"))]], [("A", 0, 1)], "NaN score"),
    ([[("A", 2, 1, 0.1)]], [("A", 0, 1)], r"ranking 0\[0\] ends before it starts"),
    ([[]], [("A", [])], "has no time range"),
    ([[]], [("A", 3, 1)], r"truth 0 \('A'\)\[0\] ends before it starts"),
    ([[], []], [("A", 0, 1)], "2 rankings for 1 truths"),
    ([], [], "no queries"),
])
def test_bad_input_is_one_clear_sentence(rankings, truths, match):
    with pytest.raises(ValueError, match=match):
        evaluate_rankings(rankings, truths)


def test_equal_scores_keep_list_order():
    ranking = [("A", 0, 1, 0.5), ("A", 5, 9, 0.5)]
    out = evaluate_rankings([ranking], [("A", 5, 9)], ks=(1, 2))
    assert out["VCMR"]["R@1,IoU>=0.5"] == 0.0 and out["VCMR"]["R@2,IoU>=0.5"] == 100.0
