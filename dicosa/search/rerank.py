"""DiCoSA's score for given (text, video) pairs: the rerank of first-stage candidates.

:meth:`DiCoSA.score` scores every text against every video. A rerank needs only the pairs
(query q, candidate c of q), and then each pair's pooling weights are known before anything of
width D is built. Eq. 1 is linear in the frames, and so are the projection W_k of Eq. 2 and
the video half of the confidence MLP's first layer (Eq. 8), so the frames are pooled first:

    e^v = W (Σ_i a_i f_i)            instead of   Σ_i a_i (W f_i)
    W_1^v e_k^v                      instead of   Σ_i a_i (W_1^v e_{k,i}^v)

which costs one D×D projection and one K×d×H product per pair rather than N of each (the
batch path must keep them per frame, since there each frame is pooled under many texts).
Everything of the text alone (its factors e^t_k = W^t_k T, their norms, the text half of the
MLP's first layer W_1^t e^t_k + b_1) is computed once per query, not per pair. The result
equals :meth:`DiCoSA.score` up to float rounding (tests/test_index_search.py).

**What could move to index time, and what cannot.** Per pair the rerank computes, for the C
candidates of a query with N frames of width D, K factors of width d = D/K and an MLP of
width H:

- Eq. 1's weights a_i = softmax_i(Tᵀ f_i / τ) (N·D per pair) need the raw frames f_i and the
  query: nothing of them exists before the query, and they need every stored frame. The
  pooled vector Σ a_i f_i (N·D) likewise.
- Eq. 2's projection W^v (paper variant; D² per pair, none in the released variant) is
  linear, so storing W^v f_i per frame at index time would be exact, but Eq. 1 still needs
  f_i itself (Tᵀ f_i is not a function of W^v f_i unless W^v is inverted, which is not exact
  in floating point): the store would hold both, twice the bytes read per candidate, to save
  one D×D product per pair. Not done.
- The MLP's video half W_1^v e^v_k (K·d·H = D·H per pair) is linear in the pooled vector too:
  storing W_1^v W^v_k f_i per frame would be exact but is K·H numbers per frame (4D with
  the default expansion of 4) beside the raw D that Eq. 1 needs: five times the bytes, to
  replace D·H by N·K·H per pair. Not done.
- Per frame and query-independent, so storable exactly: nothing else that the score reads.
  What is query-independent and exact is computed once per query instead (the text side,
  above), and the first stage's per-video vectors (the dense proxy: Eq. 1 at τ → ∞) are.

So the rerank reads each candidate's N frames once (:meth:`FrameStore.gather`, dequantised
when the index keeps int8 frames) and costs about N·D + N·D + D·H (+ D² in the paper
variant) multiply-adds per pair.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import functional as DF
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["pair_scores"]


def pair_scores(model: DiCoSA, text: TextFeatures, video: VideoFeatures,
                eps: float = 1e-6, pairs: Tensor | None = None) -> Tensor:
    """S (Eq. 9) of matched pairs -> ``[P]`` float32.

    ``video`` holds the pairs' frames ``[P, N, D]``. Without ``pairs``, ``text`` is ``[P, D]``
    and pair i is text i with video i; with ``pairs`` (int64 ``[P]``), ``text`` is ``[Q, D]``
    and pair i is text ``pairs[i]`` with video i, the text side computed once per text.
    ``eps`` is the one :func:`dicosa.functional.concept_similarity` uses.
    """
    frames = video.frames
    queries = text.text
    per_pair = queries if pairs is None else queries[pairs]  # [P, D]
    weights = DF.matched_pooling_weights(per_pair, frames, video.frame_mask,
                                         model.config.pool_temperature, model.mask_mode)
    pooled = torch.einsum("pn,pnd->pd", weights.to(frames.dtype), frames)  # [P, D]
    head = model.head
    video_factors = head.frame_factors(pooled)  # [P, K, d]
    text_factors = head.text_factors(queries)  # [Q, K, d] (Q = P without pairs)
    text_norms = text_factors.pow(2).sum(-1).float()  # [Q, K]
    text_hidden = head.text_hidden(text_factors)  # [Q, K, H] or None
    if pairs is not None:
        text_factors, text_norms = text_factors[pairs], text_norms[pairs]
        text_hidden = None if text_hidden is None else text_hidden[pairs]
    dots = (text_factors * video_factors).sum(-1).float()  # [P, K]
    norms = text_norms * video_factors.pow(2).sum(-1).float()
    cosines = dots / norms.clamp_min(eps**2).sqrt()  # [P, K]
    if text_hidden is None:  # no confidence MLP: g_k = 1/K
        confidences = torch.full_like(cosines, 1.0 / head.num_concepts)
    else:
        hidden = F.relu(head.frame_hidden(video_factors).add_(text_hidden))  # [P, K, H]
        confidences = head.conf_out(hidden).squeeze(-1).float()  # [P, K]
    return (confidences * cosines).sum(-1)
