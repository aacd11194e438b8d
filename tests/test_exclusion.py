"""Exclusion ranking (paper 003, Sec. 4.3) and the per-frame presence check."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dicosa.metrics import ranked_list_metrics
from dicosa.model import TextFeatures, VideoFeatures
from dicosa.search.exclusion import (
    ExclusionDimensions,
    active_dimensions,
    demote,
    exclusion_dimensions,
    explain_exclusion,
    magnitude_scores,
    window_presence,
)

from ._scenes import article, random_scenes, scorer_model, split, text_vectors, trained_head
from ._scenes import video as scene_video

# Codes of four videos over four concept dimensions: 0 "red circle", 1 "blue square".
TOY_CODES = torch.tensor([[1.0, 0.0, 0.0, 0.0],    # A only
                          [0.6, 0.8, 0.0, 0.0],    # A and (mostly) B
                          [0.0, 1.0, 0.0, 0.0],    # B only
                          [0.0, 0.0, 1.0, 0.0]])   # neither


def test_active_dimensions_carry_the_requested_share_of_magnitude():
    codes = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    assert active_dimensions(codes, 0.5).tolist() == [True, False, False, False]
    assert active_dimensions(codes, 0.6).tolist() == [True, True, False, False]
    assert active_dimensions(codes, 1.0).tolist() == [True, True, True, False]  # never a zero
    assert active_dimensions(torch.zeros(2, 3), 0.5).tolist() == [False] * 3
    with pytest.raises(ValueError, match="mass_fraction"):
        active_dimensions(codes, 0.0)


def test_positive_minus_excluded_dimensions_on_a_toy_case():
    a, b = torch.eye(4)[0], torch.eye(4)[1]
    dims = exclusion_dimensions(TOY_CODES, a, b[None], top_k_results=2, mass_fraction=0.7)
    # Top-2 for A: videos 0 and 1, mean |code| (0.8, 0.4): 0.7 of it needs both dimensions.
    assert dims.positive.tolist() == [True, True, False, False]
    # Top-2 for B: videos 2 and 1, mean (0.3, 0.9): dimension 1 alone carries 0.75 > 0.7.
    assert dims.excluded.tolist() == [False, True, False, False]
    assert dims.kept.tolist() == [True, False, False, False]
    # On D_A alone the A-and-B video wins (1.4 > 1.0); on D_A \ D_B the A-only video does.
    assert magnitude_scores(TOY_CODES, dims.positive).argmax() == 1
    torch.testing.assert_close(magnitude_scores(TOY_CODES, dims.kept),
                               torch.tensor([1.0, 0.6, 0.0, 0.0]))
    # Several exclusions: the union of their dimensions is removed.
    two = exclusion_dimensions(TOY_CODES, a, torch.stack([b, torch.eye(4)[2]]), 2, 0.7)
    assert two.excluded[2] and two.excluded[1]


def test_explanations_name_matched_and_empty_dimensions():
    dims = ExclusionDimensions(torch.tensor([True, True, False, False]),
                               torch.tensor([False, True, False, False]))
    first, second = explain_exclusion(TOY_CODES[:2], dims, torch.tensor([0.1, 0.9]), 0.5)
    assert first.matched == [(0, 1.0)] and first.excluded_empty == [1]
    assert first.excluded_active == [] and not first.demoted
    assert first.presence == pytest.approx(0.1)
    assert second.matched == [(0, pytest.approx(0.6))] and second.excluded_empty == []
    assert second.excluded_active == [(1, pytest.approx(0.8))] and second.demoted


def test_demote_keeps_each_group_in_order():
    order = torch.tensor([7, 3, 5, 1, 9])
    present = torch.tensor([False, True, False, True, False])
    assert demote(order, present).tolist() == [7, 5, 9, 3, 1]


def test_ranked_list_metrics_on_a_hand_computed_list():
    ranking = torch.tensor([[3, 1, 2]])
    relevant = torch.tensor([[False, True, True, False]])
    m = ranked_list_metrics(ranking, relevant, k=3)
    assert m["MRR@3"] == pytest.approx(0.5)
    ideal = 1 + 1 / torch.log2(torch.tensor(3.0)).item()
    dcg = 1 / torch.log2(torch.tensor(3.0)).item() + 0.5
    assert m["NDCG@3"] == pytest.approx(dcg / ideal)
    assert m["AP@3"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    # Empty slots (-1) are never hits; a perfect list scores 1.
    perfect = ranked_list_metrics(torch.tensor([[1, 2, -1]]), relevant, k=3)
    assert perfect == {"MRR@3": 1.0, "NDCG@3": 1.0, "AP@3": 1.0}


@pytest.mark.paths
def test_window_presence_equals_scoring_each_window_alone():
    model = scorer_model()
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(3, 5, 64, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False  # padded frames
    mask[2, 1:] = False
    text = TextFeatures(torch.randn(2, 64, generator=g))
    for window in (1, 2, 5):
        got = window_presence(model, text, VideoFeatures(frames, mask), window)
        expected = torch.full((2, 3), float("-inf"))
        for v in range(3):
            for start in range(5 - window + 1):
                part = VideoFeatures(frames[v:v + 1, start:start + window],
                                     mask[v:v + 1, start:start + window])
                if part.frame_mask.any():
                    score = model.score(text, part)[:, 0]
                    expected[:, v] = torch.maximum(expected[:, v], score)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_exclusion_search_end_to_end_on_tiny_features():
    """A red circle without a blue square, where some videos show the square in one frame
    only: the codes (whole-video proxy) cannot see it, the per-frame check can."""
    model, (_, head) = scorer_model(), trained_head()
    a, b = "red circle", "blue square"
    others = ["green cross", "white cross", "green circle", "white circle"]
    scenes = ([[a, o] for o in others]                      # 0-3: the answers
              + [[a, b], [a, b]]                            # 4-5: the square throughout
              + [[a, b], [a, b]]                            # 6-7: the square in frame 0 only
              + [s for s in random_scenes(40, seed=5) if a not in s])
    visible = {6: {b: [0]}, 7: {b: [0]}}
    videos = [scene_video(s, visible=visible.get(i), seed=100 + i) for i, s in enumerate(scenes)]
    collection = split(scenes, videos, seed=3).video
    contains_b = torch.tensor([b in s for s in scenes])

    codes = head.video_codes(collection.frames, collection.frame_mask)
    queries = text_vectors([[a], [b]])
    query_codes = head.text_codes(queries, [article(a), article(b)])
    dims = exclusion_dimensions(codes, query_codes[0], query_codes[1:], 5, 0.5)
    candidates = magnitude_scores(codes, dims.kept).topk(12).indices
    score_a = model.score(TextFeatures(queries[:1]), collection[candidates])[0]
    reranked = candidates[score_a.argsort(descending=True)]
    assert contains_b[reranked[:4]].any()  # the brief squares rank high without the check

    def checked(window):
        presence = window_presence(model, TextFeatures(queries[1:]), collection[reranked],
                                   window)[0]
        return demote(reranked, presence >= 0.5)

    top = checked(window=1)[:4]
    assert sorted(top.tolist()) == [0, 1, 2, 3]
    assert contains_b[checked(window=4)[:4]].any()  # the whole video dilutes the brief square
    relevant = torch.tensor([a in s and b not in s for s in scenes])[None]
    assert ranked_list_metrics(top[None], relevant, k=4)["AP@4"] == 1.0
    # Explanations: every answer matched some of D_A \ D_B.
    assert all(e.matched for e in explain_exclusion(codes[top], dims))
    assert F.cosine_similarity(query_codes[0], query_codes[1], dim=0) < 0.9
