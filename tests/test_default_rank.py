"""Issue 25 end to end: train.py on the synthetic config leaves a checkpoint that carries its
first-stage summary, and the index a user builds with no summary option ranks like DiCoSA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from dicosa.checkpoint import load
from dicosa.data.synthetic import caption_scene, make_synthetic, render_clip, sample_scene
from dicosa.data.video import sample_indices
from dicosa.heads.summary import default_summary
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.training import read_log

REPO = Path(__file__).resolve().parents[1]
HELD_OUT = 300


def held_out_clips(model: DiCoSA, count: int, seed: int = 5):
    """``count`` new scenes of the synthetic generator (seed ``seed``: none is a training
    clip), rendered straight to frames, encoded by ``model``; and one caption each."""
    num, size = model.config.num_frames, model.image_size
    pick = sample_indices(8, num, False)
    frames = np.zeros((count, num, 3, size, size), np.uint8)
    captions = []
    for j in range(count):
        rng = np.random.default_rng([seed, j])
        scene = sample_scene(rng)
        clip = render_clip(scene, 8, size, size, (0, 0, 0), 0.0, int(rng.integers(2**31)))
        captions.append(caption_scene(scene, rng, 1)[0])
        frames[j] = clip[pick].transpose(0, 3, 1, 2)
    with torch.inference_mode():
        video = model.encode_video(torch.from_numpy(frames))
    return VideoFeatures(video.frames.half(), video.frame_mask), captions


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script", REPO / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_trained_checkpoint_searches_like_dicosa_with_no_summary_option(tmp_path):
    root = make_synthetic(tmp_path / "data", num_train=120, num_test=0, size=32, seconds=1.0,
                          num_workers=1)
    run = tmp_path / "run"
    # The summary fitted on the training videos alone, 600 steps (~15 s): the default fit
    # with cut videos takes minutes here; cut videos are tested in test_summary_head.py.
    _train_script().main(["--config", str(REPO / "configs" / "synthetic.yaml"),
                          f"data.root={root}", f"train.output_dir={run}", "train.epochs=3",
                          "train.summary_options=[cuts_per_video=0, steps=600]"])
    fitted = [r for r in read_log(run / "log.jsonl", event=None) if r["event"] == "summary"]
    assert len(fitted) == 1 and Path(fitted[0]["path"]) == run / "best.summary.pt"
    assert fitted[0]["videos"] == 108  # the training videos, not the 12 that chose best.pt

    model, _ = load(run / "best.pt")
    summary, notice = default_summary(run / "best.pt", model)  # what index does by default
    assert summary["summary"] == "distilled" and "distilled summary fitted with" in notice
    index = VideoIndex(model, device="cpu", **summary)
    video, captions = held_out_clips(model, HELD_OUT)
    index.add_features(video, [{"path": f"held-out/{i}"} for i in range(HELD_OUT)])
    queries = captions[:100]
    exhaustive = index.search(queries, k=10, candidates=None)
    two_stage = index.search(queries, k=10, candidates=HELD_OUT // 10)
    recall = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10
                      for a, b in zip(two_stage, exhaustive, strict=True)])
    print(f"\nrecall@10 vs exhaustive at C={HELD_OUT // 10} of {HELD_OUT}: {recall:.3f}")
    # Seen 0.946-0.949 run alone and 0.894 inside a full suite on a loaded machine (the model
    # trains on whatever thread count the process has); C=30 of 300 at random would keep 0.1.
    assert recall >= 0.85
