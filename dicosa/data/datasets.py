"""Read the published annotation files of each benchmark into one :class:`RetrievalSplit`.

Each dataset has a parser per split that returns videos and captions; :func:`load_split`
then drops empty captions (counted and logged) and finds each video's file under
``video_dir``. ``docs/DATA.md`` lists the files each ``root`` must hold.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import AnnotationError

__all__ = [
    "DATASETS",
    "VIDEO_EXTENSIONS",
    "AnnotationError",
    "DatasetInfo",
    "RetrievalSplit",
    "load_split",
    "split_off_validation",
]

log = logging.getLogger(__name__)

# Looked for in this order when a video id has several files.
VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".3gp",
                    ".wmv", ".flv")


@dataclass
class RetrievalSplit:
    """One split of one dataset: videos, captions, and which video each caption describes.

    Attributes:
        name: ``"<dataset>/<split>"``.
        video_ids: ``[V]`` ids as in the annotation files.
        video_paths: ``[V]`` files (a missing file is reported when decoded, not here).
        segments: ``[V]`` ``(start, end)`` in seconds, or None for the whole video.
        captions: ``[C]`` non-empty caption strings.
        caption_video: ``[C]`` index into the video lists of the video caption i describes.
        multi_caption: True when evaluation queries several captions per video (MSVD style).
        num_empty_captions: captions dropped at load time because they were empty.
    """

    name: str
    video_ids: list[str]
    video_paths: list[Path]
    segments: list[tuple[float, float] | None]
    captions: list[str]
    caption_video: list[int]
    multi_caption: bool
    num_empty_captions: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        n = len(self.video_ids)
        if len(self.video_paths) != n or len(self.segments) != n:
            raise ValueError("video_ids, video_paths and segments must have equal length")
        if len(self.captions) != len(self.caption_video):
            raise ValueError("captions and caption_video must have equal length")
        if any(not 0 <= v < n for v in self.caption_video):
            raise ValueError("caption_video holds an index outside the video list")

    @property
    def num_videos(self) -> int:
        return len(self.video_ids)

    @property
    def num_captions(self) -> int:
        return len(self.captions)


@dataclass
class _Parsed:
    """What a split parser returns: videos in order and (caption, video index) pairs."""

    video_ids: list[str]
    captions: list[str]
    caption_video: list[int]
    multi_caption: bool = False


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset's splits, their parsers and the paper's frame count."""

    name: str
    splits: dict[str, Callable[[Path], _Parsed]]
    train_split: str
    test_split: str
    num_frames: int


# ---------------------------------------------------------------- file helpers


def _need(root: Path, name: str) -> Path:
    path = root / name
    if not path.is_file():
        raise AnnotationError(f"annotation file not found: {path}")
    return path


def _read_list(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{path} is not valid JSON: {exc}") from exc


def _read_csv(path: Path, columns: Iterable[str]) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(columns) - set(reader.fieldnames or ())
        if missing:
            raise AnnotationError(f"{path} lacks column(s) {sorted(missing)}")
        return list(reader)


def _group(pairs: Iterable[tuple[str, str]], order: list[str] | None = None) -> _Parsed:
    """(video_id, caption) pairs -> _Parsed with videos in ``order`` or first-seen order."""
    video_ids = list(order) if order is not None else []
    index = {v: i for i, v in enumerate(video_ids)}
    captions: list[str] = []
    caption_video: list[int] = []
    for vid, caption in pairs:
        if vid not in index:
            if order is not None:
                continue
            index[vid] = len(video_ids)
            video_ids.append(vid)
        captions.append(caption)
        caption_video.append(index[vid])
    return _Parsed(video_ids, captions, caption_video,
                   multi_caption=_several_per_video(caption_video, len(video_ids)))


def _several_per_video(caption_video: list[int], num_videos: int) -> bool:
    counts = np.bincount(np.asarray(caption_video, dtype=np.int64), minlength=num_videos)
    return bool(np.any(counts > 1))


def _strip_video_ext(name: str) -> str:
    stem, ext = os.path.splitext(name)
    return stem if ext.lower() in VIDEO_EXTENSIONS else name


# ---------------------------------------------------------------- split parsers (DATASETS)


def _msrvtt_train(list_name: str) -> Callable[[Path], _Parsed]:
    def parse(root: Path) -> _Parsed:
        ids = [r["video_id"] for r in _read_csv(_need(root, list_name), ["video_id"])]
        data = _read_json(_need(root, "MSRVTT_data.json"))
        pairs = ((s["video_id"], s["caption"]) for s in data["sentences"])
        parsed = _group(pairs, order=ids)
        # Training pairs every caption with its video; "multi" only matters for evaluation.
        parsed.multi_caption = False
        return parsed

    return parse


def _msrvtt_test(root: Path) -> _Parsed:
    rows = _read_csv(_need(root, "MSRVTT_JSFUSION_test.csv"), ["video_id", "sentence"])
    return _group((r["video_id"], r["sentence"]) for r in rows)


def _msvd(list_name: str, train: bool) -> Callable[[Path], _Parsed]:
    def parse(root: Path) -> _Parsed:
        ids = _read_list(_need(root, list_name))
        with _need(root, "raw-captions.pkl").open("rb") as fh:
            raw = pickle.load(fh)
        pairs = [
            (vid, " ".join(tokens) if not isinstance(tokens, str) else tokens)
            for vid in ids
            for tokens in raw.get(vid, [])
        ]
        parsed = _group(pairs, order=ids)
        parsed.multi_caption = not train
        return parsed

    return parse


def _lsmdc(file_name: str) -> Callable[[Path], _Parsed]:
    def parse(root: Path) -> _Parsed:
        path = _need(root, file_name)
        pairs = []
        with path.open(newline="") as fh:
            # Sentences contain quotes, so no quote handling at all.
            for n, row in enumerate(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)):
                if not row:
                    continue
                if len(row) < 6:
                    raise AnnotationError(f"{path}:{n + 1}: expected 6 tab-separated fields")
                pairs.append((row[0].strip(), row[-1]))
        return _group(pairs)

    return parse


