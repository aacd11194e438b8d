"""CLIP's text tower for search on a CPU: the queries of a batch packed, the work that does
not reach the answer left out, and optionally its linear layers in int8.

A search needs one vector per query: the EOT state after the last block, projected. Under
CLIP's causal mask that state reads only the positions up to the EOT, and the text tower's
time on a CPU is its matrix products, one row per position. :func:`dicosa.clip.
encode_text_tokens` already drops the columns after the batch's last EOT; a batch of queries
of different lengths still computes every query to the longest one. :class:`TextTower`
computes exactly what the EOT states read, and nothing else:

- **packed**: the batch's positions are one sequence of Σ L_i rows (each query's tokens up to
  its EOT), attention masked to each query's own earlier positions, instead of B rows of
  max L_i;
- **the start token once**: position 0 is the start-of-text token in every query, and under
  the causal mask its state in every block depends on nothing else, so its keys and values
  are computed once and kept (per start-token id);
- **the last block for the EOT rows only**: after the last block's keys and values, only the
  EOT rows' attention output and MLP reach the answer.

The same products in the same float32, so the vectors equal the model's up to float rounding
(tests/test_query_text.py), as a batch of another size does.

The blocks' float linear layers run on oneDNN, each weight reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``, which PyTorch's
compiler uses for frozen CPU linears): float32 products, faster for a few rows than
``nn.Linear``'s MKL kernels. The ops are underscored, so the tower checks them on a probe when
it is built; where they are missing, differ, or oneDNN is off
(``torch.backends.mkldnn.enabled``) the layers stay ``nn.Linear``.

``int8=True`` applies ``torch.ao.quantization.quantize_dynamic`` (int8 weights with one scale
per output channel, activations quantised per call) to the blocks' four linear layers; the
embeddings, LayerNorms, attention and the final projection stay float32. It moves the text
vector by a few percent and does not keep the ranking (docs/serve.md gives the figures), so it
is not a default. Where ``torch.ao.quantization`` is missing, asking for int8 is one sentence.
"""

from __future__ import annotations

import copy
import threading
import warnings

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import ResidualAttentionBlock
from torch import Tensor, nn

__all__ = ["TextTower", "TextTowerError"]


class TextTowerError(ValueError):
    """The text tower cannot be built this way here (one sentence)."""


# Without oneDNN: rows up to which a float Linear is computed as W xᵀ rather than x Wᵀ, which
# MKL runs faster at a few rows (benchmarks/RESULTS.md, "The text tower on oneDNN").
_FEW_ROWS = 16


class _OneDNNLinear(nn.Module):
    """A float ``nn.Linear`` on oneDNN, its weight reordered once (module docstring)."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach())
        self.bias = None if layer.bias is None else layer.bias.detach().clone()

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [],
                                                  "")


def _on_onednn(blocks: nn.ModuleList) -> nn.ModuleList:
    """``blocks`` with their float linear layers on oneDNN where this PyTorch has it and its
    ops give ``nn.Linear``'s products on a probe (else as they are)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return blocks
    layer = blocks[0].fc
    probe = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0))
    try:
        same = torch.allclose(_OneDNNLinear(layer)(probe), layer(probe), rtol=1e-4, atol=1e-4)
    except (AttributeError, RuntimeError, TypeError):  # ops missing or changed
        same = False
    if not same:
        return blocks
    for block in blocks:
        for name in ("qkv", "out", "fc", "proj"):
            setattr(block, name, _OneDNNLinear(getattr(block, name)))
    return blocks


