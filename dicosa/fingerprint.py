"""The identity of a model's features: every stored artefact (index, head) carries it.

A fingerprint is ``{"weights_sha256": str, "config": dict}``: the sha256 over every tensor
of the model's state dict and the model-config fields that change features or scores. Two
models with equal fingerprints produce the same features, however they were obtained.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Mapping

import torch
from torch import nn

__all__ = ["fingerprint_config", "fingerprint_mismatch", "model_fingerprint", "weights_sha256"]

# Model config fields that change neither features nor scores: where the weights came from
# (the weights themselves are hashed), memory settings and loss weights.
_NOT_FINGERPRINTED = ("pretrained", "grad_checkpointing", "alpha", "beta")
# Fields added after fingerprints were first stored, left out at the value that reproduces
# the features of before: an index or head of an older dicosa still matches its model.
_LEFT_OUT_AT = {"normalize_features": False}


def model_fingerprint(model: nn.Module) -> dict:
    """``{"weights_sha256": str, "config": dict}`` for a DiCoSA model (``model.config``).

    A model loaded without some of its weights (``checkpoint.load(..., towers="text")``)
    carries the fingerprint of the whole checkpoint, computed when it was read
    (``recorded_fingerprint``): that one is returned, not a hash of the weights it holds.
    """
    recorded = getattr(model, "recorded_fingerprint", None)
    if recorded is not None:
        return copy.deepcopy(recorded)
    return {"weights_sha256": weights_sha256(model.state_dict()),
            "config": fingerprint_config(model.config)}


def weights_sha256(weights: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor of a state dict (name, dtype, shape and bytes), in name
    order: :func:`model_fingerprint`'s ``weights_sha256`` of a model holding ``weights``."""
    digest = hashlib.sha256()
    for name, tensor in sorted(weights.items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fingerprint_config(config) -> dict:
    """The model-config fields that change features or scores, as plain JSON values."""
    values = {k: v for k, v in dataclasses.asdict(config).items()
              if k not in _NOT_FINGERPRINTED
              and not (k in _LEFT_OUT_AT and _LEFT_OUT_AT[k] == v)}
    return json.loads(json.dumps(values))


def fingerprint_mismatch(stored: dict, current: dict) -> str | None:
    """A phrase saying how a stored fingerprint differs from a model's, or None when equal.

    The phrase reads after "built with" / "trained on": "different weights (…) and a
    different model config (…)".
    """
    problems = []
    if stored.get("weights_sha256") != current["weights_sha256"]:
        problems.append(f"different weights (sha256 {str(stored.get('weights_sha256'))[:12]}… "
                        f"stored, {current['weights_sha256'][:12]}… in the model)")
    old, new = stored.get("config", {}), current["config"]
    changed = [f"{k}: {old.get(k)!r} stored, {new.get(k)!r} in the model"
               for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed:
        problems.append("a different model config (" + "; ".join(changed) + ")")
    return " and ".join(problems) or None
