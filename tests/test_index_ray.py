"""An index built on a real Ray cluster of two nodes on this machine (``ray start --head``, then
``ray start --address`` with its own CPU and resources), against a single-process build: a
clean build with bad files among the good ones and a file whose decoder crashes every time,
an encoder worker SIGKILLed mid-build, and a build killed whole then resumed (on a local
cluster the command starts and stops)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import torch

from dicosa.data.synthetic import make_synthetic
from dicosa.index import VideoIndex
from dicosa.index.check import check_index
from dicosa.index.parallel import PARTS, RAY_PART
from dicosa.model import DiCoSA

from ._ray_cluster import REPO, start_cluster
from ._slow_ray_index import CRASH
from ._system import reason
from ._text_media import write_clip
from ._videos import write_scenes
from .conftest import tiny_config

ray = pytest.importorskip("ray")

CONFIG = str(REPO / "configs" / "synthetic.yaml")
OCR = reason("tesseract", "fonts") is None  # words burnt into a clip, read by Tesseract
NUM_CLIPS = 8
OPTIONS = ["--batch-size", "1", "--shard-size", "1", "--config", CONFIG]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """8 clips, a clip with words burnt in, a long video (three 3-s scenes: streamed and cut
    into segments), and bad files: garbage with a title (indexed text-only), an empty file and
    a text file (skipped)."""
    root = make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=0,
                          num_test=NUM_CLIPS, size=32, seconds=1.0, num_workers=1)
    videos = root / "videos"
    write_scenes(videos / "long.mp4", [(200, 30, 30), (30, 200, 30), (20, 20, 90)],
                 seconds=3.0)
    if OCR:
        write_clip(videos / "sign.mp4", 2.0, size=(160, 96), text=("GATE 42", 0.0, 2.0))
    (videos / "broken.mp4").write_bytes(b"\x00" * 64)
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "notes.mp4").write_text("not a video\n")
    titles = {str((videos / "broken.mp4").resolve()): "a red circle moves left"}
    (root / "titles.json").write_text(json.dumps(titles))
    return videos


@pytest.fixture(scope="module")
def reference(folder, cli_model, tmp_path_factory) -> VideoIndex:
    out = tmp_path_factory.mktemp("single") / "index"
    return VideoIndex.build(cli_model, folder, out, batch_size=1, num_workers=0, progress=False,
                            titles=folder.parent / "titles.json")


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of one CPU each: the encoder actor holds one, so decoding runs on the
    other node, and every build uses both."""
    cluster = start_cluster(1, 1, resources=[{}, {"second_node": 1}])
    yield cluster
    cluster.stop()


def _assert_same_index(index: VideoIndex, reference: VideoIndex, missing: set[str] = frozenset()
                       ) -> None:
    """The same videos once each (but ``missing``), rows (a text-only one too), features to
    float16 rounding, and skipped files."""
    expected = [p for p in reference.paths if p not in missing]
    assert sorted(index.paths) == sorted(expected)
    assert len(set(index.paths)) == len(index.paths)  # no video twice
    mine, theirs = index.store.table.all(), reference.store.table.all()
    theirs = theirs[~theirs["path"].isin(missing)]
    mine, theirs = mine.sort_values(["path", "start"]), theirs.sort_values(["path", "start"])
    columns = ["path", "start", "end", "title", "text_only", "valid_frames"]
    pd.testing.assert_frame_equal(mine[columns].reset_index(drop=True),
                                  theirs[columns].reset_index(drop=True))
    a, b = index.store.gather(mine.index.to_numpy()), reference.store.gather(
        theirs.index.to_numpy())
    torch.testing.assert_close(a.frames, b.frames)  # never bit for bit across processes
    assert torch.equal(a.frame_mask, b.frame_mask)
    assert sorted(s for s in index.skipped if s[0] not in missing) == sorted(reference.skipped)


