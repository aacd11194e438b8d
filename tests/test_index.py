import json
import shutil
import warnings

import pytest
import torch

from dicosa.data.protocol import PAD_COLOURS, FrameProtocol
from dicosa.data.synthetic import make_synthetic
from dicosa.data.video import load_video, load_video_partial
from dicosa.fingerprint import model_fingerprint
from dicosa.index import VideoIndex, list_videos
from dicosa.model import DiCoSA, VideoFeatures

from ._index import exhaustive_scores, stored
from ._videos import damage, write_video
from .conftest import spy_encoder, tiny_config

NUM_VIDEOS = 6
QUERIES = ["a red circle moves left", "a blue square grows while a green cross falls"]


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=0,
                          num_test=NUM_VIDEOS, size=32, seconds=1.0, num_workers=1)
    return sorted((root / "videos").glob("video*.mp4"))


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def features(videos, model) -> VideoFeatures:
    """Features encoded directly with the model, for comparison with the index."""
    decoded = [load_video(p, model.config.num_frames, model.image_size) for p in videos]
    with torch.no_grad():
        return model.encode_video(torch.stack([f for f, _ in decoded]),
                                  torch.stack([m for _, m in decoded]))


def _build(model, paths, out=None, **kw):
    kw = {"batch_size": 2, "num_workers": 0, "progress": False, **kw}
    return VideoIndex.build(model, paths, out, **kw)


def _expected_scores(model, features, texts):
    from dicosa.clip import get_tokenizer

    stored = VideoFeatures(features.frames.float(), features.frame_mask)
    with torch.no_grad():
        text = model.encode_text(get_tokenizer(model.config.arch, model.config.max_words)(texts))
        return model.score(text, stored)


@pytest.mark.paths
def test_scores_are_the_model_score_of_the_stored_features(videos, model, features):
    index = _build(model, videos)
    assert index.paths == [str(p.resolve()) for p in videos]
    assert stored(index).frames.dtype == torch.float16
    # Encoded in batches of 2 by the index and of 6 here: CPU kernels block differently per
    # batch size, so the float32 features agree to rounding, and float16 storage may round
    # such a pair to neighbouring values (one float16 step, rtol 2^-10).
    torch.testing.assert_close(stored(index).frames, features.frames.half())
    assert torch.equal(stored(index).frame_mask, features.frame_mask)
    # The scores are exactly the model's score of what the index stores.
    expected = _expected_scores(model, stored(index), QUERIES)
    torch.testing.assert_close(exhaustive_scores(index, QUERIES), expected, atol=1e-6, rtol=1e-6)
    # Chunking over videos changes nothing.
    torch.testing.assert_close(exhaustive_scores(index, QUERIES, chunk=4), expected,
                               atol=1e-6, rtol=1e-6)

    hits = index.search(QUERIES[0], k=3, candidates=None)  # exhaustive: the reference
    order = expected[0].argsort(descending=True)[:3].tolist()
    assert [h.path for h in hits] == [index.paths[i] for i in order]
    assert [h.score for h in hits] == pytest.approx(expected[0, order].tolist(), abs=1e-6)
    assert all(h.stage == "exhaustive" and h.dicosa == h.score for h in hits)
    both = index.search(QUERIES, k=100)
    assert len(both) == 2 and all(len(h) == NUM_VIDEOS for h in both)

    meta = index.metadata
    assert list(meta.columns) == ["path", "duration", "fps", "num_frames", "valid_frames",
                                  "title", "text_only", "frames_lost", "size", "mtime",
                                  "expected_duration", "damage"]
    assert (meta["damage"] == "").all()  # whole files
    assert (meta["num_frames"] == 8).all() and meta["duration"].tolist() == [1.0] * NUM_VIDEOS
    assert (meta["valid_frames"] == model.config.num_frames).all()


def test_corrupt_file_is_counted_and_skipped(videos, model, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(videos[0].parent, folder)
    (folder / "broken.mp4").write_bytes(b"\x00" * 100)
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "notes.txt").write_text("not a video")  # not a video extension: not listed
    index = _build(model, folder, tmp_path / "index")
    assert len(index) == NUM_VIDEOS
    assert sorted(p.split("/")[-1] for p, _ in index.skipped) == ["broken.mp4", "empty.mp4"]
    assert all(reason for _, reason in index.skipped)
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert len(manifest["skipped"]) == 2 and manifest["num_videos"] == NUM_VIDEOS
    assert len(VideoIndex.load(tmp_path / "index").skipped) == 2


