"""Inference-time post-processing of similarity matrices: DSL and QB-Norm (DIS).

Both use information about the *whole* test gallery (DSL) or an extra query bank (QB-Norm),
so numbers obtained with them are not comparable with plain retrieval numbers; always report
them next to the raw ones.

Orientation convention: ``sim`` is ``[N_t, N_v]`` (captions x videos) unless stated
otherwise.  Text->video ranks are read along rows, video->text ranks along columns
(see :mod:`dicosa.metrics`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Bank rows processed at once in qb_norm; bounds the [rows, N_g] temporaries.
_BANK_CHUNK_ELEMS = 1 << 24


def dual_softmax(sim: Tensor, temperature: float = 1 / 100, dim: int = 0) -> Tensor:
    """Dual-softmax (DSL) revision of a similarity matrix.

    DSL (Cheng et al. 2021, "Improving Video-Text Retrieval by Multi-Stream Corpus Alignment
    and Dual Softmax Loss", arXiv 2109.04290) multiplies each similarity by a prior computed
    with a softmax along the *other* axis than the one that is ranked, so that a pair scores
    high only if it is a good match in both directions:

        out = sim * softmax(sim / temperature, dim) * sim.shape[dim]

    * text->video (rank each row over videos): ``dim=0`` — for each video, a softmax over
      all captions.  A "hub" video that is close to many captions spreads its prior mass
      over all of them and is pushed down for each.
    * video->text (rank each column over captions): ``dim=1`` — for each caption, a softmax
      over all videos.

    The factor ``sim.shape[dim]`` makes a uniform prior equal to 1 and changes no ranking.
    This is the authors' definition (``starmemda/CAMoE: DSL.py``), applied at inference as
    DiCoSA-derived code does (temperature 0.01 both ways); as there, a negative similarity
    becomes *more* negative under a larger prior.

    Args:
        sim: [N_t, N_v] similarities.
        temperature: softmax temperature of the prior (DiCoSA uses 1/100 for cosines).
        dim: axis of the softmax (0 for t2v ranking, 1 for v2t ranking).

    Returns:
        [N_t, N_v] revised similarities, same orientation as ``sim``.
    """
    if sim.dim() != 2:
        raise ValueError(f"sim must be 2-D, got shape {tuple(sim.shape)}")
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    prior = F.softmax(sim / temperature, dim=dim)
    return sim * prior * sim.shape[dim]


def dsl_t2v(sim: Tensor, temperature: float = 1 / 100) -> Tensor:
    """DSL for text->video ranking: prior over captions for each video.

    Args:
        sim: [N_t, N_v].

    Returns:
        [N_t, N_v]; rank rows (e.g. :func:`dicosa.metrics.ranks_t2v`).
    """
    return dual_softmax(sim, temperature, dim=0)


def dsl_v2t(sim: Tensor, temperature: float = 1 / 100) -> Tensor:
    """DSL for video->text ranking: prior over videos for each caption.

    Args:
        sim: [N_t, N_v] (not transposed).

    Returns:
        [N_t, N_v]; rank columns (e.g. :func:`dicosa.metrics.ranks_v2t`).
    """
    return dual_softmax(sim, temperature, dim=1)


def hub_gallery_items(bank: Tensor, k: int = 1, theta: float = 3.0) -> Tensor:
    """Gallery items that the query bank retrieves often ("activated set" of DIS).

    Counts, for every gallery item, in how many bank queries it is among the top-k, and keeps
    the items with ``count >= theta``.

    Args:
        bank: [N_b, N_g] bank-query x gallery similarities.
        k: top-k retrieved per bank query.
        theta: occurrence threshold.

    Returns:
        [N_g] bool, True for activated (hub) gallery items.
    """
    n_b, n_g = bank.shape
    if not 1 <= k <= n_g:
        raise ValueError(f"k must be in [1, N_g={n_g}], got {k}")
    counts = torch.zeros(n_g, dtype=torch.long, device=bank.device)
    step = max(1, _BANK_CHUNK_ELEMS // max(1, n_g))
    for start in range(0, n_b, step):
        top = bank[start : start + step].topk(k, dim=1).indices.flatten()
        counts += torch.bincount(top, minlength=n_g)
    return counts >= theta


def qb_norm(
    sim: Tensor,
    bank: Tensor,
    k: int = 1,
    beta: float = 70.0,
    theta: float = 3.0,
    *,
    log_domain: bool = True,
) -> Tensor:
    """Querybank normalisation with the Dynamic Inverted Softmax (DIS).

    QB-Norm (Bogolin et al., CVPR 2022, "Cross Modal Retrieval with Querybank
    Normalisation") reduces hubness — gallery items that are nearest neighbour of many
    queries — using a bank of extra queries (training captions for t2v):

    1. Activated set ``A``: gallery items that occur in the top-``k`` of at least ``theta``
       bank queries (:func:`hub_gallery_items`).
    2. For every test query whose top-1 gallery item (argmax of its raw row, first index on
       ties) is in ``A``, replace its row by the inverted softmax
       ``exp(beta * sim[q, g]) / sum_b exp(beta * bank[b, g])`` (normalised per gallery item
       over the bank).  All other rows keep their raw similarities.

    Rows therefore end up on different scales; the result is only meant for ranking within
    each row (each query), which is also how the reference uses it.

    The authors' reference (``ioanacroi/qb-norm``) activates every item of the bank top-k
    (``theta = 1``, ``beta = 20``); the defaults here follow released DiCoSA
    (``jpthu17/DiCoSA: main_retrieval.py``: ``count >= theta``, ``k=1, beta=70``, theta 3
    for t2v and 5 for v2t).

    Banks per direction:

    * text->video: ``sim`` = test captions x test videos ``[N_t, N_v]``; ``bank`` = training
      captions x test videos ``[N_b, N_v]``.
    * video->text: ``sim`` = ``sim_t2v.T`` (test videos x test captions ``[N_v, N_t]``);
      ``bank`` = training videos x test captions ``[N_bv, N_t]``.  Transpose the result back
      before :func:`dicosa.metrics.ranks_v2t`, or rank its rows directly.

    Numerics: ``exp(70 * s)`` overflows fp32 for ``s > ~1.27`` and the bank sum overflows
    earlier, so the normaliser is a (chunked) log-sum-exp and the normalised rows are
    computed as ``beta * sim - logsumexp_b(beta * bank)``.  With ``log_domain=True``
    (default) that log value is returned: it ranks exactly like the reference ratio (log is
    monotone) but cannot underflow to 0, which would otherwise create artificial ties among
    poorly matching items.  ``log_domain=False`` returns ``exp`` of it, i.e. the reference's
    values, where representable.

    Args:
        sim: [N_q, N_g] test query x gallery similarities.
        bank: [N_b, N_g] bank query x the same gallery similarities.
        k: top-k per bank query used to build the activated set.
        beta: inverse temperature of the inverted softmax.
        theta: occurrence threshold of the activated set (``count >= theta``).
        log_domain: return log-scores for normalised rows (see Numerics).

    Returns:
        [N_q, N_g]: normalised rows for queries whose top-1 item is activated, raw rows
        otherwise.  Dtype: that of ``sim``, upcast to at least float32.
    """
    if sim.dim() != 2 or bank.dim() != 2 or sim.shape[1] != bank.shape[1]:
        raise ValueError(
            f"need sim [N_q, N_g] and bank [N_b, N_g]; got {tuple(sim.shape)}, {tuple(bank.shape)}"
        )
    if bank.shape[0] == 0:
        raise ValueError("empty query bank")
    dtype = torch.promote_types(sim.dtype, torch.float32)
    sim, bank = sim.to(dtype), bank.to(dtype)

    activated = hub_gallery_items(bank, k=k, theta=theta)  # [N_g]
    rows = activated[sim.argmax(dim=1)]  # [N_q]
    out = sim.clone()
    if not rows.any():
        return out

    # Chunked log-sum-exp over the bank so that [N_b, N_g] * beta is never materialised.
    n_g = bank.shape[1]
    step = max(1, _BANK_CHUNK_ELEMS // max(1, n_g))
    log_norm = torch.full((n_g,), float("-inf"), dtype=dtype, device=bank.device)
    for start in range(0, bank.shape[0], step):
        chunk_lse = torch.logsumexp(beta * bank[start : start + step], dim=0)
        log_norm = torch.logaddexp(log_norm, chunk_lse)

    normed = beta * sim[rows] - log_norm[None, :].to(sim.device)
    out[rows] = normed if log_domain else normed.exp()
    return out
