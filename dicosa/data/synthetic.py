"""A small synthetic text-video benchmark in the exact MSR-VTT file layout.

Each clip shows 1-3 large, saturated objects, each with a colour, a shape and a motion, on a
dark plain or slightly noisy background. Captions name all objects or a subset of them
("a red circle moves left while a blue square grows"), so matching is compositional
(colour x shape), temporal (the motion) and partial (a caption may ignore an object).
Everything follows from ``seed``. The layout is the one :func:`load_split` reads for
``"msrvtt"``::

    root/MSRVTT_train.9k.csv        video_id column: the training videos
    root/MSRVTT_data.json           {"videos": [...], "sentences": [{video_id, caption}]}
    root/MSRVTT_JSFUSION_test.csv   key,vid_key,video_id,sentence: the test queries
    root/videos/video{n}.mp4
    root/synthetic_meta.json        the objects of every clip (not part of MSR-VTT)
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import av
import numpy as np

__all__ = ["COLOURS", "MOTIONS", "SHAPES", "SceneObject", "caption_scene", "make_synthetic",
           "render_clip", "sample_scene"]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 25),
    "green": (30, 200, 40),
    "blue": (35, 75, 245),
    "yellow": (245, 225, 20),
    "white": (245, 245, 245),
    "purple": (160, 40, 215),
    "orange": (250, 130, 10),
    "cyan": (20, 220, 230),
}
SHAPES = ("square", "circle", "triangle", "diamond", "cross")
MOTIONS = ("left", "right", "up", "down", "still", "growing", "shrinking")

# Dark backgrounds so every colour (white included) stands out.
_BACKGROUNDS = ((0, 0, 0), (30, 30, 30), (50, 50, 55), (25, 30, 20))
# Object size as a fraction of the short side: about a quarter of the frame's width.
_SIZE, _SIZE_SMALL, _SIZE_LARGE = 0.3, 0.15, 0.45
_TRAVEL = 0.45  # how far a moving object's centre travels over the clip
_LANES = (0.22, 0.5, 0.78)  # objects sit in different rows/columns to limit overlap

_VERBS = {
    "left": ("moves left", "moves to the left", "slides left", "goes left"),
    "right": ("moves right", "moves to the right", "slides right", "goes right"),
    "up": ("moves up", "rises", "goes up", "moves upward"),
    "down": ("moves down", "falls", "goes down", "moves downward"),
    "still": ("stays still", "does not move", "stays in place", "is still"),
    "growing": ("grows", "gets bigger", "is growing", "expands"),
    "shrinking": ("shrinks", "gets smaller", "is shrinking", "contracts"),
}


@dataclass(frozen=True)
class SceneObject:
    """One object of a clip; positions are fractions of the frame (x right, y down)."""

    colour: str
    shape: str
    motion: str
    x: float
    y: float


def sample_scene(rng: np.random.Generator, max_objects: int = 3) -> list[SceneObject]:
    """1..max_objects objects with distinct colours, each in its own lane."""
    count = int(rng.integers(1, max_objects + 1))
    colours = rng.choice(list(COLOURS), size=count, replace=False)
    lanes = rng.permutation(len(_LANES))[:count]
    cross_lanes = rng.permutation(len(_LANES))[:count]
    objects = []
    for colour, lane, cross in zip(colours, lanes, cross_lanes, strict=True):
        motion = str(rng.choice(MOTIONS))
        jitter = rng.uniform(-0.04, 0.04, size=2)
        if motion in ("left", "right"):
            # Start on the side opposite the motion so the whole move stays in frame.
            x = 0.5 + (_TRAVEL / 2 if motion == "left" else -_TRAVEL / 2)
            y = _LANES[lane]
        elif motion in ("up", "down"):
            x = _LANES[lane]
            y = 0.5 + (_TRAVEL / 2 if motion == "up" else -_TRAVEL / 2)
        else:
            x, y = _LANES[lane], _LANES[cross]
        objects.append(SceneObject(str(colour), str(rng.choice(SHAPES)), motion,
                                   float(x + jitter[0]), float(y + jitter[1])))
    return objects


def _state(obj: SceneObject, t: float) -> tuple[float, float, float]:
    """(x, y, size) of ``obj`` at time ``t`` in [0, 1]."""
    x, y, size = obj.x, obj.y, _SIZE
    step = _TRAVEL * t
    if obj.motion == "left":
        x -= step
    elif obj.motion == "right":
        x += step
    elif obj.motion == "up":
        y -= step
    elif obj.motion == "down":
        y += step
    elif obj.motion == "growing":
        size = _SIZE_SMALL + (_SIZE_LARGE - _SIZE_SMALL) * t
    elif obj.motion == "shrinking":
        size = _SIZE_LARGE - (_SIZE_LARGE - _SIZE_SMALL) * t
    return x, y, size


def _shape_mask(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    """Pixels inside ``shape`` of half-size ``r``; dx, dy are offsets from its centre."""
    if shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape == "triangle":  # apex up: half-width grows linearly from top to bottom
        return (np.abs(dy) <= r) & (np.abs(dx) <= (dy + r) / 2)
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= r
    if shape == "cross":
        arm = r / 2.5
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= r)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= r))
    raise ValueError(f"unknown shape {shape!r}")


def render_clip(
    objects: list[SceneObject],
    num_frames: int,
    height: int,
    width: int,
    background: tuple[int, int, int],
    noise: float,
    seed: int,
) -> np.ndarray:
    """uint8 ``[T, H, W, 3]`` frames of the scene; ``noise`` is the background's pixel std."""
    rng = np.random.default_rng(seed)
    short = min(height, width)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for i in range(num_frames):
        t = i / max(1, num_frames - 1)
        img = np.empty((height, width, 3), dtype=np.float32)
        img[:] = background
        if noise > 0:
            img += rng.normal(0.0, noise, size=(height, width, 1)).astype(np.float32)
        for obj in objects:
            x, y, size = _state(obj, t)
            inside = _shape_mask(obj.shape, xx - x * width, yy - y * height, size * short / 2)
            img[inside] = COLOURS[obj.colour]
        frames[i] = np.clip(img, 0, 255).astype(np.uint8)
    return frames


