import math

import pytest
import torch
import torch.nn.functional as F

from dicosa import functional as DF


def test_pooling_weights_sum_to_one_and_skip_padding():
    text = torch.randn(3, 8)
    frames = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()
    a = DF.pooling_weights(text, frames, mask, temperature=3.0, mask_mode="before")
    assert a.shape == (3, 2, 5)
    torch.testing.assert_close(a.sum(-1), torch.ones(3, 2))
    assert (a[:, 0, 3:] == 0).all()
    # Eq. 1 by hand for one pair.
    logits = frames[0, :3] @ text[1] / 3.0
    torch.testing.assert_close(a[1, 0, :3], logits.softmax(0))


def test_pooling_weights_after_mode_does_not_renormalise():
    text = torch.randn(1, 4)
    frames = torch.randn(1, 3, 4)
    mask = torch.tensor([[1, 1, 0]]).bool()
    after = DF.pooling_weights(text, frames, mask, 1.0, mask_mode="after")
    full = (frames[0] @ text[0]).softmax(0)
    torch.testing.assert_close(after[0, 0], full * mask[0])
    assert after.sum() < 1


def test_split_concepts_is_a_reshape():
    x = torch.arange(16.0).view(2, 8)
    f = DF.split_concepts(x, 4)
    assert f.shape == (2, 4, 2)
    torch.testing.assert_close(f[1, 2], torch.tensor([12.0, 13.0]))
    with pytest.raises(ValueError, match="not divisible"):
        DF.split_concepts(torch.zeros(2, 10), 4)


def test_info_nce_hand_computed_3x3():
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.5, 1.0, 0.0], [0.0, 3.0, 3.0]])
    rows = [math.log(math.exp(logits[i, i]) / sum(math.exp(v) for v in logits[i]))
            for i in range(3)]
    cols = [math.log(math.exp(logits[i, i]) / sum(math.exp(logits[j, i]) for j in range(3)))
            for i in range(3)]
    expected = -0.5 * (sum(rows) / 3 + sum(cols) / 3)
    assert DF.info_nce(logits).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="square"):
        DF.info_nce(torch.zeros(2, 3))


