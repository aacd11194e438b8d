"""First stages that need no trained head: how much of DiCoSA's top 10 each keeps among its
top C, against the ``confidence`` default and the trained ``distilled`` summary.

A gallery of ``--videos`` generator clips (seed ``--seed``, rendered straight to frames and
encoded by the model, as ``benchmarks/search.py`` renders its distractors) and ``--queries``
of their generated captions as pseudo-queries. recall@10 = |exhaustive DiCoSA top 10 ∩ the
stage's top C| / 10, by exact inner products (no ANN), averaged over queries. Stages:

- ``mean``, ``confidence``: one vector per video (dicosa/search/proxy.py).
- ``frames``: the ``confidence`` summary of every frame (each frame treated as a video of one
  frame), a video scored by its best frame: the max over frames approximates the sharp
  text-conditioned pooling of Eq. 1, which the frame mean (τ → ∞) does not. N vectors per
  video.
- ``frames-pqB``: the same through faiss IVF-PQ codes (B = ``--pq`` bytes per frame), with the
  stage's ANN search over frames (``C × N`` frames, then the C best distinct videos): what it
  costs in recall to hold N vectors per video in memory at 1M.
- ``union``: C/2 candidates from ``confidence`` and the rest from ``frames`` (two stages).
- ``distilled``: the head carried beside ``--checkpoint`` (``best.summary.pt``), if any.

Memory figures are the stage vectors' bytes per video at the storage named in the row.

``--index-summaries frames confidence``: the same question through the real index path, as a
user gets it: a ``VideoIndex`` per summary with the default local backend and its default
settings (``frames``: faiss IVF-PQ over the frames once 40k frames are in), the clips added
shard by shard, recall@10 of ``index.search(k=10, candidates=C)`` against
``index.search(candidates=None)`` (exhaustive DiCoSA), over the same queries.

    python benchmarks/free_first_stage.py --checkpoint runs/synthetic/best.pt --videos 20000
    python benchmarks/free_first_stage.py --zero-shot --videos 20000   # random-weight CLIP
    python benchmarks/free_first_stage.py --zero-shot --index-summaries frames confidence
    python benchmarks/free_first_stage.py --smoke
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, report
from summary_head import render

from dicosa.fingerprint import model_fingerprint
from dicosa.functional import video_proxy
from dicosa.heads.summary import carried_summary, teacher_scores
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.search.proxy import Summary


def cached_render(model: DiCoSA, count: int, seed: int, work: Path
                  ) -> tuple[VideoFeatures, list[str]]:
    """:func:`summary_head.render`, kept under ``work`` for the next run of the same model."""
    key = f"{model_fingerprint(model)['weights_sha256'][:12]}-{count}-{seed}"
    frames, texts = work / f"frames-{key}.npy", work / f"captions-{key}.json"
    if frames.is_file() and texts.is_file():
        stored = torch.from_numpy(np.load(frames))
        return (VideoFeatures(stored, torch.ones(stored.shape[:2], dtype=torch.bool)),
                json.loads(texts.read_text()))
    video, captions = render(model, count, seed)
    work.mkdir(parents=True, exist_ok=True)
    np.save(frames, video.frames.numpy())
    texts.write_text(json.dumps(captions))
    return video, captions


def frame_vectors(summary: Summary, video: VideoFeatures) -> np.ndarray:
    """``[V, N, dim]``: the summary of every frame as a video of its own."""
    count, num, width = video.frames.shape
    flat = video.frames.float().reshape(-1, width).numpy()
    out = np.concatenate([summary.videos(flat[i:i + 65536]) for i in range(0, len(flat), 65536)])
    return out.reshape(count, num, -1)


def best_frame_scores(queries: torch.Tensor, frames: np.ndarray,
                      mask: torch.Tensor) -> torch.Tensor:
    """``[Q, V]``: each video's best frame for each query."""
    scores = torch.einsum("qd,vnd->qvn", queries.float(), torch.from_numpy(frames))
    return scores.masked_fill(~mask[None], float("-inf")).amax(-1)


