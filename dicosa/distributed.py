"""Cross-process feature gathering for contrastive losses.

Gradient convention
-------------------
``all_gather_with_grad`` uses torch's functional collectives (``all_gather_single_autograd``,
called ``all_gather_tensor_autograd`` before torch 2.1x), whose backward *sums* the incoming
gradients of every rank for each rank's slice (a reduce-scatter with sum; the deprecated
``torch.distributed.nn.functional.all_gather`` had the same convention).  Consider the usual
setup: every rank computes the same loss ``L`` on the full gathered batch, and DDP then
*averages* parameter gradients over the ``W`` ranks.

* Rank ``r`` receives ``sum_{r'} dL/dx_r = W * dL/dx_r`` for its local features ``x_r``.
* Its parameter gradient is ``W * dL/dx_r * dx_r/dtheta``.
* DDP averages: ``(1/W) * sum_r W * dL/dx_r * dx_r/dtheta = dL/dtheta``,

which is exactly the single-process gradient on the concatenated batch, so no extra scaling
is needed.  The same holds when each rank computes a *different* loss ``L_r`` (e.g. only its
local queries against all keys): the result is the gradient of ``mean_r L_r``.

The released DiCoSA's backward keeps only the local slice, which gives every parameter before
the gather ``(1/W) * dL/dtheta`` (docs/training.md, "Tower gradient");
:func:`all_gather_local_grad` has that backward, and ``train.tower_grad: released`` reproduces it.

All ranks must pass tensors of identical shape (use ``drop_last=True`` in distributed
samplers); the underlying collective does not support ragged batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def _world_size() -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def _functional_all_gather():
    """torch's differentiable all-gather along dim 0 (functional collectives)."""
    from torch.distributed import _functional_collectives as funcol

    # torch >= 2.1x names it all_gather_single_autograd and deprecates the older name.
    return getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


def all_gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` from every process along dim 0, keeping gradients.

    Args:
        x: [B, ...] local tensor; same shape on every rank.

    Returns:
        [W * B, ...] with rank r's tensor at rows ``r*B:(r+1)*B``; ``x`` itself when
        torch.distributed is not initialised or the world size is 1.  Gradients on every
        slice flow back to the rank that owns it, summed over ranks (see module docstring).
    """
    if _world_size() == 1:
        return x
    gathered = _functional_all_gather()(x.contiguous(), 0, dist.group.WORLD)
    # Waits for the collective, and guards the backward's reduce-scatter against gradients
    # that arrive as strided views.
    return _ContiguousGrad.apply(gathered)


def all_gather_local_grad(x: Tensor) -> Tensor:
    """The released code's all-gather: like :func:`all_gather_with_grad` forward, but the
    backward keeps only the gradient of this rank's own slice from this rank's loss (no sum
    over ranks), so parameters before it get 1/W of the true gradient after DDP averaging.
    Kept as the reference of ``train.tower_grad: released``, which scales those gradients
    instead."""
    world = _world_size()
    if world == 1:
        return x
    gathered = all_gather_no_grad(x)
    rows = x.shape[0]
    rank = dist.get_rank()
    return torch.cat([gathered[:rank * rows], x, gathered[(rank + 1) * rows:]])


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous.

    The all-gather's backward hands the per-rank slices of this gradient to a collective
    (reduce-scatter; all-to-all on gloo for the deprecated gather) that reads raw memory, so
    older torch sends a gradient arriving as a strided view (an einsum's or rearrange's
    backward produces those) scrambled; current torch makes it contiguous itself.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        # The functional all-gather returns an AsyncCollectiveTensor; hand on a plain tensor.
        wait = getattr(x, "wait", None)
        return wait() if callable(wait) else x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous()


def all_gather_no_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` from every process along dim 0, without autograd.

    Args:
        x: [B, ...] local tensor; same shape on every rank.

    Returns:
        [W * B, ...] detached; ``x`` itself when not distributed.
    """
    world = _world_size()
    if world == 1:
        return x
    # Not every backend reduces/gathers bool (gloo), so bool masks travel as uint8.
    send = x.detach().contiguous()
    send = send.to(torch.uint8) if x.dtype == torch.bool else send
    parts = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(parts, send)
    return torch.cat(parts, dim=0).to(x.dtype)


def gather_features(text: Tensor, video: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gather text features, per-frame video features and frame masks from all processes.

    Args:
        text: [B, D] text features (differentiable).
        video: [B, N, D] per-frame video features (differentiable).
        mask: [B, N] frame validity mask (no gradient).

    Returns:
        ([W*B, D], [W*B, N, D], [W*B, N]) in rank order; inputs unchanged when not
        distributed.
    """
    if text.shape[0] != video.shape[0] or mask.shape != video.shape[:2]:
        raise ValueError(
            f"inconsistent shapes: text {tuple(text.shape)}, video {tuple(video.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    return all_gather_with_grad(text), all_gather_with_grad(video), all_gather_no_grad(mask)
