"""Ingest: list video files, decode them, encode them, and hand them on shard by shard.

:func:`ingest` runs the loop :meth:`~dicosa.index.VideoIndex.add` is made of. It knows no
index: what becomes of a full shard is the ``commit`` callable it is given (the index stores
it and commits its manifest), so the loop's only state is what is encoded and not yet handed
on. Each row carries the file's ``size`` and ``mtime``, by which a later ``add`` notices that
a file changed and encodes it again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from ..data.protocol import FrameProtocol
from ..model import DiCoSA, VideoFeatures
from ..progress import progress as show_progress
from ..search.store import finite_rows

__all__ = ["IngestReport", "Pending", "file_stamp", "ingest", "list_videos", "new_or_changed"]

log = logging.getLogger(__name__)


def list_videos(videos: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Absolute paths of the videos to index.

    A folder is searched recursively for video files (the extensions of
    :data:`dicosa.data.datasets.VIDEO_EXTENSIONS`, hidden files skipped), in sorted order; a
    file or a list of files is taken as given. A folder or file that does not exist is one
    sentence (FileNotFoundError): indexing nothing would look like success.
    """
    from ..data.datasets import VIDEO_EXTENSIONS

    if isinstance(videos, (str, os.PathLike)):
        root = Path(videos)
        if root.is_dir():
            found = [p for p in root.rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS
                     and not p.name.startswith(".") and p.is_file()]
            return sorted(str(p.resolve()) for p in found)
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist: give a folder of videos or a "
                                    "video file")
        videos = [root]
    return [str(Path(p).resolve()) for p in videos]


