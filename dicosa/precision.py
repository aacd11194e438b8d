"""The precision policy: where reduced precision may run, and where numbers must be fp32.

Training runs under Accelerate's mixed precision (``train.mixed_precision``; ``"auto"`` is
bf16 on a CUDA device that supports it). Evaluation is separate (``eval.precision``):
reported numbers are encoded and scored in fp32 unless bf16 is asked for, because bf16
moves ranks (on a random head, 4–6 of 300 queries changed rank against fp32 on CUDA).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

__all__ = ["EvalPrecision", "autocast", "eval_mixed_precision", "resolve_device",
           "resolve_mixed_precision"]

EvalPrecision = Literal["fp32", "bf16"]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device``, or CUDA when available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_mixed_precision(mode: str, device: torch.device | str | None = None) -> str:
    """Accelerate's mixed-precision name for ``train.mixed_precision``: ``"auto"`` is
    ``"bf16"`` on a CUDA device that supports it, else ``"no"``."""
    if mode != "auto":
        return mode
    device = resolve_device(device)
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def eval_mixed_precision(precision: EvalPrecision) -> str:
    """The autocast mode of an ``eval.precision`` setting (``"fp32"`` -> ``"no"``)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"eval.precision must be 'fp32' or 'bf16', got {precision!r}")
    return "no" if precision == "fp32" else "bf16"


def autocast(device: torch.device, mixed_precision: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``"bf16"``/``"fp16"`` on ``device`` (the CPU supports bf16),
    nothing for ``"no"``."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
