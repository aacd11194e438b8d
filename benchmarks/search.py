"""Two-stage search at scale: latency at 1M videos, quality at 100k against exhaustive DiCoSA.

Targets (issue 15), 2 CPU cores, C = 1,000 candidates: p50 <= 50 ms per query at 1,000,000
videos of ViT-B/32 size (D=512, N=12), resident memory <= 2 GiB plus the memory-mapped store,
recall@10 >= 0.95 of the two-stage top 10 against the exhaustive DiCoSA top 10.

Latency part (``--videos``): random-weight ViT-B/32 DiCoSA. Its text tower encodes
``--clusters`` synthetic captions; each video's 12 frames are one caption's vector (the
cluster, chosen uniformly) plus Gaussian noise of 0.5x the vector's per-dimension spread per
frame, plus a per-video offset of the same size (so videos of a cluster differ), and 1 in 4
videos have only 6 valid frames. They are written straight into the index (no decoding), shard
by shard. Queries are 200+ other captions of the same generator, one text per search, timed
end to end (text encoding, first stage, rerank, top-k) and per stage. Brute force is the
exhaustive DiCoSA.score path timed on the first ``--brute-videos`` (<= 50k) rows and
extrapolated linearly to ``--videos``.

Quality part (``--quality-videos``): the tiny DiCoSA trained on the synthetic benchmark
(``--checkpoint``, or ``benchmarks.common.synthetic_checkpoint``). The index holds the 100
test videos plus new clips of the same generator (other seeds: objects, colours, motions,
backgrounds and pixel noise sampled as the benchmark samples them), rendered to frames and
encoded by the trained model, so every video is a real encoding, not a perturbed copy. Every
test caption is a query; t2v R@1/R@5 count its own video among all of them.

Frames and text (``--frame-dtype``, ``--text-tower``): the indexes keep frames as float16 (the
default) or int8 with one scale per frame (docs/index-format.md), and queries are encoded by
the model's text tower, the packed CPU tower or its int8 variant (docs/serve.md). Either
option off its default adds to the quality part a reference: the exhaustive top 10 of an index
with the defaults (float16, the model's tower) over the same videos and captions, and every
ranking's overlap with it (``top10_vs_default_exhaustive``).

Backends (``--backend``, several compared in one run): the latency part reports, per backend,
the seconds the adds took (``ingest_s``) and the final save (``index_wait_s``: on a Milvus
server, flushing and then waiting until it has indexed and serves every row), search p50/p99,
and the dense stage's recall@10 against the exact top 10 over the same vectors, measured once
the index is saved (so indexed). For Milvus also the server's resident memory (``/proc``:
``--milvus-server`` starts a server for the run, with the ``milvus`` package's shipped
settings; or ``--uri`` plus ``--milvus-pid``). Each index gets its own collection
(``bench_latency_<videos>_<summary>``), dropped before and after the run.

    python benchmarks/search.py --videos 1000000 --quality-videos 100000   # the lead, alone
    python benchmarks/search.py --videos 100000 --quality-videos 100000    # under contention
    python benchmarks/search.py --videos 100000 --quality-videos 0 --backend local milvus \
        --milvus-server benchmarks/results/milvus-bench                        # local vs server
    python benchmarks/search.py --videos 100000 --quality-videos 100000 --frame-dtype int8 \
        --text-tower packed                                                   # the options
    python benchmarks/search.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, random_model, report, synthetic_checkpoint

from dicosa.index import VideoIndex
from dicosa.index.searcher import Searcher
from dicosa.model import DiCoSA, VideoFeatures

BACKGROUNDS = ((0, 0, 0), (30, 30, 30), (50, 50, 55), (25, 30, 20))  # the generator's RGB
WORDS = {
    "colour": ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"],
    "shape": ["circle", "square", "triangle", "cross", "star", "ring", "bar", "heart"],
    "motion": ["moves left", "moves right", "falls", "rises", "spins", "grows", "shrinks",
               "bounces"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=1_000_000, help="latency part: index size")
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--clusters", type=int, default=2000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--candidates", type=int, nargs="+", default=[1000],
                   help="C values timed (latency) and scored (quality)")
    p.add_argument("--brute-videos", type=int, default=50_000)
    p.add_argument("--brute-queries", type=int, default=5)
    p.add_argument("--backend", nargs="+", default=["local"],
                   help="first stage(s): local, exact, milvus; several: the latency part runs "
                        "for each in the same run, the quality part for the first")
    p.add_argument("--uri", default=None,
                   help="Milvus URI: http://host:19530 (a server), or a .db file (milvus-lite)")
    p.add_argument("--milvus-server", default=None, metavar="DIR",
                   help="start a Milvus standalone server (the milvus package, 2.3.5, shipped "
                        "settings) with its data in DIR for this run, and stop it at the end")
    p.add_argument("--milvus-pid", type=int, default=None,
                   help="the process id of the Milvus server at --uri, to read its memory")
    p.add_argument("--milvus-option", action="append", default=[], metavar="KEY=VALUE",
                   help="Milvus stage option, e.g. ef_search=128 or index_type=IVF_FLAT")
    p.add_argument("--recall-queries", type=int, default=50,
                   help="latency part: queries whose dense-stage top 10 is compared with the "
                        "exact top 10 over the same vectors")
    p.add_argument("--shard-size", type=int, default=8192)
    p.add_argument("--summary", default="confidence",
                   help="latency part: dense summary (confidence: 2D-vectors; mean: D; frames: "
                        "every frame's confidence summary as faiss IVF-PQ codes, the default "
                        "of an index without a distilled head; distilled)")
    p.add_argument("--stage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="first-stage option of the local backends, e.g. storage=sq8 (faiss "
                        "HNSW at 1 byte/dim)")
    p.add_argument("--quality-videos", type=int, default=100_000,
                   help="quality part: index size (0 skips it)")
    p.add_argument("--quality-candidates", type=int, nargs="+", default=[100, 300, 1000])
    p.add_argument("--summaries", nargs="+", default=["confidence", "mean"],
                   help="dense first-stage summaries compared (dicosa/search/proxy.py)")
    p.add_argument("--summary-head", default=None,
                   help="the trained head of the 'distilled' summary (benchmarks/summary_head."
                        "py); quality part: default the one --checkpoint carries "
                        "(best.summary.pt, fitted by train.py)")
    p.add_argument("--towers", choices=("text", "all"), default="text",
                   help="latency part: the model the searching index holds; 'text' drops "
                        "CLIP's image tower as a search process loads it")
    p.add_argument("--frame-dtype", choices=("float16", "int8"), default="float16",
                   help="how the indexes keep frames (int8: one scale per frame)")
    p.add_argument("--text-tower", choices=("float", "packed", "int8"), default="float",
                   help="how searches encode queries (dicosa.search.query_text)")
    p.add_argument("--checkpoint", default=None,
                   help="trained tiny DiCoSA (default: synthetic_checkpoint under --work)")
    p.add_argument("--work", default="benchmarks/results/search-bench",
                   help="where indexes and the trained model go (not the repository)")
    p.add_argument("--keep", action="store_true", help="keep the indexes after the run")
    p.add_argument("--reuse", action="store_true",
                   help="latency part: time the index a --keep run left under --work instead "
                        "of building it again (build_s is then null)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on random weights")
    p.add_argument("--out", default="benchmarks/results/search.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.arch, args.frames, args.videos, args.clusters = "dicosa-tiny", 4, 3000, 50
        args.queries, args.brute_videos, args.brute_queries = 20, 1000, 2
        args.candidates, args.quality_candidates = [100], [50, 200]
        args.quality_videos, args.shard_size = (2000 if args.quality_videos else 0), 512
        args.work, args.recall_queries = "search-bench-smoke", 10
    if "milvus" in args.backend and not (args.uri or args.milvus_server):
        p.error("--backend milvus needs --uri or --milvus-server")
    return args


def stage_options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = int(value) if value.isdigit() else value
    return out


def captions(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(["a", *(rng.choice(WORDS[k]) for k in ("colour", "shape", "motion"))])
            + (f" next to a {rng.choice(WORDS['colour'])} {rng.choice(WORDS['shape'])}"
               if rng.random() < 0.5 else "") for _ in range(count)]


def resident() -> dict[str, float]:
    """This process's resident memory in GiB: anonymous (heap, ANN index), file-backed (the
    mapped store pages, reclaimable), and the anonymous peak is not exposed, so VmHWM."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[name].split()[0]) / 2**20 for key, name in
            (("anon_gib", "RssAnon"), ("file_gib", "RssFile"), ("peak_gib", "VmHWM"))}


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