def _activitynet(data_name: str, ids_name: str) -> Callable[[Path], _Parsed]:
    def parse(root: Path) -> _Parsed:
        data = _read_json(_need(root, data_name))
        ids = _read_json(_need(root, ids_name))
        ids = [vid for vid in ids if vid in data]
        # Paragraph retrieval: all of a video's sentences form one caption.
        pairs = [(vid, " ".join(s.strip() for s in data[vid]["sentences"])) for vid in ids]
        return _group(pairs, order=ids)

    return parse


def _didemo(data_name: str, list_name: str) -> Callable[[Path], _Parsed]:
    def parse(root: Path) -> _Parsed:
        ids = [_strip_video_ext(v) for v in _read_list(_need(root, list_name))]
        entries = _read_json(_need(root, data_name))
        sentences: dict[str, list[str]] = {}
        for entry in entries:
            sentences.setdefault(_strip_video_ext(entry["video"]), []).append(
                entry["description"].strip()
            )
        ids = [vid for vid in ids if vid in sentences]
        pairs = [(vid, " ".join(sentences[vid])) for vid in ids]
        return _group(pairs, order=ids)

    return parse


DATASETS: dict[str, DatasetInfo] = {
    "msrvtt": DatasetInfo(
        "msrvtt",
        {
            "9k": _msrvtt_train("MSRVTT_train.9k.csv"),
            "7k": _msrvtt_train("MSRVTT_train.7k.csv"),
            "1k-A": _msrvtt_test,
        },
        train_split="9k",
        test_split="1k-A",
        num_frames=12,
    ),
    "msvd": DatasetInfo(
        "msvd",
        {
            "train": _msvd("train_list.txt", train=True),
            "val": _msvd("val_list.txt", train=False),
            "test": _msvd("test_list.txt", train=False),
        },
        train_split="train",
        test_split="test",
        num_frames=12,
    ),
    "lsmdc": DatasetInfo(
        "lsmdc",
        {
            "train": _lsmdc("LSMDC16_annos_training.csv"),
            "val": _lsmdc("LSMDC16_annos_val.csv"),
            "test": _lsmdc("LSMDC16_challenge_1000_publictect.csv"),
        },
        train_split="train",
        test_split="test",
        num_frames=12,
    ),
    "activitynet": DatasetInfo(
        "activitynet",
        {
            "train": _activitynet("train.json", "train_ids.json"),
            "val1": _activitynet("val_1.json", "val_ids.json"),
        },
        train_split="train",
        test_split="val1",
        num_frames=64,
    ),
    "didemo": DatasetInfo(
        "didemo",
        {
            "train": _didemo("train_data.json", "train_list.txt"),
            "test": _didemo("test_data.json", "test_list.txt"),
        },
        train_split="train",
        test_split="test",
        num_frames=64,
    ),
    # The synthetic benchmark is written in the MSR-VTT layout; train/test are aliases.
    "synthetic": DatasetInfo(
        "synthetic",
        {
            "9k": _msrvtt_train("MSRVTT_train.9k.csv"),
            "train": _msrvtt_train("MSRVTT_train.9k.csv"),
            "1k-A": _msrvtt_test,
            "test": _msrvtt_test,
        },
        train_split="train",
        test_split="test",
        num_frames=12,
    ),
}


# ---------------------------------------------------------------- loading


