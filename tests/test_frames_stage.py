"""The per-frame first stage: a video scores by its best valid frame."""

import numpy as np
import pytest
import torch

from dicosa.model import TextFeatures
from dicosa.search.dense import StageError
from dicosa.search.frames_stage import FramesStage
from dicosa.search.types import EncodedQueries


def _queries(vectors: np.ndarray) -> EncodedQueries:
    return EncodedQueries([None] * len(vectors), TextFeatures(torch.from_numpy(vectors)))


def _data(count=50, frames=4, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, frames, dim)).astype(np.float32)
    mask = np.ones((count, frames), dtype=bool)
    mask[::3, 2:] = False
    return np.arange(100, 100 + count), vectors, mask


def _best_frame_top(query, vectors, mask, ids, k):
    scores = np.where(mask, np.einsum("d,vnd->vn", query, vectors), -np.inf).max(1)
    order = np.argsort(-scores, kind="stable")[:k]
    return ids[order], scores[order]


@pytest.mark.parametrize("backend", ["exact", "faiss"])
def test_videos_rank_by_their_best_valid_frame(backend, tmp_path):
    ids, vectors, mask = _data()
    options = {"normalize": False} if backend == "exact" else {"storage": "flat"}
    stage = FramesStage.create(backend, tmp_path, 8, 4, **options)
    stage.add(ids, (vectors, mask))
    queries = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    if backend == "faiss":  # faiss ranks by inner product of what it stores: unit frames
        vectors = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
        queries = queries / np.linalg.norm(queries, axis=-1, keepdims=True)
    found = stage.search(_queries(queries), 7)
    for q, query in enumerate(queries):
        want_ids, want_scores = _best_frame_top(query, vectors, mask, ids, 7)
        np.testing.assert_array_equal(found.ids[q], want_ids)
        np.testing.assert_allclose(found.scores[q], want_scores, rtol=1e-4, atol=1e-4)


def test_padding_frames_are_never_indexed(tmp_path):
    ids, vectors, mask = _data()
    vectors[~mask] = 100.0  # would win every query if indexed
    stage = FramesStage.create("exact", tmp_path, 8, 4, normalize=False)
    stage.add(ids, (vectors, mask))
    found = stage.search(_queries(np.ones((1, 8), np.float32)), 5)
    assert (found.scores < 50).all()


def test_remove_and_reopen(tmp_path):
    ids, vectors, mask = _data()
    stage = FramesStage.create("exact", tmp_path, 8, 4, normalize=False)
    stage.add(ids, (vectors, mask))
    query = _queries(np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32))
    best = stage.search(query, 3).ids[:, 0]
    stage.remove(best)
    after = stage.search(query, 3)
    assert not np.isin(after.ids, best).any() and len(stage) == 50 - len(set(best.tolist()))
    stage.save(tmp_path)
    reopened = FramesStage.open(tmp_path)
    again = reopened.search(query, 3)
    np.testing.assert_array_equal(again.ids, after.ids)
    np.testing.assert_allclose(again.scores, after.scores)


def test_fewer_videos_than_k_pad_and_bad_input_is_one_sentence(tmp_path):
    ids, vectors, mask = _data(count=3)
    stage = FramesStage.create("exact", tmp_path, 8, 4, normalize=False)
    stage.add(ids, (vectors, mask))
    found = stage.search(_queries(np.ones((1, 8), np.float32)), 5)
    assert sorted(found.ids[0, :3].tolist()) == ids.tolist() and (found.ids[0, 3:] == -1).all()
    with pytest.raises(StageError, match=r"frame vectors must be \[n, N, dim\]"):
        stage.add(np.arange(2), (vectors, mask))
    with pytest.raises(StageError, match="6 frames per video but the stage holds 4"):
        stage.add(np.arange(2), (np.zeros((2, 6, 8)), np.ones((2, 6), bool)))


def test_a_summary_per_frame_ranks_videos_by_their_best_frame_summary(tmp_path):
    """Summary.frames feeds the stage: each frame is the summary of a one-frame video, and a
    video's stage score is its best frame's inner product with the summary's query."""
    from dicosa.model import DiCoSA, VideoFeatures
    from dicosa.search.proxy import Summary

    from .conftest import tiny_config

    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    g = torch.Generator().manual_seed(3)
    video = VideoFeatures(torch.randn(30, 4, model.embed_dim, generator=g),
                          torch.rand(30, 4, generator=g) > 0.3)
    video.frame_mask[:, 0] = True
    summary = Summary(model, "confidence")
    summary.calibrate(video.frames.mean(1).numpy())
    vectors, mask = summary.frames(video)
    assert vectors.shape == (30, 4, summary.dim)
    one = summary.videos(video.frames[7, 2:3].numpy())  # frame 2 of video 7, alone
    np.testing.assert_allclose(vectors[7, 2], one[0], rtol=1e-5, atol=1e-6)
    stage = FramesStage.create("exact", tmp_path, summary.dim, 4, normalize=False)
    stage.add(np.arange(30), (vectors, mask))
    text = torch.randn(2, model.embed_dim, generator=g)
    queries = summary.queries(text).float()
    encoded = EncodedQueries([None] * 2, TextFeatures(text), {"frames": queries})
    found = stage.search(encoded, 5)
    for q in range(2):
        want_ids, want_scores = _best_frame_top(queries[q].numpy(), vectors, mask,
                                                np.arange(30), 5)
        np.testing.assert_array_equal(found.ids[q], want_ids)
        np.testing.assert_allclose(found.scores[q], want_scores, rtol=1e-4, atol=1e-5)
