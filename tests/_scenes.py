"""Tiny scenes of coloured shapes as DiCoSA features, for the concepts head and exclusion.

An object ("red circle") is a fixed vector (its colour's plus its shape's, normalised); a
frame is the sum of the objects visible in it plus noise; a caption's text vector is the sum
of the objects it names. :func:`scorer_model` is a DiCoSA whose score is the cosine of a text
with the video's pooled frames (one factor, no projection, no confidence MLP), so its scores
on these features mean what the scenes say regardless of its random weights.
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F

from dicosa.heads.features import SplitFeatures
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures

from .conftest import tiny_config

DIM = 64  # the tiny model's width
COLOURS = ("red", "blue", "green", "white")
SHAPES = ("circle", "square", "cross")
OBJECTS = [f"{c} {s}" for c, s in itertools.product(COLOURS, SHAPES)]


@functools.cache
def object_vectors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    parts = {w: torch.randn(DIM, generator=g) for w in COLOURS + SHAPES}
    return {o: F.normalize(parts[o.split()[0]] + parts[o.split()[1]], dim=0) for o in OBJECTS}


def article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def text_vectors(objects_per_text: list[list[str]], noise: float = 0.05,
                 seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vectors = object_vectors()
    text = torch.stack([sum(vectors[o] for o in objects) for objects in objects_per_text])
    return text + noise * torch.randn(text.shape, generator=g)


def video(objects: list[str], frames: int = 4, visible: dict[str, list[int]] | None = None,
          noise: float = 0.05, seed: int = 0) -> torch.Tensor:
    """``[frames, D]``: each object in every frame, or only in ``visible[object]``."""
    g = torch.Generator().manual_seed(seed)
    vectors = object_vectors()
    out = noise * torch.randn(frames, DIM, generator=g)
    for o in objects:
        for i in (visible or {}).get(o, range(frames)):
            out[i] += vectors[o]
    return out


def random_scenes(num_videos: int, seed: int) -> list[list[str]]:
    """1-2 objects of distinct colours per video."""
    g = torch.Generator().manual_seed(seed)
    scenes = []
    for _ in range(num_videos):
        count = int(torch.randint(1, 3, (1,), generator=g))
        colours = [COLOURS[i] for i in torch.randperm(len(COLOURS), generator=g)[:count]]
        scenes.append([f"{c} {SHAPES[int(torch.randint(len(SHAPES), (1,), generator=g))]}"
                       for c in colours])
    return scenes


def split(scenes: list[list[str]], videos: list[torch.Tensor], seed: int,
          name: str = "toy") -> SplitFeatures:
    """Features of ``videos``; captions: every object alone, and all of them together."""
    captions, caption_video, named = [], [], []
    for v, objects in enumerate(scenes):
        subsets = [[o] for o in objects] + ([objects] if len(objects) > 1 else [])
        for subset in subsets:
            captions.append(" and ".join(article(o) for o in subset) + " move")
            caption_video.append(v)
            named.append(subset)
    frames = torch.stack(videos)
    return SplitFeatures(name, captions, torch.tensor(caption_video),
                         TextFeatures(text_vectors(named, seed=seed)),
                         VideoFeatures(frames, torch.ones(frames.shape[:2], dtype=torch.bool)),
                         [f"{name}{v}" for v in range(len(scenes))])


def scene_features(num_videos: int, seed: int) -> SplitFeatures:
    scenes = random_scenes(num_videos, seed)
    return split(scenes, [video(s, seed=seed * 1000 + i) for i, s in enumerate(scenes)], seed,
                 name=f"toy:{seed}")


@functools.cache
def scorer_model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config(use_factors=False)).eval()


@functools.cache
def trained_head():
    """A concepts head trained on 48 scenes (validated on 24 others), shared by the tests."""
    from dicosa.heads.concepts import ConceptCodesHead
    from dicosa.heads.features import HeadData

    data = HeadData(scene_features(48, seed=0), scene_features(24, seed=1))
    config = ConceptCodesHead.make_config({"dim": 64, "top_k": 8, "spine_steps": 300,
                                           "steps": 300, "batch_size": 16})
    return data, ConceptCodesHead.fit(scorer_model(), data, config, seed=0, progress=False)
