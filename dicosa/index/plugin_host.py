"""How :class:`~dicosa.index.VideoIndex` attaches, records and restores its plugins
(the contract itself is :mod:`dicosa.index.plugins`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..errors import IndexBusyError
from .plugins import BUILTIN_PLUGINS, IndexContext, IndexPlugin, plugin_class

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

    def restore_plugins(self, skip: Iterable[str] = ()) -> None:
        """Attach every plugin the manifest records (but the keys in ``skip``), in the
        order lexical, concepts, fusion, text."""
        skip = set(skip)
        for key in BUILTIN_PLUGINS:
            record = self.meta.get(key)
            if record and key not in skip and key not in self.plugins:
                plugin = plugin_class(key).restore(record, self._context())
                self._attach_plugin(key, plugin)
                self.plugins[key] = plugin

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
