"""dicosa serve --rankers N: searches ranked in N processes fed by one batcher."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from dicosa.index import VideoIndex
from dicosa.loading import load_model
from dicosa.serve.app import Settings, create_app
from dicosa.serve.batching import Batcher
from dicosa.serve.engine import Answer, Engine, SearchRequest
from dicosa.serve.rankers import Rankers
from dicosa.serve.ranking import answers, fair_share
from dicosa.serve.spec import EngineSpec

from ._serve import free_port, wait_for
from ._videos import write_video
from .test_serve_api import CLIPS, QUERIES, TINY, build, run_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("rankers"))


@pytest.fixture(scope="module")
def engine(built) -> Engine:
    return Engine.open(built)


def _rankers(built: Path, count: int) -> Rankers:
    # the spec's defaults, as the engine fixture opens it: the same vectors, not only the
    # ranking
    return Rankers(count, EngineSpec(built), reload_interval_s=0)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (an ended child not yet waited for is a zombie: ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _gone(pids: list[int], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_running(pid) for pid in pids)


def test_ranker_processes_answer_as_the_engine_does(built, engine):
    """Concurrent searches ranked by two ranker processes: each answer's hits, scores and
    moments are the engine's own for that query alone; the rankers stop with the app."""
    rankers = _rankers(built, 2)
    pids = rankers.pids
    assert len(set(pids)) == 2 and os.getpid() not in pids
    app = create_app(engine, Settings(reload_interval_s=0), rankers=rankers)
    with TestClient(app) as c, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda q: c.get("/api/search", params={"q": q, "k": 5}),
                                QUERIES))
        info = c.get("/api/info").json()
    assert info["server"]["rankers"] == 2
    for q, response in zip(QUERIES, answers, strict=True):
        assert response.status_code == 200
        got, alone = response.json(), engine.search(SearchRequest(text=q, k=5)).body
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in alone["hits"]]
        np.testing.assert_allclose([h["score"] for h in got["hits"]],
                                   [h["score"] for h in alone["hits"]], rtol=1e-5, atol=1e-6)
        for mine, its in zip(got["hits"], alone["hits"], strict=True):  # the same moments
            assert mine["moment"]["best"]["frame"] == its["moment"]["best"]["frame"]
            assert ([(m["start"], m["end"]) for m in mine["moment"]["moments"]]
                    == [(m["start"], m["end"]) for m in its["moment"]["moments"]])
        assert "queue" in got["times_ms"] and got["hits"][0]["video"].endswith("/stream")
    assert _gone(pids)


def test_a_killed_ranker_fails_its_search_in_one_sentence_and_is_replaced(built, engine):
    rankers = _rankers(built, 1)
    app = create_app(engine, Settings(reload_interval_s=0), rankers=rankers)
    params = {"q": "a red circle", "k": 3}
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/api/search", params=params).status_code == 200
        killed = rankers.pids[0]
        os.kill(killed, signal.SIGKILL)
        assert _gone([killed])
        failed = c.get("/api/search", params=params)
        assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
        assert failed.json() == {"error": "the process ranking this search ended (exit "
                                          "status -9); try again"}
        again = c.get("/api/search", params=params)
        assert again.status_code == 200 and len(again.json()["hits"]) == 3
        assert rankers.pids[0] != killed


class _Pages:
    """An engine whose batches fail when one of them is "bad" (as a ranker's engine)."""

    def __init__(self):
        self.ranked: list[list[str]] = []

    def rank(self, texts, **_):
        self.ranked.append(list(texts))
        if "bad" in texts:
            raise RuntimeError("this batch cannot be ranked")
        return list(texts)

    def answer(self, request, ranked):
        return Answer({"q": ranked}, [])

    def search(self, request):
        return self.answer(request, self.rank([request.text])[0])


def test_a_ranker_ranks_a_failed_batch_again_one_search_at_a_time():
    pages = _Pages()
    outcomes = answers(pages, [SearchRequest(text=t) for t in ("one", "bad", "two")])
    assert pages.ranked == [["one", "bad", "two"], ["one"], ["bad"], ["two"]]
    assert [ok for ok, _ in outcomes] == [True, False, True]
    assert outcomes[0][1].body == {"q": "one"} and outcomes[2][1].body == {"q": "two"}
    assert str(outcomes[1][1]) == "this batch cannot be ranked"


