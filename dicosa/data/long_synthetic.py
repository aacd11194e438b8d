"""The long-video synthetic benchmark: scenes of :mod:`dicosa.data.synthetic` joined by hard
cuts into long videos, each scene's time range known to the frame.

Layout written by :func:`make_long_synthetic` under ``root``::

    videos/long{n}.mp4        scenes_per_video scenes back to back (hard cuts)
    clips/scene{n}_{j}.mp4    scene j of long{n} alone: the same frames, the reference that
                              indexes the scenes as separate clips
    moments.json              [{video, caption, start, end, clip}], one query per scene:
                              its full caption (every object named); times in seconds
    long_meta.json            settings, the exclusion's source and counts, every scene's
                              objects, background, noise seed and frame range

Scenes come from their own generator stream (``[seed, LONG_STREAM]``), but the scene space
is small (8 colours x 5 shapes x 7 motions per object), so :func:`draw_scene` checks each: its
set of (colour, shape, motion) objects must differ from every training clip's (read from
``synthetic_meta.json``, or replayed from ``make_synthetic``'s seed) and be neither a subset
nor a superset of another scene's, so that a caption naming every object of its scene is true
of no other scene. Rejected draws are counted in ``long_meta.json``. Times follow from frame
counts: scene j of a video starts at (frames before it) / fps, on the decoder's frame times.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..files import write_text_atomic
from .moments import MomentSplit
from .synthetic import (
    _BACKGROUNDS,
    SceneObject,
    _in_processes,
    _pick_codec,
    _write_mp4,
    caption_scene,
    render_clip,
    sample_scene,
)

__all__ = [
    "LONG_STREAM",
    "Scene",
    "draw_scene",
    "load_long_synthetic",
    "make_long_synthetic",
    "replay_synthetic_scene_keys",
    "scene_key",
    "scene_ranges",
    "synthetic_scene_keys",
    "write_scene_video",
]

LONG_STREAM = 0x4C4F4E47  # "LONG": the generator stream of this benchmark's scenes

SceneKey = frozenset[tuple[str, str, str]]


@dataclass(frozen=True)
class Scene:
    """One scene to render: its objects, look, length in frames and full caption."""

    objects: tuple[SceneObject, ...]
    background: tuple[int, int, int]
    noise: float
    seed: int
    num_frames: int
    caption: str

    def render(self, height: int, width: int) -> np.ndarray:
        """uint8 ``[num_frames, height, width, 3]``."""
        return render_clip(list(self.objects), self.num_frames, height, width,
                           self.background, self.noise, self.seed)

    @classmethod
    def from_record(cls, record: dict) -> Scene:
        """The scene :meth:`record` wrote (extra keys ignored)."""
        return cls(tuple(SceneObject(**o) for o in record["objects"]),
                   tuple(record["background"]), float(record["noise"]), int(record["seed"]),
                   int(record["num_frames"]), str(record["caption"]))

    def record(self) -> dict:
        """A JSON-ready dict of the scene."""
        return {"objects": [asdict(o) for o in self.objects], "background": list(self.background),
                "noise": self.noise, "seed": self.seed, "num_frames": self.num_frames,
                "caption": self.caption}


def scene_key(objects: Sequence[SceneObject] | Sequence[dict]) -> SceneKey:
    """The scene's set of (colour, shape, motion): what a caption naming it can tell apart."""
    as_dicts = (o if isinstance(o, dict) else asdict(o) for o in objects)
    return frozenset((o["colour"], o["shape"], o["motion"]) for o in as_dicts)


def synthetic_scene_keys(root: str | Path) -> set[SceneKey]:
    """The scene keys of every clip of a :func:`make_synthetic` folder (its meta file)."""
    path = Path(root) / "synthetic_meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass the folder make_synthetic wrote")
    return {scene_key(clip["objects"]) for clip in json.loads(path.read_text()).values()}


def replay_synthetic_scene_keys(seed: int = 0, num_clips: int = 400) -> set[SceneKey]:
    """The scene keys :func:`make_synthetic` (default scenes) draws for ``seed`` and
    ``num_clips`` clips (train + test), without rendering anything."""
    return {scene_key(sample_scene(np.random.default_rng([seed, n]))) for n in range(num_clips)}


