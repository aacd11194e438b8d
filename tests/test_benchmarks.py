"""Every benchmark script runs once, tiny and on the CPU, and writes its JSON result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPTS = ["train_step.py", "score.py", "data.py", "train_epoch.py", "ablation.py",
           "first_stage.py", "exclusion.py", "mul2vec.py", "search.py", "lexical.py",
           "summary_head.py", "sparse.py", "serve.py", "moments.py", "search_long.py",
           "ingest_long.py", "text_sources.py"]


@pytest.mark.parametrize("script", [*SCRIPTS, "search.py --summary distilled --quality-videos 0",
                                    "search.py --summary frames --quality-videos 0",
                                    "search.py --frame-dtype int8 --text-tower packed",
                                    "serve.py --frame-dtype int8 --text-tower packed --workers 2 "
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
