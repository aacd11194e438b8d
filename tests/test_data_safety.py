"""The index keeps its data like a database: one writer at a time, transactions, integrity.

Real processes (two ``index`` commands at once, a ``search`` recording while ``index`` adds,
a process SIGKILLed at each write point), real damaged files, and a disk that fills at each
write point in turn (the ``DICOSA_FAIL_AT_WRITE`` fault point: the test may not run as root on
a tmpfs of its own).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dicosa.__main__ import main
from dicosa.data.synthetic import make_synthetic
from dicosa.files import StorageError
from dicosa.index import ManifestError, VideoIndex
from dicosa.index.check import check_index
from dicosa.loading import load_model
from dicosa.model import TextFeatures
from dicosa.plugins.titles import TitlesPlugin
from dicosa.search.store import StoreError
from dicosa.search.types import EncodedQueries

from ._index import encoded, stored

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "synthetic.yaml")
FAST = ["--num-workers", "0", "--batch-size", "2", "--shard-size", "2", "--config", CONFIG]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, list[Path]]:
    """Two folders of 6 generated clips each."""
    root = make_synthetic(tmp_path_factory.mktemp("clips"), num_train=0, num_test=12, size=32,
                          seconds=0.5, num_workers=1)
    folders = {}
    for name, part in (("a", range(0, 6)), ("b", range(6, 12))):
        folder = root / name
        folder.mkdir()
        for i in part:
            shutil.copy(root / "videos" / f"video{i}.mp4", folder / f"video{i}.mp4")
        folders[name] = sorted(folder.glob("*.mp4"))
    return folders


@pytest.fixture(scope="module")
def model():
    return load_model(None, CONFIG)[0]  # what the command line builds (seeded)


def _cli(*args: str, delay: float = 0.0, env: dict | None = None) -> subprocess.Popen:
    """``dicosa ...`` in its own process; ``delay`` slows each encoded batch."""
    script = [str(REPO / "tests" / "_slow_index.py")] if delay else ["-m", "dicosa"]
    environ = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
                   DICOSA_TEST_ENCODE_DELAY=str(delay), **(env or {}))
    return subprocess.Popen([sys.executable, *script, *args], cwd=REPO, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _paths(folder) -> list[str]:
    return [str(Path(p).resolve()) for p in folder]


def _assert_consistent(out: Path, model, expected: list[str]) -> VideoIndex:
    """Every expected video exactly once, ids unique, and every first stage holds exactly the
    live rows (a stage describing another writer's rows would break recall)."""
    index = VideoIndex.load(out, model)
    assert sorted(index.paths) == sorted(expected)
    assert len(set(index.ids.tolist())) == len(index)
    asked = encoded(index, ["a red circle"])
    summary = TextFeatures(index.stages.summary().queries(asked.text.text))
    for registered in index.stages.all():
        if registered.stage.name == "text":  # proposes only rows whose lines match: it must
            text = index.plugins["text"]  # have read every live row, and hold no other
            assert text.index.held(text.settings.engines()).tolist() == index.ids.tolist()
            assert text.index.rows().tolist() == index.ids.tolist()
            continue
        queries = (EncodedQueries(asked.queries, summary, asked.extra) if registered.dense
                   else asked)
        found = registered.stage.search(queries, len(index) + 5).ids[0]
        assert set(found[found >= 0].tolist()) == set(index.ids.tolist())
    assert check_index(out).ok
    return index


@pytest.mark.slow
def test_two_index_processes_never_lose_videos(clips, model, tmp_path):
    """Two `index` runs on one folder, each adding its own videos, started together, three
    times: both finish, and every video of both is in the index exactly once."""
    for trial in range(3):
        out = tmp_path / f"index{trial}"
        first = _cli("index", str(clips["a"][0].parent), "--out", str(out), *FAST, delay=0.2)
        second = _cli("index", str(clips["b"][0].parent), "--out", str(out), *FAST, delay=0.2)
        for process in (first, second):
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err
        _assert_consistent(out, model, _paths(clips["a"] + clips["b"]))


def test_no_wait_fails_in_one_sentence_and_adds_nothing(clips, model, tmp_path, capsys):
    """While another process holds the writer lock (this test's, a real flock), `index
    --no-wait` fails in one sentence naming the holder and adds nothing; without --no-wait it
    waits and then adds."""
    out = tmp_path / "index"
    assert main(["index", str(clips["a"][0].parent), "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    from dicosa.index.lock import WriterLock

    with WriterLock(out):
        second = _cli("index", str(clips["b"][0].parent), "--out", str(out), *FAST,
                      "--no-wait")
        _, err = second.communicate(timeout=300)
        assert second.returncode == 2, err
        last = err.strip().splitlines()[-1]  # after the log line that it resumes the index
        assert last.startswith("error: the index at") and "being written by process" in last
        assert "Traceback" not in err
        waiting = _cli("index", str(clips["b"][0].parent), "--out", str(out), *FAST)
        while "waiting for" not in (line := waiting.stderr.readline()):
            assert line, "the waiting writer never said it waits"
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    _assert_consistent(out, model, _paths(clips["a"] + clips["b"]))


@pytest.mark.slow
def test_search_recording_while_index_adds_loses_nothing(clips, model, tmp_path):
    """`search --fusion` records a setting while `index` adds: the manifest keeps every video
    (it was rewritten from the state the search opened), and the record is kept or the search
    says it is not."""
    out = tmp_path / "index"
    assert main(["index", str(clips["a"][0].parent), "--out", str(out), *FAST]) == 0
    adding = _cli("index", str(clips["b"][0].parent), "--out", str(out), *FAST, delay=0.5)
    while _owner(out) != adding.pid:  # the index process holds the lock: it is adding
        assert adding.poll() is None
    search = _cli("search", str(out), "a red circle", "--fusion")
    _, said = search.communicate(timeout=300)
    assert search.returncode == 0, said
    _, err = adding.communicate(timeout=300)
    assert adding.returncode == 0, err
    index = _assert_consistent(out, model, _paths(clips["a"] + clips["b"]))
    assert ("fusion" in index.meta) != ("not recorded" in said)


def _owner(out: Path) -> int | None:
    try:
        return json.loads((out / ".writer.json").read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _committed_shards(out: Path) -> list:
    try:
        return json.loads((out / "manifest.json").read_text())["shards"]
    except (FileNotFoundError, ValueError, KeyError):
        return []


def _counted_writes(tmp_path: Path, action) -> list[str]:
    """The labels (file names) of the write points ``action()`` meets, in order
    (DICOSA_FAULT_LOG): write point n is ``labels[n - 1]``."""
    log = tmp_path / "writes.log"
    with _environ(DICOSA_FAULT_LOG=str(log)):
        action()
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def _kind(label: str) -> str:
    """A write point's kind: its file name with shard numbers dropped."""
    return re.sub(r"\d+", "N", label)


def _sampled_points(labels: list[str]) -> list[int]:
    """The write points (1-based) a fault sweep visits: the first point of each kind (the
    opening manifest write, the reserved ids, a shard's frames and table, each first stage's
    files, ...), the first shard write after a shard was committed (a fault between two
    committed shards), and the last point (the closing commit). Every kind of write, and
    every kind of state a fault can leave behind, is visited once; the points in between
    repeat a kind already visited in the same state, and are left out to keep the sweep short.
    """
    first = {}
    for n, label in enumerate(labels, 1):
        first.setdefault(_kind(label), n)
    shards = [n for n, label in enumerate(labels, 1) if label.startswith("shard-")]
    commits = [n for n, label in enumerate(labels, 1)
               if label == "manifest.json" and shards and n > shards[0]]
    between = [n for n in shards if commits and n > commits[0]]  # after a committed shard
    return sorted({*first.values(), *between[:1], len(labels)})


class _environ:
    def __init__(self, **values: str):
        self.values = values

    def __enter__(self):
        os.environ.pop("_DICOSA_WRITES", None)
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for key in (*self.values, "_DICOSA_WRITES"):
            os.environ.pop(key, None)


@pytest.fixture(scope="module")
def built(model, clips, tmp_path_factory) -> Path:
    """An index of the clips of folder "a" (exact first stage, shards of 2), built once."""
    folder = tmp_path_factory.mktemp("built") / "index"
    VideoIndex.build(model, clips["a"], folder, batch_size=2, shard_size=2, num_workers=0,
                     progress=False, backend="exact")
    return folder


@pytest.fixture
def copy_built(built):
    """A copy of ``built`` at ``folder``, for a test to change: ``copy_built(folder)``."""
    return lambda folder: Path(shutil.copytree(built, folder))


def test_full_disk_at_each_write_point_of_add(model, clips, copy_built, tmp_path):
    """ENOSPC at the n-th write of an add, for a sample of n covering every kind of write
    (_sampled_points): one sentence; the folder reopens with exactly a committed state; the
    same object then adds correctly."""
    base = copy_built(tmp_path / "base")

    def add_b(folder: Path):
        return VideoIndex.load(folder, model).add(clips["b"][:4], batch_size=2, shard_size=2,
                                                  num_workers=0, progress=False)

    shutil.copytree(base, tmp_path / "count")
    labels = _counted_writes(tmp_path, lambda: add_b(tmp_path / "count"))
    points = _sampled_points(labels)
    assert {_kind(labels[n - 1]) for n in points} >= {  # every kind of write an add makes
        "manifest.json", "reserved.json", "shard-N.safetensors", "shard-N.csv",
        "dense.exact.npz", "first_stage.json"}
    assert points[-1] == len(labels) >= 8 and len(points) < len(labels)
    everything = _paths(clips["a"] + clips["b"][:4])
    for n in points:
        folder = shutil.copytree(base, tmp_path / f"fail{n}")
        index = VideoIndex.load(folder, model)
        with _environ(DICOSA_FAIL_AT_WRITE=str(n)), pytest.raises(StorageError) as failed:
            index.add(clips["b"][:4], batch_size=2, shard_size=2, num_workers=0,
                      progress=False)
        assert "disk is full" in str(failed.value) and "\n" not in str(failed.value)
        committed = VideoIndex.load(folder, model)
        assert set(committed.paths) <= set(everything)
        assert len(set(committed.paths)) == len(committed) >= len(clips["a"])
        assert sorted(index.paths) == sorted(committed.paths)  # the object: the last commit
        index.add(clips["b"][:4], batch_size=2, shard_size=2, num_workers=0, progress=False)
        _assert_consistent(folder, model, everything)


def _killed_child(folder: Path, model, action: str, n: int, clips) -> int:
    """Run ``action`` on the index in a forked process that SIGKILLs itself at write n."""
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_act, args=(folder, model, action, n, clips))
    child.start()
    child.join(120)
    return child.exitcode


def _act(folder: Path, model, action: str, n: int | None, clips) -> None:
    torch.set_num_threads(1)
    os.environ.pop("_DICOSA_WRITES", None)
    if n is not None:
        os.environ["DICOSA_KILL_AT_WRITE"] = str(n)
    index = VideoIndex.load(folder, model)
    if action == "add":
        index.add(clips["b"][:4], batch_size=2, shard_size=2, num_workers=0, progress=False)
    elif action == "remove":
        index.remove(_paths(clips["a"][:3]))
    else:
        index.use(TitlesPlugin(None, beta_title=0.3))


@pytest.mark.parametrize("action", ["add", "remove", "attach"])
def test_sigkill_at_each_write_point(model, clips, copy_built, tmp_path, action):
    """A process killed at write points of an add, a remove and a plugin's attachment (every
    kind of write, _sampled_points; all of them for a remove and an attachment): the index
    reopens holding the last committed state, and running the operation again
    completes it with no duplicate or missing row."""
    base = copy_built(tmp_path / "base")
    shutil.copytree(base, tmp_path / "count")
    labels = _counted_writes(tmp_path, lambda: _act(tmp_path / "count", model, action, None,
                                                    clips))
    points = _sampled_points(labels)
    assert {"manifest.json"} <= {labels[n - 1] for n in points} and points[-1] == len(labels)
    everything = _paths(clips["a"] + clips["b"][:4])
    expected = {"add": everything, "remove": _paths(clips["a"][3:]),
                "attach": _paths(clips["a"])}[action]
    for n in points:
        folder = shutil.copytree(base, tmp_path / f"kill{n}")
        assert _killed_child(folder, model, action, n, clips) == -signal.SIGKILL
        reopened = VideoIndex.load(folder, model)
        assert len(set(reopened.paths)) == len(reopened)
        assert set(reopened.paths) <= set(everything)  # a committed state: base or beyond
        assert set(expected) & set(_paths(clips["a"])) <= set(reopened.paths)
        _act(folder, model, action, None, clips)
        index = _assert_consistent(folder, model, expected)
        if action == "attach":
            assert index.meta["fusion"]["beta_title"] == 0.3


def _row_frames(index: VideoIndex, row_id: int) -> tuple[Path, int, int]:
    """``(shard file, first byte, end byte)`` of the float16 frames row ``row_id`` reads (a
    ``clips`` shard: the row's [N, D] block; a ``runs`` shard: the frames its segment
    views)."""
    number, rows = index.store.locate(np.array([row_id]))
    shard, row = index.store.shards[int(number[0])], int(rows[0])
    path = index.directory / f"{shard.name}.safetensors"
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(length))["frames"]
    start = 8 + length + info["data_offsets"][0]
    frame_bytes = int(info["shape"][-1]) * 2  # float16
    if hasattr(shard, "segment"):
        first, count = (int(v) for v in shard.segment[row])
    else:
        count = int(info["shape"][1])
        first = row * count
    return path, start + first * frame_bytes, start + (first + count) * frame_bytes


def _corrupt_row(index: VideoIndex, row_id: int) -> None:
    """Overwrite the frames of row ``row_id`` with NaN bytes, in place in its shard file."""
    path, start, end = _row_frames(index, row_id)
    data = bytearray(path.read_bytes())
    data[start:end] = np.full((end - start) // 2, np.nan, dtype=np.float16).tobytes()
    path.write_bytes(bytes(data))


def _flip_byte(index: VideoIndex, row_id: int) -> None:
    """Flip one bit of one byte in the middle of row ``row_id``'s frames, in its shard file."""
    path, start, end = _row_frames(index, row_id)
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_nan_corrupted_row_is_refused_by_checksum_and_never_ranked_first(model, copy_built,
                                                                         tmp_path, caplog):
    folder = copy_built(tmp_path / "index")
    clean = VideoIndex.load(folder, model)
    query = "a red circle moves left"
    last = clean.search(query, k=len(clean), candidates=None)[-1]  # the row to damage
    _corrupt_row(clean, last.id)
    with pytest.raises(StoreError) as refused:
        VideoIndex.load(folder, model)
    assert "does not match its checksum" in str(refused.value)
    damaged = VideoIndex.load(folder, model, verify=False)
    for candidates in (None, 3, len(damaged)):
        hits = damaged.search(query, k=len(damaged), candidates=candidates)
        assert last.id not in {h.id for h in hits}  # a logged skip, never rank 1
        assert all(np.isfinite(h.score) for h in hits)
    assert "whose DiCoSA score is NaN" in caplog.text
    report = check_index(folder)
    assert not report.ok and "fails its own checksum" in report.problems[0]
    repaired = check_index(folder, repair=True)
    assert repaired.repaired and check_index(folder).ok
    # this index records no model (built in Python without meta): the row is only removed
    assert repaired.notes[0].startswith(f"{last.path} was not encoded again: the index "
                                        "records no model")
    after = VideoIndex.load(folder, model)
    assert last.id not in after.ids and last.path not in after.paths


def _generation(folder: Path) -> int:
    return json.loads((folder / "manifest.json").read_text())["generation"]


@pytest.mark.paths  # the video is encoded again in another batch than the first time
def test_one_flipped_byte_costs_its_row_only_and_repair_encodes_it_again(model, clips,
                                                                         tmp_path, capsys):
    """``dicosa index`` (segments, text lines), then one bit flipped in one row of three
    shards: ``check`` names exactly those rows; ``check --repair``, in one commit, encodes
    again the video whose file is there and unchanged, and says why not for the one whose
    file is gone and the one that changed; every other row keeps its id."""
    videos = tmp_path / "videos"
    videos.mkdir()
    for clip in clips["a"]:
        shutil.copy(clip, videos / clip.name)
    folder = tmp_path / "index"
    assert main(["index", str(videos), "--out", str(folder), *FAST]) == 0
    index = VideoIndex.load(folder, model)
    assert len(index.store.shards) == 3  # shards of 2 videos
    ids = {path: int(i) for path, i in zip(index.paths, index.ids, strict=True)}
    kept, gone, changed = (sorted(ids)[i] for i in (0, 2, 4))  # one per shard
    clean = index.store.gather(np.array([ids[kept]]), torch.float32).frames
    for path in (kept, gone, changed):
        _flip_byte(index, ids[path])
    capsys.readouterr()
    assert main(["check", str(folder)]) == 1
    said = capsys.readouterr().out
    problems = [line for line in said.splitlines() if line.startswith("problem: ")]
    assert [p.split("shard-")[1][:5] for p in problems] == ["00000", "00001", "00002"]
    for line, path in zip(problems, (kept, gone, changed), strict=True):
        assert f"its row {ids[path]} fails its own checksum ({path})" in line
        assert line.endswith("'dicosa check --repair' encodes them again from their videos")
    assert "does not hold" not in said and said.strip().endswith("3 problem(s) left")
    with pytest.raises(StoreError, match=rf"its row {ids[kept]} fails its own checksum"):
        VideoIndex.load(folder, model)
    Path(gone).unlink()
    os.utime(changed, (1e9, 1e9))
    generation = _generation(folder)
    assert main(["check", str(folder), "--repair"]) == 0
    said = capsys.readouterr().out
    assert f"repaired: 1 video(s) encoded again from their files ({kept})" in said
    assert f"note: {gone} was not encoded again: the file is gone" in said
    assert (f"note: {changed} was not encoded again: the file changed since it was indexed "
            "(size or modification time)") in said
    assert _generation(folder) == generation + 1  # one transaction
    expected = [p for p in ids if p not in (gone, changed)]
    after = _assert_consistent(folder, model, expected)  # stages, text lines, check ok
    again = dict(zip(after.paths, after.ids.tolist(), strict=True))
    assert again[kept] >= index.store.next_id  # a new row; ids are never reused
    assert all(again[p] == ids[p] for p in expected if p != kept)
    torch.testing.assert_close(after.store.gather(np.array([again[kept]]), torch.float32)
                               .frames, clean, atol=2e-3, rtol=1e-2)


def _without_row_checksums(folder: Path, shard: str) -> None:
    """Rewrite ``shard``'s file as dicosa wrote it before per-video checksums, and its
    sha256 in the manifest."""
    import hashlib

    from safetensors.numpy import load_file, save

    path = folder / f"{shard}.safetensors"
    tensors = load_file(str(path))
    del tensors["video_crc32"]
    data = save(tensors)
    path.write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["shards"]:
        if entry["name"] == shard:
            entry["sha256"]["safetensors"] = hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_shard_written_before_row_checksums_is_checked_and_repaired_whole(model, clips,
                                                                           tmp_path):
    """Clips (one row per video): a flipped byte costs its row in a shard with per-video
    checksums, the whole shard in one written before them; repair encodes all of them
    again from their files."""
    folder = tmp_path / "index"
    VideoIndex.build(model, clips["a"][:4], folder, shard_size=2, batch_size=2,
                     num_workers=0, progress=False, segments=False, backend="exact")
    _without_row_checksums(folder, "shard-00001")
    index = VideoIndex.load(folder, model)
    assert index.store.shards[1].video_crc is None and index.store.shards[0].video_crc.size
    _flip_byte(index, 1)
    _flip_byte(index, 2)
    report = check_index(folder)
    assert len(report.problems) == 2
    assert "its row 1 fails its own checksum" in report.problems[0]
    assert "does not match its checksum (rows 2, 3: the whole shard)" in report.problems[1]
    repaired = check_index(folder, repair=True, model=model)  # it records no model itself
    assert repaired.ok and "3 video(s) encoded again" in repaired.repaired[-1]
    after = _assert_consistent(folder, model, _paths(clips["a"][:4]))
    assert after.ids.tolist() == [0, 4, 5, 6]


def test_non_finite_features_are_refused_at_write_time(model, tmp_path):
    from dicosa.model import VideoFeatures

    index = VideoIndex(model)
    frames = torch.zeros(2, model.config.num_frames, model.embed_dim, dtype=torch.float16)
    frames[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite features"):
        index.add_features(VideoFeatures(frames, torch.ones(2, model.config.num_frames,
                                                            dtype=torch.bool)),
                           [{"path": "/a.mp4"}, {"path": "/b.mp4"}])
    assert len(index) == 0


# -- honest inputs: one sentence each ---------------------------------------------------------
def test_a_long_query_is_flagged_as_truncated(model, copy_built, tmp_path, capsys):
    folder = copy_built(tmp_path / "index")
    index = VideoIndex.load(folder, model)
    words = " ".join(["red circle"] * model.config.max_words)
    assert index.query(words, k=2).truncated and not index.query("a red circle", k=2).truncated
    assert main(["search", str(folder), words, "--config", CONFIG, "-k", "2"]) == 0
    assert "longer than the" in capsys.readouterr().out


def test_a_replaced_video_is_encoded_again(model, clips, tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    for clip in clips["a"][:3]:
        shutil.copy(clip, videos / clip.name)
    index = VideoIndex.build(model, videos, tmp_path / "index", num_workers=0, progress=False)
    before = stored(index).frames.clone()
    target = videos / clips["a"][0].name
    shutil.copy(clips["b"][0], target)  # another clip at the same path
    os.utime(target, (1e9, 1e9))
    assert index.add(videos, num_workers=0, progress=False) == 1
    assert sorted(index.paths) == sorted(_paths(videos.glob("*.mp4")))  # still one row each
    row = index.paths.index(str(target.resolve()))
    assert not torch.equal(stored(index).frames[row], before[0])
    assert index.add(videos, num_workers=0, progress=False) == 0  # unchanged: nothing


def test_resume_options_that_cannot_apply_and_a_missing_folder(model, clips, tmp_path,
                                                              capsys):
    folder = tmp_path / "index"
    assert main(["index", str(clips["a"][0].parent), "--out", str(folder), *FAST]) == 0
    capsys.readouterr()
    for option in (["--backend", "exact"], ["--stage-option", "index=ivfpq"]):
        assert main(["index", str(clips["a"][0].parent), "--out", str(folder), *FAST,
                     *option]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: the index at") and "another first stage" in err
        assert "\n" not in err
    assert main(["index", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x"), *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"error: {tmp_path / 'nowhere'} does not exist: give a " \
                                   "folder of videos or a video file"
    assert not captured.out and not (tmp_path / "x").exists()  # said first, nothing left
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VideoIndex.build(model, tmp_path / "nowhere", tmp_path / "y", progress=False)
    assert not (tmp_path / "y").exists()


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EROFS", "EACCES"])
def test_filesystem_errors_are_one_sentence(model, clips, tmp_path, capsys, monkeypatch,
                                            errno_name):
    import errno

    import dicosa.files as files

    code = getattr(errno, errno_name)
    monkeypatch.setattr(files.os, "replace", _raising(code))
    folder = tmp_path / "index"
    assert main(["index", str(clips["a"][0].parent), "--out", str(folder), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and str(folder) in err
    assert {"ENOSPC": "disk is full", "EROFS": "read-only", "EACCES": "permission"}[
        errno_name] in err


def _raising(code: int):
    def replace(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return replace


def test_damaged_derived_files_are_rebuilt_and_damaged_manifests_are_sentences(
        model, clips, tmp_path, caplog):
    folder = tmp_path / "index"
    VideoIndex.build(model, clips["a"], folder, num_workers=0, progress=False)
    reference = VideoIndex.load(folder, model).search("a red circle", k=3)
    for name in ("frames/dense.pending.npz", "frames/dense.removed.npy", "frames/frames.npz"):
        path = folder / name
        path.write_bytes(path.read_bytes()[:10])  # truncated
        index = VideoIndex.load(folder, model)
        assert [h.id for h in index.search("a red circle", k=3)] == [h.id for h in reference]
        assert "rebuilding the dense first stage" in caplog.text
        index.save(folder)  # the rebuilt stage is written back
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["fingerprint"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="lacks 'fingerprint': it is damaged"):
        VideoIndex.load(folder)
    empty = tmp_path / "empty"
    VideoIndex.build(model, clips["a"][:2], empty, num_workers=0, progress=False)
    (empty / "shard-00000.csv").write_text("")
    with pytest.raises(StoreError, match=r"shard-00000\.csv is damaged"):
        VideoIndex.load(empty, model, verify=False).paths  # noqa: B018


def test_damaged_concept_codes_are_computed_again(tmp_path, caplog):
    from dicosa.search.row_cache import RowCache

    cache = RowCache(tmp_path, "concepts.codes", "head-1", 3)
    cache.extend(4, np.arange(4), lambda ids: np.ones((len(ids), 3), np.float32))
    path = tmp_path / "concepts.codes.npy"
    path.write_bytes(path.read_bytes()[:20])
    again = RowCache(tmp_path, "concepts.codes", "head-1", 3)
    assert len(again.array) == 0 and "is damaged" in caplog.text


def _as_written_before_checksums(folder: Path) -> None:
    """Rewrite an index folder as dicosa wrote it before commits were counted, shards
    checksummed, ids reserved and files stamped: the format every existing index has."""
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["generation"]
    for shard in manifest["shards"]:
        del shard["sha256"]
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (folder / "reserved.json").unlink()
    for table in folder.glob("shard-*.csv"):
        lines = table.read_text().splitlines()
        columns = lines[0].split(",")
        keep = [i for i, c in enumerate(columns) if c not in ("size", "mtime")]
        table.write_text("\n".join(",".join(line.split(",")[i] for i in keep)
                                   for line in lines) + "\n")


def test_an_index_in_the_earlier_format_opens_searches_and_grows(model, clips, copy_built,
                                                                 tmp_path):
    folder = copy_built(tmp_path / "index")
    reference = VideoIndex.load(folder, model).search("a red circle", k=4)
    _as_written_before_checksums(folder)
    old = VideoIndex.load(folder, model)
    assert [(h.id, h.score) for h in old.search("a red circle", k=4)] == [
        (h.id, h.score) for h in reference]
    assert old.add(clips["a"], num_workers=0, progress=False) == 0  # unknown stamps: kept
    old.add(clips["b"][:2], num_workers=0, progress=False)
    _assert_consistent(folder, model, _paths(clips["a"] + clips["b"][:2]))
