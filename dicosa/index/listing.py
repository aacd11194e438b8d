"""Which files an index takes: the videos of a folder, and those new or changed since."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["file_changed", "file_stamp", "list_videos", "new_or_changed", "require_videos"]

log = logging.getLogger("dicosa.index.ingest")


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
        require_videos(root)
        videos = [root]
    return [str(Path(p).resolve()) for p in videos]


def require_videos(videos: str | os.PathLike | Iterable[str | os.PathLike]) -> None:
    """A folder or file of videos that does not exist is one sentence (FileNotFoundError),
    said before anything else is done; a list of files is checked as it is encoded."""
    if isinstance(videos, (str, os.PathLike)) and not Path(videos).exists():
        raise FileNotFoundError(f"{videos} does not exist: give a folder of videos or a "
                                "video file")


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
        elif file_changed(known[path], file_stamp(path)):
            todo.append(path)
            changed += 1
    if changed:
        log.info("%d indexed file(s) changed since they were encoded: encoding them again",
                 changed)
    return todo


def file_changed(recorded: tuple, now: tuple[float, float]) -> bool:
    """A file changed when its size or mtime differs from the recorded ones (an index
    that recorded none cannot tell: unchanged)."""
    try:
        size, mtime = float(recorded[0]), float(recorded[1])
    except (TypeError, ValueError):
        return False
    if size != size or mtime != mtime:
        return False
    return (size, mtime) != now