# -- Milvus -----------------------------------------------------------------------------------
class MilvusServerInfo:
    """A Milvus standalone server this run started (``--milvus-server DIR``), with the
    package's shipped settings: the test suite's helper (``tests/_milvus_server.py``), which
    also puts the embedded etcd on free ports."""

    def __init__(self, server) -> None:
        self.server = server

    @classmethod
    def start(cls, directory: str) -> MilvusServerInfo:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests._milvus_server import StandaloneServer

        started = time.perf_counter()
        # An absolute base folder: the embedded etcd fails to start on a relative one.
        info = cls(StandaloneServer(Path(directory).resolve(), fast=False).start())
        info.start_s = round(time.perf_counter() - started, 1)
        return info

    @property
    def uri(self) -> str:
        return self.server.uri

    @property
    def pid(self) -> int:
        return self.server.pid

    def describe(self) -> dict:
        import milvus

        return {"package": f"milvus {milvus.__version__}", "settings": "shipped",
                "data_dir": str(self.server.base_dir), "start_s": self.start_s}

    def stop(self) -> None:
        self.server.stop()


def server_memory(server: MilvusServerInfo | None, pid: int | None) -> dict | None:
    """The Milvus server process's resident memory in GiB (now and its peak), from /proc."""
    pid = server.pid if server else pid
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: round(int(fields[name].split()[0]) / 2**20, 3)
            for key, name in (("rss_gib", "VmRSS"), ("peak_gib", "VmHWM"))}


