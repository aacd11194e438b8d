"""The frame store: memory-mapped shards, ids and tombstones, old indexes, damaged files."""

import json
import mmap
import os

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save as save_safetensors

from dicosa.functional import video_proxy
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.search.shards import populate_shards, uncached
from dicosa.search.store import COLUMNS, ROW_COLUMNS, FrameStore, StoreError

from ._index import exhaustive_scores
from .conftest import tiny_config


def _video(count, num=8, dim=1024, seed=0) -> VideoFeatures:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(count, num, dtype=torch.bool)
    mask[::2, num - 3:] = False
    return VideoFeatures(torch.randn(count, num, dim, generator=g).half(), mask)


def _rows(start, count):
    return [{"path": f"/v/{start + i}.mp4", "duration": 1.5, "fps": 25.0, "num_frames": 37,
             "valid_frames": 8} for i in range(count)]


def _resident() -> tuple[int, int]:
    """(anonymous, file-backed) resident memory of this process in bytes (Linux)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[key].split()[0]) * 1024 for key in ("RssAnon", "RssFile"))


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` views a memory map (somewhere down its chain of bases)."""
    while array is not None:
        if isinstance(array, mmap.mmap):
            return True
        array = array.obj if isinstance(array, memoryview) else getattr(array, "base", None)
    return False


def test_shards_are_memory_mapped_not_loaded(tmp_path):
    shards, per_shard = 8, 512  # 8 shards x 8 MiB of float16 frames = 64 MiB on disk
    store = FrameStore()
    store.directory = tmp_path
    kept = {}
    for s in range(shards):
        video = _video(per_shard, seed=s)
        ids = store.append(video, _rows(s * per_shard, per_shard))
        kept[int(ids[5 + 61 * s])] = video.frames[5 + 61 * s].clone()
        del video
    manifest = store.manifest()
    del store

    anon, file = _resident()
    opened = FrameStore.open(tmp_path, manifest)
    assert all(_mapped(s.frames) for s in opened.shards)
    assert _resident()[1] - file < 2**20  # opening reads headers only
    picked = np.array(sorted(kept))[::-1]
    got = opened.gather(picked)
    for row, frames in zip(picked, got.frames, strict=True):
        assert torch.equal(frames, kept[int(row)])
    grown_anon, grown_file = (now - then for now, then in zip(_resident(), (anon, file),
                                                                strict=True))
    # Reading 8 rows maps the pages around them (the kernel maps page-cache folios of up to
    # 2 MiB at once), never the 64 MiB, and allocates only the rows themselves.
    assert grown_file < 8 * 2.5 * 2**20, grown_file
    assert grown_anon < 4 * 2**20, grown_anon
    # ...while reading every row does map it all: the measurement can fail.
    total = sum(float(np.asarray(s.frames[::4], dtype=np.float32).sum()) for s in opened.shards)
    assert np.isfinite(total) and _resident()[1] - file > 48 * 2**20


def _evict(directory) -> None:
    """Drop the shards' pages from the page cache (written and synced: clean pages)."""
    for path in directory.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_a_populated_store_is_mapped_in_whole(tmp_path):
    """populate_shards() maps every shard into the process at once (rows are then read without a
    page fault each); it maps nothing when what the page cache lacks exceeds the bytes it may
    take, and what another process already read in costs nothing."""
    store = FrameStore()
    store.directory = tmp_path
    for s in range(4):  # 4 shards x 4 MiB of float16 frames
        store.append(_video(256, seed=s), _rows(256 * s, 256))
    manifest = store.manifest()
    del store
    _evict(tmp_path)
    opened = FrameStore.open(tmp_path, manifest)
    files = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    missing = sum(uncached(shard.frames) for shard in opened.shards)
    assert 0.9 * files < missing <= files
    file = _resident()[1]
    assert populate_shards(opened.shards, max_bytes=missing - 1) == 0
    assert _resident()[1] - file < 2**20
    assert populate_shards(opened.shards, max_bytes=missing) == files
    assert _resident()[1] - file > 0.95 * files
    assert sum(uncached(shard.frames) for shard in opened.shards) == 0
    # another process opening it now finds it all in the page cache: mapped in for nothing
    again = FrameStore.open(tmp_path, manifest)
    assert populate_shards(again.shards, max_bytes=0) == files


