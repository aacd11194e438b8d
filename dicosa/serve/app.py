"""The HTTP service: FastAPI routes over one :class:`~dicosa.serve.engine.Engine` at a time.

The routes are listed in docs/serve.md ("API") and ``/openapi.json`` (:mod:`.openapi`; the
answers' models: :mod:`.schemas`); every error is ``{"error": "one sentence"}``. Routes
that run torch or decode are plain ``def``: FastAPI runs them on its thread pool.
Videos are named by their row id only; a file is served only when the engine finds it where
its row says (:meth:`Engine.video`). Nothing on the server fetches a URL.

Every search goes through one :class:`~dicosa.serve.batching.Batcher` to the service's
:class:`~dicosa.serve.ranking.Ranking` (this process, or ranker processes: its
:class:`~dicosa.serve.topology.Topology`), which ranks it and cuts its page. A
:class:`~dicosa.serve.service.Service` holds the current engine and swaps in a new snapshot
after another process changed the index.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException
from starlette.routing import Match, Route

from .. import __version__
from .batching import Batcher
from .compute import ComputeThread
from .engine import Answer, Engine, SearchRequest
from .errors import BAD_REQUESTS, NotReady, ServeError, UnknownMoment, UnknownVideo
from .media import ThumbnailError, Thumbnails, served_type, stream_response
from .openapi import DOCS_CSP, install_docs, openapi_schema
from .rankers import RankerError, Rankers
from .ranking import InProcess
from .request_schema import IndexFacts, request_fields
from .schemas import Health, Info, Ready, SearchAnswer, VideoDetails, errors
from .security import COOKIE, Guard, safe_next
from .service import Service
from .topology import Topology
from .transcode import MediaCache, TranscodeError

__all__ = ["Limits", "Service", "Settings", "create_app"]

log = logging.getLogger("dicosa.serve")

STATIC = Path(str(resources.files("dicosa.serve") / "static"))
# The page loads nothing from elsewhere (nor does /docs: its own policy, openapi.DOCS_CSP).
_CSP = ("default-src 'self'; img-src 'self' data:; media-src 'self'; style-src 'self'; "
        "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'")
_OPEN_PATHS = ("/login", "/static/login.css", "/static/login.js")
_BINARY: dict = {}  # OpenAPI 3.1: raw bytes are content without a schema
_MEDIA = {"video": {"description": "the file (Accept-Ranges: bytes)",
                    "content": {"video/*": _BINARY, "application/octet-stream": _BINARY}},
          "image": {"description": "a JPEG", "content": {"image/jpeg": _BINARY}}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    query_chars: int = 500  # characters of q (and of each exclusion)
    exclusions: int = 8
    page: int = 50  # k: hits per page
    depth: int = 1000  # offset + k: how far down a ranking paging reaches
    candidates: int = 10_000  # rows one query may have reranked


@dataclass(frozen=True)
class Settings:
    """How the service runs (``dicosa serve``'s options)."""

    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    allowed_hosts: tuple[str, ...] | None = None  # Host headers answered (None: any)
    reload_interval_s: float = 2.0  # 0: never look for changes
    max_batch: int = 8  # searches ranked together (1: no batching)
    batch_wait_s: float = 0.002  # longest a batch waits for searches already on their way
    freeze_heap: bool = False  # refreeze the collector's objects after each reopening
    topology: Topology | None = None  # why searches rank where they do (/api/info; None:
    # as create_app's ``rankers`` say, given by the caller)
    thumbnail_cache_bytes: int = 64 << 20
    media_cache: str | None = None  # converted videos' folder (None: the user's cache folder)
    media_cache_bytes: int = 4 << 30  # 0: never convert, send every file as it is
    token_ttl_s: int = 600
    session_ttl_s: int = 12 * 3600
    secure_cookie: bool = False  # mark the session cookie Secure (behind an HTTPS proxy)


class _JSON(JSONResponse):
    """JSON where a non-finite number (which JSON cannot hold) is null. Starlette's render
    refuses one (ValueError); only then is the content walked to replace them, since the walk
    costs as much as the encoding."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:
            return super().render(_finite(content))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return _JSON({"error": message}, status_code=status, headers=headers)


class SearchBody(BaseModel):
    """A search as a JSON body (``POST /api/search``); the fields of ``GET``'s parameters."""

    model_config = ConfigDict(extra="forbid")

    q: str
    exclude: list[str] = []
    k: int = 10
    offset: int = 0
    candidates: int = 1000
    mode: str | None = None
    explain: bool = False
    source: str | None = None


def _checked(limits: Limits, q: str, exclude: list[str], k: int, offset: int, candidates: int,
             mode: str | None, explain: bool, source: str | None = None) -> SearchRequest:
    """A SearchRequest within ``limits``, else a ServeError naming the limit."""
    if not q.strip():
        raise ServeError("the query is empty: type what to look for")
    if len(q) > limits.query_chars:
        raise ServeError(f"the query is {len(q)} characters long; the limit is "
                         f"{limits.query_chars}")
    exclude = [e for e in exclude if e.strip()]
    if len(exclude) > limits.exclusions:
        raise ServeError(f"at most {limits.exclusions} things can be left out of one search")
    if any(len(e) > limits.query_chars for e in exclude):
        raise ServeError(f"each thing to leave out is at most {limits.query_chars} characters")
    if not 1 <= k <= limits.page:
        raise ServeError(f"k (results per page) must be between 1 and {limits.page}")
    if not 0 <= offset < limits.depth:
        raise ServeError(f"offset must be between 0 and {limits.depth - 1}: paging reaches "
                         f"the first {limits.depth} results")
    if not 1 <= candidates <= limits.candidates:
        raise ServeError(f"candidates must be between 1 and {limits.candidates}")
    k = min(k, limits.depth - offset)  # the last page ends at the depth paging reaches
    return SearchRequest(q, k, offset, candidates, tuple(exclude), mode or None, explain,
                         (("source", source),) if source else ())


def create_app(service: Service | Engine, settings: Settings | None = None,
               compute: ComputeThread | None = None,
               rankers: Rankers | None = None) -> FastAPI:
    """The service's FastAPI application around ``service`` (an Engine is wrapped in a
    :class:`Service`, which looks for changes every ``settings.reload_interval_s``).

    Every search, page and reopening runs on ``compute`` (:mod:`dicosa.serve.compute`; None:
    a new one). The engine is fastest when it was opened there too, as ``dicosa serve``
    does: then no other thread of the process has run torch. With ``rankers``
    (:mod:`dicosa.serve.rankers`) searches are ranked and their pages cut in those processes
    instead, which the application stops when it stops."""
    settings = settings or Settings()
    if settings.topology is None:  # as the caller gave them
        count = 0 if rankers is None else len(rankers)
        settings = replace(settings, topology=Topology(
            count, why=f"{count} ranker processes" if count else "this process"))
    if isinstance(service, Engine):
        service = Service(service, settings.reload_interval_s,
                          freeze_heap=settings.freeze_heap)
    compute = compute or service.compute or ComputeThread()
    service.compute = compute
    guard = Guard(settings.api_key, token_ttl_s=settings.token_ttl_s,
                  session_ttl_s=settings.session_ttl_s)
    thumbnails = Thumbnails(settings.thumbnail_cache_bytes)
    media = media_cache(settings)
    ranking = rankers if rankers is not None else InProcess(compute)
    batcher = Batcher(settings.max_batch, settings.batch_wait_s, ranking)

    async def lifespan(_: FastAPI):
        service.start()
        yield
        service.stop()
        batcher.close()
        thumbnails.close()
        ranking.close()

    app = FastAPI(title="dicosa", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None, default_response_class=_JSON,
                  description="Text-video search with DiCoSA: where in each video the query "
                              "matches. Errors are {\"error\": \"one sentence\"}.")
    app.state.service, app.state.guard, app.state.thumbnails = service, guard, thumbnails
    app.state.batcher, app.state.settings, app.state.media = batcher, settings, media
    _install_guards(app, settings, guard)
    app.add_middleware(_Arrivals, batcher=batcher)
    _install_errors(app)
    _install_pages(app, guard, settings)
    # Registration order is the order of /openapi.json's paths and of the docs page.
    respond = _responder(app, guard, thumbnails)
    _install_status(app, service, settings, guard, batcher)
    _install_api(app, service, settings, batcher, respond)
    _install_videos(app, service, settings, thumbnails, respond)
    _install_stream(app, service, media)
    install_docs(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    published: list = [None, None]  # [the engine it describes, the schema]

    def schema() -> dict:
        """Made once per engine: a reopened index may have other modes or plugins."""
        engine = service.current
        if published[1] is None or published[0] is not engine:
            fields = request_fields(vars(settings.limits), _facts(engine))
            published[:] = [engine, openapi_schema(
                app, api_key=guard.enabled, host_check=settings.allowed_hosts is not None,
                fields=fields)]
        return published[1]

    app.openapi = schema
    return app


def _facts(engine: Engine | None) -> IndexFacts:
    """What of ``engine``'s index decides which requests it answers (None: not open yet)."""
    if engine is None:
        return IndexFacts()
    index = engine.index
    return IndexFacts(tuple(engine.parts.modes), index.plugins.leaves_out,
                      {name: option.schema
                       for name, option in index.plugins.query_options.items()})


def _install_guards(app: FastAPI, settings: Settings, guard: Guard) -> None:
    allowed = None if settings.allowed_hosts is None else set(settings.allowed_hosts)

    @app.middleware("http")
    async def guard_requests(request: Request, call_next):
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if allowed is not None and name not in allowed:
            # A page elsewhere that points a name of its own at 127.0.0.1 (DNS rebinding)
            # would otherwise read this server's answers.
            return _error(400, f"this server answers requests for {', '.join(sorted(allowed))}"
                               " only")
        path = request.url.path
        if path not in _OPEN_PATHS and not guard.allows(
                path, request.headers, request.cookies, request.query_params):
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                back = path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/login?next={quote(back, safe='')}", 303)
            return _error(401, "this server needs its API key: send X-API-Key, or log in at "
                               "/login", {"WWW-Authenticate": "Bearer"})
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Content-Security-Policy",
                                    DOCS_CSP if path.startswith("/docs") else _CSP)
        return response


class _Arrivals:
    """ASGI middleware: a :class:`~dicosa.serve.batching.Ticket` per search request, in the
    request's state from its arrival, settled when it is answered at the latest, so that a
    batch waits only for searches on their way."""

    def __init__(self, app, batcher: Batcher):
        self.app, self.batcher = app, batcher

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/api/search":
            await self.app(scope, receive, send)
            return
        ticket = self.batcher.expect()
        scope.setdefault("state", {})["ticket"] = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.settle()


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            return _error(404, "there is nothing at this address")
        if exc.status_code == 405:
            return _error(405, f"{request.method} is not allowed at this address",
                          {"Allow": _allowed(app, request.scope)})
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(400, _validation_sentence(exc))

    @app.exception_handler(UnknownVideo)
    @app.exception_handler(UnknownMoment)
    async def unknown(request: Request, exc: LookupError):
        return _error(404, str(exc))

    @app.exception_handler(NotReady)
    async def not_ready(request: Request, exc: NotReady):
        return _error(503, str(exc), {"Retry-After": "2"})

    @app.exception_handler(RankerError)
    async def ranker_ended(request: Request, exc: RankerError):
        log.error("%s %s: %s", request.method, request.url.path, exc)
        return _error(503, str(exc), {"Retry-After": "1"})

    for kind in BAD_REQUESTS:
        app.add_exception_handler(kind, _bad_request)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "the server could not answer this request; its log says why")


