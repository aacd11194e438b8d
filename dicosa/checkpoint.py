"""Checkpoint files: atomic writes, safe loading, and rebuilding a model from one.

A checkpoint is a dict of tensors and plain containers only, so it loads with
``torch.load(weights_only=True)`` (no pickled code runs). The run's configuration travels
inside it as a YAML string, which is all :func:`load` needs to rebuild the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from .config import Config, ModelConfig, config_from_dict
from .model import DiCoSA

FORMAT_VERSION = 1


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: a crash leaves the old file or the new one.

    The data goes to a temporary file in the same folder, is fsync'ed, then renamed over
    ``path`` (a rename within one filesystem is atomic).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            torch.save(dict(state, format=FORMAT_VERSION), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write a small text file (the config beside a checkpoint) with the same guarantee."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise ValueError(f"{path} is not a dicosa checkpoint (no 'model'/'config' entries)")
    return state


def checkpoint_config(state: Mapping[str, Any]) -> Config:
    """The :class:`Config` stored (as YAML) in a loaded checkpoint."""
    return config_from_dict(yaml.safe_load(state["config"]))


def file_sha256(path: str | Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def git_sha() -> str | None:
    """The commit of the source tree, with ``-dirty`` when it has local changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty.strip() else sha


def load_model_weights(model: DiCoSA, weights: Mapping[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict(weights)``, or a ValueError naming every key/shape difference.

    A plain ``RuntimeError`` from PyTorch lists hundreds of keys; this says what kind of
    mismatch it is (another architecture, another variant, other frame/word counts).
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(weights) if weights[k].shape != expected[k].shape
    )
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected),
                             ("shape mismatches", shapes)):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                parts.append(f"{len(items)} {label}: {', '.join(items[:5])}{more}")
        raise ValueError(
            f"{source} was written for another model configuration/architecture; "
            + "; ".join(parts)
        )
    model.load_state_dict(weights)


def _offline(model_cfg: ModelConfig) -> ModelConfig:
    # The checkpoint holds every weight, so CLIP's pretrained ones are never downloaded.
    return dataclasses.replace(model_cfg, pretrained=None)


def load(path: str | Path, device: str | torch.device = "cpu",
         model_config: ModelConfig | None = None) -> tuple[DiCoSA, Config]:
    """Rebuild a trained model from a checkpoint file, in eval mode on ``device``.

    Args:
        path: a ``best.pt``/``last.pt`` written by training.
        device: where to put the model.
        model_config: build this architecture instead of the checkpoint's own (e.g. to check
            a checkpoint against a config); a mismatch raises ValueError.

    Returns:
        ``(model, config)``; the config is the one the checkpoint was trained with.
    """
    state = load_checkpoint(path)
    cfg = checkpoint_config(state)
    model = DiCoSA.from_config(_offline(model_config or cfg.model))
    load_model_weights(model, state["model"], str(path))
    return model.to(device).eval(), cfg
