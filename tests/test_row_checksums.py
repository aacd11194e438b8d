"""Per-video CRC32s in shard files: one flipped byte names the one video that holds it.

Real shard files (both layouts, float16 and int8 frames) are written by the store, then one
byte at a time is flipped on disk; a naive reference (which tensor the byte is in, which
element, which video owns that element) says which video must fail, and the store must name
exactly that one, or none for a byte that belongs to no video (the header, a ``runs``
shard's ``pad``). A shard written without the CRCs (as before them) is damaged as a whole.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dicosa.model import VideoFeatures
from dicosa.search.row_checksums import CRC_TENSOR, damaged_videos
from dicosa.search.shards import VideoRun
from dicosa.search.store import FrameStore
from dicosa.search.store_check import checksum_failures, verify

N, D = 4, 16
_DTYPES = {"F16": np.float16, "F32": np.float32, "BOOL": np.bool_, "I64": np.int64,
           "I8": np.int8}


def _clips(store: FrameStore, count: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(count, N, dtype=torch.bool)
    mask[1, 2:] = False
    store.append(VideoFeatures(torch.randn(count, N, D, generator=g).half(), mask),
                 [{"path": f"/v/clip{seed}-{i}.mp4", "duration": 1.0} for i in range(count)])


def _runs(store: FrameStore, lengths: list[int], seed: int) -> None:
    """Videos of ``lengths`` frames, cut into overlapping windows of N (stride 2)."""
    rng = np.random.default_rng(seed)
    runs = []
    for i, frames in enumerate(lengths):
        starts = list(range(0, max(frames - N, 0) + 1, 2))
        segments = np.array([[s, min(N, frames - s)] for s in starts], dtype=np.int64)
        runs.append(VideoRun(rng.standard_normal((frames, D)).astype(np.float16),
                             np.ones(frames, bool), np.arange(frames, dtype=np.float32),
                             segments, segments.astype(np.float32),
                             {"path": f"/v/run{seed}-{i}.mp4", "duration": float(frames)}))
    store.append_runs(runs, rng.standard_normal(D).astype(np.float16), N)


def _written(folder: Path, layout: str, frame_dtype: str) -> tuple[FrameStore, dict]:
    store = FrameStore(N, D, frame_dtype=frame_dtype)
    store.directory = folder
    if layout == "clips":
        _clips(store, 5, seed=1)
    else:
        _runs(store, [9, 4, 2, 12], seed=1)
    manifest = store.manifest()
    return FrameStore.open(folder, manifest), manifest


# A runs shard's segment table: which rows view which frames of which video. A flipped byte
# there moves the bounds by which the videos are checksummed.
TABLE = ("segment", "segment_video")


def _read_everything(store: FrameStore) -> None:
    """Every row read the ways search reads them: a damaged table never reads past the file."""
    ids = store.live()
    for read in (store.gather, store.has_frames, store.videos.times, store.videos.spans):
        read(ids)


def _table(shard) -> tuple[str, np.ndarray, np.ndarray]:
    """What :func:`_owner` reads of ``shard``, copied (its maps see the file change)."""
    if shard.layout == "clips":
        return "clips", np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    return "runs", np.array(shard.segment), np.array(shard.segment_video)


def _owner(table, name: str, shape: list[int], element: int) -> int:
    """The video (csv line) whose bytes hold element ``element`` (flat index) of tensor
    ``name`` of ``shape``: the naive reference, from the layout's definition; -1 for none."""
    layout, segment, segment_video = table
    unit = element // int(np.prod(shape[1:], dtype=np.int64))  # its row, video or frame
    if name == CRC_TENSOR or layout == "clips":
        return unit
    if name == "pad":
        return -1
    if name in ("segment", "segment_video", "segment_time", "proxy"):
        return int(segment_video[unit])
    first = [int(segment[segment_video == v, 0].min()) for v in range(segment_video[-1] + 1)]
    first[0] = 0
    return int(np.searchsorted(first, unit, side="right") - 1)


