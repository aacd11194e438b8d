"""The Milvus first stage against a real Milvus standalone server (the ``milvus`` package,
2.3.5): the round trip milvus-lite runs, freshness after a build or an add, and a server
killed in the middle of an ingest."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from dicosa.search.backends import make_first_stage, open_first_stage
from dicosa.search.dense import ExactStage, StageError
from dicosa.search.milvus import MilvusError
from tests._milvus_server import SUPPORTED, WHY_NOT, StandaloneServer, free_port
from tests.test_backends import encoded, one_sentence, overlap

PROMISED = 0.95  # recall@10 against exact search: HNSW M=32, efSearch=256 (as for faiss)


def clustered(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    """Vectors around random centres (``clusters`` = ``n``: nearly structureless)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    return (centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, dim))).astype(
        np.float32)


def exact_like(stage, exact: ExactStage, queries, k: int = 10) -> float:
    """Recall@k of ``stage`` against ``exact``; the scores it returns must be the exact
    cosines of the ids it returns (an index may miss a row, never misscore one)."""
    got, want = stage.search(queries, k), exact.search(queries, k)
    position = {int(i): n for n, i in enumerate(exact.ids)}
    text = queries.text.text.numpy()
    text = text / np.linalg.norm(text, axis=1, keepdims=True)
    rows = np.array([[position[int(i)] for i in row] for row in got.ids])  # [Q, k]
    cosine = np.einsum("qd,qkd->qk", text, exact.vectors[rows])
    np.testing.assert_allclose(got.scores, cosine, atol=1e-4)
    return overlap(got.ids, want.ids)


def served_indexed(stage) -> tuple[int, int]:
    """(rows loaded in sealed segments, of those in segments big enough for an index that
    have none), asked of the server directly, not through the stage."""
    segments = stage.client._get_connection().get_query_segment_info(stage.collection)
    loaded = sum(s.num_rows for s in segments)
    unindexed = sum(s.num_rows for s in segments if not s.index_name and s.num_rows >= 1024)
    return loaded, unindexed


@pytest.fixture(scope="module")
def data():
    vectors = clustered(3000, 32, 40, seed=0)
    ids = np.arange(len(vectors), dtype=np.int64) * 7 + 3  # row ids are not positions
    return ids, vectors, encoded(clustered(50, 32, 40, seed=1))


def test_round_trip_matches_exact_at_the_promised_recall(milvus_server, data, tmp_path):
    """Build, add, remove, search, save, reopen on a server (HNSW): the exact stage's top 10
    at the promised recall, with exact scores (a search right after an add: see
    test_save_returns_once_every_row_is_indexed_and_served)."""
    ids, vectors, queries = data
    milvus = make_first_stage("milvus", directory=tmp_path, dim=32, uri=milvus_server.uri,
                              collection="round_trip")
    assert milvus.index_type == "HNSW"
    exact = ExactStage(32)
    for stage in (milvus, exact):
        stage.add(ids[:2000], vectors[:2000])
        stage.add(ids[2000:], vectors[2000:])
        stage.remove(ids[::3])
    assert exact_like(milvus, exact, queries) >= PROMISED
    assert not np.isin(milvus.search(queries, 300).ids, ids[::3]).any()
    assert len(milvus) == len(exact)
    milvus.save(tmp_path)
    info = json.loads((tmp_path / "first_stage.json").read_text())
    assert info["uri"] == milvus_server.uri and info["config"]["collection"] == "round_trip"
    milvus.close()
    milvus = open_first_stage(tmp_path)
    assert exact_like(milvus, exact, queries) >= PROMISED and len(milvus) == len(exact)
    assert np.array_equal(milvus.row_ids(), np.sort(exact.ids))
    found = np.unique(milvus.search(queries, 5).ids[:, 0])
    milvus.remove(found)  # a search right after a remove (Strong) never returns it
    exact.remove(found)
    assert not np.isin(milvus.search(queries, 50).ids, found).any()
    with pytest.raises(StageError) as err:
        milvus.add(ids[1:2], vectors[1:2])
    assert "never reused" in one_sentence(err)
    milvus.close()
    with pytest.raises(StageError) as err:  # a second build into the same collection
        make_first_stage("milvus", directory=tmp_path, dim=32, uri=milvus_server.uri,
                         collection="round_trip")
    assert "already has a collection" in one_sentence(err)
    (tmp_path / "first_stage.json").write_text(json.dumps(
        {**info, "config": {**info["config"], "collection": "elsewhere"}}))
    with pytest.raises(MilvusError) as err:
        open_first_stage(tmp_path)
    assert "no collection 'elsewhere'" in one_sentence(err)


