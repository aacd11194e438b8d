"""The plugins of an index: attached, restored, what they registered, and what the index asks
of them for a request (the contract itself is :mod:`dicosa.index.plugins`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ..search.query import QueryError
from ..search.types import EncodedQueries, RerankHook
from .annotations import Annotations
from .plugins import (
    BUILTIN_OPTIONS,
    BUILTIN_PLUGINS,
    IndexContext,
    IndexPlugin,
    QueryOption,
    how_to_get,
    plugin_class,
    query_option,
)
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
            self.detach(plugin.key)
        self._attach(plugin.key, plugin)
        self._plugins[plugin.key] = plugin

    def detach(self, key: str) -> None:
        """Take plugin ``key`` off (what it registered goes with it; a record it left in the
        manifest stays)."""
        self._contexts.pop(key).detach()
        del self._plugins[key]

    def _attach(self, key: str, plugin: IndexPlugin) -> None:
        ctx = self._context()
        try:
            plugin.validate(ctx.model)
            plugin.attach(ctx)
        except BaseException:
            ctx.detach()
            raise
        self._contexts[key] = ctx

    def restore(self, records: Mapping[str, dict], skip: Iterable[str] = (),
                chosen: Mapping[str, IndexPlugin | bool] | None = None,
                use: Callable[[IndexPlugin], object] | None = None) -> None:
        """Attach every plugin ``records`` (the manifest's meta) holds a record of (but the
        keys in ``skip``), in the order lexical, concepts, titles, text; ``chosen`` (a front
        end's, :func:`~dicosa.index.plugins.chosen_plugins`) puts another plugin in a
        record's place, attached and recorded by ``use``, or leaves one out (False)."""
        skip, chosen = set(skip), chosen or {}
        for key in BUILTIN_PLUGINS:
            record, plugin = records.get(key), chosen.get(key)
            if key in skip or key in self._plugins or plugin is False:
                continue
            if plugin is not None:
                use(plugin)
            elif record:
                self.attach(plugin_class(key).restore(record, self._context()))

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

    # -- what a request may ask -----------------------------------------------------------
    @property
    def default_mode(self) -> str:
        """The search mode of a search that names none, as a plugin made it (hybrid with a
        lexical head), else dense."""
        for ctx in self._contexts.values():
            if ctx.default_mode in self.modes:
                return ctx.default_mode
        return "dense"

    @property
    def leaves_out(self) -> bool:
        """Whether a plugin answers "A without B"."""
        return any(plugin.leaves_out for plugin in self._plugins.values())

    @property
    def query_options(self) -> dict[str, QueryOption]:
        """The search options this index takes: its plugins', and for a built-in plugin it
        lacks, the check that says what it cannot do without it."""
        known = {name: query_option(name) for name in BUILTIN_OPTIONS}
        for ctx in self._contexts.values():
            known.update(ctx.options)
        return known

    def check_request(self, exclude: Sequence[str] = (), mode: str | None = None,
                      **options: object) -> dict:
        """One sentence (:class:`QueryError`) where this index cannot answer a search as
        asked: a mode it lacks, things to leave out without a hook that does, an option it
        does not take or a value the option refuses. Returns the options as the query
        encoders read them (None values: not asked)."""
        if mode is not None and mode not in self.modes:
            how = how_to_get(lambda plugin: mode in plugin.modes)
            raise QueryError(f"this index has no '{mode}' search mode (it has "
                             f"{', '.join(self.modes)})" + (f"; it comes with {how}" if how
                                                            else ""))
        if any(e.strip() for e in exclude) and not self.leaves_out:
            raise QueryError(f"this index cannot leave things out; that takes "
                             f"{how_to_get(lambda plugin: plugin.leaves_out)}")
        known = self.query_options
        checked = {}
        for name, value in options.items():
            if value is None:
                continue
            if name not in known:
                raise QueryError(f"this index takes no search option {name!r}; it takes "
                                 f"{', '.join(known) or 'none'}")
            checked[name] = known[name].check(value)
        return checked

    @property
    def annotations(self) -> Annotations:
        """What the plugins add to answers, as the front ends ask for it."""
        return Annotations(dict(self._plugins))