def drop_collection(uri: str, collection: str) -> None:
    """Drop a benchmark collection left by an earlier run (its index folder is gone)."""
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri)
    try:
        if client.has_collection(collection):
            client.drop_collection(collection)
    finally:
        client.close()


# -- latency ----------------------------------------------------------------------------------
def synthetic_shard(centres: torch.Tensor, count: int, frames: int,
                    rng: torch.Generator) -> VideoFeatures:
    """``count`` videos around random ``centres`` rows (see the module docstring)."""
    spread = centres.std(dim=1, keepdim=True).mean()  # per-dimension spread of the vectors
    cluster = torch.randint(len(centres), (count,), generator=rng)
    offset = torch.randn(count, 1, centres.shape[1], generator=rng) * 0.5 * spread
    noise = torch.randn(count, frames, centres.shape[1], generator=rng) * 0.5 * spread
    mask = torch.ones(count, frames, dtype=torch.bool)
    mask[torch.rand(count, generator=rng) < 0.25, frames // 2:] = False
    return VideoFeatures((centres[cluster, None] + offset + noise).half(), mask)


def timed_searches(index: VideoIndex, texts: list[str], candidates: int | None) -> dict:
    total, stages = [], []
    for text in texts:
        start = time.perf_counter()
        stats = index.query(text, k=10, candidates=candidates).times
        total.append(time.perf_counter() - start)
        stages.append(stats)
    ms = np.array(total) * 1000

    def median(key: str) -> float:
        return round(float(np.median([s[key] for s in stages])) * 1000, 2)

    return {"queries": len(texts), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "p50_ms_by_stage": {k: median(k) for k in ("encode_s", "first_stage_s", "rerank_s",
                                                       "hooks_s", "top_s")},
            "p50_ms_without_text_encoding": round(float(np.percentile(
                ms - np.array([s["encode_s"] for s in stages]) * 1000, 50)), 2)}


def build_latency_index(index: VideoIndex, centres: torch.Tensor, args,
                        directory: Path) -> tuple[float, float]:
    """Fill ``index`` with ``args.videos`` synthetic videos shard by shard into
    ``directory``; returns the seconds the adds took and those the final save took (on a
    Milvus server: flushing, then waiting until it has indexed and serves every row)."""
    index.save(fresh(directory))
    rng = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for first in range(0, args.videos, args.shard_size):
        count = min(args.shard_size, args.videos - first)
        index.add_features(synthetic_shard(centres, count, args.frames, rng),
                           [{"path": f"synthetic/{first + i}"} for i in range(count)])
    added = time.perf_counter()
    index.save(index.directory)
    return added - start, time.perf_counter() - added


def latency_head(model: DiCoSA, centres: torch.Tensor, args):
    """A ``distilled`` summary head for the latency part's random-weight model, fitted on
    other synthetic videos of the same generator: it gives the stage its real width and cost
    (the recall of a head distilled from a random model means nothing; see the quality part)."""
    from dicosa.heads.summary import DistilledSummaryHead, fit_summary

    count, queries = (256, 32) if args.smoke else (8192, 256)
    videos = synthetic_shard(centres, count, args.frames, torch.Generator().manual_seed(99))
    with torch.inference_mode():
        text = model.encode_text(index_tokenizer(model)(captions(queries, seed=20_000))).text
    config = DistilledSummaryHead.make_config({  # no cut videos: its recall is not the point
        "teacher_queries": queries, "window": count // 4, "shared_videos": min(2048, count // 2),
        "cuts_per_video": 0,
        **({"steps": 10, "hidden": 32} if args.smoke else {})})
    return fit_summary(model, videos, text.clone(), config, progress=False)


def index_tokenizer(model: DiCoSA):
    """The tokenizer a VideoIndex of ``model`` uses."""
    from dicosa.clip import get_tokenizer

    return get_tokenizer(model.config.arch, model.config.max_words)


def model_and_centres(arch: str, frames: int, clusters: int) -> tuple[DiCoSA, torch.Tensor]:
    """The random-weight model (seeded) and its text vectors of ``clusters`` synthetic
    captions: the centres the synthetic videos' frames are drawn around."""
    torch.manual_seed(0)
    model = random_model(arch, "released", frames).eval()
    tokenize = index_tokenizer(model)
    with torch.inference_mode():
        centres = torch.cat([model.encode_text(tokenize(captions(min(256, clusters - s),
                                                                  seed=s))).text
                             for s in range(0, clusters, 256)])
    return model, centres


def latency(args, work: Path, server: MilvusServerInfo | None) -> dict:
    """The latency part for every ``--backend`` (one result, or one per backend); the brute
    force reference is timed once, on the first."""
    model, centres = model_and_centres(args.arch, args.frames, args.clusters)
    head, head_s = args.summary_head, None  # one head for every backend of the run
    if args.summary == "distilled" and head is None and not args.reuse:
        started = time.perf_counter()
        head = latency_head(model, centres, args)
        head_s = round(time.perf_counter() - started, 1)
    results = {}
    for n, backend in enumerate(args.backend):
        results[backend] = latency_of(args, work, model, centres, backend, server, head,
                                      brute_force=n == 0)
        results[backend]["summary_head_fit_s"] = head_s
    return results[args.backend[0]] if len(args.backend) == 1 else results


def latency_of(args, work: Path, model: DiCoSA, centres: torch.Tensor, backend: str,
               server: MilvusServerInfo | None, head, brute_force: bool) -> dict:
    suffix = "" if args.summary == "confidence" else f"-{args.summary}"
    suffix += "" if args.frame_dtype == "float16" else f"-{args.frame_dtype}"
    directory = work / f"latency-{args.videos}{suffix}-{backend}"
    options, uri = stage_options(args.stage_option), None
    if backend == "milvus":
        uri = server.uri if server else args.uri
        options = {"collection": f"bench_latency_{args.videos}_{args.summary}",
                   **stage_options(args.milvus_option)}
    build, memory_after_build = None, None
    if not (args.reuse and (directory / "manifest.json").is_file()):
        if backend == "milvus":
            drop_collection(uri, options["collection"])
        index = VideoIndex(model, device="cpu", backend=backend, uri=uri,
                           summary=args.summary, summary_head=head, stage_options=options,
                           frame_dtype=args.frame_dtype)
        build = build_latency_index(index, centres, args, directory)
        memory_after_build = resident()
        del index
    if args.towers == "text":  # what a search process loads (checkpoint.load towers="text")
        from dicosa.checkpoint import drop_image_tower

        model = drop_image_tower(model)
        gc.collect()
    index = VideoIndex.load(directory, model, device="cpu")  # a fresh process's view
    index.configure_queries(args.text_tower)
    memory_loaded = resident()
    texts = captions(args.queries, seed=10_000)
    index.search(texts[0], k=10)  # warm-up
    runs = {str(c): timed_searches(index, texts, c) for c in args.candidates}
    memory_searched = resident()
    result = {
        "videos": len(index), "dim": model.embed_dim, "frames": args.frames,
        "backend": backend, "summary": args.summary, "towers": args.towers,
        "frame_dtype": index.store.frame_dtype, "text_tower": args.text_tower,
        "stage_options": options,
        "build_s": None if build is None else round(sum(build), 1), "reused": build is None,
        "ingest_s": None if build is None else round(build[0], 1),
        "index_wait_s": None if build is None else round(build[1], 1),
        "store_gib": round(sum(p.stat().st_size for p in directory.glob("shard-*"))
                           / 2**30, 2),
        "two_stage": runs,
        "first_stage_recall@10_vs_exact": first_stage_recall(index, texts[:args.recall_queries]),
        "memory_gib": {"after_build": memory_after_build, "after_load": memory_loaded,
                       "after_searches": memory_searched},
    }
    if backend == "milvus":
        result["milvus"] = {"uri": uri, "server": server.describe() if server else None,
                            "server_memory_gib": server_memory(server, args.milvus_pid)}
    if brute_force:
        result["brute_force"] = brute_force_ms(index, texts, args)
    if not args.keep:
        if backend == "milvus":
            drop_collection(uri, options["collection"])
        shutil.rmtree(directory)
    return result


@torch.inference_mode()
def exhaustive_scores(index: VideoIndex, texts: list[str]) -> torch.Tensor:
    """DiCoSA's S of every text with every live row, in id order: ``[T, R]``."""
    text = index.model.encode_text(index.tokenizer(texts).to(index.device))
    return Searcher(index.snapshot()).exhaustive(text, index.store.live(), 1024)


def brute_force_ms(index: VideoIndex, texts: list[str], args) -> dict:
    """Exhaustive DiCoSA.score on the first ``--brute-videos`` rows, extrapolated."""
    brute_videos = min(args.brute_videos, len(index))
    ids = index.ids[:brute_videos]
    times = []
    for text in texts[:args.brute_queries]:
        start = time.perf_counter()
        with torch.inference_mode():
            searcher = Searcher(index.snapshot())
            searcher.exhaustive(searcher.encode([text])[0].text, ids, chunk=1024)
        times.append(time.perf_counter() - start)
    brute_ms = float(np.median(times)) * 1000
    return {"measured_videos": brute_videos, "measured_p50_ms": round(brute_ms, 1),
            "extrapolated_ms_at_videos": round(brute_ms * len(index) / brute_videos, 1),
            "how": "exhaustive DiCoSA.score on the first measured_videos rows, "
                   "times videos / measured_videos (linear)"}


def first_stage_recall(index: VideoIndex, texts: list[str]) -> float | None:
    """|dense stage top 10 ∩ exact top 10| / 10 over ``texts``, the exact top 10 computed
    shard by shard from the stored videos (the stage's own vectors, recomputed)."""
    from dicosa.model import TextFeatures
    from dicosa.search.dense import ExactStage
    from dicosa.search.frames_stage import FramesStage
    from dicosa.search.types import EncodedQueries

    if not texts:
        return None
    summary = index.stages.summary()
    with torch.inference_mode():
        encoded = Searcher(index.snapshot()).encode(texts)[0]
        dense = EncodedQueries(encoded.queries, TextFeatures(summary.queries(encoded.text.text)),
                               encoded.extra)
    found = index.stages.dense_stage().search(dense, 10).ids
    best_ids = np.full((len(texts), 0), -1, np.int64)
    best_scores = np.full((len(texts), 0), -np.inf, np.float32)
    for ids, proxies in index.store.iter_proxies():
        exact = ExactStage(summary.dim, normalize=summary.normalize)
        if summary.per_frame:  # every frame exactly, a few thousand videos at a time
            exact = FramesStage(exact, index.store.num_frames)
            for start in range(0, len(ids), 2048):
                exact.add(ids[start:start + 2048],
                          index.stages.summary_vectors(ids[start:start + 2048]))
        else:
            exact.add(ids, index.stages.summary_vectors(ids, proxies))
        part = exact.search(dense, 10)
        best_ids = np.concatenate([best_ids, part.ids], axis=1)
        best_scores = np.concatenate([best_scores, part.scores], axis=1)
        order = np.argsort(-best_scores, axis=1, kind="stable")[:, :10]
        best_ids = np.take_along_axis(best_ids, order, 1)
        best_scores = np.take_along_axis(best_scores, order, 1)
    return round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in
                                zip(found, best_ids, strict=True)])), 4)


