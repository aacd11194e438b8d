"""all_gather_with_grad against a single-process reference, with 2 gloo CPU processes."""

import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from dicosa.distributed import (
    all_gather_local_grad,
    all_gather_no_grad,
    all_gather_with_grad,
    gather_features,
)
from tests._ranks import exit_rank, free_port

WORLD = 2
B_LOCAL, D_IN, D_OUT, N_FRAMES = 3, 5, 4, 2
TOL = 1e-5



def _info_nce(text: torch.Tensor, video: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    # Symmetric InfoNCE over [B, D] features: pair i is the positive for row/column i.
    logits = F.normalize(text, dim=-1) @ F.normalize(video, dim=-1).T / temperature
    target = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def _problem():
    # Identical on every process: the full batch and the initial weights.
    g = torch.Generator().manual_seed(0)
    x_text = torch.randn(WORLD * B_LOCAL, D_IN, generator=g)
    x_video = torch.randn(WORLD * B_LOCAL, N_FRAMES, D_IN, generator=g)
    mask = torch.rand(WORLD * B_LOCAL, N_FRAMES, generator=g) > 0.3
    mask[:, 0] = True
    torch.manual_seed(1)
    text_proj, video_proj = torch.nn.Linear(D_IN, D_OUT), torch.nn.Linear(D_IN, D_OUT)
    return x_text, x_video, mask, text_proj, video_proj


def _video_pool(frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # masked mean over frames: [B, N, D], [B, N] -> [B, D]
    m = mask.to(frames.dtype)[..., None]
    return (frames * m).sum(1) / m.sum(1)


def _loss_and_grads(x_text, x_video, mask, text_proj, video_proj, gather):
    text = text_proj(x_text)
    frames = video_proj(x_video)
    text, frames, mask = gather(text, frames, mask)
    loss = _info_nce(text, _video_pool(frames, mask))
    params = [*text_proj.parameters(), *video_proj.parameters()]
    for p in params:
        p.grad = None
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in params]


def _ddp_average(grads):
    # what DDP does after backward: all-reduce(sum) / world size
    out = []
    for grad in grads:
        grad = grad.clone()
        dist.all_reduce(grad)
        out.append(grad / dist.get_world_size())
    return out


def _worker(rank: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        x_text, x_video, mask, text_proj, video_proj = _problem()

        # single-process reference on the concatenated batch (no gathering)
        ref_loss, ref_grads = _loss_and_grads(
            x_text, x_video, mask, text_proj, video_proj, lambda t, v, m: (t, v, m)
        )

        sl = slice(rank * B_LOCAL, (rank + 1) * B_LOCAL)
        local = (x_text[sl], x_video[sl], mask[sl])

        # gathered tensors come back in rank order and equal the full batch
        t_all, v_all, m_all = gather_features(text_proj(local[0]), video_proj(local[1]), local[2])
        assert t_all.shape == (WORLD * B_LOCAL, D_OUT) and m_all.dtype == torch.bool
        torch.testing.assert_close(t_all, text_proj(x_text), atol=TOL, rtol=0)
        torch.testing.assert_close(v_all, video_proj(x_video), atol=TOL, rtol=0)
        assert torch.equal(m_all, mask)

        # 1) every rank computes the full-batch loss on gathered features
        loss, grads = _loss_and_grads(*local, text_proj, video_proj, gather_features)
        grads = _ddp_average(grads)
        torch.testing.assert_close(loss, ref_loss, atol=TOL, rtol=0)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, atol=TOL, rtol=0)

        # 2) local-loss variant: each rank scores only its own queries against all keys and
        #    the mean over ranks of these losses is the reference loss
        text = text_proj(local[0])
        video_all = _video_pool(*gather_features(text, video_proj(local[1]), local[2])[1:])
        text_all = all_gather_with_grad(text)
        logits_t = F.normalize(text, dim=-1) @ F.normalize(video_all, dim=-1).T / 0.1
        logits_v = F.normalize(video_all[sl], dim=-1) @ F.normalize(text_all, dim=-1).T / 0.1
        target = torch.arange(B_LOCAL) + rank * B_LOCAL
        local_loss = (F.cross_entropy(logits_t, target) + F.cross_entropy(logits_v, target)) / 2
        params = [*text_proj.parameters(), *video_proj.parameters()]
        for p in params:
            p.grad = None
        local_loss.backward()
        grads = _ddp_average([p.grad for p in params])
        mean_loss = local_loss.detach().clone()
        dist.all_reduce(mean_loss)
        torch.testing.assert_close(mean_loss / WORLD, ref_loss, atol=TOL, rtol=0)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, atol=TOL, rtol=0)

        # 2b) a gradient that reaches the gathered tensor as a strided view (einsum over a
        #     transposed operand) must still be split between the ranks correctly
        weight = torch.arange(WORLD * B_LOCAL * N_FRAMES * D_OUT, dtype=torch.float32)
        weight = weight.view(D_OUT, N_FRAMES, WORLD * B_LOCAL)

        def strided(frames: torch.Tensor) -> torch.Tensor:
            return torch.einsum("bnd,dnb->", frames, weight) / weight.numel()

        video_proj.zero_grad()
        strided(video_proj(x_video)).backward()
        ref_strided = [p.grad.clone() for p in video_proj.parameters()]
        video_proj.zero_grad()
        strided(all_gather_with_grad(video_proj(local[1]))).backward()
        grads = _ddp_average([p.grad for p in video_proj.parameters()])
        for g, r in zip(grads, ref_strided, strict=True):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-5)

        # 3) sensitivity check: without gradient through the gather the test above must fail
        def detached(t, v, m):
            t_all, v_all = all_gather_no_grad(t), all_gather_no_grad(v)
            sl_ = slice(rank * B_LOCAL, (rank + 1) * B_LOCAL)
            t_all = torch.cat([t_all[: sl_.start], t, t_all[sl_.stop :]])
            v_all = torch.cat([v_all[: sl_.start], v, v_all[sl_.stop :]])
            return t_all, v_all, all_gather_no_grad(m)

        _, bad = _loss_and_grads(*local, text_proj, video_proj, detached)
        bad = _ddp_average(bad)
        assert any(not torch.allclose(b, r, atol=1e-4) for b, r in zip(bad, ref_grads, strict=True))

        # 4) the released all-gather (local slice only in backward) is that detached gather,
        #    and gives every parameter before it 1/W of the gradient: train.tower_grad=released
        def released(t, v, m):
            return all_gather_local_grad(t), all_gather_local_grad(v), all_gather_no_grad(m)

        _, quirk = _loss_and_grads(*local, text_proj, video_proj, released)
        quirk = _ddp_average(quirk)
        for q, b, r in zip(quirk, bad, ref_grads, strict=True):
            torch.testing.assert_close(q, b, atol=TOL, rtol=0)
            torch.testing.assert_close(q, r / WORLD, atol=TOL, rtol=0)

        # 5) functional collectives: no deprecation warning from the gather (item 12)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            all_gather_with_grad(text_proj(local[0])).sum().backward()
        assert not [w for w in caught if "deprecat" in str(w.message).lower()], caught
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank()


@pytest.mark.paths
def test_all_gather_with_grad_matches_single_process():
    mp.spawn(_worker, args=(free_port(),), nprocs=WORLD, join=True)


def test_noop_without_process_group():
    assert not dist.is_initialized()
    x = torch.randn(3, 2, requires_grad=True)
    assert all_gather_with_grad(x) is x
    assert all_gather_no_grad(x) is x
    v, m = torch.randn(3, 4, 2), torch.ones(3, 4, dtype=torch.bool)
    t_all, v_all, m_all = gather_features(x, v, m)
    assert t_all is x and v_all is v and m_all is m
