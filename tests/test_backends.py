"""Dense first stages: exact (the reference), faiss HNSW / IVF-PQ, Milvus on milvus-lite."""

import json
import os

import faiss
import numpy as np
import pytest
import torch

from dicosa.errors import USER_ERRORS
from dicosa.functional import video_proxy
from dicosa.model import TextFeatures, VideoFeatures
from dicosa.search.backends import make_first_stage, open_first_stage
from dicosa.search.dense import ExactStage, FaissConfig, FaissStage, StageError, top_k
from dicosa.search.query import parse_query
from dicosa.search.types import EncodedQueries, FirstStage

DIM = 32


def clustered(n: int, clusters: int, seed: int) -> np.ndarray:
    """Vectors around random centres: neighbourhoods an ANN index must resolve."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, DIM))
    return (centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, DIM))).astype(
        np.float32)


def encoded(texts: np.ndarray) -> EncodedQueries:
    return EncodedQueries([parse_query("a query")] * len(texts),
                          TextFeatures(torch.from_numpy(texts)))


@pytest.fixture(scope="module")
def data():
    vectors = clustered(3000, 40, seed=0)
    ids = np.arange(len(vectors), dtype=np.int64) * 7 + 3  # row ids are not positions
    return ids, vectors, encoded(clustered(50, 40, seed=1))


def overlap(found: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in
                          zip(found, reference, strict=True)]))


STAGES = {  # the trained kinds train on their first 1,000 rows (the data has 3,000)
    "exact": lambda: ExactStage(DIM),
    "hnsw": lambda: FaissStage(DIM, FaissConfig(train_min=1000)),  # SQ8 storage
    "hnsw-fp16": lambda: FaissStage(DIM, FaissConfig(storage="fp16")),
    "hnsw-flat": lambda: FaissStage(DIM, FaissConfig(storage="flat")),
    "ivfpq": lambda: FaissStage(DIM, FaissConfig(index="ivfpq", nlist=16, pq_m=8, nprobe=16,
                                                 train_min=1000)),
    # pq_m=6 does not divide 32: the vectors are zero-padded to 36
    "ivfpq-padded": lambda: FaissStage(DIM, FaissConfig(index="ivfpq", nlist=16, pq_m=6,
                                                        nprobe=16, train_min=1000)),
}


@pytest.mark.paths  # numpy against a naive reference / another engine
def test_exact_is_cosine_top_k(data):
    ids, vectors, queries = data
    stage = ExactStage(DIM)
    stage.add(ids, torch.from_numpy(vectors))
    found = stage.search(queries, 10)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    text = queries.text.text.numpy()
    cosine = (text / np.linalg.norm(text, axis=1, keepdims=True)) @ unit.T
    assert np.array_equal(found.ids, ids[np.argsort(-cosine, axis=1)[:, :10]])
    np.testing.assert_allclose(found.scores, np.sort(cosine, axis=1)[:, ::-1][:, :10],
                               rtol=1e-5, atol=1e-6)
    assert isinstance(stage, FirstStage) and found.stage == "dense"


@pytest.mark.paths  # numpy against a naive reference / another engine
@pytest.mark.parametrize("k", [1, 7, 40, 64, 100])
def test_top_k_equals_a_stable_full_sort(k):
    # Few distinct values: many ties at the k-th place, where the order must still be the
    # stable sort's (smaller position first); NaN ranks last, as -inf.
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 5, (6, 64)).astype(np.float32)
    scores[0, :10] = np.nan
    scores[1] = 0.0  # every row tied
    scores[2, ::3] = -np.inf
    cleaned = np.where(np.isnan(scores), -np.inf, scores)
    expected = np.argsort(-cleaned, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(top_k(scores, k), expected)


def test_video_features_are_reduced_to_their_proxy():
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(5, 4, DIM, generator=g)
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[1, 2:] = False
    a, b = ExactStage(DIM), ExactStage(DIM)
    a.add(np.arange(5), VideoFeatures(frames, mask))
    b.add(np.arange(5), video_proxy(frames, mask))
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-6)


def test_another_summary_brings_its_query_half_in_extra(data):
    """A stage over another query-independent summary (width 8 here) reads the query side
    from ``extra["dense"]``: the text vectors are not that space."""
    ids, vectors, queries = data
    stage = FaissStage(8)
    stage.add(ids, vectors[:, :8])
    side = EncodedQueries(queries.queries, queries.text,
                          {"dense": queries.text.text[:, :8].clone()})
    reference = ExactStage(8)
    reference.add(ids, vectors[:, :8])
    assert overlap(stage.search(side, 10).ids, reference.search(side, 10).ids) >= 0.95
    with pytest.raises(StageError):
        stage.search(queries, 10)  # 32-wide text vectors do not fit an 8-wide stage


@pytest.mark.parametrize("storage", ["fp16", "sq8"])
def test_hnsw_recall_against_exact(data, storage):
    """Stated setting: M=32, efConstruction=200, efSearch=256 (the defaults), k=50."""
    ids, vectors, queries = data
    exact = ExactStage(DIM)
    hnsw = FaissStage(DIM, FaissConfig(storage=storage, train_min=1000))
    exact.add(ids, vectors)
    hnsw.add(ids, vectors)
    assert overlap(hnsw.search(queries, 50).ids, exact.search(queries, 50).ids) >= 0.95


def test_ivfpq_zero_pads_a_width_pq_m_does_not_divide(data):
    """32 columns, 7 sub-quantisers: 3 zero columns make 35, which hold nothing and change no
    inner product (recall between 4 and 8 sub-quantisers' 0.35 and 0.61 on this data)."""
    ids, vectors, queries = data
    stage = FaissStage(DIM, FaissConfig(index="ivfpq", nlist=16, pq_m=7, nprobe=16,
                                        train_min=1000))
    stage.add(ids, vectors)
    assert stage.index.d == 35
    stage.index.set_direct_map_type(faiss.DirectMap.Hashtable)  # ids are not positions
    stored = stage.index.reconstruct_batch(ids[:100])  # [100, 35]
    np.testing.assert_allclose(stored[:, DIM:], 0.0, atol=1e-6)
    exact = ExactStage(DIM)
    exact.add(ids, vectors)
    assert overlap(stage.search(queries, 10).ids, exact.search(queries, 10).ids) >= 0.45


@pytest.mark.parametrize("kind", STAGES)
def test_removed_rows_never_come_back(data, kind, tmp_path):
    ids, vectors, queries = data
    stage = STAGES[kind]()
    stage.add(ids[:2000], vectors[:2000])
    removed = ids[:2000:2]
    stage.remove(removed)
    stage.add(ids[2000:], vectors[2000:])  # adding after a removal keeps it removed
    live = np.setdiff1d(ids, removed)
    found = stage.search(queries, 200)
    assert not np.isin(found.ids, removed).any()
    assert np.isin(found.ids[found.ids >= 0], live).all()
    assert len(stage) == len(live)
    stage.save(tmp_path)
    again = open_first_stage(tmp_path).search(queries, 200)
    assert not np.isin(again.ids, removed).any()


@pytest.mark.parametrize("kind", STAGES)
def test_save_then_open_gives_the_same_results(data, kind, tmp_path):
    ids, vectors, queries = data
    stage = STAGES[kind]()
    stage.add(ids, vectors)
    stage.remove(ids[:10])
    before = stage.search(queries, 20)
    old = os.umask(0o022)
    try:
        stage.save(tmp_path)
    finally:
        os.umask(old)
    opened = open_first_stage(tmp_path)
    after = opened.search(queries, 20)
    assert type(opened) is type(stage)
    assert np.array_equal(before.ids, after.ids)  # same code, same process, same index
    np.testing.assert_array_equal(before.scores, after.scores)
    for path in tmp_path.iterdir():  # the umask decides, not a 0600 temp-file helper
        assert path.stat().st_mode & 0o777 == 0o644, path.name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_rows_before_training_are_searched_exactly(data, kind, tmp_path):
    """SQ8 and IVF-PQ learn from the data: small first adds wait in an exact stage (also
    across save/open) until train_min rows have come, then move into the trained index."""
    ids, vectors, queries = data
    stage, exact = STAGES[kind](), ExactStage(DIM)
    for lo, hi in ((0, 1), (1, 600)):
        stage.add(ids[lo:hi], vectors[lo:hi])
        exact.add(ids[lo:hi], vectors[lo:hi])
    stage.remove(ids[:5])
    exact.remove(ids[:5])
    assert not stage.index.is_trained and len(stage) == 595
    assert np.array_equal(stage.search(queries, 20).ids, exact.search(queries, 20).ids)
    stage.save(tmp_path)
    stage = open_first_stage(tmp_path)
    assert np.array_equal(stage.search(queries, 20).ids, exact.search(queries, 20).ids)
    stage.add(ids[600:], vectors[600:])
    exact.add(ids[600:], vectors[600:])
    assert stage.index.is_trained and len(stage.pending) == 0 and len(stage) == len(exact)
    found = stage.search(queries, 50).ids
    assert not np.isin(found, ids[:5]).any()
    # now approximate: PQ with 8 bytes for 32 dimensions is lossy, SQ8 nearly not
    assert overlap(found, exact.search(queries, 50).ids) >= (0.95 if kind == "hnsw" else 0.6)


@pytest.mark.parametrize("kind", ["hnsw", "hnsw-fp16"])
def test_compact_drops_tombstones_and_keeps_results(data, kind):
    ids, vectors, queries = data
    stage = STAGES[kind]()
    stage.add(ids, vectors)
    stage.remove(ids[::2])
    before = stage.search(queries, 30).ids
    stage.compact()
    assert stage.index.ntotal == len(ids) - len(ids[::2]) == len(stage)
    after = stage.search(queries, 30).ids
    assert not np.isin(after, ids[::2]).any()
    assert overlap(after, before) >= 0.95  # a new graph over the same codes
    with pytest.raises(StageError):
        stage.add(ids[:1], vectors[:1])  # removed ids stay used


def test_k_beyond_the_collection_pads(data):
    ids, vectors, queries = data
    for stage in (ExactStage(DIM), FaissStage(DIM)):
        stage.add(ids[:5], vectors[:5])
        found = stage.search(queries, 8)
        assert found.ids.shape == (len(queries), 8)
        assert (found.ids[:, 5:] == -1).all() and np.isneginf(found.scores[:, 5:]).all()
        assert (np.sort(found.ids[:, :5], axis=1) == ids[:5]).all()


def one_sentence(excinfo) -> str:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, USER_ERRORS)
    assert "\n" not in message and message.count(". ") == 0, message
    return message


