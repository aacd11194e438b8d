"""Annotation parsing for every dataset, in its published file format, and validation splits."""

from __future__ import annotations

import json
import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dicosa.data.datasets import (
    DATASETS,
    AnnotationError,
    RetrievalSplit,
    load_split,
    split_off_validation,
)
from tests._videos import write_video

REPO = Path(__file__).resolve().parents[1]


def pairs(split: RetrievalSplit) -> list[tuple[str, str]]:
    """(video id, caption) for every caption: the ground truth independent of indexing."""
    return [(split.video_ids[v], c) for c, v in zip(split.captions, split.caption_video,
                                                    strict=True)]


# ---------------------------------------------------------------- MSR-VTT


@pytest.fixture
def msrvtt(tmp_path) -> Path:
    (tmp_path / "MSRVTT_train.9k.csv").write_text("video_id\nvideo2\nvideo0\nvideo1\n")
    sentences = [
        ("video0", "a man sings"), ("video1", "a cat jumps"), ("video0", "someone sings"),
        ("video2", "cars race"), ("video1", "   "), ("video9", "a test video caption"),
    ]
    data = {"videos": [{"video_id": f"video{i}"} for i in (0, 1, 2, 9)],
            "sentences": [{"video_id": v, "caption": c, "sen_id": i}
                          for i, (v, c) in enumerate(sentences)]}
    (tmp_path / "MSRVTT_data.json").write_text(json.dumps(data))
    (tmp_path / "MSRVTT_JSFUSION_test.csv").write_text(
        "key,vid_key,video_id,sentence\n"
        "ret0,msr9,video9,a dog, running\nret1,msr7,video7,\"a dog, running\"\n"
    )
    return tmp_path


def test_msrvtt_9k_pairs_every_caption_of_the_listed_videos(msrvtt, caplog):
    with caplog.at_level(logging.WARNING):
        split = load_split("msrvtt", msrvtt, "9k")
    assert split.name == "msrvtt/9k"
    assert split.video_ids == ["video2", "video0", "video1"]  # list-file order
    # Captions of unlisted videos (video9) are not training pairs; the blank one is dropped.
    assert pairs(split) == [("video0", "a man sings"), ("video1", "a cat jumps"),
                            ("video0", "someone sings"), ("video2", "cars race")]
    assert split.num_empty_captions == 1
    assert "skipped 1 empty caption" in caplog.text
    assert split.multi_caption is False
    assert split.segments == [None, None, None]


def test_msrvtt_1k_a_reads_the_jsfusion_csv(msrvtt):
    # Written with csv quoting rules: the second row's sentence holds a quoted comma.
    (msrvtt / "MSRVTT_JSFUSION_test.csv").write_text(
        'key,vid_key,video_id,sentence\nret0,msr9,video9,a dog running\n'
        'ret1,msr7,video7,"a dog, running"\n'
    )
    split = load_split("msrvtt", msrvtt, "1k-A")
    assert pairs(split) == [("video9", "a dog running"), ("video7", "a dog, running")]
    assert split.multi_caption is False


def test_video_files_are_found_by_id_with_any_extension(msrvtt, tmp_path):
    write_video(msrvtt / "videos" / "video0.mp4", 2)
    write_video(msrvtt / "videos" / "video1.avi", 2, codec="mpeg4")
    (msrvtt / "videos" / "video2.txt").write_text("not a video extension")
    (msrvtt / "videos" / ".video2.partial.mp4").write_bytes(b"hidden: unfinished output")
    split = load_split("msrvtt", msrvtt, "9k")
    paths = dict(zip(split.video_ids, split.video_paths, strict=True))
    assert paths["video0"] == msrvtt / "videos" / "video0.mp4"
    assert paths["video1"] == msrvtt / "videos" / "video1.avi"
    # Missing files keep the expected name, so the decode error says what to look for.
    assert paths["video2"] == msrvtt / "videos" / "video2.mp4"
    other = load_split("msrvtt", msrvtt, "9k", video_dir=tmp_path / "elsewhere")
    assert other.video_paths[0] == tmp_path / "elsewhere" / "video2.mp4"


def test_mp4_is_preferred_when_an_id_has_several_files(msrvtt):
    (msrvtt / "videos").mkdir()
    for ext in (".mkv", ".mp4", ".avi"):
        (msrvtt / "videos" / f"video0{ext}").write_bytes(b"x")
    (msrvtt / "videos" / "old").mkdir()
    (msrvtt / "videos" / "old" / "video0.mp4").write_bytes(b"x")
    (msrvtt / "videos" / "old" / "video2.webm").write_bytes(b"x")
    split = load_split("msrvtt", msrvtt, "9k")
    assert split.video_paths[1] == msrvtt / "videos" / "video0.mp4"  # shallowest, then .mp4
    assert split.video_paths[0] == msrvtt / "videos" / "old" / "video2.webm"  # any depth


