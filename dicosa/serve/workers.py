"""``dicosa serve --workers N``: N server processes on one listening socket, one index.

uvicorn's process manager binds the socket once and starts N processes with the
``spawn`` method (none inherits the parent's torch threads or memory); each imports
:func:`app` below, which opens the index itself, as ``dicosa serve`` does with one process,
and answers the requests the kernel hands it. What they share is the index folder: the frame
store's shards are memory-mapped read-only, so their pages are in the page cache once for all
of them; each holds its own model, first stage and query cache.

Each worker is a whole service: its own batcher, and its own watcher of the folder that
reopens the index after another process adds videos and swaps the snapshot in (``app.Service``,
docs/serve.md "Adding videos while serving"). The workers swap independently, each within
about one ``--reload-interval`` of the change, so for that long one request may be answered
from the new collection and the next from the old.

The settings travel to the workers in an environment variable (``DICOSA_SERVE_WORKER``, JSON;
the API key in it, as ``DICOSA_API_KEY`` would carry it: readable by the same user only).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field

__all__ = ["ENV", "WorkerSettings", "app", "serve_workers"]

ENV = "DICOSA_SERVE_WORKER"
STARTUP_FAILURE = 3  # uvicorn's code for a worker that could not start: the parent stops
log = logging.getLogger("dicosa.serve")


@dataclass
class WorkerSettings:
    """What each worker needs to open the index and serve it."""

    index: str
    device: str | None = None
    media_roots: list[str] = field(default_factory=list)
    text_tower: str = "float"
    query_cache: int = 0
    timeline_rows: int | None = None  # None: the engine's default
    threads: int | None = None
    api_key: str | None = None
    allowed_hosts: list[str] | None = None
    max_batch: int = 8
    batch_wait_s: float = 0.002
    reload_interval_s: float = 2.0
    workers: int = 1
    media_cache: str | None = None
    media_cache_bytes: int = 4 << 30


def app():
    """The ASGI application of one worker (uvicorn's factory), from :data:`ENV`."""
    from ..errors import USER_ERRORS
    from .app import Settings, create_app
    from .compute import ComputeThread, freeze_heap
    from .engine import Engine

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    given = WorkerSettings(**json.loads(os.environ[ENV]))
    compute = ComputeThread.for_process(given.threads)  # this worker's torch work
    try:
        engine = compute.run(Engine.open, given.index, device=given.device,
                             media_roots=tuple(given.media_roots),
                             text_tower=given.text_tower, query_cache=given.query_cache,
                             timeline_rows=given.timeline_rows, populate=True)
    except USER_ERRORS as exc:  # the parent opened it a moment ago: say why, stop them all
        print(f"error: worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
    hosts = None if given.allowed_hosts is None else tuple(given.allowed_hosts)
    app = create_app(engine, Settings(api_key=given.api_key, allowed_hosts=hosts,
                                      max_batch=given.max_batch,
                                      batch_wait_s=given.batch_wait_s,
                                      reload_interval_s=given.reload_interval_s,
                                      workers=given.workers, freeze_heap=True,
                                      media_cache=given.media_cache,
                                      media_cache_bytes=given.media_cache_bytes), compute)
    freeze_heap()  # the open index out of the collector's walks (compute.py)
    return app


def serve_workers(settings: WorkerSettings, host: str, port: int) -> None:
    """Serve with ``settings.workers`` processes until interrupted (module docstring)."""
    import uvicorn

    from . import nodelay

    os.environ[ENV] = json.dumps(asdict(settings))
    uvicorn.run(f"{__name__}:app", factory=True, host=host, port=port, http=nodelay.PATH,
                workers=settings.workers, log_level="warning", timeout_graceful_shutdown=5)
