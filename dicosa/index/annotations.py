"""What an index's plugins add to answers, as the front ends ask for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .plugins import PICTURES, IndexPlugin

if TYPE_CHECKING:
    from .searcher import SearchResult

__all__ = ["Annotations"]


class Annotations:
    """The plugins of one index, asked together (``index.annotations``): the command line
    and the service name no plugin, they ask this for a hit's explanations, the keys the
    plugins add to a hit, a moment and an answer, a best frame's time range, and lines for a
    person."""

    def __init__(self, plugins: Mapping[str, IndexPlugin]):
        self.plugins = dict(plugins)

    def explain(self, result: SearchResult, i: int) -> dict:
        """Hit ``i``'s explanations as answers give them, by each plugin's API name."""
        return {self.plugins[key].api_name: said
                for key, said in result.explain(i).items() if key in self.plugins}

    def hit(self, result: SearchResult, i: int) -> dict:
        """The keys the plugins add to hit ``i``'s answer."""
        return self._merged(lambda plugin: plugin.annotate(result, i))

    def row(self, result: SearchResult, row: int) -> dict:
        """The keys the plugins add to the answer of a moment (store row ``row``)."""
        return self._merged(lambda plugin: plugin.annotate_row(result, row))

    def answer(self, result: SearchResult | None) -> dict:
        """The keys the plugins add to a search's answer; ``ranked_by`` is always among them
        (the pictures, where no plugin says otherwise or there was no search)."""
        said = {"ranked_by": dict(PICTURES)}
        if result is not None:
            said.update(self._merged(lambda plugin: plugin.summary(result)))
        return said

    def evidence(self, result: SearchResult | None, i: int
                 ) -> tuple[str, tuple[float, float] | None]:
        """What decided hit ``i``'s best moment and the time range its best frame is taken
        from: a plugin's (the line that decided it), else ``("pictures", None)``."""
        for plugin in self.plugins.values() if result is not None else ():
            found = plugin.evidence(result, i)
            if found is not None:
                return found
        return "pictures", None

    def readable(self, result: SearchResult, i: int, explain: bool = False) -> list[str]:
        """Lines for a person under hit ``i``: each plugin's annotations and, with
        ``explain``, its explanation."""
        lines = []
        for plugin in self.plugins.values():
            said = plugin.annotate(result, i)
            explained = plugin.explain(result, i) if explain else None
            if explained is not None:
                said["explain"] = explained
            lines += plugin.readable(said)
        return lines

    def readable_row(self, result: SearchResult, row: int) -> list[str]:
        """Lines for a person under a moment (store row ``row``)."""
        return [line for plugin in self.plugins.values()
                for line in plugin.readable(plugin.annotate_row(result, row))]

    def describe(self) -> dict:
        """What each plugin gives the index, by its API name (``/api/info``)."""
        return {plugin.api_name: plugin.describe() for plugin in self.plugins.values()}

    def _merged(self, said) -> dict:
        out: dict = {}
        for plugin in self.plugins.values():
            out.update(said(plugin))
        return out