def _allowed(app: FastAPI, scope: dict) -> str:
    """The methods some route answers at the scope's path (a path may have a route per
    method: GET and POST /api/search), for a 405's ``Allow`` header."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.matches(scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


async def _bad_request(request: Request, exc: Exception):
    return _error(400, str(exc))


def _validation_sentence(exc: RequestValidationError) -> str:
    """FastAPI's first validation error as one sentence: "k: input should be ...". """
    errors = exc.errors()
    if not errors:
        return "the request is not valid"
    first = errors[0]
    if first.get("type") == "json_invalid":  # loc: ("body", character offset)
        reason = (first.get("ctx") or {}).get("error") or "it does not parse"
        at = first.get("loc", ())[-1:]
        where = f" at character {at[0]}" if at and isinstance(at[0], int) else ""
        return f"the request body is not valid JSON ({reason}{where})"
    where = ".".join(str(part) for part in first.get("loc", ())
                     if part not in ("query", "body", "path"))
    message = str(first.get("msg", "is not valid"))
    if message[1:2].islower():  # "Field required" reads on after "k: "; "JSON ..." stays
        message = message[:1].lower() + message[1:]
    return f"{where}: {message}" if where else message


def media_cache(settings: Settings) -> MediaCache | None:
    """Where videos a browser cannot play are converted (None: ``media_cache_bytes`` 0)."""
    if settings.media_cache_bytes <= 0:
        return None
    folder = settings.media_cache or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dicosa", "media")
    return MediaCache(folder, settings.media_cache_bytes)