def draw_scene(
    rng: np.random.Generator,
    num_frames: int,
    exclude: set[SceneKey],
    taken: list[SceneKey],
    rejected: dict[str, int],
    max_tries: int = 100_000,
) -> Scene:
    """A scene whose key is not in ``exclude`` and is no subset or superset of any ``taken``
    key; its key is appended to ``taken`` and rejections counted in ``rejected``."""
    for _ in range(max_tries):
        objects = sample_scene(rng)
        key = scene_key(objects)
        if key in exclude:
            rejected["training"] = rejected.get("training", 0) + 1
            continue
        if any(key <= other or other <= key for other in taken):
            rejected["overlap"] = rejected.get("overlap", 0) + 1
            continue
        taken.append(key)
        background = _BACKGROUNDS[int(rng.integers(len(_BACKGROUNDS)))]
        noise = float(rng.choice([0.0, 6.0]))
        caption = caption_scene(objects, rng, 1)[0]
        return Scene(tuple(objects), background, noise, int(rng.integers(2**31)), num_frames,
                     caption)
    raise ValueError(f"no new scene found in {max_tries} draws ({len(taken)} taken, "
                     f"{len(exclude)} excluded): ask for fewer scenes")


def write_scene_video(path: Path, scenes: Sequence[Scene], size: int, fps: int,
                      codec: str) -> list[tuple[float, float]]:
    """Render ``scenes`` back to back into one file; returns each scene's ``(start, end)``
    seconds, from frame counts."""
    frames = np.concatenate([s.render(size, size) for s in scenes])
    _write_mp4(path, frames, fps, codec)
    return scene_ranges([s.num_frames for s in scenes], fps)


