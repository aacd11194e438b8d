"""Frames kept as int8 with one scale per frame: the codes, both shard layouts, the bound on
the rerank's score, the ranking, and the files (checksums, check --repair)."""

import json

import numpy as np
import pytest
import torch

from dicosa.index import VideoIndex
from dicosa.index.check import check_index
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search import rerank as rerank_module
from dicosa.search import shards as shard_module
from dicosa.search import store as store_module
from dicosa.search.frame_codec import dequantise, quantise, score_tolerance
from dicosa.search.rerank import QuantisedVideo, pair_scores
from dicosa.search.shards import VideoRun
from dicosa.search.store import FrameStore, StoreError

from .conftest import tiny_config
from .test_index_search import QUERIES, _features, _index, _text


def _rows(start, count):
    return [{"path": f"/v/{start + i}.mp4", "duration": 2.0, "fps": 10.0, "num_frames": 20,
             "valid_frames": 4} for i in range(count)]


def _runs(count, dim=16, seed=0) -> list[VideoRun]:
    """``count`` long videos of 6 + i frames, cut into segments of at most 4 frames."""
    g = np.random.default_rng(seed)
    runs = []
    for i in range(count):
        frames = 6 + i
        segments = np.array([[0, 4], [2, 4], [frames - 3, 3]])
        runs.append(VideoRun(g.normal(size=(frames, dim)).astype(np.float16),
                             np.ones(frames, bool), np.arange(frames, dtype=np.float32),
                             segments, segments.astype(np.float32),
                             {"path": f"/long/{i}.mp4", "duration": float(frames)}))
    return runs


def test_codes_are_within_half_a_step_of_each_value():
    x = np.random.default_rng(0).normal(size=(50, 7, 33)).astype(np.float32) * 3
    x[0, 0] = 0.0  # an all-zero frame: scale 0, codes 0
    x[1, 1, 5] = np.nan  # padding may hold anything; kept as 0
    codes, scale = quantise(x)
    assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (50, 7)
    assert np.abs(codes.astype(int)).max() == 127  # the largest element of a frame is ±127
    back = dequantise(codes, scale)
    finite = np.nan_to_num(x)
    assert np.all(np.abs(back - finite) <= scale[..., None] / 2 * (1 + 1e-6))
    assert scale[0, 0] == 0 and not back[0, 0].any() and back[1, 1, 5] == 0
    assert dequantise(codes, scale, np.float16).dtype == np.float16


@pytest.mark.parametrize("layout", ["clips", "runs"])
def test_both_layouts_keep_int8_and_gather_dequantises_the_rows_asked(layout, tmp_path,
                                                                       monkeypatch):
    store = FrameStore(frame_dtype="int8")
    store.directory = tmp_path
    if layout == "clips":
        video = _features_of(12, num=4, dim=16)
        store.append(video, _rows(0, 12))
        reference = video.frames.float().numpy()
    else:
        store.append_runs(_runs(4), np.full(16, 0.5, np.float16), 4)
        reference = FrameStore(frame_dtype="float16")
        reference.append_runs(_runs(4), np.full(16, 0.5, np.float16), 4)
        reference = reference.gather(reference.live()).frames.float().numpy()
    manifest = json.loads(json.dumps(store.manifest()))
    assert manifest["frame_dtype"] == "int8" and manifest["shards"][0]["frames"] == "int8"
    opened = FrameStore.open(tmp_path, manifest)
    shard = opened.shards[0]
    assert shard.frames.dtype == np.int8 and shard.frame_scale.dtype == np.float32
    assert shard.frame_scale.shape == shard.frames.shape[:-1]
    read = []
    real = shard_module.dequantise
    for module in (shard_module, store_module):  # a clips store dequantises in the store
        monkeypatch.setattr(module, "dequantise",
                            lambda codes, scale: read.append(codes.size) or real(codes, scale))
    ids = np.array([5, 1, 5, 0])
    got = opened.gather(ids, torch.float32)
    assert sum(read) == len(ids) * 4 * 16  # only the rows asked for (repeats read twice)
    step = shard.frame_scale.max()
    assert np.abs(got.frames.numpy() - reference[ids]).max() <= step / 2 * (1 + 1e-6)
    half = opened.gather(ids)  # float16 unless asked
    assert half.frames.dtype == torch.float16
    np.testing.assert_allclose(half.frames.float(), got.frames, rtol=1e-3, atol=1e-3)
    # the proxies are the kept (dequantised) frames' masked mean
    monkeypatch.undo()
    every = opened.gather(opened.live(), torch.float32)
    from dicosa.functional import video_proxy

    np.testing.assert_allclose(opened.proxies(opened.live()),
                               video_proxy(every.frames, every.frame_mask).numpy(), atol=1e-5)