def _install_stream(app: FastAPI, service: Service, media: MediaCache | None) -> None:
    """The stream route, GET and HEAD: the file as the browser can play it (converted into
    ``media`` where it cannot play the file as it is)."""
    answers = {200: _MEDIA["video"], 206: {**_MEDIA["video"], "description":
                                           "the byte range asked for"},
               304: {"description": "If-None-Match named the current ETag"},
               **errors(404, 416, 500, 503)}

    @app.get("/api/videos/{video_id}/stream", tags=["videos"], response_class=Response,
             responses=answers)
    def stream(video_id: str, request: Request) -> Response:
        """The video, as the browser can play it: the file, or (AVI, MPEG-2, HEVC, ...)
        converted to MP4 once and kept (the first request waits for it); ``Range: bytes=...``
        gets 206 and ``Content-Range``."""
        try:
            return stream_response(service.engine.video(video_id), request.headers, media)
        except TranscodeError as exc:
            log.warning("video %s cannot be sent: %s", video_id, exc)
            return _error(500, f"this video cannot be played in a browser: {exc}")

    @app.head("/api/videos/{video_id}/stream", tags=["videos"], response_class=Response,
              responses=answers)
    def stream_head(video_id: str, request: Request) -> Response:
        """The stream's headers, as GET answers them, without the body."""
        return stream(video_id, request)