def test_missing_annotation_file_is_named(msrvtt):
    (msrvtt / "MSRVTT_data.json").unlink()
    with pytest.raises(AnnotationError, match=re.escape("MSRVTT_data.json")):
        load_split("msrvtt", msrvtt, "9k")
    with pytest.raises(AnnotationError, match=re.escape("MSRVTT_train.7k.csv")):
        load_split("msrvtt", msrvtt, "7k")


def test_unknown_dataset_or_split(msrvtt):
    with pytest.raises(KeyError, match="msrvtt"):
        load_split("nope", msrvtt, "9k")
    with pytest.raises(KeyError, match="1k-A"):
        load_split("msrvtt", msrvtt, "test")


def test_registry_names_and_frame_counts():
    assert set(DATASETS) == {"msrvtt", "msvd", "lsmdc", "activitynet", "didemo", "synthetic"}
    assert {n: DATASETS[n].num_frames for n in DATASETS} == {
        "msrvtt": 12, "msvd": 12, "lsmdc": 12, "activitynet": 64, "didemo": 64, "synthetic": 12}
    for info in DATASETS.values():
        assert info.train_split in info.splits and info.test_split in info.splits


# ---------------------------------------------------------------- MSVD


@pytest.fixture
def msvd(tmp_path) -> Path:
    (tmp_path / "train_list.txt").write_text("vidA\nvidB\n")
    (tmp_path / "val_list.txt").write_text("vidC\n")
    (tmp_path / "test_list.txt").write_text("vidD\nvidE\n\n")
    raw = {
        "vidA": [["a", "man", "cooks"]],
        "vidB": [["two", "dogs"], ["dogs", "play"]],
        "vidC": [["val", "caption"]],
        "vidD": [["d", "one"], ["d", "two"], ["d", "three"]],
        "vidE": [["e", "one"], []],
    }
    with (tmp_path / "raw-captions.pkl").open("wb") as fh:
        pickle.dump(raw, fh)
    return tmp_path


def test_msvd_joins_tokens_and_evaluates_multi_caption(msvd):
    train = load_split("msvd", msvd, "train")
    assert pairs(train) == [("vidA", "a man cooks"), ("vidB", "two dogs"), ("vidB", "dogs play")]
    assert train.multi_caption is False
    test = load_split("msvd", msvd, "test")
    assert test.video_ids == ["vidD", "vidE"]
    assert test.caption_video == [0, 0, 0, 1]  # the empty token list is dropped
    assert test.captions[3] == "e one" and test.num_empty_captions == 1
    assert test.multi_caption is True
    assert load_split("msvd", msvd, "val").captions == ["val caption"]


# ---------------------------------------------------------------- LSMDC


def test_lsmdc_tab_separated_with_quotes_and_movie_folders(tmp_path):
    clip = "1001_Flight_00.00.56.400-00.01.03.479"
    rows = [
        f"{clip}\t00.00.56.400\t00.01.03.479\t00.00.56.400\t00.01.03.479\tSOMEONE says \"hi\".",
        "1002_Up_00.01.00.000-00.01.02.000\t0\t0\t0\t0\tSomeone flies, "
        "holding a 'balloon'.",
    ]
    (tmp_path / "LSMDC16_annos_training.csv").write_text("\n".join(rows) + "\n")
    write_video(tmp_path / "videos" / "1001_Flight" / f"{clip}.avi", 2)
    split = load_split("lsmdc", tmp_path, "train")
    assert split.video_ids == [clip, "1002_Up_00.01.00.000-00.01.02.000"]
    assert split.captions == ['SOMEONE says "hi".', "Someone flies, holding a 'balloon'."]
    assert split.video_paths[0] == tmp_path / "videos" / "1001_Flight" / f"{clip}.avi"
    with pytest.raises(AnnotationError, match=re.escape("LSMDC16_challenge_1000_publictect.csv")):
        load_split("lsmdc", tmp_path, "test")


def test_lsmdc_short_rows_are_rejected(tmp_path):
    (tmp_path / "LSMDC16_annos_val.csv").write_text("clip\t0\t1\tonly four\n")
    with pytest.raises(AnnotationError, match=r"LSMDC16_annos_val.csv:1"):
        load_split("lsmdc", tmp_path, "val")


# ---------------------------------------------------------------- ActivityNet, DiDeMo


