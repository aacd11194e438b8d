"""A searchable index of a video collection for one DiCoSA model: two-stage retrieval.

:class:`VideoIndex` decodes and encodes a collection once and keeps each video's per-frame
features in a memory-mapped :class:`~dicosa.search.store.FrameStore`. DiCoSA's score pools the
frames under the query (Eq. 1), so no one vector per video ranks like it; search therefore runs
in two stages:

1. **first stage** — query-independent :class:`~dicosa.search.types.FirstStage` objects
   (:mod:`dicosa.index.stages`) propose ``candidates`` rows: by default the dense proxy in an
   exact, faiss or Milvus index; plugins may register more (a sparse lexical one), whose
   candidate lists are united. A search ``mode`` picks which of them to unite;
2. **rerank** — DiCoSA scores those candidates from their stored frames, then the rerank hooks
   (exclusion, fusion, ...) adjust the scores in order, and the top ``k`` are returned
   (:mod:`dicosa.index.searcher`).

``search(..., candidates=None)`` skips the first stage and scores every row with
:meth:`DiCoSA.score`: the exhaustive reference.

Heads join through plugins (:mod:`dicosa.index.plugins`): :meth:`VideoIndex.use` attaches one
and records it in the manifest; :meth:`VideoIndex.load` and :func:`open_index` restore every
recorded plugin, so Python, the command line and the service search the same way.

Every write (build, add, remove, recording a plugin or a setting) is a transaction under the
folder's writer lock (:mod:`dicosa.index.lock`), made from the current manifest and ending in
one atomic manifest commit (:mod:`dicosa.index.manifest`); a failed write leaves the last
commit, and this object is reloaded from it. ``docs/data-safety.md`` says what is guaranteed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from ..fingerprint import fingerprint_mismatch, model_fingerprint
from ..model import DiCoSA, VideoFeatures
from ..search.query_text import QueryText
from ..search.store import FrameStore
from ..search.types import RerankHook
from .adding import Adding
from .listing import list_videos
from .lock import WriterLock
from .manifest import MANIFEST, Manifest
from .plugin_host import PluginHost
from .plugins import IndexContext, IndexPlugin
from .searcher import SearchMode
from .searching import Searching
from .stages import DEFAULT_BACKEND, StageSet, default_summary_kind
from .transactions import Transactional

__all__ = ["VideoIndex", "open_index"]

log = logging.getLogger(__name__)

_DENSE = {"dense": SearchMode(("dense",), "the dense first stage only")}


class VideoIndex(Transactional, Adding, PluginHost, Searching):
    """Per-frame features of a video collection, searched in two stages (module docstring).

    Build with :meth:`build`, reopen with :meth:`load` (or :func:`open_index`, which also
    rebuilds the recorded model). ``index.skipped`` lists the files that could not be
    decoded, as ``(path, reason)``. ``hooks``, ``query_encoders`` and ``modes`` are the
    search's extension points (plugins fill them through :meth:`use`).

    ``summary`` is what the dense stage compares (:mod:`dicosa.search.proxy`): None gives a
    new index ``"frames"`` (every frame a row, a video scored by its best frame: no training
    needed; ``"confidence"`` on Milvus); ``"distilled"`` with ``summary_head`` ranks closest
    to DiCoSA. ``backend=None`` keeps no dense first stage: the per-process parts of a multi-process
    build (:mod:`dicosa.index.parallel`), whose merge builds the stage once over every row.
    ``frame_sampling``/``frame_padding`` (default ``segments``/``black``) are how :meth:`add`
    decodes videos: the model's ``data.frame_sampling``/``data.frame_padding``.
    ``lock_timeout``: seconds a write waits for another writer (None: as long as it takes;
    0: fail at once with :class:`~dicosa.index.lock.IndexBusyError`).

    ``segments`` is how :meth:`add` treats long videos (:mod:`dicosa.data.segments`): None or
    True gives a new index the default :class:`~dicosa.data.segments.SegmentPolicy` (frames at
    1 frame/s, shots, windows of the model's N frames); a policy or a dict of its fields sets
    another; False keeps one row of N frames per video, as an index before segments did.

    ``frame_dtype`` is how a new index keeps frames: ``"float16"`` (the default) or ``"int8"``
    with one scale per frame, half the bytes, the rerank's scores within a stated bound of
    the float ones (:mod:`dicosa.search.frame_codec`). An existing index keeps its own.
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
        self.directory: Path | None = None
        self.skipped: list[tuple[str, str]] = []
        self.text_only: list[tuple[str, str]] = []  # undecodable, indexed from the title
        self.partial: list[tuple[str, str]] = []  # (path, damage) of this object's adds
        self.meta: dict = {}
        self.store = FrameStore(frame_dtype=frame_dtype or "float16")
        self.hooks: list[RerankHook] = []
        self.query_encoders: list[Callable] = []
        self.modes: dict[str, SearchMode] = dict(_DENSE)
        self.plugins: dict[str, IndexPlugin] = {}
        self._contexts: dict[str, IndexContext] = {}
        self._stages = StageSet(self.store, {
            "backend": backend, "uri": uri, "options": dict(stage_options or {}),
            "summary": summary or default_summary_kind(backend), "calibration": None,
            "dim": None}, summary_head)
        self._fingerprint: dict | None = None
        self._generation = 0
        self.lock_timeout = lock_timeout
        self._lock: WriterLock | None = None
        self._in_transaction = 0
        self.model_key: str | None = None  # set by attach
        # how queries are encoded (the text tower, the cache): set by attach, or by
        # configure_queries
        self.query_text: QueryText | None = None
        if model is not None:
            self.attach(model)

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

        ``options`` are :meth:`create_or_resume`'s (backend, uri, stage_options, summary,
        summary_head, frame_sampling, frame_padding, lock_timeout, segments, frame_dtype);
        the rest are
        :meth:`add`'s. ``meta``: free-form JSON-able facts stored in the manifest. A folder
        of videos that does not exist is one sentence, and ``out_dir`` is left as it was.
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
        ValueError sentence), or a new empty one committed there at once (None: in memory).
        Options left None (``backend="default"``) keep what a resumed index recorded; a new
        index gets the defaults (``backend=None``: no dense stage, for the parts of a
        multi-process build)."""
        out = Path(out_dir) if out_dir is not None else None
        if out is not None and (out / MANIFEST).is_file():
            index = cls.load(out, model, tokenizer=tokenizer, device=device,
                             lock_timeout=lock_timeout)
            index._check_frames(frame_sampling, frame_padding)
            index._check_segments(segments)
            index._check_frame_dtype(frame_dtype)
            index._check_stage(backend, uri, stage_options, summary)
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
            index.directory = index.store.directory = index._stages.directory = out
            with index.transaction():
                pass  # the first commit: an empty index with its settings
        return index

    def _check_frames(self, sampling: str | None, padding: str | None) -> None:
        """Refuse to decode with another frame protocol than the index was built with: its
        rows would be features of differently picked frames (None keeps a field)."""
        asked = self.frames.override(sampling, padding)
        if asked != self.frames:
            raise ValueError(f"the index at {self.directory or 'this index'} decodes videos "
                             f"with frame {self.frames} (its manifest), not {asked}; build "
                             "a new index to decode with another frame protocol")

    def _check_segments(self, segments: SegmentPolicy | dict | bool | None) -> None:
        """Refuse to cut videos otherwise than the index does (None keeps what it does)."""
        if segments is None:
            return
        asked = segment_policy(segments, self._require_model().config.num_frames)
        if asked == self.segments:
            return
        where = self.directory or "this index"
        if self.segments is None:
            raise ValueError(f"the index at {where} keeps one row per video (it was built "
                             "before segments); to search inside long videos, build a new "
                             "index: dicosa index VIDEOS --out NEW_INDEX")
        raise ValueError(f"the index at {where} cuts videos by {self.segments.as_dict()}, not "
                         f"{'no segments' if asked is None else asked.as_dict()}; leave the "
                         "option out to add to it, or build a new index")

    def _check_frame_dtype(self, frame_dtype: str | None) -> None:
        """Refuse to keep new frames otherwise than the index does (None keeps its way)."""
        if frame_dtype is not None and frame_dtype != self.store.frame_dtype:
            raise ValueError(f"the index at {self.directory} keeps frames as "
                             f"{self.store.frame_dtype}, not {frame_dtype}; leave the option "
                             "out to add to it, or build a new index")

    def _check_stage(self, backend: str | None, uri: str | None, options: dict | None,
                     summary: str | None) -> None:
        """Options that cannot apply to an existing index are one sentence, not ignored."""
        spec = self._stages.spec
        asked = {"backend": backend, "uri": uri, "options": options or None,
                 "summary": summary}
        known = {"backend": spec.get("backend"), "uri": spec.get("uri"),
                 "options": spec.get("options") or None, "summary": spec.get("summary")}
        aliases = {"local": "faiss"}
        def same(a, b) -> bool:
            return (aliases.get(a, a) == aliases.get(b, b) if isinstance(a, str)
                    and isinstance(b, str) else a == b)

        differ = [k for k, v in asked.items() if v is not None and v != "default"
                  and not same(v, known[k])]
        if differ:
            said = ", ".join(f"{k} {asked[k]!r} (it has {known[k]!r})" for k in differ)
            raise ValueError(f"the index at {self.directory} already exists with another "
                             f"first stage: {said}; leave the option out to add to it, or "
                             "build a new index")

    # -- first stages ---------------------------------------------------------------------
    @property
    def stages(self) -> list:
        """The first stages, the dense one first."""
        return [r.stage for r in self._stages.all()]

    def dense_summary(self):
        """What the dense stage compares per video and per query
        (:class:`~dicosa.search.proxy.Summary`)."""
        return self._stages.summary()

    def summary_vectors(self, ids: np.ndarray, proxies: np.ndarray | None = None) -> np.ndarray:
        """The dense stage's vectors of rows ``ids`` (from their stored proxies or frames)."""
        return self._stages.summary_vectors(ids, proxies)

    @property
    def stage_spec(self) -> dict:
        """The dense stage's settings (the manifest's ``first_stage``)."""
        return self._stages.spec

    def add_first_stage(self, stage, videos=None, *, indexed: np.ndarray | None = None
                        ) -> None:
        """Register another first stage (not recorded: a plugin records itself)."""
        self._stages.register(stage, videos, indexed)

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
            self._generation = 0
        self.directory = self._stages.directory = directory
        with self.transaction():
            self.store.save(directory)
            self._stages.save_summary_head()
            self._stages.save(directory)
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
                (:meth:`restore_plugins`).
            verify: check each shard file against its recorded checksum now (reads the
                whole store); None: when the store is under 1 GiB.

        Raises:
            FileNotFoundError: no manifest in ``directory``.
            ValueError: not a dicosa index, a damaged one, or (strict) another model's.
        """
        index = cls(None, tokenizer=tokenizer, device=device, lock_timeout=lock_timeout)
        index.directory = Path(directory)
        index._apply(Manifest.read(index.directory))
        index._verify(verify)
        if model is not None:
            index.attach(model, strict=strict)
            if plugins:
                index.restore_plugins(skip, options)
        return index

    def _verify(self, verify: bool | None) -> None:
        if verify is None:
            verify = sum(s.frames.nbytes for s in self.store.shards) < 1 << 30
        problems = self.store.verify() if verify else []
        if problems:
            from ..search.store import StoreError

            raise StoreError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                 if len(problems) > 1 else "")
                             + "; run 'dicosa check INDEX' for the details")

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
        self._stages.model, self._stages.device = self.model, self.device
        self._stages.directory = self.directory
        if self.tokenizer is None:
            from ..clip import get_tokenizer

            self.tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
        if self.query_text is None or self.query_text.model is not self.model:
            self.query_text = QueryText(self.model, self.tokenizer, self.device)

    def _require_model(self) -> DiCoSA:
        if self.model is None:
            raise RuntimeError("this index was loaded without a model; pass "
                               "VideoIndex.load(directory, model) to encode or search")
        return self.model

    # -- contents -------------------------------------------------------------------------
    def __len__(self) -> int:
        """Indexed (live) videos; a long video's segments count once (rows:
        ``len(index.store)``)."""
        return self.store.num_videos()

    @property
    def ids(self) -> np.ndarray:
        """Ids of the indexed (live) videos, ascending (a video's id is its first row's)."""
        return self.store.live_videos()

    @property
    def paths(self) -> list[str]:
        return self.store.paths(self.store.live_videos())

    @property
    def metadata(self) -> pd.DataFrame:
        """One row per indexed video (index: the video's id): the columns of
        :data:`dicosa.search.store.COLUMNS`."""
        return self.store.video_metadata()

    @property
    def features(self) -> VideoFeatures:
        """Every live row's features, float16 ``frames [R, N, D]`` and ``frame_mask [R, N]``,
        read into memory: for small indexes and tests; search reads only candidates."""
        if not len(self):
            raise ValueError("the index is empty")
        return self.store.gather(self.store.live())

def segment_policy(segments: SegmentPolicy | dict | bool | None,
                   num_frames: int) -> SegmentPolicy | None:
    """The :class:`SegmentPolicy` the ``segments`` option asks for, for a model of
    ``num_frames`` frames (see :class:`VideoIndex`)."""
    if segments is False:
        return None
    if segments is None or segments is True:
        return SegmentPolicy(window=num_frames)
    if isinstance(segments, dict):
        return SegmentPolicy.from_dict({"window": num_frames, **segments})
    if segments.window != num_frames:
        raise ValueError(f"a segment holds the model's {num_frames} frames, not "
                         f"{segments.window}")
    return segments


def open_index(directory: str | os.PathLike, model: DiCoSA | None = None, *,
               device: torch.device | str | None = None, strict: bool = True,
               skip: Iterable[str] = (), lock_timeout: float | None = None,
               towers: str = "all", verify: bool | None = None,
               options: dict | None = None) -> VideoIndex:
    """An index ready to search as it was recorded: the model its manifest names (unless
    ``model`` is given) and every plugin it recorded (but those in ``skip``; ``options``:
    a front end's, :meth:`VideoIndex.restore_plugins`).
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