def _decorrelated_factors(batch=96, k=4, d=8, seed=0):
    """Factors whose channels are centred and orthonormal over the batch."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, k * d, generator=g, dtype=torch.float64)
    x = x - x.mean(0)
    q, _ = torch.linalg.qr(x)
    return (q * math.sqrt(batch)).view(batch, k, d)


def test_paper_losses_vanish_at_constructed_optimum():
    e = _decorrelated_factors()
    corr = DF.factor_correlation(e, e.clone(), eps=0.0)
    torch.testing.assert_close(corr, torch.eye(4, dtype=torch.float32), atol=1e-5, rtol=0)
    assert DF.alignment_loss(corr).item() == pytest.approx(0.0, abs=1e-8)
    assert DF.decoupling_loss(corr).item() == pytest.approx(0.0, abs=1e-8)


def test_paper_correlation_is_bounded_and_losses_positive_off_optimum():
    e_t, e_v = torch.randn(64, 8, 16), torch.randn(64, 8, 16)
    corr = DF.factor_correlation(e_t, e_v)
    assert corr.abs().max() <= 1.0
    assert DF.alignment_loss(corr) > 1.0
    # A video factor that copies another text factor is an off-diagonal correlation of 1.
    e_v = e_t[:, [1, 0, 2, 3, 4, 5, 6, 7]]
    corr = DF.factor_correlation(e_t, e_v)
    assert corr[0, 1].item() == pytest.approx(1.0, abs=1e-4)
    assert DF.decoupling_loss(corr).item() >= 2.0 - 1e-3


def test_released_correlation_known_values():
    e = torch.randn(10, 8, 64)
    corr = DF.factor_correlation_released(e, e, divisor=32.0, eps=0.0)
    # Per-sample standardisation with the unbiased std gives Σ_c z² = d − 1.
    torch.testing.assert_close(torch.diagonal(corr), torch.full((8,), 63 / 32))
    corr = DF.factor_correlation_released(e, e, divisor=63.0, eps=0.0)
    assert DF.alignment_loss(corr).item() == pytest.approx(0.0, abs=1e-8)


def test_decoupling_and_alignment_losses_on_a_known_matrix():
    corr = torch.tensor([[0.5, 0.2], [-0.1, 1.0]])
    assert DF.decoupling_loss(corr).item() == pytest.approx(0.04 + 0.01)
    assert DF.alignment_loss(corr).item() == pytest.approx(0.25)


def test_concept_similarity_matches_a_naive_reference():
    torch.manual_seed(0)
    bt, bv, n, k, d, h = 3, 4, 5, 2, 6, 10
    e_t = torch.randn(bt, k, d)
    frame_f = torch.randn(bv, n, k, d)
    weights = torch.rand(bt, bv, n)
    w1 = torch.randn(h, 2 * d)
    b1, w2, b2 = torch.randn(h), torch.randn(h), torch.randn(())
    s, cos, conf = DF.concept_similarity(
        e_t, frame_f, weights, e_t @ w1[:, :d].T + b1, frame_f @ w1[:, d:].T, w2, b2)
    for t in range(bt):
        for v in range(bv):
            e_v = torch.einsum("n,nkc->kc", weights[t, v], frame_f[v])
            ref_cos = F.cosine_similarity(e_t[t], e_v, dim=-1)
            ref_g = F.relu(torch.cat([e_t[t], e_v], -1) @ w1.T + b1) @ w2 + b2
            torch.testing.assert_close(cos[t, v], ref_cos, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(conf[t, v], ref_g, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(s[t, v], (ref_g * ref_cos).sum(), atol=1e-4, rtol=1e-5)


def test_video_proxy_is_the_limit_of_pooling_at_infinite_temperature():
    g = torch.Generator().manual_seed(3)
    text, frames = torch.randn(2, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    proxy = DF.video_proxy(frames, mask)
    torch.testing.assert_close(proxy[1], frames[1, :2].mean(0))
    torch.testing.assert_close(proxy[2], frames[2, 0])
    weights = DF.pooling_weights(text, frames, mask, temperature=1e9)  # [2, 3, 5]
    pooled = torch.einsum("tvn,vnd->tvd", weights, frames)
    torch.testing.assert_close(pooled, proxy.expand(2, -1, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.paths
@pytest.mark.parametrize("variant", ["released", "paper"])
def test_fast_scoring_matches_the_paper_ordered_reference(variant):
    """model.score (factors per frame, hidden halves, fused sum) equals Eqs. 1, 2, 8, 9 done
    one pair at a time in the paper's order (pool -> split -> cosine -> MLP -> sum)."""
    from dicosa.model import DiCoSA
    from tests.conftest import random_batch, tiny_config

    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant=variant)).eval()
    head = model.head
    if head.text_proj is not None:  # move off the identity start so W_k matter
        with torch.no_grad():
            head.text_proj.weight.add_(0.1 * torch.randn_like(head.text_proj.weight))
            head.video_proj.weight.add_(0.1 * torch.randn_like(head.video_proj.weight))
    batch = random_batch(batch=5, frames=4, size=model.image_size)
    with torch.no_grad():
        text = model.encode_text(batch["tokens"])
        video = model.encode_video(batch["frames"], batch["frame_mask"])
        fast = model.score(text, video)
        reference = DF.concept_similarity_reference(
            text.text, video.frames, video.frame_mask, model.config.pool_temperature,
            model.num_concepts, model.mask_mode,
            None if head.text_proj is None else head.text_proj.weight,
            None if head.video_proj is None else head.video_proj.weight,
            (torch.cat([head.conf_text, head.conf_video], dim=1), head.conf_bias,
             head.conf_out.weight[0], head.conf_out.bias[0]))
    # float32 over widths of 64: a few ulps of accumulated rounding.
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-4)
