import pytest
import torch

from dicosa.metrics import (
    evaluate_similarity,
    ranks_t2v,
    ranks_v2t,
    ranks_v2t_groups,
    retrieval_metrics,
)


def _reference_ranks_t2v(sim: torch.Tensor, caption_video: torch.Tensor) -> torch.Tensor:
    # Straightforward sort-based reference: position of the own video in the sorted row.
    order = torch.argsort(sim, dim=1, descending=True)
    return (order == caption_video[:, None]).nonzero()[:, 1] + 1


def _reference_ranks_v2t(sim: torch.Tensor, caption_video: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(sim.T, dim=1, descending=True)  # [N_v, N_t] caption indices
    out = []
    for v in range(sim.shape[1]):
        positions = torch.nonzero(caption_video[order[v]] == v).flatten()
        out.append(int(positions.min()) + 1)
    return torch.tensor(out)


def test_perfect_ranking():
    sim = torch.eye(7) + 0.01 * torch.rand(7, 7)
    m = evaluate_similarity(sim)
    for d in ("t2v", "v2t"):
        assert m[d]["R@1"] == 100.0
        assert m[d]["R@5"] == 100.0
        assert m[d]["MdR"] == 1.0
        assert m[d]["MnR"] == 1.0
        assert m[d]["num_queries"] == 7


def test_reversed_ranking():
    # sim[i, j] = |i - j| + 0.001 * j: the own video (distance 0, score <= 0.009) is below
    # every other video (score >= 1) in each row and each column -> rank n everywhere.
    n = 10
    i = torch.arange(n)
    sim = (i[:, None] - i[None, :]).abs().float()
    sim += 0.001 * i[None, :]
    cv = torch.arange(n)
    r = ranks_t2v(sim, cv)
    assert torch.equal(r, torch.full((n,), n))
    m = retrieval_metrics(r)
    assert m["R@1"] == 0.0 and m["R@5"] == 0.0
    assert m["R@10"] == 100.0  # rank n = 10 <= 10
    assert m["MdR"] == 10.0 and m["MnR"] == 10.0
    assert torch.equal(ranks_v2t(sim, cv), torch.full((n,), n))


def test_ties_optimistic_and_pessimistic():
    # Row 0: own video 0 scores 0.5, videos 1 and 2 also 0.5, video 3 scores 0.9.
    #   optimistic = 1 + #{> 0.5} = 1 + 1 = 2; pessimistic = #{>= 0.5} = 4.
    # Row 1: own video 1 scores 0.7 uniquely highest -> 1 under both conventions.
    sim = torch.tensor([[0.5, 0.5, 0.5, 0.9], [0.1, 0.7, 0.2, 0.3]])
    cv = torch.tensor([0, 1])
    assert ranks_t2v(sim, cv).tolist() == [2, 1]
    assert ranks_t2v(sim, cv, ties="pessimistic").tolist() == [4, 1]
    # a constant matrix: everything tied
    flat = torch.zeros(3, 3)
    assert ranks_t2v(flat, torch.arange(3)).tolist() == [1, 1, 1]
    assert ranks_t2v(flat, torch.arange(3), ties="pessimistic").tolist() == [3, 3, 3]
    assert ranks_v2t(flat, torch.arange(3), ties="pessimistic").tolist() == [3, 3, 3]


def test_multi_caption_v2t_hand_built():
    # 4 captions x 2 videos; captions 0, 1 describe video 0, captions 2, 3 video 1.
    sim = torch.tensor(
        [
            [0.2, 0.1],  # c0 (video 0)
            [0.6, 0.8],  # c1 (video 0)
            [0.9, 0.3],  # c2 (video 1)
            [0.1, 0.4],  # c3 (video 1)
        ]
    )
    cv = torch.tensor([0, 0, 1, 1])
    # Video 0 column: [0.2, 0.6, 0.9, 0.1]; own captions best = 0.6 (c1);
    #   captions above 0.6: c2 (0.9) -> rank 2.
    # Video 1 column: [0.1, 0.8, 0.3, 0.4]; own best = 0.4 (c3); above: c1 (0.8) -> rank 2.
    assert ranks_v2t(sim, cv).tolist() == [2, 2]
    # t2v: c0 row [0.2, 0.1] own 0 -> 1; c1 [0.6, 0.8] own 0 -> 2; c2 [0.9, 0.3] own 1 -> 2;
    #   c3 [0.1, 0.4] own 1 -> 1.
    assert ranks_t2v(sim, cv).tolist() == [1, 2, 2, 1]
    m = evaluate_similarity(sim, cv)
    assert m["t2v"]["num_queries"] == 4 and m["v2t"]["num_queries"] == 2
    assert m["t2v"]["R@1"] == 50.0 and m["t2v"]["MnR"] == 1.5 and m["t2v"]["MdR"] == 1.5
    assert m["v2t"]["R@1"] == 0.0 and m["v2t"]["R@5"] == 100.0 and m["v2t"]["MdR"] == 2.0


@pytest.mark.parametrize("chunk", [1, 7, 1 << 24])
def test_random_matches_sort_reference(chunk):
    g = torch.Generator().manual_seed(0)
    n_t, n_v = 60, 13
    sim = torch.randn(n_t, n_v, generator=g)
    cv = torch.cat([torch.arange(n_v), torch.randint(0, n_v, (n_t - n_v,), generator=g)])
    cv = cv[torch.randperm(n_t, generator=g)]
    r_t = ranks_t2v(sim, cv, max_chunk_elems=chunk)
    r_v = ranks_v2t(sim, cv, max_chunk_elems=chunk)
    assert torch.equal(r_t, _reference_ranks_t2v(sim, cv))
    assert torch.equal(r_v, _reference_ranks_v2t(sim, cv))
    # continuous scores: no ties, both conventions agree
    assert torch.equal(r_t, ranks_t2v(sim, cv, ties="pessimistic", max_chunk_elems=chunk))
    assert torch.equal(r_v, ranks_v2t(sim, cv, ties="pessimistic", max_chunk_elems=chunk))


def test_retrieval_metrics_known_values():
    ranks = torch.tensor([1, 3, 6, 12, 60, 2])
    m = retrieval_metrics(ranks)
    assert m["R@1"] == pytest.approx(100 / 6)
    assert m["R@5"] == pytest.approx(300 / 6)  # 1, 3, 2
    assert m["R@10"] == pytest.approx(400 / 6)  # + 6
    assert m["R@50"] == pytest.approx(500 / 6)  # + 12
    assert m["MdR"] == 4.5  # sorted 1 2 3 6 12 60 -> (3 + 6) / 2
    assert m["MnR"] == pytest.approx(84 / 6)
    assert retrieval_metrics(torch.tensor([5, 1, 9]))["MdR"] == 5.0


def test_invalid_inputs():
    sim = torch.rand(3, 2)
    with pytest.raises(ValueError, match="without any caption"):
        ranks_v2t(sim, torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="outside"):
        ranks_t2v(sim, torch.tensor([0, 1, 2]))
    bad = sim.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ranks_t2v(bad, torch.tensor([0, 1, 1]))


def _reference_ranks_v2t_groups(sim, cv):
    """Rank of each video's caption group among the V groups, a group scored by its best
    caption (the CLIP4Clip / DiCoSA rule), by a plain loop and a sort."""
    ranks = []
    for v in range(sim.shape[1]):
        group_best = torch.stack([sim[cv == g, v].max() for g in range(sim.shape[1])])
        order = torch.argsort(group_best, descending=True)
        ranks.append(int((order == v).nonzero()) + 1)
    return torch.tensor(ranks)


def test_v2t_group_convention_hand_built():
    # 5 captions x 3 videos. Video 0's best own caption (0.5) has three captions above it
    # (c2, c3 of video 1 and c4 of video 2), but only two *groups* above it.
    sim = torch.tensor([[0.5], [0.1], [0.9], [0.8], [0.7]]).expand(5, 3).clone()
    cv = torch.tensor([0, 0, 1, 1, 2])
    assert ranks_v2t(sim, cv)[0].item() == 4
    assert ranks_v2t_groups(sim, cv)[0].item() == 3
    m = evaluate_similarity(sim, cv)
    assert m["v2t"]["num_queries"] == m["v2t_groups"]["num_queries"] == 3
    # One caption per video: no second convention is reported (they coincide).
    assert "v2t_groups" not in evaluate_similarity(torch.eye(3), torch.arange(3))


def test_v2t_groups_match_the_reference_and_agree_at_r1():
    g = torch.Generator().manual_seed(1)
    n_t, n_v = 80, 11
    sim = torch.randn(n_t, n_v, generator=g)
    cv = torch.cat([torch.arange(n_v), torch.randint(0, n_v, (n_t - n_v,), generator=g)])
    groups = ranks_v2t_groups(sim, cv)
    assert torch.equal(groups, _reference_ranks_v2t_groups(sim, cv))
    flat = ranks_v2t(sim, cv)
    assert torch.equal(groups == 1, flat == 1)  # R@1 is the same under both conventions
    assert (groups <= flat).all() and (groups < flat).any()
