"""Throughput of the training DataLoader, in clips per second.

Without ``--root`` it first writes 3-fps, 10-30 s, 398x224 synthetic clips (the shape of
``data_prep/compress_videos.py`` output) to a temporary folder. ``--smoke`` runs tiny inputs
in a few seconds (and writes no JSON unless ``--out`` is given).

    python benchmarks/data.py --workers 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from common import environment, report
from torch.utils.data import DataLoader

from dicosa.data.compress import compress_videos
from dicosa.data.datasets import DATASETS, load_split
from dicosa.data.loader import TrainDataset
from dicosa.data.synthetic import make_synthetic

DEFAULT_OUT = Path(__file__).parent / "results" / "data.json"


def _fake_tokenize(texts: list[str]) -> torch.Tensor:
    # Tokenising is not what this measures; a constant-cost stand-in.
    return torch.zeros(len(texts), 32, dtype=torch.long)


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
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-batches", type=int, default=12)
    parser.add_argument("--num-frames", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-clips", type=int, default=48, help="synthetic clips to write")
    parser.add_argument("--out", type=Path, default=None, help=f"default: {DEFAULT_OUT}")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, a few seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_clips, args.batch_size, args.num_batches = 4, 2, 2
        args.image_size = 32

    with tempfile.TemporaryDirectory() as tmp:
        if args.root is None or not Path(args.root).exists():
            # Clips as the documented pipeline leaves them: raw synthetic video re-encoded by
            # compress_videos (3 fps, 224 px short side, every frame a keyframe).
            dataset, root = "synthetic", Path(args.root or Path(tmp) / "root")
            raw = Path(tmp) / "raw"
            if args.smoke:
                make_synthetic(raw, args.num_clips, 0, size=64, fps=6, seconds=(2, 4))
            else:
                make_synthetic(raw, args.num_clips, 0, size=224, width=398, fps=10,
                               seconds=(10, 30))
            compressed = compress_videos(raw / "videos", root / "videos", fps=3,
                                     short_side=64 if args.smoke else 224,
                                     num_workers=os.cpu_count() or 1, progress=False)
            if compressed["failed"]:
                raise SystemExit(f"compressing the benchmark clips failed: {compressed['failed']}")
            for f in raw.iterdir():
                if f.is_file():
                    shutil.copy(f, root / f.name)
            source = ("synthetic 64x64 " if args.smoke else "synthetic 398x224 10-30 s ") + \
                "re-encoded by compress_videos (3 fps, all keyframes)"
        else:
            dataset, root, source = args.dataset, Path(args.root), str(args.root)
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
        ds = TrainDataset(split, _fake_tokenize, args.num_frames, args.image_size)
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, drop_last=False,
                            persistent_workers=args.workers > 0)
        clips, seconds = measure(loader, args.num_batches)

    rate = clips / seconds
    result = {
        "benchmark": "data",
        "clips_per_s": round(rate, 2),
        "clips_per_s_per_worker": round(rate / max(1, args.workers), 2),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "num_batches": args.num_batches,
        "num_frames": args.num_frames,
        "image_size": args.image_size,
        "source": source,
        "smoke": args.smoke,
        **environment("cpu"),
    }
    return report(result, args.out if args.out is not None or args.smoke else DEFAULT_OUT)


if __name__ == "__main__":
    main()
