"""Real faults: damaged files on every entry point, a full disk, a process killed mid-write."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from dicosa.checkpoint import CheckpointError, load, load_checkpoint, save_checkpoint
from dicosa.config import config_from_dict
from dicosa.data.synthetic import make_synthetic
from dicosa.model import DiCoSA

from ._launch import exec_with
from .conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=4, num_test=12,
                          size=32, seconds=1.0, num_workers=1)


@pytest.fixture(scope="module")
def checkpoint(root, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    cfg = config_from_dict({"model": dataclasses.asdict(tiny_config()),
                            "data": {"dataset": "synthetic", "root": str(root),
                                     "num_workers": 0},
                            "eval": {"batch_size": 2}})
    path = tmp_path_factory.mktemp("run") / "best.pt"
    save_checkpoint(path, {"model": model.state_dict(), "config": cfg.to_yaml(), "step": 1})
    return path


def _damaged(kind: str, checkpoint: Path, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.pt"
    data = bytearray(checkpoint.read_bytes())
    if kind == "text":
        path.write_text("these are my notes, not a checkpoint\n")
    elif kind == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif kind == "flipped":
        # The tiny model's 14 MB of weights fill the middle of the file: torch.load alone
        # returns the damaged weights without complaint.
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif kind == "state-dict":
        torch.save(torch.load(checkpoint, weights_only=True)["model"], path)
    elif kind == "other-version":
        state = torch.load(checkpoint, weights_only=True)
        state.pop("sha256")
        torch.save(dict(state, format=7), path)
    return path


EXPECTED = {
    "text": "is not a checkpoint: not a PyTorch file",
    "truncated": "is truncated or corrupted",
    "flipped": "is corrupted: its contents no longer match the sha256",
    "state-dict": "is a bare state dict",
    "other-version": "was written in checkpoint format 7; this dicosa reads format 1",
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_damaged_checkpoints_are_one_sentence_in_python(kind, checkpoint, tmp_path):
    path = _damaged(kind, checkpoint, tmp_path)
    with pytest.raises(CheckpointError) as exc:
        load(path)
    message = str(exc.value)
    assert EXPECTED[kind] in message and str(path) in message and "\n" not in message
    # No library exception chained behind it (its stack is what the sentence replaces).
    assert exc.value.__cause__ is None
    assert exc.value.__context__ is None or exc.value.__suppress_context__


def _run(*args: str, max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, *args]
    if max_file_bytes is not None:
        command = exec_with(command, max_file_bytes=max_file_bytes)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.mark.parametrize(("kind", "command"), [("text", "evaluate"), ("truncated", "index")])
def test_damaged_checkpoints_are_one_sentence_on_the_command_line(kind, command, checkpoint,
                                                                  root, tmp_path):
    path = _damaged(kind, checkpoint, tmp_path)
    if command == "evaluate":
        proc = _run("evaluate.py", "--dataset", "synthetic", "--checkpoint", str(path),
                    f"data.root={root}")
    else:
        proc = _run("-m", "dicosa", "index", str(root / "videos"), "--out",
                    str(tmp_path / "index"), "--checkpoint", str(path))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and EXPECTED[kind] in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


_FILL_THEN_LIMIT = textwrap.dedent("""
    import resource, sys, torch
    from dicosa.checkpoint import NoSpaceError, save_checkpoint
    path = sys.argv[1]
    save_checkpoint(path, {"model": {"w": torch.ones(10)}, "config": "", "step": 1})
    # From here on no file of this process may grow beyond 64 KiB (ulimit -f).
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
    try:
        save_checkpoint(path, {"model": {"w": torch.zeros(1 << 20)}, "config": "", "step": 2})
    except NoSpaceError as exc:
        print(exc)
        sys.exit(3)
""")


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_no_space(tmp_path):
    path = tmp_path / "last.pt"
    proc = _run("-c", _FILL_THEN_LIMIT, str(path))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"no space left to write {path}")
    assert "the previous file is intact" in proc.stdout
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(10))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


def test_training_into_a_full_disk_stops_with_one_sentence(root, tmp_path):
    cfg = config_from_dict({"model": dataclasses.asdict(tiny_config()),
                            "data": {"dataset": "synthetic", "root": str(root),
                                     "val_fraction": 0, "num_workers": 0},
                            "train": {"batch_size": 2, "epochs": 1, "max_steps": 1,
                                      "output_dir": str(tmp_path / "run")}})
    config = tmp_path / "cfg.yaml"
    config.write_text(cfg.to_yaml())

    # 1 MiB: the log and config fit, the 40 MB checkpoint does not
    proc = _run("train.py", "--config", str(config), max_file_bytes=1 << 20)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("train.py: error: no space left to write"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "run").glob("*.pt")) and not list((tmp_path / "run").glob(".*"))


def test_killed_feature_caching_never_leaves_a_usable_half_entry(checkpoint, root, tmp_path):
    """SIGKILL evaluate.py while it encodes (texts cached, videos under way), then run it
    again: the results equal a clean run's and no partial file is ever read."""
    cache = tmp_path / "cache"
    args = ("evaluate.py", "--dataset", "synthetic", "--checkpoint", str(checkpoint),
            f"data.root={root}", f"eval.cache_dir={cache}")
    proc = subprocess.Popen([sys.executable, *args, "--out", str(tmp_path / "killed.json")],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if list(cache.glob("text-*.pt")):  # texts are cached before videos are encoded
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "evaluate.py finished before it was killed"
    assert not list(cache.glob("video-*.pt"))
    # What a kill in the middle of writing leaves: a temporary file of a dead process.
    orphan = cache / f".{'video-test-0123456789abcdef0123'}.pt.tmp-{proc.pid}"
    orphan.write_bytes(b"PK\x03\x04 half an entry")

    again = _run(*args, "--out", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr[-2000:]
    clean = _run("evaluate.py", "--dataset", "synthetic", "--checkpoint", str(checkpoint),
                 f"data.root={root}", f"eval.cache_dir={tmp_path / 'clean'}",
                 "--out", str(tmp_path / "clean.json"))
    assert clean.returncode == 0, clean.stderr[-2000:]
    metrics = [json.loads((tmp_path / f"{n}.json").read_text())["metrics"]
               for n in ("again", "clean")]
    assert metrics[0] == metrics[1]
    assert not orphan.exists() and not list(cache.glob(".*.tmp-*"))

    # A cache entry damaged after it was written is detected, reported and recomputed.
    entry = next(cache.glob("video-*.pt"))
    entry.write_bytes(entry.read_bytes()[:100])
    damaged = _run(*args, "--out", str(tmp_path / "damaged.json"))
    assert damaged.returncode == 0 and "ignoring unreadable feature cache" in damaged.stderr
    assert json.loads((tmp_path / "damaged.json").read_text())["metrics"] == metrics[1]


def test_checkpoint_of_another_model_names_the_difference(checkpoint):
    other = dataclasses.replace(tiny_config(), num_frames=6)
    with pytest.raises(ValueError, match=r"temporal\.position: checkpoint \(4, 64\) vs model"):
        load(checkpoint, model_config=other)
