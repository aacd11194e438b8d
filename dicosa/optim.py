"""AdamW with the paper's two learning rates and decay rules, and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig

# Parameters named like these get no weight decay, as in CLIP's own training.
_NO_DECAY_NAMES = ("embedding", "position", "class_embedding", "logit_scale", "positional")


def _decays(name: str, param: nn.Parameter) -> bool:
    return param.ndim >= 2 and not any(key in name for key in _NO_DECAY_NAMES)


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Four groups: {CLIP towers, new modules} × {decay, no decay}.

    The CLIP towers (``model.clip``) train at ``clip_lr``, everything else at ``lr``; biases,
    norms (1-d), embeddings and the logit scale are not decayed.
    """
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        key = (name.startswith("clip."), _decays(name, param))
        groups.setdefault(key, []).append(param)
    return [
        {"params": params, "lr": cfg.clip_lr if is_clip else cfg.lr,
         "weight_decay": cfg.weight_decay if decays else 0.0,
         "name": f"{'clip' if is_clip else 'new'}_{'decay' if decays else 'no_decay'}"}
        for (is_clip, decays), params in sorted(groups.items())
    ]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (β, ε from the config); the fused CUDA kernel when the parameters live on a GPU."""
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(param_groups(model, cfg), betas=tuple(cfg.betas), eps=cfg.eps,
                             fused=fused or None)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                    warmup_fraction: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_fraction`` of the steps, then cosine decay to zero."""
    warmup = max(1, round(warmup_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
