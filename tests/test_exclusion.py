"""Exclusion ranking (paper 003, Sec. 4.3) and the per-frame presence check."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dicosa.metrics import ranked_list_metrics
from dicosa.model import TextFeatures, VideoFeatures
from dicosa.search.exclusion import (
    ExcludedTexts,
    ExclusionConfig,
    ExclusionDimensions,
    ExclusionRerank,
    active_dimensions,
    best_windows,
    demote,
    demotions,
    exclusion_dimensions,
    explain_exclusion,
    magnitude_scores,
    window_presence,
)
from dicosa.search.exclusion_explained import describe_evidence
from dicosa.search.query import Query
from dicosa.search.types import EncodedQueries

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
        scores, starts = best_windows(model, text, VideoFeatures(frames, mask), window)
        expected = torch.full((2, 3), float("-inf"))
        where = torch.zeros(2, 3, dtype=torch.long)
        for v in range(3):
            for start in range(5 - window + 1):
                part = VideoFeatures(frames[v:v + 1, start:start + window],
                                     mask[v:v + 1, start:start + window])
                if part.frame_mask.any():
                    score = model.score(text, part)[:, 0]
                    where[:, v] = torch.where(score > expected[:, v], start, where[:, v])
                    expected[:, v] = torch.maximum(expected[:, v], score)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scores, got)
        assert starts.tolist() == where.tolist()


A, B = "red circle", "blue square"


@pytest.fixture(scope="module")
def scene():
    """A red circle without a blue square, where some videos show the square in one frame
    only: the codes (whole-video proxy) cannot see it, the per-frame check can."""
    others = ["green cross", "white cross", "green circle", "white circle"]
    scenes = ([[A, o] for o in others]                      # 0-3: the answers
              + [[A, B], [A, B]]                            # 4-5: the square throughout
              + [[A, B], [A, B]]                            # 6-7: the square in frame 0 only
              + [s for s in random_scenes(40, seed=5) if A not in s])
    visible = {6: {B: [0]}, 7: {B: [0]}}
    videos = [scene_video(s, visible=visible.get(i), seed=100 + i) for i, s in enumerate(scenes)]
    collection = split(scenes, videos, seed=3).video
    return {"model": scorer_model(), "head": trained_head()[1], "collection": collection,
            "queries": text_vectors([[A], [B]]),
            "contains_b": torch.tensor([B in s for s in scenes]),
            "relevant": torch.tensor([A in s and B not in s for s in scenes])}


def test_exclusion_search_end_to_end_on_tiny_features(scene):
    model, head, collection = scene["model"], scene["head"], scene["collection"]
    queries, contains_b = scene["queries"], scene["contains_b"]
    codes = head.video_codes(collection.frames, collection.frame_mask)
    query_codes = head.text_codes(queries, [article(A), article(B)])
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
    assert ranked_list_metrics(top[None], scene["relevant"][None], k=4)["AP@4"] == 1.0
    # Explanations: every answer matched some of D_A \\ D_B.
    assert all(e.matched for e in explain_exclusion(codes[top], dims))
    assert F.cosine_similarity(query_codes[0], query_codes[1], dim=0) < 0.9


def scene_queries(scene, *queries: Query) -> EncodedQueries:
    """Encoded queries over the scene's vectors: A's text for every query, B's for every
    exclusion (what prepare() stores, with the scene's vectors instead of a text tower's)."""
    head, text = scene["head"], scene["queries"]
    encoded = EncodedQueries(list(queries), TextFeatures(text[[0] * len(queries)]))
    owner = torch.tensor([i for i, q in enumerate(queries) for _ in q.exclude], dtype=torch.long)
    excluded = text[[1] * len(owner)]
    encoded.extra["exclude"] = ExcludedTexts(
        TextFeatures(excluded), owner, head.text_codes(excluded, [article(B)] * len(owner)),
        head.text_codes(encoded.text.text, [article(A)] * len(queries)))
    return encoded


def hook(scene, **settings) -> ExclusionRerank:
    frames, codes = scene["collection"], scene["head"].encode_videos(scene["collection"])
    use_codes, use_frames = settings.pop("codes", True), settings.pop("frames", True)
    return ExclusionRerank(
        ExclusionConfig(**settings),
        head=scene["head"] if use_codes else None,
        video_codes=(lambda ids: codes[torch.from_numpy(ids)]) if use_codes else None,
        model=scene["model"] if use_frames else None,
        video_frames=(lambda ids: frames[torch.from_numpy(ids)]) if use_frames else None)


@pytest.mark.paths
def test_rerank_hook_matches_the_pipeline_and_spares_plain_queries(scene):
    model, collection = scene["model"], scene["collection"]
    dicosa = model.score(TextFeatures(scene["queries"][:1]), collection).float()  # [1, V]
    queries = scene_queries(scene, Query(A, (B,)), Query(A))
    scores = dicosa.expand(2, -1).contiguous()
    rerank = hook(scene, method="tiers", top_k_results=5, mass_fraction=0.5, candidates=12,
                  window=1, presence_threshold=0.5)
    adjusted = rerank.rerank_matrix(queries, scores)
    order = adjusted[0].argsort(descending=True)
    assert sorted(order[:4].tolist()) == [0, 1, 2, 3]  # the answers, as the pipeline found
    # The pipeline by hand: top-12 magnitude reranked by S(A), then the square demoted.
    codes = scene["head"].encode_videos(collection)
    dims = exclusion_dimensions(codes, queries.extra["exclude"].positive_codes[0],
                                queries.extra["exclude"].codes, 5, 0.5)
    candidates = magnitude_scores(codes, dims.kept).topk(12).indices
    reranked = candidates[dicosa[0, candidates].argsort(descending=True)]
    present = window_presence(model, TextFeatures(scene["queries"][1:]),
                              collection[reranked], 1)[0] >= 0.5
    expected = demote(reranked, present).tolist()
    clean = int((~present).sum())
    assert order[:clean].tolist() == expected[:clean]
    # Past them the hook puts videos outside the 12 but without B before those with B; among
    # the 12 the order is the pipeline's.
    assert [i for i in order.tolist() if i in expected] == expected
    torch.testing.assert_close(adjusted[1], scores[1], rtol=0, atol=0)  # no exclusion
    # Padded slots (-1) stay -inf and the ranked ones keep their relative order per tier.
    ids = np.array([[0, 4, 1, -1]])
    some = rerank(scene_queries(scene, Query(A, (B,))), ids,
                  torch.tensor([[0.2, 0.9, 0.1, -torch.inf]]))
    assert some[0, 3] == -torch.inf and some[0, 0] > some[0, 2] > some[0, 1]


def test_rerank_hook_per_frame_alone_and_codes_alone(scene):
    dicosa = scene["model"].score(TextFeatures(scene["queries"][:1]), scene["collection"])
    queries = scene_queries(scene, Query(A, (B,)))
    relevant = scene["relevant"][None]

    def ap(rerank):
        order = rerank.rerank_matrix(queries, dicosa.float()).argsort(descending=True)
        return ranked_list_metrics(order, relevant, k=4)["AP@4"]

    plain = ranked_list_metrics(dicosa.argsort(descending=True), relevant, k=4)["AP@4"]
    frames_only = ap(hook(scene, method="tiers", codes=False, window=1, presence_threshold=0.5))
    assert frames_only == 1.0 > plain
    # The codes alone (one proxy per video) cannot see a square shown in one frame: videos 6
    # and 7 stay on top; the square shown throughout (video 4, 8th by S(A)) leaves the 12.
    codes_only = hook(scene, method="tiers", frames=False, top_k_results=5, mass_fraction=0.5,
                      candidates=12)
    order = codes_only.rerank_matrix(queries, dicosa.float()).argsort(descending=True)[0]
    assert sorted(order[:2].tolist()) == [6, 7] and 4 not in order[:12].tolist()
    assert 4 in dicosa.argsort(descending=True)[0, :8].tolist()
    with pytest.raises(ValueError, match="per-frame check"):
        hook(scene, method="tiers", codes=False)  # no threshold: nothing would happen
    with pytest.raises(ValueError, match="per-frame check"):
        hook(scene, frames=False, code_threshold=float("inf"))  # demote with nothing to see
    with pytest.raises(ValueError, match="prepare"):
        hook(scene)(EncodedQueries([Query(A, (B,))], TextFeatures(
            scene["queries"][:1])), np.zeros((1, 1), dtype=np.int64), torch.zeros(1, 1))


def test_explain_names_matched_and_empty_excluded_dimensions(scene):
    rerank = hook(scene, method="tiers", top_k_results=5, mass_fraction=0.5, candidates=12,
                  window=1, presence_threshold=0.5)
    queries = scene_queries(scene, Query(A, (B,)))
    ids = np.arange(len(scene["relevant"]))
    explained = rerank.explain(queries, 0, ids, ids[:8])
    assert all(e.matched for e in explained[:4])
    assert [e.demoted for e in explained] == [False] * 4 + [True] * 4


def test_prepare_encodes_each_exclusion_once_with_its_owner():
    from dicosa.clip import get_tokenizer

    model = scorer_model()
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    queries = [Query("a red circle", ("a blue square", "a cross")), Query("a square"),
               Query("a dog", ("a cat",))]
    encoded = EncodedQueries(queries, model.encode_text(tokenize([q.text for q in queries])))
    rerank = ExclusionRerank(ExclusionConfig(presence_threshold=0.5), model=model,
                             video_frames=lambda ids: None)
    rerank.prepare(encoded, model, tokenize)
    excluded = encoded.extra["exclude"]
    assert excluded.owner.tolist() == [0, 0, 2] and excluded.codes is None
    expected = model.encode_text(tokenize(["a blue square", "a cross", "a cat"])).text
    torch.testing.assert_close(excluded.text.text, expected)


# ---------------------------------------------------------------- the demote rule (default)


def test_demotions_take_off_only_what_the_evidence_of_b_exceeds():
    positive = torch.tensor([0.9, 0.8, 0.5, 0.3])
    presence = torch.tensor([[0.1, 0.6, 0.2, 0.7],    # B1's best window in each candidate
                             [0.0, 0.0, 0.5, 0.0]])   # B2's
    config = ExclusionConfig(presence_ratio=0.5, demotion=2.0, code_threshold=float("inf"))
    frames, codes, threshold = demotions(positive, presence, config)
    assert threshold == pytest.approx(0.45)  # ρ · the best S(A)
    torch.testing.assert_close(frames, torch.tensor([[0.0, 0.3, 0.0, 0.5],
                                                     [0.0, 0.0, 0.1, 0.0]]))
    assert not codes.any()  # the codes' term is off while its threshold is infinite
    similarity = torch.tensor([[0.2, 0.0, 0.0, 0.05], [0.0, 0.0, 0.0, 0.3]])
    assert not demotions(positive, presence, config, similarity)[1].any()
    coded = replace(config, code_threshold=0.1, code_weight=3.0)
    torch.testing.assert_close(demotions(positive, None, coded, similarity)[1],
                               torch.tensor([[0.3, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.6]]))
    assert demotions(positive, None, coded, similarity)[0].shape == (2, 4)  # no frames: zeros
    # Padded candidates (-inf) neither set the threshold nor get a penalty.
    padded = torch.tensor([0.9, -torch.inf])
    _, _, t = demotions(padded, torch.tensor([[0.0, 0.9]]), config)
    assert t == pytest.approx(0.45)


def test_clips_without_evidence_keep_their_order_and_never_lose_a_place():
    g = torch.Generator().manual_seed(3)
    positive = torch.rand(200, generator=g)
    presence = torch.rand(2, 200, generator=g)
    frames, codes, _ = demotions(positive, presence, ExclusionConfig(presence_ratio=0.7))
    penalty = frames.sum(0) + codes.sum(0)
    assert (penalty > 0).any() and (penalty == 0).any()
    plain = positive.argsort(descending=True)
    adjusted = (positive - penalty).argsort(descending=True)
    kept = penalty == 0
    assert adjusted[kept[adjusted]].tolist() == plain[kept[plain]].tolist()
    place = {int(v): i for i, v in enumerate(adjusted)}
    assert all(place[int(v)] <= i for i, v in enumerate(plain) if kept[v])


def test_exclusion_config_rejects_impossible_settings():
    for bad in ({"window": 0}, {"depth": 0}, {"demotion": -1.0}, {"demotion": float("inf")},
                {"code_weight": float("nan")}, {"presence_ratio": float("nan")},
                {"method": "filter"}):
        with pytest.raises(ValueError, match="exclusion"):
            ExclusionConfig(**bad)


def test_demote_hook_is_the_rule_over_its_checked_candidates(scene):
    model, collection = scene["model"], scene["collection"]
    dicosa = model.score(TextFeatures(scene["queries"][:1]), collection).float()  # [1, V]
    queries = scene_queries(scene, Query(A, (B,)), Query(A))
    settings = dict(window=1, presence_ratio=0.4, demotion=4.0, depth=20)
    rerank = hook(scene, **settings, code_threshold=float("inf"))
    adjusted = rerank.rerank_matrix(queries, dicosa.expand(2, -1).contiguous())
    # By hand: the 20 best by S(A) lose 4 · max(0, S(B, best frame) - 0.4 · max S(A)).
    checked = dicosa[0].topk(20).indices
    presence = window_presence(model, TextFeatures(scene["queries"][1:]),
                               collection[checked], 1)[0]
    expected = dicosa[0].clone()
    expected[checked] -= 4 * (presence - 0.4 * dicosa.max()).clamp_min(0)
    torch.testing.assert_close(adjusted[0], expected, rtol=1e-5, atol=1e-5)
    # With the codes' term: each also loses 3 · max(0, code(v) · code(B) - 0.02).
    coded = hook(scene, **settings, code_threshold=0.02, code_weight=3.0)
    similarity = scene["head"].encode_videos(collection[checked]) @ queries.extra[
        "exclude"].codes[0]
    with_codes = expected.clone()
    with_codes[checked] -= 3 * (similarity - 0.02).clamp_min(0)
    assert (similarity > 0.02).any()
    torch.testing.assert_close(coded.rerank_matrix(queries, dicosa.expand(2, -1).contiguous())[0],
                               with_codes, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adjusted[1], dicosa[0], rtol=0, atol=0)  # no exclusion
    order = adjusted[0].argsort(descending=True)
    assert sorted(order[:4].tolist()) == [0, 1, 2, 3]  # the answers; every A-and-B demoted
    # Explanations: the evidence, its window and what it cost, from the call's record.
    plain = dicosa[0].argsort(descending=True)[:8]  # the A-and-B clips among them
    explained = rerank.explain(queries, 0, np.arange(len(dicosa[0])), plain.numpy())
    for e, v in zip(explained, plain.tolist(), strict=True):
        (frames,) = [x for x in e.evidence if x.source == "frames"]
        assert frames.exclusion == B and 0 <= frames.frames[0] <= 3  # the Query says "B"
        assert e.penalty == pytest.approx(float(dicosa[0, v] - adjusted[0, v]), abs=1e-5)
        assert e.demoted == (e.penalty > 0) == scene["contains_b"][v]
        assert describe_evidence(e).startswith("demoted by" if e.demoted else "kept its place")
    assert any(e.demoted for e in explained) and not all(e.demoted for e in explained)
    beyond = dicosa[0].argsort(descending=True)[-1:].numpy()  # past the checked depth
    (unchecked,) = rerank.explain(queries, 0, np.arange(len(dicosa[0])), beyond)
    assert unchecked.penalty == 0.0 and not unchecked.evidence
    assert describe_evidence(unchecked).startswith("not checked")
    with pytest.raises(ValueError, match="call the hook"):
        rerank.explain(scene_queries(scene, Query(A, (B,))), 0, beyond, beyond)


def test_demote_hook_leaves_pads_and_unscored_rows_alone(scene):
    rerank = hook(scene)
    queries = scene_queries(scene, Query(A, (B,)))
    nothing = torch.tensor([[-torch.inf, -torch.inf]])
    out = rerank(queries, np.array([[4, -1]]), nothing)  # no finite score: nothing to check
    assert out.isneginf().all() and queries.extra["exclusion"] == {}
    some = rerank(queries, np.array([[4, 0, -1]]), torch.tensor([[0.9, 0.8, -torch.inf]]))
    assert some[0, 2] == -torch.inf and some[0, 1] == 0.8  # 0: A without B keeps its score
    assert some[0, 0] < 0.8  # 4: A with B throughout, demoted behind it
    assert queries.extra["exclusion"][0].rows.tolist() == [4, 0]