def _linear(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` for rows ``x [T, in]``; a float Linear on few rows as W xᵀ (above)."""
    if type(layer) is nn.Linear and len(x) <= _FEW_ROWS and layer.bias is not None:
        return torch.addmm(layer.bias[:, None], layer.weight, x.t()).t().contiguous()
    return layer(x)


class _Block(nn.Module):
    """One pre-norm residual attention block of CLIP's text transformer on packed rows, every
    product a Linear (``nn.MultiheadAttention`` keeps its input projection as a bare
    parameter, which dynamic quantisation would not touch)."""

    def __init__(self, block: ResidualAttentionBlock):
        super().__init__()
        attn = block.attn
        width = attn.embed_dim
        self.heads = attn.num_heads
        self.ln_1, self.ln_2 = copy.deepcopy(block.ln_1), copy.deepcopy(block.ln_2)
        self.ls_1, self.ls_2 = copy.deepcopy(block.ls_1), copy.deepcopy(block.ls_2)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.in_proj_weight)
            self.qkv.bias.copy_(attn.in_proj_bias)
            self.out.weight.copy_(attn.out_proj.weight)
            self.out.bias.copy_(attn.out_proj.bias)
        self.fc, self.act = copy.deepcopy(block.mlp.c_fc), copy.deepcopy(block.mlp.gelu)
        self.proj = copy.deepcopy(block.mlp.c_proj)

    def forward(self, x: Tensor, mask: Tensor, prefix: tuple[Tensor, Tensor],
                keep: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Rows ``x [T, W]``, attending to ``prefix`` (keys, values ``[P, heads, W/heads]``)
        and to the rows ``mask [T, P + T]`` (additive) allows; ``keep``: the rows whose
        output is wanted (None: all). Returns (output rows, the rows' keys, values)."""
        rows, width = x.shape
        q, k, v = _linear(self.qkv, self.ln_1(x)).view(rows, 3, self.heads,
                                                       width // self.heads).unbind(1)
        keys, values = torch.cat([prefix[0], k]), torch.cat([prefix[1], v])
        if keep is not None:
            q, mask, x = q[keep], mask[keep], x[keep]
        attended = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask)
        x = x + self.ls_1(_linear(self.out, attended.transpose(0, 1).reshape(len(x), width)))
        hidden = self.act(_linear(self.fc, self.ln_2(x)))
        return x + self.ls_2(_linear(self.proj, hidden)), k, v


class TextTower(nn.Module):
    """``tokens [B, L]`` -> CLIP's text vector ``[B, D]`` (before DiCoSA's normalisation);
    see the module docstring. Built from a CLIP model's text weights (copied)."""

    def __init__(self, clip: CLIP, int8: bool = False):
        super().__init__()
        blocks = clip.transformer.resblocks
        if not all(isinstance(b, ResidualAttentionBlock) and not hasattr(b, "ln_1_kv")
                   and isinstance(b.attn, nn.MultiheadAttention) and b.attn.in_proj_bias
                   is not None for b in blocks):
            raise TextTowerError(f"the CPU text tower takes open_clip's standard text blocks; "
                                 f"this model's are {type(blocks[0]).__name__}: use the "
                                 "float tower")
        self.token_embedding = copy.deepcopy(clip.token_embedding)
        self.positional = nn.Parameter(clip.positional_embedding.detach().clone(),
                                       requires_grad=False)
        self.blocks = nn.ModuleList(_Block(b) for b in blocks)
        self.ln_final = copy.deepcopy(clip.ln_final)
        projection = clip.text_projection
        self.projection = (copy.deepcopy(projection) if isinstance(projection, nn.Linear)
                           else nn.Parameter(projection.detach().clone(), requires_grad=False))
        self.int8 = int8
        self.requires_grad_(False)
        self.eval()
        self.blocks = _quantised(self.blocks) if int8 else _on_onednn(self.blocks)
        self._starts: dict[int, list[tuple[Tensor, Tensor]]] = {}  # start token -> its k, v
        self._lock = threading.Lock()

    @torch.inference_mode()
    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.ndim != 2 or not 2 <= tokens.shape[1] <= self.positional.shape[0]:
            raise ValueError(f"tokens must be [B, 2 <= L <= {self.positional.shape[0]}], got "
                             f"{tuple(tokens.shape)}")
        start = tokens[:, 0]
        if bool((start != start[0]).any()):  # another tokenizer's batch: one start at a time
            return torch.cat([self(tokens[i:i + 1]) for i in range(len(tokens))])
        eot = tokens.argmax(dim=-1).clamp_min(1)  # EOT has the largest id in CLIP's vocabulary
        owner = torch.repeat_interleave(torch.arange(len(tokens)), eot)  # [T] each row's query
        first = torch.cumsum(eot, 0) - eot  # [B] each query's first packed row
        position = torch.arange(len(owner)) - first[owner] + 1  # [T] 1 .. eot_i
        x = self.token_embedding(tokens[owner, position]) + self.positional[position]
        mask = torch.full((len(owner), 1 + len(owner)), float("-inf"))
        mask[:, 0] = 0.0  # every row reads the start token
        mask[:, 1:].masked_fill_((owner[:, None] == owner[None, :])
                                 & (position[None, :] <= position[:, None]), 0.0)
        last = first + eot - 1  # [B] each query's EOT row
        for i, (block, prefix) in enumerate(zip(self.blocks, self._start(int(start[0])),
                                                strict=True)):
            keep = last if i == len(self.blocks) - 1 else None
            x = block(x, mask, prefix, keep)[0]
        x = self.ln_final(x)  # [B, W]: the EOT rows
        if isinstance(self.projection, nn.Linear):
            return self.projection(x)
        return x @ self.projection

    def _start(self, token: int) -> list[tuple[Tensor, Tensor]]:
        """Each block's key and value of the start token at position 0 (computed once)."""
        with self._lock:
            if token not in self._starts:
                x = self.token_embedding(torch.tensor([token])) + self.positional[:1]
                empty = torch.zeros(0, self.blocks[0].heads,
                                    x.shape[1] // self.blocks[0].heads)
                kept = []
                for block in self.blocks:
                    x, k, v = block(x, torch.zeros(1, 1), (empty, empty))
                    kept.append((k, v))
                self._starts[token] = kept
            return self._starts[token]


def _quantised(blocks: nn.ModuleList) -> nn.ModuleList:
    """``blocks`` with every Linear dynamically quantised to int8 (module docstring)."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:
        raise TextTowerError("this PyTorch has no dynamic quantisation "
                             "(torch.ao.quantization); use the float text tower") from None
    with warnings.catch_warnings():  # its deprecation notices
        warnings.simplefilter("ignore")
        return quantize_dynamic(blocks, {nn.Linear: per_channel_dynamic_qconfig})
