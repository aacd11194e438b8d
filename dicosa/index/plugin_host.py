"""The plugins of an index: attached, restored, and what they registered (the contract
itself is :mod:`dicosa.index.plugins`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from ..search.types import EncodedQueries, RerankHook
from .plugins import BUILTIN_PLUGINS, IndexContext, IndexPlugin, plugin_class
from .searcher import SearchMode

__all__ = ["PluginHost"]

_DENSE = {"dense": SearchMode(("dense",), "the dense first stage only")}


class PluginHost(Mapping[str, IndexPlugin]):
    """The attached plugins, by key, and what they registered through their contexts: rerank
    ``hooks``, query ``encoders`` and search ``modes`` (besides the built-in ``"dense"``).
    ``context`` makes the :class:`IndexContext` a plugin attaches through."""

    def __init__(self, context: Callable[[], IndexContext]):
        self._context = context
        self._plugins: dict[str, IndexPlugin] = {}
        self._contexts: dict[str, IndexContext] = {}
        self.hooks: list[RerankHook] = []
        self.encoders: list[Callable[[EncodedQueries], None]] = []
        self.modes: dict[str, SearchMode] = dict(_DENSE)

    def __getitem__(self, key: str) -> IndexPlugin:
        return self._plugins[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)

    def attach(self, plugin: IndexPlugin) -> None:
        """Attach ``plugin``, replacing one of the same key (whose registrations go)."""
        if plugin.key in self._plugins:
            self._contexts.pop(plugin.key).detach()
            del self._plugins[plugin.key]
        self._attach(plugin.key, plugin)
        self._plugins[plugin.key] = plugin

    def _attach(self, key: str, plugin: IndexPlugin) -> None:
        ctx = self._context()
        try:
            plugin.attach(ctx)
        except BaseException:
            ctx.detach()
            raise
        self._contexts[key] = ctx

    def restore(self, records: Mapping[str, dict], skip: Iterable[str] = ()) -> None:
        """Attach every plugin ``records`` (the manifest's meta) holds a record of (but the
        keys in ``skip``), in the order lexical, concepts, fusion, text."""
        skip = set(skip)
        for key in BUILTIN_PLUGINS:
            record = records.get(key)
            if record and key not in skip and key not in self._plugins:
                plugin = plugin_class(key).restore(record, self._context())
                self._attach(key, plugin)
                self._plugins[key] = plugin

    def reattach(self) -> None:
        """Every plugin attached again through a fresh context (the index took its last
        commit back: what they registered went with it)."""
        for ctx in self._contexts.values():
            ctx.detach()
        for key, plugin in list(self._plugins.items()):
            self._attach(key, plugin)

    def explainers(self) -> dict[str, Callable]:
        """Each plugin's ``explain``, by key."""
        return {key: plugin.explain for key, plugin in self._plugins.items()}