# -- quality ----------------------------------------------------------------------------------
def base_features(args, work: Path) -> tuple[DiCoSA, dict]:
    """The trained model and its encoded train/test splits (smoke: random weights, random
    features and captions)."""
    if args.smoke:
        torch.manual_seed(0)
        model = random_model("dicosa-tiny", "released", 4, max_words=16).eval()
        g = torch.Generator().manual_seed(2)
        make = lambda n: VideoFeatures(torch.randn(n, 4, model.embed_dim, generator=g),  # noqa: E731
                                       torch.ones(n, 4, dtype=torch.bool))
        test_captions = captions(20, seed=3)
        return model, {"test": make(20), "captions": test_captions,
                       "caption_video": torch.arange(20), "checkpoint": "random (smoke)"}
    from dicosa.checkpoint import load
    from dicosa.data.datasets import load_split
    from dicosa.data.protocol import FrameProtocol
    from dicosa.heads.features import split_features

    checkpoint = Path(args.checkpoint) if args.checkpoint else synthetic_checkpoint(work)[0]
    model, cfg = load(checkpoint)
    model.eval()
    cache = checkpoint.parent / "cache"
    test = split_features(model, load_split(cfg.data.dataset, cfg.data.root,
                                            cfg.data.test_split),
                          frames=FrameProtocol.of(cfg.data), cache_dir=cache)
    return model, {"test": test.video, "captions": test.captions,
                   "caption_video": test.caption_video, "checkpoint": str(checkpoint)}


