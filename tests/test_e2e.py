"""End to end on CPU: generate the synthetic benchmark, train.py, evaluate.py, then search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dicosa import VideoIndex, load
from dicosa.data.datasets import load_split
from dicosa.data.synthetic import make_synthetic
from dicosa.training import read_log

REPO = Path(__file__).resolve().parents[1]
NUM_TEST = 100


@pytest.mark.slow
def test_training_learns_the_synthetic_benchmark(tmp_path):
    start = time.perf_counter()
    root = make_synthetic(tmp_path / "data", num_train=300, num_test=NUM_TEST, size=32,
                          seconds=1.0, fps=8)
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    common = [f"data.root={root}", f"train.output_dir={run}"]
    # --no-summary: the first-stage summary train.py fits by default is checked by
    # test_default_rank.py; every query here reranks all 100 clips, so it would go unused.
    subprocess.run([sys.executable, str(REPO / "train.py"), "--dataset", "synthetic",
                    "--no-summary", *common], check=True, env=env, cwd=tmp_path)
    trained = time.perf_counter()
    out = tmp_path / "eval.json"
    subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--dataset", "synthetic",
                    "--checkpoint", str(run / "best.pt"), "--out", str(out), *common],
                   check=True, env=env, cwd=tmp_path)

    results = json.loads(out.read_text())
    steps = read_log(run / "log.jsonl")
    t2v = results["metrics"]["raw"]["t2v"]
    print(f"\ne2e: {steps[-1]['step']} steps, loss {steps[0]['loss']:.2f} -> "
          f"{steps[-1]['loss']:.2f}, test t2v R@1 {t2v['R@1']:.1f}% (chance {100 / NUM_TEST}%),"
          f" train {trained - start:.0f} s, total {time.perf_counter() - start:.0f} s")
    assert results["num_videos"] == NUM_TEST and results["selected_on"] == "val"
    assert t2v["R@1"] >= 5 * 100 / NUM_TEST

    # The same trained model searching the held-out clips through VideoIndex (issue 6):
    # fp16 features, the full DiCoSA score, one query per held-out caption.
    model, cfg = load(run / "best.pt")
    test = load_split("synthetic", root, cfg.data.test_split)
    index = VideoIndex.build(model, [str(p) for p in test.video_paths], tmp_path / "index",
                             progress=False)
    first = top5 = 0
    for caption, video in zip(test.captions, test.caption_video, strict=True):
        hits = [Path(hit.path).name for hit in index.search(caption, k=5)]
        first += hits[0] == test.video_paths[video].name
        top5 += test.video_paths[video].name in hits
    print(f"index search: right clip first for {first}/{NUM_TEST}, in the top 5 for {top5}")
    assert top5 > NUM_TEST // 2  # most queries find their clip among 5 of 100
    assert abs(100 * first / NUM_TEST - t2v["R@1"]) <= 3  # search agrees with evaluate.py