def file_stamp(path: str) -> tuple[float, float]:
    """``(size in bytes, mtime in s)`` of a file, NaN for one that cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return float("nan"), float("nan")
    return float(info.st_size), float(info.st_mtime)


def new_or_changed(listed: list[str], table) -> list[str]:
    """The ``listed`` files that ``table`` (an index's metadata) does not hold, or holds from a
    file whose size or modification time has changed since."""
    known = dict(zip(table["path"], zip(table["size"], table["mtime"], strict=True),
                     strict=True))
    todo, changed = [], 0
    for path in listed:
        if path not in known:
            todo.append(path)
        elif _changed(known[path], file_stamp(path)):
            todo.append(path)
            changed += 1
    if changed:
        log.info("%d indexed file(s) changed since they were encoded: encoding them again",
                 changed)
    return todo


def _changed(recorded: tuple, now: tuple[float, float]) -> bool:
    """A file changed when its size or mtime differs from the recorded ones (an index
    that recorded none cannot tell: unchanged)."""
    try:
        size, mtime = float(recorded[0]), float(recorded[1])
    except (TypeError, ValueError):
        return False
    if size != size or mtime != mtime:
        return False
    return (size, mtime) != now


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
        from ..data.video import load_video_partial, video_info

        path = self.paths[i]
        size, mtime = file_stamp(path)
        stamp = {"size": size, "mtime": mtime}
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
            shape = (self.num_frames, 3, self.image_size, self.image_size)
            return {"path": path, "frames": torch.zeros(shape, dtype=torch.uint8),
                    "frame_mask": torch.zeros(self.num_frames, dtype=torch.bool),
                    "text_only": reason,
                    "row": {"path": path, "valid_frames": 0, "title": title,
                            "text_only": True, "frames_lost": 1.0, **stamp}}
        return {"path": path, "frames": frames, "frame_mask": mask,
                "row": {"path": path, "duration": info["duration"], "fps": info["fps"],
                        "num_frames": info["num_frames"], "valid_frames": int(mask.sum()),
                        "title": self.titles.get(path, ""), "text_only": False,
                        "frames_lost": lost, **stamp}}


def _collate(items: list[dict]) -> dict:
    good = [it for it in items if "error" not in it]
    out = {"bad": [(it["path"], it["error"]) for it in items if "error" in it],
           "text_only": [(it["path"], it["text_only"]) for it in good if "text_only" in it],
           "rows": [it["row"] for it in good]}
    if good:
        out["frames"] = torch.stack([it["frames"] for it in good])
        out["frame_mask"] = torch.stack([it["frame_mask"] for it in good])
    return out


@dataclass
class Pending:
    """Encoded videos not yet stored: float16 frames on the CPU and their metadata rows."""

    video: VideoFeatures
    rows: list[dict]


@dataclass
class IngestReport:
    added: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    text_only: list[tuple[str, str]] = field(default_factory=list)


@torch.inference_mode()
def encode_batch(model: DiCoSA, device: torch.device, batch: dict) -> Pending:
    """A decoded batch's per-frame features (float16, CPU). A text-only row has no frame to
    encode: it stores zeros and an empty mask."""
    frames = batch["frames"].to(device, non_blocking=True)
    mask = batch["frame_mask"].to(device)
    seen = mask.any(dim=1)
    out = torch.zeros(*mask.shape, model.embed_dim, device=device)
    if seen.any():
        out[seen] = model.encode_video(frames[seen], mask[seen]).frames.float()
    return Pending(VideoFeatures(out.to("cpu", torch.float16), mask.cpu()), batch["rows"])


def _without_non_finite(pending: Pending, report: IngestReport) -> Pending:
    """Rows whose features are not finite are skipped (counted, logged): stored, they would
    score NaN against every query."""
    keep = finite_rows(pending.video.frames, pending.video.frame_mask)
    if keep.all():
        return pending
    for row in (r for r, k in zip(pending.rows, keep, strict=True) if not k):
        log.warning("skipping %s: the model gave non-finite features", row["path"])
        report.skipped.append((row["path"], "non-finite features"))
    index = torch.from_numpy(keep)
    return Pending(VideoFeatures(pending.video.frames[index], pending.video.frame_mask[index]),
                   [r for r, k in zip(pending.rows, keep, strict=True) if k])


def ingest(model: DiCoSA, device: torch.device, todo: list[str], frames: FrameProtocol,
           commit: Callable[[list[Pending]], None], *, batch_size: int = 16,
           num_workers: int | None = None, shard_size: int = 256, progress: bool = True,
           titles: dict[str, str] | None = None) -> IngestReport:
    """Decode and encode ``todo``; every ``shard_size`` videos (and at the end, or when
    interrupted: what is encoded is already paid for) ``commit(pending)`` stores them."""
    if num_workers is None:
        num_workers = min(4, os.cpu_count() or 1)
    loader = DataLoader(
        _VideoFiles(todo, model.config.num_frames, model.image_size, frames, titles),
        batch_size=batch_size, num_workers=num_workers, collate_fn=_collate)
    report, pending = IngestReport(), []
    bar = show_progress(total=len(todo), desc="indexing videos", unit="video", enabled=progress)
    try:
        with bar:
            for batch in loader:
                _note(batch, report)
                if batch["rows"]:
                    pending.append(_without_non_finite(encode_batch(model, device, batch),
                                                       report))
                if sum(len(p.rows) for p in pending) >= shard_size:
                    commit(pending)
                    report.added += sum(len(p.rows) for p in pending)
                    pending = []
                bar.update(len(batch["rows"]) + len(batch["bad"]))
                bar.set_postfix(skipped=len(report.skipped))
    finally:
        if any(p.rows for p in pending):
            commit(pending)
            report.added += sum(len(p.rows) for p in pending)
    return report


def _note(batch: dict, report: IngestReport) -> None:
    for path, reason in batch["bad"]:
        log.warning("skipping %s: %s", path, reason)
        report.skipped.append((path, reason))
    for path, reason in batch["text_only"]:
        log.warning("indexing %s from its title alone: %s", path, reason)
        report.text_only.append((path, reason))
    for row in batch["rows"]:
        if 0 < row["frames_lost"] < 1:
            log.warning("%s: %.0f%% of the sampled frames did not decode; indexed from the "
                        "rest (metadata frames_lost)", row["path"], 100 * row["frames_lost"])
