"""The plugin contract: how a head joins an index at search time.

A plugin (the lexical head's words, the concepts head's exclusions, title fusion; one module
each under ``dicosa/plugins/``) implements :class:`IndexPlugin`. It attaches itself through an
:class:`IndexContext`, the narrow set of things an index lets it touch (add a first stage, a
query encoder, a rerank hook, search modes; read the model, the store and the folder), says
what the index should record of it in the manifest, rebuilds itself from that record, and
explains a hit of a :class:`~dicosa.index.searcher.SearchResult`. No plugin imports the index.

``VideoIndex.use(plugin)`` attaches and records; ``VideoIndex.load`` and ``open_index``
restore every recorded plugin, found by its record's key in :data:`BUILTIN_PLUGINS` (names
of classes, kept as data so that this module imports no plugin).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from ..model import DiCoSA, TextFeatures, VideoFeatures
from ..search.store import FrameStore
from ..search.types import EncodedQueries, FirstStage, RerankHook
from .searcher import SearchMode
from .stages import StageSet

if TYPE_CHECKING:
    from .searcher import SearchResult

__all__ = ["BUILTIN_PLUGINS", "IndexContext", "IndexPlugin", "RecordedFileMissing",
           "plugin_class", "recorded_file"]

# manifest meta key -> "module:Class" of the plugin that restores it
BUILTIN_PLUGINS = {
    "lexical": "dicosa.plugins.lexical:LexicalPlugin",
    "concepts": "dicosa.plugins.exclusion:ExclusionPlugin",
    "fusion": "dicosa.plugins.fusion:FusionPlugin",
    "text": "dicosa.plugins.text:TextPlugin",
}


@dataclass
class IndexContext:
    """What an index lends a plugin while it attaches (and for its searches afterwards)."""

    model: DiCoSA
    tokenizer: Callable
    device: torch.device
    store: FrameStore
    directory: Path | None
    model_key: str  # names arrays made with this model (caches beside the index)
    meta: dict  # the manifest's meta, read-only for plugins (they record through use())
    stages: StageSet
    modes: dict[str, SearchMode]
    hooks: list[RerankHook]
    encoders: list[Callable[[EncodedQueries], None]]
    # Whether this process is the index's writer now (holds its writer lock, or the index is
    # in memory): only then may a plugin write files of its own beside the index.
    writing: Callable[[], bool] = field(default=lambda: True)
    added: list[tuple[str, object]] = field(default_factory=list)  # what attach added

    def add_stage(self, stage: FirstStage,
                  videos: Callable[[np.ndarray, VideoFeatures], object] | None = None,
                  indexed: np.ndarray | None = None) -> None:
        """Register a first stage; every live row it lacks is added now (``indexed``: the
        rows it already holds), and the index keeps it in step with the store after."""
        if any(r.stage.name == stage.name for r in self.stages.extra):
            raise ValueError(f"this index already has a '{stage.name}' stage attached")
        self.stages.register(stage, videos, indexed)
        self.added.append(("stage", stage))

    def add_query_encoder(self, encoder: Callable[[EncodedQueries], None]) -> None:
        self.encoders.append(encoder)
        self.added.append(("encoder", encoder))

    def add_hook(self, hook: RerankHook) -> None:
        self.hooks.append(hook)
        self.added.append(("hook", hook))

    def add_modes(self, **modes: SearchMode) -> None:
        self.modes.update(modes)
        self.added.append(("modes", tuple(modes)))

    @torch.inference_mode()
    def encode_text(self, texts: list[str]) -> TextFeatures:
        """DiCoSA text features of ``texts`` (for titles, exclusions ...)."""
        return self.model.encode_text(self.tokenizer(texts).to(self.device))

    def frames(self, ids: np.ndarray) -> VideoFeatures:
        """Stored features of rows ``ids`` on the model's device and dtype."""
        dtype = next(self.model.parameters()).dtype
        return self.store.gather(np.asarray(ids)).to(self.device, dtype)

    def detach(self) -> None:
        """Take back everything this context's attach added."""
        for kind, item in self.added:
            if kind == "stage":
                self.stages.extra = [r for r in self.stages.extra if r.stage is not item]
            elif kind == "encoder" and item in self.encoders:
                self.encoders.remove(item)
            elif kind == "hook" and item in self.hooks:
                self.hooks.remove(item)
            elif kind == "modes":
                for name in item:
                    self.modes.pop(name, None)
        self.added.clear()


@runtime_checkable
class IndexPlugin(Protocol):
    """A head's search-side adapter (see the module docstring)."""

    key: ClassVar[str]  # its record in the manifest's meta

    def attach(self, ctx: IndexContext) -> None:
        """Register stages, encoders, hooks and modes through ``ctx``; may be called again
        with a fresh context (an index reloaded after another process's commit)."""

    def record(self) -> dict | None:
        """What the manifest keeps to restore it (None: nothing; a plugin made from objects
        rather than files cannot be restored by another process)."""

    @classmethod
    def restore(cls, record: dict, ctx: IndexContext) -> IndexPlugin:
        """The plugin a record describes (its head files loaded and checked against
        ``ctx.model``), not yet attached."""

    def explain(self, result: SearchResult, i: int) -> dict | None:
        """Why hit ``i`` of ``result`` ranks where it does, as plain JSON-able values."""


def plugin_class(key: str) -> type:
    """The plugin class that restores manifest record ``key``."""
    module, _, name = BUILTIN_PLUGINS[key].partition(":")
    return getattr(importlib.import_module(module), name)


class RecordedFileMissing(FileNotFoundError):
    """A head file an index recorded is no longer where it was."""


def recorded_file(record: dict, key: str, option: str) -> str | None:
    """The head file a record names (None: it names none); a file no longer there is one
    sentence naming the command-line option that replaces it."""
    path = record.get("head")
    if path and not Path(path).is_file():
        raise RecordedFileMissing(
            f"the {key} head recorded in the index, {path}, is missing; pass {option} HEAD.pt "
            "with its new location")
    return os.fspath(path) if path else None
