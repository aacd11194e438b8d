"""The search service under load: N concurrent clients for T seconds, on loopback.

Targets (issue 23), the 2-core machine: >= 25 searches/s sustained at 1,000,000 videos with 8
concurrent clients, p99 <= 250 ms, no errors; the single-client latency reported beside it.

The index: synthesised features exactly as ``benchmarks/search.py`` makes them (the random-
weight ViT-B/32 DiCoSA's text tower encodes ``--clusters`` synthetic captions as cluster
centres; a video's 12 frames are a centre plus a per-video offset plus per-frame noise, 1 in 4
videos with 6 valid frames), written straight into the store; the model is the one
``configs/msrvtt.yaml`` builds with ``model.pretrained=null`` (seeded), recorded in the
manifest, so the server opens the index as ``dicosa serve`` does. Rows have no video
files: media is not part of the load.

``--hours H`` serves a collection of long videos instead (issue 32's "same figures at 1,000
hours"): ``--video-minutes`` each at 1 frame/s, shots of 1-20 s drawn as
``benchmarks/search_long.py`` draws them, cut into segments (rows) as ``dicosa index`` cuts a
long video (a shot of <= N frames is one segment, a longer one windows of N every N/2), with
the same model, summary and frame dtype as the short collections; a search answers videos,
each with its best moment.

The load: the server runs in its own process (``dicosa.serve INDEX``) on 127.0.0.1;
the clients are threads of this process, each with its own keep-alive connection, each
sending ``GET /api/search?q=...&k=10&candidates=C`` back to back with queries of the same
generator (other captions) for ``--seconds``, after ``--warmup`` seconds of the same load. One
client first (the single-client latency), then ``--clients`` at once; for each ``--max-batch``
value (batching of concurrent searches, ``dicosa/serve/batching.py``; 1 = off) a fresh server.
Latency is measured by the client (request sent to answer parsed); the server's own per-stage
medians come from the answers' ``times_ms``. Resident memory is the server process's (and its
rankers', ``/proc/PID/status``) after the concurrent phase. Clients and server share the
machine's cores, as they would on a 2-core box; each phase also reports the CPU seconds the
server and the clients used in its measured window (``benchmarks/profiling.py``).

The service's options, each compared in one run where it takes several values (every
combination is a fresh server): ``--max-batch``, ``--text-tower`` (float, packed, int8),
``--rankers`` (ranking processes behind one server; ``auto``, the default: no option, the
server picks from the machine, and the run records what it picked and why), ``--threads``
(torch threads of whoever ranks), ``--device`` (where the server encodes and
reranks: ``cpu``, the default, or ``cuda``; the index is built on the CPU either way),
``--batch-wait-ms``, ``--query-cache`` (off by default here: the clients cycle through a
few hundred captions, so a cache would answer most of them from memory, which is not what a
new query costs). ``--frame-dtype int8`` builds (and names) the index with int8 frames.
``--profile`` runs py-spy on the server during each concurrent phase and writes its busiest
functions and each search stage's share of the samples into the JSON (a profiled run is
slower: take the timings from a run without it).

    python benchmarks/serve.py --videos 100000 1000000 --keep      # the lead, alone
    python benchmarks/serve.py --videos 1000000 --reuse            # again, on the kept index
    python benchmarks/serve.py --videos 100000 --reuse --text-tower float packed --rankers 0 2
    python benchmarks/serve.py --videos 100000 --reuse --profile --max-batch 8
    python benchmarks/serve.py --hours 1000 --keep --frame-dtype int8 --rankers 0 2
    python benchmarks/serve.py --videos 100000 --frame-dtype int8 --device cuda   # a GPU
    python benchmarks/serve.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from common import environment, report
from profiling import Window, children
from search import captions, fresh, stage_options, synthetic_shard

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"videos": 1_000_000, "clients": 8, "searches_per_s": 25.0, "p99_ms": 250.0,
           "errors": 0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, nargs="+", default=None,
                   help="collections of short videos (default: 100000 1000000, or none "
                        "with --hours)")
    p.add_argument("--hours", type=float, nargs="+", default=[],
                   help="collections of long videos: this many hours, cut into segments")
    p.add_argument("--video-minutes", type=float, default=60.0, help="a long video's length")
    p.add_argument("--mean-shot", type=float, default=6.0, help="long videos' shots, seconds")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0, help="measured load per phase")
    p.add_argument("--warmup", type=float, default=10.0, help="unmeasured load before each")
    p.add_argument("--single-seconds", type=float, default=30.0)
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-batch", type=int, nargs="+", default=[8, 1])
    p.add_argument("--text-tower", nargs="+", default=["auto"],
                   choices=("auto", "float", "packed", "int8"), help="dicosa serve --text-tower")
    p.add_argument("--rankers", type=_rankers, nargs="+", default=["auto"],
                   help="dicosa serve --rankers N (auto: no option, the server's own pick)")
    p.add_argument("--threads", type=int, default=None, help="dicosa serve --threads")
    p.add_argument("--device", default="cpu", help="dicosa serve --device (cpu or cuda)")
    p.add_argument("--batch-wait-ms", type=float, default=None,
                   help="dicosa serve --batch-wait-ms (default: the server's)")
    p.add_argument("--timeline-rows", type=int, default=None,
                   help="dicosa serve --timeline-rows (default: the server's, 16)")
    p.add_argument("--query-cache", type=int, default=0,
                   help="dicosa serve --query-cache (default 0 here: module docstring)")
    p.add_argument("--frame-dtype", choices=("float16", "int8"), default="float16",
                   help="how the built index keeps frames")
    p.add_argument("--profile", action="store_true",
                   help="py-spy on the server during each concurrent phase")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--profile-native", action="store_true",
                   help="py-spy --native: C/C++ frames too (torch, OpenMP)")
    p.add_argument("--config", default="configs/msrvtt.yaml")
    p.add_argument("--set", action="append", default=["model.pretrained=null"],
                   metavar="SECTION.KEY=VALUE", help="model config overrides")
    p.add_argument("--clusters", type=int, default=2000)
    p.add_argument("--shard-size", type=int, default=8192)
    p.add_argument("--backend", default="local")
    p.add_argument("--summary", default="confidence", help="confidence or mean")
    p.add_argument("--stage-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--work", default="benchmarks/results/serve-bench",
                   help="where the indexes go (not the repository)")
    p.add_argument("--keep", action="store_true", help="keep the indexes after the run")
    p.add_argument("--reuse", action="store_true", help="serve an index a --keep run left")
    p.add_argument("--port", type=int, default=0, help="0: a free one")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds of load")
    p.add_argument("--out", default="benchmarks/results/serve.json")
    args = p.parse_args(argv)
    if args.videos is None:
        args.videos = [] if args.hours else [100_000, 1_000_000]
    if args.smoke:
        args.videos = [2000] if not args.hours else []
        args.video_minutes = min(args.video_minutes, 1.0)
        args.clients, args.clusters, args.shard_size = 2, 50, 512
        args.seconds, args.warmup, args.single_seconds, args.max_batch = 2.0, 0.5, 1.0, [8]
        args.config, args.set = str(REPO / "configs/synthetic.yaml"), ["model.num_frames=4"]
        args.profile_rate = min(args.profile_rate, 50)
        args.work = "serve-bench-smoke"
    args.config = str((REPO / args.config) if not Path(args.config).is_absolute()
                      else args.config)
    return args


# -- the index --------------------------------------------------------------------------------
def build_index(args, videos: int, directory: Path) -> dict:
    """An index of ``videos`` synthesised videos in ``directory``, its model recorded."""
    index, centres = _new_index(args, directory)
    rng = torch.Generator().manual_seed(1)
    started = time.perf_counter()
    for first in range(0, videos, args.shard_size):
        count = min(args.shard_size, videos - first)
        index.add_features(synthetic_shard(centres, count, index.model.config.num_frames, rng),
                           [{"path": f"synthetic/{first + i}"} for i in range(count)])
    index.save(directory)
    return {"build_s": round(time.perf_counter() - started, 1), "reused": False}


def build_long_index(args, hours: float, directory: Path) -> dict:
    """An index of ``hours`` of long synthesised videos (``--video-minutes`` each, shots of
    ``--mean-shot`` s: ``benchmarks/search_long.py``'s generator) cut into segments as the
    index cuts them, its model recorded."""
    from search_long import add_long_videos

    index, centres = _new_index(args, directory)
    started = time.perf_counter()
    add_long_videos(index, centres, hours, args.video_minutes, args.mean_shot)
    index.save(directory)
    return {"build_s": round(time.perf_counter() - started, 1), "reused": False}


def _new_index(args, directory: Path):
    """A new, empty index in ``directory`` of the run's model (recorded in its manifest, as
    ``dicosa serve`` opens it; the default segments, so a long video is cut as ``dicosa
    index`` cuts it) and that model's text vectors of ``--clusters`` synthetic captions, the
    centres the synthetic videos' frames are drawn around."""
    from dicosa.clip import get_tokenizer
    from dicosa.index import VideoIndex
    from dicosa.loading import load_model

    model, source, _ = load_model(None, args.config, args.set)
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    with torch.inference_mode():
        centres = torch.cat([model.encode_text(tokenize(captions(min(256, args.clusters - s),
                                                                  seed=s))).text
                             for s in range(0, args.clusters, 256)])
    index = VideoIndex(model, device="cpu", backend=args.backend, summary=args.summary,
                       stage_options=stage_options(args.stage_option),
                       frame_dtype=args.frame_dtype)
    index.meta["model"] = source
    index.save(fresh(directory))
    return index, centres