def test_bad_inputs_are_one_sentence(tmp_path, data):
    ids, vectors, _ = data
    with pytest.raises(StageError) as err:
        make_first_stage("annoy", directory=tmp_path, dim=DIM)
    assert "exact, faiss, milvus" in one_sentence(err)
    stage = make_first_stage("faiss", directory=tmp_path, dim=DIM)
    with pytest.raises(StageError) as err:
        stage.add(ids[:3], vectors[:3, :8])
    assert "[n, 32]" in one_sentence(err)
    stage.add(ids[:3], vectors[:3])
    with pytest.raises(StageError) as err:
        stage.add(ids[2:4], vectors[2:4])
    assert "never reused" in one_sentence(err)
    with pytest.raises(StageError) as err:
        stage.add(ids[5:7], np.full((2, DIM), np.nan, dtype=np.float32))
    one_sentence(err)
    with pytest.raises(ValueError) as err:
        make_first_stage("faiss", directory=tmp_path, dim=DIM, efsearch=3)
    one_sentence(err)
    with pytest.raises(StageError) as err:
        make_first_stage("exact", directory=tmp_path, dim=DIM, uri="http://localhost:19530")
    one_sentence(err)
    with pytest.raises(FileNotFoundError) as err:
        open_first_stage(tmp_path / "nowhere")
    one_sentence(err)
    (tmp_path / "first_stage.json").write_text("{not json")
    with pytest.raises(StageError) as err:
        open_first_stage(tmp_path)
    one_sentence(err)
    (tmp_path / "first_stage.json").write_text(json.dumps({"backend": "faiss", "dim": DIM}))
    (tmp_path / "dense.faiss").write_bytes(b"damaged")
    (tmp_path / "dense.removed.npy").write_bytes(b"")
    with pytest.raises(ValueError) as err:
        open_first_stage(tmp_path)
    one_sentence(err)


