"""The long-video synthetic benchmark: its cut times against the decoder's own frame times and
the frames' content, the clips, and the scenes kept out of the training data."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import av
import numpy as np
import pytest

from dicosa.data.long_synthetic import (
    Scene,
    draw_scene,
    load_long_synthetic,
    make_long_synthetic,
    replay_synthetic_scene_keys,
    scene_key,
    synthetic_scene_keys,
)
from dicosa.data.synthetic import make_synthetic

SIZE, FPS = 32, 8
SCRIPT = Path(__file__).resolve().parents[1] / "data_prep" / "make_long_synthetic.py"


def make_long_main(argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("make_long_synthetic", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    # Scene lengths drawn per scene, so the cuts fall off any regular grid.
    return make_long_synthetic(tmp_path_factory.mktemp("long"), num_videos=2,
                               scenes_per_video=3, scene_seconds=(1.0, 2.5), size=SIZE,
                               fps=FPS, seed=5, num_workers=1)


def decode(path) -> list[tuple[float, np.ndarray]]:
    """(the decoder's frame time in seconds, int RGB frame) of every frame of ``path``."""
    with av.open(str(path)) as container:
        return [(float(f.time), f.to_ndarray(format="rgb24").astype(int))
                for f in container.decode(video=0)]


def test_cut_times_match_the_decoded_frames_times_and_content(bench):
    moments = json.loads((bench / "moments.json").read_text())
    meta = json.loads((bench / "long_meta.json").read_text())
    assert len(moments) == 6 and sorted(meta["videos"]) == ["long0", "long1"]
    for video, entry in meta["videos"].items():
        ranges = [(m["start"], m["end"]) for m in moments if m["video"] == video]
        assert ranges == [(s["start"], s["end"]) for s in entry["scenes"]]
        assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        renders = [Scene.from_record(s).render(SIZE, SIZE).astype(int) for s in entry["scenes"]]
        frames = decode(bench / "videos" / f"{video}.mp4")
        assert len(frames) == sum(len(r) for r in renders)
        assert frames[-1][0] < ranges[-1][1] <= frames[-1][0] + 1 / FPS + 1e-9
        for i, (t, image) in enumerate(frames):
            assert t == pytest.approx(i / FPS, abs=1e-6)
            # The scene the annotation puts at time t is the scene on screen.
            j = next(j for j, (start, end) in enumerate(ranges) if start <= t < end)
            local = round((t - ranges[j][0]) * FPS)
            errors = [np.abs(image - r[min(local, len(r) - 1)]).mean() for r in renders]
            assert errors[j] < 12, (video, i, errors)
            assert min(e for k, e in enumerate(errors) if k != j) > 2 * errors[j] + 5


def test_clips_hold_the_same_frames_as_their_range(bench):
    split = load_long_synthetic(bench)
    clips = load_long_synthetic(bench, as_clips=True)
    assert clips.captions == split.captions and clips.num_queries == 6
    long_frames = {v: decode(p) for v, p in zip(split.video_ids, split.video_paths, strict=True)}
    for q, (video, ((start, end),)) in enumerate(split.truths()):
        clip_id, ((c_start, c_end),) = clips.truths()[q]
        assert (c_start, c_end) == (0.0, end - start)
        assert clips.durations[clips.video_ids.index(clip_id)] == end - start
        clip = decode(bench / "clips" / f"{clip_id}.mp4")
        inside = [img for t, img in long_frames[video] if start <= t < end]
        assert len(clip) == len(inside) == round((end - start) * FPS)
        for (_, a), b in zip(clip, inside, strict=True):
            assert np.abs(a - b).mean() < 6  # two encodes of the same rendered frame
    meta = json.loads((bench / "long_meta.json").read_text())
    assert split.video_paths[0].name == "long0.mp4"
    assert split.durations == [meta["videos"][v]["duration"] for v in split.video_ids]


def test_scenes_are_new_and_captions_name_one_scene(bench):
    meta = json.loads((bench / "long_meta.json").read_text())
    keys = [scene_key(s["objects"]) for v in meta["videos"].values() for s in v["scenes"]]
    training = replay_synthetic_scene_keys(0, 400)
    assert not set(keys) & training
    assert meta["exclude"]["num_scene_keys"] == len(training)
    for a in range(len(keys)):  # no scene's objects include another's
        for b in range(len(keys)):
            assert a == b or not keys[a] <= keys[b]
    for m, key in zip(json.loads((bench / "moments.json").read_text()), keys, strict=True):
        assert all(f"{c} {s}" in m["caption"] for c, s, _ in key)  # every object named


def test_replayed_training_scenes_are_make_synthetic_s(tmp_path):
    root = make_synthetic(tmp_path, num_train=5, num_test=2, size=16, seed=7, fps=4,
                          seconds=0.5, num_workers=1)
    assert synthetic_scene_keys(root) == replay_synthetic_scene_keys(7, 7)
    long = make_long_synthetic(tmp_path / "long", num_videos=1, scenes_per_video=2,
                               exclude_root=root, num_workers=1)
    meta = json.loads((long / "long_meta.json").read_text())
    assert meta["exclude"] == {"source": str(root), "num_scene_keys": 7}


def test_a_training_scene_is_redrawn_and_counted():
    first = scene_key(draw_scene(np.random.default_rng(1), 8, set(), [], {}).objects)
    rejected: dict[str, int] = {}
    again = draw_scene(np.random.default_rng(1), 8, {first}, [], rejected)
    assert scene_key(again.objects) != first and rejected == {"training": 1}
    with pytest.raises(ValueError, match="no new scene found in 50 draws"):
        draw_scene(np.random.default_rng(1), 8, set(), [frozenset()], {}, max_tries=50)


def test_script_writes_the_default_3_s_scenes(tmp_path, capsys):
    make_long_main([str(tmp_path), "--videos", "1", "--scenes", "2", "--workers", "1"])
    assert "wrote 1 videos of 2 scenes" in capsys.readouterr().out
    moments = json.loads((tmp_path / "moments.json").read_text())
    assert [(m["start"], m["end"], m["clip"]) for m in moments] == [
        (0.0, 3.0, "scene0_0"), (3.0, 6.0, "scene0_1")]
    assert len(decode(tmp_path / "videos" / "long0.mp4")) == 48
    assert decode(tmp_path / "clips" / "scene0_1.mp4")[0][1].shape == (32, 32, 3)
    with pytest.raises(SystemExit):
        make_long_main([str(tmp_path / "x"), "--exclude", str(tmp_path / "nothing")])
