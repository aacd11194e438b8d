"""What showing videos as a person sees them costs: decoding upright, thumbnails, conversion.

FFmpeg (imageio-ffmpeg's binary) makes ``--seconds`` of its ``testsrc2`` pattern (moving, fine
detail: it costs an encoder about what camera footage does) at ``--size`` and 25 fps in the
forms a collection holds: H.264 MP4 (what a browser plays as it is), the same with a
display matrix (a phone's portrait video), XviD in AVI (packed B-frames), MPEG-2 in MPEG-PS,
and H.264 in Matroska. For each it times

- ``clip_ms``: :func:`dicosa.data.video.load_clip` of 12 frames at 224 px (what indexing a
  clip decodes), median of ``--repeats``;
- ``rotation_ms``: finding the display rotation alone (the file opened and its first frame
  decoded, what the decord path adds), median;
- ``thumbnail_ms``: one thumbnail at the middle, median;
- ``convert_s``: the stream's conversion into an empty media cache (``how``: direct, remux,
  transcode; ``realtime``: video seconds converted per second), and ``cached_ms``: the same
  request again, served from the cache.

    python benchmarks/media.py --seconds 60 --size 1280x720 --repeats 5 \
        --out benchmarks/results/media.json
    python benchmarks/media.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import av
from common import environment, report

from dicosa.data.display import first_rotation
from dicosa.data.video import load_clip
from dicosa.serve.media import decode_thumbnail
from dicosa.serve.transcode import MediaCache

# name -> (file name, FFmpeg output options)
FORMS = {
    "h264_mp4": ("h264.mp4", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]),
    "xvid_avi": ("xvid.avi", ["-c:v", "libxvid", "-bf", "2", "-vtag", "XVID", "-q:v", "4"]),
    "mpeg2_mpg": ("mpeg2.mpg", ["-c:v", "mpeg2video", "-q:v", "4"]),
    "h264_mkv": ("h264.mkv", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]),
}


def make_sources(folder: Path, seconds: float, size: str, ffmpeg: str) -> dict[str, Path]:
    import subprocess

    def run(*args: str) -> None:
        subprocess.run([ffmpeg, "-y", "-loglevel", "error", *args], check=True)

    paths = {}
    for name, (file, options) in FORMS.items():
        paths[name] = folder / file
        run("-f", "lavfi", "-i", f"testsrc2=size={size}:rate=25:duration={seconds}",
            *options, "-an", str(paths[name]))
    paths["portrait_mp4"] = folder / "portrait.mp4"  # the H.264 pixels, turned for display
    run("-display_rotation:v:0", "90", "-i", str(paths["h264_mp4"]), "-c", "copy",
        str(paths["portrait_mp4"]))
    return paths


def median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(1000 * (time.perf_counter() - started))
    return round(statistics.median(times), 3)


def rotation(path: Path) -> int:
    with av.open(str(path)) as container:
        return first_rotation(container, container.streams.video[0])


def measure(path: Path, seconds: float, cache: MediaCache, repeats: int) -> dict:
    stat = path.stat()
    started = time.perf_counter()
    served, media_type, converted = cache.get(path, stat.st_size, stat.st_mtime)
    convert_s = time.perf_counter() - started
    how = cache.known_plan(path, stat.st_size, stat.st_mtime).how
    return {
        "how": how, "media_type": media_type, "bytes": stat.st_size,
        "clip_ms": median_ms(lambda: load_clip(path, 12, 224), repeats),
        "rotation_ms": median_ms(lambda: rotation(path), repeats),
        "thumbnail_ms": median_ms(lambda: decode_thumbnail(path, seconds / 2), repeats),
        "convert_s": round(convert_s, 3) if converted else None,
        "realtime": round(seconds / convert_s, 2) if converted else None,
        "converted_bytes": served.stat().st_size if converted else None,
        "cached_ms": median_ms(lambda: cache.get(path, stat.st_size, stat.st_mtime), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="2 s at 320x180, once")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.size, args.repeats = 2.0, "320x180", 1
    with tempfile.TemporaryDirectory() as work:
        cache = MediaCache(Path(work) / "media", max_bytes=1 << 40)
        sources = make_sources(Path(work), args.seconds, args.size, cache.ffmpeg)
        forms = {name: measure(path, args.seconds, cache, args.repeats)
                 for name, path in sources.items()}
        target = cache.target
    report({"benchmark": "media", "seconds": args.seconds, "size": args.size,
            "repeats": args.repeats, "target": target, "forms": forms,
            "environment": environment("cpu")}, args.out)


if __name__ == "__main__":
    main()
