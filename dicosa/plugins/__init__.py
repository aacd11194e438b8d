"""Heads and text sources at search time, one :class:`~dicosa.index.plugins.IndexPlugin` per
module: :class:`LexicalPlugin` (words: VDR / Dense2Sparse and the sparse stage),
:class:`ExclusionPlugin` ("A without B" with a concepts head), :class:`TitlesPlugin` (title
fusion: titles and Mul2vec for incomplete entries) and :class:`TextPlugin` (subtitles,
speech and on-screen text, fused by reciprocal rank)."""

from .exclusion import ExclusionPlugin
from .lexical import LexicalPlugin
from .text import TextPlugin
from .titles import TitlesPlugin

__all__ = ["ExclusionPlugin", "LexicalPlugin", "TextPlugin", "TitlesPlugin"]
