"""The per-frame first stage as an index's default dense stage (summary ``"frames"``).

The model is the ``zero-shot`` preset on the tiny random-weight CLIP: its S pools the frames
under the text at τ = 0.01, nearly a max over frames, which is what the per-frame stage
ranks by. Features are synthesised (``add_features``) so that the collections have the
structure this stage exists for: videos that match a query in one frame only.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from dicosa.clip import TINY_ARCH, get_tokenizer
from dicosa.config import model_preset
from dicosa.index import VideoIndex
from dicosa.index.check import check_index
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.search.dense import FaissStage, StageError
from dicosa.search.frames_stage import FramesStage

from ._index import encoded, searcher

QUERIES = ["a red circle moves left", "a blue square grows", "a green cross falls",
           "two yellow triangles spin"]


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    config = model_preset("zero-shot", arch=TINY_ARCH, pretrained=None, num_frames=4)
    return DiCoSA.from_config(config).eval()


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _collection(model, count=240, seed=0) -> VideoFeatures:
    """Per query: 5 videos with one frame on the query's direction (the rest noise) and 10
    whose every frame leans half-way to it; then noise. DiCoSA at τ = 0.01 ranks the first
    kind above the second; the frame mean ranks them the other way round."""
    tokens = get_tokenizer(model.config.arch, model.config.max_words)(QUERIES)
    with torch.no_grad():
        near = _unit(model.encode_text(tokens).text)  # [Q, D]
    g = torch.Generator().manual_seed(seed)
    num, dim = model.config.num_frames, model.embed_dim
    frames = _unit(torch.randn(count, num, dim, generator=g))
    for q, vector in enumerate(near):
        one, lean = slice(q * 15, q * 15 + 5), slice(q * 15 + 5, q * 15 + 15)
        frames[one, 1] = _unit(vector + 0.05 * frames[one, 1])
        frames[lean] = _unit(vector + 1.2 * frames[lean])
    mask = torch.ones(count, num, dtype=torch.bool)
    mask[2::3, 2:] = False  # every third video is short (never its matching frame 1)
    return VideoFeatures(frames.half(), mask)


def _fill(index: VideoIndex, video: VideoFeatures, first: int = 0, shard: int = 64) -> None:
    for start in range(0, len(video), shard):
        part = video[start:start + shard]
        index.add_features(part, [{"path": f"/v/{first + start + i}.mp4"}
                                  for i in range(len(part))])


def _ids(results) -> list[list[int]]:
    return [[h.id for h in hits] for hits in results]


def _recall(got, want) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(got, want,
                                                                         strict=True)]))


def test_frames_is_the_default_and_two_stage_equals_exhaustive(model, tmp_path):
    index = VideoIndex(model, device="cpu")
    index.save(tmp_path / "index")
    _fill(index, _collection(model))
    assert index.stages.spec["summary"] == "frames"
    assert isinstance(index.stages.dense_stage(), FramesStage)
    exhaustive = index.search(QUERIES, k=5, candidates=None)
    two_stage = index.search(QUERIES, k=5, candidates=20)  # of 240
    assert _ids(two_stage) == _ids(exhaustive)
    for got, want in zip(two_stage, exhaustive, strict=True):
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
        assert {h.stage for h in got} == {"dense"}
    # the best-frame score is the stage's: the cosine of the query and the matching frame
    assert all(h.stage_score > 0.9 for hits in two_stage for h in hits)
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["first_stage"]["summary"] == "frames"
    assert manifest["first_stage"]["options"] == {"index": "ivfpq", "nlist": 1024,
                                                  "nprobe": 32, "pq_m": 8}


def test_frames_keeps_more_of_dicosa_top_than_confidence(model):
    video = _collection(model)
    found = {}
    for summary in ("frames", "confidence"):
        index = VideoIndex(model, device="cpu", backend="exact", summary=summary)
        _fill(index, video)
        exhaustive = _ids(index.search(QUERIES, k=5, candidates=None))
        found[summary] = _recall(_ids(index.search(QUERIES, k=5, candidates=10)), exhaustive)
    assert found["frames"] == 1.0 and found["confidence"] <= 0.5


def test_add_remove_reopen_and_a_rebuilt_stage_answer_alike(model, tmp_path):
    out = tmp_path / "index"
    video = _collection(model)
    index = VideoIndex(model, device="cpu")
    index.save(out)
    _fill(index, video[:200])
    gone = [h.id for h in index.search(QUERIES[0], k=3, candidates=20)]
    assert index.remove(np.array(gone)) == 3
    _fill(index, video[200:], first=200)
    expected = _ids(index.search(QUERIES, k=10, candidates=30))
    assert not set(gone) & {i for row in expected for i in row}
    assert len(index.stages.dense_stage()) == 237
    reopened = VideoIndex.load(out, model, device="cpu")
    dense = reopened.stages.dense_stage()
    assert isinstance(dense, FramesStage) and len(dense) == 237
    assert _ids(reopened.search(QUERIES, k=10, candidates=30)) == expected
    assert check_index(out).ok
    shutil.rmtree(out / "frames")  # the stage's files gone: rebuilt from the store
    rebuilt = VideoIndex.load(out, model, device="cpu")
    assert _ids(rebuilt.search(QUERIES, k=10, candidates=30)) == expected
    rebuilt.save(out)
    (out / "frames" / "frames.npz").write_bytes(b"damaged")
    report = check_index(out)
    assert not report.ok and "frames.npz does not load" in report.problems[0]
    assert check_index(out, repair=True).repaired and check_index(out).ok
    again = VideoIndex.load(out, model, device="cpu")
    assert _ids(again.search(QUERIES, k=10, candidates=30)) == expected


def test_ivfpq_frames_return_c_distinct_videos(model, tmp_path):
    """Past ``train_min`` frames the stage is faiss IVF-PQ; asking for C videos fetches C x N
    frames, so C distinct videos come back even when many frames of each rank high."""
    index = VideoIndex(model, device="cpu", stage_options={"nlist": 8, "train_min": 400})
    index.save(tmp_path / "index")
    _fill(index, _collection(model, count=300))
    inner = index.stages.dense_stage().inner
    assert isinstance(inner, FaissStage) and inner.index.is_trained and not len(inner.pending)
    for c in (50, 299):
        dense = searcher(index).candidates(encoded(index, QUERIES), c, None)[0]
        assert all(len(set(row[row >= 0].tolist())) == c for row in dense)
    reopened = VideoIndex.load(tmp_path / "index", model, device="cpu")
    assert reopened.stages.dense_stage().inner.index.is_trained
    two_stage = _ids(reopened.search(QUERIES, k=5, candidates=60))
    assert _recall(two_stage, _ids(reopened.search(QUERIES, k=5, candidates=None))) >= 0.9


def test_milvus_is_refused_in_one_sentence_and_keeps_confidence_by_default(model):
    with pytest.raises(StageError, match=r"runs on the local \(faiss\) or exact backend, "
                                         r"not milvus") as error:
        VideoIndex(model, backend="milvus", summary="frames")
    assert "\n" not in str(error.value)
    assert VideoIndex(model, backend="milvus").stages.spec["summary"] == "confidence"
