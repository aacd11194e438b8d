"""The "distilled" first-stage summary (dicosa/heads/summary.py): a head trained on DiCoSA's
own scores, wired into VideoIndex as summary="distilled"."""

import numpy as np
import pytest
import torch

import dicosa.__main__ as cli
import dicosa.loading as loading
from dicosa.heads import HeadMismatchError, load_head, save_head
from dicosa.heads.summary import DistilledSummaryHead, cut_videos, fit_summary, teacher_scores
from dicosa.index import SUMMARY_HEAD, VideoIndex
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search.proxy import Summary

from ._index import encoded, searcher
from .conftest import loads, tiny_checkpoint, tiny_config
from .test_index_search import QUERIES, _features, _text


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


def _config(**changes):
    return DistilledSummaryHead.make_config({
        "dim": 16, "hidden": 32, "steps": 30, "queries_per_step": 4, "shared_videos": 32,
        "top": 4, "near": 4, "window": 16, "teacher_queries": 8, "cuts_max": 256, **changes})


@pytest.fixture(scope="module")
def head(model) -> DistilledSummaryHead:
    video = _features(model, 64, seed=3)
    text = _text(model, QUERIES * 2)
    return fit_summary(model, video, text, _config(), progress=False)


def test_teacher_is_dicosa_score(model):
    video = _features(model, 10, seed=1)
    text = _text(model, QUERIES)
    want = model.score(TextFeatures(text), VideoFeatures(video.frames.float(), video.frame_mask))
    got = teacher_scores(model, text, video, chunk=3)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("confidence", [False, True])
def test_shapes_and_inner_product(model, confidence):
    """The stage scores a query and a video by the inner product of the vectors the summary
    hands out; the video vector ignores padded frames and does not depend on the query."""
    torch.manual_seed(1)
    head = DistilledSummaryHead(_config(confidence=confidence), embed_dim=model.embed_dim,
                                num_frames=model.config.num_frames)
    if confidence:
        conf = Summary(model, "confidence")
        conf.calibrate(np.random.default_rng(0).standard_normal((20, model.embed_dim)))
        head.calibration = conf.calibration
    torch.nn.init.normal_(head.query[-1].weight)  # not zero: the learned part counts
    summary = Summary(model, "distilled", head=head)
    video = _features(model, 9, seed=2)
    vectors = summary.videos(video)
    queries = summary.queries(_text(model, QUERIES))
    assert vectors.shape == (9, summary.dim) and queries.shape == (4, summary.dim)
    assert summary.dim == 16 + (2 * model.embed_dim if confidence else 0) + 1
    # the last coordinate puts every video on the sphere of radius R, 0 for queries
    head.radius = float(np.linalg.norm(vectors[:, :-1], axis=1).max()) * 1.25
    vectors = summary.videos(video)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), head.radius, rtol=1e-5)
    assert (queries[:, -1] == 0).all()
    assert summary.needs_frames and not summary.normalize
    # padding is ignored: changing a padded frame changes nothing
    short = int(np.flatnonzero(~video.frame_mask.all(1).numpy())[0])
    frames = video.frames.clone()
    frames[short, ~video.frame_mask[short]] = 7.0
    again = summary.videos(VideoFeatures(frames, video.frame_mask))
    np.testing.assert_allclose(again, vectors, rtol=1e-5, atol=1e-5)
    # a video's vector is the same alone or in a batch
    np.testing.assert_allclose(summary.videos(video[3:4]), vectors[3:4], rtol=1e-4, atol=1e-5)
    assert torch.isfinite(queries).all()


