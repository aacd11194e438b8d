"""Test helpers: a small DiDeMo-format sample, the published files' layout with generated videos.

:func:`write_didemo_sample` writes what ``docs/DATA.md`` asks of a DiDeMo root::

    <root>/train_data.json  test_data.json   [{annotation_id, description, video, times,
                                               download_link, num_segments}]
    <root>/train_list.txt   test_list.txt    the videos' names, as in the JSON
    <root>/videos/<id>.mp4                   the JSON names end in .mov, as DiDeMo's do
    <root>/didemo_sample_meta.json           per video: duration and each scene's segments,
                                             seconds, objects (not part of DiDeMo)

Each video is cut into DiDeMo's 5-s segments and shows a few scenes of
:mod:`dicosa.data.synthetic`, each covering whole segments; each scene has one description (its
full caption) and four annotators' ``times``: three mark the scene's segments, the fourth one
segment more or less, as real annotators disagree. Durations cycle through 30 s (six full
segments), 27.5 s (a short last segment) and 22 s (five segments).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dicosa.data.long_synthetic import SceneKey, draw_scene, write_scene_video
from dicosa.data.moments import DIDEMO_SEGMENT_SECONDS
from dicosa.data.synthetic import _pick_codec
from dicosa.files import write_text_atomic

__all__ = ["SAMPLE_DURATIONS", "write_didemo_sample"]

SAMPLE_DURATIONS = (30.0, 27.5, 22.0)
_SCENES_PER_VIDEO = 3


def _segment_frames(duration: float, fps: int) -> list[int]:
    """Frames of each 5-s segment of a ``duration``-s video (the last one may be shorter)."""
    count = math.ceil(duration / DIDEMO_SEGMENT_SECONDS)
    return [round(min(DIDEMO_SEGMENT_SECONDS, duration - DIDEMO_SEGMENT_SECONDS * k) * fps)
            for k in range(count)]


def _annotator_times(first: int, last: int, num_segments: int,
                     rng: np.random.Generator) -> list[list[int]]:
    """Four annotators: three agree on ``[first, last]``, one is a segment off at one end."""
    options = [[first, last + 1]] if last + 1 < num_segments else []
    options += [[first - 1, last]] if first > 0 else []
    options += [[first + 1, last]] if first < last else []
    odd = options[int(rng.integers(len(options)))] if options else [first, last]
    times = [[first, last]] * 3 + [odd]
    return [times[i] for i in rng.permutation(4)]


def _write_video(root: Path, name: str, duration: float, rng: np.random.Generator,
                 taken: list[SceneKey], size: int, fps: int, codec: str,
                 next_id: int) -> tuple[list[dict], dict]:
    """One video's file, its annotation entries and its meta record."""
    frames = _segment_frames(duration, fps)
    cuts = np.sort(rng.choice(np.arange(1, len(frames)), _SCENES_PER_VIDEO - 1, replace=False))
    groups = np.split(np.arange(len(frames)), cuts)  # segments of each scene
    scenes = [draw_scene(rng, sum(frames[k] for k in g), set(), taken, {}) for g in groups]
    seconds = write_scene_video(root / "videos" / f"{Path(name).stem}.mp4", scenes, size, fps,
                                codec)
    entries, records = [], []
    for i, (scene, group, span) in enumerate(zip(scenes, groups, seconds, strict=True)):
        first, last = int(group[0]), int(group[-1])
        entries.append({"annotation_id": next_id + i, "description": scene.caption,
                        "video": name, "times": _annotator_times(first, last, len(frames), rng),
                        "download_link": "", "num_segments": len(frames)})
        records.append({"segments": [first, last], "start": span[0], "end": span[1],
                        **scene.record()})
    return entries, {"duration": duration, "num_segments": len(frames), "scenes": records}


def write_didemo_sample(
    root: str | Path,
    num_train: int = 3,
    num_test: int = 3,
    seed: int = 0,
    size: int = 32,
    fps: int = 2,
    codec: str = "auto",
) -> Path:
    """Write the sample under ``root`` (layout: the module docstring); returns ``root``.

    Args:
        num_train, num_test: videos of each split.
        seed: everything follows from it.
        size: frame height and width (even).
        fps: frame rate; it must make every segment a whole number of frames (2 does).
    """
    if any(abs(f * fps - round(f * fps)) > 1e-9 for f in (*SAMPLE_DURATIONS, 5.0)):
        raise ValueError(f"fps {fps} does not give whole frames for every segment")
    root = Path(root)
    (root / "videos").mkdir(parents=True, exist_ok=True)
    codec = _pick_codec(codec)
    rng = np.random.default_rng([seed, 0xD1DE])
    taken: list[SceneKey] = []
    meta: dict[str, dict] = {}
    next_id = 0
    for split, count in (("train", num_train), ("test", num_test)):
        entries, names = [], []
        for n in range(count):
            name = f"{1000 + len(meta)}@N00_{seed}{n}_{split}.mov"
            duration = SAMPLE_DURATIONS[len(meta) % len(SAMPLE_DURATIONS)]
            video_entries, meta[Path(name).stem] = _write_video(
                root, name, duration, rng, taken, size, fps, codec, next_id)
            entries += video_entries
            next_id += len(video_entries)
            names.append(name)
        write_text_atomic(root / f"{split}_data.json", json.dumps(entries, indent=1))
        write_text_atomic(root / f"{split}_list.txt", "".join(f"{v}\n" for v in names))
    write_text_atomic(root / "didemo_sample_meta.json", json.dumps(meta, indent=1))
    return root
