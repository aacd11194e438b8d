"""A searchable on-disk index of video features for one DiCoSA model.

:class:`VideoIndex` decodes and encodes a collection of videos once, stores their per-frame
features, and ranks them for any text with the full DiCoSA score (text-conditioned pooling,
concept factors and adaptive pooling; :meth:`DiCoSA.score`).

On-disk format (one folder)::

    manifest.json              what is in the index; rewritten atomically after each shard
    shard-00000.safetensors    "frames": float16 [n, N, D] per-frame features after the
                               temporal transformer; "frame_mask": bool [n, N]
    shard-00000.csv            one row per video of that shard, in the same order:
                               path, duration (s), fps, num_frames (in the file),
                               valid_frames (decoded frames, the rest is padding)
    shard-00001.safetensors ...

``manifest.json`` holds ``format`` (``"dicosa-video-index"``), ``version`` (1),
``fingerprint`` (``weights_sha256``: sha256 over the model's state-dict tensors, and
``config``: the model config fields that change features or scores), ``num_frames`` N,
``dim`` D, ``shards`` (``[{"name", "count"}]``, in order), ``num_videos``, ``skipped``
(``[{"path", "reason"}]``, files that could not be decoded) and ``meta`` (free-form, e.g. the
CLI records the checkpoint or config it used). Only shards listed in the manifest belong to
the index, so an interrupted write leaves at most an orphan file that the next shard
overwrites; a build into a folder that already holds an index resumes it.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from .checkpoint import write_bytes_atomic, write_text_atomic
from .fingerprint import fingerprint_mismatch, model_fingerprint
from .model import DiCoSA, VideoFeatures
from .search.query import QueryError

__all__ = ["FORMAT", "VideoIndex", "fingerprint_mismatch", "list_videos", "model_fingerprint"]

log = logging.getLogger(__name__)

FORMAT = "dicosa-video-index"
VERSION = 1
MANIFEST = "manifest.json"
_COLUMNS = ("path", "duration", "fps", "num_frames", "valid_frames")


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

    def __init__(self, paths: Sequence[str], num_frames: int, image_size: int):
        self.paths = list(paths)
        self.num_frames = num_frames
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        from .data.video import load_video, video_info

        path = self.paths[i]
        try:
            frames, mask = load_video(path, self.num_frames, self.image_size)
            info = video_info(path)
        except Exception as exc:  # any unreadable file is skipped, never fatal
            return {"path": path, "error": getattr(exc, "reason", None) or str(exc)}
        return {"path": path, "frames": frames, "frame_mask": mask,
                "row": {"path": path, "duration": info["duration"], "fps": info["fps"],
                        "num_frames": info["num_frames"], "valid_frames": int(mask.sum())}}


def _collate(items: list[dict]) -> dict:
    good = [it for it in items if "error" not in it]
    out = {"bad": [(it["path"], it["error"]) for it in items if "error" in it],
           "rows": [it["row"] for it in good]}
    if good:
        out["frames"] = torch.stack([it["frames"] for it in good])
        out["frame_mask"] = torch.stack([it["frame_mask"] for it in good])
    return out


@dataclass
class _Shard:
    frames: Tensor  # float16 [n, N, D]
    frame_mask: Tensor  # bool [n, N]
    rows: list[dict]
    name: str | None = None  # its file stem once written to the index folder


class VideoIndex:
    """Per-frame features of a video collection, searchable by text with the DiCoSA score.

    Build with :meth:`build`, reopen with :meth:`load`. ``index.skipped`` lists the files that
    could not be decoded, as ``(path, reason)``.
    """

    def __init__(self, model: DiCoSA | None, *, tokenizer: Callable | None = None,
                 device: torch.device | str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else None
        self.directory: Path | None = None
        self.skipped: list[tuple[str, str]] = []
        self.meta: dict = {}
        self._shards: list[_Shard] = []
        self._fingerprint: dict | None = None
        self._cache: tuple[Tensor, Tensor] | None = None
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
        """
        out = Path(out_dir) if out_dir is not None else None
        if out is not None and (out / MANIFEST).is_file():
            index = cls.load(out, model, tokenizer=tokenizer, device=device)
            log.info("resuming the index at %s (%d videos)", out, len(index))
        else:
            index = cls(model, tokenizer=tokenizer, device=device)
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                index.directory = out
                index._write_manifest()
        index.meta.update(meta or {})
        index.add(videos, batch_size=batch_size, num_workers=num_workers,
                  shard_size=shard_size, progress=progress)
        if index.directory is not None:
            index._write_manifest()  # meta, even when there was nothing left to add
        return index

    def add(
        self,
        videos: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        batch_size: int = 16,
        num_workers: int | None = None,
        shard_size: int = 256,
        progress: bool = True,
    ) -> int:
        """Encode and append the videos not yet indexed; returns how many were added.

        Files that cannot be decoded are logged, counted in :attr:`skipped` and left out.
        With a :attr:`directory`, each full shard is written (and the manifest updated)
        as soon as it is encoded.
        """
        model = self._require_model()
        indexed = set(self.paths)
        todo = list(dict.fromkeys(p for p in list_videos(videos) if p not in indexed))
        if not todo:
            return 0
        if num_workers is None:
            num_workers = min(4, os.cpu_count() or 1)
        loader = DataLoader(
            _VideoFiles(todo, model.config.num_frames, model.image_size),
            batch_size=batch_size, num_workers=num_workers, collate_fn=_collate,
        )
        retried = set(todo)
        self.skipped = [(p, r) for p, r in self.skipped if p not in retried]
        pending: list[_Shard] = []
        added = bad = 0
        bar = tqdm(total=len(todo), desc="indexing videos", unit="video", disable=not progress)
        try:
            with bar:
                for batch in loader:
                    for path, reason in batch["bad"]:
                        log.warning("skipping %s: %s", path, reason)
                        self.skipped.append((path, reason))
                    bad += len(batch["bad"])
                    if batch["rows"]:
                        pending.append(self._encode(batch))
                        added += len(batch["rows"])
                    if sum(len(s.rows) for s in pending) >= shard_size:
                        self._append(pending)
                        pending = []
                    bar.update(len(batch["rows"]) + len(batch["bad"]))
                    bar.set_postfix(skipped=bad)
        finally:
            # Keep what was encoded even when interrupted: it is already paid for.
            if pending:
                self._append(pending)
            if self.directory is not None:
                self._write_manifest()  # records the skipped files even when none was added
        if bad:
            log.warning("skipped %d of %d video files that could not be decoded (see "
                        "index.skipped)", bad, len(todo))
        return added

    @torch.inference_mode()
    def _encode(self, batch: dict) -> _Shard:
        model = self._require_model()
        frames = batch["frames"].to(self.device, non_blocking=True)
        mask = batch["frame_mask"].to(self.device)
        video = model.encode_video(frames, mask)
        return _Shard(video.frames.to("cpu", torch.float16), video.frame_mask.cpu(),
                      batch["rows"])

    def _append(self, parts: list[_Shard]) -> None:
        shard = _Shard(torch.cat([p.frames for p in parts]),
                       torch.cat([p.frame_mask for p in parts]),
                       [row for p in parts for row in p.rows])
        self._shards.append(shard)
        self._cache = None
        if self.directory is not None:
            self._write_shard(self.directory, shard, len(self._shards) - 1)
            self._write_manifest()

    # -- persistence ----------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the whole index to ``directory``, which becomes where later :meth:`add`
        calls write their shards."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        same = self.directory is not None and directory.resolve() == self.directory.resolve()
        for i, shard in enumerate(self._shards):
            if not (same and shard.name is not None):
                self._write_shard(directory, shard, i)
        self.directory = directory
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
        """Open an index written by :meth:`build` or :meth:`save`.

        Args:
            model: the model to search with; it must have the weights and config the index
                was built with. None opens the index for reading only (no search).
            strict: a model that differs raises ValueError (True) or warns (False).

        Raises:
            FileNotFoundError: no manifest in ``directory``.
            ValueError: not a dicosa index, or (strict) built with another model.
        """
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{directory} is not a video index (no {MANIFEST})")
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} manifest")
        if manifest.get("version") != VERSION:
            raise ValueError(f"{path}: index format version {manifest.get('version')} is not "
                             f"supported (this dicosa reads version {VERSION})")
        index = cls(None, tokenizer=tokenizer, device=device)
        index.directory = directory
        index._fingerprint = manifest["fingerprint"]
        index.meta = manifest.get("meta", {})
        index.skipped = [(s["path"], s["reason"]) for s in manifest.get("skipped", [])]
        for entry in manifest["shards"]:
            tensors = load_file(str(directory / f"{entry['name']}.safetensors"))
            # Only the numeric columns may hold NaN; a file may well be called "NA".
            rows = pd.read_csv(directory / f"{entry['name']}.csv", dtype={"path": str},
                               keep_default_na=False,
                               na_values={"duration": ["nan"], "fps": ["nan"]}).to_dict("records")
            if len(rows) != entry["count"] or tensors["frames"].shape[0] != entry["count"]:
                raise ValueError(f"{directory}: shard {entry['name']} does not hold the "
                                 f"{entry['count']} videos the manifest lists")
            index._shards.append(_Shard(tensors["frames"], tensors["frame_mask"].bool(), rows,
                                        entry["name"]))
        if model is not None:
            index.attach(model, strict=strict)
        return index

    def _write_shard(self, directory: Path, shard: _Shard, number: int) -> None:
        name = f"shard-{number:05d}"
        # Each file is written whole under a temporary name, then renamed.
        write_bytes_atomic(directory / f"{name}.safetensors", save_safetensors(
            {"frames": shard.frames.contiguous(), "frame_mask": shard.frame_mask.contiguous()}))
        write_text_atomic(directory / f"{name}.csv",
                          pd.DataFrame(shard.rows, columns=list(_COLUMNS)).to_csv(index=False))
        shard.name = name

    def _write_manifest(self) -> None:
        assert self.directory is not None
        frames = self._shards[0].frames if self._shards else None
        if frames is not None:
            num_frames, dim = frames.shape[1], frames.shape[2]
        else:
            num_frames = (self._fingerprint or {}).get("config", {}).get("num_frames")
            dim = self.model.embed_dim if self.model is not None else None
        write_text_atomic(self.directory / MANIFEST, json.dumps({
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self._fingerprint,
            "num_frames": num_frames,
            "dim": dim,
            "num_videos": len(self),
            "shards": [{"name": s.name, "count": len(s.rows)} for s in self._shards],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "meta": self.meta,
        }, indent=1))

    # -- model ----------------------------------------------------------------------------
    def attach(self, model: DiCoSA, strict: bool = True) -> None:
        """Use ``model`` to encode and search (moved to the index's device, in eval mode).

        Raises ValueError (``strict``) or warns when the index was built with another model.
        """
        fingerprint = model_fingerprint(model)
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
        return sum(len(s.rows) for s in self._shards)

    @property
    def paths(self) -> list[str]:
        return [row["path"] for s in self._shards for row in s.rows]

    @property
    def metadata(self) -> pd.DataFrame:
        """One row per indexed video: path, duration, fps, num_frames, valid_frames."""
        return pd.DataFrame([row for s in self._shards for row in s.rows], columns=list(_COLUMNS))

    @property
    def features(self) -> VideoFeatures:
        """All stored features: float16 ``frames [V, N, D]`` and ``frame_mask [V, N]``."""
        if self._cache is None:
            if not self._shards:
                raise ValueError("the index is empty")
            self._cache = (torch.cat([s.frames for s in self._shards]),
                           torch.cat([s.frame_mask for s in self._shards]))
        return VideoFeatures(*self._cache)

    # -- search ---------------------------------------------------------------------------
    @torch.inference_mode()
    def scores(self, texts: str | Sequence[str], chunk: int = 1024) -> Tensor:
        """DiCoSA scores S of every text against every indexed video: ``[T, V]`` float32.

        Videos are moved to the device ``chunk`` at a time, so memory stays bounded by the
        chunk, not the collection.
        """
        model = self._require_model()
        texts = [texts] if isinstance(texts, str) else list(texts)
        features = self.features
        dtype = next(model.parameters()).dtype
        text = model.encode_text(self.tokenizer(texts).to(self.device))
        out = []
        for start in range(0, len(self), chunk):
            video = VideoFeatures(features.frames[start:start + chunk].to(self.device, dtype),
                                  features.frame_mask[start:start + chunk].to(self.device))
            out.append(model.score(text, video).float().cpu())
        return torch.cat(out, dim=1)

    def search(self, text: str | Sequence[str], k: int = 10,
               chunk: int = 1024) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """The ``k`` best videos for ``text``, as ``[(path, score)]`` best first; a list of
        texts gives one such list per text."""
        _check_search(text, k)
        scores = self.scores(text, chunk)
        top = scores.topk(min(k, scores.shape[1]), dim=1)
        paths = self.paths
        results = [[(paths[i], float(s)) for i, s in zip(idx.tolist(), val.tolist(),
                                                          strict=True)]
                   for idx, val in zip(top.indices, top.values, strict=True)]
        return results[0] if isinstance(text, str) else results


def _check_search(text: str | Sequence[str], k: int) -> None:
    """Refuse what has no meaningful answer instead of ranking it anyway."""
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise QueryError("no query was given")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise QueryError(f"a query must be non-empty text, got {t!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise QueryError(f"k must be a positive number of results, got {k!r}")