def test_bad_uri_is_one_sentence(tmp_path):
    with pytest.raises(MilvusError) as err:
        make_first_stage("milvus", directory=tmp_path, dim=32,
                         uri=f"http://127.0.0.1:{free_port()}", timeout=1.0)
    assert "cannot reach Milvus at http://127.0.0.1:" in one_sentence(err)


def test_save_returns_once_every_row_is_indexed_and_served(milvus_server, tmp_path):
    """Nearly structureless vectors, where Milvus's interim index of a sealed segment finds
    about half the neighbours: right after save (what ``index`` ends with) every row is in
    an indexed segment on the query node and recall is the promised one; a search right
    after an add in the same process waits the same way."""
    vectors = clustered(6000, 64, 6000, seed=2)
    ids = np.arange(len(vectors), dtype=np.int64)
    queries = encoded(clustered(50, 64, 6000, seed=3))
    milvus = make_first_stage("milvus", directory=tmp_path, dim=64, uri=milvus_server.uri,
                              collection="fresh")
    exact = ExactStage(64)
    for stage in (milvus, exact):
        stage.add(ids[:4000], vectors[:4000])
    milvus.save(tmp_path)
    assert served_indexed(milvus) == (4000, 0)  # asked before any search
    progress = milvus.index_progress()
    assert progress.done and progress.rows == progress.indexed == progress.served == 4000
    assert exact_like(milvus, exact, queries) >= PROMISED
    for stage in (milvus, exact):
        stage.add(ids[4000:], vectors[4000:])
    assert exact_like(milvus, exact, queries) >= PROMISED  # waits first
    assert served_indexed(milvus) == (6000, 0)
    milvus.close()


def test_frames_need_milvus_2_4(milvus_server, tmp_path):
    """FLOAT16_VECTOR (frames kept in the collection) is Milvus >= 2.4; the milvus-lite test
    in test_backends.py covers the field itself."""
    with pytest.raises(MilvusError) as err:
        make_first_stage("milvus", directory=tmp_path, dim=32, uri=milvus_server.uri,
                         collection="with_frames", frames=4)
    message = one_sentence(err)
    assert "2.4" in message and "v2.3.5" in message and milvus_server.uri in message


# -- faults ------------------------------------------------------------------------------------
@pytest.fixture
def own_server(tmp_path_factory):
    """A server of this test's own, to be killed (the shared one stays up)."""
    if not SUPPORTED:
        pytest.skip(WHY_NOT)
    server = StandaloneServer(tmp_path_factory.mktemp("milvus-killed")).start()
    yield server
    server.stop()


