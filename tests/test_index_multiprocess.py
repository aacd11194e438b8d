"""A multi-process index build (torchrun, 2 gloo CPU processes) against a single-process one,
and a multi-process build killed mid-way then relaunched."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import torch

from dicosa.data.protocol import PAD_COLOURS, FrameProtocol
from dicosa.data.synthetic import make_synthetic
from dicosa.data.video import load_video
from dicosa.index import VideoIndex
from dicosa.index.parallel import PARTS, Launch, _block, build_index
from dicosa.loading import load_model

from ._index import stored
from ._ranks import free_port
from ._videos import write_scenes, write_video
from .conftest import spy_encoder

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "synthetic.yaml")
NUM_VIDEOS = 10
# One video per batch and per shard: every process writes several shards, in batches of the
# size the single-process reference uses.
OPTIONS = ["--num-workers", "0", "--batch-size", "1", "--shard-size", "1", "--config", CONFIG]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=0,
                          num_test=NUM_VIDEOS, size=32, seconds=1.0, num_workers=1)
    (root / "videos" / "broken.mp4").write_bytes(b"\x00" * 64)
    return root / "videos"


@pytest.fixture(scope="module")
def model():
    return load_model(None, CONFIG)[0]  # the model the command line builds (seeded)


@pytest.fixture(scope="module")
def reference(folder, model, tmp_path_factory) -> VideoIndex:
    out = tmp_path_factory.mktemp("single") / "index"
    return VideoIndex.build(model, folder, out, batch_size=1, num_workers=0, progress=False)



def _launch(folder: Path, out: Path, *extra: str, processes: int = 2,
            script: str | None = None, delay: float = 0.0) -> subprocess.Popen:
    """``torchrun -m dicosa index`` (or ``script``) with ``processes`` CPU processes."""
    target = [script] if script else ["-m", "dicosa"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               DICOSA_TEST_ENCODE_DELAY=str(delay))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
               str(processes), "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               *target, "index", str(folder), "--out", str(out), *OPTIONS, *extra]
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _kill_launch(pid: int) -> None:
    """SIGKILL torchrun and its workers. The workers run in sessions of their own (torchrun
    starts them so), so killing the launcher's process group would leave them running."""
    launcher = psutil.Process(pid)
    for process in [*launcher.children(recursive=True), launcher]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)


