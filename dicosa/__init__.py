"""dicosa: text-video retrieval with disentangled concept subspaces (DiCoSA, IJCAI 2023).

The public names below are imported on first use (PEP 562): ``import dicosa`` loads neither
torch nor open_clip, so ``dicosa --help`` and ``--version`` answer at once, and
``from dicosa import DiCoSA`` imports the model then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one version source: pyproject.toml reads it (tool.setuptools.dynamic).
__version__ = "0.1.0"

# public name -> the submodule that defines it
_EXPORTS = {
    "load": "checkpoint",
    "TINY_ARCH": "clip", "get_tokenizer": "clip", "load_clip": "clip",
    "Config": "config", "ConfigError": "config", "DataConfig": "config",
    "EvalConfig": "config", "ModelConfig": "config", "TrainConfig": "config",
    "load_config": "config",
    "IndexPlugin": "index", "SearchResult": "index", "VideoIndex": "index",
    "open_index": "index",
    "DiCoSA": "model", "TextFeatures": "model", "VideoFeatures": "model",
    "FactorReport": "visualize", "visualize_factors": "visualize",
    "visualize_words": "visualize",
}

__all__ = [
    "TINY_ARCH", "Config", "ConfigError", "DataConfig", "DiCoSA", "EvalConfig", "FactorReport",
    "IndexPlugin", "ModelConfig", "SearchResult", "TextFeatures", "TrainConfig",
    "VideoFeatures", "VideoIndex", "get_tokenizer", "load", "load_clip", "load_config",
    "open_index", "visualize_factors", "visualize_words",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dicosa' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from .checkpoint import load
    from .clip import TINY_ARCH, get_tokenizer, load_clip
    from .config import (
        Config,
        ConfigError,
        DataConfig,
        EvalConfig,
        ModelConfig,
        TrainConfig,
        load_config,
    )
    from .index import IndexPlugin, SearchResult, VideoIndex, open_index
    from .model import DiCoSA, TextFeatures, VideoFeatures
    from .visualize import FactorReport, visualize_factors, visualize_words
