"""Re-encode a folder of videos to a low frame rate and short side, for fast decoding.

Uses the ffmpeg binary shipped by the ``imageio-ffmpeg`` package. Outputs go to
``<dst>/<same relative path>.mp4``; each is written to a hidden temporary file and renamed
when complete, so an interrupted run leaves no half-written output and a rerun skips every
finished file.

By default the output is what :func:`dicosa.data.video.load_video` reads fastest: MJPEG
(every frame a JPEG, decoded by libjpeg-turbo with no seeking) cropped to the centre square,
the only part the loader ever uses. ``codec="h264"`` and ``square=False`` give the usual
aspect-preserving H.264 files instead (every frame a keyframe), for other tools.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ..progress import progress as show_progress
from .datasets import VIDEO_EXTENSIONS

__all__ = ["CODECS", "compress_video", "compress_videos", "ffmpeg_exe", "plan_outputs"]


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary from ``imageio-ffmpeg``."""
    import imageio_ffmpeg  # deferred: only this module needs it

    return imageio_ffmpeg.get_ffmpeg_exe()


# Codec arguments. h264: every frame a keyframe, so sampling 12 of ~60 frames decodes 12,
# not the whole GOP before each, and fastdecode (no CABAC, no deblocking) for ~20% more bytes.
# mjpeg: quantiser 3 on ffmpeg's 2..31 scale; full-range yuvj420p is what JPEG decoders expect.
_CODEC_ARGS = {
    "mjpeg": ["-c:v", "mjpeg", "-q:v", "3", "-pix_fmt", "yuvj420p"],
    "h264": ["-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-pix_fmt", "yuv420p",
             "-g", "1", "-tune", "fastdecode"],
}
CODECS = tuple(_CODEC_ARGS)


def _check_codec(codec: str) -> None:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")


def _video_filter(fps: float, short_side: int, square: bool) -> str:
    # Short side to `short_side` (never upscaled), long side by aspect ratio; every size
    # rounded to even numbers because 4:2:0 chroma needs them.
    s = f"trunc(min({short_side},min(iw,ih))/2)*2"
    chain = f"fps={fps},scale='if(lte(iw,ih),{s},-2)':'if(lte(iw,ih),-2,{s})'"
    # crop centres by default; the loader centre-crops the same square, so nothing it would
    # read is lost.
    return chain + (",crop='min(iw,ih)':'min(iw,ih)'" if square else "")


def compress_video(
    src: str | Path,
    dst: str | Path,
    fps: float = 3,
    short_side: int = 224,
    ffmpeg: str | None = None,
    timeout: float | None = None,
    codec: str = "mjpeg",
    square: bool = True,
) -> str | None:
    """Re-encode ``src`` to an mp4 at ``dst`` (atomically).

    Args:
        fps, short_side: output frame rate and short side (never upscaled).
        codec: ``"mjpeg"`` or ``"h264"``.
        square: keep only the centre square.

    Returns:
        None on success, else the reason it failed (ffmpeg's last error lines).
    """
    _check_codec(codec)
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.stem}.partial.mp4")
    cmd = [
        ffmpeg or ffmpeg_exe(), "-y", "-nostdin", "-loglevel", "error", "-i", str(src),
        "-vf", _video_filter(fps, short_side, square), "-an", *_CODEC_ARGS[codec],
        # Index at the front: readers need not seek to the end to open the file.
        "-movflags", "+faststart", "-threads", "1", str(tmp),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        return f"timed out after {timeout} s"
    if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        return " | ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit {proc.returncode}"
    os.replace(tmp, dst)
    return None


def plan_outputs(src_dir: str | Path, dst_dir: str | Path) -> list[tuple[Path, Path]]:
    """``(source, output)`` for every video under ``src_dir``, outputs mirroring its tree.

    Raises:
        ValueError: ``dst_dir`` is ``src_dir`` or inside it (sources must never be touched).
    """
    src_dir, dst_dir = Path(src_dir).resolve(), Path(dst_dir).resolve()
    if dst_dir == src_dir or src_dir in dst_dir.parents:
        raise ValueError(f"output folder {dst_dir} must be outside the input folder {src_dir}")
    if not src_dir.is_dir():
        raise FileNotFoundError(f"input folder not found: {src_dir}")
    return [(path, (dst_dir / path.relative_to(src_dir)).with_suffix(".mp4"))
            for path in sorted(src_dir.rglob("*"))
            if path.suffix.lower() in VIDEO_EXTENSIONS and not path.name.startswith(".")]


def compress_videos(
    src_dir: str | Path,
    dst_dir: str | Path,
    fps: float = 3,
    short_side: int = 224,
    num_workers: int = 4,
    progress: bool = True,
    timeout: float | None = None,
    codec: str = "mjpeg",
    square: bool = True,
) -> dict:
    """Re-encode every video under ``src_dir`` into ``dst_dir``, skipping finished outputs.

    See :func:`compress_video` for ``codec`` and ``square``.

    Returns:
        ``{"done": int, "skipped": int, "failed": [(source path, reason), ...]}``.
    """
    _check_codec(codec)
    pairs = plan_outputs(src_dir, dst_dir)
    todo = [(s, d) for s, d in pairs if not d.is_file()]
    exe = ffmpeg_exe()
    failed: list[tuple[str, str]] = []
    # Threads suffice: each job is an ffmpeg subprocess.
    with ThreadPoolExecutor(max_workers=max(1, num_workers)) as pool, show_progress(
        total=len(todo), desc="compressing", unit="video", enabled=progress
    ) as bar:
        futures = {
            pool.submit(compress_video, s, d, fps, short_side, exe, timeout, codec, square): s
            for s, d in todo
        }
        for future in as_completed(futures):
            reason = future.result()
            if reason is not None:
                failed.append((str(futures[future]), reason))
            bar.update()
    return {"done": len(todo) - len(failed), "skipped": len(pairs) - len(todo),
            "failed": failed}
