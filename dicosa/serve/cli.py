"""``dicosa serve INDEX``: the search service and its page on one index.

The index, its model and its heads are opened before the server listens: a problem with them
is one sentence and exit status 2, never a server that answers errors. Without ``--host`` the
server listens on 127.0.0.1 only and answers only requests addressed to the loopback names.
``--api-key`` without a value makes a random key and prints it; the ``DICOSA_API_KEY``
environment variable sets one without showing it in the process list. Without ``--rankers``
the service picks where searches rank from the machine (:mod:`dicosa.serve.topology`) and
says what it picked and why, here and in ``/api/info``.

FastAPI and uvicorn are the optional extra ``dicosa[serve]``; this module imports them only
when the command runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .compute import ComputeThread
    from .rankers import Rankers
    from .spec import EngineSpec
    from .topology import Topology

__all__ = ["LOOPBACK_NAMES", "MissingExtra", "add_serve_parser", "main", "run_serve"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")
ENV_KEY = "DICOSA_API_KEY"
log = logging.getLogger("dicosa.serve")


class MissingExtra(ValueError):
    """The optional dependencies of the service are not installed (one sentence)."""


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` command to a ``dicosa`` sub-parser set; returns it."""
    p = subparsers.add_parser("serve", help="a search service and web page on an index",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("index", help="index folder written by 'dicosa index'")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; another "
                        "address exposes the index: set an API key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", nargs="?", const="", default=None, metavar="KEY",
                   help=f"require this key on every request, media included (default: "
                        f"${ENV_KEY} if set); without a value a random key is made and printed")
    p.add_argument("--media-root", action="append", default=[], metavar="DIR",
                   help="serve only videos inside DIR (repeatable; default: each video in the "
                        "folder its index row names, links out of it refused)")
    p.add_argument("--media-cache", default=None, metavar="DIR",
                   help="where videos a browser cannot play (AVI, MPEG-2, HEVC, ...) are kept "
                        "once converted to MP4 for the page (default: ~/.cache/dicosa/media)")
    p.add_argument("--media-cache-size", type=float, default=4.0, metavar="GB",
                   help="the converted videos kept at most, least recently used out first "
                        "(default 4; 0: never convert, send every file as it is)")
    p.add_argument("--device", default=None, help="where to search (default: CUDA if present)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="concurrent searches ranked together (1: no batching)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="MS",
                   help="longest a batch waits for searches already received (never for "
                        "searches not yet sent)")
    p.add_argument("--text-tower", choices=("auto", "float", "packed", "int8"), default="auto",
                   help="how queries are encoded: float (the model's text tower), packed "
                        "(CPU: the same vectors in about half the time), int8 (packed with "
                        "int8 linear layers: faster, a different ranking; docs/serve.md), "
                        "auto (default: packed on a CPU, float on a GPU)")
    p.add_argument("--query-cache", type=int, default=1024, metavar="TEXTS",
                   help="keep the encodings of this many recent query texts (0: none)")
    p.add_argument("--timeline-rows", type=int, default=None, metavar="ROWS",
                   help="the most segments of a hit's video its timeline scores (default 16; "
                        "a longer video's are sampled; fewer: faster searches of long "
                        "videos, a coarser timeline; docs/serve.md)")
    p.add_argument("--rankers", type=int, default=None,
                   help="processes that rank the searches of this one server, fed from one "
                        "queue (0: this process ranks; default: picked from the machine, "
                        "2 on a CPU of 2 cores or more where the memory holds them; "
                        "docs/serve.md)")
    p.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)  # refused
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the process that ranks (default: torch's, every "
                        "core, in one process; a ranker's while another ranker is busy: the "
                        "cores / rankers)")
    p.add_argument("--reload-interval", type=float, default=2.0, metavar="SECONDS",
                   help="how often to look for videos another process added (0: never)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name to answer besides the loopback ones (for a proxy in "
                        "front of a loopback server)")
    p.set_defaults(func=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    """Open the index, pick where searches rank, then serve it until interrupted."""
    try:
        import uvicorn

        from .app import Settings, create_app
        from .compute import ComputeThread, freeze_heap, keep_freed_buffers
        from .rankers import RankerError
        from .service import Service
    except ImportError as exc:
        raise MissingExtra(f"'dicosa serve' needs FastAPI and uvicorn ({exc.name} is "
                           "missing): pip install 'dicosa[serve]'") from None
    key = _api_key(args.api_key)
    for warning in binding_warnings(args.host, key):
        log.warning(warning)
    _check_counts(args)
    spec = _spec(args)
    # this process's torch work and heap (compute.py); one thread where rankers are asked for
    compute = ComputeThread.for_process(1 if args.rankers else args.threads)
    keep_freed_buffers()
    service = Service.open(spec, args.reload_interval, compute=compute, freeze_heap=True)
    topology = _topology(args, str(service.engine.index.device), compute)
    try:
        rankers = _start_rankers(spec, topology, args.reload_interval)
    except RankerError as exc:  # one sentence
        print(f"error: {exc}", file=sys.stderr)
        return 2
    hosts = allowed_hosts(args.host, args.allowed_host)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    videos = len(service.engine.index)
    print(f"serving {videos} videos of {args.index} at http://{shown}:{args.port}/ "
          f"(Ctrl-C stops){' with an API key' if key else ''}"
          + (f" with {topology.rankers} rankers" if rankers else ""), flush=True)
    print(f"searches rank in {topology.why}", flush=True)
    settings = Settings(api_key=key, allowed_hosts=hosts, max_batch=args.max_batch,
                        batch_wait_s=args.batch_wait_ms / 1000,
                        reload_interval_s=args.reload_interval, topology=topology,
                        media_cache=args.media_cache,
                        media_cache_bytes=int(args.media_cache_size * (1 << 30)))
    freeze_heap()  # the open index out of the collector's walks (compute.py)
    uvicorn.run(create_app(service, settings, compute, rankers), host=args.host,
                port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


def _spec(args: argparse.Namespace) -> EngineSpec:
    """What the server and each ranker open: the index as the options say, its store mapped
    in."""
    from .spec import TIMELINE_ROWS, EngineSpec

    return EngineSpec(str(args.index), device=args.device, media_roots=tuple(args.media_root),
                      text_tower=args.text_tower, query_cache=args.query_cache,
                      timeline_rows=args.timeline_rows or TIMELINE_ROWS, populate=True)


def _topology(args: argparse.Namespace, device: str, compute: ComputeThread) -> Topology:
    """Where searches rank: as ``--rankers`` says, else picked from the machine with the
    index open (:func:`dicosa.serve.topology.choose`); the server then runs one torch thread
    where rankers rank."""
    import torch

    from .machine import anonymous_bytes, available_bytes, cores
    from .topology import choose

    topology = choose(rankers=args.rankers, threads=args.threads,
                      device=device, cores=cores(),
                      available=available_bytes(), held=anonymous_bytes())
    if topology.rankers and args.rankers is None:
        compute.run(torch.set_num_threads, 1)
    return topology


def _start_rankers(spec: EngineSpec, topology: Topology,
                   reload_interval_s: float) -> Rankers | None:
    """The topology's ranker processes, started and ready (:mod:`dicosa.serve.rankers`), or
    None where this process ranks."""
    if not topology.rankers:
        return None
    from .rankers import Rankers

    rankers = Rankers(topology.rankers, spec, threads=topology.threads,
                      alone_threads=topology.alone_threads,
                      reload_interval_s=reload_interval_s)
    rankers.wait_ready()  # closes them all if one cannot open the index
    return rankers


def _check_counts(args: argparse.Namespace) -> None:
    if args.workers is not None:
        raise ValueError("--workers is no longer an option: give --rankers N (one server "
                         "process and N processes ranking its searches from one queue; "
                         "docs/serve.md)")
    for name in ("threads", "timeline_rows"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.rankers is not None and args.rankers < 0:
        raise ValueError(f"--rankers must be 0 or more, got {args.rankers}")
    if args.query_cache < 0:
        raise ValueError(f"--query-cache must be 0 or more, got {args.query_cache}")
    if not args.media_cache_size >= 0:  # NaN too
        raise ValueError(f"--media-cache-size must be 0 or more gigabytes, got "
                         f"{args.media_cache_size}")


def _api_key(option: str | None) -> str | None:
    if option == "":
        key = secrets.token_urlsafe(24)
        print(f"API key (give it to who may search): {key}", flush=True)
        return key
    return option or os.environ.get(ENV_KEY) or None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def binding_warnings(host: str, key: str | None) -> list[str]:
    """What to tell whoever listens beyond this machine."""
    if is_loopback(host) or key:
        return []
    return [f"listening on {host} without an API key: anyone who reaches this address can "
            "search the index and play its videos; add --api-key"]


def allowed_hosts(host: str, extra: list[str]) -> tuple[str, ...] | None:
    """The Host headers to answer: the loopback names (and ``extra``) for a loopback server,
    which guards it against DNS rebinding; any for a server on another address."""
    if not is_loopback(host):
        return None
    return (*LOOPBACK_NAMES, *extra)


def main(argv: list[str] | None = None) -> int:
    """``dicosa.serve``: the serve command on its own."""
    from ..errors import USER_ERRORS

    parser = argparse.ArgumentParser(prog="dicosa.serve")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
