"""Training/evaluation datasets: items, substitution of bad videos, and evaluation failures."""

from __future__ import annotations

import logging
import zlib
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from dicosa.data.datasets import RetrievalSplit
from dicosa.data.loader import BadVideosError, TextDataset, TrainDataset, VideoDataset
from dicosa.data.video import load_video
from tests._videos import truncate, write_video

REPO = Path(__file__).resolve().parents[1]
LENGTH = 8


def fake_tokenize(texts: list[str]) -> torch.Tensor:
    """Hash words to ids 1..999, pad/cut to LENGTH: deterministic across processes."""
    out = torch.zeros(len(texts), LENGTH, dtype=torch.long)
    for i, text in enumerate(texts):
        ids = [zlib.crc32(w.encode()) % 999 + 1 for w in text.split()][:LENGTH]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def make_split(root: Path, bad: dict[int, str] | None = None, num_videos: int = 4,
               per_video: int = 2) -> RetrievalSplit:
    """``num_videos`` 6-frame clips with ``per_video`` captions each; ``bad`` maps a video
    index to "missing", "empty" or "truncated"."""
    bad = bad or {}
    paths = []
    for v in range(num_videos):
        path = root / f"v{v}.mp4"
        kind = bad.get(v)
        if kind == "empty":
            path.touch()
        elif kind == "truncated":
            truncate(write_video(path, 6), 0.4)
        elif kind is None:
            write_video(path, 6)
        paths.append(path)
    return RetrievalSplit(
        name="toy/train", video_ids=[f"v{v}" for v in range(num_videos)], video_paths=paths,
        segments=[None] * num_videos,
        captions=[f"video {v} caption {k}" for v in range(num_videos) for k in range(per_video)],
        caption_video=[v for v in range(num_videos) for _ in range(per_video)],
        multi_caption=per_video > 1,
    )


def test_train_item_is_a_caption_video_pair(tmp_path):
    split = make_split(tmp_path)
    ds = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32)
    assert len(ds) == 8
    item = ds[5]
    assert set(item) == {"tokens", "frames", "frame_mask", "video_index", "skipped"}
    assert item["video_index"] == 2 and item["skipped"] == 0
    assert torch.equal(item["tokens"], fake_tokenize(["video 2 caption 1"])[0])
    assert item["tokens"].dtype == torch.long and item["tokens"].shape == (LENGTH,)
    assert item["frames"].shape == (4, 3, 32, 32) and item["frames"].dtype == torch.uint8
    assert item["frame_mask"].tolist() == [True] * 4


def test_train_offsets_follow_torch_seed(tmp_path):
    split = make_split(tmp_path, num_videos=1, per_video=1)
    split.video_paths[0] = write_video(tmp_path / "long.mp4", 48)
    ds = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32)
    torch.manual_seed(0)
    a = [ds[0]["frames"] for _ in range(4)]
    torch.manual_seed(0)
    b = [ds[0]["frames"] for _ in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # Twelve frames per segment: four draws are not all identical.
    assert any(not torch.equal(a[0], x) for x in a[1:])


def test_bad_training_video_is_substituted_counted_and_logged_once(tmp_path, caplog):
    split = make_split(tmp_path, bad={1: "truncated"})
    ds = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32, seed=5)
    with caplog.at_level(logging.WARNING, logger="dicosa.data.loader"):
        first = ds[2]  # a caption of video 1
        second = ds[2]
        ds[3]
    assert first["skipped"] >= 1 and first["video_index"] != 1
    # Deterministic substitute, and its caption travels with it.
    assert (second["video_index"], second["skipped"]) == (first["video_index"],
                                                          first["skipped"])
    sub_captions = [c for c, v in zip(split.captions, split.caption_video, strict=True)
                    if v == first["video_index"]]
    assert any(torch.equal(first["tokens"], fake_tokenize([c])[0]) for c in sub_captions)
    assert caplog.text.count(str(split.video_paths[1])) == 1
    assert ds.pop_bad_videos() == {str(split.video_paths[1])}
    assert ds.bad_videos == set()


def test_skipped_counts_add_up_across_workers(tmp_path):
    split = make_split(tmp_path, bad={0: "missing", 2: "empty"}, num_videos=5)
    ds = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32, seed=1)
    serial = [ds[i] for i in range(len(ds))]
    expected = sum(item["skipped"] for item in serial)
    assert expected >= 4  # four captions point at bad videos
    assert all(item["video_index"] not in (0, 2) for item in serial)
    loader = DataLoader(ds, batch_size=3, num_workers=2, shuffle=False)
    batches = list(loader)
    assert sum(int(b["skipped"].sum()) for b in batches) == expected
    assert torch.cat([b["video_index"] for b in batches]).tolist() == [
        item["video_index"] for item in serial]
    assert batches[0]["frames"].shape == (3, 4, 3, 32, 32)


