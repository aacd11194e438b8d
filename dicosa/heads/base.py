"""The family of heads trained on a frozen DiCoSA.

A head is a small ``nn.Module`` that maps DiCoSA's features (text vectors, per-frame video
features) to another representation: sparse vocabulary vectors (``lexical``, ``d2s``),
sparse concept codes (``concepts``), topic vectors (``mul2vec``). The encoders stay fixed;
a head learns from features encoded once and cached (:mod:`dicosa.heads.features`), so
training one takes minutes on a CPU.

Every head class

* sets ``kind`` (its name on the command line) and ``Config`` (a frozen dataclass of its
  hyper-parameters, built from YAML/``--set`` with unknown keys rejected);
* is constructed as ``cls(config, **init_args)``, where ``init_args()`` returns the plain
  values (sizes, word lists) that its shapes depend on, so a saved head rebuilds exactly;
* implements ``fit(model, data, config, seed=..., progress=...)`` -> a trained head.

A saved head (:func:`save_head`) carries the fingerprint of the model it was trained on
(:mod:`dicosa.fingerprint`); :func:`load_head` with any other model is a one-sentence
:class:`HeadMismatchError`, never wrong results.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from ..checkpoint import read_checkpoint_file, save_checkpoint
from ..config import dataclass_from_dict
from ..errors import HeadMismatchError
from ..fingerprint import fingerprint_mismatch, model_fingerprint

__all__ = [
    "HEAD_FORMAT",
    "Head",
    "HeadMismatchError",
    "available_heads",
    "head_class",
    "head_key",
    "load_head",
    "read_head_file",
    "register_head",
    "save_head",
]

HEAD_FORMAT = "dicosa-head"
HEAD_VERSION = 1

# kind -> "module:Class"; imported on first use so that one head's dependencies (scipy,
# faiss, ...) are needed only by those who use it.
_REGISTRY: dict[str, str] = {}
_CLASSES: dict[str, type[Head]] = {}


class Head(nn.Module):
    """Base class of the heads; see the module docstring for the contract."""

    kind: ClassVar[str] = ""
    Config: ClassVar[type] = object

    def __init__(self, config: Any):
        super().__init__()
        if not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, "
                            f"got {type(config).__name__}")
        self.config = config

    def init_args(self) -> dict[str, Any]:
        """Plain values (ints, strings, lists) passed to ``__init__`` besides the config."""
        return {}

    @classmethod
    def fit(cls, model: nn.Module, data: Any, config: Any, *, seed: int = 0,
            progress: bool = True) -> Head:
        """Train a head on the frozen ``model``'s features ``data`` (a
        :class:`dicosa.heads.features.HeadData`)."""
        raise NotImplementedError

    @classmethod
    def make_config(cls, values: Mapping[str, Any] | None = None) -> Any:
        """The head's config from a mapping (defaults for missing keys; unknown keys fail)."""
        return dataclass_from_dict(cls.Config, dict(values or {}), f"{cls.kind}.")


def register_head(cls: type[Head] | None = None, *, kind: str | None = None,
                  target: str | None = None):
    """Register a head class (decorator), or a lazy ``"module:Class"`` target under ``kind``."""
    if target is not None:
        if kind is None:
            raise ValueError("register_head(target=...) needs kind=")
        _REGISTRY[kind] = target
        return None
    if cls is None or not cls.kind:
        raise ValueError("a head class needs a non-empty 'kind'")
    _CLASSES[cls.kind] = cls
    return cls


def available_heads() -> list[str]:
    return sorted(set(_REGISTRY) | set(_CLASSES))


def head_class(kind: str) -> type[Head]:
    """The class registered under ``kind``; ValueError naming the known kinds otherwise."""
    if kind not in _CLASSES:
        if kind not in _REGISTRY:
            raise ValueError(f"unknown head '{kind}'; known heads: "
                             f"{', '.join(available_heads()) or 'none'}")
        module, _, name = _REGISTRY[kind].partition(":")
        try:
            _CLASSES[kind] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"the '{kind}' head is not available in this installation "
                             f"({exc})") from None
    return _CLASSES[kind]


def save_head(head: Head, path: str | Path, model: nn.Module,
              trained: Mapping[str, Any] | None = None) -> Path:
    """Write ``head`` to ``path`` atomically with the fingerprint of ``model``.

    ``trained`` holds plain facts about the training run (splits, seed, metrics); the date
    is added here.
    """
    record = dict(trained or {})
    record.setdefault("date", datetime.datetime.now(datetime.timezone.utc)
                      .isoformat(timespec="seconds"))
    return save_checkpoint(path, {
        "head_format": HEAD_FORMAT,
        "head_version": HEAD_VERSION,
        "kind": head.kind,
        "config": dataclasses.asdict(head.config),
        "init": head.init_args(),
        "fingerprint": model_fingerprint(model),
        "state": head.state_dict(),
        "trained": record,
    })


def read_head_file(path: str | Path) -> dict:
    """The raw contents of a head file, checked to be one (HeadMismatchError otherwise)."""
    state = read_checkpoint_file(path)
    if not isinstance(state, dict) or state.get("head_format") != HEAD_FORMAT:
        raise HeadMismatchError(f"{path} is not a dicosa head file (train one with "
                                "'dicosa heads train KIND --checkpoint CKPT')")
    if state.get("head_version") != HEAD_VERSION:
        raise HeadMismatchError(f"{path} is a head file of format version "
                                f"{state.get('head_version')}; this dicosa reads version "
                                f"{HEAD_VERSION}")
    return state


def load_head(path: str | Path, model: nn.Module | None = None, *,
              kind: str | None = None) -> Head:
    """Rebuild a saved head in eval mode.

    Args:
        path: a file written by :func:`save_head`.
        model: the DiCoSA model the head will be used with; its fingerprint must equal the
            one stored (None skips the check: for inspecting a file only).
        kind: if given, the file must hold a head of this kind.

    Raises:
        HeadMismatchError: not a head file, another kind, or trained on another model.
    """
    state = read_head_file(path)
    if kind is not None and state["kind"] != kind:
        raise HeadMismatchError(f"{path} holds a '{state['kind']}' head, not a '{kind}' head")
    if model is not None:
        problem = fingerprint_mismatch(state["fingerprint"], model_fingerprint(model))
        if problem:
            raise HeadMismatchError(
                f"the {state['kind']} head {path} was trained on a model with {problem}; "
                f"train it again on this model ('dicosa heads train {state['kind']}"
                " --checkpoint CKPT')")
    cls = head_class(state["kind"])
    head = cls(cls.make_config(state["config"]), **state["init"])
    head.load_state_dict(state["state"])
    head.trained = state.get("trained", {})
    return head.eval()


def head_key(head: nn.Module) -> str:
    """sha256 of the head's weights: which head made an array stored beside an index."""
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
