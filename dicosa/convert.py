"""The authors' released checkpoints (jpthu17/DiCoSA) as dicosa checkpoints.

The released training script saves ``model.state_dict()`` of its ``DiCoSA`` module
(``pytorch_model.bin.N``, ``best.pth``). Its keys map onto dicosa's ``released`` variant:

=====================================  ===============================================
released                               dicosa
=====================================  ===============================================
``clip.*`` (OpenAI CLIP names)         ``clip.*`` (open_clip keeps OpenAI's names)
``transformerClip.resblocks.i.*``      ``temporal.blocks.i.*``
``frame_position_embeddings.weight``   ``temporal.position`` (its first N_v rows)
``weight_fc.0.weight`` ``[H, 2d]``     ``head.conf_text`` (columns ``:d``, the text half)
                                       and ``head.conf_video`` (columns ``d:``)
``weight_fc.0.bias``                   ``head.conf_bias``
``weight_fc.2.weight``, ``.bias``      ``head.conf_out.weight``, ``.bias``
=====================================  ===============================================

A key of the file that maps nowhere, a dicosa weight nothing maps to, or a shape that does
not fit is a :class:`ConversionError` listing every one. The result is a dicosa checkpoint
whose config is the released protocol (``configs/msrvtt-released.yaml`` unless another is
given), so ``evaluate.py`` scores it with the released frames and QB-Norm banks.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from torch import Tensor

from .checkpoint import (
    offline_model,
    read_checkpoint_file,
    save_checkpoint,
)
from .config import Config, ModelConfig, find_config, load_config
from .errors import ConversionError
from .files import file_sha256

__all__ = ["RELEASED_CONFIG", "ConversionError", "convert_checkpoint", "convert_released",
           "summary_hint"]

RELEASED_CONFIG = "msrvtt-released"  # the shipped config of the released protocol

_TEMPORAL = re.compile(r"transformerClip\.resblocks\.(\d+)\.(.+)")


def _listed(label: str, keys: list[str], limit: int = 12) -> str:
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"{len(keys)} {label}: {', '.join(keys[:limit])}{more}"


def convert_released(state: Mapping[str, Tensor], model_cfg: ModelConfig,
                     expected: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Map a released state dict to dicosa's keys.

    Args:
        state: the released ``model.state_dict()`` (a ``module.`` prefix from DDP is fine).
        model_cfg: the dicosa architecture (``variant: released``).
        expected: the state dict of that dicosa model, for key and shape checks.

    Returns:
        dicosa weights, one per key of ``expected``.

    Raises:
        ConversionError: unknown or missing keys, or shapes that do not fit, all listed.
    """
    if model_cfg.variant != "released" or not (model_cfg.use_factors
                                               and model_cfg.use_adaptive_pooling):
        raise ConversionError("released checkpoints are the 'released' variant with factors "
                              "and adaptive pooling; set model.variant=released")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    out: dict[str, Tensor] = {}
    unknown: list[str] = []
    for key, value in state.items():
        if key.startswith("clip.") and key in expected:
            out[key] = value
        elif match := _TEMPORAL.fullmatch(key):
            out[f"temporal.blocks.{match[1]}.{match[2]}"] = value
        elif key == "frame_position_embeddings.weight":
            out["temporal.position"] = value[:model_cfg.num_frames]
        elif key == "weight_fc.0.weight":
            width = value.shape[1] // 2  # [e^t; e^v]: the text half comes first (Eq. 8)
            out["head.conf_text"], out["head.conf_video"] = value[:, :width], value[:, width:]
        elif key == "weight_fc.0.bias":
            out["head.conf_bias"] = value
        elif key in ("weight_fc.2.weight", "weight_fc.2.bias"):
            out[f"head.conf_out.{key.rsplit('.', 1)[1]}"] = value
        else:
            unknown.append(key)
    missing = sorted(set(expected) - set(out))
    unknown += sorted(set(out) - set(expected))  # e.g. more temporal blocks than configured
    shapes = sorted(f"{k}: {tuple(out[k].shape)} vs {tuple(expected[k].shape)}"
                    for k in set(out) & set(expected) if out[k].shape != expected[k].shape)
    if unknown or missing or shapes:
        parts = [_listed(label, items) for label, items in (
            ("unknown keys", sorted(unknown)), ("missing dicosa weights", missing),
            ("shape mismatches", shapes)) if items]
        raise ConversionError(f"not a released DiCoSA checkpoint for this model config "
                              f"({model_cfg.arch}, {model_cfg.num_frames} frames, "
                              f"{model_cfg.temporal_layers} temporal blocks): "
                              + "; ".join(parts))
    return {k: out[k].detach().clone().contiguous().to(expected[k].dtype) for k in expected}


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    state = read_checkpoint_file(path)
    for key in ("state_dict", "model"):  # wrappers some scripts add
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not (isinstance(state, dict) and state
            and all(isinstance(v, Tensor) for v in state.values())):
        raise ConversionError(f"{path} does not hold a state dict of tensors")
    return state


def convert_checkpoint(source: str | Path, out: str | Path, config: str | Path | None = None,
                       overrides: Iterable[str] = ()) -> Path:
    """Convert a released checkpoint file into a dicosa checkpoint at ``out``.

    Args:
        source: the released ``best.pth`` / ``pytorch_model.bin.N``.
        out: the dicosa checkpoint to write.
        config: the run config stored with it (default ``configs/msrvtt-released.yaml``);
            its model section must describe the released network.
        overrides: ``section.key=value`` changes to that config.

    Returns:
        ``out``; ``dicosa.checkpoint.load(out)`` then rebuilds the model.
    """
    source, out = Path(source), Path(out)
    cfg: Config = load_config(find_config(config or RELEASED_CONFIG), overrides)
    model = offline_model(cfg.model)
    weights = convert_released(_read_state_dict(source), cfg.model, model.state_dict())
    model.load_state_dict(weights)  # strict: every key and shape was checked above
    save_checkpoint(out, {
        "model": weights, "config": cfg.to_yaml(), "step": None,
        # The released script keeps the checkpoint with the best test R@1 (its "val" loader
        # reads MSR-VTT's 1k-A test file); an epoch file is chosen by nothing.
        "selected_on": "unknown (released checkpoint)",
        "converted_from": {"path": str(source), "sha256": file_sha256(source),
                           "model": dataclasses.asdict(cfg.model)},
    })
    return out


def summary_hint(out: str | Path) -> str:
    """The line ``convert`` prints after writing ``out``: the one command that fits the
    first-stage summary search uses (on the checkpoint's training data, or with
    ``--data-root`` a folder of the user's own captioned videos in the same layout)."""
    from .heads.summary import summary_fit_command

    return ("two-stage search keeps DiCoSA's ranking with a fitted first-stage summary "
            "(~98% of its top 10 at C=1,000 of 100k videos, ~57% without); fit it on the "
            "training data (or --data-root YOUR_CAPTIONED_VIDEOS) with: "
            f"{summary_fit_command(out)}")
