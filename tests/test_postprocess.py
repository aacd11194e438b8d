import pytest
import torch

from dicosa.metrics import ranks_t2v
from dicosa.postprocess import dsl_t2v, dsl_v2t, dual_softmax, hub_gallery_items, qb_norm

# ---------------------------------------------------------------- DSL


def test_dsl_hand_example_flips_shared_video():
    # Caption 0 prefers video 0 (0.6 > 0.5), but video 0 is also close to caption 1, while
    # video 1 is close only to caption 0.
    sim = torch.tensor([[0.6, 0.5], [0.55, 0.1]])
    out = dsl_t2v(sim, temperature=0.1)
    # prior = softmax over captions (dim 0) of sim / 0.1:
    #   column 0: logits 6, 5.5 -> [1/(1+e^-0.5), 1/(1+e^0.5)] = [0.622459, 0.377541]
    #   column 1: logits 5, 1   -> [1/(1+e^-4),   1/(1+e^4)]   = [0.982014, 0.017986]
    # out = sim * prior * N_t (= 2):
    #   [[0.6*0.622459*2, 0.5*0.982014*2], [0.55*0.377541*2, 0.1*0.017986*2]]
    expected = torch.tensor([[0.746951, 0.982014], [0.415295, 0.003597]])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    assert out[0].argmax() == 1  # caption 0 now retrieves video 1
    assert sim[0].argmax() == 0


def test_dsl_orientation_and_shape():
    g = torch.Generator().manual_seed(1)
    sim = torch.rand(5, 3, generator=g)
    assert dsl_t2v(sim).shape == sim.shape
    assert dsl_v2t(sim).shape == sim.shape
    # the v2t revision is the t2v revision of the transposed problem
    torch.testing.assert_close(dsl_v2t(sim), dsl_t2v(sim.T).T)
    torch.testing.assert_close(dual_softmax(sim, dim=0), dsl_t2v(sim))
    # each column of the t2v prior sums to one (times N_t)
    prior = dsl_t2v(sim, temperature=0.05) / sim
    torch.testing.assert_close(prior.sum(dim=0), torch.full((3,), 5.0))


