"""The synthetic benchmark: layout, determinism, captions and the rendered content."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dicosa.data.datasets import load_split
from dicosa.data.loader import TrainDataset
from dicosa.data.synthetic import (
    COLOURS,
    SceneObject,
    caption_scene,
    make_synthetic,
    render_clip,
    sample_scene,
)
from dicosa.data.video import check_videos, load_video, video_info

ANNOTATIONS = ("MSRVTT_train.9k.csv", "MSRVTT_data.json", "MSRVTT_JSFUSION_test.csv",
               "synthetic_meta.json")


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    return make_synthetic(root, num_train=8, num_test=4, size=32, seed=3, fps=8, seconds=1.5,
                          num_workers=2)


def test_layout_is_msrvtt_and_loads_unchanged(synth):
    train = load_split("msrvtt", synth, "9k")
    test = load_split("msrvtt", synth, "1k-A")
    assert train.video_ids == [f"video{i}" for i in range(8)]
    assert test.video_ids == [f"video{i}" for i in range(8, 12)]
    assert all(p.is_file() and p.suffix == ".mp4" for p in train.video_paths + test.video_paths)
    # One full-description query per test video, as in MSR-VTT 1k-A.
    assert test.num_captions == 4 and test.multi_caption is False
    assert load_split("synthetic", synth, "train").captions == train.captions
    assert check_videos(train.video_paths + test.video_paths, progress=False) == []
    info = video_info(train.video_paths[0])
    assert (info["width"], info["height"], info["fps"], info["num_frames"]) == (32, 32, 8.0, 12)


def test_captions_describe_the_clip(synth):
    meta = json.loads((synth / "synthetic_meta.json").read_text())
    train = load_split("msrvtt", synth, "9k")
    per_video = np.bincount(train.caption_video, minlength=train.num_videos)
    assert per_video.min() >= 3 and per_video.max() <= 5
    for caption, v in zip(train.captions, train.caption_video, strict=True):
        objects = meta[train.video_ids[v]]["objects"]
        named = {c for c in COLOURS if f" {c} " in f" {caption} "}
        # Every colour named is in the clip (partial captions name a subset).
        assert named and named <= {o["colour"] for o in objects}, caption
    first = meta["video0"]["captions"][0]
    assert all(f"{o['colour']} {o['shape']}" in first for o in meta["video0"]["objects"])


def test_same_seed_same_benchmark(synth, tmp_path):
    again = make_synthetic(tmp_path, num_train=8, num_test=4, size=32, seed=3, fps=8,
                           seconds=1.5, num_workers=1)
    for name in ANNOTATIONS:
        assert (again / name).read_text() == (synth / name).read_text()
    a, _ = load_video(synth / "videos" / "video5.mp4", 4, 32)
    b, _ = load_video(again / "videos" / "video5.mp4", 4, 32)
    assert torch.equal(a, b)
    other = make_synthetic(tmp_path / "other", num_train=2, num_test=0, size=32, seed=4,
                           fps=8, seconds=1.0, num_workers=1)
    assert (other / "MSRVTT_data.json").read_text() != (synth / "MSRVTT_data.json").read_text()


def test_all_test_captions_gives_multi_caption_evaluation(tmp_path):
    root = make_synthetic(tmp_path, num_train=1, num_test=3, size=32, seed=0, fps=4,
                          seconds=1.0, test_captions="all", num_workers=1)
    test = load_split("synthetic", root, "test")
    assert test.multi_caption is True and test.num_captions >= 9


def test_training_dataset_runs_on_it(synth):
    split = load_split("synthetic", synth, "train")
    ds = TrainDataset(split, lambda texts: torch.ones(len(texts), 4, dtype=torch.long), 12, 32)
    item = ds[0]
    assert item["frames"].shape == (12, 3, 32, 32) and item["frame_mask"].all()
    assert item["skipped"] == 0


def centroid(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


@pytest.mark.parametrize("motion,axis,sign", [("left", 0, -1), ("right", 0, 1), ("up", 1, -1),
                                               ("down", 1, 1)])
def test_motions_move_the_object(motion, axis, sign):
    x = {"left": 0.7, "right": 0.3}.get(motion, 0.5)
    y = {"up": 0.7, "down": 0.3}.get(motion, 0.5)
    obj = SceneObject("red", "square", motion, x, y)
    frames = render_clip([obj], 6, 64, 64, (0, 0, 0), 0.0, seed=0)
    paths = np.array([centroid(f[..., 0] > 128)[axis] for f in frames])
    assert np.all(sign * np.diff(paths) > 0)
    assert abs(paths[-1] - paths[0]) > 0.4 * 64  # a clear move: most of half the frame


@pytest.mark.parametrize("motion,sign", [("growing", 1), ("shrinking", -1), ("still", 0)])
def test_size_changes(motion, sign):
    obj = SceneObject("blue", "circle", motion, 0.5, 0.5)
    frames = render_clip([obj], 5, 64, 64, (0, 0, 0), 0.0, seed=0)
    areas = np.array([(f[..., 2] > 128).sum() for f in frames])
    assert np.all(np.sign(np.diff(areas)) == sign)
    # Large: a still object covers about a tenth of the frame (diameter 0.3 of the side).
    if motion == "still":
        assert 0.05 < areas[0] / 64**2 < 0.12


def test_colours_survive_encoding(tmp_path):
    root = make_synthetic(tmp_path, num_train=6, num_test=0, size=64, seed=1, fps=4,
                          seconds=1.0, num_workers=1)
    meta = json.loads((root / "synthetic_meta.json").read_text())
    checked = 0
    for vid, entry in meta.items():
        objects = [SceneObject(**o) for o in entry["objects"]]
        rendered = render_clip(objects, entry["num_frames"], 64, 64,
                               tuple(entry["background"]), 0.0, seed=0)[0]
        frames, _ = load_video(root / "videos" / f"{vid}.mp4", 4, 64)
        decoded = frames[0].permute(1, 2, 0).numpy().astype(int)
        # Pixels well inside the last-drawn object keep its colour after yuv420p encoding.
        last = objects[-1]
        inside = np.all(rendered == COLOURS[last.colour], axis=-1)
        core = inside & np.roll(inside, 2, 0) & np.roll(inside, -2, 0) & np.roll(
            inside, 2, 1) & np.roll(inside, -2, 1)
        if core.sum() < 10:
            continue
        error = np.abs(decoded[core].mean(0) - np.array(COLOURS[last.colour]))
        assert error.max() < 30, (vid, last.colour, error)
        checked += 1
    assert checked >= 3


def test_scene_and_captions_are_well_formed():
    rng = np.random.default_rng(0)
    for _ in range(50):
        objects = sample_scene(rng)
        assert 1 <= len(objects) <= 3
        assert len({o.colour for o in objects}) == len(objects)
        captions = caption_scene(objects, rng, 5)
        # One object allows only 4 wordings; more objects always reach the 5 asked for.
        assert len(set(captions)) == len(captions) == (5 if len(objects) > 1 else 4)
        assert all(f"{o.colour} {o.shape}" in captions[0] for o in objects)
    assert caption_scene([SceneObject("orange", "circle", "left", 0.7, 0.5)],
                         np.random.default_rng(0), 1) == ["an orange circle moves left"]