# -- the server -------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(directory: Path, port: int, setup: dict, args) -> subprocess.Popen:
    """``dicosa serve`` on ``directory`` with the run's ``setup`` (max_batch, text_tower,
    rankers) and the options every run shares."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    command = [sys.executable, "-m", "dicosa.serve", str(directory.resolve()), "--port",
               str(port), "--max-batch", str(setup["max_batch"]), "--reload-interval", "0",
               "--device", args.device, "--text-tower", setup["text_tower"], "--query-cache",
               str(args.query_cache)]
    if setup["rankers"] != "auto":
        command += ["--rankers", str(setup["rankers"])]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.batch_wait_ms is not None:
        command += ["--batch-wait-ms", str(args.batch_wait_ms)]
    if args.timeline_rows is not None:
        command += ["--timeline-rows", str(args.timeline_rows)]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_ready(base: str, server: subprocess.Popen, timeout: float = 1800.0) -> float:
    import httpx

    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server stopped: {server.stdout.read()[-3000:]}")
        try:
            if httpx.get(base + "/api/ready", timeout=5).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server was not ready within {timeout} s")


def resident(pid: int) -> dict[str, float]:
    """A process's resident memory in GiB: anonymous, file-backed (mapped store pages) and
    the peak of both."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: round(int(fields[name].split()[0]) / 2**20, 3) for key, name in
            (("anon_gib", "RssAnon"), ("file_gib", "RssFile"), ("peak_gib", "VmHWM"))}


