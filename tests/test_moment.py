"""The moment: Eq. 1's frame weights per hit, and the stored frames' times in the video.

The times are checked against the frames the decoder really returns: every frame of the
generated clips is a flat grey level that encodes its own index (``_videos.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dicosa.data.video import load_video_partial
from dicosa.index import VideoIndex
from dicosa.model import TextFeatures, VideoFeatures
from dicosa.search.moment import (
    best_moments,
    frame_times,
    frame_weights,
    row_frame_times,
    timelines,
)

from ._index import stored
from ._videos import level_to_index, write_video
from .conftest import tiny_config

SLOTS = 4  # the tiny model's N


def test_frame_weights_are_the_weights_the_score_pools_with(tiny_model):
    g = torch.Generator().manual_seed(0)
    text = torch.randn(3, tiny_model.embed_dim, generator=g)
    frames = torch.randn(3, SLOTS, tiny_model.embed_dim, generator=g).half()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    video = VideoFeatures(frames, mask)
    weights = frame_weights(tiny_model, text, video)  # [3, N]
    with torch.no_grad():
        reference = tiny_model.explain(TextFeatures(text), video.to(dtype=torch.float32))
    expected = reference["weights"][torch.arange(3), torch.arange(3)]  # text i with video i
    torch.testing.assert_close(weights, expected.masked_fill(~mask, 0.0), atol=1e-5, rtol=1e-4)
    assert (weights[~mask] == 0).all()
    if tiny_model.mask_mode == "before":  # the paper renormalises over the valid frames
        torch.testing.assert_close(weights.sum(1), torch.ones(3), atol=1e-5, rtol=0)
    # One query for every video ([1, D]) is the same as the query repeated.
    torch.testing.assert_close(frame_weights(tiny_model, text[:1], video),
                               frame_weights(tiny_model, text[:1].expand(3, -1), video))


CLIPS = {"short.mp4": (3, 10), "ten.mp4": (10, 10), "odd.mp4": (23, 25), "long.mp4": (47, 5),
         "grid.mp4": (40, 10)}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moment")
    return {name: write_video(folder / name, n, fps=fps) for name, (n, fps) in CLIPS.items()}


@pytest.mark.parametrize("sampling", ["segments", "released"])
def test_frame_times_are_the_times_of_the_frames_the_index_decoded(clips, sampling):
    """Through a real build of N frames per video (an index without segments): the rows
    (frame count, rate) and masks the index stored give the times of the frames the decoder
    returned for each stored slot."""
    torch.manual_seed(0)
    from dicosa.model import DiCoSA

    model = DiCoSA.from_config(tiny_config()).eval()
    index = VideoIndex.build(model, list(clips.values()), None, frame_sampling=sampling,
                             num_workers=0, progress=False, backend="exact", segments=False)
    rows, video = index.metadata, stored(index)
    times = frame_times(index.frames, SLOTS, rows, video.frame_mask)  # [n, N]
    for row, (path, time_row, mask) in enumerate(zip(rows["path"], times, video.frame_mask,
                                                     strict=True)):
        frames, decoded_mask, _ = load_video_partial(path, SLOTS, 32, sampling=sampling)
        assert torch.equal(decoded_mask, mask)
        picked = level_to_index(frames[decoded_mask].float().mean(dim=(1, 2, 3)).numpy())
        fps = CLIPS[path.rsplit("/", 1)[1]][1]
        np.testing.assert_allclose(time_row[mask.numpy()], picked / fps, atol=1e-9,
                                   err_msg=f"{path} ({sampling}), row {row}")
        assert np.isnan(time_row[~mask.numpy()]).all()
        assert (np.diff(time_row[mask.numpy()]) > 0).all()


def test_frame_times_say_nothing_they_cannot_know():
    # 40 frames at 10 fps: the segment centres 5, 15, 25, 35.
    np.testing.assert_allclose(row_frame_times("segments", 4, 40, 10.0, 4), [.5, 1.5, 2.5, 3.5])
    # released: one frame a second, then 4 evenly spaced among the 4 seconds' frames
    np.testing.assert_allclose(row_frame_times("released", 4, 40, 10.0, 4), [0, 1, 2, 3])
    unknown = [
        row_frame_times("segments", 4, 40, 10.0, 4, frames_lost=0.25),  # which frame is lost?
        row_frame_times("segments", 4, 40, "", 4),  # no frame rate
        row_frame_times("segments", 4, float("nan"), 10.0, 4),  # no frame count
        row_frame_times("segments", 4, 40, 10.0, 0),  # text-only: no stored frame
        row_frame_times("segments", 4, 40, 10.0, 3),  # the mask does not match the picks
        row_frame_times("segments", 4, 40, 0.0, 4),
    ]
    for times in unknown:
        assert times.shape == (4,) and np.isnan(times).all()


def test_timelines_pick_the_heaviest_valid_frame():
    weights = torch.tensor([[0.1, 0.6, 0.3, 0.0], [0.2, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    times = np.array([[0.5, 1.5, 2.5, np.nan], [np.nan] * 4, [np.nan] * 4])
    first, unknown, blank = timelines(weights, times, mask, np.array([0.3, 0.1, 0.0]))
    assert (first.best_frame, first.best_time) == (1, 1.5)
    assert first.best_weight == pytest.approx(0.6)
    assert first.times == [0.5, 1.5, 2.5, None]
    assert (unknown.best_frame, unknown.best_time) == (0, None)  # a tie goes to the earliest
    assert blank is None  # indexed from its title alone
    parts = first.as_dict()
    assert [f["frame"] for f in parts["frames"]] == [0, 1, 2, 3]
    assert [f["score"] for f in parts["frames"]] == [pytest.approx(0.3)] * 4
    assert parts["best"] == {"frame": 1, "time": 1.5, "weight": pytest.approx(0.6)}
    assert not any(isinstance(v, float) and math.isnan(v) for f in parts["frames"]
                   for v in f.values())



def test_moments_join_the_matching_rows_next_to_their_best_row():
    """Windows of one long shot (0-12 s, every 2 s) that all match, a shot after it that does
    not, and one more that matches less: the first moment is the whole matching stretch with
    the best row's score, the rows below the bar stay apart, and nothing is taken twice."""
    spans = np.array([[0, 4], [2, 6], [4, 8], [6, 10], [8, 12], [12, 15], [15, 18],
                      [30, 33]], float)
    scores = np.array([0.70, 0.90, 0.85, 0.80, 0.75, 0.10, 0.45, 0.60])
    rows = np.arange(len(scores)) + 100
    moments = best_moments(rows, spans, scores, limit=3, background=0.1, join=0.8)
    # bar 0.1 + 0.8 * (0.9 - 0.1) = 0.74: rows 101-104 join (0.70 and below do not)
    assert [(m.start, m.end, m.score, m.row) for m in moments] == [
        (2.0, 12.0, 0.9, 101), (30.0, 33.0, 0.6, 107), (15.0, 18.0, 0.45, 106)]
    # a lower level joins the 0.70 window too; above 1, each moment is one row
    assert best_moments(rows, spans, scores, 1, 0.1, join=0.7)[0].start == 0.0
    alone = best_moments(rows, spans, scores, 3, 0.1, join=2.0)
    assert [(m.start, m.end) for m in alone] == [(2.0, 6.0), (6.0, 10.0), (30.0, 33.0)]
    # rows that only meet (at a cut) are two moments, however well both match
    met = best_moments(np.arange(3), np.array([[0, 3.4], [3.4, 7], [9, 12]]),
                       np.array([0.9, 0.88, 0.89]), 3, background=0.0, join=0.8)
    assert [(m.start, m.end) for m in met] == [(0.0, 3.4), (9.0, 12.0), (3.4, 7.0)]
    # unknown times join nothing; unscored rows are never moments
    unknown = best_moments(np.arange(3), np.array([[np.nan, np.nan], [0, 4], [2, 6]]),
                           np.array([0.9, 0.8, -np.inf]), 3, background=0.0)
    assert [(m.start, m.end, m.row) for m in unknown] == [(None, None, 0), (0.0, 4.0, 1)]
    apart = best_moments(np.arange(3), np.array([[0, 4], [10, 14], [20, 24]]),
                         np.array([0.5, -np.inf, np.nan]), 3, background=0.0)
    assert [m.row for m in apart] == [0]  # -inf and NaN: not scored, even with time free


def test_moments_without_a_background_take_the_median_of_the_scores():
    spans = np.array([[0, 4], [2, 6], [4, 8], [8, 12]], float)
    scores = np.array([0.9, 0.8, 0.2, 0.1])  # median 0.5: bar 0.5 + 0.5 * 0.4 = 0.7
    assert best_moments(np.arange(4), spans, scores, 1)[0].end == 6.0
    assert best_moments(np.arange(4), spans, scores, 1, join=0.9)[0].end == 4.0
