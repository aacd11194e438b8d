"""Test helpers: write tiny real video files whose frames encode their own index.

Frame ``i`` is a flat grey image of level :func:`frame_level` ``(i)``, so a test can read
back which frames a decoder returned from the mean pixel value (codecs keep flat regions
within a few levels).
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

# Steps of 5 survive the 1-2 level shifts of codecs and decoder-side scaling.
LEVEL_START = 10
LEVEL_STEP = 5


def frame_level(index: int | np.ndarray) -> int | np.ndarray:
    """Grey level of frame ``index`` in videos written by :func:`write_video`."""
    return LEVEL_START + LEVEL_STEP * np.asarray(index)


def level_to_index(mean: float | np.ndarray) -> np.ndarray:
    """Invert :func:`frame_level` from a measured mean pixel value."""
    return np.rint((np.asarray(mean) - LEVEL_START) / LEVEL_STEP).astype(int)


def write_video(
    path: str | Path,
    num_frames: int,
    fps: int = 10,
    width: int = 48,
    height: int = 32,
    codec: str = "mpeg4",
) -> Path:
    """Write ``num_frames`` flat grey frames (frame i at ``frame_level(i)``) to ``path``.

    Supports up to 50 frames (levels stay below 256). Returns ``path``.
    """
    if LEVEL_START + LEVEL_STEP * (num_frames - 1) > 255:
        raise ValueError("too many frames for distinct grey levels")
    levels = frame_level(np.arange(num_frames)).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (num_frames, height, width, 3))
    return write_frames(path, frames, fps, codec)


def write_frames(path: str | Path, frames: np.ndarray, fps: int = 10, codec: str = "mpeg4"):
    """Encode uint8 ``[T, H, W, 3]`` RGB frames (H, W even) to ``path``; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames.shape[1:3]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        # MJPEG wants full-range chroma, as compress_videos writes it.
        pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"crf": "0", "preset": "ultrafast"}
        else:
            # A fine quantiser so flat levels survive encoding.
            stream.codec_context.qmax = 2
        for img in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def truncate(path: str | Path, keep_fraction: float = 0.5) -> Path:
    """Cut ``path`` to its first ``keep_fraction`` of bytes (a typical broken download)."""
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path


def damage(path: str | Path, first: int, last: int) -> Path:
    """Zero the coded bytes of packets ``first..last-1`` in place (a damaged stretch: the
    container still opens, those frames no longer decode)."""
    path = Path(path)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        spans = [(p.pos, p.size) for p in container.demux(stream) if p.size]
    data = bytearray(path.read_bytes())
    for pos, size in spans[first:last]:
        data[pos:pos + size] = bytes(size)
    path.write_bytes(bytes(data))
    return path


def write_timed(path: str | Path, levels, times, start: float = 0.0, width: int = 48,
                height: int = 32) -> Path:
    """Flat grey frames of ``levels`` at the given presentation ``times`` (seconds, strictly
    increasing; a variable frame rate), the stream starting at ``start`` seconds (Matroska,
    millisecond timestamps). Returns ``path``."""
    from fractions import Fraction

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=1000)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.codec_context.qmax = 2
        for level, time in zip(levels, times, strict=True):
            img = np.full((height, width, 3), level, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts, frame.time_base = round((time + start) * 1000), Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_scenes(path: str | Path, colours, seconds: float = 3.0, fps: int = 8,
                 width: int = 48, height: int = 32) -> Path:
    """A video of one scene per RGB colour in ``colours``, ``seconds`` each, joined by hard
    cuts; in each scene a white square moves right (so consecutive frames differ a little).
    Returns ``path``."""
    frames = []
    per_scene = round(seconds * fps)
    for colour in colours:
        for i in range(per_scene):
            img = np.empty((height, width, 3), dtype=np.uint8)
            img[:] = colour
            x = (2 * i) % (width - 8)
            img[8:16, x:x + 8] = 255
            frames.append(img)
    return write_frames(path, np.stack(frames), fps=fps)