def test_activitynet_paragraphs_follow_the_ids_file(tmp_path):
    data = {
        "v_a": {"duration": 10.0, "timestamps": [[0, 5], [5, 10]],
                "sentences": ["A man walks in. ", " He sits down."]},
        "v_b": {"duration": 4.0, "timestamps": [[0, 4]], "sentences": ["Rain falls."]},
        "v_c": {"duration": 4.0, "timestamps": [[0, 4]], "sentences": ["Not listed."]},
    }
    (tmp_path / "val_1.json").write_text(json.dumps(data))
    (tmp_path / "val_ids.json").write_text(json.dumps(["v_b", "v_a", "v_missing"]))
    split = load_split("activitynet", tmp_path, "val1")
    assert pairs(split) == [("v_b", "Rain falls."), ("v_a", "A man walks in. He sits down.")]
    assert split.segments == [None, None] and split.multi_caption is False


def test_didemo_groups_descriptions_into_one_paragraph_per_video(tmp_path):
    entries = [
        {"video": "111@N00_1_ab.mov", "times": [[0, 0]], "description": "a dog runs"},
        {"video": "222@N00_2_cd.mp4", "times": [[1, 1]], "description": "a girl waves"},
        {"video": "111@N00_1_ab.mov", "times": [[2, 3]], "description": " it stops "},
    ]
    (tmp_path / "test_data.json").write_text(json.dumps(entries))
    (tmp_path / "test_list.txt").write_text("111@N00_1_ab.mov\n222@N00_2_cd.mp4\n")
    write_video(tmp_path / "videos" / "222@N00_2_cd.mp4", 2)
    split = load_split("didemo", tmp_path, "test")
    assert pairs(split) == [("111@N00_1_ab", "a dog runs it stops"),
                            ("222@N00_2_cd", "a girl waves")]
    assert split.video_paths[1].name == "222@N00_2_cd.mp4"
    with pytest.raises(AnnotationError, match=re.escape("train_list.txt")):
        load_split("didemo", tmp_path, "train")


# ---------------------------------------------------------------- validation split


def many_caption_split(num_videos: int = 20, per_video: int = 3) -> RetrievalSplit:
    ids = [f"v{i}" for i in range(num_videos)]
    caption_video = [v for v in range(num_videos) for _ in range(per_video)]
    return RetrievalSplit(
        name="toy/train", video_ids=ids, video_paths=[Path(f"{i}.mp4") for i in ids],
        segments=[None] * num_videos, captions=[f"c{v}-{k}" for v in range(num_videos)
                                                for k in range(per_video)],
        caption_video=caption_video, multi_caption=False,
    )


def test_validation_split_never_shares_a_video():
    split = many_caption_split()
    train, val = split_off_validation(split, 0.25, seed=1)
    assert len(val.video_ids) == 5 and len(train.video_ids) == 15
    assert not set(train.video_ids) & set(val.video_ids)
    # Every caption lands, with its own video, in exactly one part.
    assert sorted(pairs(train) + pairs(val)) == sorted(pairs(split))
    assert val.multi_caption is True and train.multi_caption is False
    assert val.name == "toy/train:val"


def test_validation_split_depends_only_on_the_seed():
    split = many_caption_split()
    a = split_off_validation(split, 0.2, seed=3)[1].video_ids
    assert split_off_validation(split, 0.2, seed=3)[1].video_ids == a
    others = {tuple(split_off_validation(split, 0.2, seed=s)[1].video_ids) for s in range(5)}
    assert len(others) > 1


def test_validation_fraction_edge_cases():
    split = many_caption_split(num_videos=4, per_video=1)
    train, val = split_off_validation(split, 0.01, seed=0)
    assert len(val.video_ids) == 1 and val.multi_caption is False  # at least one video
    train, val = split_off_validation(split, 0.0, seed=0)
    assert val.video_ids == [] and train.video_ids == split.video_ids
    with pytest.raises(ValueError):
        split_off_validation(split, 1.0, seed=0)


def test_split_rejects_inconsistent_lists():
    with pytest.raises(ValueError):
        RetrievalSplit("x", ["a"], [Path("a.mp4")], [None], ["c"], [1], False)


# ---------------------------------------------------------------- check CLI


def test_check_videos_cli_lists_bad_files(msrvtt):
    write_video(msrvtt / "videos" / "video0.mp4", 3)
    (msrvtt / "videos" / "video1.mp4").write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "check_videos.py"), "msrvtt", str(msrvtt),
         "9k", "--workers", "1"], capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "2 of 3 videos unusable" in proc.stdout
    bad_lines = [line for line in proc.stdout.splitlines() if line.startswith("BAD")]
    assert len(bad_lines) == 2
    assert "video2.mp4: file not found" in proc.stdout and "video1.mp4: empty" in proc.stdout