def rendered_distractors(model: DiCoSA, count: int, work: Path, seed: int = 1) -> VideoFeatures:
    """``count`` new scenes of the synthetic benchmark's generator (objects, colours, motions
    and background noise sampled as it samples them, seed ``seed`` so none is a benchmark
    clip), rendered straight to frames (no mp4 round trip) and encoded by ``model``; cached
    under ``work``."""
    from dicosa.data.synthetic import render_clip, sample_scene
    from dicosa.data.video import sample_indices

    cache = work / f"rendered-{count}-{seed}-{model_fingerprint_short(model)}.npy"
    num = model.config.num_frames
    if cache.is_file():
        frames = torch.from_numpy(np.load(cache))
        return VideoFeatures(frames, torch.ones(frames.shape[:2], dtype=torch.bool))
    size, rendered = model.image_size, 8  # 8 rendered frames, N sampled as the loader does
    pick = sample_indices(rendered, num, False)
    out = np.zeros((count, num, model.embed_dim), np.float16)
    batch = np.zeros((256, num, 3, size, size), np.uint8)
    for start in range(0, count, 256):
        m = min(256, count - start)
        for j in range(m):
            rng = np.random.default_rng([seed, start + j])
            background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
            clip = render_clip(sample_scene(rng), rendered, size, size, background,
                               float(rng.choice([0.0, 6.0])), int(rng.integers(2**31)))
            batch[j] = clip[pick].transpose(0, 3, 1, 2)
        with torch.inference_mode():
            out[start:start + m] = model.encode_video(torch.from_numpy(batch[:m])).frames.half()
    np.save(cache, out)
    frames = torch.from_numpy(out)
    return VideoFeatures(frames, torch.ones(frames.shape[:2], dtype=torch.bool))


