"""How :class:`~dicosa.index.VideoIndex` attaches, records and restores its plugins, and
what it asks of them for a request (the contract itself is :mod:`dicosa.index.plugins`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from ..errors import IndexBusyError
from ..search.query import QueryError
from .annotations import Annotations
from .plugins import (
    BUILTIN_OPTIONS,
    BUILTIN_PLUGINS,
    IndexContext,
    IndexPlugin,
    QueryOption,
    chosen_plugins,
    how_to_get,
    plugin_class,
    query_option,
)

__all__ = ["PluginHost"]

log = logging.getLogger("dicosa.index.video_index")


class PluginHost:
    """Mixed into :class:`~dicosa.index.VideoIndex`."""

    def use(self, plugin: IndexPlugin, *, record: bool = True, wait: bool = True
            ) -> IndexPlugin:
        """Attach ``plugin`` (replacing one of the same key) and, with ``record``, keep its
        record in the manifest so that :meth:`load` restores it; returns it. ``wait=False``:
        while another process writes the index, the record is kept in this object only
        (:meth:`remember`)."""
        self._require_model()
        if plugin.key in self.plugins:
            self._contexts.pop(plugin.key).detach()
            del self.plugins[plugin.key]
        self._attach_plugin(plugin.key, plugin)
        self.plugins[plugin.key] = plugin
        recorded = plugin.record() if record else None
        if recorded is not None:
            self.remember(plugin.key, recorded, wait=wait)
        return plugin

    def _attach_plugin(self, key: str, plugin: IndexPlugin) -> None:
        ctx = self._context()
        try:
            plugin.attach(ctx)
        except BaseException:
            ctx.detach()
            raise
        self._contexts[key] = ctx

    def _context(self) -> IndexContext:
        return IndexContext(self.model, self.tokenizer, self.device, self.store,
                            self.directory, self.model_key, self.meta, self._stages,
                            self.modes, self.hooks, self.query_encoders, self._is_writer)

    def _is_writer(self) -> bool:
        """Whether this object may write the folder now: it holds the writer lock (or the
        index is in memory)."""
        return self.directory is None or (self._lock is not None and self._lock.held
                                           and self._lock.directory == self.directory)

    def restore_plugins(self, skip: Iterable[str] = (),
                        options: Mapping[str, object] | None = None) -> None:
        """Attach every plugin the manifest records (but the keys in ``skip``), in the
        order lexical, concepts, fusion, text; ``options`` (a front end's, see
        :meth:`IndexPlugin.from_options`) may put another plugin in a record's place (it is
        recorded, when no other process is writing) or leave one out."""
        skip = set(skip)
        chosen = chosen_plugins(options, self.meta) if options else {}
        for key in BUILTIN_PLUGINS:
            record, plugin = self.meta.get(key), chosen.get(key)
            if key in skip or key in self.plugins or plugin is False:
                continue
            if plugin is not None:
                self.use(plugin, wait=False)
            elif record:
                plugin = plugin_class(key).restore(record, self._context())
                self._attach_plugin(key, plugin)
                self.plugins[key] = plugin

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
        return any(plugin.leaves_out for plugin in self.plugins.values())

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
        return Annotations(dict(self.plugins))

    def remember(self, key: str, value: dict, *, wait: bool = True) -> bool:
        """Keep ``value`` as ``meta[key]`` in one transaction from the current manifest; a
        record that is already there writes nothing. ``wait=False``: when another process
        is writing, keep it in this object only, say so, and return False."""
        if self.meta.get(key) == value:
            return True
        try:
            with self.transaction(timeout=None if wait else 0):
                self.meta[key] = value
        except IndexBusyError as exc:
            self.meta[key] = value
            log.warning("%s; the %s setting applies to this search but is not recorded",
                        exc, key)
            return False
        return True