def _phrase(obj: SceneObject, verb: int) -> str:
    article = "an" if obj.colour[0] in "aeiou" else "a"
    return f"{article} {obj.colour} {obj.shape} {_VERBS[obj.motion][verb]}"


def _join(phrases: list[str], use_while: bool) -> str:
    if len(phrases) == 1:
        return phrases[0]
    head = ", ".join(phrases[:-1])
    return f"{head} {'while' if use_while else 'and'} {phrases[-1]}"


def caption_scene(
    objects: list[SceneObject], rng: np.random.Generator, num_captions: int
) -> list[str]:
    """``num_captions`` distinct captions; the first names every object, the others a
    random non-empty subset in random order and wording (partial matches)."""
    captions = [_join([_phrase(o, 0) for o in objects], use_while=False)]
    for _ in range(50 * num_captions):
        if len(captions) == num_captions:
            break
        k = int(rng.integers(1, len(objects) + 1))
        chosen = [objects[j] for j in rng.permutation(len(objects))[:k]]
        phrases = [_phrase(o, int(rng.integers(len(_VERBS[o.motion])))) for o in chosen]
        caption = _join(phrases, use_while=bool(rng.integers(2)))
        if caption not in captions:
            captions.append(caption)
    return captions


def _pick_codec(codec: str) -> str:
    if codec != "auto":
        return codec
    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def _write_mp4(path: Path, frames: np.ndarray, fps: int, codec: str) -> None:
    """Write frames atomically: a crash never leaves a half-written ``path`` behind."""
    tmp = path.with_name(f".{path.name}.partial.mp4")
    height, width = frames.shape[1:3]
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.thread_count = 1  # the pool already uses every core
        if codec == "libx264":
            stream.options = {"crf": "18", "preset": "veryfast"}
        else:
            stream.codec_context.qmax = 4  # keep colours saturated at low resolution
        for img in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        container.mux(stream.encode())
    os.replace(tmp, path)


def _render_job(job: dict) -> None:
    objects = [SceneObject(**o) for o in job["objects"]]
    frames = render_clip(objects, job["num_frames"], job["height"], job["width"],
                         tuple(job["background"]), job["noise"], job["seed"])
    _write_mp4(Path(job["path"]), frames, job["fps"], job["codec"])