def _index_videos(video_dir: Path) -> dict[str, Path]:
    """Map file stem -> path for every video file at any depth under ``video_dir``.

    Any depth, because some downloads nest clips (LSMDC: one folder per movie). Among files
    with the same stem the shallowest wins, then the earliest in VIDEO_EXTENSIONS.
    """
    rank = {ext: i for i, ext in enumerate(VIDEO_EXTENSIONS)}
    found: dict[str, tuple[int, int, Path]] = {}
    if not video_dir.is_dir():
        return {}
    for path in video_dir.rglob("*"):
        ext = path.suffix.lower()
        # Dot-files are unfinished outputs of compress_videos.
        if ext not in rank or path.name.startswith("."):
            continue
        key = (len(path.relative_to(video_dir).parts), rank[ext], path)
        if path.stem not in found or key < found[path.stem]:
            found[path.stem] = key
    return {stem: key[2] for stem, key in found.items()}


def load_split(
    dataset: str, root: str | Path, split: str, video_dir: str | Path | None = None
) -> RetrievalSplit:
    """Load one split from the dataset's published annotation files under ``root``.

    Args:
        dataset: a key of :data:`DATASETS`.
        root: folder holding the annotation files.
        split: a split name of that dataset (e.g. ``"9k"``, ``"1k-A"``, ``"test"``).
        video_dir: folder of ``{video_id}.<ext>`` files; default ``<root>/videos``.

    Raises:
        KeyError: unknown dataset or split.
        AnnotationError: an annotation file is missing or malformed (the message names it).
    """
    if dataset not in DATASETS:
        raise KeyError(f"unknown dataset {dataset!r}; choose from {sorted(DATASETS)}")
    info = DATASETS[dataset]
    if split not in info.splits:
        raise KeyError(f"{dataset} has no split {split!r}; choose from {sorted(info.splits)}")
    root = Path(root)
    video_dir = root / "videos" if video_dir is None else Path(video_dir)
    parsed = info.splits[split](root)

    captions, caption_video = [], []
    for caption, vid in zip(parsed.captions, parsed.caption_video, strict=True):
        caption = caption.strip()
        if caption:
            captions.append(caption)
            caption_video.append(vid)
    num_empty = len(parsed.captions) - len(captions)
    if num_empty:
        log.warning("%s/%s: skipped %d empty caption(s)", dataset, split, num_empty)

    files = _index_videos(video_dir)
    # A missing file keeps its expected name so the decode error names what to look for.
    paths = [files.get(vid, video_dir / f"{vid}.mp4") for vid in parsed.video_ids]
    missing = sum(vid not in files for vid in parsed.video_ids)
    if missing:
        log.warning("%s/%s: %d of %d video files not found under %s",
                    dataset, split, missing, len(paths), video_dir)
    return RetrievalSplit(
        name=f"{dataset}/{split}",
        video_ids=list(parsed.video_ids),
        video_paths=paths,
        segments=[None] * len(parsed.video_ids),
        captions=captions,
        caption_video=caption_video,
        multi_caption=parsed.multi_caption,
        num_empty_captions=num_empty,
    )


def _subset(
    split: RetrievalSplit, videos: np.ndarray, name: str, multi_caption: bool | None
) -> RetrievalSplit:
    """The videos at sorted indices ``videos`` with their captions, re-indexed.

    ``multi_caption=None`` sets the flag from the data (some video has several captions).
    """
    new_index = {int(v): i for i, v in enumerate(videos)}
    keep = [i for i, v in enumerate(split.caption_video) if v in new_index]
    caption_video = [new_index[split.caption_video[i]] for i in keep]
    if multi_caption is None:
        multi_caption = _several_per_video(caption_video, len(videos))
    return replace(
        split,
        name=name,
        video_ids=[split.video_ids[v] for v in videos],
        video_paths=[split.video_paths[v] for v in videos],
        segments=[split.segments[v] for v in videos],
        captions=[split.captions[i] for i in keep],
        caption_video=caption_video,
        multi_caption=multi_caption,
        num_empty_captions=0,
    )


def split_off_validation(
    split: RetrievalSplit, fraction: float, seed: int
) -> tuple[RetrievalSplit, RetrievalSplit]:
    """Hold out ``fraction`` of the VIDEOS (with all their captions) for validation.

    No video appears in both parts. The held-out part is ``multi_caption`` whenever one of
    its videos has several captions (e.g. MSR-VTT's 20), so it is evaluated MSVD-style.

    Returns:
        ``(train, val)``; ``val`` has ``round(fraction * V)`` videos, at least one when
        ``fraction > 0`` and ``train`` keeps at least one.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n = split.num_videos
    n_val = round(fraction * n)
    if fraction > 0:
        n_val = min(max(1, n_val), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    val_videos = np.sort(order[:n_val])
    train_videos = np.sort(order[n_val:])
    return (
        _subset(split, train_videos, f"{split.name}:train", split.multi_caption),
        _subset(split, val_videos, f"{split.name}:val", None),
    )
