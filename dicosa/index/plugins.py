"""The plugin contract: how a head or a text source joins an index.

A plugin (one module each under ``dicosa/plugins/``) subclasses :class:`IndexPlugin`, whose
methods have defaults, and attaches itself through an :class:`IndexContext`, the narrow set
of things an index lends it. No plugin imports the index object's modules, and no front end
imports a plugin: the command line and the service reach them through the index
(:class:`~dicosa.index.plugin_host.PluginHost`, :mod:`~dicosa.index.annotations`). A
recorded plugin is restored by its record's key in :data:`BUILTIN_PLUGINS` (names of
classes, kept as data so that this module imports no plugin). ``docs/architecture.md``
("The plugin contract") walks through it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from ..model import DiCoSA, TextFeatures, VideoFeatures
from ..search.store import FrameStore
from ..search.types import EncodedQueries, FirstStage, RerankHook
from .searcher import SearchMode
from .stages import StageSet

if TYPE_CHECKING:
    from .searcher import SearchResult

__all__ = ["BUILTIN_OPTIONS", "BUILTIN_PLUGINS", "PICTURES", "FileCheck", "IndexContext",
           "IndexPlugin", "QueryOption", "check_derived", "chosen_plugins", "how_to_get",
           "plugin_class", "query_option"]

# manifest meta key -> "module:Class" of the plugin that restores it. The keys are what
# indexes have recorded since they were first written ("fusion": title fusion).
BUILTIN_PLUGINS = {
    "lexical": "dicosa.plugins.lexical:LexicalPlugin",
    "concepts": "dicosa.plugins.exclusion:ExclusionPlugin",
    "fusion": "dicosa.plugins.titles:TitlesPlugin",
    "text": "dicosa.plugins.text:TextPlugin",
}
# query option -> "module:NAME" of the QueryOption that checks it where the index lacks the
# plugin that registers it (a search of the pictures alone is still a search).
BUILTIN_OPTIONS = {"source": "dicosa.plugins.text_ranking:WITHOUT_TEXT"}
# What ranked a search's hits where no plugin says otherwise (an answer's ``ranked_by``).
PICTURES = {"by": "pictures", "sources": []}


@dataclass(frozen=True)
class QueryOption:
    """A search option a plugin registers: ``index.query(text, name=value)``."""

    name: str
    # the value as asked -> as the query encoders read it (``EncodedQueries.extra[name]``);
    # a value it cannot take is a QueryError of one sentence
    check: Callable[[object], object]
    schema: dict  # its value's JSON Schema, as the service publishes it


@dataclass
class FileCheck:
    """What checking a plugin's files found (``dicosa check``)."""

    problems: list[str] = field(default_factory=list)  # not repaired
    repaired: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)


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
    options: dict[str, QueryOption] = field(default_factory=dict)  # what attach registered
    default_mode: str | None = None  # the search mode the plugin makes the index's default

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

    def add_modes(self, default: str | None = None, **modes: SearchMode) -> None:
        """Register search modes; ``default``: the one of them a search without a mode uses."""
        self.modes.update(modes)
        self.added.append(("modes", tuple(modes)))
        self.default_mode = default or self.default_mode

    def add_option(self, option: QueryOption) -> None:
        """Register a search option: its checked value reaches the query encoders as
        ``EncodedQueries.extra[option.name]``."""
        self.options[option.name] = option

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
        self.options.clear()
        self.default_mode = None