def _features_of(count, num, dim, seed=0) -> VideoFeatures:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(count, num, dtype=torch.bool)
    mask[::2, -1] = False
    return VideoFeatures(torch.randn(count, num, dim, generator=g).half(), mask)


@pytest.mark.paths
@pytest.mark.parametrize("options", [{}, {"variant": "paper"}, {"use_adaptive_pooling": False},
                                     {"use_factors": False}])
def test_the_rerank_on_int8_frames_stays_within_the_derived_bound(options):
    """pair_scores on the int8 frames against DiCoSA.score on the float16 frames they came
    from: each pair within score_tolerance of the quantisation step (plus float rounding of
    two float32 computations, as tests/test_index_search.py allows them)."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(**options)).eval()
    text = _text(model, QUERIES)
    video = _features(model, 64, seed=3, near=text, per_query=8)
    store = FrameStore(frame_dtype="int8")
    ids = store.append(video, _rows(0, len(video)))
    kept = store.gather(ids, torch.float32)
    pairs = torch.arange(len(ids)) % len(QUERIES)
    reference = VideoFeatures(video.frames.float(), video.frame_mask)
    step = torch.from_numpy(store.shards[0].frame_scale)  # [n, N]
    with torch.no_grad():
        expected = model.score(TextFeatures(text), reference)[pairs, torch.arange(len(ids))]
        got = pair_scores(model, TextFeatures(text), kept, pairs=pairs)
        bound = score_tolerance(model, TextFeatures(text[pairs]), reference, step)
    moved = (got - expected).abs()
    assert torch.all(moved <= bound + 1e-5), (moved - bound).max()
    # the bound says something: well under the spread of the scores it bounds
    assert bound.max() < 0.1 * (expected.max() - expected.min()), (bound.max(), expected)


@pytest.mark.parametrize("options", [{}, {"variant": "paper"}, {"use_adaptive_pooling": False}])
def test_the_rerank_of_int8_codes_as_kept_equals_the_rerank_of_dequantised_frames(
        options, monkeypatch):
    """Codes handed to pair_scores as kept and dequantised block by block give the scores of
    the frames dequantised first (float rounding apart), blocks of every size (a ragged last
    one included), pairs in any order; gather_codes reads the same rows in either order."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(**options)).eval()
    text = _text(model, QUERIES)
    store = FrameStore(frame_dtype="int8")
    store.append(_features(model, 23, seed=4, near=text, per_query=4), _rows(0, 23))
    store.append(_features(model, 17, seed=5, near=text, per_query=4), _rows(23, 17))
    ids = np.random.default_rng(1).permutation(40)[:33]
    pairs = torch.from_numpy(np.random.default_rng(2).integers(0, len(QUERIES), len(ids)))
    with torch.no_grad():
        expected = pair_scores(model, TextFeatures(text), store.gather(ids, torch.float32),
                               pairs=pairs)
        for block in (1, 5, 64):
            monkeypatch.setattr(rerank_module, "_DEQUANTISED_PAIRS", block)
            kept = QuantisedVideo(*map(torch.from_numpy, store.gather_codes(ids)))
            got = pair_scores(model, TextFeatures(text), kept, pairs=pairs)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    ascending = np.sort(ids)  # the fast read: each shard's rows copied into one slice
    for got, kept in zip(store.gather_codes(ascending), store.gather_codes(ids), strict=True):
        order = np.argsort(ids)
        np.testing.assert_array_equal(got, kept[order])
    codes, scale, mask = store.gather_codes(ascending)
    reference = store.gather(ascending, torch.float32)
    np.testing.assert_array_equal(codes * scale[..., None], reference.frames.numpy())
    np.testing.assert_array_equal(mask, reference.frame_mask.numpy())
    half = FrameStore(frame_dtype="float16")
    half.append(_features(model, 3, seed=6, near=text, per_query=1), _rows(0, 3))
    assert half.gather_codes(np.arange(3)) is None


