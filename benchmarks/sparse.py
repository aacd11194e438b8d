"""The sparse first stage: the exact scipy inverted index against seismic (``pyseismic-lsr``).

Per collection size: build time, single-query latency (p50/p99) for the top-C candidates,
recall of the exact top-10 and top-C within seismic's top-C, and memory. Seismic is searched
at several (query_cut, heap_factor) settings over one build (they are search-time knobs).

Data: synthetic vectors shaped like a lexical head's: ``--vocab`` words drawn Zipf-like (a
few words in most videos, most words in few), 20-400 non-zeros per video (log-normal around
``--nnz``), positive log-normal weights (``--idf``: times log(n / df), so that frequent words
weigh little, as with learned sparse encoders). A query is the 2-27 heaviest words of a
random video (weights times log-normal noise) plus three random words: 5-30 non-zeros.

After the sweep, ``--added`` of the collection (default 1%, under the default
``pending_fraction`` of 5%) is added again as new rows (copies of random rows under new ids):
the time of that add and the single-query latency with the added rows waiting outside the
seismic index (scored exactly beside it, no rebuild) are reported under ``after_add``.

Memory: the exact stage holds the float32 rows and their term-major copy (nbytes); the
seismic stage holds the same rows (rescoring, explanations, rebuilds) plus its index, whose
size is given as its saved file. ``peak_rss_gib`` is the process's peak after each phase.

    OMP_NUM_THREADS=1 python benchmarks/sparse.py --n 100000 1000000 --threads 1
    python benchmarks/sparse.py --smoke
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from common import environment, report

from dicosa.model import TextFeatures
from dicosa.search.query import parse_query
from dicosa.search.seismic import SeismicStage, seismic_config
from dicosa.search.sparse import SparseStage
from dicosa.search.types import EncodedQueries


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000],
                   help="collection sizes")
    p.add_argument("--vocab", type=int, default=50_000)
    p.add_argument("--nnz", type=float, default=90, help="typical non-zeros per video")
    p.add_argument("--idf", action="store_true",
                   help="multiply each weight by its word's log(n / df), as learned sparse "
                        "encoders give frequent words small weights")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--candidates", type=int, nargs="+", default=[1000, 100],
                   help="C, the first stage's k (each measured over the same builds)")
    p.add_argument("--sweep", default="10:0.9,5:0.9,30:0.7,30:0.5",
                   help="seismic query_cut:heap_factor pairs to search with (the default "
                        "settings are measured too)")
    p.add_argument("--build", action="append", default=[], metavar="KEY=VALUE",
                   help="a seismic build setting other than the default, repeatable "
                        "(e.g. n_postings=6000)")
    p.add_argument("--threads", type=int, default=1,
                   help="seismic's build threads and torch's (0: seismic uses every core)")
    p.add_argument("--added", type=float, default=0.01,
                   help="rows added after the build, as a share of the collection")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument("--out", default="benchmarks/results/sparse.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.n, args.vocab, args.nnz, args.queries, args.candidates = [2000], 2000, 40, 10, [100]
        args.sweep = "5:0.9"
    return args


def collection(n: int, vocab: int, nnz: float, seed: int) -> sp.csr_matrix:
    """``[n, vocab]`` float32 CSR, built in blocks to bound the temporaries at 1M rows."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1))
    cdf /= cdf[-1]
    words = np.random.default_rng(0).permutation(vocab)  # which word is frequent
    blocks = []
    for start in range(0, n, 100_000):
        rows = min(n, start + 100_000) - start
        counts = np.clip(rng.lognormal(np.log(nnz), 0.5, rows), 20, 400).astype(np.int64)
        drawn = words[np.minimum(np.searchsorted(cdf, rng.random(counts.sum())), vocab - 1)]
        weights = rng.lognormal(-1.0, 0.8, counts.sum()).astype(np.float32)
        block = sp.csr_matrix((weights, (np.repeat(np.arange(rows), counts), drawn)),
                              shape=(rows, vocab), dtype=np.float32)
        block.sum_duplicates()  # a word drawn twice is one non-zero
        blocks.append(block)
    return sp.vstack(blocks, format="csr")


