"""DiDeMo's moment annotations: ``times`` read as seconds, on hand-made entries and on the
DiDeMo-format sample the project writes (its frame-exact scene times as the reference)."""

from __future__ import annotations

import json
import logging

import av
import numpy as np
import pytest

from dicosa.data.datasets import load_split
from dicosa.data.long_synthetic import Scene
from dicosa.data.moments import didemo_range, load_didemo_moments
from dicosa.moment_metrics import evaluate_rankings

from ._didemo_sample import write_didemo_sample


@pytest.mark.parametrize("first, last, duration, expected", [
    (0, 0, None, (0.0, 5.0)),
    (1, 4, None, (5.0, 25.0)),     # inclusive: segments 1..4 are seconds 5..25
    (5, 5, None, (25.0, 30.0)),
    (5, 5, 27.5, (25.0, 27.5)),    # the last segment ends with the video
    (4, 5, 22.0, (20.0, 22.0)),
    (2, 3, 22.0, (10.0, 20.0)),    # untouched by a later end
    (5, 5, 22.0, None),            # a sixth segment a 22-s video does not have
])
def test_didemo_range_known_values(first, last, duration, expected):
    assert didemo_range(first, last, duration) == expected


@pytest.mark.parametrize("pair", [(2, 1), (0, 6), (-1, 0), (0.5, 1), (True, 1)])
def test_didemo_range_refuses_malformed_segments(pair):
    with pytest.raises(ValueError, match="DiDeMo segments must"):
        didemo_range(*pair)


def test_hand_made_entries_keep_every_annotator_and_count_what_they_drop(tmp_path, caplog):
    entries = [
        {"annotation_id": 7, "video": "a@N00_1.mov", "description": " a dog runs ",
         "times": [[0, 0], [0, 1], [0, 0], [0, 0]]},
        {"annotation_id": 8, "video": "a@N00_1.mov", "description": "it stops",
         "times": [[2, 3], [9, 9], [3, 2], "x"]},                  # three malformed ranges
        {"annotation_id": 9, "video": "b@N00_2.mp4", "description": "", "times": [[1, 1]]},
        {"annotation_id": 10, "video": "b@N00_2.mp4", "description": "a girl waves",
         "times": [[6, 6]]},                                       # none usable: skipped
        {"annotation_id": 11, "video": "b@N00_2.mp4", "description": "she sits",
         "times": [[4, 5]]},
        {"annotation_id": 12, "video": "c@N00_3.mov", "description": "not listed",
         "times": [[0, 0]]},
    ]
    (tmp_path / "val_data.json").write_text(json.dumps(entries))
    (tmp_path / "val_list.txt").write_text("b@N00_2.mp4\na@N00_1.mov\n")
    with caplog.at_level(logging.WARNING):
        split = load_didemo_moments(tmp_path, "val")
    assert split.name == "didemo/val" and split.video_ids == ["b@N00_2", "a@N00_1"]
    assert split.truths() == [
        ("b@N00_2", ((20.0, 30.0),)),  # no file: the 5-s grid, unclipped
        ("a@N00_1", ((0.0, 5.0), (0.0, 10.0), (0.0, 5.0), (0.0, 5.0))),
        ("a@N00_1", ((10.0, 20.0),)),
    ]
    assert split.captions == ["she sits", "a dog runs", "it stops"]
    assert split.annotation_ids == ["11", "7", "8"]
    assert split.durations == [None, None]
    assert split.num_skipped_ranges == 4 and split.num_skipped_captions == 2
    text = caplog.text
    assert "dropped 4 annotator range(s)" in text and "skipped 2 caption(s)" in text
    assert "1 annotation(s) of videos not in the list file" in text
    assert "2 of 2 video files not found" in text


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_didemo_sample(tmp_path_factory.mktemp("didemo"), num_train=2, num_test=3,
                               seed=1)


def test_sample_times_in_seconds_equal_the_written_scenes(sample):
    meta = json.loads((sample / "didemo_sample_meta.json").read_text())
    split = load_didemo_moments(sample, "test")
    assert len(split.video_ids) == 3 and split.num_queries == 9
    assert split.num_skipped_ranges == 0 and split.num_skipped_captions == 0
    # The probed durations: five segments, six full ones, a short last one.
    assert [meta[v]["duration"] for v in split.video_ids] == [22.0, 30.0, 27.5]
    assert split.durations == pytest.approx([22.0, 30.0, 27.5])
    scenes = [(v, s) for v in split.video_ids for s in meta[v]["scenes"]]
    for caption, (video, ranges), (scene_video, scene) in zip(
            split.captions, split.truths(), scenes, strict=True):
        assert (video, caption) == (scene_video, scene["caption"])
        # Three annotators mark the scene; its seconds come from the frames written.
        assert ranges.count((scene["start"], scene["end"])) == 3 and len(ranges) == 4
    assert meta[split.video_ids[0]]["num_segments"] == 5
    assert meta[split.video_ids[2]]["scenes"][-1]["end"] == 27.5
    # An oracle ranking the agreed range first reaches every recall.
    oracle = [[(v, *max(set(r), key=r.count), 1.0)] for v, r in split.truths()]
    out = evaluate_rankings(oracle, split.truths())
    assert set(out["VCMR"].values()) == {100.0} and out["num_multi_annotator"] == 9


def test_sample_frames_show_the_annotated_scene(sample):
    meta = json.loads((sample / "didemo_sample_meta.json").read_text())
    for video, entry in meta.items():
        renders = [Scene.from_record(s).render(32, 32).astype(int) for s in entry["scenes"]]
        with av.open(str(sample / "videos" / f"{video}.mp4")) as container:
            frames = [(float(f.time), f.to_ndarray(format="rgb24").astype(int))
                      for f in container.decode(video=0)]
        assert len(frames) == round(entry["duration"] * 2)
        for t, image in frames:
            j = next(j for j, s in enumerate(entry["scenes"]) if s["start"] <= t < s["end"])
            local = round((t - entry["scenes"][j]["start"]) * 2)
            errors = [np.abs(image - r[min(local, len(r) - 1)]).mean() for r in renders]
            assert errors[j] < 12 and errors[j] == min(errors), (video, t, errors)


def test_sample_loads_unchanged_as_retrieval_split(sample):
    split = load_split("didemo", sample, "train")
    assert split.video_ids == ["1000@N00_10_train", "1001@N00_11_train"]
    assert all(p.is_file() and p.suffix == ".mp4" for p in split.video_paths)  # .mov -> .mp4
    data = json.loads((sample / "train_data.json").read_text())
    assert split.captions[0] == " ".join(e["description"] for e in data
                                         if e["video"].startswith("1000@"))