def test_dsl_large_temperature_is_near_identity():
    # temperature -> inf makes the prior uniform (= 1 after the N factor)
    sim = torch.tensor([[0.3, -0.2], [0.1, 0.4], [0.0, 0.2]])
    torch.testing.assert_close(dsl_t2v(sim, temperature=1e6), sim, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- QB-Norm

# 4 bank queries x 3 gallery items; top-1 of each bank row: 0, 0, 0, 1 -> counts [3, 1, 0].
BANK = torch.tensor(
    [
        [0.9, 0.1, 0.0],
        [0.8, 0.2, 0.1],
        [0.7, 0.0, 0.3],
        [0.1, 0.6, 0.2],
    ]
)
# Test queries: top-1 items 0, 1, 2.
SIM = torch.tensor(
    [
        [0.5, 0.45, 0.1],
        [0.2, 0.6, 0.3],
        [0.1, 0.2, 0.7],
    ]
)


def test_hub_gallery_items_threshold():
    assert hub_gallery_items(BANK, k=1, theta=3).tolist() == [True, False, False]
    assert hub_gallery_items(BANK, k=1, theta=1).tolist() == [True, True, False]
    assert hub_gallery_items(BANK, k=1, theta=4).tolist() == [False, False, False]
    # k=2: top-2 sets {0,1}, {0,1}, {0,2}, {1,2} -> counts [3, 3, 2]
    assert hub_gallery_items(BANK, k=2, theta=3).tolist() == [True, True, False]


def test_qb_norm_hand_example():
    # beta = 1 keeps the arithmetic by hand:
    #   column sums of exp(bank):
    #     g0: e^.9 + e^.8 + e^.7 + e^.1 = 2.459603 + 2.225541 + 2.013753 + 1.105171 = 7.804068
    #     g1: e^.1 + e^.2 + e^0  + e^.6 = 1.105171 + 1.221403 + 1.0 + 1.822119   = 5.148693
    #     g2: e^0  + e^.1 + e^.3 + e^.2 = 1.0 + 1.105171 + 1.349859 + 1.221403   = 4.676433
    # theta = 3 activates only g0, so only query 0 (top-1 = g0) is normalised:
    #   q0 -> [e^.5 / 7.804068, e^.45 / 5.148693, e^.1 / 4.676433]
    #       = [1.648721 / 7.804068, 1.568312 / 5.148693, 1.105171 / 4.676433]
    #       = [0.211264, 0.304604, 0.236328]
    out = qb_norm(SIM, BANK, k=1, beta=1.0, theta=3, log_domain=False)
    torch.testing.assert_close(
        out[0], torch.tensor([0.211264, 0.304604, 0.236328]), atol=1e-5, rtol=0
    )
    # the hub g0 lost query 0 to g1
    assert out[0].argmax() == 1
    # queries whose top-1 is not activated keep their raw similarities exactly
    assert torch.equal(out[1:], SIM[1:])
    # log domain: log of the same ratios
    out_log = qb_norm(SIM, BANK, k=1, beta=1.0, theta=3)
    torch.testing.assert_close(out_log[0], torch.log(out[0]))
    assert torch.equal(out_log[1:], SIM[1:])


def test_qb_norm_theta_one_matches_original_qbnorm():
    # theta = 1: every item in any bank top-1 (g0, g1) is activated -> queries 0 and 1.
    out = qb_norm(SIM, BANK, k=1, beta=1.0, theta=1, log_domain=False)
    col = torch.tensor([7.804068, 5.148693, 4.676433])
    torch.testing.assert_close(out[:2], SIM[:2].exp() / col, atol=1e-5, rtol=0)
    assert torch.equal(out[2], SIM[2])


def test_qb_norm_nothing_activated_is_identity():
    out = qb_norm(SIM, BANK, theta=100)
    assert torch.equal(out, SIM)


def _hubby_problem(seed: int, n_q: int, n_g: int, hub: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Each query's own item = q % n_g gets +0.4; one hub item gets +0.45 for everyone.
    g = torch.Generator().manual_seed(seed)
    sim = 0.3 * torch.rand(n_q, n_g, generator=g)
    sim[torch.arange(n_q), torch.arange(n_q) % n_g] += 0.4
    sim[:, hub] += 0.45
    return sim, torch.arange(n_q) % n_g


def test_qb_norm_reduces_hubness_and_improves_r1():
    n_g, hub = 6, 2
    sim, cv = _hubby_problem(0, 30, n_g, hub)
    bank, _ = _hubby_problem(1, 60, n_g, hub)
    before = int((sim.argmax(dim=1) == hub).sum())
    out = qb_norm(sim, bank, k=1, beta=20.0, theta=3)
    after = int((out.argmax(dim=1) == hub).sum())
    assert before >= 20  # the hub wins most queries before normalisation
    assert after < before
    r1_before = float((ranks_t2v(sim, cv) == 1).float().mean())
    r1_after = float((ranks_t2v(out, cv) == 1).float().mean())
    assert r1_after > r1_before


def test_qb_norm_beta70_stable_and_matches_float64_reference():
    # Unnormalised dot products up to ~2: exp(70 * 2) overflows fp32 (max ~3.4e38 = e^88.7).
    g = torch.Generator().manual_seed(3)
    sim = 2 * torch.rand(40, 8, generator=g)
    bank = 2 * torch.rand(200, 8, generator=g)
    bank[:, 0] += 0.3  # item 0 is a hub of the bank: top-1 for far more than theta rows
    assert torch.isinf(torch.exp(70 * bank)).any()  # the naive fp32 route would break
    out = qb_norm(sim, bank, k=1, beta=70.0, theta=40)
    assert torch.isfinite(out).all()
    # float64 reference of the reference formula (e^140 ~ 6e60 is fine in float64)
    s64, b64 = sim.double(), bank.double()
    counts = torch.bincount(b64.argmax(dim=1), minlength=8)
    rows = (counts >= 40)[s64.argmax(dim=1)]
    assert rows.any() and not rows.all()
    ref = s64.clone()
    ref[rows] = torch.exp(70 * s64[rows]) / torch.exp(70 * b64).sum(dim=0)
    # same per-row ordering (log is monotone); compare log values where normalised
    assert torch.equal(out.argsort(dim=1), ref.argsort(dim=1))
    torch.testing.assert_close(out[rows].double(), torch.log(ref[rows]), atol=1e-3, rtol=1e-5)


def test_qb_norm_bank_chunking_invariant(monkeypatch):
    import dicosa.postprocess as pp

    g = torch.Generator().manual_seed(4)
    sim, bank = torch.rand(10, 5, generator=g), torch.rand(37, 5, generator=g)
    full = qb_norm(sim, bank, theta=2)
    monkeypatch.setattr(pp, "_BANK_CHUNK_ELEMS", 5 * 4)  # 4 bank rows per chunk
    torch.testing.assert_close(qb_norm(sim, bank, theta=2), full)


def test_qb_norm_v2t_orientation():
    # v2t: queries are videos (sim.T), bank is training videos x test captions.
    g = torch.Generator().manual_seed(5)
    sim_tv = torch.rand(7, 4, generator=g)  # captions x videos
    bank_v = torch.rand(9, 7, generator=g)  # training videos x test captions
    out = qb_norm(sim_tv.T, bank_v, theta=1)
    assert out.shape == (4, 7)
    with pytest.raises(ValueError):
        qb_norm(sim_tv, bank_v)  # gallery sizes disagree (4 vs 7)
