"""dicosa as a user installs it.

A wheel built from this checkout, installed (not editable) into a folder of its own, runs
``index`` and ``search`` from an unrelated working directory with its shipped random-weight
config: the checkout is not on the path there, so a config read from the repository rather
than from the package data fails here. And ``pip install .`` into a fresh virtual
environment that already has torch and the other dependencies (this environment's, dicosa's
own files left out) installs dicosa alone, with no index to download from: the torch there
is kept, and the ``dicosa`` console script answers ``--help`` and ``--version``."""

from __future__ import annotations

import ast
import email
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from ._videos import write_video

REPO = Path(__file__).resolve().parents[1]
# What a wheel is built from (the build writes build/ and *.egg-info beside them, so it runs
# on a copy, never in the checkout).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "dicosa", "configs")


def _run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{args[:3]} failed:\n{done.stdout}\n{done.stderr}"
    return done


PIP = ("-m", "pip", "--disable-pip-version-check")


def _copy_sources(to: Path) -> Path:
    for name in SOURCES:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, to / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, to / name)
    return to


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from this checkout."""
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(work / "source")
    _run(*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(work / "wheels"), str(source), cwd=work)
    (built,) = (work / "wheels").glob("dicosa-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """A folder holding dicosa installed from a wheel of this checkout."""
    work = tmp_path_factory.mktemp("install")
    _run(*PIP, "install", "-q", "--no-deps", "--no-index", "--target", str(work / "site"),
         str(wheel), cwd=work)
    return work / "site"


def test_wheel_carries_the_licence_the_types_marker_and_one_version(wheel):
    import dicosa

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = email.message_from_bytes(archive.read(next(
            n for n in names if n.endswith(".dist-info/METADATA"))))
        entry_points = archive.read(next(
            n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "dicosa/py.typed" in names
    licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert licence and "MIT License" in zipfile.ZipFile(wheel).read(licence[0]).decode()
    assert meta["Version"] == dicosa.__version__ and meta["License-Expression"] == "MIT"
    assert "dicosa = dicosa.cli:main" in entry_points
    requires = meta.get_all("Requires-Dist")
    # decord only where it has wheels; test tools only in the dev extra
    assert any(r.startswith("decord") and "platform_machine" in r and "extra" not in r
               for r in requires)
    for tool in ("pytest", "selenium", "httpx", "milvus==", "setuptools"):
        assert all("extra == \"dev\"" in r for r in requires if r.startswith(tool)), tool


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


def _without_dicosa(into: Path) -> Path:
    """``into`` holding links to everything installed here but dicosa itself: the
    dependencies a user's environment already has."""
    into.mkdir()
    sources = [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    for folder in sources:
        for item in folder.iterdir():
            name = item.name.lower()
            if (name.startswith(("dicosa", "__editable__", "_dicosa")) or name.endswith(".pth")
                    or name == "__pycache__" or (into / item.name).exists()):
                continue
            (into / item.name).symlink_to(item)
    return into


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> tuple[Path, str]:
    """A new virtual environment with torch and the rest already there, then
    ``pip install .`` of this checkout (no index: nothing may be downloaded); returns its
    folder and pip's output."""
    work = tmp_path_factory.mktemp("fresh")
    env = work / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    inner = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (Path(inner) / "_present.pth").write_text(str(_without_dicosa(work / "present")) + "\n")
    source = _copy_sources(work / "source")
    done = subprocess.run([str(python), *PIP, "install", "--no-index", "--no-build-isolation",
                           str(source)], cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env, done.stdout


def test_pip_install_keeps_the_installed_torch_and_adds_the_command(fresh, tmp_path):
    env, said = fresh
    installed = [line for line in said.splitlines() if line.startswith("Successfully installed")]
    assert installed and installed[0].split()[2:] == [f"dicosa-{_version()}"]
    command = env / "bin" / "dicosa"
    help_text = subprocess.run([str(command), "--help"], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    for name in ("index", "search", "serve", "train", "evaluate", "demo"):
        assert name in help_text.stdout
    version = subprocess.run([str(command), "--version"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert version.stdout.strip() == f"dicosa {_version()}"
    # the command line imports no torch to answer: measured there, not timed (a shared CI
    # machine's clock says little), as the modules it loaded
    loaded = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sys, dicosa.cli as c; c.build_parser(); "
         "print(c.__file__); print(sorted(m for m in ('torch', 'open_clip', 'fastapi') "
         "if m in sys.modules))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    where, heavy = loaded.stdout.splitlines()
    assert Path(where).is_relative_to(env) and heavy == "[]"


def _version() -> str:
    import dicosa

    return dicosa.__version__
