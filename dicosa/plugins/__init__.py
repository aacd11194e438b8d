"""Heads at search time, one :class:`~dicosa.index.plugins.IndexPlugin` per module:
:class:`LexicalPlugin` (words: VDR / Dense2Sparse and the sparse stage),
:class:`ExclusionPlugin` ("A without B" with a concepts head) and :class:`FusionPlugin`
(titles and Mul2vec for incomplete entries)."""

from .exclusion import ExclusionPlugin
from .fusion import FusionPlugin
from .lexical import LexicalPlugin

__all__ = ["ExclusionPlugin", "FusionPlugin", "LexicalPlugin"]