def model_fingerprint_short(model: DiCoSA) -> str:
    from dicosa.fingerprint import model_fingerprint

    return model_fingerprint(model)["weights_sha256"][:12]


def recall_at(ranked: list[list[int]], truth: list[int], k: int) -> float:
    return float(np.mean([t in r[:k] for r, t in zip(ranked, truth, strict=True)]))


def quality_index(args, work: Path, model: DiCoSA, test: VideoFeatures,
                  others: VideoFeatures, summary: str,
                  server: MilvusServerInfo | None, checkpoint: str,
                  frame_dtype: str | None = None) -> tuple[VideoIndex, np.ndarray]:
    backend, uri, options = args.backend[0], None, {}
    if backend == "milvus":
        uri = server.uri if server else args.uri
        options = {"collection": f"bench_quality_{args.quality_videos}_{summary}",
                   **stage_options(args.milvus_option)}
        drop_collection(uri, options["collection"])
    head = None
    if summary == "distilled":  # the given head, else the one the checkpoint carries
        from dicosa.heads.summary import carried_summary, summary_beside

        head = args.summary_head or carried_summary(checkpoint, model)
        if head is None:
            raise SystemExit(f"--summaries distilled: give --summary-head, or fit the "
                             f"checkpoint's own ({summary_beside(checkpoint)})")
    frame_dtype = frame_dtype or args.frame_dtype
    index = VideoIndex(model, device="cpu", backend=backend, uri=uri, stage_options=options,
                       summary=summary, summary_head=head, frame_dtype=frame_dtype)
    suffix = "" if frame_dtype == "float16" else f"-{frame_dtype}"
    index.save(fresh(work / f"quality-{args.quality_videos}-{summary}{suffix}"))
    test_ids = index.add_features(VideoFeatures(test.frames.half(), test.frame_mask),
                                  [{"path": f"test/{i}"} for i in range(len(test))])
    for first in range(0, len(others), args.shard_size):
        part = others[first:first + args.shard_size]
        index.add_features(part, [{"path": f"distractor/{first + i}"} for i in range(len(part))])
    index.save(index.directory)
    return index, test_ids


