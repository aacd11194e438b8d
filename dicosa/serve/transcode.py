"""Videos a browser cannot play, converted on demand into a bounded cache (docs/serve.md,
"Videos a browser cannot play").

:func:`probe` reads a file's container and codecs (PyAV); :func:`plan` decides: send it as it
is, *remux* it (its streams copied into an MP4), or *transcode* it to H.264/AAC in MP4
(VP9/Opus in WebM where the FFmpeg binary, imageio-ffmpeg's, lacks ``libx264``), upright and
with square pixels, so a player shows what the index saw.

:class:`MediaCache`'s files are used least recently first out (a file's modification time is
its last use; Linux keeps a removed file's data for a response still reading it). A file's
name hashes the source's path, size and modification time and the output's profile, so a
changed source is converted again.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import av

__all__ = ["MediaCache", "Plan", "Probe", "TranscodeError", "plan", "probe"]

log = logging.getLogger(__name__)

# What Chromium and Firefox play, by container family.
_MP4_VIDEO, _MP4_AUDIO = {"h264", "vp9", "av1"}, {"aac", "mp3", "opus", "flac"}
_WEBM_VIDEO, _WEBM_AUDIO = {"vp8", "vp9", "av1"}, {"opus", "vorbis"}
_PLAIN_PIXELS = {"yuv420p", "yuvj420p"}  # H.264 in other layouts (4:2:2, 10-bit) fails there
_TIMEOUT_S = 6 * 3600  # a conversion that runs longer is stopped (a wedged FFmpeg)
_PLANS = 65536  # files whose plan is remembered


class TranscodeError(Exception):
    """A file that FFmpeg could not make playable (one sentence)."""


@dataclass(frozen=True)
class Probe:
    """A file's container family and codecs."""

    family: str  # "mp4" (MP4/MOV), "webm" (Matroska/WebM) or the format's own name
    video: str  # codec name ("" without a video stream)
    pixels: str  # the video's pixel format
    audio: tuple[str, ...]  # every audio stream's codec


@dataclass(frozen=True)
class Plan:
    """How a file reaches the browser: ``"direct"``, ``"remux"`` or ``"transcode"``, and
    the media type it is sent as."""

    how: str
    media_type: str


def probe(path: str | os.PathLike) -> Probe:
    """The container and codecs of ``path``. Raises TranscodeError where it does not open."""
    try:
        with av.open(str(path)) as container:
            names = set(container.format.name.split(","))
            family = ("mp4" if names & {"mp4", "mov"} else
                      "webm" if names & {"webm", "matroska"} else container.format.name)
            videos = container.streams.video
            video = videos[0].codec_context.name if videos else ""
            pixels = (videos[0].codec_context.format.name
                      if videos and videos[0].codec_context.format else "")
            audio = tuple(s.codec_context.name for s in container.streams.audio)
    except (av.FFmpegError, OSError) as exc:
        raise TranscodeError(f"the file cannot be read ({type(exc).__name__})") from None
    return Probe(family, video, pixels, audio)


def plan(found: Probe, target: str = "mp4") -> Plan:
    """How a file of ``found`` codecs is sent; ``target`` is what a conversion makes
    (``"mp4"``: H.264/AAC, ``"webm"``: VP9/Opus)."""
    audio = set(found.audio)
    h264_plain = found.video != "h264" or found.pixels in _PLAIN_PIXELS
    if found.family == "mp4" and found.video in _MP4_VIDEO and h264_plain and (
            audio <= _MP4_AUDIO):
        return Plan("direct", "video/mp4")
    if found.family == "webm" and found.video in _WEBM_VIDEO and audio <= _WEBM_AUDIO:
        return Plan("direct", "video/webm")
    if target == "mp4" and found.video in _MP4_VIDEO and h264_plain:
        return Plan("remux", "video/mp4")  # its streams fit an MP4 as they are
    return Plan("transcode", f"video/{target}")


def _arguments(how: str, target: str, audio: tuple[str, ...]) -> list[str]:
    """FFmpeg's output options for a remux or a transcode to ``target``."""
    streams = ["-map", "0:v:0", "-map", "0:a:0?", "-sn", "-dn"]
    if how == "remux":
        sound = ["-c:a", "copy"] if audio and set(audio[:1]) <= _MP4_AUDIO else [
            "-c:a", "aac", "-b:a", "128k"]
        return [*streams, "-c:v", "copy", *sound, "-movflags", "+faststart", "-f", "mp4"]
    # Upright (FFmpeg turns by the display matrix by default), square pixels, even sides.
    scale = ["-vf", "scale=trunc(iw*sar/2)*2:trunc(ih/2)*2,setsar=1"]
    if target == "mp4":
        return [*streams, *scale, "-c:v", "libx264", "-preset", "veryfast", "-crf", "23",
                "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "128k", "-ac", "2",
                "-movflags", "+faststart", "-f", "mp4"]
    return [*streams, *scale, "-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
            "-b:v", "0", "-crf", "33", "-row-mt", "1", "-pix_fmt", "yuv420p",
            "-c:a", "libopus", "-b:a", "96k", "-f", "webm"]


