"""Training a head on a frozen DiCoSA checkpoint: ``dicosa heads train KIND``."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import yaml

from ..config import ConfigError, replace
from .base import head_class, read_head_file, save_head
from .features import head_data
from .summary import summary_beside

__all__ = ["fit_checkpoint_summary", "parse_head_overrides", "train_head"]

log = logging.getLogger(__name__)


def parse_head_overrides(overrides: Iterable[str]) -> dict:
    """``["key=value", ...]`` (values parsed as YAML scalars) -> ``{key: value}``."""
    values = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"head setting '{item}' must look like key=value")
        values[key.strip()] = yaml.safe_load(raw) if raw else raw
    return values


def train_head(kind: str, checkpoint: str | Path, out: str | Path, overrides: Iterable[str] = (),
               *, data_root: str | None = None, seed: int = 0,
               device: str | torch.device = "cpu", progress: bool = True) -> Path:
    """Train a ``kind`` head on the frozen model of ``checkpoint`` and save it to ``out``.

    ``kind`` is a registered head (``dicosa.heads.available_heads()``), ``overrides`` are
    ``key=value`` settings of its config, ``data_root`` replaces the checkpoint's
    ``data.root``, and ``seed`` seeds the head's initialisation and sampling. Features are
    cached beside the checkpoint (``<checkpoint folder>/cache``).
    """
    from ..checkpoint import load

    cls = head_class(kind)
    config = cls.make_config(parse_head_overrides(overrides))
    model, cfg = load(checkpoint, device)
    model.requires_grad_(False)
    if data_root is not None:
        cfg = replace(cfg, data={"root": data_root})
    cache_dir = cfg.eval.cache_dir or Path(checkpoint).parent / "cache"
    started = time.perf_counter()
    data = head_data(model, cfg, cache_dir=cache_dir, device=device, progress=progress)
    encoded = time.perf_counter()
    head = cls.fit(model, data, config, seed=seed, progress=progress)
    trained = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "train_split": data.train.name,
        "val_split": data.val.name if data.val is not None else None,
        "seed": seed,
        "config": dataclasses.asdict(config),
        "encode_seconds": round(encoded - started, 1),
        "fit_seconds": round(time.perf_counter() - encoded, 1),
    }
    trained.update(getattr(head, "fit_report", {}))
    path = save_head(head, out, model, trained)
    log.debug("saved the %s head to %s", kind, path)  # callers say where
    return path


def fit_checkpoint_summary(checkpoint: str | Path, overrides: Iterable[str] = (), *,
                           device: str | torch.device = "cpu",
                           progress: bool = True) -> tuple[Path, dict]:
    """Fit the distilled first-stage summary of ``checkpoint`` on its own training split
    (minus the validation videos that chose it) and keep it beside it
    (:func:`dicosa.heads.summary.summary_beside`), where ``index`` finds it.

    Returns:
        ``(path, trained)``: the head file and its record (``encode_seconds`` for the
        features, read back from the cache when evaluation or an earlier head wrote them,
        and ``fit_seconds``).
    """
    path = train_head("summary", checkpoint, summary_beside(checkpoint), overrides,
                      device=device, progress=progress)
    return path, read_head_file(path)["trained"]
