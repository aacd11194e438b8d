"""RandAugment on training clips: timm's ops, the same draws for every frame of one clip.

The released code augments training frames with RandAugment ``rand-m7-n4-mstd0.5-inc1``.
A video's frames must change together (one rotation, one colour shift for the whole clip),
so :class:`ClipRandAugment` replays one sequence of random draws for each frame: timm's
RandAugment draws its ops from numpy's global generator and their probabilities,
magnitudes, signs and resampling filters from Python's ``random``, so both are seeded with
the clip's seed before every frame and restored afterwards (the caller's streams are
untouched). The seed comes from the training item's generator, so a clip's augmentation is
a function of ``(seed, epoch, index)`` like its frame offsets.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image
from timm.data.auto_augment import rand_augment_transform

__all__ = ["RELEASED_AUGMENT", "ClipRandAugment"]

RELEASED_AUGMENT = "rand-m7-n4-mstd0.5-inc1"


class ClipRandAugment:
    """``(frames uint8 [N, 3, S, S], mask bool [N], seed) -> frames``: RandAugment with one
    set of random choices per clip, applied to the real frames (``mask``) only.

    Args:
        config: a timm RandAugment string (``rand-m7-n4-mstd0.5-inc1``).
        image_size: S; translations are up to 45% of it, as timm sets them for its own
            training transforms.
    """

    def __init__(self, config: str = RELEASED_AUGMENT, image_size: int = 224):
        hparams = {"translate_const": int(image_size * 0.45),
                   "interpolation": Image.Resampling.BICUBIC}
        try:
            self.transform = rand_augment_transform(config, hparams)
        except (AssertionError, ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"data.augment {config!r} is not a RandAugment string timm "
                             f"accepts ({exc or type(exc).__name__})") from None
        self.config = config

    def __repr__(self) -> str:
        return f"ClipRandAugment({self.config!r})"

    def __call__(self, frames: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
        if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3:
            raise ValueError(f"frames must be uint8 [N, 3, S, S], got {frames.dtype} "
                             f"{tuple(frames.shape)}")
        out = frames.clone()
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            for i in torch.nonzero(mask).flatten().tolist():
                random.seed(seed)
                np.random.seed(seed % 2**32)
                image = Image.fromarray(frames[i].permute(1, 2, 0).numpy())
                augmented = np.asarray(self.transform(image), dtype=np.uint8)
                out[i] = torch.from_numpy(augmented.copy()).permute(2, 0, 1)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        return out
