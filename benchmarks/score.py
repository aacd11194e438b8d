"""Scoring throughput: S for 1,000 texts × 1,000 videos from cached features.

Target (issue 3) on one H100: <= 10 ms (the released code: 1.85 s with its default chunking,
49 ms at best). Features are random, at ViT-B/32 width (D=512, 12 frames, K=8).

    python benchmarks/score.py --device cuda
    python benchmarks/score.py --smoke               # tiny model on CPU, seconds
"""

from __future__ import annotations

import argparse
import time

import torch
from common import environment, random_model, report

from dicosa.model import TextFeatures, VideoFeatures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--variant", default="released", choices=["released", "paper"])
    p.add_argument("--texts", type=int, default=1000)
    p.add_argument("--videos", type=int, default=1000)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--chunk", type=int, default=None, help="texts per block (default: all)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--eager", action="store_true",
                   help="no torch.compile (compiled is the default on CUDA)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU")
    p.add_argument("--out", default="benchmarks/results/score.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.arch, args.device, args.frames = "dicosa-tiny", "cpu", 4
        args.texts = args.videos = 64
        args.repeats, args.dtype = 2, "float32"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    model = random_model(args.arch, args.variant, args.frames).to(device).eval()
    compiled = device.type == "cuda" and not args.eager
    if compiled:
        model.compile_scoring(dynamic=False)
    dtype = getattr(torch, args.dtype)
    model.head.to(dtype)
    dim = model.embed_dim
    text = TextFeatures(torch.randn(args.texts, dim, device=device, dtype=dtype))
    video = VideoFeatures(torch.randn(args.videos, args.frames, dim, device=device, dtype=dtype),
                          torch.ones(args.videos, args.frames, dtype=torch.bool, device=device))

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.score(text, video, chunk=args.chunk)

    reference = run()  # warm-up (and kernel selection)
    times = []
    for _ in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    # fp32 on the same features tells how much the reduced precision moves the scores.
    model.head.float()
    with torch.inference_mode():
        exact = model.score(TextFeatures(text.text.float()),
                            VideoFeatures(video.frames.float(), video.frame_mask),
                            chunk=args.chunk)
    result = {
        "benchmark": "score",
        "arch": args.arch,
        "variant": args.variant,
        "texts": args.texts,
        "videos": args.videos,
        "frames": args.frames,
        "chunk": args.chunk,
        "dtype": args.dtype,
        "compile": compiled,
        "median_ms": 1000 * times[len(times) // 2],
        "min_ms": 1000 * times[0],
        "max_abs_diff_vs_fp32": float((out.float() - exact).abs().max()),
        "same_as_first_call": bool(torch.equal(out, reference)),
        "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                            if device.type == "cuda" else None),
        **environment(device),
    }
    return report(result, args.out)


if __name__ == "__main__":
    main()
