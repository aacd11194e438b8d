"""Query texts to DiCoSA text vectors: which text tower, and a cache of recent encodings.

:class:`QueryText` is what a search encodes its queries with, one of :data:`TOWERS`:
``"float"``, the model's own text tower (the default); ``"packed"``, the CPU tower that
computes only what the EOT states read (:class:`dicosa.text_tower.TextTower`: the same
vectors up to float rounding); ``"auto"``, ``"packed"`` on a CPU where the model's text blocks
are open_clip's standard ones, else ``"float"``; ``"int8"``, that tower with its linear
layers dynamically quantised (a ranking that changes: not a default). docs/serve.md
("--text-tower") says what each costs.

``cache`` > 0 keeps the text vectors of that many recent query texts (least recently used out
first), keyed by the exact text the tower reads (the query after "A without B" is split off):
a repeated query, or the next page of one, is not encoded again. The search mode is not part
of the key: the DiCoSA text vector does not depend on it. A cached vector equals a fresh one
within float rounding (it was computed in another batch). Lookups and inserts hold a lock,
encoding does not.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..model import DiCoSA
from ..text_tower import TextTower, TextTowerError

__all__ = ["TOWERS", "QueryText", "truncated"]

TOWERS = ("auto", "float", "packed", "int8")


def _tower(model: DiCoSA, device: torch.device, tower: str) -> tuple[str, TextTower | None]:
    """The tower ``tower`` names on ``device`` (``"auto"`` resolved; module docstring): its
    name and the CPU tower, None for the model's own."""
    if tower == "auto":
        if device.type != "cpu":
            return "float", None
        try:
            return "packed", TextTower(model.clip)
        except TextTowerError:
            return "float", None
    if tower == "float":
        return "float", None
    if device.type != "cpu":
        raise ValueError(f"the {tower} text tower runs on the CPU only; use the float "
                         f"tower on {device.type}")
    return tower, TextTower(model.clip, int8=tower == "int8")


class QueryText:
    """Encodes query texts for search (module docstring)."""

    def __init__(self, model: DiCoSA, tokenizer: Callable, device: torch.device, *,
                 tower: str = "float", cache: int = 0):
        if tower not in TOWERS:
            raise ValueError(f"the text tower is one of {', '.join(TOWERS)}, got {tower!r}")
        if cache < 0:
            raise ValueError(f"the query cache holds a number of texts >= 0, got {cache}")
        self.model, self.tokenizer, self.device = model, tokenizer, torch.device(device)
        self.capacity = int(cache)
        self.tower, self._tower = _tower(model, self.device, tower)  # None: the model's own
        self._cache: OrderedDict[str, tuple[Tensor, bool]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, list[bool]]:
        """The text vectors ``[B, D]`` of ``texts`` and whether each was cut short (longer than
        the model reads, :func:`truncated`)."""
        texts = list(texts)
        found = self._lookup(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            tokens = self.tokenizer(missing)
            with torch.inference_mode():
                tokens = tokens.to(self.device)
                vectors = (self.model.encode_text(tokens) if self._tower is None
                           else self.model.encode_text(tokens, tower=self._tower)).text
            cut = truncated(self.tokenizer, missing, tokens)
            fresh = {t: (vectors[i], cut[i]) for i, t in enumerate(missing)}
            self._store(fresh)
            found.update(fresh)
        return (torch.stack([found[t][0] for t in texts]),
                [bool(found[t][1]) for t in texts])

    def _lookup(self, texts: list[str]) -> dict[str, tuple[Tensor, bool]]:
        found = {}  # (without a cache, every text is a miss)
        with self._lock:
            for text in texts:
                entry = self._cache.get(text)
                if entry is not None:
                    self._cache.move_to_end(text)
                    found[text] = entry
                    self.hits += 1
                else:
                    self.misses += 1
        return found

    def _store(self, fresh: dict[str, tuple[Tensor, bool]]) -> None:
        if not self.capacity:
            return
        with self._lock:
            for text, (vector, cut) in fresh.items():
                self._cache[text] = (vector.clone(), cut)  # not a view of the whole batch
                self._cache.move_to_end(text)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)

    def stats(self) -> dict:
        """The tower and the cache's counts: ``{"tower", "cache": {"capacity", "size",
        "hits", "misses"}}`` (hits and misses count texts since this object was made)."""
        with self._lock:
            return {"tower": self.tower,
                    "cache": {"capacity": self.capacity, "size": len(self._cache),
                              "hits": self.hits, "misses": self.misses}}


def truncated(tokenizer: Callable, texts: Sequence[str], tokens: Tensor) -> list[bool]:
    """Whether each text had more tokens than ``tokens`` holds (the tokenizer cut it).

    A full last position means the text reached the context; it was cut when the tokenizer,
    given a longer context (open_clip's tokenizers take ``context_length``), yields more."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:  # a tokenizer of another shape
        return [False] * len(texts)
    full = (tokens[:, -1] != 0).tolist()
    if not any(full):
        return [False] * len(texts)
    try:
        longer = tokenizer(list(texts), context_length=tokens.shape[1] * 8)
    except TypeError:  # a tokenizer without context_length: a full row is all we know
        return full
    return ((longer != 0).sum(dim=1) > tokens.shape[1]).tolist()
