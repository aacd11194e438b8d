"""A searchable index of a video collection for one DiCoSA model: two-stage retrieval.

:class:`VideoIndex` decodes and encodes a collection once and keeps each video's per-frame
features in a memory-mapped :class:`~dicosa.search.store.FrameStore`. DiCoSA's score pools the
frames under the query (Eq. 1), so no one vector per video ranks like it: first stages
(:mod:`dicosa.index.stages`, and those plugins register) propose ``candidates`` rows, DiCoSA
scores them from their stored frames and the rerank hooks adjust the scores
(:mod:`dicosa.index.searcher`); ``candidates=None`` scores every row, the exhaustive
reference. Heads join through plugins (:mod:`dicosa.index.plugins`), recorded in the
manifest and restored on load. Every write is one transaction under the folder's writer lock
(:mod:`dicosa.index.transactions`; ``docs/data-safety.md``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd
import torch

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from ..fingerprint import fingerprint_mismatch, model_fingerprint
from ..integers import at_least
from ..model import DiCoSA, VideoFeatures
from ..search.query_text import QueryText
from ..search.shards import VideoRun
from ..search.store import FrameStore
from ..search.store_check import verify as verify_store
from ..search.types import RerankHook
from .annotations import Annotations
from .encode import clips_as_features
from .hits import Hit
from .ingest import Clip, ingest, new_or_changed
from .listing import list_videos
from .lock import IndexBusyError
from .manifest import MANIFEST, Manifest, read_reserved
from .plugin_host import PluginHost
from .plugins import IndexContext, IndexPlugin, chosen_plugins
from .resume import (
    check_frame_dtype,
    check_frames,
    check_segments,
    check_stage,
    segment_policy,
)
from .searcher import DEFAULT_CANDIDATES, Searcher, SearchParts, SearchResult, check_search
from .stages import DEFAULT_BACKEND, StageSet, default_summary_kind
from .transactions import Writer

__all__ = ["VideoIndex", "open_index"]

log = logging.getLogger(__name__)


class VideoIndex:
    """Per-frame features of a video collection, searched in two stages (module docstring).

    Build with :meth:`build`, reopen with :meth:`load` (or :func:`open_index`, which also
    rebuilds the recorded model); search with :meth:`query` (a :class:`SearchResult` per
    text) or :meth:`search` (its hits). ``index.skipped`` lists the files that could not be
    decoded, as ``(path, reason)``. A façade over ``store`` (the frames), ``stages`` (the
    first stages kept in step with it), ``plugins``
    (:class:`~dicosa.index.plugin_host.PluginHost`) and ``writer`` (lock, transactions and
    the rows written in them); a search borrows a frozen :meth:`snapshot` of them.

    ``summary`` is what the dense stage compares (:mod:`dicosa.search.proxy`): None gives a
    new index ``"frames"`` (every frame a row, a video scored by its best frame: no training
    needed; ``"confidence"`` on Milvus); ``"distilled"`` with ``summary_head`` ranks closest
    to DiCoSA. ``backend=None`` keeps no dense first stage (the parts of a multi-process
    build). ``frame_sampling``/``frame_padding`` (default ``segments``/``black``) are how
    :meth:`add` decodes videos. ``lock_timeout``: seconds a write waits for another writer
    (None: as long as it takes; 0: fail at once with :class:`IndexBusyError`).
    ``segments``: how :meth:`add` treats long videos (:mod:`dicosa.data.segments`): None or
    True gives a new index the default policy, a policy or a dict of its fields another,
    False one row of N frames per video. ``frame_dtype``: how a new index keeps frames,
    ``"float16"`` (default) or ``"int8"`` (half the bytes, scores within a stated bound:
    :mod:`dicosa.search.frame_codec`); an existing index keeps its own.
    """

    def __init__(self, model: DiCoSA | None, *, tokenizer: Callable | None = None,
                 device: torch.device | str | None = None,
                 backend: str | None = DEFAULT_BACKEND,
                 uri: str | None = None, stage_options: dict | None = None,
                 summary: str | None = None, summary_head=None,
                 frame_sampling: str | None = None, frame_padding: str | None = None,
                 lock_timeout: float | None = None,
                 segments: SegmentPolicy | dict | bool | None = None,
                 frame_dtype: str | None = None):
        self.model: DiCoSA | None = None
        self.segments = (segment_policy(segments, model.config.num_frames)
                         if model is not None else None)
        self.frames = FrameProtocol().override(frame_sampling, frame_padding)
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else None
        self.skipped: list[tuple[str, str]] = []
        self.text_only: list[tuple[str, str]] = []  # undecodable, indexed from the title
        self.partial: list[tuple[str, str]] = []  # (path, damage) of this object's adds
        self.meta: dict = {}
        self.store = FrameStore(frame_dtype=frame_dtype or "float16")
        self.stages = StageSet(self.store, {
            "backend": backend, "uri": uri, "options": dict(stage_options or {}),
            "summary": summary or default_summary_kind(backend), "calibration": None,
            "dim": None}, summary_head)
        self.writer = Writer(self.store, self.stages, self._manifest, self._take, lock_timeout)
        self.plugins = PluginHost(self._context)
        self._fingerprint: dict | None = None
        self.model_key: str | None = None  # set by attach
        # how queries are encoded (the text tower, the cache): set by attach, or by
        # configure_queries
        self.query_text: QueryText | None = None
        if model is not None:
            self.attach(model)

    @property
    def directory(self) -> Path | None:
        """The index folder (None: in memory until :meth:`save`)."""
        return self.writer.directory

    @directory.setter
    def directory(self, directory: Path | None) -> None:
        self.writer.directory = self.stages.directory = directory

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def build(cls, model: DiCoSA, videos: str | os.PathLike | Iterable[str | os.PathLike],
              out_dir: str | os.PathLike | None = None, *, batch_size: int = 16,
              num_workers: int | None = None, tokenizer: Callable | None = None,
              shard_size: int = 256, device: torch.device | str | None = None,
              meta: dict | None = None, progress: bool = True,
              titles: dict[str, str] | str | os.PathLike | None = None,
              **options) -> VideoIndex:
        """Decode and encode ``videos`` (a folder, a file or a list of files) into ``out_dir``
        (None: in memory until :meth:`save`); an index already there (same model) is resumed
        and its videos are not encoded again.

        ``options`` are :meth:`create_or_resume`'s, the rest :meth:`add`'s. ``meta``:
        free-form JSON-able facts stored in the manifest. A folder of videos that does not
        exist is one sentence, and ``out_dir`` is left as it was.
        """
        videos = list_videos(videos)  # before anything is written
        index = cls.create_or_resume(model, out_dir, tokenizer=tokenizer, device=device,
                                     **options)
        with index.writing():  # one writer from the settings to the last video
            if meta:
                with index.transaction():
                    index.meta.update(meta)
            index.add(videos, batch_size=batch_size, num_workers=num_workers,
                      shard_size=shard_size, progress=progress, titles=titles)
        return index

    @classmethod
    def create_or_resume(cls, model: DiCoSA, out_dir: str | os.PathLike | None, *,
                         tokenizer: Callable | None = None,
                         device: torch.device | str | None = None,
                         backend: str | None = "default", uri: str | None = None,
                         stage_options: dict | None = None, summary: str | None = None,
                         summary_head=None, frame_sampling: str | None = None,
                         frame_padding: str | None = None,
                         lock_timeout: float | None = None,
                         segments: SegmentPolicy | dict | bool | None = None,
                         frame_dtype: str | None = None) -> VideoIndex:
        """The index in ``out_dir`` (same model, frame protocol and first stage, else one
        ValueError sentence: :mod:`dicosa.index.resume`), or a new empty one committed there
        at once (None: in memory). Options left None (``backend="default"``) keep what a
        resumed index recorded; a new index gets the defaults (``backend=None``: no dense
        stage, for the parts of a multi-process build)."""
        out = Path(out_dir) if out_dir is not None else None
        if out is not None and (out / MANIFEST).is_file():
            index = cls.load(out, model, tokenizer=tokenizer, device=device,
                             lock_timeout=lock_timeout)
            check_frames(out, index.frames, frame_sampling, frame_padding)
            check_segments(out, index.segments, segments, model.config.num_frames)
            check_frame_dtype(out, index.store.frame_dtype, frame_dtype)
            check_stage(out, index.stages.spec, backend, uri, stage_options, summary)
            log.info("resuming the index at %s (%d videos)", out, len(index))
            return index
        index = cls(model, tokenizer=tokenizer, device=device,
                    backend=DEFAULT_BACKEND if backend == "default" else backend, uri=uri,
                    stage_options=stage_options, summary=summary,
                    summary_head=summary_head, frame_sampling=frame_sampling,
                    frame_padding=frame_padding, lock_timeout=lock_timeout,
                    segments=segments, frame_dtype=frame_dtype)
        if out is not None:
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                from ..files import storage_error

                raise storage_error(exc, out, "creating the index folder") from None
            index.directory = index.store.directory = out
            with index.transaction():
                pass  # the first commit: an empty index with its settings
        return index

    # -- persistence ----------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the whole index to ``directory`` (one transaction there), which becomes
        where later writes go."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.directory is None or directory.resolve() != self.directory.resolve():
            if (directory / MANIFEST).is_file():
                raise FileExistsError(f"{directory} already holds an index; save into an "
                                      "empty folder, or add to that index")
            self.writer.generation = 0
        self.directory = directory
        with self.transaction():
            self.store.save(directory)
            self.stages.save_summary_head()
            self.stages.save(directory)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, model: DiCoSA | None = None, *,
             strict: bool = True, tokenizer: Callable | None = None,
             device: torch.device | str | None = None, plugins: bool = True,
             skip: Iterable[str] = (), verify: bool | None = None,
             lock_timeout: float | None = None, options: dict | None = None) -> VideoIndex:
        """Open an index written by :meth:`build` or :meth:`save` (format version 1-3).

        The store is memory-mapped; the dense first stage is opened from its files, or
        rebuilt from the stored proxies when it lags the store.

        Args:
            model: the model to search with; it must have the weights and config the index
                was built with. None opens the index for reading only (no search, no plugin).
            strict: a model that differs raises ValueError (True) or warns (False).
            plugins: restore every plugin the manifest records (but those in ``skip``);
                a front end's ``options`` may replace or leave out one
                (:meth:`IndexPlugin.from_options`; one put in a record's place is recorded,
                when no other process is writing).
            verify: check each shard file against its recorded checksum now (reads the
                whole store); None: when the store is under 1 GiB.

        Raises:
            FileNotFoundError: no manifest in ``directory``.
            ValueError: not a dicosa index, a damaged one, or (strict) another model's.
        """
        index = cls(None, tokenizer=tokenizer, device=device, lock_timeout=lock_timeout)
        index.directory = Path(directory)
        index._take(Manifest.read(index.directory), True)
        index._verify(verify)
        if model is not None:
            index.attach(model, strict=strict)
            if plugins:
                chosen = chosen_plugins(options, index.meta) if options else None
                index.plugins.restore(index.meta, skip, chosen,
                                      lambda plugin: index.use(plugin, wait=False))
        return index

    def _verify(self, verify: bool | None) -> None:
        if verify is None:
            verify = sum(s.frames.nbytes for s in self.store.shards) < 1 << 30
        problems = verify_store(self.store) if verify else []
        if problems:
            from ..search.store import StoreError

            raise StoreError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                 if len(problems) > 1 else "")
                             + "; run 'dicosa check INDEX' for the details")

    # -- the writer's side ----------------------------------------------------------------
    def writing(self, timeout: float | None = None):
        """Hold the folder's writer lock (:meth:`Writer.writing`)."""
        return self.writer.writing(timeout)

    def transaction(self, timeout: float | None = None):
        """One change ending in one manifest commit (:meth:`Writer.transaction`)."""
        return self.writer.transaction(timeout)

    def _manifest(self, generation: int) -> Manifest:
        """This object's state as commit ``generation`` records it."""
        store = self.store.manifest()
        if store["num_frames"] is None:
            store["num_frames"] = (self._fingerprint or {}).get("config", {}).get("num_frames")
            store["dim"] = self.model.embed_dim if self.model is not None else None
        return Manifest(self._fingerprint, store, self.stages.record(), list(self.skipped),
                        self.frames, self.meta, generation, len(self), self.segments)

    def _take(self, manifest: Manifest, whole: bool) -> None:
        """The state ``manifest`` commits, in place: ``whole`` (opening, or the last commit
        after a failed write), every stage as recorded and every plugin attached again;
        else (another writer's commits) each stage given the rows added and losing the rows
        removed since, the plugins kept (their per-row data follow the store's ids)."""
        before = self.store.live()
        self.store.take(FrameStore.open(self.directory, manifest.store))
        self.store.reserved = read_reserved(self.directory)
        self.frames, self.segments = manifest.frames, manifest.segments
        self._fingerprint, self.meta = manifest.fingerprint, manifest.meta
        self.skipped = list(manifest.skipped)
        self.writer.generation = manifest.generation
        if not whole:
            self.stages.follow(before)
            self.stages.synced = manifest.first_stage.get("synced")
            return
        spec = manifest.first_stage
        self.stages.reset({"backend": spec.get("backend"), "uri": spec.get("uri"),
                           "options": spec.get("options") or {},
                           "summary": spec.get("summary", "confidence"),
                           "calibration": spec.get("calibration"), "dim": spec.get("dim"),
                           "synced": spec.get("synced")}, self.directory)
        if self.model is not None:
            self.plugins.reattach()

    # -- model ----------------------------------------------------------------------------
    def attach(self, model: DiCoSA, strict: bool = True) -> None:
        """Use ``model`` to encode and search (moved to the index's device, in eval mode).

        Raises ValueError (``strict``) or warns when the index was built with another model.
        """
        fingerprint = model_fingerprint(model)
        # Names what made an array kept beside the index (e.g. the encoded titles).
        self.model_key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()
                                        ).hexdigest()
        if self._fingerprint is not None:
            problem = fingerprint_mismatch(self._fingerprint, fingerprint)
            if problem:
                where = self.directory or "this index"
                message = (f"the index at {where} was built with {problem}; its features do "
                           "not fit this model. Rebuild the index with this model, or load it "
                           "with the model it was built with")
                if strict:
                    raise ValueError(message)
                warnings.warn(message, stacklevel=3)
        else:
            self._fingerprint = fingerprint
        if self.device is None:
            self.device = (torch.device("cuda") if torch.cuda.is_available()
                           else next(model.parameters()).device)
        self.model = model.to(self.device).eval()
        self.stages.model, self.stages.device = self.model, self.device
        self.stages.directory = self.directory
        if self.tokenizer is None:
            from ..clip import get_tokenizer

            self.tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
        if self.query_text is None or self.query_text.model is not self.model:
            self.query_text = QueryText(self.model, self.tokenizer, self.device)

    def configure_queries(self, tower: str = "float", cache: int = 0) -> QueryText:
        """Encode queries with ``tower`` (``"float"``: the model's text tower; ``"packed"``:
        the CPU tower, same vectors; ``"int8"``: it with int8 linear layers; ``"auto"``:
        packed on a CPU, :mod:`dicosa.text_tower`) and keep the vectors of the last ``cache``
        query texts (0: none); see :mod:`dicosa.search.query_text`."""
        self.query_text = QueryText(self._require_model(), self.tokenizer, self.device,
                                    tower=tower, cache=cache)
        return self.query_text

    def _require_model(self) -> DiCoSA:
        if self.model is None:
            raise RuntimeError("this index was loaded without a model; pass "
                               "VideoIndex.load(directory, model) to encode or search")
        return self.model

    # -- plugins --------------------------------------------------------------------------
    def use(self, plugin: IndexPlugin, *, record: bool = True, wait: bool = True
            ) -> IndexPlugin:
        """Attach ``plugin`` (replacing one of the same key) and, with ``record``, keep its
        record in the manifest so that :meth:`load` restores it; returns it. ``wait=False``:
        while another process writes the index, the record is kept in this object only
        (:meth:`remember`)."""
        self._require_model()
        self.plugins.attach(plugin)
        recorded = plugin.record() if record else None
        if recorded is not None:
            self.remember(plugin.key, recorded, wait=wait)
        return plugin

    def _context(self) -> IndexContext:
        return IndexContext(self.model, self.tokenizer, self.device, self.store,
                            self.directory, self.model_key, self.meta, self.stages,
                            self.plugins.modes, self.plugins.hooks, self.plugins.encoders,
                            self.writer.holds)

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

    # -- search ---------------------------------------------------------------------------
    def snapshot(self, hooks: Sequence[RerankHook] | None = None,
                 options: dict | None = None) -> SearchParts:
        """The parts a search reads, frozen now (:class:`~dicosa.index.searcher.SearchParts`):
        ``hooks`` instead of the plugins' (None: theirs); ``options`` go into every batch's
        ``EncodedQueries.extra`` before the query encoders run (``{"source": ...}``)."""
        encoders = tuple(self.plugins.encoders)
        if options:
            encoders = (lambda encoded: encoded.extra.update(options), *encoders)
        return SearchParts(self._require_model(), self.device, self.store, self.stages,
                           MappingProxyType(dict(self.plugins.modes)),
                           tuple(self.plugins.hooks if hooks is None else hooks), encoders,
                           MappingProxyType(self.plugins.explainers()), self.frames,
                           self.query_text)

    def query(self, text: str | Sequence[str], k: int = 10,
              candidates: int | None = DEFAULT_CANDIDATES, *,
              hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
              exclude: Sequence[str] = (), mode: str | None = None, **options: object
              ) -> SearchResult | list[SearchResult]:
        """The ``k`` best videos for ``text`` and everything the search computed: a
        :class:`SearchResult` (hits best first, seconds per stage, the encoded query, the
        candidates and their scores, ``truncated``, ``explain``, ``timelines``); a list of
        texts gives one per text, searched together.

        Args:
            candidates: rows the first stage(s) propose for DiCoSA to rerank (C, raised to
                ``k`` when smaller). None scores every row with :meth:`DiCoSA.score` (the
                exhaustive reference); C at least the index's size reranks every row.
            hooks: rerank hooks to apply instead of the plugins'.
            chunk: videos per forward of the exhaustive path.
            exclude: things every result should not show, as ``"A without B"`` in the text
                does (needs the exclusion plugin).
            mode: a search mode (``index.plugins.modes``): which first stages propose
                candidates (``"dense"``; with a lexical head ``"lexical"``, ``"bow"`` or
                ``"hybrid"``). None: every registered stage.
            options: the search options the plugins register
                (``index.plugins.query_options``), e.g. the text plugin's ``source``: what
                the query is matched against (``"visual"``, ``"speech"``, ``"all"``, ...;
                ``docs/text.md``). None: what the option does by default.
        """
        k, candidates = check_search(text, k, candidates)
        texts = [text] if isinstance(text, str) else list(text)
        searcher = Searcher(self.snapshot(hooks, self.check_request(**options)))
        results = searcher.run(texts, k, candidates, exclude=exclude, mode=mode, chunk=chunk)
        for result in results:
            if result.truncated:
                log.warning("the query %r is longer than the %d tokens the model reads; it was "
                            "searched as far as the model reads it", result.query[:60],
                            self.model.config.max_words)
        return results[0] if isinstance(text, str) else results

    def search(self, text: str | Sequence[str], k: int = 10,
               candidates: int | None = DEFAULT_CANDIDATES, **options
               ) -> list[Hit] | list[list[Hit]]:
        """The hits of :meth:`query` (its arguments): the ``k`` best videos for ``text``,
        best first; a list of texts gives one list per text."""
        found = self.query(text, k, candidates, **options)
        return found.hits if isinstance(found, SearchResult) else [r.hits for r in found]

    def check_request(self, exclude: Sequence[str] = (), mode: str | None = None,
                      **options: object) -> dict:
        """The one check of a search's request against this index (its plugins', one
        sentence where it cannot answer: :meth:`PluginHost.check_request
        <dicosa.index.plugin_host.PluginHost.check_request>`); the options as the query
        encoders read them."""
        return self.plugins.check_request(exclude, mode, **options)

    @property
    def default_mode(self) -> str:
        """The search mode of a search that names none (a plugin's, else dense)."""
        return self.plugins.default_mode

    @property
    def annotations(self) -> Annotations:
        """What the plugins add to answers, as the front ends ask for it."""
        return self.plugins.annotations

    # -- writes ---------------------------------------------------------------------------
    def add(self, videos: str | os.PathLike | Iterable[str | os.PathLike], *,
            batch_size: int = 16, num_workers: int | None = None, shard_size: int = 256,
            progress: bool = True, titles: dict[str, str] | str | os.PathLike | None = None,
            only_new: bool = True) -> int:
        """Encode and store the videos not yet indexed, and those whose file changed (size
        or modification time) since it was indexed; returns how many were stored.

        Files that cannot be decoded are logged, counted in :attr:`skipped` and left out,
        unless ``titles`` gives them a title: then they are indexed text-only (no frame in
        the mask; :attr:`text_only`); those whose decode lost part of them are indexed from
        what decodes and listed in :attr:`partial`. Each full shard is one transaction:
        stored, given to every first stage, committed. ``only_new=False`` encodes every
        listed video (each process of a multi-process build has decided itself what is new).
        The writer lock is held from the listing to the end, so two writers never encode the
        same video.
        """
        from ..search.title_fusion import normalise_titles

        batch_size = at_least(batch_size, "batch_size")
        shard_size = at_least(shard_size, "shard_size")
        if num_workers is not None:
            num_workers = at_least(num_workers, "num_workers", least=0)
        model = self._require_model()
        listed = list(dict.fromkeys(list_videos(videos)))
        with self.writing():
            todo = (new_or_changed(listed, self.store.table.videos()) if only_new
                    else listed)
            if not todo:
                return 0
            retried = set(todo)
            with self.transaction():
                self.skipped = [(p, r) for p, r in self.skipped if p not in retried]
            report = ingest(model, self.device, todo, self.frames, self._store_pending,
                            segments=self.segments, batch_size=batch_size,
                            num_workers=num_workers, shard_size=shard_size,
                            progress=progress, titles=normalise_titles(titles))
            with self.transaction():
                self.skipped += report.skipped
                self.text_only += report.text_only
                self.partial += report.partial
                if self.directory is not None:
                    self.stages.save(self.directory)
        if report.skipped:
            log.warning("skipped %d of %d video files that could not be indexed (see "
                        "index.skipped)", len(report.skipped), len(todo))
        return report.added

    def _store_pending(self, pending: list[Clip] | list[VideoRun], pad: np.ndarray) -> None:
        if isinstance(pending[0], VideoRun):
            self.add_runs(pending, pad)
            return
        self.add_features(*clips_as_features(pending))

    def add_features(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """Store already encoded videos (float16 ``[n, N, D]`` frames and their metadata rows,
        at least ``path``) as one shard, in one transaction; returns their row ids. A live
        row of the same path is replaced (a changed file encoded again)."""
        return self.writer.add_features(video, rows)

    def add_runs(self, runs: list[VideoRun], pad: np.ndarray) -> np.ndarray:
        """Store already encoded videos as frame runs cut into segments (one ``runs``
        shard, :mod:`dicosa.search.shards`), in one transaction; returns their row ids. The
        live rows of the same paths are replaced."""
        return self.writer.add_runs(runs, pad, self.segments.window)

    def link_shards(self, shards: list[tuple[str, int, dict | None]]) -> np.ndarray:
        """Append shard files already in the index folder, ``(name, count, sha256)``: each
        ``name`` relative to the folder, holding ``count`` rows, ``sha256`` its files'
        checksums where the writer recorded them; as new rows, without copying them, in one
        transaction; returns their ids. The merge of a multi-process or Ray build links its
        workers' shards this way."""
        return self.writer.link(shards, None if self.segments is None
                                else self.segments.window)

    def remove(self, videos: str | Iterable[str] | np.ndarray | Sequence[int]) -> int:
        """Remove videos (paths, or ids: a video's id or any of its rows' ids) from the store
        and every first stage, every row of each, in one transaction; returns how many rows
        were live. Their ids are never reused."""
        return self.writer.remove(videos)

    # -- contents -------------------------------------------------------------------------
    def __len__(self) -> int:
        """Indexed (live) videos; a long video's segments count once (rows:
        ``len(index.store)``)."""
        return len(self.store.videos)

    @property
    def ids(self) -> np.ndarray:
        """Ids of the indexed (live) videos, ascending (a video's id is its first row's)."""
        return self.store.videos.live()

    @property
    def paths(self) -> list[str]:
        return self.store.table.paths(self.store.videos.live())

    @property
    def metadata(self) -> pd.DataFrame:
        """One row per indexed video (index: the video's id): the columns of
        :data:`dicosa.search.store.COLUMNS`."""
        return self.store.table.videos()


def open_index(directory: str | os.PathLike, model: DiCoSA | None = None, *,
               device: torch.device | str | None = None, strict: bool = True,
               skip: Iterable[str] = (), lock_timeout: float | None = None,
               towers: str = "all", verify: bool | None = None,
               options: dict | None = None) -> VideoIndex:
    """An index ready to search as it was recorded: the model its manifest names (unless
    ``model`` is given) and every plugin it recorded (but those in ``skip``; ``options``:
    a front end's, :meth:`VideoIndex.load`).
    ``towers="text"`` loads that model without CLIP's image tower: a process that only
    searches (adding videos then says it needs the whole model). ``verify``: as
    :meth:`VideoIndex.load`'s."""
    if model is None:
        from ..loading import model_from_source

        source = Manifest.read(Path(directory)).meta.get("model")  # the index opens once
        if not source:
            raise ValueError(f"the index at {directory} does not record its model; pass the "
                             "model (dicosa search --checkpoint CKPT)")
        model = model_from_source(source, towers)
    return VideoIndex.load(directory, model, device=device, strict=strict, skip=skip,
                           lock_timeout=lock_timeout, verify=verify, options=options)