def test_all_videos_bad_gives_up_with_a_clear_error(tmp_path):
    split = make_split(tmp_path, bad={0: "missing", 1: "empty"}, num_videos=2)
    ds = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32, max_substitutions=5)
    with pytest.raises(RuntimeError, match="check_videos"):
        ds[0]


def test_video_dataset_is_deterministic(tmp_path):
    split = make_split(tmp_path, num_videos=2)
    ds = VideoDataset(split, num_frames=4, image_size=32)
    item = ds[1]
    assert set(item) == {"frames", "frame_mask", "video_index"} and item["video_index"] == 1
    expected, mask = load_video(split.video_paths[1], 4, 32, train=False)
    assert torch.equal(item["frames"], expected) and torch.equal(item["frame_mask"], mask)
    assert torch.equal(ds[1]["frames"], item["frames"])
    ds.check(progress=False)  # all good: no error


def test_video_dataset_fails_listing_every_bad_file(tmp_path):
    split = make_split(tmp_path, bad={1: "missing", 3: "truncated"}, num_videos=4)
    ds = VideoDataset(split, num_frames=4, image_size=32)
    with pytest.raises(BadVideosError) as info:
        ds[3]
    assert [p for p, _ in info.value.bad] == [str(split.video_paths[1]),
                                              str(split.video_paths[3])]
    message = str(info.value)
    assert "2 unusable video file(s) in toy/train" in message
    assert str(split.video_paths[1]) in message and str(split.video_paths[3]) in message
    with pytest.raises(BadVideosError):
        ds.check(progress=False)


def test_video_dataset_error_survives_a_worker(tmp_path):
    split = make_split(tmp_path, bad={0: "empty"}, num_videos=2)
    batches = iter(DataLoader(VideoDataset(split, 4, 32), batch_size=2, num_workers=1))
    try:
        next(batches)
    except BadVideosError as exc:
        error = str(exc)
    else:
        pytest.fail("no BadVideosError")
    # Drop the iterator now: kept alive by a traceback, its workers stop only at teardown.
    del batches
    assert "v0.mp4: empty file" in error


def test_text_dataset_indexes_every_caption(tmp_path):
    split = make_split(tmp_path, num_videos=2, per_video=3)
    ds = TextDataset(split, fake_tokenize)
    assert len(ds) == 6
    item = ds[4]
    assert item["caption_index"] == 4 and split.caption_video[4] == 1
    assert torch.equal(item["tokens"], fake_tokenize(["video 1 caption 1"])[0])
    batch = next(iter(DataLoader(ds, batch_size=6)))
    assert batch["tokens"].shape == (6, LENGTH) and batch["caption_index"].tolist() == [
        0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------- the released protocol


def _textured_frames(num_frames: int, size: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (1, 3, size, size), generator=g, dtype=torch.uint8)
    return image.expand(num_frames, -1, -1, -1).clone()


def test_randaugment_changes_every_frame_of_a_clip_alike():
    import random

    import numpy as np

    from dicosa.data.augment import RELEASED_AUGMENT, ClipRandAugment

    augment = ClipRandAugment(RELEASED_AUGMENT, image_size=32)
    frames = _textured_frames(4)
    mask = torch.tensor([True, True, True, False])
    random.seed(7)
    np.random.seed(7)
    outputs = []
    for seed in range(6):
        out = augment(frames, mask, seed=seed)
        assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])  # one draw a clip
        assert torch.equal(out[3], frames[3])  # padding is left alone
        assert torch.equal(out, augment(frames, mask, seed=seed))  # a function of the seed
        outputs.append(out[0])
    assert len({o.numpy().tobytes() for o in outputs}) >= 3  # seeds draw different ops
    assert random.random() == random.Random(7).random()  # the caller's streams are intact
    with pytest.raises(ValueError, match="RandAugment"):
        ClipRandAugment("rand-q9", image_size=32)


def test_augmented_training_items_are_reproducible(tmp_path):
    split = make_split(tmp_path)
    plain = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32, seed=5)
    augmented = TrainDataset(split, fake_tokenize, num_frames=4, image_size=32, seed=5,
                             augment="rand-m7-n4-mstd0.5-inc1")
    changed = 0
    for index in range(len(plain)):
        torch.manual_seed(index)
        a = augmented[index]["frames"]
        torch.manual_seed(index)
        assert torch.equal(a, augmented[index]["frames"])
        torch.manual_seed(index)
        changed += not torch.equal(a, plain[index]["frames"])
    assert changed >= len(plain) // 2