def _finish(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def _encoded(stdout: str) -> int:
    found = re.search(r"encoded (\d+) now, in (\d+) process", stdout)
    assert found, stdout
    return int(found.group(1))


def _assert_same_index(index: VideoIndex, reference: VideoIndex) -> None:
    assert sorted(index.paths) == sorted(reference.paths)
    assert len(set(index.paths)) == len(index.paths)  # no video twice
    order = [index.paths.index(p) for p in reference.paths]
    mine = stored(index)
    # Equal to float16 rounding: never bit for bit across process counts.
    torch.testing.assert_close(mine.frames[order], stored(reference).frames)
    assert torch.equal(mine.frame_mask[order], stored(reference).frame_mask)
    assert index.skipped == reference.skipped


def _written(out: Path) -> dict[str, bytes]:
    """The shard files the part manifests list (what a killed build must keep), by name."""
    found = {}
    for manifest in (out / PARTS).glob("rank-*/manifest.json"):
        for shard in json.loads(manifest.read_text())["shards"]:
            path = manifest.parent / f"{shard['name']}.safetensors"
            found[str(path.relative_to(out))] = path.read_bytes()
    return found


@pytest.mark.paths
def test_two_processes_build_the_single_process_index(folder, model, reference, tmp_path):
    out = tmp_path / "index"
    stdout = _finish(_launch(folder, out, script="tests/_slow_index.py"))  # no delay
    assert _encoded(stdout) == NUM_VIDEOS and "in 2 process(es)" in stdout
    # Both processes closed the process group (left open, gloo can abort at exit: seen on CI).
    assert stdout.count("process group open after the command: False") == 2
    assert "skipped 1 unreadable file(s)" in stdout and "broken.mp4" in stdout

    index = VideoIndex.load(out, model)
    _assert_same_index(index, reference)
    assert index.paths == reference.paths  # contiguous blocks keep the sorted order
    manifest = json.loads((out / "manifest.json").read_text())
    names = [s["name"] for s in manifest["shards"]]
    assert {n.split("/")[1] for n in names} == {"rank-0", "rank-1"}  # both processes wrote
    assert [s["first_id"] for s in manifest["shards"]] == list(range(NUM_VIDEOS))
    assert manifest["first_stage"]["synced"] == [NUM_VIDEOS, 0]  # built over every row
    hits = index.search("a red circle moves left", k=3, candidates=4)
    assert len(hits) == 3 and {h.stage for h in hits} == {"dense"}

    # Another model: the main process says so in one sentence, the other one stays quiet.
    other = _launch(folder, out, "--set", "train.seed=1")
    stdout, stderr = other.communicate(timeout=300)
    assert other.returncode != 0
    assert stderr.count("error: the index at") == 1 and "different weights" in stderr


@pytest.mark.paths
def test_a_killed_two_process_build_resumes(folder, model, reference, tmp_path):
    out = tmp_path / "index"
    proc = _launch(folder, out, script="tests/_slow_index.py", delay=0.25)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not _written(out):
            time.sleep(0.01)
        _kill_launch(proc.pid)
    finally:
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it was killed"
    kept = _written(out)
    assert 0 < len(kept) < NUM_VIDEOS
    # The main process wrote the empty index when it started; nothing was merged into it.
    assert json.loads((out / "manifest.json").read_text())["shards"] == []

    stdout = _finish(_launch(folder, out))  # the same command again
    assert _encoded(stdout) == NUM_VIDEOS - len(kept)  # what was written is not re-encoded
    assert {name: (out / name).read_bytes() for name in kept} == kept  # nor rewritten
    _assert_same_index(VideoIndex.load(out, model), reference)


def test_a_relaunch_with_another_process_count_takes_over_the_parts(folder, model, reference,
                                                                    tmp_path):
    """A single process finishes what a killed two-process build left: rank 1's shards,
    never merged, are linked; only the videos no part holds are encoded."""
    out = tmp_path / "index"
    videos = sorted(str(p.resolve()) for p in folder.glob("video*.mp4"))
    part = VideoIndex.create_or_resume(model, out / PARTS / "rank-1", backend=None)
    part.add(videos[5:8], batch_size=1, num_workers=0, shard_size=1, progress=False)

    report = build_index(model, folder, out, batch_size=1, num_workers=0, progress=False)
    assert report.processes == 1 and report.encoded == NUM_VIDEOS - 3  # rank 1 held 3
    assert len(report.index.skipped) == 1
    _assert_same_index(VideoIndex.load(out, model), reference)
    # A relaunch after the merge links nothing new and encodes only the unreadable file again.
    again = build_index(model, folder, out, batch_size=1, num_workers=0, progress=False)
    assert again.encoded == 0 and again.index.paths == report.index.paths


def test_a_merge_that_links_a_runs_shard_first_keeps_the_rows_n_frames_wide(model, tmp_path):
    """A long video of 3-s scenes: its runs shard's rows hold 3 frames of the model's N = 4.
    Linked into an empty index, the index still gathers rows of N slots (padding after)."""
    long = write_scenes(tmp_path / "long.mp4", [(200, 30, 30), (30, 200, 30)], seconds=3.0)
    out = tmp_path / "index"
    part = VideoIndex.create_or_resume(model, out / PARTS / "rank-0", backend=None)
    part.add([long], num_workers=0, progress=False)
    index = build_index(model, [long], out, num_workers=0, progress=False).index
    frames = index.store.gather(index.store.live())  # one row per scene
    assert index.store.num_frames == model.config.num_frames == frames.frames.shape[1] == 4
    assert frames.frame_mask.sum(1).tolist() == [3, 3]
    assert VideoIndex.load(out, model).store.num_frames == 4


def test_a_file_changed_since_a_merge_is_encoded_again_and_replaces_its_rows(model, tmp_path):
    clips = [write_video(tmp_path / "clips" / f"{name}.mp4", 30, fps=10) for name in "ab"]
    out = tmp_path / "index"
    part = VideoIndex.create_or_resume(model, out / PARTS / "rank-1", backend=None)
    part.add(clips[1:], num_workers=0, progress=False)  # a part: the merging path
    options = {"batch_size": 1, "num_workers": 0, "progress": False}
    assert build_index(model, clips, out, **options).encoded == 1
    before = VideoIndex.load(out, model).store.table.all()
    write_video(clips[0], 20, fps=10)  # another size: changed
    report = build_index(model, clips, out, **options)
    assert report.encoded == 1  # the changed file alone
    index = VideoIndex.load(out, model)
    table = index.store.table.all()
    assert sorted(index.paths) == sorted(str(c.resolve()) for c in clips)  # one row each
    assert table.loc[table["path"].str.endswith("a.mp4"), "num_frames"].item() == 20
    assert len(before) == len(table) == 2 and index.store.next_id == 3  # the old id is gone


@dataclass
class _Pretend(Launch):
    """One process of a launch, run here in turn with the others and without a process
    group: the main process's broadcast waits in ``box`` for the others; a gather returns only
    this process's own value."""

    box: list = field(default_factory=list)

    def broadcast(self, value: object) -> object:
        if self.is_main:
            self.box[:] = [value]
        return self.box[0]

    def gather(self, value: object) -> list:
        return [value]


def test_every_process_decodes_with_the_index_frame_protocol(model, tmp_path, monkeypatch):
    """Resumed with no protocol asked for, every process of a launch decodes with the one
    the index recorded, and a part recorded with another one is refused."""
    clips = [write_video(tmp_path / "clips" / f"{name}.mp4", 30, fps=10) for name in "abc"]
    out, released = tmp_path / "index", FrameProtocol("released", "mean")
    VideoIndex.create_or_resume(model, out, frame_sampling="released", frame_padding="mean")
    seen = spy_encoder(model, monkeypatch)
    options = {"batch_size": 1, "num_workers": 0, "progress": False}
    box: list = []
    for rank in (0, 1):  # the main process, which merges what it has, then the other one
        build_index(model, clips[:2], out, launch=_Pretend(rank, 2, box=box), **options)
        part = json.loads((out / PARTS / f"rank-{rank}" / "manifest.json").read_text())
        assert part["frames"] == released.as_dict()
    index = build_index(model, clips[:2], out, **options).index  # links rank 1's part
    assert index.frames == released and len(index) == 2
    for clip, (frames, mask) in zip(clips[:2], seen, strict=True):  # a by rank 0, b by 1
        expected, expected_mask = load_video(clip, 4, model.image_size, sampling="released",
                                             pad_colour=PAD_COLOURS["mean"])
        assert torch.equal(frames[0], expected) and torch.equal(mask[0], expected_mask)

    other = VideoIndex.create_or_resume(model, out / PARTS / "rank-2", backend=None)
    other.add(clips[2:], **options)  # segments/black, the default
    with pytest.raises(ValueError, match=r"rank-2 decodes videos with frame sampling "
                                         r"'segments' and padding 'black'"):
        build_index(model, clips, out, **options)


def test_blocks_cover_the_list_once():
    items = [str(i) for i in range(11)]
    for size in (1, 2, 3, 4, 11, 12):
        blocks = [_block(items, rank, size) for rank in range(size)]
        assert [i for block in blocks for i in block] == items
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
