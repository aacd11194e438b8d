"""The published OpenAPI schema against what a running service really answers.

Each request goes to a real uvicorn server; its request and its answer (status, content type,
body) are validated with openapi-core against the ``/openapi.json`` that server publishes.
openapi-core fails an answer whose status the operation does not list (a 400 where the schema
says 422), whose body breaks its model, or that carries a field the model does not declare
(the models forbid extras: ``dicosa/serve/schemas.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest

pytest.importorskip("fastapi")
openapi_core = pytest.importorskip("openapi_core")

from openapi_core import OpenAPI  # noqa: E402
from openapi_core.testing import MockRequest, MockResponse  # noqa: E402

from dicosa.search.query import QUERY_PATTERN  # noqa: E402
from dicosa.serve.app import Limits, Settings, create_app  # noqa: E402
from dicosa.serve.engine import Engine  # noqa: E402

from ._serve import served  # noqa: E402
from .test_serve_api import build  # noqa: E402

KEY = "a key for the schema test"


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    return Engine.open(build(tmp_path_factory.mktemp("schema")))


class Checked:
    """Requests to one live server, each answer validated against its published schema."""

    def __init__(self, base: str, headers: dict | None = None):
        self.base, self.headers = base, headers or {}
        published = httpx.get(base + "/openapi.json", headers=self.headers, timeout=30)
        assert published.status_code == 200
        self.schema = published.json()
        self.openapi = OpenAPI.from_dict(self.schema)

    def __call__(self, method: str, url: str, *, expect: int, json_body: dict | None = None,
                 headers: dict | None = None) -> httpx.Response:
        sent = {**self.headers, **(headers or {})}
        answer = httpx.request(method, self.base + url, json=json_body, headers=sent,
                               timeout=60)
        assert answer.status_code == expect, (url, answer.status_code, answer.text[:300])
        parts = urlsplit(url)
        body = None if json_body is None else json.dumps(json_body).encode()
        request = MockRequest(self.base, method.lower(), parts.path,
                              args=dict(httpx.QueryParams(parts.query).multi_items()),
                              headers={k.lower(): v for k, v in sent.items()},
                              data=body)
        kind = answer.headers.get("content-type", "").split(";")[0]
        response = MockResponse(answer.content, status_code=answer.status_code,
                                headers=dict(answer.headers), content_type=kind)
        self.openapi.validate_response(request, response)
        return answer


def test_every_answer_matches_the_published_schema(engine):
    app = create_app(engine, Settings(reload_interval_s=0))
    with served(app) as base:
        check = Checked(base)
        assert "422" not in json.dumps(check.schema["paths"])
        assert "securitySchemes" not in check.schema.get("components", {})
        check("GET", "/api/health", expect=200)
        check("GET", "/api/ready", expect=200)
        check("GET", "/api/info", expect=200)
        found = check("GET", "/api/search?q=a+red+circle&k=3&explain=true", expect=200).json()
        assert found["hits"] and found["hits"][0]["moment"]["frames"]
        check("POST", "/api/search", json_body={"q": "a blue square", "k": 2}, expect=200)
        check("GET", "/api/search?q=a&k=0", expect=400)
        check("GET", "/api/search?q=a&k=three", expect=400)
        check("GET", "/api/search?q=a&mode=nonsense", expect=400)
        check("POST", "/api/search", json_body={"q": "a", "unknown": 1}, expect=400)
        check("GET", "/api/videos/0", expect=200)
        check("GET", "/api/videos/999", expect=404)
        check("GET", "/api/videos/0/similar?k=2", expect=200)
        check("GET", "/api/videos/0/similar?k=0", expect=400)
        size = len(check("GET", "/api/videos/0/stream", expect=200).content)
        check("GET", "/api/videos/0/stream", headers={"Range": "bytes=0-9"}, expect=206)
        check("GET", "/api/videos/0/stream", headers={"Range": f"bytes={size}-"}, expect=416)
        check("GET", "/api/videos/0/thumb?t=0.1", expect=200)
        check("GET", "/api/videos/0/thumb?t=-1", expect=400)


def test_the_api_key_is_a_security_scheme_and_401_is_declared(engine):
    app = create_app(engine, Settings(reload_interval_s=0, api_key=KEY,
                                      allowed_hosts=("127.0.0.1",)))
    with served(app) as base:
        check = Checked(base, {"X-API-Key": KEY})
        schemes = check.schema["components"]["securitySchemes"]
        assert schemes["ApiKey"] == {**schemes["ApiKey"], "type": "apiKey", "in": "header",
                                     "name": "X-API-Key"}
        assert {"Bearer", "Session", "MediaToken"} <= set(schemes)
        stream = check.schema["paths"]["/api/videos/{video_id}/stream"]["get"]
        assert {"MediaToken": []} in stream["security"]
        assert {"MediaToken": []} not in check.schema["paths"]["/api/info"]["get"]["security"]
        check("GET", "/api/info", expect=200)
        check("GET", "/api/info", headers={"X-API-Key": "wrong"}, expect=401)
        hit = check("GET", "/api/search?q=a&k=1", expect=200).json()["hits"][0]
        assert "token=" in hit["video"]
        # the Host check answers any route with 400, which every operation then lists
        check("GET", "/api/health", headers={"Host": "elsewhere.example"}, expect=400)


def _parameters(schema: dict, path: str) -> dict[str, dict]:
    return {p["name"]: p["schema"] for p in schema["paths"][path]["get"]["parameters"]}


def test_the_schema_states_every_limit_the_server_enforces(engine):
    """Lengths, the query's grammar, ranges, the index's modes; ``exclude`` takes nothing
    where the index has no concepts head (the test index has none); a boundary request the
    schema allows is answered, the first one past it is refused."""
    limits = Limits()
    app = create_app(engine, Settings(reload_interval_s=0))
    with served(app) as base:
        check = Checked(base)
        search = _parameters(check.schema, "/api/search")
        assert search["q"] == {**search["q"], "minLength": 1, "maxLength": limits.query_chars,
                               "pattern": QUERY_PATTERN}
        assert (search["k"]["minimum"], search["k"]["maximum"]) == (1, limits.page)
        assert (search["offset"]["minimum"], search["offset"]["maximum"]) == (
            0, limits.depth - 1)
        assert search["candidates"]["maximum"] == limits.candidates
        assert set(search["mode"]["enum"]) == {*engine.parts.modes, ""}
        assert search["exclude"]["maxItems"] == 0  # no concepts head here
        body = check.schema["components"]["schemas"]["SearchBody"]["properties"]
        assert body["q"]["pattern"] == QUERY_PATTERN and body["k"]["maximum"] == limits.page
        assert {"type": "null"} in body["mode"]["anyOf"]  # a JSON body may say null
        similar = _parameters(check.schema, "/api/videos/{video_id}/similar")
        assert similar["row"]["pattern"] == similar["video_id"]["pattern"] == r"^[0-9]{1,18}$"
        thumb = _parameters(check.schema, "/api/videos/{video_id}/thumb")
        assert (thumb["t"]["minimum"], thumb["t"]["maximum"]) == (0, 86_400)
        # the last page allowed ends at the depth paging reaches: it is cut, not refused
        last = check("GET", f"/api/search?q=a&k={limits.page}&offset={limits.depth - 1}",
                     expect=200).json()
        assert last["query"]["k"] == 1 and last["query"]["offset"] == limits.depth - 1
        check("GET", f"/api/search?q=a&offset={limits.depth}", expect=400)
        check("GET", "/api/search?q=a&source=visual", expect=200)
        check("GET", "/api/videos/0/thumb?t=86400", expect=200)
        # a row id that is not one of the video's moments does not exist: 404
        missing = check("GET", "/api/videos/0/similar?row=5", expect=404).json()
        assert missing == {"error": "row 5 is not a moment of video 0"}


def test_a_method_not_allowed_says_which_are(engine):
    app = create_app(engine, Settings(reload_interval_s=0))
    with served(app) as base:
        for method, path, allowed in (("TRACE", "/api/search", "GET, POST"),
                                      ("DELETE", "/api/videos/0", "GET"),
                                      ("PUT", "/api/health", "GET")):
            answer = httpx.request(method, base + path, timeout=30)
            assert answer.status_code == 405 and answer.headers["allow"] == allowed
            assert answer.json() == {"error": f"{method} is not allowed at this address"}


def test_a_body_that_is_not_json_is_one_sentence(engine):
    app = create_app(engine, Settings(reload_interval_s=0))
    with served(app) as base:
        answer = httpx.post(base + "/api/search", content=b'{"q": "a", "k": }', timeout=30,
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert answer.json() == {"error": "the request body is not valid JSON (Expecting value "
                                      "at character 16)"}


def test_schemathesis_finds_no_valid_request_refused_and_no_failure(engine, tmp_path):
    """Schemathesis against the live server on loopback: its default phases (boundary values,
    then generated requests, then chains of them), 5 examples per operation, a fixed seed,
    every check on requests valid by the schema (no 5xx, answers as published, no valid
    request refused, 405 with Allow). About 150 requests in ~2 s."""
    app = create_app(engine, Settings(reload_interval_s=0))
    with served(app) as base:
        done = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", base + "/openapi.json",
             "--checks", "all", "--mode", "positive", "--max-examples", "5", "--seed", "1",
             "--workers", "1", "--request-timeout", "30", "--no-shrink"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout
    selected = re.search(r"Selected: (\d+)/(\d+)", done.stdout)
    tested = re.search(r"Tested: (\d+)", done.stdout)
    assert selected[1] == selected[2] == tested[1]  # every operation of the schema
