"""Where each concept factor looks: per-factor frame heat maps, word attributions and names.

:func:`visualize_factors` explains the DiCoSA score of one video against one or more texts
(paper §4.4, Fig. 5, Appendix D) and returns a matplotlib figure together with a
:class:`FactorReport` holding every number behind it, as a :class:`Figured` pair: it unpacks
as ``figure, report`` and, as the last expression of a notebook cell, shows the figure.

For each text the score decomposes exactly as S = Σ_k g_k s_k (Eq. 9), where the video factor
e_k^v pools the frames with the text-conditioned weights a_i (Eq. 1). For each factor k:

* frame heat map: attention rollout through CLIP's image transformer, each block's attention
  probabilities A weighted by the gradient of g_k·s_k with respect to A, positive part,
  averaged over heads, and rolled out (R ← R + Ā R, starting from the identity, which keeps
  the residual path) from the CLS token to the patches (Appendix D);
* word attribution: gradient × input of g_k·s_k on the token embeddings, summed over width;
* name: the vocabulary words whose own text factor k has the largest cosine with the video's
  factor k for this text.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from .data.protocol import FrameProtocol
from .model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["DEFAULT_VOCABULARY", "FactorReport", "Figured", "PairReport", "WordsReport",
           "plot_factor_report", "visualize_factors", "visualize_words"]

# Common words of video captions (objects, people, actions, scenes, colours): the default pool
# of factor names when no captions are given.
_DEFAULT_WORDS = """
man woman person people boy girl child children baby kid men women player players team crowd
audience singer band chef host reporter driver dancer dog cat horse bird fish animal animals
car cars truck bus train bike bicycle motorcycle boat plane airplane road street city house room
kitchen table food water ocean sea beach river lake pool snow mountain field grass tree trees
forest sky fire stage screen game video music song guitar piano drum ball football soccer
basketball tennis baseball golf race track ring shirt dress hair face hand hands phone
computer camera book paper toy cartoon news show movie scene picture lights night
talking speaking singing dancing playing running walking jumping swimming driving riding
cooking eating drinking cutting mixing pouring fighting laughing smiling crying sitting
standing lying holding showing looking watching explaining throwing kicking hitting climbing
skiing surfing skating flying falling shooting reading writing drawing painting sleeping
red blue green yellow black white small large young old funny loud fast slow
"""
DEFAULT_VOCABULARY: tuple[str, ...] = tuple(_DEFAULT_WORDS.split())

# Function words dropped when a vocabulary is built from captions.
_STOP_TEXT = """
a an the and or but of in on at to for from with by as into onto over under up down out off
is are was were be been being am it its this that these those there here he she they them his
her their him we you your our i me my mine who whom which what when where why how while then
than so very too just also not no yes do does did doing has have had having can could will
would should may might must some any all each other another one two three about after before
through during again more most much many such only own same s t
"""
_STOP_WORDS = frozenset(_STOP_TEXT.split())

_WORD = re.compile(r"[a-z]+")
_SPECIAL_TOKENS = {"<start_of_text>": "[SOT]", "<end_of_text>": "[EOT]"}


@dataclass
class PairReport:
    """The numbers behind one text–video pair. K factors, N frames, L tokens (SOT … EOT).

    Attributes:
        text: the caption.
        tokens: ``[L]`` token strings, ``"[SOT]"`` first and ``"[EOT]"`` last.
        similarity: S, equal to ``model.score`` for this pair.
        weights: ``[N]`` pooling weights a_i of Eq. 1 (0 on padded frames).
        cosines: ``[K]`` s_k = cos(e_k^t, e_k^v).
        confidences: ``[K]`` g_k of Eq. 8.
        contributions: ``[K]`` g_k·s_k; they sum to ``similarity``.
        heatmaps: ``[K, N, h, w]`` rollout relevance of each patch (h × w patch grid), ≥ 0.
        word_attributions: ``[K, L]`` gradient × input per token (signed).
        factor_names: ``[K]`` lists of the top vocabulary words per factor, best first.
        name_scores: ``[K]`` lists of those words' cosines.
    """

    text: str
    tokens: list[str]
    similarity: float
    weights: np.ndarray
    cosines: np.ndarray
    confidences: np.ndarray
    contributions: np.ndarray
    heatmaps: np.ndarray
    word_attributions: np.ndarray
    factor_names: list[list[str]]
    name_scores: list[list[float]]


@dataclass
class FactorReport:
    """Everything :func:`visualize_factors` plotted, as plain numpy arrays.

    Attributes:
        video: the video's path, or None when frames were passed.
        frames: ``[N, 3, H, W]`` uint8 frames as the model saw them.
        frame_mask: ``[N]`` bool, False for padding.
        pairs: one :class:`PairReport` per text, in the order given.
    """

    video: str | None
    frames: np.ndarray
    frame_mask: np.ndarray
    pairs: list[PairReport] = field(default_factory=list)

    @property
    def num_concepts(self) -> int:
        return len(self.pairs[0].cosines) if self.pairs else 0

    @property
    def similarity(self) -> np.ndarray:
        """``[T]`` S for each text."""
        return np.array([p.similarity for p in self.pairs])


class Figured(NamedTuple):
    """A figure and the numbers behind it (``figure, report = visualize_factors(...)``).

    The figure is not managed by pyplot (nothing stays open, no GUI backend is needed); in a
    notebook this pair displays as the figure itself (:meth:`_repr_png_`), and
    ``figure.savefig`` writes it anywhere."""

    figure: Figure
    report: Any  # FactorReport or WordsReport

    @classmethod
    def saved(cls, figure: Figure, report: Any, save_path: str | os.PathLike | None
              ) -> Figured:
        """The pair, the figure written to ``save_path`` as PNG first when one is given."""
        if save_path is not None:
            Path(save_path).parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(save_path, format="png", dpi=100)
        return cls(figure, report)

    def _repr_png_(self) -> bytes:
        out = io.BytesIO()
        self.figure.savefig(out, format="png", dpi=100)
        return out.getvalue()

    def __repr__(self) -> str:  # the report's arrays are too long to print
        return f"Figured({self.figure!r}, {type(self.report).__name__})"


def visualize_factors(
    model: DiCoSA,
    video: str | os.PathLike | Tensor,
    texts: str | Sequence[str],
    *,
    frame_mask: Tensor | None = None,
    tokenizer: Callable[[list[str]], Tensor] | None = None,
    vocabulary: Sequence[str] | None = None,
    num_names: int = 3,
    save_path: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    protocol: FrameProtocol | None = None,
) -> Figured:
    """Explain the DiCoSA score of one video against each text, factor by factor.

    Args:
        model: a DiCoSA model (either variant, any K).
        video: a video file (decoded with :func:`dicosa.data.video.load_video` at the model's
            ``num_frames`` and ``image_size``), or uint8 frames ``[N, 3, H, W]``.
        texts: one caption or a list of captions.
        frame_mask: ``[N]`` bool for frame tensors (default: all frames valid).
        tokenizer: maps a list of strings to ``[B, L]`` tokens; default
            ``get_tokenizer(model.config.arch, model.config.max_words)``.
        vocabulary: words or whole captions (e.g. the dataset's captions) to name factors
            from; captions are split into words, function words dropped and the 1000 most
            frequent kept. Default: :data:`DEFAULT_VOCABULARY`.
        num_names: words per factor name.
        save_path: write the figure there as PNG.
        device: run on this device (the model is moved there); default the model's device.
        protocol: how a video file's frames are picked and padded; pass the checkpoint's
            (``FrameProtocol.of(cfg.data)``) so the model sees what it was trained on. Default
            :class:`~dicosa.data.protocol.FrameProtocol` (segments, black padding).

    Returns:
        ``(figure, report)`` (a :class:`Figured`). The figure has one subfigure per text,
        laid out as a grid of K + 1 rows and N + 1 columns: row 0 shows the frames titled with
        a_i and, on the right, the per-factor bars of s_k, g_k and g_k·s_k; row k (1..K) shows
        factor k's heat map over every frame and, on the right, its word attributions. Every
        axes carries a
        label ``"text{t}/frame{i}"``, ``"text{t}/summary"``, ``"text{t}/factor{k}/frame{i}"``
        or ``"text{t}/factor{k}/words"`` (``ax.get_label()``).
    """
    from .clip import get_tokenizer

    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError("texts is empty: pass at least one caption")
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    tokenizer = tokenizer or get_tokenizer(model.config.arch, model.config.max_words)
    frames, mask, video_name = _frames_of(model, video, frame_mask,
                                          protocol or FrameProtocol())

    was_training = model.training
    model.eval()
    try:
        words = _vocabulary_words(vocabulary)
        word_factors = _encode_words(model, tokenizer, words, device)  # [V, K, d]
        tokens = tokenizer(texts).to(device)  # [T, L]
        report = FactorReport(video_name, frames.numpy(), mask.numpy())
        clean = _explain_clean(model, tokens, frames, mask, device)
        relevance = _relevance(model, tokens, frames, mask, device)
        for t, text in enumerate(texts):
            names = _factor_names(clean["video_factors"][t], word_factors, words, num_names)
            report.pairs.append(_pair_report(text, t, tokens, tokenizer, clean, relevance,
                                             names))
    finally:
        model.train(was_training)

    return Figured.saved(plot_factor_report(report), report, save_path)


def _pair_report(text: str, t: int, tokens: Tensor, tokenizer, clean: dict, relevance: dict,
                 names: tuple[list[list[str]], list[list[float]]]) -> PairReport:
    """Text ``t``'s part of the explanation: its score factor by factor, the frames' and
    words' relevance, and the factors' names with their scores."""
    length = int(tokens[t].argmax()) + 1  # through EOT, the largest id
    return PairReport(
        text=text,
        tokens=_token_strings(tokenizer, tokens[t, :length].tolist()),
        similarity=float(clean["similarity"][t]),
        weights=clean["weights"][t].numpy(),
        cosines=clean["cosines"][t].numpy(),
        confidences=clean["confidences"][t].numpy(),
        contributions=(clean["confidences"][t] * clean["cosines"][t]).numpy(),
        heatmaps=relevance["heatmaps"][t].numpy(),
        word_attributions=relevance["words"][t][:, :length].numpy(),
        factor_names=names[0],
        name_scores=names[1],
    )


# -- inputs ----------------------------------------------------------------------------------
def _frames_of(model: DiCoSA, video, frame_mask: Tensor | None,
               protocol: FrameProtocol) -> tuple[Tensor, Tensor, str | None]:
    """uint8 ``[N, 3, S, S]`` frames, bool ``[N]`` mask and the video's name."""
    if isinstance(video, (str, os.PathLike)):
        from .data.video import load_video

        frames, mask = load_video(video, model.config.num_frames, model.image_size,
                                  sampling=protocol.sampling, pad_colour=protocol.pad_colour)
        return frames, mask, str(video)
    if not isinstance(video, Tensor) or video.ndim != 4 or video.shape[1] != 3:
        raise ValueError("video must be a path or uint8 frames [N, 3, H, W], got "
                         f"{getattr(video, 'shape', type(video).__name__)}")
    if video.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8 (0-255), got {video.dtype}")
    frames = video.detach().cpu()
    if frames.shape[-2:] != (model.image_size, model.image_size):
        from torchvision.transforms.v2 import functional as TF

        frames = TF.center_crop(TF.resize(frames, [model.image_size], antialias=True),
                                [model.image_size, model.image_size])
    if frame_mask is None:
        mask = torch.ones(frames.shape[0], dtype=torch.bool)
    else:
        mask = frame_mask.detach().cpu().bool()
        if mask.shape != (frames.shape[0],):
            raise ValueError(f"frame_mask must be [{frames.shape[0]}], got {tuple(mask.shape)}")
    return frames, mask, None


def _vocabulary_words(vocabulary: Sequence[str] | None, limit: int = 1000) -> list[str]:
    if vocabulary is None:
        return list(DEFAULT_VOCABULARY)
    if isinstance(vocabulary, str):
        vocabulary = [vocabulary]
    counts = Counter(w for entry in vocabulary for w in _WORD.findall(entry.lower())
                     if w not in _STOP_WORDS)
    if not counts:
        raise ValueError("vocabulary holds no usable words")
    # Most frequent first; ties broken alphabetically so names are reproducible.
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def _token_strings(tokenizer, ids: list[int]) -> list[str]:
    inner = getattr(tokenizer, "func", tokenizer)  # get_tokenizer returns a functools.partial
    if not hasattr(inner, "decode"):
        return [str(i) for i in ids]
    pieces = (inner.decode([i]).strip() for i in ids)
    return [_SPECIAL_TOKENS.get(piece, piece) for piece in pieces]


# -- numbers ---------------------------------------------------------------------------------
@torch.no_grad()
def _encode_words(model: DiCoSA, tokenizer, words: list[str], device, batch: int = 256) -> Tensor:
    """Text factors of each vocabulary word, ``[V, K, d]``."""
    out = [model.head.text_factors(model.encode_text(tokenizer(words[i:i + batch]).to(device))
                                   .text).float().cpu()
           for i in range(0, len(words), batch)]
    return torch.cat(out)


@torch.no_grad()
def _explain_clean(model: DiCoSA, tokens: Tensor, frames: Tensor, mask: Tensor,
                   device) -> dict[str, Tensor]:
    """The model's own forward (no hooks), so S matches ``model.score`` bit for bit."""
    text = model.encode_text(tokens)
    video = model.encode_video(frames[None].to(device), mask[None].to(device))
    parts = {k: v[:, 0].float().cpu() for k, v in model.explain(text, video).items()}
    frame_factors = model.head.frame_factors(video.frames)[0].float().cpu()  # [N, K, d]
    parts["video_factors"] = torch.einsum("tn,nkc->tkc", parts["weights"], frame_factors)
    return parts


def _factor_names(video_factors: Tensor, word_factors: Tensor, words: list[str],
                  num_names: int) -> tuple[list[list[str]], list[list[float]]]:
    """Top words per factor by cos(word's e_k^t, video's e_k^v): ``[K, d]``, ``[V, K, d]``."""
    cos = F.cosine_similarity(word_factors, video_factors[None], dim=-1)  # [V, K]
    top = cos.topk(min(num_names, len(words)), dim=0)
    names = [[words[i] for i in top.indices[:, k].tolist()] for k in range(cos.shape[1])]
    scores = [top.values[:, k].tolist() for k in range(cos.shape[1])]
    return names, scores


class _AttentionCapture:
    """Route each image block's attention through an explicit softmax(QKᵀ/√d) we can
    differentiate against.

    nn.MultiheadAttention is called with ``need_weights=False`` (fused kernels), so its
    probabilities never exist as a tensor. A forward hook on each block's ``attn`` recomputes
    them from ``in_proj_weight`` on the block's ln_1 output and returns the attention output
    built from them, which replaces the module's output: the rest of the forward is unchanged
    (up to rounding) and now depends on the captured probabilities.
    """

    def __init__(self, blocks: Sequence[nn.Module]):
        self.probs: list[Tensor] = []
        self.handles = []
        for block in blocks:
            attn = getattr(block, "attn", None)
            if not isinstance(attn, nn.MultiheadAttention) or not attn._qkv_same_embed_dim:
                raise NotImplementedError(
                    "frame heat maps need image blocks whose .attn is a self-attention "
                    f"nn.MultiheadAttention; got {type(attn).__name__}")
            self.handles.append(attn.register_forward_hook(self._hook, with_kwargs=True))

    def _hook(self, module: nn.MultiheadAttention, args, kwargs, output):
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs.get("key", query)
        if key is not query:
            raise NotImplementedError("frame heat maps need self-attention blocks")
        x = query if module.batch_first else query.transpose(0, 1)  # [B, S, W]
        batch, seq, width = x.shape
        heads = module.num_heads
        qkv = F.linear(x, module.in_proj_weight, module.in_proj_bias)
        q, k, v = qkv.view(batch, seq, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        logits = q @ k.transpose(-1, -2) / math.sqrt(width // heads)  # [B, h, S, S]
        attn_mask = kwargs.get("attn_mask")
        if attn_mask is not None:
            logits = (logits.masked_fill(attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                      else logits + attn_mask)
        probs = logits.softmax(dim=-1)
        self.probs.append(probs)
        out = module.out_proj((probs @ v).transpose(1, 2).reshape(batch, seq, width))
        return (out if module.batch_first else out.transpose(0, 1)), None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _relevance(model: DiCoSA, tokens: Tensor, frames: Tensor, mask: Tensor,
               device) -> dict[str, list[Tensor]]:
    """Per text: heat maps ``[K, N, h, w]`` and word attributions ``[K, L]``."""
    visual = model.clip.visual
    capture = _AttentionCapture(visual.transformer.resblocks)
    embeddings: list[Tensor] = []

    def keep_embeddings(_module, _args, output):
        # A fresh leaf: gradients w.r.t. the embeddings exist even with frozen weights.
        leaf = output.detach().requires_grad_(True)
        embeddings.append(leaf)
        return leaf

    embed_hook = model.clip.token_embedding.register_forward_hook(keep_embeddings)
    try:
        with torch.enable_grad():
            # Grad-requiring pixels keep the image graph alive when the weights are frozen.
            pixels = frames[None].to(device).float().div(255.0).requires_grad_(True)
            pixels = (pixels - model.pixel_mean) / model.pixel_std
            video = model.encode_video(pixels, mask[None].to(device))
            # A copy: under gradient checkpointing the blocks run again during backward and
            # the hooks append recomputed probabilities that are not in this graph.
            probs = list(capture.probs)  # per block [N, h, S, S]
            heatmaps, words = [], []
            for t in range(tokens.shape[0]):
                text = model.encode_text(tokens[t:t + 1])
                emb = embeddings[-1]  # [1, L, W]
                parts = model.explain(TextFeatures(text.text), VideoFeatures(video.frames,
                                                                             video.frame_mask))
                target = (parts["confidences"] * parts["cosines"])[0, 0]  # [K]
                maps, attributions = [], []
                for k in range(target.shape[0]):
                    grads = torch.autograd.grad(target[k], [emb, *probs], retain_graph=True,
                                                allow_unused=True)
                    emb_grad = grads[0] if grads[0] is not None else torch.zeros_like(emb)
                    attributions.append((emb_grad * emb).sum(-1)[0].detach())  # [L]
                    maps.append(_rollout(probs, grads[1:]))
                heatmaps.append(torch.stack(maps).float().cpu())
                words.append(torch.stack(attributions).float().cpu())
    finally:
        capture.remove()
        embed_hook.remove()
    return {"heatmaps": heatmaps, "words": words}


def _rollout(probs: Sequence[Tensor], grads: Sequence[Tensor | None]) -> Tensor:
    """Gradient-weighted attention rollout from CLS to the patches: ``[N, h, w]``.

    Ā = mean_heads(max(∇A ⊙ A, 0)) per block; R = Π (I + Ā) applied as R ← R + Ā R.
    """
    first = probs[0]
    num, _, seq, _ = first.shape
    rollout = torch.eye(seq, device=first.device).expand(num, seq, seq).clone()
    for attn, grad in zip(probs, grads, strict=True):
        if grad is None:
            continue
        weighted = (grad * attn).clamp(min=0).mean(dim=1).detach()  # [N, S, S]
        rollout = rollout + weighted @ rollout
    patches = rollout[:, 0, 1:]  # CLS row, patch columns
    side = math.isqrt(patches.shape[-1])
    if side * side != patches.shape[-1]:
        raise NotImplementedError(f"{patches.shape[-1]} patch tokens do not form a square grid")
    return patches.reshape(num, side, side)


# -- figure ----------------------------------------------------------------------------------
def plot_factor_report(report: FactorReport) -> Figure:
    """Draw a :class:`FactorReport` (layout documented in :func:`visualize_factors`)."""
    num_frames = report.frames.shape[0]
    num_k = report.num_concepts
    width = 1.15 * num_frames + 4.5
    row_height = 1.25
    heights = [(num_k + 1) * row_height + 0.8 for _ in report.pairs]
    figure = Figure(figsize=(width, sum(heights)), layout="constrained")
    subfigures = figure.subfigures(len(report.pairs), 1, height_ratios=heights, squeeze=False)
    images = report.frames.transpose(0, 2, 3, 1)  # [N, H, W, 3]
    for t, (pair, sub) in enumerate(zip(report.pairs, subfigures[:, 0], strict=True)):
        sub.suptitle(f'"{pair.text}"   S = Σ g·s = {pair.similarity:.3f}', fontsize=11)
        grid = sub.add_gridspec(num_k + 1, num_frames + 1,
                                width_ratios=[1] * num_frames + [3.5])
        _plot_frames(sub, grid, t, images, report.frame_mask, pair)
        _plot_summary(sub.add_subplot(grid[0, num_frames], label=f"text{t}/summary"), pair)
        for k in range(num_k):
            _plot_factor_row(sub, grid, t, k, images, report.frame_mask, pair)
    return figure


def _plot_frames(sub, grid, t: int, images: np.ndarray, mask: np.ndarray,
                 pair: PairReport) -> None:
    for i, image in enumerate(images):
        ax = sub.add_subplot(grid[0, i], label=f"text{t}/frame{i}")
        ax.imshow(image if mask[i] else np.full_like(image, 128))
        ax.set_title(f"a={pair.weights[i]:.2f}" if mask[i] else "padding", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    sub.axes[-len(images)].set_ylabel("frames", fontsize=8)


def _plot_summary(ax, pair: PairReport) -> None:
    k = np.arange(len(pair.cosines))
    ax.bar(k - 0.27, pair.cosines, 0.27, label="s_k")
    ax.bar(k, pair.confidences, 0.27, label="g_k")
    ax.bar(k + 0.27, pair.contributions, 0.27, label="g_k·s_k")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(k, [str(i) for i in k], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("factor", fontsize=7)
    ax.legend(fontsize=6, ncols=3, loc="upper center", bbox_to_anchor=(0.5, 1.35), frameon=False)


def _plot_factor_row(sub, grid, t: int, k: int, images: np.ndarray, mask: np.ndarray,
                     pair: PairReport) -> None:
    heat = pair.heatmaps[k]  # [N, h, w]
    top = float(heat.max())
    size = images.shape[1]
    for i, image in enumerate(images):
        ax = sub.add_subplot(grid[k + 1, i], label=f"text{t}/factor{k}/frame{i}")
        ax.imshow(image if mask[i] else np.full_like(image, 128))
        if mask[i]:
            # One colour scale per factor across frames, so frames compare within a row.
            ax.imshow(heat[i], cmap="jet", alpha=0.5, vmin=0.0, vmax=top if top > 0 else 1.0,
                      extent=(-0.5, size - 0.5, size - 0.5, -0.5), interpolation="bilinear")
        ax.set_xticks([])
        ax.set_yticks([])
        if i == 0:
            name = ", ".join(pair.factor_names[k])
            ax.set_ylabel(f"factor {k}\n{name}\ns={pair.cosines[k]:.2f} g={pair.confidences[k]:.2f}"
                          f"\ng·s={pair.contributions[k]:.3f}", fontsize=7, rotation=0,
                          ha="right", va="center")
    ax = sub.add_subplot(grid[k + 1, len(images)], label=f"text{t}/factor{k}/words")
    # SOT and EOT are left out of the plot (they are in the report): EOT carries the pooled
    # text vector and would dwarf the words.
    words = pair.tokens[1:-1]
    values = pair.word_attributions[k, 1:-1]
    colors = ["tab:red" if v > 0 else "tab:blue" for v in values]
    ax.bar(np.arange(len(words)), values, color=colors)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(np.arange(len(words)), words, rotation=60, fontsize=6, ha="right")
    ax.tick_params(axis="y", labelsize=6)


# -- a lexical head's words over time ----------------------------------------------------------
@dataclass
class WordsReport:
    """The numbers behind :func:`visualize_words`.

    Attributes:
        words: ``[W]`` the video's top words, heaviest (largest peak over frames) first.
        frames: ``[N']`` the valid frames' positions in the video.
        weights: ``[W, N']`` each word's weight in each valid frame (the head's per-frame
            activation; a VDR video vector is its max over frames, before normalisation).
    """

    words: list[str]
    frames: np.ndarray
    weights: np.ndarray


def visualize_words(head, video: VideoFeatures, *, num_words: int = 10,
                    save_path: str | os.PathLike | None = None,
                    title: str | None = None) -> Figured:
    """A heat map of one video's top words × its frames, from a lexical head (VDR or D2S).

    Args:
        head: a :class:`~dicosa.heads.lexical.LexicalHead` (``heads train lexical`` / ``d2s``).
        video: one video's per-frame DiCoSA features (``len(video) == 1``), e.g.
            ``index.store.gather([row_id])`` or ``model.encode_video(frames, mask)``.
        num_words: rows of the heat map: the words with the largest weight in any frame.
        save_path: write the figure there as PNG.
        title: the figure's title (e.g. the video's path).

    Returns:
        ``(figure, report)`` (a :class:`Figured`); the heat map's axes is labelled
        ``"words"``.
    """
    if len(video) != 1:
        raise ValueError(f"visualize_words draws one video, got {len(video)}: pass video[i:i+1]")
    if not bool(video.frame_mask.any()):
        raise ValueError("the video has no valid frame to draw")
    with torch.no_grad():
        weights = head.frame_activations(video.to("cpu", torch.float32))  # [N', |V|]
    peaks = weights.amax(0)  # [|V|]
    top = peaks.topk(min(num_words, len(peaks))).indices
    report = WordsReport(words=[head.words[i] for i in top.tolist()],
                         frames=np.flatnonzero(video.frame_mask[0].cpu().numpy()),
                         weights=weights[:, top].T.numpy())
    return Figured.saved(plot_words_report(report, title), report, save_path)


def plot_words_report(report: WordsReport, title: str | None = None) -> Figure:
    """Draw a :class:`WordsReport`: words as rows, frames as columns."""
    num_words, num_frames = report.weights.shape
    figure = Figure(figsize=(1.2 + 0.45 * num_frames + 1.5, 0.9 + 0.3 * num_words),
                    layout="constrained")
    ax = figure.add_subplot(label="words")
    image = ax.imshow(report.weights, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(np.arange(num_words), report.words, fontsize=8)
    ax.set_xticks(np.arange(num_frames), [str(f) for f in report.frames], fontsize=8)
    ax.set_xlabel("frame", fontsize=8)
    figure.colorbar(image, ax=ax, label="word weight")
    if title:
        ax.set_title(title, fontsize=9)
    return figure