def queries(rows: sp.csr_matrix, count: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    vocab = rows.shape[1]
    out = sp.lil_matrix((count, vocab), dtype=np.float32)
    for q in range(count):
        row = rows[int(rng.integers(rows.shape[0]))]
        top = np.argsort(-row.data)[:int(rng.integers(2, 28))]
        out[q, row.indices[top]] = row.data[top] * rng.lognormal(0, 0.3, len(top))
        out[q, rng.integers(0, vocab, 3)] = rng.lognormal(-1.0, 0.8, 3)
    return out.tocsr()


def encoded(vectors: sp.csr_matrix) -> EncodedQueries:
    out = EncodedQueries([parse_query("q")] * vectors.shape[0],
                         TextFeatures(torch.zeros(vectors.shape[0], 4)))
    out.extra["lexical"] = vectors
    return out


def peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def search_figures(stage, singles: list[EncodedQueries], top: np.ndarray, c: int) -> dict:
    """Single-query latency and recall of the exact top-10 / top-C (``top`` [Q, >= C], the
    exact stage's list, best first, ties to the smaller id: its first C are the exact top-C;
    -1 pads)."""
    latencies, found = [], []
    for query in singles:
        start = time.perf_counter()
        found.append(stage.search(query, c).ids[0])
        latencies.append((time.perf_counter() - start) * 1000)

    def recall(width: int) -> float:
        per_query = [len(set(f[f >= 0]) & set(t[:width][t[:width] >= 0]))
                     / max(1, int((t[:width] >= 0).sum())) for f, t in zip(found, top,
                                                                          strict=True)]
        return round(float(np.mean(per_query)), 4)

    return {"latency_ms_p50": round(float(np.percentile(latencies, 50)), 2),
            "latency_ms_p99": round(float(np.percentile(latencies, 99)), 2),
            "recall@10": recall(10), f"recall@{c}": recall(c)}


def measure(n: int, args: argparse.Namespace, work: Path) -> dict:
    start = time.perf_counter()
    rows = collection(n, args.vocab, args.nnz, seed=1)
    if args.idf:
        df = np.bincount(rows.indices, minlength=args.vocab)
        rows = sp.csr_matrix(rows.multiply(np.log((n + 1) / (df + 1))[None, :]),
                             dtype=np.float32)
        rows.eliminate_zeros()  # a word in every row weighs log(1) = 0
    asked = queries(rows, args.queries, seed=2)
    singles = [encoded(asked[i]) for i in range(asked.shape[0])]
    ids = np.arange(n, dtype=np.int64)
    words = [str(i) for i in range(args.vocab)]
    result = {"n": n, "nnz_per_video": round(rows.nnz / n, 1),
              "query_nnz_mean": round(asked.nnz / asked.shape[0], 1),
              "generate_s": round(time.perf_counter() - start, 1), "peak_rss_gib": {}}
    result["peak_rss_gib"]["data"] = peak_rss_gib()

    exact = SparseStage(words)
    start = time.perf_counter()
    exact.add(ids, rows)
    exact.scores(asked[:1])  # builds the term-major copy, as the first search does
    exact_build = time.perf_counter() - start
    top = exact.search(encoded(asked), max(args.candidates)).ids  # the reference [Q, C]
    result["exact"] = {"build_s": round(exact_build, 2),
                       "memory_gib": round(exact.nbytes / 2**30, 3),
                       **{f"C={c}": search_figures(exact, singles, top, c)
                          for c in args.candidates}}
    result["peak_rss_gib"]["exact"] = peak_rss_gib()
    del exact

    config = seismic_config({**dict(pair.split("=", 1) for pair in args.build),
                             "num_threads": args.threads})
    stage = SeismicStage(words, config=config)
    start = time.perf_counter()
    stage.add(ids, rows)
    stage.build()
    seismic_build = time.perf_counter() - start
    folder = work / f"seismic-{n}"
    folder.mkdir()
    stage.save(folder)
    index_bytes = sum(p.stat().st_size for p in folder.glob("*.seismic"))
    settings = [(config.query_cut, config.heap_factor)] + [
        (int(q), float(h)) for q, h in (pair.split(":") for pair in args.sweep.split(","))]
    searched = {f"C={c}": {} for c in args.candidates}
    for query_cut, heap_factor in dict.fromkeys(settings):
        stage.set_config(replace(config, query_cut=query_cut, heap_factor=heap_factor))
        for c in args.candidates:
            searched[f"C={c}"][f"query_cut={query_cut},heap_factor={heap_factor}"] = \
                search_figures(stage, singles, top, c)
    result["seismic"] = {"build_s": round(seismic_build, 2),
                         "build_settings": config.build_settings(),
                         "memory_gib": round((stage.nbytes + index_bytes) / 2**30, 3),
                         "index_file_gib": round(index_bytes / 2**30, 3),
                         "search": searched,
                         "after_add": after_add(stage, config, rows, singles, args)}
    result["peak_rss_gib"]["seismic"] = peak_rss_gib()
    return result


def after_add(stage: SeismicStage, config, rows: sp.csr_matrix,
              singles: list[EncodedQueries], args: argparse.Namespace) -> dict:
    """Add ``--added`` of the collection as new rows, then time single queries (C = the
    largest) with them waiting outside the seismic index."""
    stage.set_config(config)
    n = rows.shape[0]
    count = max(1, int(n * args.added))
    copies = np.random.default_rng(3).choice(n, count, replace=False)
    start = time.perf_counter()
    stage.add(np.arange(n, n + count, dtype=np.int64), rows[copies])
    add_s = time.perf_counter() - start
    rebuilt = stage._stale  # True: past pending_fraction, the next search rebuilds
    latencies = []
    for query in singles:
        begin = time.perf_counter()
        stage.search(query, max(args.candidates))
        latencies.append((time.perf_counter() - begin) * 1000)
    return {"rows_added": count, "add_s": round(add_s, 3), "rebuild_at_next_search": rebuilt,
            "C": max(args.candidates),
            "latency_ms_p50": round(float(np.percentile(latencies, 50)), 2),
            "latency_ms_p99": round(float(np.percentile(latencies, 99)), 2)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {
        "what": "sparse first stage alone: exact scipy CSR inverted index vs seismic; recall of "
                "the exact top-10 / top-C within the stage's top-C; single-query latency",
        "data": f"synthetic: {args.vocab} words Zipf-like, ~{args.nnz:g} non-zeros per video "
                "(log-normal, 20-400), log-normal weights" + (" times log(n/df)" if args.idf
                                                              else "")
                + "; queries 5-30 non-zeros from a video's heaviest words plus 3 random ones",
        "candidates": args.candidates, "queries": args.queries,
        "seismic_threads": args.threads or "all cores",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "pyseismic_lsr": importlib.metadata.version("pyseismic-lsr"),
        **environment("cpu"), "sizes": {},
    }
    with tempfile.TemporaryDirectory() as work:
        for n in args.n:
            result["sizes"][str(n)] = measure(n, args, Path(work))
            report(result, args.out)  # what is measured so far survives a later failure
    return report(result, args.out)


if __name__ == "__main__":
    main()
