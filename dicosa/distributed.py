"""Cross-process feature gathering for contrastive losses.

Gradient convention
-------------------
``all_gather_with_grad`` uses ``torch.distributed.nn.functional.all_gather``, whose backward
*sums* the incoming gradients of every rank for each rank's slice (reduce-scatter; all-to-all
plus sum on gloo).  Consider the usual setup: every rank computes the same loss ``L`` on the
full gathered batch, and DDP then *averages* parameter gradients over the ``W`` ranks.

* Rank ``r`` receives ``sum_{r'} dL/dx_r = W * dL/dx_r`` for its local features ``x_r``.
* Its parameter gradient is ``W * dL/dx_r * dx_r/dtheta``.
* DDP averages: ``(1/W) * sum_r W * dL/dx_r * dx_r/dtheta = dL/dtheta``,

which is exactly the single-process gradient on the concatenated batch, so no extra scaling
is needed.  The same holds when each rank computes a *different* loss ``L_r`` (e.g. only its
local queries against all keys): the result is the gradient of ``mean_r L_r``.

The alternative found in many CLIP4Clip-style code bases — backward returns only the local
slice of the incoming gradient, without summing — yields ``(1/W) * dL/dtheta`` after DDP
averaging, i.e. an implicit learning-rate division by the world size.

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
    # Imported lazily: torch.distributed.nn pulls in RPC bits that are absent on some builds.
    from torch.distributed.nn.functional import all_gather

    return _ContiguousGrad.apply(torch.cat(all_gather(x), dim=0))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous.

    all_gather's backward hands the per-rank slices of this gradient to a collective
    (all-to-all on gloo) that reads raw memory; a gradient arriving as a strided view (an
    einsum's or rearrange's backward produces those) was sent scrambled, which the 2-process
    equality test caught.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

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