def test_int8_runs_hand_their_segments_over_as_kept_with_the_pad_in_int8():
    """A ``runs`` shard's segments read as codes (the rerank's read) are its dequantised
    segments exactly, padded slots holding the pad's int8 form (a short segment of a model
    that pools its padding, ``mask_mode="after"``, scores the same either way); mixed with a
    ``clips`` shard in one read, each row in its place."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    assert model.mask_mode == "after"
    dim = model.embed_dim
    store = FrameStore(frame_dtype="int8")
    pad = np.random.default_rng(3).normal(size=dim).astype(np.float16)
    store.append_runs(_runs(3, dim=dim, seed=2), pad, 4)
    store.append(_features(model, 5, seed=4), _rows(100, 5))
    ids = np.array([13, 0, 2, 5, 11, 8, 4])  # segments with and without padding, and clips
    codes, scale, mask = store.gather_codes(ids)
    reference = store.gather(ids, torch.float32)
    np.testing.assert_array_equal(codes * scale[..., None], reference.frames.numpy())
    np.testing.assert_array_equal(mask, reference.frame_mask.numpy())
    assert not mask[ids == 2].all()  # a segment of 3 frames in 4 slots
    padded = reference.frames[int(np.flatnonzero(ids == 2)[0]), 3].numpy()
    np.testing.assert_allclose(padded, pad, atol=float(np.abs(pad).max()) / 127)
    text = _text(model, QUERIES[:1])
    pairs = torch.zeros(len(ids), dtype=torch.int64)
    with torch.no_grad():
        torch.testing.assert_close(
            pair_scores(model, TextFeatures(text), QuantisedVideo(*map(torch.from_numpy,
                                                                        (codes, scale, mask))),
                        pairs=pairs),
            pair_scores(model, TextFeatures(text), reference, pairs=pairs),
            rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def plain() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config(use_adaptive_pooling=False)).eval()


def test_int8_frames_keep_the_top_10(plain, tmp_path):
    more = [*QUERIES, "a purple star shrinks", "an orange ring bounces", "a white bar rises",
            "a black heart falls"]
    text = _text(plain, more)
    video = _features(plain, 400, seed=5, near=text, per_query=12)
    half = _index(plain, video)
    small = VideoIndex(plain, backend="exact", frame_dtype="int8")
    small.save(tmp_path / "int8")
    for start in range(0, len(video), 64):
        part = video[start:start + 64]
        small.add_features(part, [{"path": f"/v/{start + i}.mp4"} for i in range(len(part))])
    assert json.loads((tmp_path / "int8" / "manifest.json").read_text())["version"] == 5
    for candidates in (100, None):
        for a, b in zip(half.search(more, k=10, candidates=candidates),
                        small.search(more, k=10, candidates=candidates), strict=True):
            assert [h.id for h in a] == [h.id for h in b]
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=0.02)
    with pytest.raises(ValueError, match="keeps frames as int8, not float16"):
        VideoIndex.create_or_resume(plain, tmp_path / "int8", frame_dtype="float16")


def test_int8_runs_are_searched_as_moments(plain):
    index = VideoIndex(plain, backend="exact", frame_dtype="int8")
    dim = plain.embed_dim
    index.add_runs(_runs(3, dim=dim, seed=2), np.zeros(dim, np.float16))
    hits = index.search(QUERIES[0], k=3)
    assert len(hits) == 3 and all(len(h.moments) >= 1 for h in hits)
    assert index.store.shards[0].frame_dtype == "int8"
    run = index.store.videos.run(hits[0].id)
    assert run["frames"].dtype == np.float16 and len(run["frames"]) == 6 + hits[0].id // 3


def test_checksums_and_repair_cover_int8_shards(plain, tmp_path):
    video = _features(plain, 40, seed=7)
    index = VideoIndex(plain, backend="exact", frame_dtype="int8")
    index.save(tmp_path / "index")
    index.add_features(video[:20], _rows(0, 20))
    index.add_features(video[20:], _rows(20, 20))
    assert check_index(tmp_path / "index").ok
    shard = tmp_path / "index" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-64:] = b"\x7f" * 64  # the end of the file: the last videos' proxies
    shard.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its checksum"):
        VideoIndex.load(tmp_path / "index", plain, verify=True)
    report = check_index(tmp_path / "index")
    assert not report.ok and "shard-00001.safetensors does not match" in report.problems[0]
    assert "its rows 24..39 fail their own checksums" in report.problems[0]
    repaired = check_index(tmp_path / "index", repair=True)  # no files: removed
    assert repaired.repaired and "rows 24..39" in repaired.repaired[0]
    reopened = VideoIndex.load(tmp_path / "index", plain, verify=True)  # sound again
    assert len(reopened) == 24 and reopened.store.frame_dtype == "int8"
    assert {h.id for h in reopened.search(QUERIES[0], k=24)} == set(range(24))
