"""Optimisers and the learning-rate schedule: dicosa's and the released code's."""

from __future__ import annotations

import math

import pytest
import torch

from dicosa.config import TrainConfig
from dicosa.model import DiCoSA
from dicosa.optim import BertAdam, build_optimizer, lr_factor, param_groups
from tests.conftest import tiny_config


def test_schedules_at_the_issues_figures():
    # 7,030 steps, 10% warm-up, step 3,500: the released factor is the cosine of the whole
    # run's progress (0.50), dicosa's restarts the cosine after warm-up (0.59).
    assert lr_factor(3500, 7030, 0.1, "released") == pytest.approx(0.5033, abs=1e-4)
    assert lr_factor(3500, 7030, 0.1, "cosine") == pytest.approx(0.5905, abs=1e-4)
    assert lr_factor(0, 7030, 0.1, "released") == 0.0  # the released first step is rate 0
    assert lr_factor(351, 7030, 0.1, "released") == pytest.approx(351 / 703)
    # Not restarted: right after warm-up the released factor is already below 1.
    assert lr_factor(703, 7030, 0.1, "released") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.1)))
    assert lr_factor(702, 7030, 0.1, "cosine") == 1.0
    assert lr_factor(7029, 7030, 0.1, "cosine") < 1e-5
    with pytest.raises(ValueError, match="schedule"):
        lr_factor(1, 10, 0.1, "linear")


def _bert_adam_reference(p, grads, lr, betas, eps, wd, max_norm):
    """The released update written out: per-tensor clipping, no bias correction."""
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for g in grads:
        g = g * min(1.0, max_norm / (g.norm().item() + 1e-6))
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr * (m / (v.sqrt() + eps) + wd * p)
    return p


def test_bert_adam_matches_the_released_update_and_differs_from_adamw():
    g = torch.Generator().manual_seed(0)
    start = torch.randn(6, 4, generator=g)
    grads = [3 * torch.randn(6, 4, generator=g) for _ in range(4)]  # norms above 1: clipped
    param = torch.nn.Parameter(start.clone())
    opt = BertAdam([param], lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
    adamw_param = torch.nn.Parameter(start.clone())
    adamw = torch.optim.AdamW([adamw_param], lr=1e-2, betas=(0.9, 0.98), eps=1e-6,
                              weight_decay=0.2)
    for grad in grads:
        param.grad, adamw_param.grad = grad.clone(), grad.clone()
        opt.step()
        adamw.step()
    expected = _bert_adam_reference(start, grads, 1e-2, (0.9, 0.98), 1e-6, 0.2, 1.0)
    torch.testing.assert_close(param.detach(), expected, atol=1e-6, rtol=1e-5)
    assert (param.detach() - adamw_param.detach()).abs().max() > 1e-3  # bias correction


def test_released_groups_decay_all_but_biases_and_frozen_towers_are_left_out():
    model = DiCoSA.from_config(tiny_config())
    released = TrainConfig(weight_decay_rule="released")
    decayed = {id(p) for group in param_groups(model, released) if group["weight_decay"] > 0
               for p in group["params"]}
    ln_weight = model.clip.transformer.resblocks[0].ln_1.weight
    assert id(ln_weight) in decayed  # CLIP's ln_* weights decay in the released code
    assert id(model.clip.transformer.resblocks[0].ln_1.bias) not in decayed
    assert id(ln_weight) not in {id(p) for group in param_groups(model, TrainConfig())
                                 if group["weight_decay"] > 0 for p in group["params"]}
    for param in model.clip.parameters():
        param.requires_grad_(False)
    optimizer = build_optimizer(model, TrainConfig(optimizer="bertadam"))
    assert isinstance(optimizer, BertAdam)
    assert not any(g["name"].startswith("clip") for g in optimizer.param_groups)