@pytest.mark.parametrize("layout, frame_dtype", [("clips", "float16"), ("runs", "float16"),
                                                 ("runs", "int8"), ("clips", "int8")])
def test_one_flipped_byte_fails_the_crc_of_the_video_that_holds_it(tmp_path, layout,
                                                                   frame_dtype):
    store, manifest = _written(tmp_path, layout, frame_dtype)
    (shard,) = store.shards
    path = tmp_path / f"{shard.name}.safetensors"
    clean = path.read_bytes()
    (length,) = struct.unpack("<Q", clean[:8])
    header = json.loads(clean[8:8 + length])
    assert damaged_videos(shard).size == 0 and not checksum_failures(store)
    table = _table(shard)  # the reference: the clean file's layout
    rng = np.random.default_rng(0)
    tried = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        size = np.dtype(_DTYPES[info["dtype"]]).itemsize
        for offset in rng.choice(np.arange(begin, end), size=min(6, end - begin),
                                 replace=False):
            damaged = bytearray(clean)
            damaged[8 + length + offset] ^= 0x10
            path.write_bytes(bytes(damaged))
            reopened = FrameStore.open(tmp_path, manifest)
            part = reopened.shards[0]
            expected = _owner(table, name, info["shape"], int(offset - begin) // size)
            found = damaged_videos(part).tolist()
            (damage,) = checksum_failures(reopened)  # the sha256 always sees it
            if name in TABLE:  # the partition itself moved: the owner and its neighbours
                assert expected in found and found == sorted(found), (name, offset, found)
                assert set(found) <= {expected - 1, expected, expected + 1}
                _read_everything(reopened)
            else:
                assert found == ([] if expected < 0 else [expected]), (name, offset)
                ids = np.arange(part.count)
                owner = ids if expected < 0 else ids[part.video_of(ids) == expected]
                assert damage.ids.tolist() == owner.tolist()
                assert damage.by_row == (expected >= 0)
            tried += 1
    path.write_bytes(clean)
    assert tried >= 20


def test_a_shard_without_crcs_is_damaged_as_a_whole_and_removed_videos_heal_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    _, manifest = _written(tmp_path, "runs", "float16")
    path = tmp_path / "shard-00000.safetensors"
    old = tmp_path / "old"
    old.mkdir()
    tensors = load_file(str(path))
    del tensors[CRC_TENSOR]  # as written before per-video checksums
    save_file(tensors, str(old / "shard-00000.safetensors"))
    (old / "shard-00000.csv").write_bytes((tmp_path / "shard-00000.csv").read_bytes())
    for folder in (tmp_path, old):
        data = bytearray((folder / "shard-00000.safetensors").read_bytes())
        data[-3] ^= 0x01  # a byte of the last video's last row (its proxy)
        (folder / "shard-00000.safetensors").write_bytes(bytes(data))
    current = FrameStore.open(tmp_path, manifest)
    (damage,) = checksum_failures(current)
    assert damage.by_row and damage.ids.tolist() == current.videos.rows(
        current.videos.of(np.array([current.next_id - 1]))[0]).tolist()
    assert "fail their own checksums" in damage.sentence()
    before = FrameStore.open(old, {**manifest, "shards": [{**manifest["shards"][0],
                                                            "sha256": None}]})
    assert before.shards[0].video_crc is None
    assert not checksum_failures(before)  # no sha256 recorded: not checked
    before.shards[0].sha256 = {"safetensors": "0" * 64}
    (whole,) = checksum_failures(before)
    assert not whole.by_row and len(whole.ids) == before.next_id
    assert whole.sentence().endswith(f"(rows 0..{before.next_id - 1}: the whole shard)")
    # a repair removes the damaged video's rows: the shard is sound again
    current.remove(damage.ids)
    assert not checksum_failures(current) and not verify(current)
