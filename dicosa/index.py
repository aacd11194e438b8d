"""A searchable index of a video collection for one DiCoSA model: two-stage retrieval.

:class:`VideoIndex` decodes and encodes a collection once and keeps each video's per-frame
features in a memory-mapped :class:`~dicosa.search.store.FrameStore`. DiCoSA's score pools the
frames under the query (Eq. 1), so no one vector per video ranks like it; search therefore runs
in two stages:

1. **first stage** — a query-independent :class:`~dicosa.search.types.FirstStage` proposes
   ``candidates`` rows: by default the dense proxy (masked frame mean, Eq. 1 at τ → ∞) in an
   exact, faiss or Milvus index; more stages (a sparse lexical one) may be registered, and
   their candidate lists are united. A search ``mode`` (:attr:`VideoIndex.modes`:
   ``"dense"``, and ``"lexical"``/``"bow"``/``"hybrid"`` once a lexical head is attached,
   :func:`dicosa.search.lexical_index.attach_lexical`) picks which of them to unite;
2. **rerank** — DiCoSA scores those candidates from their stored frames
   (:func:`~dicosa.search.rerank.pair_scores`, equal to :meth:`DiCoSA.score`), then the
   :attr:`VideoIndex.hooks` (exclusion, fusion, ...) adjust the scores in order, and the top
   ``k`` are returned as :class:`Hit` objects.

``search(..., candidates=None)`` skips the first stage and scores every row with
:meth:`DiCoSA.score`: the exhaustive reference.

On-disk format (one folder)::

    manifest.json              what is in the index; rewritten atomically after each shard
    shard-00000.safetensors    frames, frame_mask, proxy of one shard (see search/store.py)
    shard-00000.csv            one metadata row per video of that shard
    first_stage.json, dense.*  the dense first stage's own files (search/dense.py)

``manifest.json`` holds ``format`` (``"dicosa-video-index"``), ``version`` (2, or 3 when the
frame protocol is not ``segments``/``black``: see below), ``fingerprint``
(``weights_sha256`` and the ``config`` fields that change features or scores), the store's
fields (``num_frames``, ``dim``, ``next_id``, ``removed`` row ids, ``shards``:
``[{"name", "first_id", "count", "proxy"}]``), ``num_videos`` (live rows), ``first_stage``
(``backend``, ``uri``, ``options``, ``synced``: the store's ``[next_id, removed]`` when the
stage was last saved; a stage that lags is rebuilt from the stored proxies when opened),
``skipped`` (``[{"path", "reason"}]``), ``frames`` (``{"sampling", "padding"}``: the frame
protocol every video was decoded with, :class:`~dicosa.data.protocol.FrameProtocol`; a
manifest without it was written before it was recorded, when indexes always decoded
``segments``/``black``; an index with another protocol is version 3, so that a dicosa from
before the field refuses it instead of adding videos decoded the wrong way) and ``meta``
(free-form; dicosa keeps there ``model``, what built the index, and ``lexical``,
``concepts`` and ``fusion``, the heads and settings ``python -m dicosa search`` reattaches).
Only shards listed in the manifest belong to the index, so an interrupted write leaves at
most an orphan file that the next shard overwrites; a build into a folder that already
holds an index resumes it. Version-1 folders (no proxies, no first stage) open as they are
and are upgraded on their next write.

A multi-process build (:mod:`dicosa.parallel_index`) adds ``parts/rank-R/``: each process's
own shards and manifest (an index without a first stage). The merged ``manifest.json`` lists
those shards by their relative names (``parts/rank-1/shard-00000``); nothing else changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from .checkpoint import write_text_atomic
from .data.protocol import FrameProtocol
from .fingerprint import fingerprint_mismatch, model_fingerprint
from .model import DiCoSA, TextFeatures, VideoFeatures
from .search.proxy import Summary
from .search.query import Query, QueryError, parse_query
from .search.rerank import pair_scores
from .search.store import FrameStore
from .search.types import Candidates, EncodedQueries, FirstStage, RerankHook

__all__ = ["FORMAT", "Hit", "SearchMode", "VideoIndex", "fingerprint_mismatch", "list_videos",
           "model_fingerprint"]

log = logging.getLogger(__name__)

FORMAT = "dicosa-video-index"
VERSION = 3  # written only for a frame protocol other than segments/black (else 2)
READABLE = (1, 2, 3)
MANIFEST = "manifest.json"
SUMMARY_HEAD = "summary_head.pt"  # the "distilled" summary's head (dicosa/heads/summary.py)
DEFAULT_BACKEND = "local"  # faiss HNSW, in the index folder
DEFAULT_CANDIDATES = 1000
# Indexes decoded with this before their manifest recorded the frame protocol (``frames``).
_UNRECORDED_FRAMES = FrameProtocol("segments", "black")
_PAIRS_PER_CHUNK = 2048  # rerank pairs per forward: [chunk, N, D] float32 stays ~50 MB


def list_videos(videos: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Absolute paths of the videos to index.

    A folder is searched recursively for video files (the extensions of
    :data:`dicosa.data.datasets.VIDEO_EXTENSIONS`, hidden files skipped), in sorted order; a
    file or a list of files is taken as given.
    """
    from .data.datasets import VIDEO_EXTENSIONS

    if isinstance(videos, (str, os.PathLike)):
        root = Path(videos)
        if root.is_dir():
            found = [p for p in root.rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS
                     and not p.name.startswith(".") and p.is_file()]
            return sorted(str(p.resolve()) for p in found)
        videos = [root]
    return [str(Path(p).resolve()) for p in videos]


