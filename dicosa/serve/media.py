"""Video files over HTTP with byte ranges (so ``<video>`` can seek), and moment thumbnails.

A file the browser cannot play is sent converted (:mod:`.transcode`, :func:`stream_response`),
with the same byte serving; HEAD answers as GET does, without the body.

Files are sent by Starlette's ``FileResponse``, which does the byte serving (one range: 206
with ``Content-Range``; HEAD; the file read in chunks and closed when the client leaves).
What it is asked for is decided here first, because three of its own answers differ from
what this API promises: it answers a Range of an unknown unit (``items=0-5``) with 400 where
RFC 9110 (14.2) says a server MUST ignore it, it answers malformed ranges and ranges past the
end in plain text where every error of this API is ``{"error": ...}``, and it has no
conditional GET. So here: ``If-None-Match`` with the current ETag gets 304; one
``bytes=first-last``, ``bytes=first-`` or ``bytes=-suffix`` range is passed on to
``FileResponse``; a range past the end gets 416 with ``Content-Range: bytes */size`` and a
JSON error; anything else (several ranges, another unit, bad syntax, an ``If-Range`` that no
longer matches) gets the whole file, which RFC 9110 allows a server to send instead.

Thumbnails (:class:`Thumbnails`) are decoded once and kept; :meth:`Thumbnails.prefetch`
decodes a result page's best moments while the page is sent, so the browser's requests
usually find them made.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from email.utils import formatdate
from pathlib import Path

import av
import numpy as np
import simplejpeg
from starlette.responses import FileResponse, Response

from ..data.display import display_of, shown_pixels
from .engine import VideoFile
from .errors import UnknownVideo
from .transcode import MediaCache

__all__ = ["RangeNotSatisfiable", "ThumbnailError", "Thumbnails", "decode_thumbnail",
           "file_response", "parse_range", "served_type", "stream_response"]

log = logging.getLogger(__name__)

_EPSILON = 1e-3  # seconds: frame times are i / fps, which floating point may put a hair off


class RangeNotSatisfiable(Exception):
    """A byte range that starts past the end of the file."""


class ThumbnailError(Exception):
    """No frame could be decoded at the asked time."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive ``(first, last)`` byte range ``header`` asks of a ``size``-byte file;
    None: send the whole file (see the module docstring). Raises RangeNotSatisfiable."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    first, last = first.strip(), last.strip()
    if (unit.strip().lower() != "bytes" or "," in spec or not dash
            or not (first.isdigit() or not first) or not (last.isdigit() or not last)
            or not (first or last)):
        return None
    if not first:  # the last `last` bytes
        if int(last) == 0 or size == 0:
            raise RangeNotSatisfiable
        return max(0, size - int(last)), size - 1
    start = int(first)
    if last and int(last) < start:
        return None  # not a valid range: ignored
    if start >= size:
        raise RangeNotSatisfiable
    return start, size - 1 if not last else min(int(last), size - 1)


class _FileRange(FileResponse):
    """``FileResponse`` told which range to send (None: the whole file) in place of the
    request's own ``Range`` and ``If-Range`` headers, which :func:`file_response` judged."""

    def __init__(self, path: Path, span: tuple[int, int] | None, **kwargs):
        super().__init__(path, **kwargs)
        self.span = span

    async def __call__(self, scope, receive, send) -> None:
        headers = [(k, v) for k, v in scope.get("headers", ())
                   if k not in (b"range", b"if-range")]
        if self.span is not None:
            headers.append((b"range", f"bytes={self.span[0]}-{self.span[1]}".encode()))
        await super().__call__({**scope, "headers": headers}, receive, send)


def file_response(file: VideoFile, headers: dict[str, str], etag: str | None = None,
                  modified: float | None = None) -> Response:
    """The response to a GET or HEAD of ``file`` with request ``headers`` (lower-case
    names); ``etag`` and ``modified`` (a time stamp): the file's version where its own size
    and modification time do not say it (a converted file, whose modification time marks its
    last use, is the version of its source)."""
    try:
        stat = os.stat(file.path)  # now: the file may have changed since it was checked
    except OSError:  # removed or made unreadable since it was checked
        raise UnknownVideo(file.id) from None
    etag = etag or f'"{stat.st_size:x}-{int(stat.st_mtime * 1000):x}"'
    common = {"Accept-Ranges": "bytes", "ETag": etag, "Cache-Control": "private, no-cache",
              "Last-Modified": formatdate(modified or stat.st_mtime, usegmt=True)}
    if headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=common)
    wanted = headers.get("range")
    if wanted and headers.get("if-range", etag) != etag:
        wanted = None  # the file changed since the client's first part: start again
    try:
        span = parse_range(wanted, stat.st_size)
    except RangeNotSatisfiable:
        return Response(b'{"error":"the requested byte range lies past the end of the file"}',
                        status_code=416, media_type="application/json",
                        headers={**common, "Content-Range": f"bytes */{stat.st_size}"})
    return _FileRange(file.path, span, headers=common, media_type=file.media_type,
                      stat_result=stat)


