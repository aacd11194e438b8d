"""Every benchmark script runs once, tiny and on the CPU, and writes its JSON result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# train_epoch.py's smoke runs inside gpu_session.sh's (test below).
SCRIPTS = ["train_step.py", "score.py", "data.py", "ablation.py",
           "first_stage.py", "exclusion.py", "mul2vec.py", "search.py", "lexical.py",
           "summary_head.py", "sparse.py", "serve.py", "moments.py", "search_long.py",
           "ingest_long.py", "ingest_ray.py", "text_sources.py", "media.py", "cuts.py",
           "ocr.py"]


@pytest.mark.parametrize("script", [*SCRIPTS, "search.py --summary distilled --quality-videos 0",
                                    "search.py --summary frames --quality-videos 0",
                                    "search.py --frame-dtype int8 --text-tower packed",
                                    "free_first_stage.py --work renders",
                                    "serve.py --frame-dtype int8 --text-tower packed --rankers 0 "
                                    "--query-cache 16 --profile"])
def test_benchmark_smoke(script, tmp_path):
    script, *extra = script.split()
    path = ROOT / "benchmarks" / script
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(path), "--smoke", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result and all(v == v for v in result.values() if isinstance(v, float))  # no NaN


def test_serve_benchmark_serves_long_videos_as_segments(tmp_path):
    """``serve.py --hours``: a collection of long videos, each cut into segments (rows), served
    by rankers; every search answers k videos."""
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve.py"), "--smoke",
                           "--hours", "0.25", "--rankers", "2", "--timeline-rows", "3",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (size,) = json.loads(out.read_text())["sizes"]
    (run,) = size["runs"]
    assert size["hours"] == 0.25 and run["rankers"] == 2 and run["timeline_rows"] == 3
    assert run["indexed_videos"] == 15  # a quarter hour of 1-minute videos
    assert size["rows"] > 5 * run["indexed_videos"]  # shots of ~6 s, segments of <= 4 frames
    assert run["concurrent"]["requests"] > 0 and run["concurrent"]["errors"] == 0
    assert run["concurrent"]["timeline_rows_max"] == 3  # the rankers' timelines: 3 rows each


def test_gpu_session_runs_the_steps_it_is_given(tmp_path):
    """``gpu_session.sh OUT --smoke train_epoch``: the environment check and that one step,
    each with its line in summary.txt and its JSON; the steps not named do not run."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_SITE": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), str(out),
                           "--smoke", "train_epoch"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["env", "train_epoch"]
    assert all(": exit 0 after" in line for line in lines), lines
    result = json.loads((out / "train_epoch.json").read_text())
    assert result["benchmark"] == "train_epoch" and result["clips_per_s"] > 0
    assert not (out / "serve.json").exists()