def _part_paths(out: Path) -> list[str]:
    """The videos the Ray part's manifest lists (the job's record of finished shards)."""
    manifest = out / PARTS / RAY_PART / "manifest.json"
    if not manifest.is_file():
        return []
    with contextlib.suppress(json.JSONDecodeError, OSError):  # read while being replaced
        part = VideoIndex.load(out / PARTS / RAY_PART, None, verify=False)
        return part.paths
    return []


def _command(folder: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "tests/_slow_ray_index.py", "index", str(folder), "--out", str(out),
            "--engine", "ray", "--titles", str(folder.parent / "titles.json"), *OPTIONS,
            *extra]


def _run(command: list[str], env: dict, delay: float = 0.0, log: Path | None = None
         ) -> subprocess.Popen:
    env = dict(env, DICOSA_TEST_ENCODE_DELAY=str(delay),
               DICOSA_TEST_ENCODE_LOG=str(log or ""))
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _wait_for_shards(out: Path, proc: subprocess.Popen, count: int) -> list[str]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        linked = _part_paths(out)
        if len(linked) >= count:
            return linked
        time.sleep(0.05)
    raise AssertionError(f"no {count} shard(s) linked before the build ended: "
                         f"{proc.communicate()[1][-3000:]}")


def _finish(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def test_a_two_node_build_equals_the_single_process_build(cluster, folder, cli_model, reference,
                                                          tmp_path, monkeypatch):
    """Bad files are counted as the single process counts them; a file whose decoder
    crashes on every try is listed as unreadable, and the build goes on."""
    from dicosa.index.ray_build import _FAILED, RaySettings, build_index_on_ray
    from dicosa.plugins.text import TextPlugin
    from dicosa.text.ray_reads import ray_reads

    from ._slow_ray_index import runtime_env

    crash = folder.parent / "crash" / f"{CRASH}.mp4"
    crash.parent.mkdir()
    crash.write_bytes((folder / "video0.mp4").read_bytes())
    out = tmp_path / "index"
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    ray.init(address=cluster.address, runtime_env=runtime_env(), log_to_driver=False)
    try:  # a process already connected to Ray builds on that cluster
        report = build_index_on_ray(
            cli_model, [*sorted(map(str, folder.iterdir())), str(crash)], out,
            ray_settings=RaySettings(tries=1), batch_size=2, shard_size=3, progress=False,
            titles=folder.parent / "titles.json")
        if OCR:  # on-screen text read by a reader actor, written here
            with report.index.writing():
                text = report.index.use(TextPlugin(subtitles=False, ocr=True, ocr_frames=1,
                                                   reads=ray_reads(ray, readers=1)))
    finally:
        ray.shutdown()
    if OCR:
        sign = report.index.store.table.all().query("path.str.endswith('sign.mp4')").index
        assert "GATE 42" in " ".join(line["text"] for line in text.lines(int(sign[0])))
        screen = text.reports["screen"]
        assert (screen.videos, screen.found) == (len(report.index), 1)
        held = text.index.held(text.settings.engines())  # every row has its record
        assert set(report.index.store.live().tolist()) <= set(np.asarray(held).tolist())
    assert report.nodes == 2 and report.encoders == 1
    assert report.index.text_only == reference.text_only  # the titled broken file
    assert report.retried == 1  # the crashing file, run again alone
    index = VideoIndex.load(out, cli_model)
    assert (str(crash.resolve()), _FAILED) in index.skipped
    index.skipped.remove((str(crash.resolve()), _FAILED))
    _assert_same_index(index, reference)
    assert report.encoded == len(reference)
    assert all(s.name.startswith(f"{PARTS}/{RAY_PART}/shard-") for s in index.store.shards)
    assert check_index(out).ok
    files = {p.name for p in (out / PARTS / RAY_PART).glob("shard-*")}
    assert files == {f"{s.name.rsplit('/', 1)[1]}.{ext}" for s in index.store.shards
                     for ext in ("safetensors", "csv")}  # no file the manifest does not name
    hits = index.search("a red circle moves left", k=3, candidates=4)
    assert len(hits) == 3
    # Nothing left to do: no cluster is needed and nothing is encoded.
    again = build_index_on_ray(cli_model, folder, out, progress=False)
    assert again.encoded == 0 and sorted(again.index.paths) == sorted(index.paths)


def test_a_worker_killed_mid_build_costs_only_its_unfinished_work(cluster, folder, cli_model,
                                                                 reference, tmp_path):
    """The command line's build, with on-screen text read in the same job; the encoder
    actor is SIGKILLed once the first shard is linked."""
    out = tmp_path / "index"
    ocr = ["--ocr", "--ocr-frames", "1"] if OCR else []  # read on the cluster
    proc = _run(_command(folder, out, "--ray-address", cluster.address, *ocr), cluster.env,
                delay=0.3)
    try:
        linked = _wait_for_shards(out, proc, 1)
        encoders = cluster.workers("ray::MapWorker")
        assert len(encoders) == 1, [p.cmdline()[0] for p in cluster.workers()]
        encoders[0].send_signal(signal.SIGKILL)  # the encoder actor, model and all
        stdout = _finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert len(linked) < len(reference), "the build finished before the worker was killed"
    assert encoders[0].pid not in {p.pid for p in cluster.workers("ray::MapWorker")}
    assert f"indexed {len(reference)} videos" in stdout and "on Ray: 2 node(s)" in stdout
    assert "indexed from its title alone (undecodable)" in stdout
    if ocr:
        assert f"screen (tesseract): 1 of {len(reference)} videos with screen" in stdout
    index = VideoIndex.load(out, cli_model)
    _assert_same_index(index, reference)
    assert check_index(out).ok
    assert len(index.search("a blue square", k=2, candidates=4)) == 2


def test_a_killed_build_resumes_without_encoding_a_finished_video(cluster, folder, cli_model,
                                                                  reference, tmp_path):
    """The driver is SIGKILLed mid-build; the same command, on a local cluster of its own
    this time, encodes only the videos no linked shard holds."""
    out, log = tmp_path / "index", tmp_path / "encoded.txt"
    proc = _run(_command(folder, out, "--ray-address", cluster.address), cluster.env,
                delay=0.3)
    try:
        _wait_for_shards(out, proc, 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    kept = _part_paths(out)  # what the killed job recorded as finished
    assert 2 <= len(kept) < len(reference)

    before = _local_clusters()
    stdout = _finish(_run(_command(folder, out), dict(cluster.env, RAY_ADDRESS=""), log=log))
    again = set(log.read_text().split())
    assert not again & set(kept)  # no finished video encoded again
    found = re.search(r"encoded (\d+) now on Ray: 1 node", stdout)
    assert found and int(found.group(1)) == len(reference) - len(kept), stdout
    assert _local_clusters() == before  # the command's own cluster is gone
    _assert_same_index(VideoIndex.load(out, cli_model), reference)


def _local_clusters() -> set[int]:
    """Processes of local clusters dicosa started (their folder's name says so)."""
    found = set()
    for process in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if "dicosa-ray-" in line:
            found.add(process.info["pid"])
    return found


def test_ray_options_are_checked_before_anything_runs(folder, tmp_path):
    done = subprocess.run([sys.executable, "-m", "dicosa", "index", str(folder), "--out",
                           str(tmp_path / "index"), "--engine", "ray", "--num-workers", "2",
                           "--config", CONFIG], cwd=REPO, text=True, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode != 0 and "--ray-decode-cpus" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cpu_encoder_takes_its_nodes_cores_not_the_one_thread_ray_gives_it():
    """Ray starts a one-CPU actor with OMP_NUM_THREADS=1; the encoder, sharing the node's
    cores with the decoders as a single process does, sets torch's threads itself."""
    from dicosa.index.ray_work import EncodeVideos

    model = DiCoSA.from_config(tiny_config()).eval()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as Ray leaves it
        EncodeVideos(model, None, None, batch_size=1)
        assert torch.get_num_threads() == (os.cpu_count() or 1)
        EncodeVideos(model, None, None, batch_size=1, threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
