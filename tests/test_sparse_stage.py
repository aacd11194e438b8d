"""The lexical first stage: an exact inverted index checked against the dense product."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dicosa.model import TextFeatures
from dicosa.search.query import parse_query
from dicosa.search.sparse import SparseIndexError, SparseStage
from dicosa.search.types import EncodedQueries, FirstStage

WORDS = [f"w{i}" for i in range(40)]


def _sparse(rows: int, nnz: int, seed: int) -> np.ndarray:
    """``[rows, |V|]`` non-negative with ``nnz`` non-zeros per row, float32."""
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, len(WORDS)), dtype=np.float32)
    for r in range(rows):
        out[r, rng.choice(len(WORDS), nnz, replace=False)] = rng.random(nnz) + 0.01
    return out


def _queries(vectors: np.ndarray) -> EncodedQueries:
    queries = EncodedQueries([parse_query(f"q{i}") for i in range(len(vectors))],
                             TextFeatures(torch.zeros(len(vectors), 4)))
    queries.extra["lexical"] = sp.csr_matrix(vectors)
    return queries


def _naive(queries: np.ndarray, videos: np.ndarray, ids: np.ndarray, k: int):
    """Dense matrix product, then the k best rows with a score above zero."""
    scores = queries.astype(np.float64) @ videos.T.astype(np.float64)  # [Q, n]
    out = []
    for row in scores:
        order = sorted((i for i in range(len(row)) if row[i] > 0), key=lambda i: (-row[i],
                                                                                  ids[i]))
        out.append([(int(ids[i]), row[i]) for i in order[:k]])
    return out


@pytest.fixture
def stage() -> SparseStage:
    stage = SparseStage(WORDS)
    stage.add(np.arange(100, 160), _sparse(60, 5, 0))
    return stage


@pytest.mark.paths
def test_inverted_index_equals_the_dense_product(stage):
    assert isinstance(stage, FirstStage)
    videos, ids = _sparse(60, 5, 0), np.arange(100, 160)
    queries = _sparse(7, 3, 1)
    found = stage.search(_queries(queries), 10)
    assert found.ids.shape == (7, 10) and found.stage == "lexical"
    for q, expected in enumerate(_naive(queries, videos, ids, 10)):
        n = len(expected)
        assert found.ids[q, :n].tolist() == [i for i, _ in expected]
        np.testing.assert_allclose(found.scores[q, :n], [s for _, s in expected], rtol=1e-6)
        assert (found.ids[q, n:] == -1).all() and np.isneginf(found.scores[q, n:]).all()


def test_a_video_sharing_no_word_is_never_a_candidate():
    stage = SparseStage(WORDS)
    videos = np.zeros((3, len(WORDS)), dtype=np.float32)
    videos[0, 1], videos[1, 2], videos[2, [1, 2]] = 0.5, 0.9, [0.1, 0.1]
    stage.add(np.array([7, 8, 9]), videos)
    query = np.zeros((1, len(WORDS)), dtype=np.float32)
    query[0, 1] = 1.0
    found = stage.search(_queries(query), 3)
    assert found.ids.tolist() == [[7, 9, -1]]
    np.testing.assert_allclose(found.scores[0, :2], [0.5, 0.1])


def test_ties_at_the_kth_score_go_to_the_smaller_id():
    stage = SparseStage(WORDS)
    videos = np.zeros((6, len(WORDS)), dtype=np.float32)
    videos[:, 1] = [0.5, 0.2, 0.5, 0.9, 0.5, 0.5]
    stage.add(np.array([40, 10, 30, 50, 20, 60]), videos)
    query = np.zeros((1, len(WORDS)), dtype=np.float32)
    query[0, 1] = 1.0
    assert stage.search(_queries(query), 3).ids.tolist() == [[50, 20, 30]]
    assert stage.search(_queries(query), 5).ids.tolist() == [[50, 20, 30, 40, 60]]


def test_remove_add_and_bad_rows(stage):
    videos = _sparse(60, 5, 0)
    stage.remove(np.arange(100, 130))
    assert len(stage) == 30
    queries = _sparse(4, 4, 2)
    found = stage.search(_queries(queries), 5)
    assert not np.isin(found.ids, np.arange(100, 130)).any()
    expected = _naive(queries, videos[30:], np.arange(130, 160), 5)
    assert [r[:len(e)] for r, e in zip(found.ids.tolist(), expected, strict=True)] == [
        [i for i, _ in e] for e in expected]
    stage.add(np.array([200]), torch.tensor(videos[:1]))  # torch tensors are accepted too
    with pytest.raises(SparseIndexError, match="must be new and distinct"):
        stage.add(np.array([200]), videos[:1])
    with pytest.raises(SparseIndexError, match="vocabulary has 40 words"):
        stage.add(np.array([300]), np.ones((1, 3), dtype=np.float32))
    with pytest.raises(SparseIndexError, match="no lexical vectors"):
        stage.search(EncodedQueries([parse_query("x")], TextFeatures(torch.zeros(1, 4))), 3)


def test_save_load_round_trip_with_the_umask(stage, tmp_path):
    queries = _queries(_sparse(5, 3, 3))
    before = stage.search(queries, 8)
    old = os.umask(0o022)
    try:
        stage.save(tmp_path)
    finally:
        os.umask(old)
    path = tmp_path / "sparse-lexical.npz"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["sparse-lexical.npz"]  # no temporaries
    loaded = SparseStage.load(tmp_path)
    assert loaded.words == WORDS and loaded.ids.tolist() == stage.ids.tolist()
    after = loaded.search(queries, 8)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_array_equal(after.scores, before.scores)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(SparseIndexError, match="is not a readable sparse index"):
        SparseStage.load(tmp_path)
