"""What tests read of an index beyond its search entry points: every stored row's features,
the exhaustive score matrix, queries encoded through the searcher."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dicosa.index.searcher import Searcher
from dicosa.model import VideoFeatures
from dicosa.search.types import EncodedQueries


def stored(index) -> VideoFeatures:
    """Every live row's features as the store keeps them, read into memory."""
    return index.store.gather(index.store.live())


def searcher(index) -> Searcher:
    """The query path over the index's parts now."""
    return Searcher(index.snapshot())


def encoded(index, texts: Sequence[str], mode: str | None = None) -> EncodedQueries:
    """``texts`` parsed and encoded once, the query encoders run (no search)."""
    return searcher(index).encode(texts, (), mode)[0]


@torch.inference_mode()
def exhaustive_scores(index, texts: Sequence[str], chunk: int = 1024) -> torch.Tensor:
    """DiCoSA scores S of every text (encoded as given, no query parsing) against every live
    row, in id order: ``[T, R]`` float32, rows read ``chunk`` at a time."""
    text = index.model.encode_text(index.tokenizer(list(texts)).to(index.device))
    return searcher(index).exhaustive(text, index.store.live(), chunk)
