"""Train the ``"distilled"`` first-stage summary head (dicosa/heads/summary.py) for the search
benchmark: generator clips of another seed than the benchmark's distractors (seed 1) and
test split, rendered straight to frames as ``benchmarks/search.py`` renders its distractors,
with one generated caption each; no labels are used, DiCoSA's own scores are the teacher.

    python benchmarks/summary_head.py --out /work/artifacts/search-bench/summary-head.pt
    python benchmarks/search.py --summaries distilled confidence \\
        --summary-head /work/artifacts/search-bench/summary-head.pt
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
from common import synthetic_checkpoint
from search import BACKGROUNDS

from dicosa.heads import save_head
from dicosa.heads.summary import DistilledSummaryHead, fit_summary
from dicosa.model import VideoFeatures


def render(model, count: int, seed: int) -> tuple[VideoFeatures, list[str]]:
    """``count`` generator scenes (seed ``seed``) encoded by ``model``, and a caption each."""
    from dicosa.data.synthetic import caption_scene, render_clip, sample_scene
    from dicosa.data.video import sample_indices

    num, size = model.config.num_frames, model.image_size
    pick = sample_indices(8, num, False)
    out = np.zeros((count, num, model.embed_dim), np.float16)
    batch = np.zeros((256, num, 3, size, size), np.uint8)
    texts = []
    for start in range(0, count, 256):
        m = min(256, count - start)
        for j in range(m):
            rng = np.random.default_rng([seed, start + j])
            background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
            scene = sample_scene(rng)
            clip = render_clip(scene, 8, size, size, background, float(rng.choice([0.0, 6.0])),
                               int(rng.integers(2**31)))
            texts.append(caption_scene(scene, rng, 1)[0])
            batch[j] = clip[pick].transpose(0, 3, 1, 2)
        with torch.inference_mode():
            out[start:start + m] = model.encode_video(torch.from_numpy(batch[:m])).frames.half()
    frames = torch.from_numpy(out)
    return VideoFeatures(frames, torch.ones(frames.shape[:2], dtype=torch.bool)), texts


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="default: the synthetic benchmark's")
    p.add_argument("--work", default="/tmp/dicosa-search-bench")
    p.add_argument("--out", required=True)
    p.add_argument("--videos", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=7, help="generator seed (1 = the distractors)")
    p.add_argument("--set", nargs="*", default=[], help="head config key=value")
    args = p.parse_args(argv)
    if args.seed == 1:
        raise SystemExit("seed 1 renders the benchmark's own distractors; pick another")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from dicosa.checkpoint import load
    from dicosa.clip import get_tokenizer
    from dicosa.heads.train import parse_head_overrides

    checkpoint = (Path(args.checkpoint) if args.checkpoint else
                  synthetic_checkpoint(Path(args.work))[0])
    model, _ = load(checkpoint)
    model.eval().requires_grad_(False)
    started = time.perf_counter()
    videos, texts = render(model, args.videos, args.seed)
    tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
    config = DistilledSummaryHead.make_config(parse_head_overrides(args.set))
    rng = np.random.default_rng(args.seed)
    chosen = rng.choice(len(texts), min(config.teacher_queries, len(texts)), replace=False)
    with torch.inference_mode():
        text = model.encode_text(tokenizer([texts[i] for i in chosen])).text
    logging.info("rendered and encoded %d clips in %.0f s", len(videos),
                 time.perf_counter() - started)
    head = fit_summary(model, videos, text, config, seed=0)
    head.trained.update(generator_seed=args.seed, checkpoint=str(checkpoint))
    return save_head(head, args.out, model, head.trained)


if __name__ == "__main__":
    print(main())
