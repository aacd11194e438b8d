"""dicosa: text-video retrieval with disentangled concept subspaces (DiCoSA, IJCAI 2023)."""

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

__all__ = [
    "TINY_ARCH",
    "Config",
    "ConfigError",
    "DataConfig",
    "DiCoSA",
    "EvalConfig",
    "FactorReport",
    "IndexPlugin",
    "ModelConfig",
    "SearchResult",
    "TextFeatures",
    "TrainConfig",
    "VideoFeatures",
    "VideoIndex",
    "get_tokenizer",
    "load",
    "load_clip",
    "load_config",
    "open_index",
    "visualize_factors",
    "visualize_words",
]
__version__ = "0.1.0"
