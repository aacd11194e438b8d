"""The word vocabulary of the lexical heads: whole-word ids of the model's own CLIP tokenizer.

Each dimension of a lexical vector is one whole word of open_clip's BPE vocabulary (a token
ending in ``</w>``, letters only); sub-word pieces, the start/end markers and the pad id 0
(``"!"``, a real token) are left out, so every dimension reads as a word. The full whole-word
list has ~32k entries; a head keeps the words of its training captions plus ``distractors``
other words, taken in BPE merge order (roughly: most frequent English words first), so the
vocabulary is large enough that naming the right word is not luck, and small enough for a CPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import open_clip
import torch
from torch import Tensor

from ..clip import register_architectures
from .features import text_vectors

__all__ = ["Vocabulary", "build_vocabulary", "caption_words", "word_vectors"]

_WORD = re.compile(r"[a-z]+")
_SUFFIX = "</w>"


def caption_words(text: str) -> list[str]:
    """The lower-case words of ``text`` in order (what the bag of words counts)."""
    return _WORD.findall(text.lower())


def _whole_words(arch: str) -> dict[str, int]:
    """word -> token id of every letters-only whole-word token of ``arch``'s tokenizer."""
    register_architectures()
    encoder = open_clip.get_tokenizer(arch).encoder
    return {token[:-len(_SUFFIX)]: int(i) for token, i in encoder.items()
            if token.endswith(_SUFFIX) and token[:-len(_SUFFIX)].isalpha() and i != 0}


class Vocabulary:
    """An ordered word list with its token ids; ``bow`` maps texts onto it."""

    def __init__(self, words: Sequence[str], token_ids: Sequence[int]):
        if len(words) != len(token_ids) or len(set(words)) != len(words):
            raise ValueError("a vocabulary needs as many token ids as distinct words")
        self.words = list(words)
        self.token_ids = [int(i) for i in token_ids]
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def bow(self, texts: Sequence[str]) -> Tensor:
        """Multi-hot ``[B, |V|]`` float32: 1 where a word of the text is in the vocabulary."""
        out = torch.zeros(len(texts), len(self.words))
        for row, text in enumerate(texts):
            ids = [self.index[w] for w in caption_words(text) if w in self.index]
            out[row, ids] = 1.0
        return out


def build_vocabulary(captions: Sequence[str], arch: str, distractors: int) -> Vocabulary:
    """The captions' whole words plus ``distractors`` other whole words (lowest token ids of
    three letters or more first), sorted by token id."""
    whole = _whole_words(arch)
    chosen = {w for text in captions for w in caption_words(text) if w in whole}
    others = sorted((i, w) for w, i in whole.items() if w not in chosen and len(w) >= 3)
    chosen.update(w for _, w in others[:distractors])
    ordered = sorted(chosen, key=whole.__getitem__)
    return Vocabulary(ordered, [whole[w] for w in ordered])


@torch.no_grad()
def word_vectors(model: torch.nn.Module, vocab: Vocabulary, how: str) -> Tensor:
    """``[|V|, D]`` one vector per word in DiCoSA's joint space, on the CPU, to initialise
    projections.

    ``"embedding"``: CLIP's input token embedding through the text projection (VDR's MLM-head
    analogue); ``"encoded"``: the text vector of ``"a {word}"`` from the
    frozen text tower (the zero-shot baseline's vectors); ``"random"``: Gaussian (the
    collapse ablation of VDR's appendix C).
    """
    clip = model.clip
    dim = clip.text_projection.shape[1]
    if how == "random":
        return torch.randn(len(vocab), dim) / dim ** 0.5
    device = clip.text_projection.device
    if how == "embedding":
        rows = clip.token_embedding.weight[torch.tensor(vocab.token_ids, device=device)]  # [|V|, W]
        return (rows @ clip.text_projection).float().cpu()
    if how == "encoded":
        return text_vectors(model, [f"a {w}" for w in vocab.words], 512)
    raise ValueError(f"unknown word-vector init '{how}'; use embedding, encoded or random")
