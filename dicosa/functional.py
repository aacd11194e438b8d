"""DiCoSA's equations as pure tensor functions (no weights held here).

Shape letters: B_t texts, B_v videos, N frames per video, D feature width, K concepts,
d = D/K factor width, H hidden width of the confidence MLP. Equation numbers refer to
Jin et al., "Text-Video Retrieval with Disentangled Conceptualization and Set-to-Set
Alignment", IJCAI 2023.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

MaskMode = Literal["before", "after"]


def pooling_weights(
    text: Tensor, frames: Tensor, frame_mask: Tensor, temperature: float,
    mask_mode: MaskMode = "before",
) -> Tensor:
    """Eq. 1, text-conditioned frame weights a_i = softmax_i(Tᵀ f_i / τ).

    Args:
        text: ``[B_t, D]`` raw (unnormalised) text vectors T.
        frames: ``[B_v, N, D]`` raw frame vectors f_i.
        frame_mask: ``[B_v, N]`` bool, False for padded frames.
        mask_mode: ``"before"`` excludes padded frames from the softmax (the paper);
            ``"after"`` multiplies the softmax by the mask without renormalising (the
            authors' released code).
    Returns:
        ``[B_t, B_v, N]`` weights, in float32.
    """
    logits = torch.einsum("td,vnd->tvn", text, frames).float() / temperature  # [B_t, B_v, N]
    mask = frame_mask[None]  # [1, B_v, N]
    if mask_mode == "before":
        return logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return logits.softmax(dim=-1) * mask


def matched_pooling_weights(
    text: Tensor, frames: Tensor, frame_mask: Tensor, temperature: float,
    mask_mode: MaskMode = "before",
) -> Tensor:
    """Eq. 1 for matched pairs only (text i with video i): ``[B, D], [B, N, D] -> [B, N]``."""
    logits = torch.einsum("bd,bnd->bn", text, frames).float() / temperature
    if mask_mode == "before":
        return logits.masked_fill(~frame_mask, float("-inf")).softmax(dim=-1)
    return logits.softmax(dim=-1) * frame_mask


def video_proxy(frames: Tensor, frame_mask: Tensor) -> Tensor:
    """Eq. 1 as τ → ∞: the masked mean of the frame vectors, ``[B_v, N, D] -> [B_v, D]``.

    With an infinite temperature the text-conditioned weights become uniform over the valid
    frames, so this is the one video vector that does not depend on the query: what a
    first-stage index can hold.
    """
    weights = frame_mask.to(frames.dtype)  # [B_v, N]
    total = torch.einsum("vn,vnd->vd", weights, frames)
    return total / weights.sum(dim=1, keepdim=True).clamp_min(1)


def split_concepts(x: Tensor, num_concepts: int) -> Tensor:
    """Eq. 2's split of ``[..., D]`` into K factors ``[..., K, D/K]`` (after any projection W_k)."""
    if x.shape[-1] % num_concepts:
        raise ValueError(f"feature width {x.shape[-1]} is not divisible by K={num_concepts}")
    return rearrange(x, "... (k d) -> ... k d", k=num_concepts)


def concept_similarity_reference(
    text: Tensor,
    frames: Tensor,
    frame_mask: Tensor,
    temperature: float,
    num_concepts: int,
    mask_mode: MaskMode = "before",
    text_proj: Tensor | None = None,
    video_proj: Tensor | None = None,
    confidence_mlp: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """Eqs. 1, 2, 8 and 9 in the paper's order, one pair at a time: the readable definition
    that :func:`concept_similarity` (the fast path) is tested against.

    1. pool: the video vector of pair (t, v) is V = Σ_i a_i f_i, a from Eq. 1;
    2. split: e_k^t = W_k^t T and e_k^v = W_k^v V (Eq. 2);
    3. cosine: s_k = cos(e_k^t, e_k^v);
    4. MLP: g_k = w_2ᵀ ReLU(W_1 [e_k^t; e_k^v] + b_1) + b_2 (Eq. 8), or 1/K without one;
    5. sum: S = Σ_k g_k s_k (Eq. 9).

    Builds a ``[B_t, B_v, D]`` tensor, so it is for small inputs only.

    Args:
        text: ``[B_t, D]`` T; frames ``[B_v, N, D]`` and ``frame_mask [B_v, N]``.
        temperature, mask_mode: Eq. 1 (:func:`pooling_weights`).
        num_concepts: K.
        text_proj, video_proj: ``[D, D]`` the stacked W_k (None: no projection, the
            released variant).
        confidence_mlp: ``(W_1 [H, 2d], b_1 [H], w_2 [H], b_2 [])``, or None for g_k = 1/K.
    Returns:
        S ``[B_t, B_v]``.
    """
    weights = pooling_weights(text, frames, frame_mask, temperature, mask_mode)
    video = torch.einsum("tvn,vnd->tvd", weights, frames.float())  # 1. pool: V per pair
    text = text.float()
    if text_proj is not None:
        text, video = text @ text_proj.float().T, video @ video_proj.float().T
    text_factors = split_concepts(text, num_concepts)[:, None]  # 2. split: [B_t, 1, K, d]
    video_factors = split_concepts(video, num_concepts)  # [B_t, B_v, K, d]
    text_factors = text_factors.expand_as(video_factors)
    cosines = F.cosine_similarity(text_factors, video_factors, dim=-1)  # 3. [B_t, B_v, K]
    if confidence_mlp is None:
        confidences = torch.full_like(cosines, 1.0 / num_concepts)
    else:  # 4. the MLP on the concatenated pair of factors
        w1, b1, w2, b2 = (t.float() for t in confidence_mlp)
        pair = torch.cat([text_factors, video_factors], dim=-1)  # [B_t, B_v, K, 2d]
        confidences = F.relu(pair @ w1.T + b1) @ w2 + b2
    return (confidences * cosines).sum(-1)  # 5. sum over the K concepts


def concept_similarity(
    text_factors: Tensor,
    frame_factors: Tensor,
    weights: Tensor,
    text_hidden: Tensor | None,
    frame_hidden: Tensor | None,
    out_weight: Tensor | None,
    out_bias: Tensor | None,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 8–9, S = Σ_k g_k cos(e_k^t, e_k^v), for every (text, video) pair.

    The video factor of a pair is e_k^v = Σ_i a_i e_{k,i}^v (Eq. 1 is linear in the frames),
    so nothing of width D is built per pair: the cosine's numerator pools per-frame dot
    products, its video norm is aᵀ G_k a with the per-video frame Gram matrix G_k, and the
    confidence MLP's first layer is split into a text half (``text_hidden``, bias included)
    and a video half applied to frames before pooling (``frame_hidden``).

    Args:
        text_factors: ``[B_t, K, d]`` e^t.
        frame_factors: ``[B_v, N, K, d]`` per-frame video factors.
        weights: ``[B_t, B_v, N]`` pooling weights a (Eq. 1).
        text_hidden: ``[B_t, K, H]`` W_1^t e^t + b_1, or None for g_k = 1/K (no adaptive pooling).
        frame_hidden: ``[B_v, N, K, H]`` W_1^v e_i^v per frame.
        out_weight, out_bias: ``[H]`` and ``[]``, the MLP's second layer.
    Returns:
        ``(S [B_t, B_v], cosines [B_t, B_v, K], confidences [B_t, B_v, K])``.
    """
    weights = weights.to(frame_factors.dtype)
    dots = torch.einsum("tkc,vnkc,tvn->tvk", text_factors, frame_factors, weights)
    gram = torch.einsum("vnkc,vmkc->vknm", frame_factors, frame_factors)  # [B_v, K, N, N]
    video_sq = torch.einsum("tvn,vknm,tvm->tvk", weights, gram, weights)  # ‖e^v‖² per pair
    text_sq = text_factors.pow(2).sum(-1)  # [B_t, K]
    cosines = dots.float() / (text_sq[:, None].float() * video_sq.float()).clamp_min(eps**2).sqrt()
    if text_hidden is None:
        confidences = torch.full_like(cosines, 1.0 / cosines.shape[-1])
    else:
        confidences = pair_confidences(weights, text_hidden, frame_hidden, out_weight, out_bias)
    similarity = (confidences * cosines).sum(-1)  # [B_t, B_v]
    return similarity, cosines, confidences


def pair_confidences(weights: Tensor, text_hidden: Tensor, frame_hidden: Tensor,
                     out_weight: Tensor, out_bias: Tensor) -> Tensor:
    """Eq. 8, g_k = w_2ᵀ ReLU(W_1^t e_k^t + W_1^v e_k^v + b_1) + b_2 for all pairs: [B_t, B_v, K].

    The pooled video half is one batched matmul over videos; the ``[B_v, B_t, K, H]`` hidden
    activation it makes is the largest tensor of scoring, so it is updated in place (under
    torch.compile the add, ReLU and reduction fuse into one pass over it).
    """
    num_videos, num_frames, num_concepts, width = frame_hidden.shape
    pooled = torch.bmm(weights.transpose(0, 1),  # [B_v, B_t, N]
                       frame_hidden.reshape(num_videos, num_frames, num_concepts * width))
    hidden = pooled.view(num_videos, -1, num_concepts, width)  # [B_v, B_t, K, H]
    if torch.is_grad_enabled() and (pooled.requires_grad or text_hidden.requires_grad):
        hidden = F.relu(hidden + text_hidden[None])
    else:
        hidden = hidden.add_(text_hidden[None]).relu_()
    confidences = hidden @ out_weight.to(hidden.dtype) + out_bias  # [B_v, B_t, K]
    return confidences.transpose(0, 1).float()


def info_nce(logits: Tensor) -> Tensor:
    """Eq. 10, symmetric InfoNCE over ``logits [B, B]`` (texts × videos, matches on the diagonal).

    ``logits`` already holds S / τ'.
    """
    if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"InfoNCE needs a square [B, B] matrix, got {tuple(logits.shape)}")
    targets = torch.arange(logits.shape[0], device=logits.device)
    logits = logits.float()
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets))


def factor_correlation(text_factors: Tensor, video_factors: Tensor, eps: float = 1e-5) -> Tensor:
    """Eqs. 4–5 as written, C_ij = E[z_iᵀ z_j] ∈ [−1, 1], for matched pairs.

    Each factor channel is standardised over the batch (Eq. 4), and C averages the per-channel
    correlations of text factor i with video factor j over the d channels.

    Args:
        text_factors, video_factors: ``[B, K, d]`` e^t and e^v of matched pairs.
    Returns:
        ``C [K, K]``.
    """
    z_t = _standardise(text_factors.float(), dim=0, unbiased=False, eps=eps)
    z_v = _standardise(video_factors.float(), dim=0, unbiased=False, eps=eps)
    batch, _, width = z_t.shape
    return torch.einsum("bic,bjc->ij", z_t, z_v) / (batch * width)


def factor_correlation_released(
    text_factors: Tensor, video_factors: Tensor, divisor: float, eps: float = 1e-5
) -> Tensor:
    """Eqs. 4–5 as the released code computes them.

    Each sample's factor is standardised over its own d channels (unbiased std), and
    C = mean_b z_tᵀ z_v / divisor, where the released code divides by the text length
    (max_words). C_ii then peaks at (d − 1) / divisor rather than 1.
    """
    z_t = _standardise(text_factors.float(), dim=-1, unbiased=True, eps=eps)
    z_v = _standardise(video_factors.float(), dim=-1, unbiased=True, eps=eps)
    return torch.einsum("bic,bjc->ij", z_t, z_v) / (z_t.shape[0] * divisor)


def _standardise(x: Tensor, dim: int, unbiased: bool, eps: float) -> Tensor:
    centred = x - x.mean(dim=dim, keepdim=True)
    return centred / (x.var(dim=dim, keepdim=True, unbiased=unbiased) + eps).sqrt()


def decoupling_loss(correlation: Tensor) -> Tensor:
    """Eq. 6, inter-concept decoupling L_D = Σ_i Σ_{j≠i} C_ij²."""
    off_diagonal = correlation - torch.diag_embed(torch.diagonal(correlation))
    return off_diagonal.pow(2).sum()


def alignment_loss(correlation: Tensor) -> Tensor:
    """Eq. 7, intra-concept alignment L_A = Σ_i (1 − C_ii)²."""
    return (1 - torch.diagonal(correlation)).pow(2).sum()
