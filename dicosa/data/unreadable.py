"""Why a video file cannot be read, in one plain sentence instead of FFmpeg's or decord's text.

FFmpeg says "[Errno 1094995529] Invalid data found when processing input" for a web page
saved as ``.mp4``, for an MP4 cut before its index and for random bytes alike, and decord adds
a C++ source line. What the file is, its first bytes say: an MP4/MOV starts with an ``ftyp``
box and needs its ``moov`` box (the index of its frames) to be read at all, an AVI starts
with ``RIFF....AVI ``, Matroska/WebM with the EBML magic, and a text file is printable.
:func:`plain_reason` reads those bytes and names the likely cause; the library's own text is
logged at debug level for whoever needs it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["plain_reason"]

log = logging.getLogger(__name__)

_HEAD = 4096  # bytes read to recognise a file
_MOOV_SCAN = 64 << 20  # an MP4's index is looked for in at most this many bytes


def plain_reason(path: str | os.PathLike, exc: BaseException | str, doing: str = "opening"
                 ) -> str:
    """One sentence (to follow ``"path: "``) on why ``path`` failed while ``doing``
    (``"opening"``; ``"reading"`` or ``"decoding"`` a file that opened) with the library
    error ``exc``."""
    log.debug("%s: %s failed: %s", path, doing, exc)
    if doing != "opening":
        return (f"damaged: a stretch of it cannot be {'read' if doing == 'reading' else 'decoded'}"
                " (a broken or cut-off part of the file)")
    head = _head(Path(path))
    if _is_text(head):
        return ("not a video: the file holds text (a web page or an error message saved "
                "under a video's name?)")
    if head[4:8] == b"ftyp":
        if not _has_box(Path(path), b"moov"):
            return ("cut short: an MP4/MOV whose index (its moov box) is missing, as an "
                    "interrupted download or copy leaves it")
        return "damaged: an MP4/MOV whose index (its moov box) cannot be read"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "damaged: an AVI whose headers cannot be read (cut short or overwritten)"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "damaged: a Matroska/WebM file whose headers cannot be read"
    return "not a video FFmpeg recognises (damaged, or another kind of file)"


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD)
    except OSError:
        return b""


def _is_text(head: bytes) -> bool:
    """Whether the first bytes read as text (UTF-8, no control bytes but whitespace)."""
    if not head.strip():
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # a multi-byte character cut at the end of the sample is still text
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return all(c.isprintable() or c in "\t\r\n\f" for c in text)


def _has_box(path: Path, kind: bytes) -> bool:
    """Whether an ISO media file holds a whole top-level ``kind`` box (each box starts with
    a 32-bit size, or 1 and a 64-bit size after the type; 0 runs to the end of the file)."""
    try:
        size_of_file = path.stat().st_size
        with open(path, "rb") as f:
            at = 0
            while at + 8 <= min(size_of_file, _MOOV_SCAN):
                f.seek(at)
                header = f.read(16)
                size, name = int.from_bytes(header[:4], "big"), header[4:8]
                if size == 1 and len(header) == 16:
                    size = int.from_bytes(header[8:16], "big")
                if name == kind:
                    return size == 0 or at + size <= size_of_file
                if size < 8:
                    return False
                at += size
    except OSError:
        return False
    return False