class _TwoRankers:
    """Rankers as the batcher sees them: two, one busy with ``busy`` searches; a free one is
    handed out when the test says so; each batch is answered at once."""

    def __init__(self, busy: int):
        self.busy, self.batches, self._free = busy, [], queue.Queue()

    def __len__(self) -> int:
        return 2

    def acquire(self):
        return self._free.get()

    def share(self, waiting: int, max_batch: int) -> int:
        return fair_share(waiting, self.busy, 2, max_batch)

    def free(self) -> None:
        self._free.put(object())

    def submit(self, ranker, engine, requests, done, quiet=False) -> None:
        self.batches.append(len(requests))
        done([(True, Answer({"times_ms": {}}, [])) for _ in requests])


def test_a_free_ranker_takes_its_share_of_the_searches_not_all_that_wait():
    """Six searches wait while the other ranker ranks two: the free ranker takes four (the
    eight divided by two), and the two left go to the next free one, not six at once."""
    rankers = _TwoRankers(busy=2)
    batcher = Batcher(max_batch=8, ranking=rankers)
    engine = object()  # the batcher only names the snapshot; the rankers rank
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(batcher.answer, engine, SearchRequest(text=f"q{i}"))
                   for i in range(6)]
        deadline = time.monotonic() + 10
        while batcher._queue.qsize() < 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # one is held by the batching thread, waiting for a ranker
        rankers.free()
        deadline = time.monotonic() + 10
        while not rankers.batches and time.monotonic() < deadline:
            time.sleep(0.01)
        rankers.busy = 4  # the first batch is with its ranker now
        rankers.free()
        assert all("queue" in f.result(timeout=10).body["times_ms"] for f in futures)
    batcher.close()
    assert rankers.batches == [4, 2]


def test_workers_or_no_timeline_rows_are_one_sentence(built, capsys):
    """--workers is refused with one sentence that names --rankers, which stays."""
    from dicosa.cli import main

    assert main(["serve", str(built), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --workers is no longer an option: give --rankers N")
    assert err.count("\n") == 1
    assert main(["serve", str(built), "--timeline-rows", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --timeline-rows must be at least 1, got 0\n"


@pytest.mark.slow
def test_serve_with_rankers_searches_in_them_and_each_reloads(built, tmp_path):
    """dicosa serve --rankers 2: searches are answered by ranker processes (children of the
    server), which reopen the index after another process adds videos (searches then see
    them) and stop with the server."""
    import httpx

    folder = shutil.copytree(built, tmp_path / "index")
    port = free_port()
    server = run_cli("serve", str(folder), "--port", str(port), "--rankers", "2",
                     "--reload-interval", "0.5")
    base = f"http://127.0.0.1:{port}"

    def searched() -> list[dict]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda q: httpx.get(base + "/api/search", timeout=60,
                                                     params={"q": q, "k": 3}).json(), QUERIES))

    try:
        wait_for(base + "/api/ready", timeout=180)
        assert httpx.get(base + "/api/info", timeout=30).json()["server"]["rankers"] == 2
        rankers = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children")
                   .read_text().split()]
        assert all(len(a["hits"]) == 3 and a["videos"] == len(CLIPS) for a in searched())
        new = tmp_path / "new"
        for i in range(2):
            write_video(new / f"added{i}.mp4", 15 + i, fps=10)
        model, source, _ = load_model(None, TINY[1], TINY[3:])
        VideoIndex.build(model, new, folder, meta={"model": source}, num_workers=0,
                         progress=False)
        deadline, videos = time.monotonic() + 120, set()
        while videos != {len(CLIPS) + 2} and time.monotonic() < deadline:
            videos = {a["videos"] for a in searched()}  # both rankers, as batches land
            time.sleep(0.5)
        assert videos == {len(CLIPS) + 2}
    finally:
        server.terminate()
        out, err = server.communicate(timeout=60)
    # uvicorn shuts down on SIGTERM, then raises it again for whoever waits (exit -15)
    assert server.returncode == -signal.SIGTERM and "Traceback" not in err, err[-2000:]
    assert "with 2 rankers" in out
    assert len(rankers) >= 2 and _gone(rankers)


def test_rankers_that_cannot_open_the_index_say_why_to_each_search(engine, tmp_path):
    rankers = Rankers(1, EngineSpec(tmp_path / "missing"), reload_interval_s=0)
    app = create_app(engine, Settings(reload_interval_s=0), rankers=rankers)
    with TestClient(app, raise_server_exceptions=False) as c:
        for _ in range(2):  # the batcher keeps answering
            failed = c.get("/api/search", params={"q": "a red circle"})
            assert failed.status_code == 503
            assert "is not a video index" in failed.json()["error"]
    assert _gone(rankers.pids)