def stream_response(file: VideoFile, headers: dict[str, str], cache: MediaCache | None
                    ) -> Response:
    """:func:`file_response` of the file as the browser can play it: as it is, or converted
    by ``cache`` (None: always as it is). Raises TranscodeError."""
    if cache is None:
        return file_response(file, headers)
    path, media_type, converted = cache.get(file.path, file.size, file.mtime)
    served = dataclasses.replace(file, path=path, media_type=media_type)
    if not converted:
        return file_response(served, headers)
    return file_response(served, headers, etag=f'"{path.stem}"', modified=file.mtime)


def served_type(file: VideoFile, cache: MediaCache | None) -> str:
    """The media type :func:`stream_response` will most likely send ``file`` as, from its
    name alone (a search answer's links probe no file): a WebM as it is, anything else as
    MP4, as it is or converted (WebM where the cache converts to WebM)."""
    if cache is None or file.path.suffix.lower() == ".webm":
        return file.media_type
    known = cache.known_plan(file.path, file.size, file.mtime)
    if known is not None:
        return known.media_type
    return "video/mp4" if file.path.suffix.lower() in (".mp4", ".m4v", ".mov") else (
        f"video/{cache.target}")


def decode_thumbnail(path: str | Path, t: float, width: int = 320, quality: int = 80) -> bytes:
    """JPEG of the frame shown at ``t`` seconds into ``path`` (the last frame starting at or
    before ``t``; the last frame for a time past the end), upright, its longer side at most
    ``width`` pixels."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if t > 0 and stream.time_base:
                container.seek(int(t / stream.time_base), stream=stream, backward=True)
            chosen = None
            for frame in container.decode(stream):
                if chosen is not None and frame.time is not None and frame.time > t + _EPSILON:
                    break
                chosen = frame
            if chosen is None:
                raise ThumbnailError(f"{path}: no frame decodes at {t:.3f} s")
            image = _upright_image(stream, chosen, width)
    except (av.FFmpegError, OSError, IndexError) as exc:
        raise ThumbnailError(f"{path}: {exc}") from None
    return simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality,
                                  colorspace="RGB")


def _upright_image(stream: av.VideoStream, frame: av.VideoFrame, width: int) -> np.ndarray:
    """``frame`` as a player shows it (square pixels, turned), its longer side at most
    ``width`` pixels."""
    display = display_of(stream, frame.rotation)
    shown_width, shown_height = display.shown_size()
    scale = min(1.0, width / max(shown_width, shown_height))
    scaled = max(2, round(shown_width * scale / 2) * 2)
    height = max(2, round(shown_height * scale / 2) * 2)
    size = (height, scaled) if display.turned else (scaled, height)  # before turning
    return shown_pixels(frame, width=size[0], height=size[1])


class Thumbnails:
    """Moment thumbnails (:func:`decode_thumbnail`), decoded once on two threads and kept, at
    most ``max_bytes`` of them: the least recently used leave first."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self._cache: OrderedDict[tuple, bytes] = OrderedDict()
        self._pending: dict[tuple, Future] = {}
        self._size = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="dicosa-thumbnails")
        self.decoded = 0  # how many were decoded (not served from the cache)

    @staticmethod
    def key(file: VideoFile, t: float) -> tuple:
        """A thumbnail's identity: the file as it is now and the time in milliseconds."""
        return (str(file.path), file.size, file.mtime, round(t * 1000))

    def get(self, file: VideoFile, t: float) -> bytes:
        """The thumbnail at ``t``: from the cache, or decoded now (waiting for a decode of
        the same one already under way). Raises ThumbnailError."""
        return self._future(file, t).result()

    def prefetch(self, items: Iterable[tuple[VideoFile, float]]) -> None:
        """Start decoding these thumbnails in the background (failures are only logged)."""
        for file, t in items:
            self._future(file, t)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _future(self, file: VideoFile, t: float) -> Future:
        key = self.key(file, t)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                done: Future = Future()
                done.set_result(self._cache[key])
                return done
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._decode, key, file.path, t)
            return self._pending[key]

    def _decode(self, key: tuple, path: Path, t: float) -> bytes:
        try:
            image = decode_thumbnail(path, t)
        except ThumbnailError as exc:
            log.warning("no thumbnail: %s", exc)
            with self._lock:
                self._pending.pop(key, None)
            raise
        with self._lock:
            self._pending.pop(key, None)
            self.decoded += 1
            self._cache[key] = image
            self._size += len(image)
            while self._size > self.max_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._size -= len(old)
        return image