# -- Milvus (milvus-lite) -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def milvus_dir(tmp_path_factory):
    pytest.importorskip("milvus_lite")
    return tmp_path_factory.mktemp("milvus-index")


@pytest.mark.paths  # numpy against a naive reference / another engine
def test_milvus_lite_round_trip_matches_exact(milvus_dir, data):
    """Build, search, add, remove, save, reopen: the same top-k as the exact stage (FLAT)."""
    ids, vectors, queries = data
    ids, vectors = ids[:300], vectors[:300]
    milvus = make_first_stage("milvus", directory=milvus_dir, dim=DIM)
    exact = ExactStage(DIM)

    def same_top_k(k=10):
        got, want = milvus.search(queries, k), exact.search(queries, k)
        np.testing.assert_allclose(got.scores, want.scores, atol=1e-4)
        # equal scores may swap places: compare ids where the next score differs
        distinct = np.diff(want.scores, axis=1, append=-np.inf) < -1e-4
        assert np.array_equal(got.ids[distinct], want.ids[distinct])

    for stage in (milvus, exact):
        stage.add(ids[:200], vectors[:200])
    same_top_k()
    for stage in (milvus, exact):
        stage.add(ids[200:], vectors[200:])
        stage.remove(ids[::3])
    same_top_k()
    assert not np.isin(milvus.search(queries, 300).ids, ids[::3]).any()
    assert len(milvus) == len(exact)
    milvus.save(milvus_dir)
    info = json.loads((milvus_dir / "first_stage.json").read_text())
    assert info["backend"] == "milvus" and info["uri"] == "milvus.db"  # relative: folder moves
    milvus.close()
    milvus = open_first_stage(milvus_dir)
    same_top_k()
    with pytest.raises(StageError) as err:
        milvus.add(ids[1:2], vectors[1:2])
    assert "never reused" in one_sentence(err)
    milvus.close()


