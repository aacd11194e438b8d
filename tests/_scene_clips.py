"""A served collection for the browser tests: scenes of coloured shapes, as real VP9 clips.

Each scene of ``_scenes.py`` is both a video file and its DiCoSA features: the file is 4 s at
10 fps of the scene's objects drawn on a dark background (the objects visible in stored frame
s are drawn in frames 10s .. 10s + 9, so the frame the ``segments`` protocol picks for slot s,
10s + 5, shows them), and the features are the scene's object vectors. The model reads a
query as the sum of the objects it names ("a red circle"), so DiCoSA's scores, the concepts
head (for "A without B") and a VDR lexical head (for words) all mean what the scenes show.
"""

from __future__ import annotations

import re
from pathlib import Path

import av
import numpy as np
import torch

from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, TextFeatures

from ._scenes import (
    COLOURS,
    OBJECTS,
    SHAPES,
    random_scenes,
    scene_features,
    split,
    text_vectors,
    trained_head,
)
from ._scenes import video as scene_video
from .conftest import tiny_config

A, B = "red circle", "blue square"
FPS, SECONDS, SLOTS = 10, 4, 4
WIDTH, HEIGHT = 128, 80
RGB = {"red": (220, 50, 50), "blue": (50, 90, 230), "green": (40, 180, 70),
       "white": (235, 235, 235)}
_OBJECT = re.compile(r"\b(" + "|".join(COLOURS) + r")\s+(" + "|".join(SHAPES) + r")s?\b",
                     re.IGNORECASE)


def tokenize(texts: list[str]) -> torch.Tensor:
    """``[B, len(OBJECTS)]`` counts of the objects each text names."""
    out = torch.zeros(len(texts), len(OBJECTS), dtype=torch.long)
    for row, text in enumerate(texts):
        for colour, shape in _OBJECT.findall(text):
            out[row, OBJECTS.index(f"{colour.lower()} {shape.lower()}")] += 1
    return out


