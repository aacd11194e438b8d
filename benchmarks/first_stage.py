"""First stages alone: build time, index size, single-query latency and recall@C against the
exact stage, per backend (``dicosa.search.backends``).

Vectors are synthetic dense proxies: a Gaussian mixture (``--clusters`` random centres, unit
noise at ``--spread``), L2-normalised by the stages; queries are drawn from the same mixture.
Recall@C is |ANN top-C ∩ exact top-C| / C (and the same at 10), averaged over queries. Index
size is the saved faiss file (what the index holds in RAM), also given per vector and scaled to
1M vectors, the issue's target.

    python benchmarks/first_stage.py --n 100000                    # hnsw-fp16, hnsw-sq8, ivfpq
    python benchmarks/first_stage.py --n 20000 --backends milvus   # milvus-lite
    python benchmarks/first_stage.py --smoke
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, report

from dicosa.model import TextFeatures
from dicosa.search.backends import make_first_stage
from dicosa.search.query import parse_query
from dicosa.search.types import EncodedQueries

# name -> (backend, options)
BACKENDS = {
    "exact": ("exact", {}),
    "hnsw-fp16": ("faiss", {"storage": "fp16"}),
    "hnsw-sq8": ("faiss", {"storage": "sq8"}),
    "hnsw-flat": ("faiss", {"storage": "flat"}),
    "ivfpq": ("faiss", {"index": "ivfpq"}),
    "milvus": ("milvus", {}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="vectors in the collection")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--spread", type=float, default=0.5, help="noise scale around a centre")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--candidates", type=int, default=1000, help="C, the first stage's k")
    p.add_argument("--backends", default="hnsw-fp16,hnsw-sq8,ivfpq",
                   help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--ef-sweep", default="",
                   help="also search HNSW stages at these efSearch values, e.g. 1000,2000 "
                        "(one build; efSearch is raised to C anyway)")
    p.add_argument("--nlist", type=int, default=None, help="IVF lists (default: 4·√n)")
    p.add_argument("--nprobe", type=int, default=None)
    p.add_argument("--milvus-insert-bytes", type=int, default=None,
                   help="vector bytes per Milvus insert call (default: MilvusConfig's 2 MiB)")
    p.add_argument("--milvus-index", default=None, help="Milvus index_type (default: FLAT on "
                   "milvus-lite)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, every local backend")
    p.add_argument("--out", default="benchmarks/results/first_stage.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.n, args.dim, args.clusters, args.queries, args.candidates = 3000, 64, 50, 20, 100
        args.backends, args.ef_sweep = "exact,hnsw-fp16,hnsw-sq8,ivfpq", "200"
    return args


def mixture(n: int, dim: int, clusters: int, spread: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 50_000):  # bounded temporaries at 1M
        stop = min(n, start + 50_000)
        out[start:stop] = centres[rng.integers(0, clusters, stop - start)]
        out[start:stop] += spread * rng.standard_normal((stop - start, dim), dtype=np.float32)
    return out


def options_for(name: str, args: argparse.Namespace) -> dict:
    options = dict(BACKENDS[name][1])
    if BACKENDS[name][0] == "faiss":
        options["train_min"] = 1  # one add of the whole collection: train on it at once
    if name == "ivfpq":  # 4·√n lists, at least 39 training points per list
        options["nlist"] = args.nlist or max(1, min(int(4 * args.n ** 0.5), args.n // 39))
        # 8 dimensions per sub-quantiser (64 bytes per vector at D=512)
        options["pq_m"] = next(m for m in (64, 32, 16, 8, 4) if args.dim % m == 0
                               and args.dim // m >= 8)
        if args.nprobe:
            options["nprobe"] = args.nprobe
    if name == "milvus":
        if args.milvus_insert_bytes:
            options["insert_bytes"] = args.milvus_insert_bytes
        if args.milvus_index:
            options["index_type"] = args.milvus_index
    return options


def measure(name: str, args, ids, vectors, queries, reference, work: Path) -> dict:
    backend, _ = BACKENDS[name]
    options = options_for(name, args)
    folder = work / name
    stage = make_first_stage(backend, directory=folder, dim=args.dim, **options)
    start = time.perf_counter()
    stage.add(ids, vectors)
    build_s = time.perf_counter() - start
    result = {"backend": backend, "options": options, "build_s": round(build_s, 2),
              "vectors_per_s": round(len(ids) / build_s),
              **search_figures(stage, queries, reference, args.candidates)}
    if name.startswith("hnsw") and args.ef_sweep:
        result["ef_sweep"] = {}
        for ef in (int(v) for v in args.ef_sweep.split(",")):
            stage.set_search(ef_search=ef)
            result["ef_sweep"][ef] = search_figures(stage, queries, reference, args.candidates)
    stage.save(folder)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".faiss", ".npz"))
    if size:
        result["index_bytes_per_vector"] = round(size / len(ids), 1)
        result["index_gib_at_1m"] = round(size / len(ids) * 1e6 / 2**30, 3)
    if hasattr(stage, "close"):
        stage.close()
    return result


def search_figures(stage, queries, reference: np.ndarray, candidates: int) -> dict:
    """Single-query latency percentiles and recall against the exact top-C."""
    latencies, found = [], []
    for query in queries:
        start = time.perf_counter()
        found.append(stage.search(query, candidates).ids[0])
        latencies.append((time.perf_counter() - start) * 1000)
    found = np.stack(found)
    return {"latency_ms_p50": round(float(np.percentile(latencies, 50)), 2),
            "latency_ms_p99": round(float(np.percentile(latencies, 99)), 2),
            f"recall@{candidates}": round(recall(found, reference), 4),
            "recall@10": round(recall(found[:, :10], reference[:, :10]), 4)}


def recall(found: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b)
                          for a, b in zip(found, reference, strict=True)]))


def encoded(texts: np.ndarray) -> EncodedQueries:
    return EncodedQueries([parse_query("q")] * len(texts), TextFeatures(torch.from_numpy(texts)))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    names = args.backends.split(",")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    vectors = mixture(args.n, args.dim, args.clusters, args.spread, seed=1)
    ids = np.arange(args.n, dtype=np.int64)
    texts = mixture(args.queries, args.dim, args.clusters, args.spread, seed=2)
    queries = [encoded(texts[i:i + 1]) for i in range(len(texts))]  # one text per search
    exact = make_first_stage("exact", directory=".", dim=args.dim)
    exact.add(ids, vectors)
    reference = exact.search(encoded(texts), args.candidates).ids
    del exact
    result = {
        "what": "first stage alone: recall@C of its top-C against the exact top-C, single-query "
                "latency, build time, saved index size",
        "data": f"synthetic Gaussian mixture, {args.clusters} centres, noise {args.spread}, "
                f"unit vectors; queries from the same mixture",
        "n": args.n, "dim": args.dim, "queries": args.queries, "candidates": args.candidates,
        "threads": torch.get_num_threads(), **environment("cpu"), "backends": {},
    }
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            result["backends"][name] = measure(name, args, ids, vectors, queries, reference,
                                               Path(work))
    return report(result, args.out)


if __name__ == "__main__":
    main()