class _VideoFiles(Dataset):
    """Decodes one file per item; a failure becomes an item with an ``error`` instead."""

    def __init__(self, paths: Sequence[str], num_frames: int, image_size: int,
                 frames: FrameProtocol, titles: dict[str, str] | None = None):
        self.paths = list(paths)
        self.titles = titles or {}
        self.num_frames = num_frames
        self.image_size = image_size
        self.frames = frames

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        from .data.video import load_video_partial, video_info

        path = self.paths[i]
        try:
            # A damaged stretch costs its frames, not the video: the rest is indexed and the
            # row flagged with the fraction lost (fused search weighs its video view by it).
            frames, mask, lost = load_video_partial(
                path, self.num_frames, self.image_size, pad_colour=self.frames.pad_colour,
                sampling=self.frames.sampling)
            info = video_info(path)
        except Exception as exc:  # any unreadable file is skipped, never fatal
            reason = getattr(exc, "reason", None) or str(exc)
            title = self.titles.get(path, "")
            if not title:
                return {"path": path, "error": reason}
            # Undecodable but titled: indexed from its title alone (no frame in the mask).
            size = (self.num_frames, 3, self.image_size, self.image_size)
            return {"path": path, "frames": torch.zeros(size, dtype=torch.uint8),
                    "frame_mask": torch.zeros(self.num_frames, dtype=torch.bool),
                    "text_only": reason,
                    "row": {"path": path, "valid_frames": 0, "title": title,
                            "text_only": True, "frames_lost": 1.0}}
        return {"path": path, "frames": frames, "frame_mask": mask,
                "row": {"path": path, "duration": info["duration"], "fps": info["fps"],
                        "num_frames": info["num_frames"], "valid_frames": int(mask.sum()),
                        "title": self.titles.get(path, ""), "text_only": False,
                        "frames_lost": lost}}


def _collate(items: list[dict]) -> dict:
    good = [it for it in items if "error" not in it]
    out = {"bad": [(it["path"], it["error"]) for it in items if "error" in it],
           "text_only": [(it["path"], it["text_only"]) for it in good if "text_only" in it],
           "rows": [it["row"] for it in good]}
    if good:
        out["frames"] = torch.stack([it["frames"] for it in good])
        out["frame_mask"] = torch.stack([it["frame_mask"] for it in good])
    return out


@dataclass(frozen=True)
class Hit:
    """One search result."""

    path: str
    score: float  # the ranking score: DiCoSA's S after the rerank hooks (= dicosa without hooks)
    dicosa: float  # DiCoSA's S (Eq. 9) of the query and this video
    stage: str  # what proposed it: a first stage ("dense", "lexical", "bow", "dense+lexical"),
    #             "all" (every row reranked, candidates >= len(index)) or "exhaustive"
    #             (candidates=None)
    stage_score: float | None  # the first listed stage's own score; None for "all"/"exhaustive"
    id: int  # the store row id
    # every proposing stage's own score, e.g. {"dense": 0.31, "lexical": 2.7} for
    # "dense+lexical" (their scales differ); None for "all"/"exhaustive"
    stage_scores: dict[str, float] | None = field(default=None, hash=False)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SearchMode:
    """A named choice of first stages for :meth:`VideoIndex.search` (``mode=``).

    A search in this mode unites the candidates of the registered stages named in ``stages``
    and of every stage that no mode names (a fusion stage that finds text-only rows stays on
    in every mode). The query encoders read the mode's name in ``EncodedQueries.extra["mode"]``
    (a lexical head encodes its query as bag of words in ``"bow"``, with the network otherwise).
    """

    stages: tuple[str, ...]  # FirstStage.name of the stages this mode searches
    help: str = ""


@dataclass
class _Pending:
    video: VideoFeatures  # float16 frames on the CPU
    rows: list[dict]


@dataclass
class _Registered:
    stage: FirstStage
    # What ``stage.add`` takes for new rows, from their ids and features (None: the proxies).
    videos: Callable[[np.ndarray, VideoFeatures], object] | None = None
    dense: bool = False  # the index's own dense stage: vectors and queries through the summary


