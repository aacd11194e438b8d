"""Incomplete galleries: titles, undecodable videos and lost frames, made deterministically.

Real collections come with titles, some videos will not decode, others lose stretches of
frames. :func:`incomplete_gallery` draws such a gallery from a benchmark whose videos have
several captions (the synthetic benchmark's ``synthetic_meta.json`` lists them all): each
video's title is one of its *other* captions (never the query) with a fraction of its words
dropped; chosen videos lose their title, their video (text-only: indexed from the title
alone), or a fraction of their frames. Everything follows from ``seed``.

:func:`apply_gallery` turns the plan into features: undecodable videos have no frames; a
corrupted video's frames are either replaced by frames of pure noise that the decoder does
not notice (``corruption="noise"``: the model sees garbage) or are lost and masked out
(``corruption="lost"``: the index keeps the decodable frames and flags the fraction lost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..model import VideoFeatures

__all__ = ["IncompleteGallery", "apply_gallery", "incomplete_gallery", "mask_words", "words"]

Corruption = Literal["none", "noise", "lost", "undecodable", "mixed"]


def words(text: str) -> list[str]:
    """Lower-case alphabetic words, in order (the vocabulary unit of Mul2vec's tensor)."""
    return re.findall(r"[a-z]+", text.lower())


def mask_words(text: str, fraction: float, rng: np.random.Generator) -> str:
    """``text`` with ``round(fraction * n)`` of its n words dropped (at least one kept)."""
    tokens = words(text)
    drop = min(round(fraction * len(tokens)), max(len(tokens) - 1, 0))
    gone = set(rng.choice(len(tokens), size=drop, replace=False).tolist()) if drop else set()
    return " ".join(w for i, w in enumerate(tokens) if i not in gone)


@dataclass(frozen=True)
class IncompleteGallery:
    """What is known about each gallery video ``[V]``."""

    titles: list[str]  # "" where the title is missing
    text_only: np.ndarray  # bool [V]: the video does not decode; only its title is indexed
    frames_lost: np.ndarray  # float32 [V]: fraction of frames corrupted (0 for intact ones)
    corruption: str  # how corrupted frames look: "noise" (unnoticed) or "lost" (masked)
    title_source: list[int]  # [V] which caption each title was made from

    @property
    def has_title(self) -> np.ndarray:
        return np.array([bool(t) for t in self.titles])

    @property
    def flagged_lost(self) -> np.ndarray:
        """The fraction lost as an index would record it: noise frames go unnoticed."""
        return self.frames_lost if self.corruption == "lost" else np.zeros_like(self.frames_lost)


def incomplete_gallery(captions: list[list[str]], query_caption: list[int], *, seed: int,
                       title_mask: float = 0.2, missing_titles: float = 0.0,
                       corrupt: float = 0.0, corruption: Corruption = "none",
                       frames_lost: float = 0.5) -> IncompleteGallery:
    """Titles and damage for ``V`` videos.

    Args:
        captions: every caption of each video (``[V]`` lists, at least two each).
        query_caption: ``[V]`` the caption used as the query; the title is another one.
        seed: everything below is a function of it.
        title_mask: fraction of a title's words dropped.
        missing_titles: fraction of videos without a title.
        corrupt: fraction of videos damaged as ``corruption`` says ("undecodable": no video,
            never chosen among the untitled ones so that every video keeps something;
            "mixed": half of them undecodable, half with noise frames).
        frames_lost: fraction of a damaged video's frames that are noise or lost.
    """
    rng = np.random.default_rng(seed)
    num = len(captions)
    titles, sources = [], []
    for caps, query in zip(captions, query_caption, strict=True):
        others = [i for i in range(len(caps)) if i != query]
        if not others:
            raise ValueError("every video needs a caption besides its query to make a title")
        sources.append(others[int(rng.integers(len(others)))])
        titles.append(mask_words(caps[sources[-1]], title_mask, rng))
    order = rng.permutation(num)
    untitled = order[:round(missing_titles * num)]
    for i in untitled:
        titles[i] = ""
    # Damage falls on titled videos first so an undecodable video keeps its title.
    titled = [i for i in rng.permutation(num) if i not in set(untitled.tolist())]
    damaged = titled[:round(corrupt * num)]
    text_only = np.zeros(num, dtype=bool)
    lost = np.zeros(num, dtype=np.float32)
    if corruption == "mixed":
        half = len(damaged) // 2
        text_only[damaged[:half]] = True
        lost[damaged[half:]] = frames_lost
        corruption = "noise"
    elif corruption == "undecodable":
        text_only[damaged] = True
    elif corruption in ("noise", "lost"):
        lost[damaged] = frames_lost
    return IncompleteGallery(titles, text_only, lost, corruption, sources)


def apply_gallery(video: VideoFeatures, gallery: IncompleteGallery,
                  noise: VideoFeatures | None, *, seed: int) -> VideoFeatures:
    """The features an index would hold for ``gallery``'s videos ``[V, N, D]``.

    Text-only videos keep their rows but have every frame masked (callers must not score
    them with DiCoSA). Corrupted frames (a random subset per video, at least one frame kept
    intact) are replaced by ``noise``'s frames ("noise") or masked out ("lost").

    The noise is applied after the temporal transformer (the frozen encoder's output for
    a clip of pure noise frames): an approximation of re-encoding the damaged clip.
    """
    rng = np.random.default_rng(seed)
    frames, mask = video.frames.clone(), video.frame_mask.clone()
    for i in np.flatnonzero(gallery.frames_lost > 0):
        valid = np.flatnonzero(mask[i].numpy())
        count = min(round(float(gallery.frames_lost[i]) * len(valid)), len(valid) - 1)
        hit = torch.as_tensor(rng.choice(valid, size=count, replace=False), dtype=torch.long)
        if gallery.corruption == "noise":
            if noise is None:
                raise ValueError("corruption='noise' needs the features of a noise clip")
            source = noise.frames[int(rng.integers(len(noise)))]  # [N, D]
            frames[i, hit] = source[hit]
        else:
            mask[i, hit] = False
    mask[torch.as_tensor(gallery.text_only)] = False
    return VideoFeatures(frames, mask)
