"""Models by where they come from: a checkpoint file, or a config (random or CLIP weights).

:func:`load_model` is how the command line and :func:`dicosa.index.open_index` build the model
an index records in its manifest (``meta["model"]``), so that a later process rebuilds the
same one. A config's record keeps a copy of the file's text beside its path: an index whose
config file was moved or deleted still opens (:func:`model_from_source`), and the index's
model fingerprint still checks that the rebuilt model is the one it was made with.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from .config import DEFAULT_CONFIG, Config, config_from_text
from .data.protocol import FrameProtocol
from .model import DiCoSA

__all__ = ["DEFAULT_CONFIG", "ZERO_SHOT_NOTICE", "load_model", "model_from_source"]

log = logging.getLogger(__name__)

ZERO_SHOT_NOTICE = ("no checkpoint given: using CLIP zero-shot (configs/zero-shot.yaml: CLIP's "
                    "text-video cosine under a text-conditioned pooling of the frames, no "
                    "DiCoSA training); --checkpoint CKPT uses a trained DiCoSA")


def load_model(checkpoint: str | None, config: str | None,
               overrides: Sequence[str] = (), towers: Literal["all", "text"] = "all",
               ) -> tuple[DiCoSA, dict, FrameProtocol]:
    """The model of a checkpoint or a config, a record of where it came from, and the
    frames it reads. With neither, the ``zero-shot`` preset (:data:`DEFAULT_CONFIG`), said
    in one line (:data:`ZERO_SHOT_NOTICE`, logged).

    ``towers="text"``: without CLIP's image tower, for a process that only searches
    (:func:`dicosa.checkpoint.load`); it keeps the whole model's fingerprint.

    Returns:
        ``(model, source, frames)``; ``source`` is ``{"checkpoint": path}`` or ``{"config":
        path, "overrides": [...], "config_yaml": the file's text}`` with absolute paths,
        enough for :func:`model_from_source` to rebuild the same model; ``frames`` is the
        config's (a checkpoint's: the one it was trained with) ``data.frame_sampling`` and
        ``data.frame_padding``.
    """
    if checkpoint is not None:
        from .checkpoint import load

        model, cfg = load(checkpoint, towers=towers)
        return (model.eval(), {"checkpoint": str(Path(checkpoint).resolve())},
                FrameProtocol.of(cfg.data))
    from .config import find_config

    if config is None:
        log.info(ZERO_SHOT_NOTICE)
    path = find_config(config or DEFAULT_CONFIG)
    text = path.read_text()
    cfg = config_from_text(text, overrides)
    return (_built(cfg, towers), {"config": str(path.resolve()), "overrides": list(overrides),
                                  "config_yaml": text}, FrameProtocol.of(cfg.data))


def _built(cfg: Config, towers: Literal["all", "text"]) -> DiCoSA:
    if cfg.model.pretrained is None:
        # Random initial weights must be the same in every process that uses this index.
        torch.manual_seed(cfg.train.seed)
    model = DiCoSA.from_config(cfg.model).eval()
    if towers == "text":
        from .checkpoint import drop_image_tower

        model = drop_image_tower(model)
    return model


def model_from_source(source: dict, towers: Literal["all", "text"] = "all") -> DiCoSA:
    """The model a ``source`` record of :func:`load_model` names (``towers="text"``: for a
    process that only searches): from its checkpoint, or its config file, or, where that
    file is gone, the copy of it the record keeps (said in one logged line)."""
    config, copy = source.get("config"), source.get("config_yaml")
    overrides = source.get("overrides", ())
    if source.get("checkpoint") is None and config and copy is not None and not Path(
            config).is_file():
        log.warning("the config file %s is gone; the copy the index keeps of it builds the "
                    "model", config)
        return _built(config_from_text(copy, overrides), towers)
    return load_model(source.get("checkpoint"), config, overrides, towers)[0]