def test_damaged_video_keeps_its_decodable_frames_and_says_how_many_were_lost(
        model, tmp_path, caplog):
    folder = tmp_path / "videos"
    write_video(folder / "sound.mp4", 30)
    damaged = damage(write_video(folder / "damaged.mp4", 30), 10, 15)
    frames, mask, lost = load_video_partial(damaged, model.config.num_frames, model.image_size)
    assert 0 < lost < 1 and 0 < mask.sum() < model.config.num_frames  # the case under test
    with caplog.at_level("WARNING", logger="dicosa.index"):
        index = _build(model, folder, tmp_path / "index")
    assert len(index) == 2 and not index.skipped
    table = VideoIndex.load(tmp_path / "index").metadata.set_index("path")
    row = table.loc[str(damaged.resolve())]
    assert row["frames_lost"] == pytest.approx(lost) and row["valid_frames"] == int(mask.sum())
    assert table.loc[str((folder / "sound.mp4").resolve()), "frames_lost"] == 0
    assert any("damaged.mp4" in r.message and "did not decode" in r.message
               for r in caplog.records)
    stored = index.store.gather(index.ids[[list(table.index).index(str(damaged.resolve()))]])
    assert torch.equal(stored.frame_mask[0], mask)
    with torch.no_grad():  # the kept frames are encoded as they decode (float16 store)
        expected = model.encode_video(frames[None], mask[None]).frames[0]
    torch.testing.assert_close(stored.frames[0][mask].float(), expected[mask],
                               atol=2e-3, rtol=2e-3)


def test_save_load_round_trip(videos, model, tmp_path):
    index = _build(model, videos[:4])
    assert index.add(videos) == NUM_VIDEOS - 4  # already indexed videos are not re-added
    index.save(tmp_path / "index")
    loaded = VideoIndex.load(tmp_path / "index", model)
    assert loaded.paths == index.paths
    assert torch.equal(stored(loaded).frames, stored(index).frames)
    assert torch.equal(stored(loaded).frame_mask, stored(index).frame_mask)
    assert loaded.metadata.equals(index.metadata)
    assert torch.equal(exhaustive_scores(loaded, QUERIES), exhaustive_scores(index, QUERIES))

    read_only = VideoIndex.load(tmp_path / "index")
    assert len(read_only) == NUM_VIDEOS
    with pytest.raises(RuntimeError, match="without a model"):
        read_only.search("a dog")