def test_server_killed_mid_ingest(own_server, data, tmp_path, monkeypatch):
    """SIGKILL between two insert calls of an add: the add fails in one sentence, a search
    while the server is down is one sentence naming it, and after a restart on the same
    folder the stage reopens holding exactly the rows whose inserts the server answered;
    adding the rest resumes the build, with no row lost or twice."""
    ids, vectors, queries = data
    batch = 250  # rows per insert call
    stage = make_first_stage("milvus", directory=tmp_path, dim=32, uri=own_server.uri,
                             collection="ingest", insert_bytes=batch * 32 * 4, timeout=5.0)
    stage.add(ids[:1000], vectors[:1000])
    stage.save(tmp_path)
    inserts, insert = [], stage.client.insert

    def insert_then_kill(*args, **kwargs):
        if len(inserts) == 3:
            own_server.kill()
            stage.config = replace(stage.config, timeout=1.0)  # no need to retry 5 s now
        out = insert(*args, **kwargs)
        inserts.append(len(args[1]))
        return out

    monkeypatch.setattr(stage.client, "insert", insert_then_kill)
    with pytest.raises(MilvusError) as err:
        stage.add(ids[1000:], vectors[1000:])
    assert own_server.uri in one_sentence(err) and inserts == [batch] * 3
    with pytest.raises(MilvusError) as err:
        stage.search(queries, 10)
    assert f"cannot reach Milvus at {own_server.uri}" in one_sentence(err)
    stage.close()

    own_server.start()  # same folder, same ports
    stage = open_first_stage(tmp_path)
    held = stage.row_ids()
    answered = ids[:1000 + 3 * batch]
    assert np.array_equal(held, np.sort(answered)) and len(stage) == len(answered)
    stage.add(ids[len(answered):], vectors[len(answered):])  # resume
    stage.save(tmp_path)
    assert np.array_equal(stage.row_ids(), np.sort(ids)) and len(stage) == len(ids)
    exact = ExactStage(32)
    exact.add(ids, vectors)
    assert exact_like(stage, exact, queries) >= PROMISED
    stage.close()



def test_benchmark_smoke_through_the_server(milvus_server, tmp_path):
    """benchmarks/search.py --smoke with the local backend and Milvus side by side."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "search.py"
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--quality-videos", "0", "--out", str(out),
         "--backend", "local", "milvus", "--uri", milvus_server.uri,
         "--milvus-pid", str(milvus_server.pid)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    latency = json.loads(out.read_text())["latency"]
    assert set(latency) == {"local", "milvus"}
    for result in latency.values():
        assert result["videos"] == 3000 and result["first_stage_recall@10_vs_exact"] >= PROMISED
        assert 0 < result["two_stage"]["100"]["p50_ms"] <= result["two_stage"]["100"]["p99_ms"]
    assert latency["milvus"]["milvus"]["server_memory_gib"]["rss_gib"] > 0.05
    assert "brute_force" in latency["local"]


def test_index_add_after_an_interrupted_add(milvus_server, tmp_path, monkeypatch):
    """A VideoIndex on the server whose add failed after some inserts (the server kept them,
    the manifest never recorded them): reopened, it searches only recorded rows, and its next
    add replaces the leftovers instead of refusing their ids as reused."""
    from dicosa.index import VideoIndex
    from dicosa.model import DiCoSA, VideoFeatures
    from dicosa.search.milvus import MilvusStage
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()

    def videos(n: int, name: str):
        frames = torch.randn(n, 4, model.embed_dim).half()
        return VideoFeatures(frames, torch.ones(n, 4, dtype=torch.bool)), [
            {"path": f"{name}{i}"} for i in range(n)]

    index = VideoIndex(model, device="cpu", backend="milvus", uri=milvus_server.uri,
                       stage_options={"collection": "interrupted", "insert_bytes": 100 * 512})
    index.save(tmp_path)
    index.add_features(*videos(300, "a"))
    index.save(tmp_path)
    calls = []

    def insert_twice(self, *args, **kwargs):
        if len(calls) == 2:
            raise ConnectionError("the network went away")
        calls.append(1)
        return original(self, *args, **kwargs)

    stage = index.stages.dense_stage()
    original = type(stage.client).insert
    monkeypatch.setattr(type(stage.client), "insert", insert_twice)
    with pytest.raises(MilvusError):
        index.add_features(*videos(300, "b"))
    monkeypatch.undo()
    assert len(stage) == 300 + 200  # two inserts of 100 rows went through

    index = VideoIndex.load(tmp_path, model)
    assert len(index) == 300 and isinstance(index.stages.dense_stage(), MilvusStage)
    hits = index.search("a red circle", k=10, candidates=100)
    assert len(hits) == 10 and all(h.id < 300 for h in hits)
    index.add_features(*videos(300, "c"))
    index.save(tmp_path)
    assert np.array_equal(index.stages.dense_stage().row_ids(), index.ids)
