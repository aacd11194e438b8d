"""The search methods of :class:`~dicosa.index.VideoIndex`: each lends the index's current
parts to a :class:`~dicosa.index.searcher.Searcher` for one call."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from ..search.query_text import QueryText
from ..search.types import RerankHook
from .searcher import DEFAULT_CANDIDATES, Hit, Searcher, SearchResult, check_search

__all__ = ["Searching"]

log = logging.getLogger("dicosa.index.video_index")


class Searching:
    """Mixed into :class:`~dicosa.index.VideoIndex`."""

    def searcher(self, hooks: Sequence[RerankHook] | None = None,
                 options: dict | None = None) -> Searcher:
        """The query path over this index's current parts (:mod:`dicosa.index.searcher`);
        ``options`` (checked: :meth:`check_request`) go into every batch's
        ``EncodedQueries.extra`` before the query encoders run."""
        explainers = {key: plugin.explain for key, plugin in self.plugins.items()}
        encoders = list(self.query_encoders)
        if options:
            encoders.insert(0, lambda encoded: encoded.extra.update(options))
        return Searcher(self._require_model(), self.tokenizer, self.device, self.store,
                        self._stages, self.modes, list(self.hooks if hooks is None else hooks),
                        encoders, explainers, self.frames, self.query_text)

    def configure_queries(self, tower: str = "float", cache: int = 0) -> QueryText:
        """Encode queries with ``tower`` (``"float"``: the model's text tower; ``"packed"``:
        the CPU tower, same vectors; ``"int8"``: it with int8 linear layers; ``"auto"``:
        packed on a CPU, :mod:`dicosa.text_tower`) and keep the vectors of the last ``cache``
        query texts (0: none); see :mod:`dicosa.search.query_text`."""
        self.query_text = QueryText(self._require_model(), self.tokenizer, self.device,
                                    tower=tower, cache=cache)
        return self.query_text

    def encode_queries(self, texts: Sequence[str], exclude: Sequence[str] = (),
                       mode: str | None = None):
        """Parse and encode queries once, running the query encoders (no search)."""
        return self.searcher().encode(texts, exclude, mode)[0]

    @torch.inference_mode()
    def scores(self, texts: str | Sequence[str], chunk: int = 1024) -> Tensor:
        """DiCoSA scores S of every text against every indexed video, in :attr:`ids` order:
        ``[T, V]`` float32. The texts are encoded as given (no query parsing); videos are
        read ``chunk`` at a time, so memory stays bounded by the chunk."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        searcher = self.searcher()
        text = searcher.model.encode_text(self.tokenizer(texts).to(self.device))
        return searcher.exhaustive(text, self.store.live(), chunk)

    def query(self, text: str | Sequence[str], k: int = 10,
              candidates: int | None = DEFAULT_CANDIDATES, *,
              hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
              exclude: Sequence[str] = (), mode: str | None = None, **options: object
              ) -> SearchResult | list[SearchResult]:
        """:meth:`search` with everything it computed: a :class:`SearchResult` per text (hits,
        seconds per stage, the encoded query, the candidates, ``truncated``, ``explain``)."""
        k, candidates = check_search(text, k, candidates)
        texts = [text] if isinstance(text, str) else list(text)
        options = self.check_request(**options)
        results = self.searcher(hooks, options).run(texts, k, candidates, exclude=exclude,
                                                    mode=mode, chunk=chunk)
        for result in results:
            if result.truncated:
                log.warning("the query %r is longer than the %d tokens the model reads; it was "
                            "searched as far as the model reads it", result.query[:60],
                            self.model.config.max_words)
        return results[0] if isinstance(text, str) else results

    def search(self, text: str | Sequence[str], k: int = 10,
               candidates: int | None = DEFAULT_CANDIDATES, *,
               hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
               exclude: Sequence[str] = (), mode: str | None = None, **options: object
               ) -> list[Hit] | list[list[Hit]]:
        """The ``k`` best videos for ``text``, best first; a list of texts gives one list per
        text.

        Args:
            candidates: rows the first stage(s) propose for DiCoSA to rerank (C, raised to
                ``k`` when smaller). None scores every row with :meth:`DiCoSA.score` (the
                exhaustive reference); C at least the index's size reranks every row.
            hooks: rerank hooks to apply instead of :attr:`hooks`.
            chunk: videos per forward of the exhaustive path.
            exclude: things every result should not show, as ``"A without B"`` in the text
                does (needs the exclusion plugin).
            mode: a key of :attr:`modes`: which first stages propose candidates (``"dense"``;
                with a lexical head ``"lexical"``, ``"bow"`` or ``"hybrid"``). None: every
                registered stage.
            options: the search options the plugins register (:attr:`query_options`), e.g.
                the text plugin's ``source``: what the query is matched against,
                ``"visual"`` (DiCoSA alone), ``"subtitles"``, ``"speech"``, ``"screen"``,
                ``"text"`` (the three), ``"all"``, or several (a list, or comma-separated).
                None: what the option does by default.
        """
        return self.search_with_stats(text, k, candidates, hooks=hooks, chunk=chunk,
                                      exclude=exclude, mode=mode, **options)[0]

    def search_with_stats(self, text: str | Sequence[str], k: int = 10,
                          candidates: int | None = DEFAULT_CANDIDATES, *,
                          hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
                          exclude: Sequence[str] = (), mode: str | None = None,
                          **options: object) -> tuple[list[Hit] | list[list[Hit]], dict]:
        """:meth:`search` and what it did: seconds per stage and candidates kept per query."""
        results = self.query([text] if isinstance(text, str) else text, k, candidates,
                             hooks=hooks, chunk=chunk, exclude=exclude, mode=mode,
                             **options)
        stats = {**results[0].times, "stage": results[0].stage, "mode": mode,
                 "candidates": [r.candidates for r in results],
                 "truncated": [r.truncated for r in results]}
        hits = [r.hits for r in results]
        return (hits[0] if isinstance(text, str) else hits), stats