def test_milvus_bad_uris_are_one_sentence(milvus_dir):
    from dicosa.search.milvus import MilvusError

    with pytest.raises(MilvusError) as err:
        make_first_stage("milvus", directory=milvus_dir, dim=DIM, uri="ftp://somewhere")
    assert "http://host:19530" in one_sentence(err)
    with pytest.raises(MilvusError) as err:
        make_first_stage("milvus", directory=milvus_dir, dim=DIM, uri="http://127.0.0.1:9",
                         timeout=1.0)
    assert "cannot reach Milvus" in one_sentence(err)


def test_milvus_lite_without_pkg_resources_is_one_sentence(milvus_dir, monkeypatch):
    """milvus-lite 2.5 imports pkg_resources, which setuptools 82 removed."""
    import sys

    from dicosa.search.milvus import MilvusError

    monkeypatch.setitem(sys.modules, "pkg_resources", None)
    for name in [n for n in sys.modules if n.startswith("milvus_lite")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MilvusError) as err:
        make_first_stage("milvus", directory=milvus_dir, dim=DIM)
    assert "pip install 'setuptools<82'" in one_sentence(err)


@pytest.mark.paths  # numpy against a naive reference / another engine
def test_milvus_keeps_frames_for_a_searcher_without_local_files(milvus_dir):
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(6, 3, DIM, generator=g)
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[2, 1:] = False
    mask[4, 2] = False
    stage = make_first_stage("milvus", directory=milvus_dir, dim=DIM, collection="with_frames",
                             frames=4)
    stage.add(np.arange(10, 16), VideoFeatures(frames, mask))
    back = stage.fetch_frames(np.array([14, 10, 12]))
    assert back.frames.shape == (3, 4, DIM) and back.frames.dtype == torch.float16
    assert torch.equal(back.frames[:, :3], frames[[4, 0, 2]].half())
    assert (back.frames[:, 3] == 0).all()
    assert torch.equal(back.frame_mask[:, :3], mask[[4, 0, 2]]) and not back.frame_mask[:, 3].any()
    exact = ExactStage(DIM)
    exact.add(np.arange(10, 16), VideoFeatures(frames, mask))
    queries = encoded(frames[:, 0].numpy().copy())
    assert np.array_equal(stage.search(queries, 3).ids, exact.search(queries, 3).ids)
    with pytest.raises(StageError) as err:
        stage.add(np.arange(20, 22), frames[:2, 0])  # proxies alone cannot fill the frames
    one_sentence(err)
    with pytest.raises(StageError) as err:
        stage.fetch_frames(np.array([10, 99]))
    assert "99" in one_sentence(err)
    stage.close()