def make_synthetic(
    root: str | Path,
    num_train: int = 300,
    num_test: int = 100,
    size: int = 64,
    seed: int = 0,
    fps: int = 8,
    seconds: float | tuple[float, float] = 2.5,
    width: int | None = None,
    captions_per_video: tuple[int, int] = (3, 5),
    test_captions: Literal["first", "all"] = "first",
    num_workers: int | None = None,
    codec: str = "auto",
    scenes: Callable[[np.random.Generator], list[SceneObject]] = sample_scene,
) -> Path:
    """Write the synthetic benchmark under ``root`` (see the module docstring for the layout).

    Args:
        root: output folder (created).
        num_train, num_test: clips in each split; ids are ``video0..`` train then test.
        size: frame height in pixels (even); also the width unless ``width`` is given.
        seed: everything (scenes, captions, noise) is a function of it.
        fps: frame rate of the files.
        seconds: clip length, or a ``(low, high)`` range drawn per clip.
        captions_per_video: inclusive range of captions per clip.
        test_captions: test queries per test clip: ``"first"`` (the full caption, one query
            per video as in MSR-VTT 1k-A) or ``"all"`` (multi-caption evaluation).
        num_workers: processes encoding clips; default ``os.cpu_count()``.
        codec: ``"libx264"``, ``"mpeg4"`` or ``"auto"`` (libx264 when available).
        scenes: draws one clip's objects from the clip's generator (default
            :func:`sample_scene`: independent objects); a benchmark passes its own to make
            objects co-occur (``benchmarks/exclusion.py``'s frequent-B split).

    Returns:
        ``root`` as a Path.
    """
    width = size if width is None else width
    if size % 2 or width % 2:
        raise ValueError("yuv420p needs even frame sizes")
    root = Path(root)
    video_dir = root / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    codec = _pick_codec(codec)
    total = num_train + num_test

    jobs, videos, sentences, meta = [], [], [], {}
    for n in range(total):
        rng = np.random.default_rng([seed, n])
        vid = f"video{n}"
        objects = scenes(rng)
        length = seconds if np.isscalar(seconds) else rng.uniform(*seconds)
        num_frames = max(2, round(float(length) * fps))
        background = _BACKGROUNDS[int(rng.integers(len(_BACKGROUNDS)))]
        noise = float(rng.choice([0.0, 6.0]))
        lo, hi = captions_per_video
        captions = caption_scene(objects, rng, int(rng.integers(lo, hi + 1)))
        split = "train" if n < num_train else "test"
        videos.append({"video_id": vid, "id": n, "split": split, "category": 0})
        sentences.extend({"caption": c, "video_id": vid, "sen_id": len(sentences) + i}
                         for i, c in enumerate(captions))
        meta[vid] = {"objects": [asdict(o) for o in objects], "captions": captions,
                     "background": list(background), "noise": noise, "num_frames": num_frames}
        jobs.append({"path": str(video_dir / f"{vid}.mp4"), "objects": meta[vid]["objects"],
                     "num_frames": num_frames, "height": size, "width": width,
                     "background": background, "noise": noise, "seed": int(rng.integers(2**31)),
                     "fps": fps, "codec": codec})

    _in_processes(_render_job, jobs, num_workers)
    _write_annotations(root, videos, sentences, meta, num_train, test_captions, seed)
    return root


def _in_processes(work: Callable[[dict], None], jobs: list[dict],
                  num_workers: int | None) -> None:
    """``work(job)`` for every job, in ``num_workers`` processes (None: one per core; one
    worker, or one job, in this process)."""
    workers = min((os.cpu_count() or 1) if num_workers is None else num_workers, len(jobs))
    if workers <= 1:
        for job in jobs:
            work(job)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, jobs, chunksize=max(1, len(jobs) // (workers * 4))))


def _write_annotations(root: Path, videos: list[dict], sentences: list[dict], meta: dict,
                       num_train: int, test_captions: str, seed: int) -> None:
    """MSR-VTT's annotation files for the clips (the first ``num_train`` are the training
    split), and the scenes behind them (``synthetic_meta.json``)."""
    with (root / "MSRVTT_train.9k.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["video_id"])
        writer.writerows([v["video_id"]] for v in videos[:num_train])
    with (root / "MSRVTT_JSFUSION_test.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["key", "vid_key", "video_id", "sentence"])
        for v in videos[num_train:]:
            caps = meta[v["video_id"]]["captions"]
            for c in caps if test_captions == "all" else caps[:1]:
                writer.writerow([f"ret{v['id']}", f"msr{v['id']}", v["video_id"], c])
    (root / "MSRVTT_data.json").write_text(json.dumps(
        {"info": {"description": f"dicosa synthetic benchmark, seed {seed}"},
         "videos": videos, "sentences": sentences}))
    (root / "synthetic_meta.json").write_text(json.dumps(meta))