class IndexPlugin:
    """A head's or a text source's part of an index (see the module docstring); every
    method but :meth:`attach` and :meth:`restore` has a default that does nothing (but
    :meth:`validate`'s, which loads a head file)."""

    key: ClassVar[str]  # its record in the manifest's meta
    api_name: ClassVar[str]  # its explanations' name in answers (JSON)
    # files it derives in the index folder -> how to see that one loads (dicosa check)
    derived: ClassVar[dict[str, Callable[[Path], object]]] = {}
    # What it gives an index that a request may ask for (the search modes it adds; whether it
    # leaves things out, "A without B"), and how an index gets it: the sentence that refuses
    # such a request of an index without it says so.
    modes: ClassVar[dict[str, SearchMode]] = {}
    leaves_out: ClassVar[bool] = False
    how: ClassVar[str] = ""
    # A head plugin's kind of head file (load_head's kind=), the command-line option that
    # passes one, and the file it was given (None: a loaded head, or no head).
    head_kind: ClassVar[str | None] = None
    head_option: ClassVar[str] = ""
    path: str | None = None

    def __init__(self, head=None):
        """``head``: a head file (its resolved path recorded; loaded and checked against the
        index's model by :meth:`validate`) or a loaded head (not recorded); None: none."""
        self.path = str(Path(head).resolve()) if isinstance(head, (str, os.PathLike)) else None
        self.head = None if self.path else head

    def attach(self, ctx: IndexContext) -> None:
        """Register stages, encoders, hooks, modes and options through ``ctx``; may be
        called again with a fresh context (an index reloaded after another process's
        commit)."""
        raise NotImplementedError

    def record(self) -> dict | None:
        """What the manifest keeps to restore it (None: nothing; a plugin made from objects
        rather than files cannot be restored by another process)."""
        return None

    @classmethod
    def restore(cls, record: dict, ctx: IndexContext) -> IndexPlugin:
        """The plugin a record describes, not yet attached."""
        raise NotImplementedError

    @classmethod
    def from_options(cls, options: Mapping[str, object], record: dict | None
                     ) -> IndexPlugin | bool | None:
        """The plugin a front end's ``options`` ask for in place of ``record`` (what the
        index recorded; None: nothing): a plugin (attached and recorded), None (they ask
        nothing of it: the record is restored) or False (left out of these searches, its
        record kept). ``options`` are the command line's, by their argparse names
        (``head``, ``concepts``, ``exclusion_set`` as a dict, ``mul2vec``, ``speech`` ...);
        what a plugin cannot take is one sentence, before any work."""
        return None

    @classmethod
    def recorded_head(cls, record: dict) -> str | None:
        """The head file ``record`` names (None: it names none); a file no longer there is
        one sentence (FileNotFoundError) naming the option that replaces it."""
        path = record.get("head")
        if path and not Path(path).is_file():
            raise FileNotFoundError(
                f"the {cls.key} head recorded in the index, {path}, is missing; pass "
                f"{cls.head_option} HEAD.pt with its new location")
        return os.fspath(path) if path else None

    def validate(self, model: DiCoSA) -> None:
        """Load its head file, checked against ``model`` (before any video is encoded, and
        before each :meth:`attach`)."""
        if self.path is not None:
            self.head = self.read_head(model)

    def read_head(self, model: DiCoSA) -> torch.nn.Module:
        """Its head file (:attr:`path`), of kind :attr:`head_kind`, checked against ``model``."""
        from ..heads.base import load_head

        return load_head(self.path, model, kind=self.head_kind)

    @classmethod
    def check_files(cls, directory: Path, live: np.ndarray, repair: bool) -> FileCheck:
        """Check the files it keeps in ``directory`` against the live rows (``repair``:
        delete what does not load; it is derived, and rebuilt when next needed)."""
        return check_derived(directory, cls.derived, repair)

    def explain(self, result: SearchResult, i: int) -> dict | None:
        """Why hit ``i`` of ``result`` ranks where it does, as plain JSON-able values."""
        return None

    def annotate(self, result: SearchResult, i: int) -> dict:
        """Keys it adds to hit ``i``'s answer (the text plugin's matched lines)."""
        return {}

    def annotate_row(self, result: SearchResult, row: int) -> dict:
        """Keys it adds to the answer of a moment, store row ``row``."""
        return {}

    def summary(self, result: SearchResult) -> dict:
        """Keys it adds to a search's answer (the text plugin's ``ranked_by``)."""
        return {}

    def evidence(self, result: SearchResult, i: int) -> tuple[str, tuple[float, float]] | None:
        """``(by, (start, end))``: what decided hit ``i``'s best moment, where it was not the
        pictures, and the time range its best frame is taken from (None: the pictures)."""
        return None

    def readable(self, said: dict) -> list[str]:
        """Lines for a person of what it said of one hit or moment: ``said`` holds its
        annotations and, when asked, ``"explain"``: its explanation."""
        return []

    def describe(self) -> dict:
        """What it gives this index, for ``/api/info``."""
        return {}

    def report(self, before: IndexPlugin | None) -> list[str]:
        """What attaching it did, for ``dicosa index`` (``before``: the plugin of the same
        key it replaced)."""
        return []


def plugin_class(key: str) -> type[IndexPlugin]:
    """The plugin class that restores manifest record ``key``."""
    return _named(BUILTIN_PLUGINS[key])


def chosen_plugins(options: Mapping[str, object], meta: Mapping[str, object] | None = None
                   ) -> dict[str, IndexPlugin | bool]:
    """Each built-in plugin's answer to a front end's ``options`` (:meth:`IndexPlugin
    .from_options`; ``meta``: what the index recorded), by key, where it has one."""
    meta = meta or {}
    chosen = {key: plugin_class(key).from_options(options, meta.get(key))
              for key in BUILTIN_PLUGINS}
    return {key: plugin for key, plugin in chosen.items() if plugin is not None}


def how_to_get(offers: Callable[[type[IndexPlugin]], bool]) -> str:
    """How an index gets the built-in plugin ``offers`` picks ("": none does)."""
    return next((cls.how for cls in map(plugin_class, BUILTIN_PLUGINS) if offers(cls)), "")


def query_option(name: str) -> QueryOption | None:
    """How option ``name`` is checked where the index lacks the built-in plugin that
    registers it (None: no built-in plugin registers it)."""
    return _named(BUILTIN_OPTIONS[name]) if name in BUILTIN_OPTIONS else None


def _named(where: str):
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def check_derived(directory: Path, files: Mapping[str, Callable[[Path], object]],
                  repair: bool) -> FileCheck:
    """Whether each of ``files`` (name in ``directory`` -> how to read it) that is there
    loads; ``repair`` deletes one that does not (it is rebuilt when next needed)."""
    found = FileCheck()
    for name, read in files.items():
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            read(path)
        except Exception as exc:
            what = f"{path} does not load ({type(exc).__name__})"
            if repair:
                path.unlink()
                found.repaired.append(what + ": deleted, rebuilt when next needed")
            else:
                found.problems.append(what + "; 'check --repair' deletes it (derivable)")
    return found
