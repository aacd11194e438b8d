"""Train the ``"distilled"`` first-stage summary head (dicosa/heads/summary.py) for the search
benchmark: generator clips of another seed than the benchmark's distractors (seed 1) and
test split, rendered straight to frames as ``benchmarks/search.py`` renders its distractors,
with one generated caption each; no labels are used, DiCoSA's own scores are the teacher.

Validation (``--val-videos``, 0 skips it) on **pseudo-queries**, never the test captions: a
gallery of generator clips of seed ``--val-seed`` (default 1, i.e. the benchmark's own
distractors) and 300 of their generated captions as queries; recall@10 of the exhaustive
DiCoSA top 10 within the top C of each summary by exact inner product.

    python benchmarks/summary_head.py --head WORK/summary-head.pt \\
        --checkpoint RUN/best.pt --val-videos 100000      # RUN: a synthetic-benchmark run
    python benchmarks/search.py --summaries distilled confidence \\
        --summary-head WORK/summary-head.pt
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, random_model, report, synthetic_checkpoint
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


def validate(model, head, count: int, seed: int, candidates: list[int]) -> dict:
    """recall@10 vs exhaustive on pseudo-queries (see the module), distilled vs confidence."""
    from dicosa.clip import get_tokenizer
    from dicosa.functional import video_proxy
    from dicosa.heads.summary import teacher_scores
    from dicosa.search.proxy import Summary

    videos, texts = render(model, count, seed)
    chosen = np.random.default_rng(123).choice(count, min(300, count), replace=False)
    tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
    with torch.inference_mode():
        text = model.encode_text(tokenizer([texts[i] for i in chosen])).text
    top10 = teacher_scores(model, text, videos).float().topk(10, dim=1).indices
    proxies = video_proxy(videos.frames.float(), videos.frame_mask).numpy()
    out = {"videos": count, "generator_seed": seed, "queries": len(chosen)}
    confidence = Summary(model, "confidence")
    confidence.calibrate(proxies)
    for name, summary, vids in (("distilled", Summary(model, "distilled", head=head), videos),
                                ("confidence", confidence, proxies)):
        with torch.inference_mode():
            vectors = np.concatenate([summary.videos(vids[i:i + 8192])
                                      for i in range(0, count, 8192)])
            scores = summary.queries(text).float() @ torch.from_numpy(vectors).t()
        out[name] = {}
        for c in candidates:
            found = scores.topk(min(c, count), dim=1).indices
            out[name][str(c)] = round(float(np.mean([
                len(set(a) & set(b)) / 10 for a, b in
                zip(top10.tolist(), found.tolist(), strict=True)])), 4)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="default: the synthetic benchmark's")
    p.add_argument("--work", default="/tmp/dicosa-search-bench")
    p.add_argument("--head", default=None, help="the head file to write (default: none)")
    p.add_argument("--videos", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=7, help="generator seed (1 = the distractors)")
    p.add_argument("--set", nargs="*", default=[], help="head config key=value")
    p.add_argument("--val-videos", type=int, default=20_000)
    p.add_argument("--val-seed", type=int, default=1)
    p.add_argument("--val-candidates", type=int, nargs="+",
                   default=[100, 300, 1000, 3000, 10000])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on random weights")
    p.add_argument("--out", default="benchmarks/results/summary_head.json")
    args = p.parse_args(argv)
    if args.seed == args.val_seed:
        raise SystemExit("training and validation clips must come from different seeds")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from dicosa.checkpoint import load
    from dicosa.clip import get_tokenizer
    from dicosa.heads.train import parse_head_overrides

    if args.smoke:
        torch.manual_seed(0)
        model, checkpoint = random_model("dicosa-tiny", "released", 4, max_words=16), "random"
        args.videos, args.val_videos, args.val_candidates = 300, 200, [10, 50]
        args.set += ["steps=5", "teacher_queries=50", "window=100", "shared_videos=64"]
    else:
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
    if args.head:
        save_head(head, args.head, model, head.trained)
    result = {"benchmark": "summary_head", **environment("cpu"),
              "threads": torch.get_num_threads(), "smoke": args.smoke,
              "head": args.head, "config": vars(config), "trained": head.trained,
              "validation": (validate(model, head, args.val_videos, args.val_seed,
                                      args.val_candidates) if args.val_videos else None)}
    return report(result, args.out)


if __name__ == "__main__":
    main()
