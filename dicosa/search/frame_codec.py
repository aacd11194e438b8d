"""How the frame store keeps frame vectors: float16, or int8 with one scale per frame, and
how far the int8 form can move DiCoSA's score.

**int8** (an index option, ``frame_dtype="int8"``): each frame vector x (width D) is kept as
int8 codes q and one float32 scale s, symmetric:

    s = max_j |x_j| / 127,    q_j = round(x_j / s) in [-127, 127],    x̂_j = s q_j

so every element is off by at most half a step, |x̂_j - x_j| <= s / 2, and the whole vector by
||x̂ - x||₂ <= √D s / 2. A frame costs D + 4 bytes instead of float16's 2D: the store is about
half the size (12 MB -> 6 MB of frames read per query of 1,000 ViT-B/32 candidates).

:func:`score_tolerance` carries that half step through Eq. 1, 2, 8 and 9 (DiCoSA's gradient)
to how far S of a pair can move, to first order; the tests hold the rerank on int8 frames to
it against :meth:`DiCoSA.score` on the float frames (tests/test_frame_codec.py). A bound
without the first-order step (each inequality taken at its worst: Cauchy-Schwarz on Eq. 1's
logits, the softmax's Lipschitz constant, the MLP's operator norms) holds for any rounding
but is far looser than the score's range on the models tested, so it states nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model import DiCoSA, TextFeatures, VideoFeatures
from .rerank import pair_scores

__all__ = ["FRAME_DTYPES", "check_frame_dtype", "dequantise", "quantise", "score_tolerance"]

FRAME_DTYPES = ("float16", "int8")
_LEVELS = 127


def check_frame_dtype(frame_dtype: str) -> str:
    """``frame_dtype`` if the store can keep frames that way, else one ValueError sentence."""
    if frame_dtype not in FRAME_DTYPES:
        raise ValueError(f"frame_dtype must be one of {', '.join(FRAME_DTYPES)}, got "
                         f"{frame_dtype!r}")
    return frame_dtype


def quantise(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Frame vectors ``[..., D]`` (any float) -> int8 codes ``[..., D]`` and float32 scales
    ``[...]`` (module docstring). Non-finite values (only ever in padding: valid frames are
    checked before they are stored) are kept as 0."""
    x = np.nan_to_num(np.asarray(frames, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    scale = (np.abs(x).max(axis=-1) / _LEVELS).astype(np.float32)  # [...]
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    codes = np.clip(np.rint(x / safe[..., None]), -_LEVELS, _LEVELS).astype(np.int8)
    return codes, scale


def dequantise(codes: np.ndarray, scale: np.ndarray, dtype=np.float32) -> np.ndarray:
    """x̂ = s q: codes ``[..., D]`` and scales ``[...]`` -> ``[..., D]`` of ``dtype`` (numpy's
    float32 products, computed by torch on its threads: faster)."""
    out = torch.from_numpy(np.ascontiguousarray(codes)).to(torch.float32)
    out.mul_(torch.as_tensor(np.asarray(scale, dtype=np.float32))[..., None])
    out = out.numpy()
    return out if np.dtype(dtype) == np.float32 else out.astype(dtype)


def score_tolerance(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                    step: Tensor) -> Tensor:
    """How far S (Eq. 9) of each pair (text i, video i) can move when every element of frame
    n of video i is rounded by at most ``step[i, n] / 2``, to first order in the step:
    ``[P]`` float32,

        |ΔS| <= Σ_n Σ_j |∂S/∂f_nj| step_n / 2

    the largest change any such rounding makes through S's gradient (the worst signs, every
    element at its half step). The gradient is DiCoSA's own, through Eq. 1 (the softmax
    weights), Eq. 2, 8 and 9 (autograd of :func:`~dicosa.search.rerank.pair_scores`, which
    equals :meth:`DiCoSA.score`). Second-order terms are O(step²); float rounding of the two
    computations is not included (add a few ulps of S).

    Args:
        text: ``[P, D]``; video: the float (reference) frames ``[P, N, D]`` and mask.
        step: ``[P, N]`` the quantisation step s of each frame (0 where it is exact).
    """
    with torch.inference_mode(False), torch.enable_grad():
        frames = video.frames.detach().float().clone().requires_grad_(True)
        scores = pair_scores(model, TextFeatures(text.text.detach().float().clone()),
                             VideoFeatures(frames, video.frame_mask.clone()))
        (grad,) = torch.autograd.grad(scores.sum(), frames)
    return (grad.abs() * step.float()[..., None] / 2).sum(dim=(1, 2))
