"""Optimisers, parameter groups and the learning-rate schedule.

The schedule is a pure function of the step (:func:`lr_factor`): before optimiser step ``s``
(counted from 0) every group's rate is set to its base rate times ``lr_factor(s, ...)``, so a
resumed run needs nothing but the step number.

Two optimisers: AdamW (torch's, bias-corrected) and :class:`BertAdam`, the released code's:
no bias correction and every tensor's gradient clipped to norm ``max_grad_norm`` before its
update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch
from torch import nn

from .config import TrainConfig

__all__ = ["BertAdam", "build_optimizer", "lr_factor", "param_groups", "set_learning_rates"]

# Parameters named like these get no weight decay, as in CLIP's own training.
_NO_DECAY_NAMES = ("embedding", "position", "class_embedding", "logit_scale", "positional")


def _decays(name: str, param: nn.Parameter, rule: str) -> bool:
    if rule == "released":  # the released code exempts names containing "bias" only
        return "bias" not in name
    return param.ndim >= 2 and not any(key in name for key in _NO_DECAY_NAMES)


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Up to four groups: {CLIP towers, new modules} × {decay, no decay}.

    The CLIP towers (``model.clip``) train at ``clip_lr``, everything else at ``lr``; which
    parameters decay follows ``cfg.weight_decay_rule``. Parameters that do not require a
    gradient (frozen towers) are left out.
    """
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        key = (name.startswith("clip."), _decays(name, param, cfg.weight_decay_rule))
        groups.setdefault(key, []).append(param)
    out = []
    for (is_clip, decays), params in sorted(groups.items()):
        out.append({"params": params, "lr": cfg.clip_lr if is_clip else cfg.lr,
                    "weight_decay": cfg.weight_decay if decays else 0.0,
                    "name": f"{'clip' if is_clip else 'new'}_{'decay' if decays else 'no_decay'}"})
    return out


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``cfg.optimizer`` over :func:`param_groups`: AdamW (β, ε from the config; the fused
    CUDA kernel when the parameters live on a GPU) or :class:`BertAdam`."""
    groups = param_groups(model, cfg)
    if not groups:
        raise ValueError("no trainable parameters (every parameter is frozen)")
    if cfg.optimizer == "bertadam":
        return BertAdam(groups, betas=tuple(cfg.betas), eps=cfg.eps, max_grad_norm=1.0)
    fused = all(p.is_cuda for group in groups for p in group["params"])
    return torch.optim.AdamW(groups, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, total_steps: int, warmup_fraction: float,
              schedule: Literal["cosine", "released"] = "cosine") -> float:
    """The multiplier of the base learning rates for optimiser step ``step`` (from 0).

    ``"cosine"``: linear warm-up over ``round(warmup_fraction · total)`` steps (reaching 1 on
    the last warm-up step), then a cosine from 1 to 0 over the remaining steps.

    ``"released"`` (the released BertAdam's ``warmup_cosine``): with progress
    ``x = step / total``, ``x / warmup_fraction`` while ``x < warmup_fraction``, then
    ``0.5 · (1 + cos(π·x))``: the cosine of the whole run's progress, not restarted after
    the warm-up, so the first step has rate 0 and the rate drops from about 1 to
    ``0.5 · (1 + cos(π · warmup_fraction))`` (0.976 at 0.1) when the warm-up ends.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if schedule == "released":
        progress = step / total_steps
        if progress < warmup_fraction:
            return progress / warmup_fraction
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r} (cosine, released)")
    warmup = max(1, round(warmup_fraction * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def set_learning_rates(optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                       factor: float) -> dict[str, float]:
    """Set every group of :func:`param_groups` to its base rate (``clip_lr`` for the CLIP
    towers, ``lr`` otherwise) times ``factor``; returns ``{"lr", "clip_lr"}`` as set."""
    rates = {"lr": cfg.lr * factor, "clip_lr": cfg.clip_lr * factor}
    for group in optimizer.param_groups:
        group["lr"] = rates["clip_lr" if group["name"].startswith("clip") else "lr"]
    return rates


class BertAdam(torch.optim.Optimizer):
    """Adam as the released code steps it (its ``BertAdam``), scheduled from outside.

    For each parameter ``p`` with gradient ``g``:

    1. ``g`` is clipped to norm ``max_grad_norm``, per tensor (not over all parameters);
    2. ``m ← β1·m + (1−β1)·g``, ``v ← β2·v + (1−β2)·g²`` with no bias correction;
    3. ``p ← p − lr · (m / (√v + ε) + weight_decay · p)``.

    Without bias correction the first updates are smaller than Adam's (the first is
    ``(1−β1)/√(1−β2) · sign(g)``-sized rather than ``sign(g)``). The learning rate is the
    group's ``lr``; :func:`set_learning_rates` applies the schedule.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, max_grad_norm: float = 1.0):
        if lr < 0 or eps < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"invalid BertAdam settings: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "max_grad_norm": max_grad_norm})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("BertAdam does not support sparse gradients")
                if group["max_grad_norm"] > 0:
                    norm = torch.linalg.vector_norm(grad.float())
                    grad = grad * (group["max_grad_norm"] / (norm + 1e-6)).clamp(max=1.0)
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = exp_avg / (exp_avg_sq.sqrt() + group["eps"])
                if group["weight_decay"] > 0:
                    update.add_(p, alpha=group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
        return loss