def test_fingerprint_mismatch_is_explained(videos, model, tmp_path):
    _build(model, videos[:2], tmp_path / "index")
    torch.manual_seed(1)
    other_weights = DiCoSA.from_config(tiny_config()).eval()
    with pytest.raises(ValueError, match="different weights"):
        VideoIndex.load(tmp_path / "index", other_weights)
    with pytest.raises(ValueError, match="different weights"):  # nor can a build resume
        _build(other_weights, videos, tmp_path / "index")
    with pytest.warns(UserWarning, match="different weights"):
        VideoIndex.load(tmp_path / "index", other_weights, strict=False)

    torch.manual_seed(0)
    other_config = DiCoSA.from_config(tiny_config(pool_temperature=1.0)).eval()
    with pytest.raises(ValueError, match=r"pool_temperature: 3\.0 stored, 1\.0"):
        VideoIndex.load(tmp_path / "index", other_config)

    # Same weights and config, however the model was obtained: no complaint.
    torch.manual_seed(0)
    same = DiCoSA.from_config(tiny_config(pretrained=None, grad_checkpointing=True)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VideoIndex.load(tmp_path / "index", same)


def test_fingerprint_covers_every_weight(model):
    before = model_fingerprint(model)
    with torch.no_grad():
        model.head.conf_out.bias += 1e-3
    try:
        assert model_fingerprint(model)["weights_sha256"] != before["weights_sha256"]
    finally:
        with torch.no_grad():
            model.head.conf_out.bias -= 1e-3
    assert model_fingerprint(model) == before


def test_build_resumes_without_duplicates(videos, model, tmp_path):
    out = tmp_path / "index"
    first = _build(model, videos[:3], out, shard_size=2)
    kept = stored(first).frames.clone()
    shard0 = (out / "shard-00000.safetensors").read_bytes()

    resumed = _build(model, videos, out, shard_size=2)
    assert resumed.paths == [str(p.resolve()) for p in videos]
    assert torch.equal(stored(resumed).frames[:3], kept)
    assert (out / "shard-00000.safetensors").read_bytes() == shard0  # not rewritten
    reloaded = VideoIndex.load(out, model)
    assert reloaded.paths == resumed.paths and len(set(reloaded.paths)) == NUM_VIDEOS


def test_the_index_decodes_with_the_frame_protocol_it_records(model, tmp_path, monkeypatch):
    # 3 s at 10 fps, 4 frames: segment centres 3, 11, 18, 26; released 0, 10, 20 + a mean row.
    clips = [write_video(tmp_path / "clips" / f"{name}.mp4", 30, fps=10) for name in "abc"]
    released = [load_video(c, 4, model.image_size, sampling="released",
                           pad_colour=PAD_COLOURS["mean"]) for c in clips]
    segments = load_video(clips[0], 4, model.image_size)
    assert not torch.equal(released[0][0], segments[0])  # the two protocols differ here
    seen = spy_encoder(model, monkeypatch)
    out = tmp_path / "index"
    built = _build(model, clips[:1], out, frame_sampling="released", frame_padding="mean")
    assert built.frames == FrameProtocol("released", "mean")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["frames"] == {"sampling": "released", "padding": "mean"}
    assert manifest["version"] >= 3  # a dicosa that ignores "frames" refuses it
    VideoIndex.load(out, model).add(clips[1:2], num_workers=0, progress=False)  # reopened
    resumed = _build(model, clips, out)  # a resumed build keeps the recorded protocol
    assert resumed.frames == FrameProtocol("released", "mean") and len(resumed) == 3
    assert len(seen) == 3
    for (frames, mask), (expected, expected_mask) in zip(seen, released, strict=True):
        assert torch.equal(frames[0], expected) and torch.equal(mask[0], expected_mask)

    with pytest.raises(ValueError, match=(
            r"decodes videos with frame sampling 'released' and padding 'mean' \(its "
            r"manifest\), not sampling 'segments' and padding 'mean'; build a new index")):
        _build(model, clips, out, frame_sampling="segments")
    # A manifest from before the protocol was recorded: what indexes decoded then.
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["frames"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert VideoIndex.load(out, model).frames == FrameProtocol("segments", "black")


@pytest.mark.paths
def test_interrupted_build_keeps_written_shards(videos, model, tmp_path, monkeypatch):
    out = tmp_path / "index"
    from dicosa.index.encode import Encoder

    take = Encoder.take
    calls = []

    def interrupted(self, item):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return take(self, item)

    monkeypatch.setattr(Encoder, "take", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _build(model, videos, out, batch_size=1, shard_size=2)
    monkeypatch.setattr(Encoder, "take", take)

    # Shards 0 (videos 0-1) and the encoded-but-unflushed video 2 survive the interrupt.
    partial = VideoIndex.load(out, model)
    assert partial.paths == [str(p.resolve()) for p in videos[:3]]
    done = _build(model, videos, out)
    assert done.paths == [str(p.resolve()) for p in videos]
    # Video 2 was encoded in a batch of 1 before the interrupt, in a batch of 2 here.
    torch.testing.assert_close(stored(done).frames, stored(_build(model, videos)).frames)


@pytest.mark.paths
def test_decoding_workers_give_the_same_index(videos, model):
    serial = _build(model, videos)
    parallel = _build(model, videos, num_workers=2, batch_size=4)
    assert parallel.paths == serial.paths
    # Batches of 2 and 4: equal to float16 rounding (see the first test), not bit for bit.
    torch.testing.assert_close(stored(parallel).frames, stored(serial).frames)


def test_list_videos(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/b/z.mp4", "a/x.MKV", "y.avi", ".hidden.mp4", "a/readme.md"):
        (tmp_path / name).write_bytes(b"x")
    names = [p.removeprefix(str(tmp_path.resolve()) + "/") for p in list_videos(tmp_path)]
    assert names == ["a/b/z.mp4", "a/x.MKV", "y.avi"]
    assert list_videos(tmp_path / "y.avi") == [str((tmp_path / "y.avi").resolve())]