def pq_candidates(queries: np.ndarray, frames: np.ndarray, mask: np.ndarray, c: int,
                  code_bytes: int) -> list[list[int]]:
    """The C best distinct videos of a faiss IVF-PQ search over the valid frames."""
    import faiss

    count, num, dim = frames.shape
    owner = np.repeat(np.arange(count), num)[mask.reshape(-1)]
    vectors = np.ascontiguousarray(frames.reshape(-1, dim)[mask.reshape(-1)], np.float32)
    lists = max(1, int(4 * np.sqrt(len(vectors))))
    index = faiss.index_factory(dim, f"IVF{lists},PQ{code_bytes}", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors[np.random.default_rng(0).choice(len(vectors),
                                                        min(len(vectors), 100 * lists),
                                                        replace=False)])
    index.add(vectors)
    index.nprobe = max(1, lists // 8)
    _, found = index.search(np.ascontiguousarray(queries, np.float32), c * num)
    out = []
    for row in found:
        videos = owner[row[row >= 0]]
        _, first = np.unique(videos, return_index=True)
        out.append(videos[np.sort(first)][:c].tolist())
    return out


def recall(found: list[list[int]], truth: torch.Tensor) -> float:
    return round(float(np.mean([len(set(f) & set(t)) / 10
                                for f, t in zip(found, truth.tolist(), strict=True)])), 4)


def evaluate(model: DiCoSA, video: VideoFeatures, text: torch.Tensor, candidates: list[int],
             head, pq_bytes: list[int]) -> dict:
    truth = teacher_scores(model, text, video).float().topk(10, dim=1).indices  # [Q, 10]
    proxies = video_proxy(video.frames.float(), video.frame_mask).numpy()
    conf = Summary(model, "confidence")
    conf.calibrate(proxies)
    mean = Summary(model, "mean")
    with torch.inference_mode():
        scores = {"mean": torch.nn.functional.normalize(text.float(), dim=-1)
                  @ torch.nn.functional.normalize(torch.from_numpy(proxies), dim=-1).T,
                  "confidence": conf.queries(text).float() @ torch.from_numpy(
                      conf.videos(proxies)).T}
        frames = frame_vectors(conf, video)
        conf_queries = conf.queries(text).float()
        scores["frames"] = best_frame_scores(conf_queries, frames, video.frame_mask)
        if head is not None:
            distilled = Summary(model, "distilled", head=head)
            scores["distilled"] = distilled.queries(text).float() @ torch.from_numpy(
                distilled.videos(video)).T
    dim = conf.dim
    out = {"bytes_per_video": {"mean": model.embed_dim, "confidence": dim,
                               "frames": video.frames.shape[1] * dim,
                               **{f"frames-pq{b}": video.frames.shape[1] * b
                                  for b in pq_bytes},
                               "union": dim + video.frames.shape[1] * dim},
           "storage": "1 byte per dimension (SQ8), PQ codes for frames-pq"}
    del mean
    for c in candidates:
        row = {name: recall(s.topk(min(c, s.shape[1]), dim=1).indices.tolist(), truth)
               for name, s in scores.items()}
        half = c // 2
        conf_top = scores["confidence"].topk(half, dim=1).indices.tolist()
        frame_rank = scores["frames"].argsort(dim=1, descending=True).tolist()
        union = []
        for a, ranked in zip(conf_top, frame_rank, strict=True):
            seen = set(a)
            union.append(a + [v for v in ranked if v not in seen][:c - half])
        row["union"] = recall(union, truth)
        for b in pq_bytes:
            row[f"frames-pq{b}"] = recall(pq_candidates(conf_queries.numpy(), frames,
                                                        video.frame_mask.numpy(), c, b), truth)
        out[str(c)] = row
    return out


def index_recall(model: DiCoSA, video: VideoFeatures, texts: list[str], summaries: list[str],
                 candidates: list[int]) -> dict:
    """recall@10 against exhaustive DiCoSA through ``VideoIndex`` (see the module)."""
    from dicosa.index import VideoIndex

    out, exhaustive = {}, None
    for summary in summaries:
        started = time.perf_counter()
        index = VideoIndex(model, device="cpu", summary=summary)
        for first in range(0, len(video.frames), 4096):
            part = slice(first, first + 4096)
            index.add_features(VideoFeatures(video.frames[part].half(), video.frame_mask[part]),
                               [{"path": f"clip/{first + i}"}
                                for i in range(len(video.frames[part]))])

        def top(c, index=index):
            return [[h.id for h in hits] for start in range(0, len(texts), 50)
                    for hits in index.search(texts[start:start + 50], k=10, candidates=c)]

        exhaustive = exhaustive or top(None)
        stage = getattr(index.stages.dense_stage(), "inner", index.stages.dense_stage())
        trained = getattr(getattr(stage, "index", None), "is_trained", None)
        row = {"options": index.stages.spec["options"], "stage": type(stage).__name__,
               "faiss_trained": trained}
        for c in candidates:
            got = top(c)
            row[str(c)] = round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in
                                               zip(got, exhaustive, strict=True)])), 4)
        row["seconds"] = round(time.perf_counter() - started, 1)
        out[summary] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a trained tiny DiCoSA (its best.summary.pt is used)")
    p.add_argument("--zero-shot", action="store_true",
                   help="the zero-shot preset on the random-weight tiny CLIP instead")
    p.add_argument("--videos", type=int, default=20_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--candidates", type=int, nargs="+", default=[30, 100, 200, 1000])
    p.add_argument("--pq", type=int, nargs="+", default=[16],
                   help="frames-pqB rows: B code bytes per frame")
    p.add_argument("--index-summaries", nargs="*", default=[],
                   help="also measure these summaries through VideoIndex (default settings)")
    p.add_argument("--index-only", action="store_true",
                   help="only the --index-summaries part (skip the exact-inner-product rows)")
    p.add_argument("--work", default="/tmp/dicosa-free-first-stage",
                   help="rendered clips are kept here for the next run (not the repository)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="benchmarks/results/free_first_stage.json")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    head, source = None, args.checkpoint
    if args.smoke or args.zero_shot:
        from dicosa.clip import TINY_ARCH
        from dicosa.config import ModelConfig, model_preset

        torch.manual_seed(0)
        config = (model_preset("zero-shot", arch=TINY_ARCH, pretrained=None, num_frames=4)
                  if args.zero_shot else
                  ModelConfig(arch=TINY_ARCH, pretrained=None, temporal_layers=2, num_frames=4,
                              max_words=16))
        model = DiCoSA.from_config(config).eval()
        source = "zero-shot preset, random tiny CLIP" if args.zero_shot else "random (smoke)"
        if args.smoke:
            args.videos, args.queries, args.candidates = 600, 20, [30, 100]
    else:
        from dicosa.checkpoint import load

        model, _ = load(args.checkpoint)
        head = carried_summary(args.checkpoint, model)
    model.requires_grad_(False)
    started = time.perf_counter()
    video, captions = cached_render(model, args.videos, args.seed, Path(args.work))
    chosen = np.random.default_rng(123).choice(args.videos, min(args.queries, args.videos),
                                               replace=False)
    from dicosa.clip import get_tokenizer

    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    queries = [captions[i] for i in chosen]
    with torch.inference_mode():
        text = model.encode_text(tokenize(queries)).text
    rendered = time.perf_counter() - started
    result = {"benchmark": "free_first_stage", **environment("cpu"), "model": str(source),
              "videos": args.videos, "queries": len(chosen), "generator_seed": args.seed,
              "render_s": round(rendered, 1)}
    if not args.index_only:
        result["recall@10_vs_exhaustive"] = evaluate(model, video, text, args.candidates, head,
                                                     args.pq)
    if args.index_summaries:
        result["index_recall@10_vs_exhaustive"] = index_recall(
            model, video, queries, args.index_summaries, args.candidates)
    return report(result, args.out)


if __name__ == "__main__":
    main()
