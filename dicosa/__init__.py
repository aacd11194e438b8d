"""dicosa: text-video retrieval with disentangled concept subspaces (DiCoSA, IJCAI 2023)."""

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
from .model import DiCoSA, TextFeatures, VideoFeatures

__all__ = [
    "TINY_ARCH",
    "Config",
    "ConfigError",
    "DataConfig",
    "DiCoSA",
    "EvalConfig",
    "ModelConfig",
    "TextFeatures",
    "TrainConfig",
    "VideoFeatures",
    "get_tokenizer",
    "load_clip",
    "load_config",
]
__version__ = "0.1.0"
