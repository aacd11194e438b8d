"""Throughput of the training DataLoader, in clips per second.

Without ``--root`` it first writes 10-30 s, 398x224, 10-fps source clips to a temporary
folder and re-encodes them with ``compress_videos`` (3 fps, 224 px; ``--codec`` and
``--keep-aspect`` as in ``data_prep/compress_videos.py``). The sources are textured and pan,
so that they cost about as many bytes per frame to store, and as much work to decode, as
camera footage; the synthetic benchmark's flat shapes would flatter the decoder. The JSON
records the mean stored bytes per frame, to compare with a real dataset's. ``--smoke`` runs
tiny inputs in a few seconds (and writes no JSON unless ``--out`` is given).

    python benchmarks/data.py --workers 1 2 --repeats 3
    python benchmarks/data.py --workers 1 8 16 --repeats 3     # on a 16-core machine
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import av
import numpy as np
from common import environment, report
from torch.utils.data import DataLoader

from dicosa.clip import get_tokenizer
from dicosa.data.compress import CODECS, compress_videos
from dicosa.data.datasets import DATASETS, load_split
from dicosa.data.loader import TrainDataset
from dicosa.data.synthetic import make_synthetic
from dicosa.training import build_train_loader

DEFAULT_OUT = Path(__file__).parent / "results" / "data.json"


def write_textured(path: Path, num_frames: int, height: int, width: int, fps: int,
                   seed: int) -> None:
    """A panning view of a random scene: smooth colour regions, edges and sensor-like noise."""
    rng = np.random.default_rng(seed)
    pan = 3  # pixels per frame
    full_w = width + pan * num_frames
    # Low-frequency colour field plus a few hard-edged blocks, at quarter resolution.
    coarse = rng.uniform(0, 255, size=(height // 16 + 2, full_w // 16 + 2, 3))
    scene = np.kron(coarse, np.ones((16, 16, 1)))[:height, :full_w]
    for _ in range(12):
        y, x = rng.integers(0, height), rng.integers(0, full_w)
        scene[y:y + rng.integers(8, 60), x:x + rng.integers(8, 60)] = rng.uniform(0, 255, 3)
    y, x = np.mgrid[0:height, 0:full_w]
    scene += 25 * np.sin(x / rng.uniform(2, 6) + y / rng.uniform(2, 6))[..., None]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        stream.codec_context.thread_count = 1
        for t in range(num_frames):
            noise = rng.normal(0, 6, size=(height, width, 1))
            img = np.clip(scene[:, pan * t: pan * t + width] + noise, 0, 255).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        container.mux(stream.encode())


def _texture_job(job: tuple[str, int, int, int, int]) -> None:
    path, seed, height, width, fps = job
    with av.open(path) as container:
        num_frames = container.streams.video[0].frames
    write_textured(Path(path), num_frames, height, width, fps, seed)


def bytes_per_frame(folder: Path) -> float:
    total_bytes, total_frames = 0, 0
    for path in folder.glob("*.mp4"):
        with av.open(str(path)) as container:
            total_frames += container.streams.video[0].frames
        total_bytes += path.stat().st_size
    return total_bytes / max(1, total_frames)


def measure(loader: DataLoader, num_batches: int) -> tuple[int, float]:
    """(clips, seconds) over ``num_batches`` batches, after one warm-up batch that absorbs
    worker start-up; cycles through epochs when the dataset is smaller."""
    clips, start, seen = 0, None, 0
    while seen <= num_batches:
        for batch in loader:
            if start is None:
                start = time.perf_counter()  # first batch is warm-up
            else:
                clips += batch["frames"].shape[0]
            seen += 1
            if seen > num_batches:
                break
    return clips, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="dataset root; default: synthetic clips")
    parser.add_argument("--dataset", default="msrvtt", choices=sorted(DATASETS))
    parser.add_argument("--split", default=None, help="default: the dataset's training split")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="one or more worker counts, each measured on the same clips")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per worker count (interleaved); the median is reported")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-batches", type=int, default=40)
    parser.add_argument("--num-frames", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-clips", type=int, default=48, help="synthetic clips to write")
    parser.add_argument("--codec", choices=CODECS, default="mjpeg",
                        help="how compress_videos stores the synthetic clips")
    parser.add_argument("--keep-aspect", action="store_true",
                        help="store whole 398x224 frames instead of the centre square")
    parser.add_argument("--out", type=Path, default=None, help=f"default: {DEFAULT_OUT}")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, a few seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_clips, args.batch_size, args.num_batches = 4, 2, 2
        args.image_size = 32

    with tempfile.TemporaryDirectory() as tmp:
        if args.root is None or not Path(args.root).exists():
            # Clips as the documented pipeline leaves them: source video re-encoded by
            # compress_videos (3 fps, 224 px short side).
            dataset, root = "synthetic", Path(args.root or Path(tmp) / "root")
            raw = Path(tmp) / "raw"
            height, width, fps = (64, 64, 6) if args.smoke else (224, 398, 10)
            # make_synthetic writes the MSR-VTT annotation files and clips of random lengths;
            # each clip is then replaced by textured footage of the same length.
            make_synthetic(raw, args.num_clips, 0, size=height, width=width, fps=fps,
                           seconds=(2, 4) if args.smoke else (10, 30))
            jobs = [(str(p), i, height, width, fps)
                    for i, p in enumerate(sorted((raw / "videos").glob("*.mp4")))]
            with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
                list(pool.map(_texture_job, jobs))
            compressed = compress_videos(raw / "videos", root / "videos", fps=3,
                                         short_side=64 if args.smoke else 224,
                                         num_workers=os.cpu_count() or 1, progress=False,
                                         codec=args.codec, square=not args.keep_aspect)
            if compressed["failed"]:
                raise SystemExit(f"compressing the benchmark clips failed: {compressed['failed']}")
            for f in raw.iterdir():
                if f.is_file():
                    shutil.copy(f, root / f.name)
            source = (f"textured {width}x{height} "
                      f"{'2-4' if args.smoke else '10-30'} s clips re-encoded by compress_videos "
                      f"(3 fps, {args.codec}, {'whole frame' if args.keep_aspect else 'square'})")
        else:
            dataset, root, source = args.dataset, Path(args.root), str(args.root)
        stored = bytes_per_frame(root / "videos")
        split = load_split(dataset, root, args.split or DATASETS[dataset].train_split)
        # One caption per video, so a batch never decodes the same file twice.
        first = {}
        for i, v in enumerate(split.caption_video):
            first.setdefault(v, i)
        keep = sorted(first.values())
        # Enough items that no worker runs dry: a new epoch restarts every worker, and with
        # a few clips that start-up, not decoding, is what would be timed.
        need = (args.num_batches + 1) * args.batch_size
        keep = (keep * (need // len(keep) + 1))[:max(need, len(keep))]
        split.captions = [split.captions[i] for i in keep]
        split.caption_video = [split.caption_video[i] for i in keep]
        # The loader train.py builds: real tokenizer, per-item seeding, dropped last batch.
        ds = TrainDataset(split, get_tokenizer("ViT-B-32", 32), args.num_frames,
                          args.image_size)
        rates: dict[int, list[float]] = {w: [] for w in args.workers}
        for _ in range(args.repeats):
            for workers in args.workers:
                loader, _ = build_train_loader(ds, args.batch_size, seed=0,
                                               num_workers=workers)
                clips, seconds = measure(loader, args.num_batches)
                rates[workers].append(clips / seconds)

    runs = []
    for workers, values in rates.items():
        rate = statistics.median(values)
        runs.append({"workers": workers, "clips_per_s": round(rate, 2),
                     "clips_per_s_per_worker": round(rate / max(1, workers), 2),
                     "all_runs": [round(v, 2) for v in values]})
    result = {
        "benchmark": "data",
        "runs": runs,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "num_batches": args.num_batches,
        "num_frames": args.num_frames,
        "image_size": args.image_size,
        "source": source,
        "stored_bytes_per_frame": round(stored),
        "smoke": args.smoke,
        **environment("cpu"),
    }
    return report(result, args.out if args.out is not None or args.smoke else DEFAULT_OUT)


if __name__ == "__main__":
    main()