def lookup_model() -> DiCoSA:
    """The scenes' scorer (same weights as the heads were trained on) reading a text as the
    sum of the object vectors it names."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(use_factors=False)).eval()
    table = text_vectors([[o] for o in OBJECTS], noise=0.0)  # [objects, D]
    model.encode_text = lambda tokens: TextFeatures(tokens.cpu().float() @ table)
    return model


def collection() -> tuple[list[list[str]], dict[int, dict[str, list[int]]]]:
    """A with other things (0-3), A with B throughout (4-5) or in frame 0 only (6-7), and
    scenes without A (as tests/test_exclusion_search.py)."""
    others = ["green cross", "white cross", "green circle", "white circle"]
    scenes = ([[A, o] for o in others] + [[A, B]] * 4
              + [s for s in random_scenes(30, seed=5) if A not in s])
    return scenes, {6: {B: [0]}, 7: {B: [0]}}


def draw(objects: list[str], visible: dict[str, list[int]] | None, slot: int) -> np.ndarray:
    """One RGB frame ``[HEIGHT, WIDTH, 3]`` of stored slot ``slot``'s visible objects."""
    image = np.full((HEIGHT, WIDTH, 3), 28, dtype=np.uint8)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    for place, name in enumerate(objects):
        if slot not in (visible or {}).get(name, range(SLOTS)):
            continue
        colour, shape = name.split()
        cx, cy, r = WIDTH * (place + 1) // (len(objects) + 1), HEIGHT // 2, HEIGHT // 4
        if shape == "circle":
            inside = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
        elif shape == "square":
            inside = (abs(x - cx) <= r) & (abs(y - cy) <= r)
        else:  # cross
            inside = (((abs(x - cx) <= r // 3) & (abs(y - cy) <= r))
                      | ((abs(y - cy) <= r // 3) & (abs(x - cx) <= r)))
        image[inside] = RGB[colour]
    return image


def write_clip(path: Path, objects: list[str], visible: dict | None) -> Path:
    """VP9 in WebM (what Chromium plays), FPS x SECONDS frames."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libvpx-vp9", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"deadline": "realtime", "cpu-used": "8", "crf": "30", "b:v": "0"}
        for i in range(FPS * SECONDS):
            frame = av.VideoFrame.from_ndarray(draw(objects, visible, i // FPS), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def scene_index(folder: Path) -> tuple[VideoIndex, list[list[str]]]:
    """The collection's clips in ``folder`` and an in-memory index of their features with
    the concepts and lexical plugins attached: ``(index, scenes)``."""
    from dicosa.heads.features import HeadData
    from dicosa.heads.lexical import VDRConfig, VDRHead
    from dicosa.plugins.exclusion import attach_exclusion
    from dicosa.plugins.lexical import attach_lexical
    from dicosa.search.exclusion import ExclusionConfig

    scenes, visible = collection()
    features = split(scenes, [scene_video(s, visible=visible.get(i), seed=100 + i)
                              for i, s in enumerate(scenes)], seed=3).video
    rows = []
    for i, objects in enumerate(scenes):
        path = write_clip(folder / f"scene{i:02d}-{'-'.join(o.replace(' ', '_') for o in objects)}"
                          ".webm", objects, visible.get(i))
        rows.append({"path": str(path), "duration": float(SECONDS), "fps": float(FPS),
                     "num_frames": FPS * SECONDS, "valid_frames": SLOTS,
                     "title": " and ".join(objects)})
    model = lookup_model()
    index = VideoIndex(model, tokenizer=tokenize, backend="exact")
    index.add_features(type(features)(features.frames.half(), features.frame_mask), rows)
    config = ExclusionConfig(top_k_results=5, mass_fraction=0.5, candidates=12, window=1,
                             presence_threshold=0.5)
    attach_exclusion(index, trained_head()[1], config)
    words = HeadData(scene_features(48, seed=0), scene_features(24, seed=1))
    head = VDRHead.fit(model, words, VDRConfig(distractors=20, epochs=60, video_k=6),
                       progress=False)
    attach_lexical(index, head)
    return index, scenes


def write_long(path: Path, scenes: list[list[str]], seconds: int = 3) -> Path:
    """One VP9 video of ``scenes`` one after another, ``seconds`` each (hard cuts)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libvpx-vp9", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"deadline": "realtime", "cpu-used": "8", "crf": "30", "b:v": "0"}
        for objects in scenes:
            for _ in range(FPS * seconds):
                frame = av.VideoFrame.from_ndarray(draw(objects, None, 0), format="rgb24")
                container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def long_index(folder: Path, videos: list[list[list[str]]], seconds: int = 3) -> VideoIndex:
    """An in-memory index of long videos, each a list of scenes (``seconds`` each), stored as
    an index with segments stores them: frames at 1 frame/s (each the scene's object vectors),
    one segment per scene."""
    from dicosa.search.shards import VideoRun

    runs = []
    for v, scenes in enumerate(videos):
        path = write_long(folder / f"long{v}.webm", scenes, seconds)
        frames = torch.cat([scene_video(s, frames=seconds, seed=200 + 20 * v + i)
                            for i, s in enumerate(scenes)]).half().numpy()  # [F, D]
        count = len(scenes) * seconds
        starts = np.arange(0, count, seconds)
        runs.append(VideoRun(frames, np.ones(count, bool), np.arange(count, dtype=np.float32),
                             np.stack([starts, np.full(len(scenes), seconds)], 1),
                             np.stack([starts, starts + seconds], 1).astype(np.float32),
                             {"path": str(path), "duration": float(count), "fps": float(FPS),
                              "num_frames": FPS * count, "valid_frames": count}))
    index = VideoIndex(lookup_model(), tokenizer=tokenize, backend="exact")
    index.add_runs(runs, np.zeros(runs[0].frames.shape[1], np.float16))
    return index
