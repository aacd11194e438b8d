"""Training-step throughput: random weights, random clips, one optimiser step per iteration.

Prints and writes a JSON result with clips/s and peak GPU memory. Targets (issue 3), one H100,
ViT-B/32, 12 frames of 224 px, 32 words, B=128:
  fast mode (default)   >= 650 clips/s, peak memory < 33.8 GiB
  memory mode           <= 12 GiB, >= 520 clips/s
The released implementation measures 327 clips/s and 33.8 GiB under the same conditions.

    python benchmarks/train_step.py --device cuda --batch 128          # compiled
    python benchmarks/train_step.py --device cuda --batch 128 --memory # + checkpointing
    python benchmarks/train_step.py --smoke          # tiny model on CPU, seconds
"""

from __future__ import annotations

import argparse
import time

import torch
from common import environment, random_model, report

from dicosa.config import TrainConfig
from dicosa.optim import build_optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--variant", default="released", choices=["released", "paper"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--words", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--memory", action="store_true", help="gradient checkpointing (memory mode)")
    p.add_argument("--eager", action="store_true",
                   help="no torch.compile (compiled is the default on CUDA)")
    p.add_argument("--no-bf16", action="store_true", help="fp32 (no autocast)")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, 2 steps")
    p.add_argument("--out", default="benchmarks/results/train_step.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.arch, args.device, args.batch, args.frames, args.words = "dicosa-tiny", "cpu", 4, 4, 16
        args.steps, args.warmup = 2, 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    model = random_model(args.arch, args.variant, args.frames, args.words,
                         grad_checkpointing=args.memory).to(device).train()
    compiled = device.type == "cuda" and not args.eager
    if compiled:
        model.compile_towers()
    optimizer = build_optimizer(model, TrainConfig())
    use_bf16 = device.type == "cuda" and not args.no_bf16

    size = model.image_size
    frames = torch.randint(0, 256, (args.batch, args.frames, 3, size, size), dtype=torch.uint8,
                           device=device)
    tokens = torch.randint(1, 49000, (args.batch, args.words), device=device)
    tokens[:, -1] = 49407  # EOT
    batch = {"tokens": tokens, "frames": frames,
             "frame_mask": torch.ones(args.batch, args.frames, dtype=torch.bool, device=device)}

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    result = {
        "benchmark": "train_step",
        "arch": args.arch,
        "variant": args.variant,
        "mode": "memory" if args.memory else "fast",
        "compile": compiled,
        "bf16": use_bf16,
        "batch": args.batch,
        "frames": args.frames,
        "words": args.words,
        "image_size": size,
        "steps": args.steps,
        "step_ms": 1000 * elapsed / args.steps,
        "clips_per_s": args.batch * args.steps / elapsed,
        "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                            if device.type == "cuda" else None),
        "final_loss": float(loss),
        **environment(device),
    }
    return report(result, args.out)


if __name__ == "__main__":
    main()
