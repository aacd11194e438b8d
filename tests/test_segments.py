"""Segments: shots from cuts and holes, short shots joined, windows over long shots, chunks
for the temporal transformer, and the time span of each segment."""

import itertools

import numpy as np
import pytest

from dicosa.data.segments import (
    SegmentPolicy,
    chunk_shots,
    layout_run,
    segment_run,
    segment_spans,
    shots_of,
)


def test_shots_from_cuts_holes_and_short_shots():
    assert shots_of(0, [3]) == []
    assert shots_of(10, []) == [(0, 10)]
    assert shots_of(10, [3, 7, 0, 10, 42]) == [(0, 3), (3, 7), (7, 10)]  # outside: ignored
    # A one-frame shot joins its shorter neighbour: (3, 4) -> (0, 4) beside (4, 10).
    assert shots_of(10, [3, 4], min_frames=2) == [(0, 4), (4, 10)]
    # ...but never across a hole: the frames before and after a lost stretch stay apart.
    assert shots_of(10, [4], holes=[3], min_frames=2) == [(0, 3), (3, 10)]
    assert shots_of(10, [], holes=[1], min_frames=3) == [(0, 1), (1, 10)]
    # Every frame is in exactly one shot, in order, whatever the cuts.
    rng = np.random.default_rng(0)
    for _ in range(50):
        length = int(rng.integers(1, 60))
        cuts = rng.integers(0, length + 3, size=int(rng.integers(0, 8)))
        holes = rng.integers(0, length + 3, size=int(rng.integers(0, 3)))
        shots = shots_of(length, cuts, holes, min_frames=int(rng.integers(1, 5)))
        assert shots[0][0] == 0 and shots[-1][1] == length
        assert all(a < b for a, b in shots)
        assert all(b == c for (_, b), (c, _) in itertools.pairwise(shots))
        assert {h for h in holes if 0 < h < length} <= {a for a, _ in shots}


def test_windows_cover_long_shots_and_short_shots_are_one_segment():
    segments = segment_run([(0, 3), (3, 17), (17, 29)], window=4, step=2)
    assert segments.tolist() == [[0, 3],  # a short shot: one segment
                                 [3, 4], [5, 4], [7, 4], [9, 4], [11, 4], [13, 4],
                                 [17, 4], [19, 4], [21, 4], [23, 4], [25, 4]]
    # The last window of a shot ends at its end; windows never cross a shot boundary.
    assert segment_run([(0, 10)], window=4, step=4).tolist() == [[0, 4], [4, 4], [6, 4]]
    for first, count in segments.tolist():
        shot = next((a, b) for a, b in [(0, 3), (3, 17), (17, 29)] if a <= first < b)
        assert first + count <= shot[1] and count <= 4
    covered = np.zeros(29, bool)
    for first, count in segments.tolist():
        covered[first:first + count] = True
    assert covered.all()


def test_chunks_are_near_equal_and_partition_each_shot():
    chunks = chunk_shots([(0, 3), (3, 17), (17, 30)], window=4)
    # 14 frames in ceil(14 / 4) = 4 chunks of 3-4, 13 frames in 4 chunks of 3-4
    assert chunks.tolist() == [[0, 3], [3, 3], [6, 4], [10, 4], [14, 3],
                               [17, 3], [20, 4], [24, 3], [27, 3]]
    assert (chunks[:, 1] <= 4).all() and (chunks[1:, 0] == chunks[:-1].sum(1)).all()


def test_segment_spans_from_frame_times():
    times = np.array([0.0, 1.0, 2.0, 3.0, 7.5, 8.5])  # a hole between 3 and 7.5
    spans = segment_spans(np.array([[0, 2], [2, 2], [4, 2]]), times, 1.0, duration=9.2)
    np.testing.assert_allclose(spans, [[0, 2], [2, 4], [7.5, 9.2]])
    # The end is cut short by the video's end, never before the start.
    np.testing.assert_allclose(segment_spans(np.array([[5, 1]]), times, 1.0, duration=8.6),
                               [[8.5, 8.6]])


def test_rows_meet_at_the_cut_the_detector_saw():
    """At 1 frame/s, cuts at 2.4 s and 6.0 s: the rows on either side meet at the cut itself,
    the frame at 3 s (the first after 2.4) beginning the new row; of two cuts in one gap the
    stronger is the boundary; a shot joined for being short leaves no boundary."""
    times = np.arange(12.0)
    policy = SegmentPolicy(window=4, min_shot=1.0)
    layout = layout_run(times, [2.4, 6.0], [], policy, duration=12.0)
    assert layout.shots == [(0, 3), (3, 6), (6, 12)]
    np.testing.assert_allclose(layout.spans[:2], [[0, 2.4], [2.4, 6.0]])
    assert layout.spans[2].tolist() == [6.0, 10.0]
    # two cuts between the frames at 2 s and 3 s: the stronger one bounds the rows
    for changes, cut in [([90.0, 12.0], 2.2), ([12.0, 90.0], 2.7), (None, 2.2)]:
        layout = layout_run(times, [2.2, 2.7], [], policy, 12.0, changes)
        assert layout.spans[0, 1] == layout.spans[1, 0] == cut
    # a one-frame shot (the frame at 5 s) under min_shot 2 s joins the shorter neighbour:
    # the cut at 4.5 s is no boundary and moves no row, the one at 5.5 s remains one
    layout = layout_run(times, [4.5, 5.5], [], SegmentPolicy(window=4, min_shot=2.0), 12.0)
    assert layout.shots == [(0, 6), (6, 12)]
    assert 4.5 not in layout.spans and layout.spans[:, 0].tolist().count(5.5) == 1
    # segment_spans alone: a cut in a segment's gap moves its start (and the previous end)
    spans = segment_spans(np.array([[0, 3], [3, 3]]), times[:6], 1.0, 6.0, cuts=[2.5])
    np.testing.assert_allclose(spans, [[0, 2.5], [2.5, 6]])


def test_policy_checks_and_round_trips():
    policy = SegmentPolicy(window=12)
    assert (policy.step, policy.span, policy.min_frames) == (6, 12.0, 1)
    assert SegmentPolicy.from_dict(policy.as_dict()) == policy
    assert SegmentPolicy(window=4, rate=2.0, min_shot=1.5).min_frames == 3
    for bad, message in [({"window": 0}, "window"), ({"window": 4, "rate": 0}, "rate"),
                         ({"window": 4, "stride": 5}, "stride"),
                         ({"window": 4, "detector": "magic"}, "detector")]:
        with pytest.raises(ValueError, match=message):
            SegmentPolicy(**bad)
    with pytest.raises(ValueError, match="unknown segment settings"):
        SegmentPolicy.from_dict({"window": 4, "fps": 2})
