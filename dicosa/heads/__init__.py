"""Heads trained on a frozen DiCoSA (see :mod:`dicosa.heads.base` for the contract).

=========  ==============================================  ======================
kind       what it learns                                  module
=========  ==============================================  ======================
lexical    VDR: word-named sparse text/video vectors       dicosa.heads.lexical
d2s        Dense2Sparse with Bernoulli expansion control   dicosa.heads.lexical
concepts   sparse disentangled codes for exclusion         dicosa.heads.concepts
mul2vec    topic vectors from titles and captions (NTF)    dicosa.heads.mul2vec
summary    a first-stage vector distilled from DiCoSA's S  dicosa.heads.summary
=========  ==============================================  ======================
"""

from .base import (
    Head,
    HeadMismatchError,
    available_heads,
    head_class,
    load_head,
    register_head,
    save_head,
)

__all__ = ["Head", "HeadMismatchError", "available_heads", "head_class", "load_head",
           "register_head", "save_head"]

# The built-in heads, imported when first asked for.
for _kind, _target in {
    "lexical": "dicosa.heads.lexical:VDRHead",
    "d2s": "dicosa.heads.lexical:D2SHead",
    "concepts": "dicosa.heads.concepts:ConceptCodesHead",
    "mul2vec": "dicosa.heads.mul2vec:Mul2vecHead",
    "summary": "dicosa.heads.summary:DistilledSummaryHead",
}.items():
    register_head(kind=_kind, target=_target)
