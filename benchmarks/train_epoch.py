"""Throughput of the full training loop (data loader + model + optimiser) on synthetic data.

Runs ``dicosa.training.train`` for a fixed number of steps on the synthetic benchmark and
reads steps/s, clips/s and the data/step time split from its ``log.jsonl`` (the first
logged window, with start-up and warm-up, is left out). Prints and writes JSON.

    python benchmarks/train_epoch.py                          # tiny model on CPU
    python benchmarks/train_epoch.py --arch ViT-B-32 --device cuda --batch 128 --frames 12
    python benchmarks/train_epoch.py --smoke                  # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import torch
from common import environment, report

from dicosa.clip import TINY_ARCH, clip_dims, load_clip
from dicosa.config import config_from_dict
from dicosa.data.synthetic import make_synthetic
from dicosa.training import read_log, train


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default=TINY_ARCH)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--words", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log-every", type=int, default=10, help="steps per timing window")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers (default: 0 on CPU, where a worker only competes "
                        "with the model for cores; 8 on CUDA)")
    p.add_argument("--videos", type=int, default=300, help="synthetic training clips")
    p.add_argument("--data", type=Path, help="an existing synthetic benchmark (else generated)")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, a few steps")
    p.add_argument("--out", default="benchmarks/results/train_epoch.json")
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = 8 if args.device == "cuda" else 0
    if args.smoke:
        # Two timing windows (the first, with the warm-up, is left out of the figures).
        args.arch, args.device, args.batch, args.frames = TINY_ARCH, "cpu", 4, 4
        args.steps, args.log_every, args.videos, args.workers = 4, 2, 8, 0
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.device == "cpu":
        # Accelerate picks the GPU whenever there is one; this keeps the run on the CPU.
        os.environ["ACCELERATE_USE_CPU"] = "true"
    image_size = clip_dims(load_clip(args.arch, None))["image_size"]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            start = time.perf_counter()
            root = make_synthetic(Path(tmp) / "data", num_train=args.videos, num_test=10,
                                  size=image_size, seconds=1.0, fps=8)
            print(f"generated {args.videos} clips at {image_size} px in "
                  f"{time.perf_counter() - start:.1f} s")
        cfg = config_from_dict({
            "model": {"arch": args.arch, "pretrained": None, "num_frames": args.frames,
                      "max_words": args.words,
                      "temporal_layers": 2 if args.arch == TINY_ARCH else 4},
            "data": {"dataset": "synthetic", "root": str(root), "train_split": "train",
                     "test_split": "test", "val_fraction": 0.0, "num_workers": args.workers},
            "train": {"batch_size": args.batch, "epochs": 10_000, "max_steps": args.steps,
                      "output_dir": str(Path(tmp) / "run"), "log_every": args.log_every,
                      "mixed_precision": "auto",
                      # The first-stage summary is fitted after the loop, outside the figures:
                      # only the smoke fits it (in a few steps), to keep that path run.
                      "fit_summary": args.smoke,
                      **({"summary_options": ["steps=40"]} if args.smoke else {})},
        })
        start = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - start
        records = read_log(Path(tmp) / "run" / "log.jsonl")
    timed = records[1:] or records
    steps = len(timed) * args.log_every
    step_s = sum(r["data_time"] + r["step_time"] for r in timed) * args.log_every
    result = {
        "benchmark": "train_epoch",
        "arch": args.arch,
        "cpu_threads": torch.get_num_threads(),
        "batch": args.batch,
        "frames": args.frames,
        "words": args.words,
        "image_size": image_size,
        "workers": args.workers,
        "timed_steps": steps,
        "steps_per_s": steps / step_s,
        "clips_per_s": sum(r["clips_per_s"] for r in timed) / len(timed),
        "data_time_s": sum(r["data_time"] for r in timed) / len(timed),
        "step_time_s": sum(r["step_time"] for r in timed) / len(timed),
        "peak_memory_mib": max(r["peak_memory_mib"] for r in records),
        "total_wall_s": wall,
        **environment(args.device),
        "config": dataclasses.asdict(cfg.train),
    }
    return report(result, args.out)


if __name__ == "__main__":
    main()