def _install_pages(app: FastAPI, guard: Guard, settings: Settings) -> None:
    @app.get("/", include_in_schema=False)
    def page() -> Response:
        return Response((STATIC / "index.html").read_bytes(), media_type="text/html",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/login", include_in_schema=False)
    def login_page() -> Response:
        return Response((STATIC / "login.html").read_bytes(), media_type="text/html",
                        headers={"Cache-Control": "no-store"})

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
        target = safe_next((form.get("next") or ["/"])[0])
        if not guard.enabled:
            return RedirectResponse(target, 303)
        if not guard.is_key((form.get("key") or [""])[0]):
            await asyncio.sleep(0.5)  # slows guessing
            return RedirectResponse(f"/login?failed=1&next={quote(target)}", 303)
        response = RedirectResponse(target, 303)
        response.set_cookie(COOKIE, guard.session(), max_age=settings.session_ttl_s,
                            httponly=True, samesite="strict", secure=settings.secure_cookie)
        return response


def _responder(app: FastAPI, guard: Guard,
               thumbnails: Thumbnails) -> Callable[[Answer, float], Response]:
    def respond(answer: Answer, started: float) -> Response:
        """The answer's body as it is (FastAPI's encoder pass over it costs milliseconds),
        with the media links of each hit (tokens in them when a key is set) and the time since
        ``started``; the page's best moments start decoding."""
        wanted = []
        for hit, file in zip(answer.body["hits"], answer.files, strict=True):
            if file is None:  # its file is gone or may not be served
                hit.update(video=None, thumbnail=None, media_type=None, media_token=None)
                continue
            vid = hit["id"]
            token = f"token={guard.media_token(vid)}" if guard.enabled else ""
            best = (hit["moment"] or {}).get("best") or {}
            t = best.get("time") or 0.0
            wanted.append((file, t))
            hit["video"] = f"/api/videos/{vid}/stream" + (f"?{token}" if token else "")
            hit["thumbnail"] = f"/api/videos/{vid}/thumb?t={t:g}" + (f"&{token}" if token
                                                                        else "")
            hit["media_type"] = served_type(file, app.state.media)
            hit["media_token"] = token or None  # for links to its other moments
        thumbnails.prefetch(wanted)
        answer.body["times_ms"]["total"] = round(1000 * (time.perf_counter() - started), 3)
        return _JSON(answer.body)

    return respond


def _install_api(app: FastAPI, service: Service, settings: Settings, batcher: Batcher,
                 respond: Callable[[Answer, float], Response]) -> None:
    """Search (GET and POST), answers sent by ``respond``."""
    limits = settings.limits

    def run_search(request: SearchRequest, http: Request) -> Response:
        started = time.perf_counter()
        engine = service.engine
        engine.check(request)
        return respond(batcher.answer(engine, request, getattr(http.state, "ticket", None)),
                       started)

    searched = {200: {"model": SearchAnswer}, **errors(400, 500, 503)}

    @app.get("/api/search", tags=["search"], response_model=None, responses=searched)
    def search(http: Request, q: str, exclude: Annotated[list[str] | None, Query()] = None,
               k: int = 10, offset: int = 0, candidates: int = 1000, mode: str | None = None,
               explain: bool = False, source: str | None = None) -> Response:
        """Rank the videos for ``q`` ("A without B" leaves B out, as ``exclude`` does): the
        page ``[offset, offset + k)`` with each hit's frame weights, their times and the best
        moment, the time per stage, and (``explain``) the words and concepts behind each;
        ``source`` (visual, subtitles, speech, screen, text, all) what the query is matched
        against, each hit saying the ``line`` that matched."""
        return run_search(_checked(limits, q, exclude or [], k, offset, candidates, mode,
                                   explain, source), http)

    @app.post("/api/search", tags=["search"], response_model=None, responses=searched)
    def search_body(body: SearchBody, http: Request) -> Response:
        """:func:`search` with the parameters in a JSON body."""
        return run_search(_checked(limits, **body.model_dump()), http)


def _install_status(app: FastAPI, service: Service, settings: Settings, guard: Guard,
                    batcher: Batcher) -> None:
    """Whether the service answers, whether its index is open, and what it searches."""
    limits = settings.limits

    @app.get("/api/health", tags=["service"], response_model=None,
             responses={200: {"model": Health}, **errors(500)})
    def health() -> dict:
        """The process answers (it may still be opening the index: see /api/ready)."""
        return {"status": "ok"}

    @app.get("/api/ready", tags=["service"], response_model=None,
             responses={200: {"model": Ready}, **errors(500, 503)})
    def ready() -> dict:
        """The index is open and searchable."""
        engine = service.engine
        return {"ready": True, "videos": len(engine.index), "opened_at":
                engine.opened_at.isoformat(timespec="seconds"), "reloads": service.reloads,
                "last_reload": service.last_reload, "reload_error": service.reload_error}

    @app.get("/api/info", tags=["service"], response_model=None,
             responses={200: {"model": Info}, **errors(500, 503)})
    def info() -> dict:
        """What is being searched: videos, model, plugins, search modes, backend, limits."""
        return {**service.engine.info(), "limits": vars(limits), "version": __version__,
                "api_key": guard.enabled,
                "server": {"pid": os.getpid(), "threads": batcher.ranking.threads,
                           "max_batch": settings.max_batch, **settings.topology.as_dict()}}


def _install_videos(app: FastAPI, service: Service, settings: Settings,
                    thumbnails: Thumbnails,
                    respond: Callable[[Answer, float], Response]) -> None:
    """A video's facts, "more like this" and its thumbnails (its stream:
    :func:`_install_stream`)."""
    limits, compute = settings.limits, service.compute  # compute: create_app's

    @app.get("/api/videos/{video_id}", tags=["videos"], response_model=None,
             responses={200: {"model": VideoDetails}, **errors(404, 500, 503)})
    def video(video_id: str) -> dict:
        """A video's name, title, duration and frame rate (never its path)."""
        return service.engine.details(video_id)

    @app.get("/api/videos/{video_id}/similar", tags=["videos"], response_model=None,
             responses={200: {"model": SearchAnswer}, **errors(400, 404, 500, 503)})
    def similar(video_id: str, k: int = 10, offset: int = 0, candidates: int = 1000,
                row: str | None = None) -> Response:
        """More like this: the videos whose frames are most like this video's (or, with
        ``row``, like one of its moments: a row its hit's ``moments`` name), with moments."""
        request = _checked(limits, "similar", [], k, offset, candidates, None, False)
        started = time.perf_counter()
        return respond(compute.run(service.engine.similar, video_id, row=row, k=request.k,
                                   offset=request.offset, candidates=request.candidates),
                       started)

    @app.get("/api/videos/{video_id}/thumb", tags=["videos"], response_class=Response,
             responses={200: _MEDIA["image"], **errors(400, 404, 500, 503)})
    def thumb(video_id: str, t: float = 0.0) -> Response:
        """A JPEG of the frame shown ``t`` seconds into the video (decoded once, cached)."""
        if not math.isfinite(t) or not 0 <= t <= 86_400:
            raise ServeError("t must be a time in seconds between 0 and 86400")
        file = service.engine.video(video_id)
        try:
            image = thumbnails.get(file, t)
        except ThumbnailError:
            return _error(404, "no thumbnail can be made of this video at that time")
        return Response(image, media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=86400"})