def test_ids_tombstones_proxies_and_rows(tmp_path):
    store = FrameStore()
    first = store.append(_video(5, dim=16), _rows(0, 5))
    second = store.append(_video(4, dim=16, seed=1), _rows(5, 4))
    assert first.tolist() == [0, 1, 2, 3, 4] and second.tolist() == [5, 6, 7, 8]
    assert store.remove(np.array([2, 6, 6, 42])).tolist() == [2, 6]  # unknown ids ignored
    assert len(store) == 7 and store.live().tolist() == [0, 1, 3, 4, 5, 7, 8]
    store.save(tmp_path)
    reopened = FrameStore.open(tmp_path, json.loads(json.dumps(store.manifest())))
    assert reopened.append(_video(1, dim=16, seed=2), _rows(9, 1)).tolist() == [9]  # not 2
    for s in (store, reopened):
        video = s.gather(np.array([8, 0, 8]))
        np.testing.assert_array_equal(s.proxies(np.array([8, 0])), video_proxy(
            video.frames[:2].float(), video.frame_mask[:2]).numpy())
        rows = s.table.rows(np.array([7, 1]))
        assert rows["path"].tolist() == ["/v/7.mp4", "/v/1.mp4"] and rows.index.tolist() == [7, 1]
        assert list(rows.columns) == list(ROW_COLUMNS)
        # a clip row is its whole video: its own video id, [0, duration]
        assert rows["video"].tolist() == [7, 1] and rows["end"].tolist() == [1.5, 1.5]
        # columns(): the same values as rows(), any order and repeats, across shards
        ids = np.array([8, 0, 5, 8, 3])
        picked = s.table.columns(ids, ("path", "fps", "num_frames"))
        for name, values in picked.items():
            assert values.tolist() == s.table.rows(ids)[name].tolist()
        assert [ids.tolist() for ids, _ in s.iter_proxies()][:2] == [[0, 1, 3, 4], [5, 7, 8]]
    assert reopened.table.all().drop(index=9).equals(store.table.all())
    assert list(reopened.table.videos().columns) == list(COLUMNS)
    # has_frames: False exactly for a row stored without any valid frame (title-only rows)
    empty = _video(1, dim=16, seed=3)
    empty.frame_mask[:] = False
    blank = reopened.append(empty, _rows(10, 1))
    assert reopened.has_frames(np.array([10, 0, 9, 5])).tolist() == [False, True, True, True]
    assert blank.tolist() == [10]
    with pytest.raises(ValueError, match=r"do not fit this store's \[n, 8, 16\]"):
        store.append(_video(1, dim=32), _rows(0, 1))


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


def _write_version_1(directory, model, count=6):
    """An index folder as dicosa wrote it before the store (manifest version 1)."""
    from dicosa.fingerprint import model_fingerprint

    video = _video(count, num=model.config.num_frames, dim=model.embed_dim)
    directory.mkdir()
    (directory / "shard-00000.safetensors").write_bytes(save_safetensors(
        {"frames": video.frames, "frame_mask": video.frame_mask}))
    pd.DataFrame(_rows(0, count), columns=list(COLUMNS[:5])).to_csv(
        directory / "shard-00000.csv", index=False)
    (directory / "manifest.json").write_text(json.dumps({
        "format": "dicosa-video-index", "version": 1, "fingerprint": model_fingerprint(model),
        "num_frames": model.config.num_frames, "dim": model.embed_dim, "num_videos": count,
        "shards": [{"name": "shard-00000", "count": count}], "skipped": [], "meta": {}}))
    return video


def test_version_1_index_loads_searches_and_upgrades(model, tmp_path):
    out = tmp_path / "old"
    video = _write_version_1(out, model)
    old = VideoIndex.load(out, model)
    assert len(old) == 6 and old.paths == [f"/v/{i}.mp4" for i in range(6)]
    assert old.metadata["title"].tolist() == [""] * 6
    exhaustive = old.search("a red circle", k=3, candidates=None)
    assert {h.id for h in old.search("a red circle", k=3, candidates=4)} <= set(range(6))
    assert [h.id for h in old.search("a red circle", k=3)] == [h.id for h in exhaustive]

    old.add_features(video, [{"path": f"/w/{i}.mp4"} for i in range(6)])
    old.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == 2 and [s["proxy"] for s in manifest["shards"]] == [False, True]
    new = VideoIndex.load(out, model)
    assert len(new) == 12 and new.paths[6:] == [f"/w/{i}.mp4" for i in range(6)]
    scores = exhaustive_scores(new, ["a red circle"])[0]
    torch.testing.assert_close(scores[:6], scores[6:])


def test_unreadable_indexes_are_one_sentence(model, tmp_path):
    out = tmp_path / "old"
    _write_version_1(out, model)
    manifest = json.loads((out / "manifest.json").read_text())

    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 7}))
    with pytest.raises(ValueError, match=r"version 7 is not supported .* rebuild the index"):
        VideoIndex.load(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="is damaged; rebuild the index"):
        VideoIndex.load(out)
    (out / "manifest.json").write_text(json.dumps(manifest))
    shard = out / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(StoreError, match="truncated; rebuild the index"):
        VideoIndex.load(out)
    shard.unlink()
    with pytest.raises(StoreError, match="is missing; rebuild the index"):
        VideoIndex.load(out)
    for error in (StoreError,):
        assert issubclass(error, ValueError)  # printed as one sentence by the CLI