def quality(args, work: Path, server: MilvusServerInfo | None) -> dict:
    model, data = base_features(args, work)
    test = data["test"]
    extra = max(0, args.quality_videos - len(test))
    others = (rendered_distractors(model, extra, work) if not args.smoke else
              VideoFeatures(torch.randn(extra, 4, model.embed_dim).half(),
                            torch.ones(extra, 4, dtype=torch.bool)))
    texts = data["captions"]
    result = {"checkpoint": data["checkpoint"], "queries": len(texts), "two_stage": {},
              "frame_dtype": args.frame_dtype, "text_tower": args.text_tower}
    reference = None  # the defaults' exhaustive top 10, when an option is off its default
    if args.frame_dtype != "float16" or args.text_tower != "float":
        index, _ = quality_index(args, work, model, test, others, args.summaries[0], server,
                                 data["checkpoint"], frame_dtype="float16")
        reference = ranking(index, texts, None)
        drop_index(index, args)
    exhaustive = None
    for summary in args.summaries:
        index, test_ids = quality_index(args, work, model, test, others, summary, server,
                                        data["checkpoint"])
        index.configure_queries(args.text_tower)
        truth = test_ids[data["caption_video"].numpy()].tolist()
        if exhaustive is None:
            start = time.perf_counter()
            exhaustive = ranking(index, texts, None)
            result["videos"] = len(index)
            result["exhaustive"] = {"R@1": recall_at(exhaustive, truth, 1),
                                    "R@5": recall_at(exhaustive, truth, 5),
                                    "seconds_all_queries": round(time.perf_counter() - start, 1),
                                    **versus(reference, exhaustive)}
            # The 100 test videos alone: the clean benchmark figure, for reference.
            clean = exhaustive_scores(index, texts)[:, :len(test)].argsort(dim=1,
                                                                            descending=True)
            result["clean_test_only"] = {"R@1": recall_at(clean.tolist(), truth, 1),
                                         "R@5": recall_at(clean.tolist(), truth, 5)}
        rows = result["two_stage"][summary] = {}
        for c in args.quality_candidates:
            got = ranking(index, texts, c)
            rows[str(c)] = {"recall@10_vs_exhaustive": overlap(exhaustive, got),
                            "R@1": recall_at(got, truth, 1), "R@5": recall_at(got, truth, 5),
                            **versus(reference, got)}
        if not args.keep:
            drop_index(index, args)
    return result


