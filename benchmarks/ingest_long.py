"""What an hour of video costs to index: decode + encode on the CPU, and the bytes stored.

A generated H.264 file (``--minutes`` of ``--width`` x ``--height`` at ``--fps``: scenes of
moving coloured shapes, ``dicosa.data.synthetic``'s renderer, a cut every 2-12 s) is indexed
as a user's would be (``VideoIndex.build``: frames at 1 frame/s, shots, windows) by a
random-weight model of ``--arch`` (default ViT-B/32: the cost is the architecture's, the
weights do not change it). Timed separately: the streaming decode alone (PyAV at 1 frame/s
with the shot detector, ``dicosa.data.stream.FrameStream``), then the whole build; both
scaled to an hour of video. The store's bytes (shard files) per hour.

    python benchmarks/ingest_long.py --minutes 10 --out benchmarks/results/ingest_long.json
    python benchmarks/ingest_long.py --smoke
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import av
import numpy as np
from common import environment, random_model, report

from dicosa.data.stream import FrameStream
from dicosa.data.synthetic import COLOURS, render_clip, sample_scene
from dicosa.index import VideoIndex


def write_video(path: Path, minutes: float, width: int, height: int, fps: int,
                seed: int = 0) -> dict:
    """The test file (module docstring); returns its facts."""
    rng = np.random.default_rng(seed)
    total = round(minutes * 60 * fps)
    backgrounds = [np.array(c) // 5 for c in COLOURS.values()]
    cuts, written = [], 0
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "23"}
        while written < total:
            length = min(total - written, int(rng.integers(2 * fps, 12 * fps)))
            frames = render_clip(sample_scene(rng), length, height, width,
                                 tuple(backgrounds[int(rng.integers(len(backgrounds)))]),
                                 4.0, int(rng.integers(2**31)))
            for image in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            cuts.append(written / fps)
            written += length
        container.mux(stream.encode())
    return {"seconds": total / fps, "frames": total, "width": width, "height": height,
            "fps": fps, "codec": "h264 (libx264 veryfast, crf 23)", "scenes": len(cuts),
            "bytes": path.stat().st_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--work", default="benchmarks/results/ingest-long")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="benchmarks/results/ingest_long.json")
    args = p.parse_args()
    if args.smoke:
        args.minutes, args.width, args.height, args.fps = 0.3, 160, 96, 10
        args.arch, args.frames, args.work = "dicosa-tiny", 4, "ingest-long-smoke"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    video = work / f"long-{args.minutes:g}min-{args.height}p.mp4"
    started = time.perf_counter()
    facts = write_video(video, args.minutes, args.width, args.height, args.fps)
    written = time.perf_counter() - started
    model = random_model(args.arch, "released", args.frames).eval()
    import scenedetect  # noqa: F401  (imported before the clock: OpenCV loads in seconds)

    started = time.perf_counter()
    stream = FrameStream(video, 1.0, model.image_size)
    taken = sum(len(batch.times) for batch in stream)
    decode_s = time.perf_counter() - started

    out = work / "index"
    if out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()
    index = VideoIndex.build(model, [str(video)], out, device="cpu",
                             num_workers=args.num_workers, progress=False)
    build_s = time.perf_counter() - started
    stored = sum(f.stat().st_size for f in out.glob("shard-*"))
    derived = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) - stored
    hours = facts["seconds"] / 3600
    report({
        "benchmark": "ingest_long", "video": facts, "write_s": round(written, 1),
        "arch": args.arch, "dim": model.embed_dim, "N": args.frames,
        "frames_stored": taken, "rows": len(index.store),
        "shots_found": len(stream.report.cuts) + 1,
        "decode_s": round(decode_s, 2), "build_s": round(build_s, 2),
        "per_hour": {"decode_s": round(decode_s / hours, 1),
                     "decode_and_encode_s": round(build_s / hours, 1),
                     "store_mib": round(stored / hours / 2**20, 2),
                     "derived_mib": round(derived / hours / 2**20, 2),
                     "video_mib": round(facts["bytes"] / hours / 2**20, 1)},
        "num_workers": args.num_workers, **environment("cpu"),
    }, args.out)


if __name__ == "__main__":
    main()
