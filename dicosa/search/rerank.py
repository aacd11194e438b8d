"""DiCoSA's score for given (text, video) pairs: the rerank of first-stage candidates.

:meth:`DiCoSA.score` scores every text against every video. A rerank needs only the pairs
(query q, candidate c of q), and then each pair's pooling weights are known before anything of
width D is built. Eq. 1 is linear in the frames, and so are the projection W_k of Eq. 2 and
the video half of the confidence MLP's first layer (Eq. 8), so the frames are pooled first:

    e^v = W (Σ_i a_i f_i)            instead of   Σ_i a_i (W f_i)
    W_1^v e_k^v                      instead of   Σ_i a_i (W_1^v e_{k,i}^v)

which costs one D×D projection and one K×d×H product per pair rather than N of each.
Everything of the text alone is computed once per query, not per pair. The result equals
:meth:`DiCoSA.score` up to float rounding (tests/test_index_search.py); docs/search.md
("Rerank") says why nothing more of it moves to index time.

Frames of an int8 index arrive as kept (:class:`QuantisedVideo`) and are dequantised a block
of pairs at a time into one reused float32 buffer just before Eq. 1 pools them, rather than
into fresh memory per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import functional as DF
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["QuantisedVideo", "pair_scores"]

# Pairs dequantised at a time (3 MiB of float32 at N=12, D=512): small enough to stay in the
# CPU's cache between dequantising and pooling, large enough that a block's dozen torch calls
# cost little beside its arithmetic.
_DEQUANTISED_PAIRS = 128


@dataclass
class QuantisedVideo:
    """Pairs' frames as an int8 index keeps them: frame = ``scale`` × ``codes``."""

    codes: Tensor  # [P, N, D] int8
    scale: Tensor  # [P, N] float32
    frame_mask: Tensor  # [P, N] bool

    def __len__(self) -> int:
        return len(self.codes)

    def rows(self, run: slice | Tensor) -> QuantisedVideo:
        return QuantisedVideo(self.codes[run], self.scale[run], self.frame_mask[run])


def pair_scores(model: DiCoSA, text: TextFeatures, video: VideoFeatures | QuantisedVideo,
                eps: float = 1e-6, pairs: Tensor | None = None) -> Tensor:
    """S (Eq. 9) of matched pairs -> ``[P]`` float32.

    ``video`` holds the pairs' frames ``[P, N, D]`` (as float, or int8 as kept). Without
    ``pairs``, ``text`` is ``[P, D]``
    and pair i is text i with video i; with ``pairs`` (int64 ``[P]``), ``text`` is ``[Q, D]``
    and pair i is text ``pairs[i]`` with video i, the text side computed once per text and
    each run of pairs that share a text scored with it broadcast (a rerank's candidates come
    query by query): nothing of the text is copied per pair.
    ``eps`` is the one :func:`dicosa.functional.concept_similarity` uses.
    """
    text_side = _TextSide.of(model.head, text.text)
    if pairs is None:
        return _scores(model, text_side, video, eps)
    out = torch.empty(len(pairs), dtype=torch.float32, device=video.frame_mask.device)
    order = torch.argsort(pairs, stable=True)
    ordered = pairs[order]
    sorted_already = bool((order == torch.arange(len(order), device=order.device)).all())
    queries, counts = torch.unique_consecutive(ordered, return_counts=True)
    start = 0
    for query, count in zip(queries.tolist(), counts.tolist(), strict=True):
        run = slice(start, start + count) if sorted_already else order[start:start + count]
        out[run] = _scores(model, text_side.one(query), _rows(video, run), eps)
        start += count
    return out


@dataclass
class _TextSide:
    """Everything of the texts alone (computed once per text)."""

    text: Tensor  # [Q, D]
    factors: Tensor  # [Q, K, d]
    norms: Tensor  # [Q, K] the factors' squared norms
    hidden: Tensor | None  # [Q, K, H] the MLP's text half (None: no confidence MLP)

    @classmethod
    def of(cls, head, text: Tensor) -> _TextSide:
        factors = head.text_factors(text)
        return cls(text, factors, factors.pow(2).sum(-1).float(), head.text_hidden(factors))

    def one(self, query: int) -> _TextSide:
        """Text ``query`` alone, each part with a leading axis of 1 (broadcast over pairs)."""
        part = slice(query, query + 1)
        return _TextSide(self.text[part], self.factors[part], self.norms[part],
                         None if self.hidden is None else self.hidden[part])


def _rows(video: VideoFeatures | QuantisedVideo, run: slice | Tensor
          ) -> VideoFeatures | QuantisedVideo:
    if isinstance(video, QuantisedVideo):
        return video.rows(run)
    return VideoFeatures(video.frames[run], video.frame_mask[run])


def _pooled(model: DiCoSA, text: Tensor, frames: Tensor, mask: Tensor) -> Tensor:
    """Eq. 1 for each pair: its frames ``[P, N, D]`` pooled under its text (``[P, D]``, or
    ``[1, D]`` broadcast) -> ``[P, D]``."""
    per_pair = text.expand(len(frames), -1)  # [P, D] (a view when one text)
    weights = DF.matched_pooling_weights(per_pair, frames, mask,
                                         model.config.pool_temperature, model.mask_mode)
    return torch.bmm(weights.to(frames.dtype)[:, None], frames)[:, 0]


def _pooled_quantised(model: DiCoSA, text: Tensor, video: QuantisedVideo,
                      dtype: torch.dtype) -> Tensor:
    """:func:`_pooled` of int8 frames, dequantised a block at a time (module docstring)."""
    count, frames, dim = video.codes.shape
    device = video.codes.device
    out = torch.empty(count, dim, dtype=dtype, device=device)
    block = torch.empty(min(count, _DEQUANTISED_PAIRS), frames, dim, device=device)
    for start in range(0, count, _DEQUANTISED_PAIRS):
        part = slice(start, start + _DEQUANTISED_PAIRS)
        real = block[:len(video.codes[part])]
        real.copy_(video.codes[part]).mul_(video.scale[part, :, None])  # [p, N, D] float32
        rows = text if len(text) == 1 else text[part]
        out[part] = _pooled(model, rows, real.to(dtype), video.frame_mask[part])
    return out


def _scores(model: DiCoSA, text: _TextSide, video: VideoFeatures | QuantisedVideo,
            eps: float) -> Tensor:
    """S of pair i = (text i, video i), a text side of one row broadcast over the videos."""
    if isinstance(video, QuantisedVideo):
        pooled = _pooled_quantised(model, text.text, video, text.text.dtype)  # [P, D]
    else:
        pooled = _pooled(model, text.text, video.frames, video.frame_mask)  # [P, D]
    head = model.head
    video_factors = head.frame_factors(pooled)  # [P, K, d]
    dots = (text.factors * video_factors).sum(-1).float()  # [P, K]
    norms = text.norms * video_factors.pow(2).sum(-1).float()
    cosines = dots / norms.clamp_min(eps**2).sqrt()  # [P, K]
    if text.hidden is None:  # no confidence MLP: g_k = 1/K
        confidences = torch.full_like(cosines, 1.0 / head.num_concepts)
    else:
        hidden = head.frame_hidden(video_factors).add_(text.hidden).relu_()  # [P, K, H]
        out = head.conf_out  # the MLP's second layer, H -> 1: a matrix-vector product
        confidences = torch.mv(hidden.flatten(0, 1), out.weight[0]).add_(out.bias)
        confidences = confidences.view(cosines.shape).float()  # [P, K]
    return (confidences * cosines).sum(-1)
