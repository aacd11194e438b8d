"""Models by where they come from: a checkpoint file, or a config (random or CLIP weights).

:func:`load_model` is how the command line and :func:`dicosa.index.open_index` build the model
an index records in its manifest (``meta["model"]``), so that a later process rebuilds the
same one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .config import load_config
from .data.protocol import FrameProtocol
from .model import DiCoSA

__all__ = ["DEFAULT_CONFIG", "load_model", "model_from_source"]

DEFAULT_CONFIG = "configs/msrvtt.yaml"


def load_model(checkpoint: str | None, config: str | None,
               overrides: Sequence[str] = ()) -> tuple[DiCoSA, dict, FrameProtocol]:
    """The model of a checkpoint or a config, a record of where it came from, and the
    frames it reads.

    Returns:
        ``(model, source, frames)``; ``source`` is ``{"checkpoint": path}`` or ``{"config":
        path, "overrides": [...]}`` with absolute paths, enough for :func:`model_from_source`
        to rebuild the same model; ``frames`` is the config's (a checkpoint's: the one it was
        trained with) ``data.frame_sampling`` and ``data.frame_padding``.
    """
    if checkpoint is not None:
        from .checkpoint import load

        model, cfg = load(checkpoint)
        return (model.eval(), {"checkpoint": str(Path(checkpoint).resolve())},
                FrameProtocol.of(cfg.data))
    from .training import config_path

    path = config_path(config or DEFAULT_CONFIG, None)
    cfg = load_config(path, overrides)
    if cfg.model.pretrained is None:
        # Random initial weights must be the same in every process that uses this index.
        torch.manual_seed(cfg.train.seed)
    model = DiCoSA.from_config(cfg.model).eval()
    return (model, {"config": str(path.resolve()), "overrides": list(overrides)},
            FrameProtocol.of(cfg.data))


def model_from_source(source: dict) -> DiCoSA:
    """The model a ``source`` record of :func:`load_model` names."""
    return load_model(source.get("checkpoint"), source.get("config"),
                      source.get("overrides", ()))[0]