class VideoIndex:
    """Per-frame features of a video collection, searched in two stages (see the module doc).

    Build with :meth:`build`, reopen with :meth:`load`. ``index.skipped`` lists the files that
    could not be decoded, as ``(path, reason)``. Extension points for heads:

    - :attr:`hooks`: :class:`~dicosa.search.types.RerankHook` objects applied in order to the
      DiCoSA scores of the candidates (empty by default);
    - :attr:`query_encoders`: callables ``(EncodedQueries) -> None`` that fill
      ``EncodedQueries.extra`` once per batch of queries, before any stage runs;
    - :meth:`add_first_stage`: another first stage (e.g. sparse lexical); candidate lists
      of all stages are united, and :meth:`add`/:meth:`remove` keep every stage in step;
    - :attr:`modes`: named choices of first stages for ``search(mode=...)`` (``"dense"``
      by default; a head that adds a stage adds its modes).

    ``backend=None`` keeps no dense first stage: the per-process parts of a multi-process
    build (:mod:`dicosa.parallel_index`), whose merge builds the stage once over every row.

    ``frame_sampling`` and ``frame_padding`` (default ``segments``/``black``) are how
    :meth:`add` decodes videos: the ``data.frame_sampling``/``data.frame_padding`` the model
    was trained and evaluated with. They are recorded in the manifest (:attr:`frames`).
    """

    def __init__(self, model: DiCoSA | None, *, tokenizer: Callable | None = None,
                 device: torch.device | str | None = None,
                 backend: str | None = DEFAULT_BACKEND,
                 uri: str | None = None, stage_options: dict | None = None,
                 summary: str = "confidence", summary_head=None,
                 frame_sampling: str | None = None, frame_padding: str | None = None):
        self.model = model
        self.frames = FrameProtocol().override(frame_sampling, frame_padding)
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else None
        self.directory: Path | None = None
        self.skipped: list[tuple[str, str]] = []
        self.text_only: list[tuple[str, str]] = []  # undecodable, indexed from the title
        self.meta: dict = {}
        self.store = FrameStore()
        self.hooks: list[RerankHook] = []
        self.query_encoders: list[Callable[[EncodedQueries], None]] = []
        self.modes: dict[str, SearchMode] = {
            "dense": SearchMode(("dense",), "the dense first stage only")}
        self.stage_spec = {"backend": backend, "uri": uri, "options": dict(stage_options or {}),
                           "summary": summary, "calibration": None, "dim": None}
        self._dense: FirstStage | None = None
        self._summary: Summary | None = None
        # "distilled": the trained head (or its file), kept in the index folder as SUMMARY_HEAD
        self._summary_head = summary_head
        self._extra: list[_Registered] = []
        self._synced: list[int] | None = None  # the store's [next_id, removed] at stage save
        self._fingerprint: dict | None = None
        self.model_key: str | None = None  # set by attach
        if model is not None:
            self.attach(model)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        model: DiCoSA,
        videos: str | os.PathLike | Iterable[str | os.PathLike],
        out_dir: str | os.PathLike | None = None,
        *,
        batch_size: int = 16,
        num_workers: int | None = None,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        shard_size: int = 256,
        device: torch.device | str | None = None,
        meta: dict | None = None,
        progress: bool = True,
        backend: str = DEFAULT_BACKEND,
        uri: str | None = None,
        stage_options: dict | None = None,
        summary: str = "confidence",
        summary_head=None,
        titles: dict[str, str] | str | os.PathLike | None = None,
        frame_sampling: str | None = None,
        frame_padding: str | None = None,
    ) -> VideoIndex:
        """Decode and encode ``videos`` (a folder, a file or a list of files).

        Args:
            model: the DiCoSA model whose features are stored (and used by :meth:`search`).
            out_dir: folder to write the index to, shard by shard as it is built; an index
                already there (same model) is resumed and its videos are not re-encoded.
                None keeps the index in memory until :meth:`save`.
            batch_size: videos per forward pass.
            num_workers: DataLoader decoding processes (default: up to 4, one per core).
            tokenizer: for :meth:`search`; default the model's CLIP tokenizer.
            shard_size: a shard is written once this many videos are encoded (so it holds
                up to ``shard_size + batch_size - 1``); an interrupt loses at most one
                unwritten shard, and Ctrl-C writes even that one.
            device: where to encode and search; default CUDA when present, else the
                model's device. The model is moved there.
            meta: free-form JSON-able facts stored in the manifest.
            backend, uri, stage_options: the dense first stage (``"local"`` = ``"faiss"``,
                HNSW by default, ``{"index": "ivfpq"}`` as an option; ``"exact"``;
                ``"milvus"`` with ``uri``, by default milvus-lite in the index folder); see
                ``dicosa/search/backends.py``. A resumed index keeps the one it was built with.
            summary: what the dense stage compares per video (``dicosa/search/proxy.py``):
                ``"confidence"`` (default), ``"mean"`` or ``"distilled"``.
            summary_head: for ``"distilled"``, the trained
                :class:`~dicosa.heads.summary.DistilledSummaryHead` or its file; it is copied
                into the index folder.
            titles: a title per video (dict path→title, or a CSV ``path,title`` / JSON
                sidecar, see :func:`dicosa.search.fusion.read_titles`); a titled video that
                cannot be decoded is indexed text-only (see :meth:`add`).
            frame_sampling, frame_padding: the frame protocol to decode with, as the model's
                ``data.frame_sampling``/``data.frame_padding`` (``python -m dicosa index``
                takes them from the checkpoint's config). None: a resumed index's recorded
                protocol, ``segments``/``black`` for a new one. A resumed index keeps its
                own; asking for another raises ValueError.
        """
        index = cls.create_or_resume(model, out_dir, tokenizer=tokenizer, device=device,
                                     backend=backend, uri=uri, stage_options=stage_options,
                                     summary=summary, summary_head=summary_head,
                                     frame_sampling=frame_sampling,
                                     frame_padding=frame_padding)
        index.meta.update(meta or {})
        index.add(videos, batch_size=batch_size, num_workers=num_workers,
                  shard_size=shard_size, progress=progress, titles=titles)
        if index.directory is not None:
            index._write_manifest()  # meta, even when there was nothing left to add
        return index

    @classmethod
    def create_or_resume(
        cls,
        model: DiCoSA,
        out_dir: str | os.PathLike | None,
        *,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        device: torch.device | str | None = None,
        backend: str | None = DEFAULT_BACKEND,
        uri: str | None = None,
        stage_options: dict | None = None,
        summary: str = "confidence",
        summary_head=None,
        frame_sampling: str | None = None,
        frame_padding: str | None = None,
    ) -> VideoIndex:
        """The index in ``out_dir`` (same model and frame protocol, else ValueError), or a new
        empty one whose manifest is written there at once (None: in memory); how
        :meth:`build` starts."""
        out = Path(out_dir) if out_dir is not None else None
        if out is not None and (out / MANIFEST).is_file():
            index = cls.load(out, model, tokenizer=tokenizer, device=device)
            index._check_frames(frame_sampling, frame_padding)
            log.info("resuming the index at %s (%d videos)", out, len(index))
            return index
        index = cls(model, tokenizer=tokenizer, device=device, backend=backend, uri=uri,
                    stage_options=stage_options, summary=summary, summary_head=summary_head,
                    frame_sampling=frame_sampling, frame_padding=frame_padding)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            index.directory = index.store.directory = out
            index._write_manifest()
        return index

    def _check_frames(self, sampling: str | None, padding: str | None) -> None:
        """Refuse to decode with another frame protocol than the index was built with: its
        rows would be features of differently picked frames (None keeps a field)."""
        asked = self.frames.override(sampling, padding)
        if asked != self.frames:
            raise ValueError(f"the index at {self.directory or 'this index'} decodes videos "
                             f"with frame {self.frames} (its manifest), not {asked}; build "
                             "a new index to decode with another frame protocol")

    def add(
        self,
        videos: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        batch_size: int = 16,
        num_workers: int | None = None,
        shard_size: int = 256,
        progress: bool = True,
        titles: dict[str, str] | str | os.PathLike | None = None,
        only_new: bool = True,
    ) -> int:
        """Encode and append the videos not yet indexed; returns how many were added.

        ``only_new=False`` encodes every listed video, indexed or not: for a caller that has
        decided itself what is new (each process of a multi-process build,
        :mod:`dicosa.parallel_index`).

        Files that cannot be decoded are logged, counted in :attr:`skipped` and left out,
        unless ``titles`` gives them a title: then they are indexed text-only (metadata
        ``text_only`` True, no frame in the mask; logged and counted in :attr:`text_only`),
        for fused search (:func:`dicosa.search.fusion.attach_fusion`) to find.
        Each full shard goes into the store and every first stage at once; with a
        :attr:`directory` it is written (and the manifest updated) as soon as it is encoded.
        Videos are decoded with the index's frame protocol (:attr:`frames`).
        """
        from .search.fusion import normalise_titles

        model = self._require_model()
        indexed = set(self.paths) if only_new else set()
        todo = list(dict.fromkeys(p for p in list_videos(videos) if p not in indexed))
        if not todo:
            return 0
        if num_workers is None:
            num_workers = min(4, os.cpu_count() or 1)
        loader = DataLoader(
            _VideoFiles(todo, model.config.num_frames, model.image_size, self.frames,
                        normalise_titles(titles)),
            batch_size=batch_size, num_workers=num_workers, collate_fn=_collate,
        )
        retried = set(todo)
        self.skipped = [(p, r) for p, r in self.skipped if p not in retried]
        pending: list[_Pending] = []
        added = bad = 0
        bar = tqdm(total=len(todo), desc="indexing videos", unit="video", disable=not progress)
        try:
            with bar:
                for batch in loader:
                    for path, reason in batch["bad"]:
                        log.warning("skipping %s: %s", path, reason)
                        self.skipped.append((path, reason))
                    bad += len(batch["bad"])
                    for path, reason in batch["text_only"]:
                        log.warning("indexing %s from its title alone: %s", path, reason)
                        self.text_only.append((path, reason))
                    for row in batch["rows"]:
                        if 0 < row["frames_lost"] < 1:
                            log.warning("%s: %.0f%% of the sampled frames did not decode; "
                                        "indexed from the rest (metadata frames_lost)",
                                        row["path"], 100 * row["frames_lost"])
                    if batch["rows"]:
                        pending.append(self._encode(batch))
                        added += len(batch["rows"])
                    if sum(len(p.rows) for p in pending) >= shard_size:
                        self._append(pending)
                        pending = []
                    bar.update(len(batch["rows"]) + len(batch["bad"]))
                    bar.set_postfix(skipped=bad)
        finally:
            # Keep what was encoded even when interrupted: it is already paid for.
            if pending:
                self._append(pending)
            if self.directory is not None:
                self._save_stages()
                self._write_manifest()  # records the skipped files even when none was added
        if bad:
            log.warning("skipped %d of %d video files that could not be decoded (see "
                        "index.skipped)", bad, len(todo))
        return added

    @torch.inference_mode()
    def _encode(self, batch: dict) -> _Pending:
        model = self._require_model()
        frames = batch["frames"].to(self.device, non_blocking=True)
        mask = batch["frame_mask"].to(self.device)
        # A text-only row has no frame to encode: it stores zeros and an empty mask.
        seen = mask.any(dim=1)
        out = torch.zeros(*mask.shape, model.embed_dim, device=self.device)
        if seen.any():
            out[seen] = model.encode_video(frames[seen], mask[seen]).frames.float()
        video = VideoFeatures(out, mask)
        return _Pending(VideoFeatures(video.frames.to("cpu", torch.float16),
                                      video.frame_mask.cpu()), batch["rows"])

    def _append(self, parts: list[_Pending]) -> None:
        video = VideoFeatures(torch.cat([p.video.frames for p in parts]),
                              torch.cat([p.video.frame_mask for p in parts]))
        self.add_features(video, [row for p in parts for row in p.rows])

    def add_features(self, video: VideoFeatures, rows: list[dict]) -> np.ndarray:
        """Append already encoded videos (float16 ``[n, N, D]`` frames and their metadata rows,
        at least ``path``) as one shard, into the store and every first stage; returns their
        row ids. What :meth:`add` does per shard, and what benchmarks use to skip decoding."""
        ids = self._extend(lambda: self.store.append(video, rows))
        if self.directory is not None:
            self._write_manifest()
        return ids

    def link_shard(self, name: str, count: int) -> np.ndarray:
        """Append a shard file already in the index folder (``name`` relative to it, holding
        ``count`` videos) as new rows of the store and every first stage, without copying
        it; returns their ids. The manifest is written by the caller (:meth:`save`): the
        merge of a multi-process build links many shards, then writes it once."""
        return self._extend(lambda: self.store.link(name, count))

    def _extend(self, append: Callable[[], np.ndarray]) -> np.ndarray:
        """Run ``append`` (new store rows -> their ids), then give the rows to every stage."""
        existing = self._stages()  # before: a stage made afterwards is filled from the store
        ids = append()
        for registered in existing:
            drop_from = getattr(registered.stage, "drop_from", None)
            if drop_from is not None and len(ids):  # rows an interrupted add left on a server
                drop_from(int(ids.min()))
            registered.stage.add(ids, self._stage_input(registered, ids))
        self._dense_stage()  # made now, from the store, if the width was unknown until now
        return ids

    def remove(self, videos: str | Iterable[str] | np.ndarray | Sequence[int]) -> int:
        """Remove videos (paths, or store row ids) from the store and every first stage;
        returns how many were live. Their ids are never reused."""
        items = [videos] if isinstance(videos, str) else list(np.asarray(videos).reshape(-1)
                                                              if isinstance(videos, np.ndarray)
                                                              else videos)
        if items and isinstance(items[0], (str, os.PathLike)):
            table = self.store.metadata()
            wanted = {str(Path(p).resolve()) for p in items} | {str(p) for p in items}
            ids = table.index[table["path"].isin(wanted)].to_numpy(np.int64)
        else:
            ids = np.asarray(items, dtype=np.int64)
        ids = self.store.remove(ids)
        if len(ids):
            for registered in self._stages():
                registered.stage.remove(ids)
            if self.directory is not None:
                self._save_stages()
                self._write_manifest()
        return len(ids)

    # -- first stages ---------------------------------------------------------------------
    @property
    def stages(self) -> list[FirstStage]:
        """The first stages, the dense one first."""
        return [r.stage for r in self._stages()]

    def remember(self, key: str, value: dict) -> None:
        """Keep ``value`` as ``meta[key]`` (a head and settings that ``python -m dicosa search``
        reattaches), writing the manifest of an index in a folder only when it changes: a
        search that reattaches what the index recorded writes nothing."""
        if self.meta.get(key) == value:
            return
        self.meta[key] = value
        if self.directory is not None:
            self._write_manifest()

    def add_first_stage(self, stage: FirstStage,
                        videos: Callable[[np.ndarray, VideoFeatures], object] | None = None,
                        *, indexed: np.ndarray | None = None) -> None:
        """Register another first stage; every live row is added to it now.

        ``indexed``: the row ids ``stage`` already holds (a stage reopened from its files);
        only the other live rows are added, and held rows removed since are removed from it.

        ``videos(ids, features)`` computes what ``stage.add`` takes for rows ``ids`` from their
        stored features (float16 ``[n, N, D]``); None gives it the dense proxies ``[n, D]``.
        The caller reopens and re-registers such a stage after :meth:`load` (the manifest
        records only the dense stage); :meth:`add`, :meth:`remove` and :meth:`save` keep it in
        step with the store.
        """
        registered = _Registered(stage, videos)
        held = np.asarray([] if indexed is None else indexed, dtype=np.int64)
        gone = held[~self.store.is_live(held)]
        if len(gone):
            stage.remove(gone)
        for ids in self._live_by_shard():
            ids = ids[~np.isin(ids, held)]
            if len(ids):
                stage.add(ids, self._stage_input(registered, ids))
        self._extra.append(registered)

    def _stages(self) -> list[_Registered]:
        dense = self._dense_stage()
        return ([_Registered(dense, dense=True)] if dense is not None else []) + self._extra

    def _dense_summary(self) -> Summary:
        if self._summary is None:
            model = self._require_model()
            head = None
            if self.stage_spec["summary"] == "distilled":
                head = self._summary_head
                if head is None and self.directory is not None and (
                        self.directory / SUMMARY_HEAD).is_file():
                    head = self.directory / SUMMARY_HEAD
                if isinstance(head, (str, os.PathLike)):
                    from .heads.base import load_head

                    head = load_head(head, model, kind="summary")
                if head is not None:
                    head = head.to(self.device).eval()
                self._summary_head = head
                self._save_summary_head()
            self._summary = Summary(model, self.stage_spec["summary"],
                                    self.stage_spec.get("calibration"), head=head)
        return self._summary

    def _save_summary_head(self) -> None:
        """Keep the distilled summary's head in the index folder (atomic, fingerprinted)."""
        head = self._summary_head
        if (self.directory is None or head is None or isinstance(head, (str, os.PathLike))
                or self.model is None):
            return
        path = self.directory / SUMMARY_HEAD
        if not path.is_file():
            from .heads.base import save_head

            save_head(head, path, self.model, getattr(head, "trained", None))

    def _summary_vectors(self, ids: np.ndarray, proxies: np.ndarray | None = None
                         ) -> np.ndarray:
        """The dense stage's vectors of rows ``ids`` (from their frames for "distilled")."""
        summary = self._dense_summary()
        if summary.needs_frames:
            return np.concatenate([summary.videos(self.store.gather(ids[i:i + 8192]))
                                   for i in range(0, len(ids), 8192)]
                                  or [np.zeros((0, summary.dim), np.float32)])
        return summary.videos(self.store.proxies(ids) if proxies is None else proxies)

    def _dense_stage(self) -> FirstStage | None:
        """The dense stage, made (and filled from the store) once the store holds videos to
        calibrate its summary on and a model is attached."""
        if self._dense is None:
            if self.model is None or not len(self.store) or self.stage_spec["backend"] is None:
                return None
            summary = self._dense_summary()
            summary.calibrate(next(self.store.iter_proxies())[1])
            self.stage_spec.update(calibration=summary.calibration, dim=summary.dim)
            spec = {**self.stage_spec, "options": {"normalize": summary.normalize,
                                                   **self.stage_spec["options"]}}
            self._dense = _make_stage(spec, self.directory, summary.dim)
            for ids, proxies in self.store.iter_proxies():
                self._dense.add(ids, self._summary_vectors(ids, proxies))
        return self._dense

    def _stage_input(self, registered: _Registered, ids: np.ndarray) -> object:
        if registered.dense:
            return self._summary_vectors(ids)
        if registered.videos is None:
            return self.store.proxies(ids)
        return registered.videos(ids, self.store.gather(ids))

    def _live_by_shard(self):
        for ids, _ in self.store.iter_proxies():
            yield ids

    def _save_stages(self) -> None:
        assert self.directory is not None
        for registered in self._stages():
            registered.stage.save(self.directory)
        if self._dense is not None:  # else the stage stays stale and is rebuilt when opened
            self._synced = [self.store.next_id, len(self.store.removed)]

    # -- persistence ----------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the whole index to ``directory``, which becomes where later :meth:`add`
        calls write their shards."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.store.save(directory)
        self.directory = directory
        self._save_summary_head()
        self._save_stages()
        self._write_manifest()
        return directory

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        model: DiCoSA | None = None,
        *,
        strict: bool = True,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        device: torch.device | str | None = None,
    ) -> VideoIndex:
        """Open an index written by :meth:`build` or :meth:`save` (format version 1-3).

        The store is memory-mapped; the dense first stage is opened from its files, or
        rebuilt from the stored proxies when it lags the store (an interrupted build) or the
        index predates first stages (version 1).

        Args:
            model: the model to search with; it must have the weights and config the index
                was built with. None opens the index for reading only (no search).
            strict: a model that differs raises ValueError (True) or warns (False).

        Raises:
            FileNotFoundError: no manifest in ``directory``.
            ValueError: not a dicosa index, a damaged one, or (strict) built with another model.
        """
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{directory} is not a video index (no {MANIFEST})")
        try:
            manifest = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path} is damaged; rebuild the index with 'python -m dicosa "
                             "index'") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} manifest")
        if manifest.get("version") not in READABLE:
            raise ValueError(f"{path}: index format version {manifest.get('version')} is not "
                             f"supported (this dicosa reads versions 1 to {VERSION}); "
                             "rebuild the index with 'python -m dicosa index'")
        spec = manifest.get("first_stage") or {"backend": DEFAULT_BACKEND}
        frames = manifest.get("frames") or _UNRECORDED_FRAMES.as_dict()
        index = cls(None, tokenizer=tokenizer, device=device, backend=spec["backend"],
                    uri=spec.get("uri"), stage_options=spec.get("options"),
                    summary=spec.get("summary", "confidence"),
                    frame_sampling=frames["sampling"], frame_padding=frames["padding"])
        index.stage_spec.update(calibration=spec.get("calibration"), dim=spec.get("dim"))
        index.directory = directory
        index._fingerprint = manifest["fingerprint"]
        index.meta = manifest.get("meta", {})
        index.skipped = [(s["path"], s["reason"]) for s in manifest.get("skipped", [])]
        index.store = FrameStore.open(directory, manifest)
        if index.store.dim is not None and spec.get("synced") == [index.store.next_id,
                                                                  len(index.store.removed)]:
            index._dense = _open_stage(spec, directory)
            index._synced = spec["synced"]
        if model is not None:
            index.attach(model, strict=strict)
        return index

    def _write_manifest(self) -> None:
        assert self.directory is not None
        store = self.store.manifest()
        if store["num_frames"] is None:
            store["num_frames"] = (self._fingerprint or {}).get("config", {}).get("num_frames")
            store["dim"] = self.model.embed_dim if self.model is not None else None
        write_text_atomic(self.directory / MANIFEST, json.dumps({
            "format": FORMAT,
            # 2 where the format is unchanged: older dicosa versions read it as before.
            "version": 2 if self.frames == _UNRECORDED_FRAMES else VERSION,
            "fingerprint": self._fingerprint,
            "num_videos": len(self),
            **store,
            "first_stage": {**self.stage_spec, "synced": self._synced},
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "frames": self.frames.as_dict(),
            "meta": self.meta,
        }, indent=1))

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
        if self.tokenizer is None:
            from .clip import get_tokenizer

            self.tokenizer = get_tokenizer(model.config.arch, model.config.max_words)

    def _require_model(self) -> DiCoSA:
        if self.model is None:
            raise RuntimeError("this index was loaded without a model; pass "
                               "VideoIndex.load(directory, model) to encode or search")
        return self.model

    # -- contents -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.store)

    @property
    def ids(self) -> np.ndarray:
        """Row ids of the indexed (live) videos, ascending."""
        return self.store.live()

    @property
    def paths(self) -> list[str]:
        return self.store.paths(self.store.live())

    @property
    def metadata(self) -> pd.DataFrame:
        """One row per indexed video (index: row id): the columns of
        :data:`dicosa.search.store.COLUMNS`."""
        return self.store.metadata()

    @property
    def features(self) -> VideoFeatures:
        """Every live row's features, float16 ``frames [V, N, D]`` and ``frame_mask [V, N]``,
        read into memory: for small indexes and tests; search reads only candidates."""
        if not len(self):
            raise ValueError("the index is empty")
        return self.store.gather(self.store.live())

    # -- search ---------------------------------------------------------------------------
    def encode_queries(self, texts: Sequence[str], exclude: Sequence[str] = (),
                       mode: str | None = None) -> EncodedQueries:
        """Parse the queries ("A without B"; ``exclude`` adds exclusions to every query),
        encode their positive text, run the :attr:`query_encoders` (which read ``mode``, the
        search mode, in ``extra["mode"]``; None: every stage is searched)."""
        model = self._require_model()
        self._check_mode(mode)
        queries = [parse_query(t, exclude) for t in texts]
        with torch.inference_mode():
            text = model.encode_text(self.tokenizer([q.text for q in queries]).to(self.device))
        encoded = EncodedQueries(queries, text, {"mode": mode})
        for encoder in self.query_encoders:
            encoder(encoded)
        return encoded

    @torch.inference_mode()
    def scores(self, texts: str | Sequence[str], chunk: int = 1024) -> Tensor:
        """DiCoSA scores S (:meth:`DiCoSA.score`) of every text against every indexed video,
        in :attr:`ids` order: ``[T, V]`` float32. The texts are encoded as given (no query
        parsing). Videos are read ``chunk`` at a time, so memory stays bounded by the chunk."""
        model = self._require_model()
        texts = [texts] if isinstance(texts, str) else list(texts)
        text = model.encode_text(self.tokenizer(texts).to(self.device))
        return self._exhaustive(text, self.store.live(), chunk)

    def _exhaustive(self, text: TextFeatures, ids: np.ndarray, chunk: int) -> Tensor:
        model = self._require_model()
        dtype = next(model.parameters()).dtype
        out = [torch.zeros(len(text), 0)]
        for start in range(0, len(ids), chunk):
            video = self.store.gather(ids[start:start + chunk]).to(self.device, dtype)
            out.append(model.score(text, video).float().cpu())
        return torch.cat(out, dim=1)

    def search(self, text: str | Sequence[str], k: int = 10,
               candidates: int | None = DEFAULT_CANDIDATES, *,
               hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
               exclude: Sequence[str] = (), mode: str | None = None
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
                does (needs an exclusion hook: :func:`dicosa.search.exclusion_index.
                attach_exclusion`).
            mode: a key of :attr:`modes`: which first stages propose candidates (``"dense"``;
                with a lexical head ``"lexical"`` (the head's query), ``"bow"`` (the query's
                own words, no network) or ``"hybrid"`` (dense and lexical united)). None: every
                registered stage. A lexical or bow search reranks only the rows that share a
                word with the query, even when ``candidates`` covers the whole index.
        """
        return self.search_with_stats(text, k, candidates, hooks=hooks, chunk=chunk,
                                      exclude=exclude, mode=mode)[0]

    @torch.inference_mode()
    def search_with_stats(self, text: str | Sequence[str], k: int = 10,
                          candidates: int | None = DEFAULT_CANDIDATES, *,
                          hooks: Sequence[RerankHook] | None = None, chunk: int = 1024,
                          exclude: Sequence[str] = (), mode: str | None = None
                          ) -> tuple[list[Hit] | list[list[Hit]], dict]:
        """:meth:`search` and what it did: seconds per stage and candidates kept per query."""
        _check_search(text, k, candidates)
        self._check_mode(mode)
        texts = [text] if isinstance(text, str) else list(text)
        clock = _Clock()
        encoded = self.encode_queries(texts, exclude, mode)
        _warn_unhandled_exclusions(encoded.queries, hooks if hooks is not None else self.hooks)
        clock.lap("encode_s")
        if candidates is not None:
            candidates = max(candidates, k)  # fewer than k could not fill the answer
        ids, stage, stage_scores, by_stage = self._candidates(encoded, candidates, mode)
        clock.lap("first_stage_s")
        if isinstance(stage, str) and stage == "exhaustive":
            scores = self._exhaustive(encoded.text, ids[0], chunk).expand(len(texts), -1)
        else:
            scores = self._rerank(encoded, ids)
        clock.lap("rerank_s")
        scores = self._without_text_only(ids, scores)
        dicosa = scores.clone()
        for hook in hooks if hooks is not None else self.hooks:
            scores = hook(encoded, ids, scores)
        clock.lap("hooks_s")
        results = self._top(scores, dicosa, ids, (stage, stage_scores, by_stage), k)
        clock.lap("top_s")
        stats = {**clock.times, "stage": stage if isinstance(stage, str) else "first stage",
                 "mode": mode, "candidates": [int((row >= 0).sum()) for row in ids]}
        return (results[0] if isinstance(text, str) else results), stats

    def _check_mode(self, mode: str | None) -> None:
        if mode is not None and mode not in self.modes:
            raise QueryError(f"this index has no '{mode}' search mode (it has "
                             f"{', '.join(self.modes)}); lexical, bow and hybrid need a lexical "
                             "head: attach_lexical(index, HEAD), or 'python -m dicosa index' "
                             "with --head HEAD.pt")

    def _searched(self, mode: str | None) -> list[_Registered]:
        """The stages a search in ``mode`` unites (see :class:`SearchMode`)."""
        stages = self._stages()
        if mode is None:
            return stages
        named = {name for m in self.modes.values() for name in m.stages}
        wanted = set(self.modes[mode].stages)
        return [r for r in stages if r.stage.name in wanted or r.stage.name not in named]

    def _candidates(self, encoded: EncodedQueries, candidates: int | None, mode: str | None):
        """``(ids [Q, C] int64 with -1 pads, stage: str or [Q, C] labels, the first listed
        stage's scores [Q, C], and {stage: score} per candidate [Q, C] where several stages
        searched)`` (the last three None or a label for every row reranked)."""
        stages = self._searched(mode)
        # Reranking every row is what the dense stage would propose anyway once C covers the
        # index; a sparse stage alone proposes only rows sharing a word, so it still runs.
        covered = candidates is not None and candidates >= len(self.store) and (
            any(r.dense for r in stages))
        if candidates is None or covered or not stages:
            label = "exhaustive" if candidates is None else "all"
            live = self.store.live()  # not per two-stage query: 3.5 ms at 1M rows
            return np.broadcast_to(live, (len(encoded), len(live))), label, None, None
        dense = (EncodedQueries(encoded.queries, TextFeatures(self._dense_summary().queries(
            encoded.text.text)), encoded.extra) if any(r.dense for r in stages) else None)
        found = [r.stage.search(dense if r.dense else encoded, candidates) for r in stages]
        if len(found) == 1:
            ids = found[0].ids.copy()
            ids[~self.store.is_live(ids)] = -1  # a stage that lags never returns a removed row
            return ids, found[0].stage, found[0].scores, None
        return _union(found, self.store)

    def _without_text_only(self, ids: np.ndarray, scores: Tensor) -> Tensor:
        """DiCoSA cannot score a row without frames: -inf there (a fusion hook imputes it)."""
        flat = np.unique(ids[ids >= 0])
        if not len(flat):
            return scores
        # A text-only row is stored with no valid frame. The frame mask answers from the
        # memory map; the metadata's text_only column took pandas 20-60 ms per query at 1M.
        flags = ~self.store.has_frames(flat)
        if not flags.any():
            return scores
        blank = np.isin(ids, flat[flags])
        return scores.masked_fill(torch.from_numpy(blank), float("-inf"))

    @torch.inference_mode()
    def _rerank(self, encoded: EncodedQueries, ids: np.ndarray) -> Tensor:
        """DiCoSA S of each query with its candidates: ``[Q, C]`` float32, -inf at pads."""
        model = self._require_model()
        dtype = next(model.parameters()).dtype
        query, column = np.nonzero(ids >= 0)
        out = torch.full(ids.shape, float("-inf"))
        text = encoded.text.text.to(self.device, dtype)
        for start in range(0, len(query), _PAIRS_PER_CHUNK):
            q, c = query[start:start + _PAIRS_PER_CHUNK], column[start:start + _PAIRS_PER_CHUNK]
            video = self.store.gather(ids[q, c]).to(self.device, dtype)
            pairs = TextFeatures(text[torch.from_numpy(q).to(self.device)])
            out[q, c] = pair_scores(model, pairs, video).cpu()
        return out

    def _top(self, scores: Tensor, dicosa: Tensor, ids: np.ndarray, proposed: tuple,
             k: int) -> list[list[Hit]]:
        """The k best hits per query; ``proposed``: :meth:`_candidates`' stage labels, first
        stage scores and per-stage scores."""
        stage, stage_scores, by_stage = proposed
        top = scores.topk(min(k, scores.shape[1]), dim=1)
        picked = []
        for q, (cols, vals) in enumerate(zip(top.indices.tolist(), top.values.tolist(),
                                             strict=True)):
            picked.append([(c, v) for c, v in zip(cols, vals, strict=True)
                           if v != float("-inf") and ids[q, c] >= 0])
        hit_ids = np.array([ids[q, c] for q, row in enumerate(picked) for c, _ in row],
                           dtype=np.int64)
        paths = iter(self.store.paths(hit_ids))
        results = []
        for q, row in enumerate(picked):
            hits = []
            for c, v in row:
                label = stage if isinstance(stage, str) else str(stage[q, c])
                first = None if stage_scores is None else float(stage_scores[q, c])
                parts = (by_stage[q, c] if by_stage is not None
                         else None if first is None else {label: first})
                hits.append(Hit(path=next(paths), score=v, dicosa=float(dicosa[q, c]),
                                id=int(ids[q, c]), stage=label, stage_score=first,
                                stage_scores=parts))
            results.append(hits)
        return results


def _union(found: list[Candidates], store: FrameStore):
    """United candidate lists of several stages: ids [Q, C], labels ("dense+lexical"), the
    first listed stage's score of each row and every proposing stage's ({stage: score})."""
    rows = []
    for q in range(len(found[0].ids)):
        merged: dict[int, dict[str, float]] = {}  # row id -> {stage: its score}, in order
        for cand in found:
            for i, s in zip(cand.ids[q].tolist(), cand.scores[q].tolist(), strict=True):
                if i >= 0:
                    merged.setdefault(i, {})[cand.stage] = s
        rows.append(merged)
    width = max(1, max(len(r) for r in rows))
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    labels = np.full((len(rows), width), "", dtype=object)
    scores = np.full((len(rows), width), -np.inf, dtype=np.float32)
    by_stage = np.full((len(rows), width), None, dtype=object)
    for q, merged in enumerate(rows):
        for c, (i, parts) in enumerate(merged.items()):
            ids[q, c], labels[q, c], by_stage[q, c] = i, "+".join(parts), parts
            scores[q, c] = next(iter(parts.values()))
    ids[~store.is_live(ids)] = -1
    return ids, labels, scores, by_stage


class _Clock:
    def __init__(self):
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = now - self._last
        self._last = now


def _warn_unhandled_exclusions(queries: list[Query], hooks: Sequence[RerankHook]) -> None:
    if not hooks and any(q.exclude for q in queries):
        log.warning("the query's exclusions (%s) are ignored: no exclusion hook is attached "
                    "to this index", ", ".join(e for q in queries for e in q.exclude))


def _check_search(text: str | Sequence[str], k: int, candidates: int | None) -> None:
    """Refuse what has no meaningful answer instead of ranking it anyway."""
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise QueryError("no query was given")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise QueryError(f"a query must be non-empty text, got {t!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise QueryError(f"k must be a positive number of results, got {k!r}")
    if candidates is not None and (isinstance(candidates, bool)
                                   or not isinstance(candidates, int) or candidates < 1):
        raise QueryError(f"candidates must be a positive number of rows to rerank (or None "
                         f"for exhaustive search), got {candidates!r}")


# -- first-stage backends -------------------------------------------------------------------
def _make_stage(spec: dict, directory: Path | None, dim: int) -> FirstStage:
    """A new, empty dense first stage as ``spec`` ({backend, uri, options}) describes
    (``dicosa/search/backends.py``; ``directory`` None: an in-memory index, saved later)."""
    from .search.backends import make_first_stage

    return make_first_stage(spec["backend"], directory=directory or Path("."), dim=dim,
                            uri=spec.get("uri"), **spec.get("options", {}))


def _open_stage(spec: dict, directory: Path) -> FirstStage:
    from .search.backends import open_first_stage

    return open_first_stage(directory, uri=spec.get("uri"))
