"""The search service's API through FastAPI's test client, on a real tiny index.

The index is built from generated clips (frame i a flat grey level that names it, see
``_videos.py``) with the random-weight tiny model that ``configs/synthetic.yaml`` makes, and is
opened the way ``dicosa serve`` opens it: from the model its manifest recorded.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from dicosa.index import VideoIndex
from dicosa.loading import load_model
from dicosa.model import TextFeatures
from dicosa.serve.app import _JSON, Limits, Service, Settings, create_app
from dicosa.serve.cli import allowed_hosts, binding_warnings
from dicosa.serve.engine import Answer, Engine
from dicosa.serve.media import RangeNotSatisfiable, parse_range
from dicosa.serve.security import COOKIE, Guard
from dicosa.serve.spec import EngineSpec

from ._serve import free_port, wait_for
from ._videos import level_to_index, write_video

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/synthetic.yaml"), "--set", "model.num_frames=4"]
CLIPS = [(20, 10), (30, 25), (3, 10), (40, 10), (12, 5), (16, 8), (25, 10)]  # (frames, fps)
QUERIES = ["a red circle moves left", "a blue square", "a green triangle falls",
           "two white crosses", "a yellow star spins", "an orange ring", "a black heart", "a bar"]


def build(folder: Path) -> Path:
    videos = folder / "videos"
    for i, (frames, fps) in enumerate(CLIPS):
        write_video(videos / ("more" if i == 6 else "") / f"clip{i}.mp4", frames, fps=fps)
    model, source, frames = load_model(None, str(REPO / "configs/synthetic.yaml"),
                                       ["model.num_frames=4"])
    VideoIndex.build(model, videos, folder / "index", meta={"model": source}, backend="exact",
                     num_workers=0, progress=False, frame_sampling=frames.sampling)
    return folder / "index"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def engine(built) -> Engine:
    return Engine.open(built)


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, Settings(reload_interval_s=0)),
                    raise_server_exceptions=False) as c:
        yield c


def error_of(response) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    text = body["error"]
    assert "\n" not in text and "Traceback" not in text and text.strip() == text
    return text


def test_health_ready_and_info(client, engine):
    assert client.get("/api/health").json() == {"status": "ok"}
    ready = client.get("/api/ready").json()
    assert ready["ready"] and ready["videos"] == len(CLIPS)
    info = client.get("/api/info").json()
    assert info["videos"] == len(CLIPS) and info["default_mode"] == "dense"
    assert info["model"] == {"source": "synthetic.yaml", "arch": "dicosa-tiny", "frames": 4,
                             "dim": engine.model.embed_dim, "max_words": 16}
    assert info["plugins"] == {}  # no head, no text: nothing but the pictures
    assert info["backend"] == "exact" and set(info["modes"]) == {"dense"}
    assert info["limits"]["page"] == Limits().page
    assert "paths" not in json.dumps(info) and str(engine.directory) not in json.dumps(info)
    assert client.get("/openapi.json").json()["paths"]["/api/search"]["get"]


def test_search_gives_each_hit_its_frame_weights_times_and_best_moment(client, engine):
    query = "a red circle moves left"
    answer = client.get("/api/search", params={"q": query, "k": 5}).json()
    assert answer["query"]["text"] == query and answer["videos"] == len(CLIPS)
    assert {"encode", "first_stage", "rerank", "hooks", "top", "moments", "total"} <= set(
        answer["times_ms"])
    hits = answer["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    # The naive reference: DiCoSA's own scores and pooling weights for this query.
    index, model = engine.index, engine.model
    with torch.no_grad():
        text = model.encode_text(index.tokenizer([query]))
        ids = np.array([h["id"] for h in hits])
        video = index.store.gather(ids).to(dtype=torch.float32)
        explained = model.explain(text, video)
    np.testing.assert_allclose([h["dicosa"] for h in hits], explained["similarity"][0],
                               rtol=1e-4, atol=1e-5)
    rows = index.store.table.rows(ids)
    for hit, weights, mask, (_, row) in zip(hits, explained["weights"][0], video.frame_mask,
                                            rows.iterrows(), strict=True):
        assert hit["name"] == Path(row["path"]).name and "path" not in hit
        frames = hit["moment"]["frames"]
        np.testing.assert_allclose([f["weight"] for f in frames],
                                   weights.masked_fill(~mask, 0), atol=1e-5)
        times = [f["time"] for f in frames]
        valid = mask.nonzero().flatten().tolist()
        assert [t is None for t in times] == [not m for m in mask.tolist()]
        assert all(0 <= times[j] < row["duration"] for j in valid)
        assert times[valid[0]] < times[valid[-1]] or len(valid) == 1
        best = hit["moment"]["best"]
        assert best["frame"] == max(valid, key=lambda j: frames[j]["weight"])
        assert best["time"] == times[best["frame"]]
        assert hit["thumbnail"] == f"/api/videos/{hit['id']}/thumb?t={best['time']:g}"
        assert hit["video"] == f"/api/videos/{hit['id']}/stream"
        assert hit["media_type"] == "video/mp4"
    short = next(h for h in hits + client.get("/api/search", params={
        "q": query, "k": 7}).json()["hits"] if h["name"] == "clip2.mp4")
    assert [f["time"] for f in short["moment"]["frames"]] == [0.0, 0.1, 0.2, None]  # 3 frames


def test_post_is_get_and_paging_continues_the_ranking(client):
    params = {"q": "a blue square", "k": 6, "candidates": 50}
    got = client.get("/api/search", params=params).json()
    posted = client.post("/api/search", json=params).json()
    assert [h["id"] for h in posted["hits"]] == [h["id"] for h in got["hits"]]
    first = client.get("/api/search", params={**params, "k": 3}).json()
    second = client.get("/api/search", params={**params, "k": 3, "offset": 3}).json()
    assert [h["id"] for h in first["hits"] + second["hits"]] == [h["id"] for h in got["hits"]]
    assert [h["rank"] for h in second["hits"]] == [4, 5, 6]
    assert first["more"] and second["more"]
    last = client.get("/api/search", params={**params, "k": 3, "offset": 6}).json()
    assert len(last["hits"]) == 1 and not last["more"]
    assert client.get("/api/search", params={**params, "offset": 9}).json()["hits"] == []
    error_of(client.post("/api/search", json={**params, "unknown": 1}))


def test_stream_answers_byte_ranges(client, engine):
    file = engine.video(0)  # MPEG-4 part 2, which a browser cannot play: sent as H.264 MP4
    sent, media_type, converted = client.app.state.media.get(file.path, file.size, file.mtime)
    assert converted and media_type == "video/mp4"
    data = sent.read_bytes()
    size = len(data)
    whole = client.get("/api/videos/0/stream")
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["accept-ranges"] == "bytes" and whole.headers["content-type"] == \
        "video/mp4"
    cases = {"bytes=0-99": (0, 99), "bytes=100-": (100, size - 1), "bytes=-10": (size - 10,
                                                                                size - 1),
             f"bytes=5-{size + 100}": (5, size - 1)}
    for header, (first, last) in cases.items():
        part = client.get("/api/videos/0/stream", headers={"Range": header})
        assert part.status_code == 206, header
        assert part.headers["content-range"] == f"bytes {first}-{last}/{size}"
        assert part.content == data[first:last + 1]
        assert int(part.headers["content-length"]) == last - first + 1
    past = client.get("/api/videos/0/stream", headers={"Range": f"bytes={size}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{size}"
    error_of(past)
    for ignored in ("bytes=0-1,5-6", "items=0-5", "bytes=9-3", "bytes=x-"):
        assert client.get("/api/videos/0/stream", headers={"Range": ignored}).content == data
    etag = whole.headers["etag"]
    stale = client.get("/api/videos/0/stream", headers={"Range": "bytes=0-9",
                                                         "If-Range": '"other"'})
    assert stale.status_code == 200 and stale.content == data
    assert client.get("/api/videos/0/stream",
                      headers={"If-None-Match": etag}).status_code == 304


def test_answers_hold_null_where_a_number_is_not_finite():
    body = {"hits": [{"score": float("nan"), "moment": {"frames": [
        {"score": float("-inf"), "weight": 0.25}]}}], "title": "NaN", "times": (1.5, 2.0)}
    assert json.loads(_JSON(body).body) == {
        "hits": [{"score": None, "moment": {"frames": [{"score": None, "weight": 0.25}]}}],
        "title": "NaN", "times": [1.5, 2.0]}
    finite = {"hits": [{"score": 0.5, "name": "é"}], "times": [1.5]}  # as Starlette writes it
    assert _JSON(finite).body == json.dumps(finite, ensure_ascii=False,
                                            separators=(",", ":")).encode()


def test_parse_range_edges():
    assert parse_range(None, 10) is None and parse_range("bytes=-20", 10) == (0, 9)
    assert parse_range("bytes = 2-4", 10) == (2, 4)
    for bad in ("bytes=-0", "bytes=10-"):
        with pytest.raises(RangeNotSatisfiable):
            parse_range(bad, 10)


@pytest.mark.parametrize("path", [
    "/api/videos/..%2F..%2Fetc%2Fpasswd/stream", "/api/videos/..%2f/stream",
    "/api/videos/%2e%2e/stream", "/api/videos/-1/stream", "/api/videos/1e3/stream",
    "/api/videos/99999/stream", "/api/videos/0x1/thumb", "/api/videos/%2Fetc%2Fpasswd",
    "/api/videos/1.0/similar", "/api/videos/%00/stream", "/api/videos/ 1/stream",
    "/api/videos/%D9%A1/stream",  # an Arabic-Indic digit one: digits, but not ASCII ones
])
def test_unknown_and_path_like_ids_are_404(client, path):
    response = client.get(path)
    assert response.status_code == 404, path
    error_of(response)


def test_a_file_that_leads_out_of_its_folder_is_never_served(client, engine, tmp_path):
    file = engine.video(5)
    kept = tmp_path / "kept.mp4"
    shutil.move(file.path, kept)
    outside = tmp_path / "secret.mp4"
    outside.write_bytes(b"not for you")
    try:
        file.path.symlink_to(outside)  # the row's path, now a link out of its folder
        for url in ("/api/videos/5/stream", "/api/videos/5/thumb"):
            assert client.get(url).status_code == 404
        hit = next(h for h in client.get("/api/search", params={"q": "a", "k": 7}).json()[
            "hits"] if h["id"] == 5)
        assert hit["video"] is None and hit["thumbnail"] is None
        file.path.unlink()
        assert client.get("/api/videos/5/stream").status_code == 404  # a missing file
    finally:
        file.path.unlink(missing_ok=True)
        shutil.move(kept, file.path)
    assert client.get("/api/videos/5/stream").status_code == 200


def test_thumbnails_show_the_moment_and_are_decoded_once(client, engine):
    thumbnails = client.app.state.thumbnails
    # clip3: 40 frames at 10 fps; the frame shown at t is frame floor(t * 10).
    for t, frame in ((0.0, 0), (1.5, 15), (1.55, 15), (3.9, 39), (99, 39)):
        response = client.get("/api/videos/3/thumb", params={"t": t})
        assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
        assert "max-age" in response.headers["cache-control"]
        image = simplejpeg.decode_jpeg(response.content)
        assert level_to_index(image.mean()) == frame, t
    before = thumbnails.decoded
    assert client.get("/api/videos/3/thumb", params={"t": 1.5}).status_code == 200
    assert thumbnails.decoded == before  # from the cache
    for bad in ({"t": -1}, {"t": "nan"}, {"t": "soon"}):
        assert client.get("/api/videos/3/thumb", params=bad).status_code == 400


def test_a_search_page_starts_its_thumbnails_decoding(client, engine):
    thumbnails = client.app.state.thumbnails
    answer = client.get("/api/search", params={"q": "a yellow star spins", "k": 7}).json()
    deadline = time.monotonic() + 20
    keys = {thumbnails.key(engine.video(h["id"]), h["moment"]["best"]["time"])
            for h in answer["hits"]}
    while time.monotonic() < deadline and not keys <= set(thumbnails._cache):
        time.sleep(0.05)
    before = thumbnails.decoded
    for hit in answer["hits"]:
        assert client.get(hit["thumbnail"]).status_code == 200
    assert thumbnails.decoded == before  # all prefetched


def test_more_like_this_ranks_by_dicosa_with_the_video_as_query(client, engine):
    answer = client.get("/api/videos/3/similar", params={"k": 6}).json()
    ids = [h["id"] for h in answer["hits"]]
    assert 3 not in ids and len(ids) == 6 and answer["query"]["like"] == 3
    index, model = engine.index, engine.model
    with torch.no_grad():
        proxy = torch.from_numpy(index.store.proxies(np.array([3])))
        others = np.array([i for i in index.ids if i != 3])
        video = index.store.gather(others).to(dtype=torch.float32)
        scores = model.score(TextFeatures(proxy), video)[0]
    assert ids == others[np.argsort(-scores.numpy(), kind="stable")].tolist()
    assert client.get("/api/videos/77/similar").status_code == 404


def test_limits_and_bad_parameters_are_one_sentence(client):
    limits = Limits()
    cases = [{"q": "x" * (limits.query_chars + 1)}, {"q": "a", "k": limits.page + 1},
             {"q": "a", "k": 0}, {"q": "a", "offset": limits.depth}, {"q": "a", "offset": -1},
             {"q": "a", "candidates": limits.candidates + 1}, {"q": "   "}, {"q": "a", "k": "x"},
             {"q": "a", "mode": "lexical"}, {"q": "a dog without"}, {}]
    for params in cases:
        response = client.get("/api/search", params=params)
        assert response.status_code == 400, params
        error_of(response)
    many = client.get("/api/search", params={"q": "a", "exclude": [
        f"thing {i}" for i in range(limits.exclusions + 1)]})
    assert many.status_code == 400 and "at most" in error_of(many)
    # Leaving something out needs a concepts head; "without" in the text is only noted.
    assert "concepts head" in error_of(client.get("/api/search",
                                                  params={"q": "a", "exclude": "b"}))
    noted = client.get("/api/search", params={"q": "a red circle without a blue square"})
    assert noted.status_code == 200 and "concepts head" in noted.json()["notes"][0]
    assert error_of(client.get("/nowhere")) == "there is nothing at this address"
    assert client.delete("/api/search").status_code == 405


def test_an_internal_failure_is_one_sentence_without_details(client, engine, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internals at /srv/private")

    monkeypatch.setattr(engine, "rank", broken)
    response = client.get("/api/search", params={"q": "a red circle"})
    assert response.status_code == 500
    assert "secret" not in response.text and "/srv" not in response.text
    error_of(response)


def test_the_api_key_guards_every_endpoint_media_included(engine):
    key = "correct horse battery staple"
    app = create_app(engine, Settings(api_key=key, reload_interval_s=0))
    with TestClient(app, raise_server_exceptions=False) as c:
        for url in ("/api/search?q=a", "/api/info", "/api/health", "/api/videos/0/stream",
                    "/api/videos/0/thumb", "/api/videos/0/similar", "/openapi.json",
                    "/static/app.js"):
            response = c.get(url)
            assert response.status_code == 401, url
            error_of(response)
        page = c.get("/?q=a+dog", headers={"Accept": "text/html"}, follow_redirects=False)
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2F%3Fq%3Da%2Bdog"  # back to the search
        assert c.get("/login").status_code == 200
        assert c.get("/api/info", headers={"X-API-Key": key}).status_code == 200
        assert c.get("/api/info", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/api/info", headers={"X-API-Key": key + "x"}).status_code == 401
        # The search answer's media links carry a token for that video only.
        hit = c.get("/api/search?q=a&k=2", headers={"X-API-Key": key}).json()["hits"][0]
        assert "token=" in hit["video"] and "token=" in hit["thumbnail"]
        assert c.get(hit["video"], headers={"Range": "bytes=0-3"}).status_code == 206
        assert c.get(hit["thumbnail"]).status_code == 200
        token = hit["video"].split("token=")[1]
        other = 1 if hit["id"] != 1 else 0
        assert c.get(f"/api/videos/{other}/stream?token={token}").status_code == 401
        assert c.get(f"/api/search?q=a&token={token}").status_code == 401
        tampered = token[:-1] + ("0" if token[-1] != "0" else "1")
        assert c.get(f"/api/videos/{hit['id']}/stream?token={tampered}").status_code == 401
        # Logging in sets the session cookie the page (and its <video>) then send.
        wrong = c.post("/login", data={"key": "nope", "next": "/"}, follow_redirects=False)
        assert wrong.status_code == 303 and "failed=1" in wrong.headers["location"]
        assert COOKIE not in c.cookies
        done = c.post("/login", data={"key": key, "next": "//evil.example/"},
                      follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/"
        cookie = done.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert c.get("/api/videos/0/stream", headers={"Range": "bytes=0-3"}).status_code == 206
        assert c.get("/").status_code == 200


def test_tokens_expire():
    now = [1000.0]
    guard = Guard("k", token_ttl_s=60, clock=lambda: now[0])
    token, session = guard.media_token(4), guard.session()
    path = "/api/videos/4/stream"
    assert guard.allows(path, {}, {}, {"token": token})
    assert guard.allows("/api/info", {}, {COOKIE: session}, {})
    now[0] += 61
    assert not guard.allows(path, {}, {}, {"token": token})
    assert guard.allows("/api/info", {}, {COOKIE: session}, {})  # sessions last longer
    assert not Guard("other key", clock=lambda: now[0]).allows("/api/info", {},
                                                                {COOKIE: session}, {})


def test_loopback_by_default_and_host_names_checked(engine):
    from dicosa.cli import build_parser

    args = build_parser().parse_args(["serve", "INDEX"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.api_key is None
    assert binding_warnings("127.0.0.1", None) == [] and binding_warnings("0.0.0.0", "k") == []
    assert "without an API key" in binding_warnings("0.0.0.0", None)[0]
    assert allowed_hosts("0.0.0.0", []) is None
    app = create_app(engine, Settings(allowed_hosts=allowed_hosts("127.0.0.1", []),
                                      reload_interval_s=0))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/api/health").status_code == 200
        assert c.get("/api/health", headers={"Host": "localhost:8000"}).status_code == 200
        rebound = c.get("/api/health", headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 400 and "answers requests for" in error_of(rebound)


def test_concurrent_searches_get_their_own_answers(engine):
    """Eight searches at once through the batching thread: each gets what it would alone
    (no shared search parameters), and some ran together."""
    alone = {}
    for i, q in enumerate(QUERIES):
        alone[q] = engine.search(_request(q, k=3 + i % 3, offset=i % 2)).body
    app = create_app(engine, Settings(reload_interval_s=0, max_batch=8, batch_wait_s=0.05))
    with TestClient(app, raise_server_exceptions=False) as c:
        barrier = threading.Barrier(len(QUERIES))

        def ask(i_q):
            i, q = i_q
            barrier.wait()
            return q, c.get("/api/search", params={"q": q, "k": 3 + i % 3,
                                                   "offset": i % 2}).json()

        with ThreadPoolExecutor(len(QUERIES)) as pool:
            answers = dict(pool.map(ask, enumerate(QUERIES)))
    for q, answer in answers.items():
        assert [h["id"] for h in answer["hits"]] == [h["id"] for h in alone[q]["hits"]], q
        np.testing.assert_allclose([h["score"] for h in answer["hits"]],
                                   [h["score"] for h in alone[q]["hits"]], rtol=1e-4, atol=1e-5)
    assert max(a["batch"] for a in answers.values()) > 1


def _request(q: str, **kwargs):
    from dicosa.serve.engine import SearchRequest

    return SearchRequest(q, **kwargs)


def run_cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dicosa", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_serve_command_reports_a_bad_index_in_one_sentence(tmp_path, capsys):
    from dicosa.cli import main

    assert main(["serve", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a video index" in err and err.count("\n") == 1


def test_serve_command_listens_on_loopback_only_and_picks_its_topology(built):
    """``dicosa serve INDEX`` with no option: loopback only, and where searches rank picked
    from the machine (dicosa/serve/topology.py), said on start and in /api/info, with as many
    ranker processes running as it says."""
    import httpx

    port = free_port()
    server = run_cli("serve", str(built), "--port", str(port))
    try:
        wait_for(f"http://127.0.0.1:{port}/api/ready", timeout=180)
        listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
        local = {line.split()[1] for line in listening if line.split()[3] == "0A"}  # LISTEN
        assert f"0100007F:{port:04X}" in local  # 127.0.0.1, not 0.0.0.0
        assert f"00000000:{port:04X}" not in local
        picked = httpx.get(f"http://127.0.0.1:{port}/api/info", timeout=30).json()["server"]
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/" in out
    assert picked["chosen"] == "machine" and f"searches rank in {picked['why']}\n" in out
    if picked["rankers"]:  # the machine has the cores and the memory for them
        assert picked["why"].startswith(f"{picked['rankers']} ranker processes: ")
        assert picked["threads"] == max(1, len(os.sched_getaffinity(0)) // picked["rankers"])
    else:
        assert picked["why"].startswith("this process: ")
    assert len(children) >= picked["rankers"]  # spawn's resource tracker may be one more


def test_the_text_tower_and_query_cache_are_set_and_shown(built):
    """--text-tower packed --query-cache N: the same ranking, and /api/info counts the cache's
    hits (a second page of a query is not encoded again)."""
    engine = Engine.open(EngineSpec(built, text_tower="packed", query_cache=4))
    plain = Engine.open(EngineSpec(built, query_cache=0))
    with TestClient(create_app(engine, Settings(reload_interval_s=0))) as c:
        before = c.get("/api/info").json()["text"]
        pages = [c.get("/api/search", params={"q": "a blue square", "k": 3, "offset": o}).json()
                 for o in (0, 3)]
        info = c.get("/api/info").json()
    want = plain.search(_request("a blue square", k=6)).body["hits"]
    assert [h["id"] for p in pages for h in p["hits"]] == [h["id"] for h in want]
    assert before["tower"] == "packed" and before["cache"]["capacity"] == 4
    assert info["text"]["cache"]["hits"] == before["cache"]["hits"] + 1
    assert info["text"]["cache"]["misses"] == before["cache"]["misses"] + 1
    assert info["frame_dtype"] == "float16" and info["server"]["rankers"] == 0
    assert info["server"]["chosen"] == "options" and info["server"]["why"] == "this process"
    assert info["server"]["max_batch"] == Settings().max_batch


def test_the_service_maps_its_store_in_when_it_opens_and_reopens(built, monkeypatch):
    """Engine.open(populate=True), as dicosa serve opens an index: the frame store is mapped
    in (populate_shards, tested on a real store in test_store.py) within half the memory
    available, on opening and on every reopening; not when not asked."""
    import dicosa.serve.engine as opening

    budgets = []
    real = opening.populate_shards
    monkeypatch.setattr(opening, "populate_shards",
                        lambda shards, max_bytes: budgets.append(max_bytes) or real(shards,
                                                                                   max_bytes))
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    engine = Engine.open(EngineSpec(built, populate=True))
    reopened = engine.reopen()
    assert engine.populated and reopened.populated and len(budgets) == 2
    assert reopened.spec == engine.spec  # a reopened snapshot opens what the first did
    assert all(0.3 * available < b < 0.7 * available for b in budgets)
    assert not Engine.open(built).populated and len(budgets) == 2


def test_videos_added_by_another_writer_are_searched_after_a_reload(built, tmp_path):
    """Videos are added to the served folder while searches run, as ``dicosa index``
    does (``VideoIndex.build`` into it, with its own model and index objects, on another
    thread; a process of its own writes the same files): each search sees the old collection
    or the new one, and the service then reopens it."""
    folder = shutil.copytree(built, tmp_path / "index")
    engine = Engine.open(folder)
    service = Service(engine, reload_interval_s=0)
    app = create_app(service, Settings(reload_interval_s=0))
    new = tmp_path / "new"
    for i in range(3):
        write_video(new / f"added{i}.mp4", 15 + i, fps=10)
    seen, stop = [], threading.Event()
    with TestClient(app, raise_server_exceptions=False) as c:
        def searching():
            while not stop.is_set():
                response = c.get("/api/search", params={"q": "a red circle", "k": 50})
                seen.append((response.status_code, response.json().get("videos"),
                             len(response.json().get("hits", []))))
                service.check_reload()

        worker = threading.Thread(target=searching)
        worker.start()
        try:
            model, source, _ = load_model(None, TINY[1], TINY[3:])
            VideoIndex.build(model, new, folder, meta={"model": source}, num_workers=0,
                             progress=False)
            deadline = time.monotonic() + 60
            # The writer commits more than once (its settings, then each shard): the
            # service may reopen in between, and reopens again for the next commit.
            while (len(service.engine.index) < len(CLIPS) + 3
                   and time.monotonic() < deadline):
                time.sleep(0.1)
        finally:
            stop.set()
            worker.join()
        assert service.reloads >= 1 and len(service.engine.index) == len(CLIPS) + 3
        after = c.get("/api/search", params={"q": "a red circle", "k": 50}).json()
    assert after["videos"] == len(CLIPS) + 3 and len(after["hits"]) == len(CLIPS) + 3
    assert {h["name"] for h in after["hits"]} >= {"added0.mp4", "added1.mp4", "added2.mp4"}
    assert seen and all(status == 200 for status, _, _ in seen)
    assert {(videos, hits) for _, videos, hits in seen} <= {(len(CLIPS), len(CLIPS)),
                                                            (len(CLIPS) + 3, len(CLIPS) + 3)}


class _StubEngine:
    """Ranks instantly, remembering each batch of texts; "bad" fails its batch. Its page is
    the ranking's stage and batch, as Engine.answer cuts one."""

    def __init__(self):
        self.calls = []

    def rank(self, texts, *, depth, candidates, exclude=(), mode=None, options=()):
        from dicosa.serve.engine import Ranked

        self.calls.append(list(texts))
        if "bad" in texts:
            raise ValueError("no good")
        return [Ranked([], 0, {}, t, batch=len(texts)) for t in texts]

    def answer(self, request, ranked):
        return Answer({"stage": ranked.stage, "batch": ranked.batch, "times_ms": {}}, [])

    def search(self, request):
        return self.answer(request, self.rank([request.text], depth=1, candidates=1)[0])