def server_memory(pid: int, rankers: list[int]) -> dict:
    """The server's memory (:func:`resident`); with ranker processes, the server's and each
    ranker's, their anonymous memory summed (their mapped store pages are the same page
    cache)."""
    if not rankers:
        return resident(pid)
    each = [resident(r) for r in rankers]
    server = resident(pid)
    return {"anon_gib": round(server["anon_gib"] + sum(r["anon_gib"] for r in each), 3),
            "file_gib_max": max(r["file_gib"] for r in [server, *each]), "rankers": each,
            "server": server}


# -- the load ---------------------------------------------------------------------------------
def load(base: str, clients: int, seconds: float, warmup: float, args, seed: int,
         window: Window | None = None) -> dict:
    """``clients`` threads searching back to back: warm-up, then ``seconds`` measured
    (``window`` started and stopped at its edges).

    The objects this process holds before the load (torch, the model code it imported: about
    0.4 million) are frozen out of the garbage collector for its duration: otherwise one full
    collection, which the answers' short-lived objects set off now and then, stalls every
    client thread for ~200 ms (measured at 1M, 2026-11-26) and adds that to the latency of
    each search in flight, a pause of the load generator's, not of the server's."""
    import httpx

    texts = captions(max(500, 50 * clients), seed=10_000 + seed)
    gc.collect()
    gc.freeze()  # unfrozen once the clients stop (below)
    start_at = time.perf_counter() + 0.2
    measure_from, stop_at = start_at + warmup, start_at + warmup + seconds
    timers = [threading.Timer(at - time.perf_counter(), act) for at, act in
              ((measure_from, window.start), (stop_at, window.stop))] if window else []
    for timer in timers:
        timer.start()
    records: list[list[tuple]] = [[] for _ in range(clients)]

    def client(c: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            i = c
            while time.perf_counter() < start_at:
                time.sleep(0.001)
            while (now := time.perf_counter()) < stop_at:
                params = {"q": texts[i % len(texts)], "k": args.k,
                          "candidates": args.candidates}
                i += clients
                try:
                    response = http.get("/api/search", params=params)
                    answer = response.json() if response.status_code == 200 else None
                    ok = answer is not None and len(answer["hits"]) == args.k
                except (httpx.HTTPError, ValueError):
                    answer, ok = None, False
                if now >= measure_from:
                    records[c].append((now, time.perf_counter() - now, ok,
                                       answer["times_ms"] if answer else None,
                                       answer["batch"] if answer else None,
                                       _scored_rows(answer) if ok else 0))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.unfreeze()
    for timer in timers:
        timer.join()
    out = summarise([r for rows in records for r in rows], seconds, clients)
    return {**out, **(window.result if window else {})}


def _scored_rows(answer: dict) -> int:
    """The most rows any hit's timeline in ``answer`` scored."""
    return max((h["moment"]["scored_rows"] for h in answer["hits"] if h["moment"]), default=0)


def summarise(rows: list[tuple], seconds: float, clients: int) -> dict:
    good = [r for r in rows if r[2]]
    ms = np.array([r[1] for r in good]) * 1000 if good else np.zeros(1)

    def stage(name: str) -> float | None:
        values = [r[3][name] for r in good if name in r[3]]
        return round(float(np.median(values)), 2) if values else None

    return {"clients": clients, "seconds": seconds, "requests": len(rows),
            "errors": len(rows) - len(good),
            "searches_per_s": round(len(good) / seconds, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "mean_batch": round(float(np.mean([r[4] for r in good])), 2) if good else None,
            "timeline_rows_max": max((r[5] for r in good), default=None),
            "server_p50_ms": {name: stage(name) for name in
                              ("queue", "encode", "first_stage", "rerank", "hooks", "top",
                               "moments", "total")},
            "slowest": _slowest(good, ms)}


def _slowest(good: list[tuple], ms: np.ndarray) -> dict | None:
    """Where the slowest 5% of searches spent their time, beside all searches' medians: the
    queue, the server's whole time (``total``), the rest (HTTP and the client) and the batch
    they were ranked in."""
    if len(good) < 20:
        return None
    slow = ms >= np.percentile(ms, 95)

    def medians(rows: list[tuple], took: np.ndarray) -> dict:
        server = np.array([r[3].get("total", np.nan) for r in rows])
        return {"searches": len(rows), "ms": round(float(np.median(took)), 1),
                "queue_ms": round(float(np.median([r[3].get("queue", np.nan) for r in rows])), 1),
                "server_ms": round(float(np.nanmedian(server)), 1),
                "outside_ms": round(float(np.nanmedian(took - server)), 1),
                "batch": round(float(np.mean([r[4] for r in rows])), 2)}

    return {"slowest_5pct": medians([r for r, s in zip(good, slow, strict=True) if s], ms[slow]),
            "all": medians(good, ms)}


def setups(args) -> list[dict]:
    """Every combination of the compared service options: one fresh server each."""
    return [{"max_batch": b, "text_tower": t, "rankers": r}
            for b in args.max_batch for t in args.text_tower for r in args.rankers]


def serve_and_load(args, directory: Path, setup: dict) -> dict:
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(directory, port, setup, args)
    label = "-".join(f"{k}{v}" for k, v in setup.items())
    raw = Path(args.out).with_name(f"{Path(args.out).stem}.{directory.name}.{label}.pyspy.txt")
    try:
        ready_s = wait_ready(base, server)
        picked = _info(base)["server"]
        single = load(base, 1, args.single_seconds, args.warmup, args, seed=0,
                      window=Window(server.pid))
        concurrent = load(base, args.clients, args.seconds, args.warmup, args, seed=1,
                          window=Window(server.pid, args.profile, args.profile_rate,
                                        args.profile_native, raw))
        memory = server_memory(server.pid, _rankers_of(server.pid) if picked["rankers"]
                               else [])
        info = _info(base)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    return {**setup, "rankers": picked["rankers"], "chosen": picked["chosen"],
            "why": picked["why"], "threads": picked["threads"], "query_cache": args.query_cache,
            "indexed_videos": info["videos"], "timeline_rows": info["timeline_rows"],
            "text": info["text"], "open_s": round(ready_s, 1), "single_client": single,
            "concurrent": concurrent, "server_memory_gib": memory}


def _info(base: str) -> dict:
    import httpx

    return httpx.get(base + "/api/info", timeout=30).json()


def _rankers(value: str) -> int | str:
    return value if value == "auto" else int(value)


def _rankers_of(pid: int) -> list[int]:
    """The server's ranker processes: its children that run dicosa (not multiprocessing's
    resource tracker)."""
    return [child for child in children(pid)
            if b"resource_tracker" not in Path(f"/proc/{child}/cmdline").read_bytes()]


def met(size: dict, run: dict) -> bool:
    """The bar: at 1M videos (or 1,000 hours of long ones) with 8 clients, >= 25/s, p99 <=
    250 ms, no errors."""
    c = run["concurrent"]
    return ((size.get("videos", 0) >= TARGETS["videos"] or size.get("hours", 0) >= 1000)
            and c["clients"] >= TARGETS["clients"]
            and c["searches_per_s"] >= TARGETS["searches_per_s"]
            and c["p99_ms"] <= TARGETS["p99_ms"] and c["errors"] == 0)


def collections(args, work: Path) -> list[tuple[dict, Path, callable]]:
    """Each collection the run serves: what it is, its folder and how to build it."""
    dtype = "" if args.frame_dtype == "float16" else f"-{args.frame_dtype}"
    short = [({"videos": v}, work / f"index-{v}-{args.summary}{dtype}",
              lambda d, v=v: build_index(args, v, d)) for v in args.videos]
    long = [({"hours": h, "video_minutes": args.video_minutes, "mean_shot_s": args.mean_shot},
             work / f"long-{h:g}h-{args.video_minutes:g}min-{args.summary}{dtype}",
             lambda d, h=h: build_long_index(args, h, d)) for h in args.hours]
    return short + long


def serve_collection(args, what: dict, directory: Path, build) -> dict:
    """Build (or, with ``--reuse``, reuse) one collection and load a fresh server per setup
    on it."""
    reused = args.reuse and (directory / "manifest.json").is_file()
    built = {"build_s": None, "reused": True} if reused else build(directory)
    store = sum(p.stat().st_size for p in directory.glob("shard-*")) / 2**30
    shape = _shape(directory)
    runs = [serve_and_load(args, directory, setup) for setup in setups(args)]
    size = {**what, **shape, **built, "store_gib": round(store, 2), "runs": runs}
    size["targets_met"] = {",".join(f"{k}={r[k]}" for k in
                                    ("max_batch", "text_tower", "rankers", "chosen")):
                           met(size, r) for r in runs}
    if not args.keep:
        shutil.rmtree(directory)
    return size


def _shape(directory: Path) -> dict:
    """The collection's live rows (a long video's segments each count) from its manifest."""
    import json

    manifest = json.loads((directory / "manifest.json").read_text())
    return {"rows": manifest["next_id"] - len(manifest["removed"])}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [serve_collection(args, what, directory, build)
             for what, directory, build in collections(args, work)]
    result = {"benchmark": "serve", **environment(args.device), "threads": torch.get_num_threads(),
              "smoke": args.smoke, "clients": args.clients, "seconds": args.seconds,
              "candidates": args.candidates, "k": args.k, "backend": args.backend,
              "summary": args.summary, "config": Path(args.config).name,
              "frame_dtype": args.frame_dtype, "query_cache": args.query_cache,
              "overrides": args.set, "targets": TARGETS, "sizes": sizes}
    if args.smoke:
        shutil.rmtree(work, ignore_errors=True)
    return report(result, args.out)


if __name__ == "__main__":
    main()
