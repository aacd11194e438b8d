"""Indexing throughput by engine: one process, Ray, and torchrun with 2 processes.

A collection of ``--videos`` generated H.264 files (``ingest_long.write_video``: moving
shapes, a cut every 2-12 s, ``--width`` x ``--height`` at ``--fps``), their lengths spread
evenly from 0.25 to 1.75 times ``--minutes`` (so that one file takes several times another's
work, as in a real collection), is indexed by each engine through the command line, as a user
runs it, into a fresh folder:

- ``processes``: ``dicosa index`` (one process, its default DataLoader decode workers;
  ``processes:W`` gives it ``--num-workers W``);
- ``ray``: ``dicosa index --engine ray``, a local Ray cluster started and stopped by the
  command (its start is timed apart once, ``ray_cluster_start_s``, for a cluster kept up);
- ``torchrun``: ``torchrun --nproc_per_node 2 -m dicosa index``.

Each time includes the command's start (imports, the model built from the same config: a
random-weight ``--arch`` DiCoSA, whose cost is the architecture's). The figure is hours of
video indexed per hour of wall time, the median of ``--repeats`` runs taken in turns; the Ray
command's own line says where its workers' time went (decode, encode, write: seconds summed
over the workers). Every engine must store the same rows.

    python benchmarks/ingest_ray.py --videos 8 --minutes 2 --repeats 3 \\
        --out benchmarks/results/ingest_ray.json
    python benchmarks/ingest_ray.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import av
import numpy as np
import torch
from common import environment, report
from ingest_long import write_video

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("processes", "ray", "torchrun")
_RAY_LINE = re.compile(r"on Ray: (\d+) node\(s\), (\d+) encoder\(s\); decode ([\d.]+) s, "
                       r"encode ([\d.]+) s, write ([\d.]+) s, wall ([\d.]+) s")


def write_collection(folder: Path, args: argparse.Namespace) -> dict:
    """The collection (module docstring), reused when already written; returns its facts."""
    folder.mkdir(parents=True, exist_ok=True)
    minutes = args.minutes * np.linspace(0.25, 1.75, args.videos)
    order = np.random.default_rng(0).permutation(args.videos)  # long files not all last
    seconds, jobs = 0.0, []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, length in zip(order, minutes, strict=True):
            path = folder / f"video{i:03d}-{length:.2f}min.mp4"
            if not path.is_file():
                jobs.append(pool.submit(write_video, path, float(length), args.width,
                                        args.height, args.fps, seed=int(i)))
            seconds += round(length * 60 * args.fps) / args.fps
        for job in jobs:
            job.result()
    return {"videos": args.videos, "seconds": seconds, "longest_s": float(minutes[-1] * 60),
            "shortest_s": float(minutes[0] * 60), "width": args.width, "height": args.height,
            "fps": args.fps, "bytes": sum(p.stat().st_size for p in folder.glob("*.mp4"))}


def read_collection(folder: Path) -> dict:
    """Facts of a folder of videos given as they are (``--collection``)."""
    files = sorted(folder.rglob("*.mp4"))
    if not files:
        raise SystemExit(f"{folder} holds no .mp4 file")
    seconds = []
    for path in files:
        with av.open(str(path)) as container:
            seconds.append(container.duration / av.time_base)
    return {"videos": len(files), "seconds": round(sum(seconds), 2),
            "longest_s": round(max(seconds), 2), "shortest_s": round(min(seconds), 2),
            "bytes": sum(p.stat().st_size for p in files), "given": str(folder)}


def write_config(path: Path, args: argparse.Namespace) -> Path:
    """The model's config (JSON is YAML) for every engine's command."""
    tiny = args.arch == "dicosa-tiny"
    path.write_text(json.dumps({"model": {
        "arch": args.arch, "pretrained": None, "variant": "released",
        "num_frames": args.frames, "max_words": 32, "temporal_layers": 2 if tiny else 4}}))
    return path


def command(engine: str, folder: Path, out: Path, config: Path) -> list[str]:
    """``engine``'s ``dicosa index`` command line (``processes:W``: W decode workers)."""
    index = ["-m", "dicosa", "index", str(folder), "--out", str(out), "--config", str(config),
             "--no-subtitles"]
    if engine.startswith("processes:"):
        index += ["--num-workers", engine.split(":", 1)[1]]
    if engine == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                *index]
    return [sys.executable, *index, *(["--engine", "ray"] if engine == "ray" else [])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(engine: str, folder: Path, work: Path, config: Path) -> dict:
    """One build by ``engine`` into a fresh folder: its wall time, rows, Ray's breakdown."""
    out = work / f"index-{engine.replace(':', '-')}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    started = time.perf_counter()
    done = subprocess.run(command(engine, folder, out, config), cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    from dicosa.index import VideoIndex

    index = VideoIndex.load(out, None, verify=False)
    result = {"wall_s": round(wall, 2), "videos": len(index), "rows": len(index.store)}
    found = _RAY_LINE.search(done.stdout)
    if engine == "ray" and found:
        nodes, encoders, decode, encode, write, build = found.groups()
        result["ray"] = {"nodes": int(nodes), "encoders": int(encoders),
                         "worker_s": {"decode": float(decode), "encode": float(encode),
                                      "write": float(write)},
                         "build_wall_s": float(build)}
    return result


def ray_cluster_start() -> float:
    """Seconds to start (and connect to) the local cluster the command starts."""
    from dicosa.index.ray_build import RaySettings, ray_cluster

    started = time.perf_counter()
    with ray_cluster(RaySettings()) as ray:
        ray.cluster_resources()
        up = time.perf_counter() - started
    return round(up, 2)


def summarise(runs: dict[str, list[dict]], seconds: float) -> dict:
    out = {}
    for engine, results in runs.items():
        wall = statistics.median(r["wall_s"] for r in results)
        out[engine] = {"median_wall_s": round(wall, 2),
                       "video_hours_per_hour": round(seconds / wall, 2),
                       "runs": results}
    if "processes" in out:
        base = out["processes"]["video_hours_per_hour"]
        for engine in out:
            out[engine]["vs_processes"] = round(out[engine]["video_hours_per_hour"] / base, 3)
    rows = {r["rows"] for results in runs.values() for r in results}
    if len(rows) != 1:
        raise SystemExit(f"the engines stored different rows: {rows}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--videos", type=int, default=8)
    p.add_argument("--minutes", type=float, default=2.0, help="mean length of a video")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--arch", default="ViT-B-32")
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="processes writing the collection")
    p.add_argument("--collection", help="index this folder of .mp4 files as it is in place "
                   "of writing one")
    p.add_argument("--work", default="benchmarks/results/ingest-ray")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="benchmarks/results/ingest_ray.json")
    args = p.parse_args()
    if args.smoke:
        args.videos, args.minutes, args.width, args.height, args.fps = 3, 0.1, 160, 96, 10
        args.arch, args.frames, args.work = "dicosa-tiny", 4, "ingest-ray-smoke"
        args.engines = "processes,ray"
    work = Path(args.work).resolve()
    if args.collection:
        folder = Path(args.collection).resolve()
        facts = read_collection(folder)
    else:
        folder = work / f"videos-{args.videos}x{args.minutes:g}min-{args.height}p"
        facts = write_collection(folder, args)
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work / f"{args.arch}-{args.frames}.yaml", args)
    engines = [e for e in args.engines.split(",") if e]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(args.repeats):  # in turns, so that a slow spell of the machine is shared
        for engine in engines:
            runs[engine].append(run(engine, folder, work, config))
    report({"benchmark": "ingest_ray", "collection": facts, "arch": args.arch,
            "N": args.frames, "engines": summarise(runs, facts["seconds"]),
            "ray_cluster_start_s": ray_cluster_start() if "ray" in engines else None,
            "repeats": args.repeats,
            **environment("cuda" if torch.cuda.is_available() else "cpu")}, args.out)


if __name__ == "__main__":
    main()