def scene_ranges(frame_counts: Sequence[int], fps: int) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of scenes of ``frame_counts`` frames played back to back."""
    bounds = np.cumsum([0, *frame_counts]) / fps
    return [(float(a), float(b)) for a, b in itertools.pairwise(bounds)]


def _write_video_job(job: dict) -> None:
    """One long video and its scenes as separate clips (a process-pool job)."""
    scenes, size, fps, codec = job["scenes"], job["size"], job["fps"], job["codec"]
    root = Path(job["root"])
    write_scene_video(root / "videos" / f"{job['video']}.mp4", scenes, size, fps, codec)
    for clip, scene in zip(job["clips"], scenes, strict=True):
        _write_mp4(root / "clips" / f"{clip}.mp4", scene.render(size, size), fps, codec)


def _frame_counts(rng: np.random.Generator, count: int, seconds: float | tuple[float, float],
                  fps: int) -> list[int]:
    if np.isscalar(seconds):
        lengths = np.full(count, float(seconds))
    else:
        lengths = rng.uniform(*seconds, size=count)
    return [max(2, round(float(s) * fps)) for s in lengths]


def make_long_synthetic(
    root: str | Path,
    num_videos: int = 20,
    scenes_per_video: int = 10,
    scene_seconds: float | tuple[float, float] = 3.0,
    size: int = 32,
    fps: int = 8,
    seed: int = 0,
    exclude_root: str | Path | None = None,
    exclude_seed: int = 0,
    exclude_clips: int = 400,
    num_workers: int | None = None,
    codec: str = "auto",
) -> Path:
    """Write the long-video benchmark under ``root`` (layout: the module docstring).

    Args:
        root: output folder (created).
        num_videos, scenes_per_video: videos, and scenes joined into each.
        scene_seconds: a scene's length, or ``(low, high)`` drawn per scene; rounded to whole
            frames (at least 2).
        size: frame height and width in pixels (even; the synthetic config's model takes 32).
        fps: frame rate of every file.
        seed: everything (scenes, captions, noise) follows from it.
        exclude_root: the :func:`make_synthetic` folder the model trained on; its clips'
            scenes are excluded. Without it the scenes of ``make_synthetic(seed=exclude_seed,
            num_train + num_test = exclude_clips)`` are replayed and excluded (the defaults
            are ``make_synthetic``'s).
        num_workers: processes writing videos; default ``os.cpu_count()``, <= 1 in-process.
        codec: ``"libx264"``, ``"mpeg4"`` or ``"auto"``.

    Returns:
        ``root`` as a Path.
    """
    if size % 2:
        raise ValueError("yuv420p needs an even frame size")
    if num_videos < 1 or scenes_per_video < 1:
        raise ValueError("num_videos and scenes_per_video must be >= 1")
    root = Path(root)
    for sub in ("videos", "clips"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if exclude_root is not None:
        exclude, source = synthetic_scene_keys(exclude_root), str(exclude_root)
    else:
        exclude = replay_synthetic_scene_keys(exclude_seed, exclude_clips)
        source = f"make_synthetic(seed={exclude_seed}) clips 0..{exclude_clips - 1}, replayed"
    codec = _pick_codec(codec)
    rng = np.random.default_rng([seed, LONG_STREAM])
    taken: list[SceneKey] = []
    rejected: dict[str, int] = {"training": 0, "overlap": 0}
    jobs, moments, videos = [], [], {}
    for n in range(num_videos):
        counts = _frame_counts(rng, scenes_per_video, scene_seconds, fps)
        scenes = [draw_scene(rng, c, exclude, taken, rejected) for c in counts]
        video, clips = f"long{n}", [f"scene{n}_{j}" for j in range(scenes_per_video)]
        records = []
        for j, (scene, (start, end)) in enumerate(zip(scenes, scene_ranges(counts, fps),
                                                      strict=True)):
            moments.append({"video": video, "caption": scene.caption, "start": start,
                            "end": end, "clip": clips[j]})
            records.append({"clip": clips[j], "start": start, "end": end, **scene.record()})
        videos[video] = {"duration": records[-1]["end"], "scenes": records}
        jobs.append({"root": str(root), "video": video, "clips": clips, "scenes": scenes,
                     "size": size, "fps": fps, "codec": codec})
    _in_processes(_write_video_job, jobs, num_workers)
    meta = {"settings": {"num_videos": num_videos, "scenes_per_video": scenes_per_video,
                         "scene_seconds": scene_seconds, "size": size, "fps": fps, "seed": seed,
                         "codec": codec},
            "exclude": {"source": source, "num_scene_keys": len(exclude)},
            "rejected_draws": rejected, "videos": videos}
    write_text_atomic(root / "long_meta.json", json.dumps(meta, indent=1))
    write_text_atomic(root / "moments.json", json.dumps(moments, indent=1))
    return root


def load_long_synthetic(root: str | Path, as_clips: bool = False) -> MomentSplit:
    """The benchmark's queries as a :class:`MomentSplit`.

    Args:
        root: a folder :func:`make_long_synthetic` wrote.
        as_clips: the reference: videos are the separate scene clips (``clips/``) and each
            query's range is its whole clip, so VCMR R@k at any tIoU is "the right clip in
            the top k".
    """
    root = Path(root)
    path = root / "moments.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: write the benchmark with "
                                "data_prep/make_long_synthetic.py")
    moments = json.loads(path.read_text())
    key, folder = ("clip", "clips") if as_clips else ("video", "videos")
    video_ids = list(dict.fromkeys(m[key] for m in moments))
    index = {v: i for i, v in enumerate(video_ids)}
    durations: dict[str, float] = {}
    ranges = []
    for m in moments:
        start, end = (0.0, m["end"] - m["start"]) if as_clips else (m["start"], m["end"])
        durations[m[key]] = max(durations.get(m[key], 0.0), end)
        ranges.append(((start, end),))
    return MomentSplit(
        name=f"long_synthetic/{'clips' if as_clips else 'videos'}",
        video_ids=video_ids,
        video_paths=[root / folder / f"{v}.mp4" for v in video_ids],
        durations=[durations[v] for v in video_ids],
        captions=[m["caption"] for m in moments],
        caption_video=[index[m[key]] for m in moments],
        ranges=ranges,
        annotation_ids=[m["clip"] for m in moments],
    )