def test_training_starts_at_confidence_and_improves(model):
    """With ``confidence`` the zero-initialised query MLP makes the untrained head score
    exactly as the "confidence" summary does; training lowers the distillation loss."""
    video = _features(model, 64, seed=3)
    text = _text(model, QUERIES * 2)
    config = _config(confidence=True, steps=1, lr=1e-12)
    head = fit_summary(model, video, text, config, progress=False)
    conf = Summary(model, "confidence", head.calibration)
    from dicosa.functional import video_proxy
    proxy = video_proxy(video.frames.float(), video.frame_mask).numpy()
    want = conf.queries(text) @ torch.from_numpy(conf.videos(proxy)).T
    summary = Summary(model, "distilled", head=head)
    got = summary.queries(text) @ torch.from_numpy(summary.videos(video)).T
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    norms = np.linalg.norm(summary.videos(video), axis=1)
    np.testing.assert_allclose(norms, head.radius, rtol=1e-5)  # fit sets R above every norm
    trained = fit_summary(model, video, text, _config(steps=60), progress=False)
    assert fit_summary(model, video, text, _config(steps=20), progress=False).trained[
        "steps"] == 20  # the schedule's warm-up is one step long here: no division by 0
    assert trained.trained["loss"] < 0.9 * fit_summary(
        model, video, text, _config(steps=2), progress=False).trained["loss"]


def test_cut_videos_join_two_training_videos_at_one_cut():
    """Each frame of a cut video is its source's frame at the same position; a video holds
    frames of at most two sources, switching once; padding stays masked, about
    ``frame_drop`` of the valid frames are masked out, and every video keeps one frame."""
    videos, num = 6, 5
    ids = torch.arange(videos * num, dtype=torch.float32).view(videos, num, 1)
    mask = torch.ones(videos, num, dtype=torch.bool)
    mask[2, 3:] = False  # a short video
    cut = cut_videos(VideoFeatures(ids.expand(-1, -1, 3), mask), 2000, 0.3,
                     torch.Generator().manual_seed(0))
    frame = cut.frames[..., 0].long()  # [2000, N]: the source frame's id
    source, position = frame // num, frame % num
    assert cut.frames.shape == (2000, num, 3)
    assert (position == torch.arange(num)).all()
    assert ((source[:, 1:] != source[:, :-1]).sum(1) <= 1).all()
    valid = mask[source, position]  # [2000, N]: the source frame is not padding
    padding_kept = (cut.frame_mask & ~valid).any(1)  # only where nothing else was left
    assert (cut.frame_mask[padding_kept].sum(1) == 1).all()
    assert cut.frame_mask.any(1).all()
    dropped = 1 - cut.frame_mask[valid].float().mean()
    assert 0.2 < float(dropped) < 0.35


def test_save_load_round_trip(model, head, tmp_path):
    path = save_head(head, tmp_path / "summary.pt", model)
    loaded = load_head(path, model, kind="summary")
    video = _features(model, 5, seed=4)
    text = _text(model, QUERIES)
    a, b = Summary(model, "distilled", head=head), Summary(model, "distilled", head=loaded)
    np.testing.assert_array_equal(a.videos(video), b.videos(video))
    torch.testing.assert_close(a.queries(text), b.queries(text))
    torch.manual_seed(5)
    other = DiCoSA.from_config(tiny_config()).eval()
    with pytest.raises(HeadMismatchError):
        load_head(path, other)


