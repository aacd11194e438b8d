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
                                    "--query-cache 16 --profile", "serve.py --rankers 2"])
def test_benchmark_smoke(script, tmp_path):
    script, *extra = script.split()
    path = ROOT / "benchmarks" / script
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(path), "--smoke", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result and all(v == v for v in result.values() if isinstance(v, float))  # no NaN