class MediaCache:
    """Converted videos in ``folder`` (made when first needed), at most ``max_bytes``: the
    least recently used files leave first (the one just made stays, even alone above the
    budget). One conversion runs at a time: each FFmpeg uses every core."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int = 4 << 30):
        self.folder, self.max_bytes = Path(folder), max_bytes
        self._ffmpeg: str | None = None  # imageio-ffmpeg's binary, found when first needed
        self._target: str | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, Future] = {}
        self._converting = threading.Lock()
        self._plans: dict[tuple, tuple[Plan, Probe]] = {}  # by the file's version
        self.converted = 0  # conversions this process ran

    @property
    def ffmpeg(self) -> str:
        if self._ffmpeg is None:
            import imageio_ffmpeg

            self._ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
        return self._ffmpeg

    @property
    def target(self) -> str:
        """``"mp4"`` where FFmpeg has libx264, else ``"webm"`` (libvpx-vp9)."""
        if self._target is None:
            encoders = subprocess.run([self.ffmpeg, "-hide_banner", "-encoders"],
                                      capture_output=True, text=True, timeout=60).stdout
            self._target = "mp4" if "libx264" in encoders else "webm"
        return self._target

    def plan(self, path: Path, size: int, mtime: float) -> tuple[Plan, Probe]:
        """How the file is sent (probed once per version of the file)."""
        identity = (str(path), size, mtime)
        with self._lock:
            known = self._plans.get(identity)
        if known is None:
            found = probe(path)
            known = plan(found, self.target), found
            with self._lock:
                if len(self._plans) >= _PLANS:
                    self._plans.clear()  # a bound, not an LRU: probing again is cheap
                self._plans[identity] = known
        return known

    def known_plan(self, path: Path, size: int, mtime: float) -> Plan | None:
        """The plan of this version of the file if it was probed (None: not yet)."""
        with self._lock:
            known = self._plans.get((str(path), size, mtime))
        return None if known is None else known[0]

    def converted_path(self, path: Path, size: int, mtime: float, media_type: str) -> Path:
        """Where the converted form of this version of the file lives."""
        ext = "webm" if media_type == "video/webm" else "mp4"
        key = hashlib.sha256(f"{path}\0{size}\0{mtime!r}\0{ext}-1".encode()).hexdigest()
        return self.folder / f"{key[:40]}.{ext}"

    def get(self, path: Path, size: int, mtime: float) -> tuple[Path, str, bool]:
        """``(file to send, media type, converted?)`` for this version of ``path``,
        converting it first where the browser cannot play it (waiting for a conversion of
        the same file already under way). Raises TranscodeError."""
        how, found = self.plan(path, size, mtime)
        if how.how == "direct":
            return path, how.media_type, False
        out = self.converted_path(path, size, mtime, how.media_type)
        if _touch(out):
            return out, how.media_type, True
        with self._lock:
            future = self._pending.get(out.name)
            mine = future is None
            if mine:
                future = self._pending[out.name] = Future()
        if mine:
            try:
                future.set_result(self._convert(path, out, how.how, found))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                with self._lock:
                    del self._pending[out.name]
        return future.result(), how.media_type, True

    def _convert(self, source: Path, out: Path, how: str, found: Probe) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._converting, open(out.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be making it
            if _touch(out):
                return out
            made = self._ffmpeg_run(source, out, how, found)
            if made is None and how == "remux":  # streams that an MP4 refuses as they are
                made = self._ffmpeg_run(source, out, "transcode", found)
            if made is None:
                raise TranscodeError("FFmpeg could not convert it for the browser; the "
                                     "server's log says why")
        self._evict(keep=out)
        return out

    def _ffmpeg_run(self, source: Path, out: Path, how: str, found: Probe) -> Path | None:
        part = out.with_name(f".tmp-{out.stem}-{os.getpid()}-{threading.get_ident()}"
                             f"{out.suffix}")
        command = [self.ffmpeg, "-nostdin", "-y", "-loglevel", "error", "-i", str(source),
                   *_arguments(how, self.target, found.audio), str(part)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode or not part.is_file():
            log.warning("could not %s %s for the browser: %s", how, source,
                        "timed out" if done is None else done.stderr.strip()[-400:])
            part.unlink(missing_ok=True)
            return None
        os.replace(part, out)
        self.converted += 1
        log.info("%s %s for the browser in %.1f s (%d bytes)", how, source.name,
                 time.perf_counter() - started, out.stat().st_size)
        return out

    def _evict(self, keep: Path) -> None:
        """The least recently used converted files out, until the rest fit the budget."""
        files = []
        for entry in self.folder.iterdir():
            if entry.suffix in (".mp4", ".webm") and not entry.name.startswith(".tmp-"):
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                files.append((stat.st_mtime, stat.st_size, entry))
        total = sum(size for _, size, _ in files)
        for _, size, entry in sorted(files):
            if total <= self.max_bytes:
                break
            if entry == keep:
                continue
            entry.unlink(missing_ok=True)
            entry.with_suffix(".lock").unlink(missing_ok=True)
            total -= size
            log.info("media cache: removed %s (least recently used)", entry.name)


def _touch(path: Path) -> bool:
    """Mark a converted file used now (its modification time); False where it is not there."""
    try:
        os.utime(path)
    except OSError:
        return False
    return True
