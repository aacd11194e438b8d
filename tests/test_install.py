"""dicosa as a user installs it: a wheel built from this checkout, installed (not editable)
into a folder of its own, runs ``index`` and ``search`` from an unrelated working directory
with its shipped random-weight config. The checkout is not on the path there, so a config
read from the repository rather than from the package data fails here."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._videos import write_video

REPO = Path(__file__).resolve().parents[1]
# What a wheel is built from (the build writes build/ and *.egg-info beside them, so it runs
# on a copy, never in the checkout).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "dicosa", "configs")


def _run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{args[:3]} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding dicosa installed from a wheel of this checkout."""
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    for name in SOURCES:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(item, source / name)
    pip = ("-m", "pip", "--disable-pip-version-check")
    _run(*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(work / "wheels"), str(source), cwd=work)
    (wheel,) = (work / "wheels").glob("dicosa-*.whl")
    _run(*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(work / "site"),
         str(wheel), cwd=work)
    return work / "site"


def test_wheel_ships_every_config(site):
    shipped = sorted(p.name for p in (site / "dicosa" / "configs").glob("*.yaml"))
    assert shipped == sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    assert (site / "dicosa" / "model_configs" / "dicosa-tiny.json").is_file()


def test_installed_copy_indexes_and_searches_from_anywhere(site, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    for i in range(3):
        write_video(elsewhere / "videos" / f"clip{i}.mp4", num_frames=8 + 4 * i)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}

    # the dicosa that `python -m dicosa` runs there (found, not imported: no torch to load)
    origin = _run("-c", "import importlib.util; print(importlib.util.find_spec('dicosa').origin)",
                  cwd=elsewhere, env=env).stdout.strip()
    assert Path(origin).resolve() == (site / "dicosa" / "__init__.py").resolve()

    done = _run("-m", "dicosa", "index", "videos", "--out", "idx", "--config", "synthetic",
                cwd=elsewhere, env=env)
    assert "indexed 3 videos" in done.stdout
    # the model's config came from the installed package data
    manifest = json.loads((elsewhere / "idx" / "manifest.json").read_text())
    shipped = site / "dicosa" / "configs" / "synthetic.yaml"
    assert manifest["meta"]["model"]["config"] == str(shipped)
    found = _run("-m", "dicosa", "search", "idx", "a red square", cwd=elsewhere, env=env)
    rows = [line.split() for line in found.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert sorted(Path(row[-1]).name for row in rows) == ["clip0.mp4", "clip1.mp4", "clip2.mp4"]


def test_errors_module_imports_nothing_of_dicosa():
    """Catching USER_ERRORS must not load the model, training or search code."""
    tree = ast.parse((REPO / "dicosa" / "errors.py").read_text())
    imported = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    relative = [node.module for node in imported
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    named = [alias.name for node in imported if isinstance(node, ast.Import)
             for alias in node.names]
    named += [node.module for node in imported
              if isinstance(node, ast.ImportFrom) and node.level == 0]
    assert relative == [] and not [name for name in named if name.startswith("dicosa")]


@pytest.mark.parametrize(("module", "name"), [
    ("dicosa.config", "ConfigError"), ("dicosa.checkpoint", "CheckpointError"),
    ("dicosa.checkpoint", "NoSpaceError"), ("dicosa.clip", "PretrainedWeightsError"),
    ("dicosa.convert", "ConversionError"), ("dicosa.data.datasets", "AnnotationError"),
    ("dicosa.data.video", "VideoDecodeError"), ("dicosa.heads.base", "HeadMismatchError"),
    ("dicosa.training", "NonFiniteLossError"),
])
def test_error_classes_keep_their_old_homes(module, name):
    import importlib

    import dicosa.errors

    assert getattr(importlib.import_module(module), name) is getattr(dicosa.errors, name)