def ranking(index: VideoIndex, texts: list[str], candidates: int | None) -> list[list[int]]:
    """The top 10 video ids of each text (25 texts per search call)."""
    hits = []
    for start in range(0, len(texts), 25):
        hits += index.search(texts[start:start + 25], k=10, candidates=candidates)
    return [[h.id for h in q] for q in hits]


def overlap(want: list[list[int]], got: list[list[int]]) -> float:
    """Mean |want ∩ got| / |want| over the queries."""
    return round(float(np.mean([len(set(a) & set(b)) / len(a) for a, b in
                                zip(want, got, strict=True)])), 4)


def versus(reference: list[list[int]] | None, got: list[list[int]]) -> dict:
    """``got``'s overlap with the defaults' exhaustive top 10, and the share of queries whose
    top 10 is the same set (nothing without a reference)."""
    if reference is None:
        return {}
    same = np.mean([set(a) == set(b) for a, b in zip(reference, got, strict=True)])
    return {"top10_vs_default_exhaustive": overlap(reference, got),
            "same_top10_as_default_exhaustive": round(float(same), 4)}


def drop_index(index: VideoIndex, args) -> None:
    if args.backend[0] == "milvus":
        drop_collection(index.stages.spec["uri"], index.stages.spec["options"]["collection"])
    shutil.rmtree(index.directory)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    server = MilvusServerInfo.start(args.milvus_server) if args.milvus_server else None
    try:
        result = {"benchmark": "search", **environment("cpu"),
                  "threads": torch.get_num_threads(), "smoke": args.smoke,
                  "latency": latency(args, work, server) if args.videos else None,
                  "quality": quality(args, work, server) if args.quality_videos else None}
    finally:
        if server is not None:
            server.stop()
    if args.smoke:
        shutil.rmtree(work, ignore_errors=True)
    return report(result, args.out)


if __name__ == "__main__":
    main()