def test_a_failed_batch_is_run_again_one_search_at_a_time():
    """A search that fails fails alone: its batch is run again search by search."""
    from dicosa.serve.batching import Batcher

    class SlowToQueue(queue.Queue):
        """"one" and "two" take a while to reach the queue after "bad" is in it."""

        def put(self, item, *args, **kwargs):
            if item is not None and item.request.text != "bad":
                time.sleep(0.2)
            super().put(item, *args, **kwargs)

    stub, batcher = _StubEngine(), Batcher(max_batch=4, max_wait_s=5.0)
    batcher._queue = SlowToQueue()
    tickets = {text: batcher.expect() for text in ["one", "bad", "two"]}  # all three received
    barrier = threading.Barrier(3)

    def ask(text):
        barrier.wait()
        try:
            return batcher.answer(stub, _request(text), tickets[text]).body["stage"]
        except ValueError as exc:
            return str(exc)

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, ["one", "bad", "two"]))
    batcher.close()
    assert answers == ["one", "no good", "two"]
    calls = stub.calls  # the batch waited for the two on their way, failed, ran one by one
    assert sorted(calls[0]) == ["bad", "one", "two"]
    assert sorted(calls[1:]) == [["bad"], ["one"], ["two"]]


def test_a_batch_waits_only_for_searches_on_their_way():
    """A lone search is ranked at once however long a batch may wait; a search already
    received (its ticket taken) is waited for, and joins; one that never comes costs the
    batch at most max_wait_s."""
    from dicosa.serve.batching import Batcher

    stub, batcher = _StubEngine(), Batcher(max_batch=4, max_wait_s=1.0)
    started = time.perf_counter()
    alone = batcher.answer(stub, _request("one")).body
    assert time.perf_counter() - started < 0.5 and alone["times_ms"]["queue"] < 500
    assert alone["batch"] == 1 and batcher.coming == 0

    ticket = batcher.expect()  # "two" has arrived and is being parsed

    def late():
        time.sleep(0.2)
        return batcher.answer(stub, _request("two"), ticket).body

    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(late)
        first = batcher.answer(stub, _request("three")).body
        assert first["batch"] == second.result()["batch"] == 2 and ["three", "two"] in stub.calls
    assert batcher.coming == 0

    lost = batcher.expect()  # received, then never queued (its request failed elsewhere)
    started = time.perf_counter()
    assert batcher.answer(stub, _request("four")).body["batch"] == 1
    assert 0.9 < time.perf_counter() - started < 5
    lost.settle()
    lost.settle()  # settling twice is settling once
    assert batcher.coming == 0
    batcher.close()
