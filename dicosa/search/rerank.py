"""DiCoSA's score for given (text, video) pairs: the rerank of first-stage candidates.

:meth:`DiCoSA.score` scores every text against every video. A rerank needs only the pairs
(query q, candidate c of q), and then each pair's pooling weights are known before anything of
width D is built. Eq. 1 is linear in the frames, and so are the projection W_k of Eq. 2 and
the video half of the confidence MLP's first layer (Eq. 8), so the frames are pooled first:

    e^v = W (Σ_i a_i f_i)            instead of   Σ_i a_i (W f_i)
    W_1^v e_k^v                      instead of   Σ_i a_i (W_1^v e_{k,i}^v)

which costs one D×D projection and one K×d×H product per pair rather than N of each (the
batch path must keep them per frame, since there each frame is pooled under many texts).
The result equals :meth:`DiCoSA.score` up to float rounding (tests/test_index_search.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import functional as DF
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["pair_scores"]


def pair_scores(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                eps: float = 1e-6) -> Tensor:
    """S (Eq. 9) of matched pairs: text ``i`` with video ``i``, ``[P, D]`` and ``[P, N, D]``
    -> ``[P]`` float32. ``eps`` is the one :func:`dicosa.functional.concept_similarity` uses."""
    frames = video.frames
    weights = DF.matched_pooling_weights(text.text, frames, video.frame_mask,
                                         model.config.pool_temperature, model.mask_mode)
    pooled = torch.einsum("pn,pnd->pd", weights.to(frames.dtype), frames)  # [P, D]
    head = model.head
    video_factors = head.frame_factors(pooled)  # [P, K, d]
    text_factors = head.text_factors(text.text)  # [P, K, d]
    dots = (text_factors * video_factors).sum(-1).float()  # [P, K]
    norms = (text_factors.pow(2).sum(-1).float() * video_factors.pow(2).sum(-1).float())
    cosines = dots / norms.clamp_min(eps**2).sqrt()  # [P, K]
    confidences = head.confidence(text_factors, video_factors).float()  # [P, K]
    return (confidences * cosines).sum(-1)
