"""End to end on CPU: generate the synthetic benchmark, train.py, then evaluate.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    subprocess.run([sys.executable, str(REPO / "train.py"), "--dataset", "synthetic", *common],
                   check=True, env=env, cwd=tmp_path)
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