def test_index_with_distilled_summary(model, head, tmp_path):
    """summary="distilled" in VideoIndex: candidates >= len(index) is still exhaustive, the
    stage ranks by the head's inner product, and the index reopens with the head it saved."""
    with pytest.raises(ValueError, match="summary_head"):
        Summary(model, "distilled")
    video = _features(model, 120, seed=6)
    index = VideoIndex(model, backend="exact", summary="distilled", summary_head=head)
    index.save(tmp_path / "ix")
    for start in range(0, 120, 50):
        part = video[start:start + 50]
        index.add_features(part, [{"path": f"/v/{start + i}.mp4"} for i in range(len(part))])
    index.save(tmp_path / "ix")
    assert (tmp_path / "ix" / SUMMARY_HEAD).is_file()
    full = index.search(QUERIES, k=5, candidates=None)
    every = index.search(QUERIES, k=5, candidates=len(index))
    assert [[h.id for h in q] for q in full] == [[h.id for h in q] for q in every]
    # the stage's candidates are the top of q(t) . u(v)
    summary = Summary(model, "distilled", head=head)
    scores = summary.queries(_text(model, QUERIES)) @ torch.from_numpy(summary.videos(video)).T
    hits = index.search(QUERIES, k=5, candidates=20)
    got = searcher(index).candidates(encoded(index, QUERIES), 20, None)[0]
    want = scores.topk(20, dim=1).indices.numpy()
    assert all(set(g) == set(w) for g, w in zip(got.tolist(), want.tolist(), strict=True))
    # reopened from its folder (the head file, fingerprint-checked)
    again = VideoIndex.load(tmp_path / "ix", model)
    assert [[h.id for h in q] for q in again.search(QUERIES, k=5, candidates=20)] == \
        [[h.id for h in q] for q in hits]
    # removal keeps the stage in step
    index.remove(np.asarray(want[0][:3]))
    after = searcher(index).candidates(encoded(index, QUERIES[:1]), 20, None)[0][0]
    assert not set(want[0][:3]) & set(after.tolist())


def test_heads_train_summary_then_index_with_it_on_the_command_line(tmp_path, capsys,
                                                                    monkeypatch):
    """`heads train summary` on a checkpoint's encoded training split, then `index
    --summary-head`: the index's dense stage is the distilled one, with the head it was given;
    a head of another model stops the command in one sentence before anything is encoded."""
    from dicosa.heads.train import train_head

    model, checkpoint, root = tiny_checkpoint(tmp_path, num_train=8, val_fraction=0.25)
    path = train_head("summary", checkpoint, tmp_path / "summary.pt",
                      ["dim=8", "hidden=16", "steps=3", "queries_per_step=2",
                       "shared_videos=4", "top=2", "near=2", "window=4", "teacher_queries=4"],
                      progress=False)
    head = load_head(path, model, kind="summary")
    assert head.config.dim == 8 and head.trained["fit_seconds"] >= 0

    monkeypatch.setattr(loading, "load_model", loads(model, {"config": "tiny"}))
    out = tmp_path / "index"
    assert cli.main(["index", str(root / "videos"), "--out", str(out), "--summary-head",
                     str(path), "--backend", "exact", "--num-workers", "0",
                     "--config", "x"]) == 0
    assert "indexed 8 videos" in capsys.readouterr().out
    index = VideoIndex.load(out, model)
    assert index.stages.spec["summary"] == "distilled" and (out / SUMMARY_HEAD).is_file()
    assert index.search("a red circle", k=3, candidates=4)

    torch.manual_seed(5)
    other = DiCoSA.from_config(tiny_config()).eval()
    monkeypatch.setattr(loading, "load_model", loads(other, {"config": "tiny"}))
    code = cli.main(["index", str(root / "videos"), "--out", str(tmp_path / "other"),
                     "--summary-head", str(path), "--config", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "trained on a model with" in err[-1] and len(err) == 1
    assert not (tmp_path / "other").exists()


def test_pooling_ignores_masked_frames_and_an_empty_row_is_finite(head):
    """Masked frames change nothing (same as the row without them); a row with no valid frame
    (a title-only entry) gets a finite vector, never NaN, which would poison the ANN index."""
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(3, 4, head.embed_dim, generator=g)
    mask = torch.tensor([[True, True, False, False], [True] * 4, [False] * 4])
    pooled = head.pool(frames, mask).detach()
    alone = head.pool(frames[:1, :2], torch.ones(1, 2, dtype=torch.bool)).detach()
    torch.testing.assert_close(pooled[0], alone[0], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(pooled).all()
    video = VideoFeatures(frames, mask)
    assert torch.isfinite(head.videos(None, video)).all()
