"""Search inside long videos at scale: 1,000 hours of video (3.6M frames at 1 frame/s).

Issue 31's target, 2 CPU cores, one query at a time, C = 1,000 candidate rows: p50 <= 100 ms
per query at 1,000 hours of ViT-B/32-sized features (D = 512, N = 12), the search process
<= 2 GiB of anonymous memory plus the memory-mapped store.

The collection is synthesised as ``benchmarks/search.py`` synthesises videos (random-weight
ViT-B/32 DiCoSA; its text tower encodes ``--clusters`` captions, the cluster centres), but as
the runs an index with segments stores: ``--hours`` of videos of ``--video-minutes`` each, at
1 frame/s, cut into shots of 1-20 s (exponential, mean ``--mean-shot`` s); a shot's frames
are one cluster's centre plus a per-shot offset plus per-frame noise (each 0.5x the centres'
spread), so the shots of one video differ and their frames vary. Rows are what the index
makes of them (``dicosa.data.segments``: a shot of <= N frames is one segment, a longer one
windows of N every N/2), written straight into the index (no decoding) video by video.

The dense stage is the ``distilled`` summary (one vector per row, the kind ``train.py``
carries; fitted here on other synthetic runs, so its recall means nothing: see
``benchmarks/search.py``'s quality part) on the default faiss backend. Timed: 200 queries of
the same caption generator, end to end (text tower, first stage, DiCoSA rerank, videos and
their moments) and per stage, in a fresh process's view of the index (``--reuse``).

    python benchmarks/search_long.py --hours 1000 --keep --work W   # build, then time
    python benchmarks/search_long.py --hours 1000 --reuse --work W  # time again, fresh
    python benchmarks/search_long.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, report
from search import captions, latency_head, model_and_centres, resident, timed_searches

from dicosa.data.segments import SegmentPolicy, segment_run, segment_spans
from dicosa.index import VideoIndex
from dicosa.search.shards import VideoRun


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=1000.0)
    p.add_argument("--video-minutes", type=float, default=60.0)
    p.add_argument("--mean-shot", type=float, default=6.0, help="seconds")
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--frames", type=int, default=12, help="N, frames per segment at most")
    p.add_argument("--clusters", type=int, default=2000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--videos-per-shard", type=int, default=16)
    p.add_argument("--work", default="benchmarks/results/search-long")
    p.add_argument("--keep", action="store_true", help="keep the index after the run")
    p.add_argument("--reuse", action="store_true", help="time the index a --keep run left")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the tiny model")
    p.add_argument("--out", default="benchmarks/results/search_long.json")
    args = p.parse_args()
    if args.smoke:
        args.hours, args.video_minutes, args.arch, args.frames = 0.5, 5.0, "dicosa-tiny", 4
        args.clusters, args.queries, args.work = 50, 10, "search-long-smoke"
    return args


def synthetic_run(centres: torch.Tensor, seconds: int, policy: SegmentPolicy,
                  mean_shot: float, rng: np.random.Generator, name: str) -> VideoRun:
    """One video's run at 1 frame/s: shots of cluster frames (module docstring)."""
    lengths = []
    while sum(lengths) < seconds:
        lengths.append(int(np.clip(rng.exponential(mean_shot), 1, 20)))
    lengths[-1] -= sum(lengths) - seconds
    lengths = [n for n in lengths if n > 0]
    spread = float(centres.std(dim=1).mean())
    shots, frames, first = [], [], 0
    for n in lengths:
        base = centres[int(rng.integers(len(centres)))].numpy()
        offset = rng.normal(0, 0.5 * spread, centres.shape[1])
        frames.append(base + offset + rng.normal(0, 0.5 * spread, (n, centres.shape[1])))
        shots.append((first, first + n))
        first += n
    times = np.arange(seconds, dtype=np.float64)
    segments = segment_run(shots, policy.window, policy.step)
    spans = segment_spans(segments, times, 1.0, float(seconds))
    return VideoRun(np.concatenate(frames).astype(np.float16), np.ones(seconds, bool),
                    times.astype(np.float32), segments, spans.astype(np.float32),
                    {"path": name, "duration": float(seconds), "fps": 25.0,
                     "num_frames": 25 * seconds, "valid_frames": seconds})


def add_long_videos(index: VideoIndex, centres: torch.Tensor, hours: float,
                    video_minutes: float, mean_shot: float, per_shard: int = 16) -> int:
    """``hours`` of synthetic videos of ``video_minutes`` each (:func:`synthetic_run`, seeded)
    added to ``index`` as runs cut by its segment policy, ``per_shard`` videos a shard;
    returns how many videos."""
    seconds = round(video_minutes * 60)
    videos = max(1, round(hours * 3600 / seconds))
    rng = np.random.default_rng(1)
    pad = np.zeros(index.model.embed_dim, np.float16)
    for first in range(0, videos, per_shard):
        index.add_runs([synthetic_run(centres, seconds, index.segments, mean_shot, rng,
                                      f"synthetic/long{first + i}.mp4")
                        for i in range(min(per_shard, videos - first))], pad)
    return videos


def build(args, model, centres: torch.Tensor, directory: Path, head) -> dict:
    policy = SegmentPolicy(window=args.frames)
    index = VideoIndex(model, device="cpu", summary="distilled", summary_head=head,
                       segments=policy)
    index.save(directory)
    started = time.perf_counter()
    videos = add_long_videos(index, centres, args.hours, args.video_minutes, args.mean_shot,
                             args.videos_per_shard)
    added = time.perf_counter()
    index.save(directory)
    return {"videos": videos, "ingest_s": round(added - started, 1),
            "index_wait_s": round(time.perf_counter() - added, 1),
            "memory_after_build_gib": resident()}


def main() -> None:
    args = parse_args()
    model, centres = model_and_centres(args.arch, args.frames, args.clusters)
    work = Path(args.work)
    directory = work / f"long-{args.hours:g}h"
    built = None
    if not (args.reuse and (directory / "manifest.json").is_file()):
        if directory.exists():
            shutil.rmtree(directory)
        head = latency_head(model, centres, _HeadArgs(args.frames, args.smoke))
        built = build(args, model, centres, directory, head)
    from dicosa.checkpoint import drop_image_tower

    model = drop_image_tower(model)  # what a search process loads
    gc.collect()
    index = VideoIndex.load(directory, model, device="cpu")
    memory_loaded = resident()
    texts = captions(args.queries, seed=10_000)
    index.search(texts[0], k=10)  # warm-up
    timed = timed_searches(index, texts, args.candidates)
    frames = sum(len(s.frames) for s in index.store.shards)
    result = {
        "benchmark": "search_long", "hours": args.hours, "videos": len(index),
        "rows": len(index.store), "frames": frames, "dim": model.embed_dim, "N": args.frames,
        "mean_shot_s": args.mean_shot, "summary": "distilled", "backend": "local",
        "candidates": args.candidates, "build": built, "reused": built is None,
        "store_gib": round(sum(p.stat().st_size for p in directory.glob("shard-*"))
                           / 2**30, 2),
        "search": timed,
        "memory_gib": {"after_load": memory_loaded, "after_searches": resident()},
        "targets": {"p50_ms": 100, "anon_gib": 2.0},
        **environment("cpu"),
    }
    report(result, args.out)
    if not args.keep:
        shutil.rmtree(directory)


class _HeadArgs:
    """What ``search.latency_head`` reads of the arguments."""

    def __init__(self, frames: int, smoke: bool):
        self.frames, self.smoke = frames, smoke


if __name__ == "__main__":
    main()
