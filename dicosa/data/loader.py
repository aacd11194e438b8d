"""PyTorch datasets over a :class:`RetrievalSplit`: training pairs, evaluation videos, captions.

Items are dicts that ``torch.utils.data.default_collate`` batches as is. Decoding happens in
``__getitem__`` (one decord reader per call), so the datasets are cheap to pickle into
DataLoader workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .augment import ClipRandAugment
from .datasets import RetrievalSplit
from .protocol import PAD_COLOURS, pad_colour
from .video import VideoDecodeError, check_videos, load_video

__all__ = ["PAD_COLOURS", "BadVideosError", "TextDataset", "TrainDataset", "VideoDataset"]

log = logging.getLogger(__name__)

Tokenize = Callable[[list[str]], torch.Tensor]

class BadVideosError(VideoDecodeError):
    """Evaluation found unusable videos; ``bad`` lists every one as ``(path, reason)``."""

    def __init__(self, bad: Sequence[tuple[str, str]] | str, split_name: str = "") -> None:
        if isinstance(bad, str):
            # A DataLoader worker's exception is rebuilt in the parent from its message alone.
            self.bad: list[tuple[str, str]] = []
            message = bad
        else:
            self.bad = list(bad)
            lines = "\n".join(f"  {path}: {reason}" for path, reason in self.bad)
            where = f" in {split_name}" if split_name else ""
            message = f"{len(self.bad)} unusable video file(s){where}:\n{lines}"
        RuntimeError.__init__(self, bad, split_name)  # these args make it picklable
        self.path = self.bad[0][0] if self.bad else ""
        self.reason = message

    def __str__(self) -> str:
        return self.reason


class TrainDataset(Dataset):
    """One item per caption: the caption's tokens and frames of its video.

    A video that fails to decode is logged (once per process), added to
    :attr:`bad_videos`, and replaced by another caption-video pair chosen deterministically
    from ``(seed, index, attempt)``. Each item reports in ``"skipped"`` how many
    substitutions it needed: summing that over batches counts failures across DataLoader
    workers, which :attr:`bad_videos` (per process) cannot.

    Frame offsets and the augmentation's draws come from torch's RNG, so
    ``torch.manual_seed`` (and DataLoader's per-worker seeding) makes them reproducible while
    every epoch samples new ones.

    Args:
        sampling, padding: ``data.frame_sampling`` and ``data.frame_padding``.
        augment: ``data.augment``, a timm RandAugment string, or None.
    """

    def __init__(
        self,
        split: RetrievalSplit,
        tokenize: Tokenize,
        num_frames: int,
        image_size: int,
        seed: int = 0,
        max_substitutions: int = 20,
        sampling: str = "segments",
        padding: str = "black",
        augment: str | None = None,
    ) -> None:
        if split.num_captions == 0:
            raise ValueError(f"{split.name} has no captions to train on")
        self.split = split
        self.tokenize = tokenize
        self.num_frames = num_frames
        self.image_size = image_size
        self.seed = seed
        self.max_substitutions = max_substitutions
        self.sampling = sampling
        self.pad_colour = pad_colour(padding)
        self.augment = ClipRandAugment(augment, image_size) if augment else None
        self.bad_videos: set[str] = set()

    def __len__(self) -> int:
        return self.split.num_captions

    def _candidate(self, index: int, attempt: int) -> int:
        if attempt == 0:
            return index
        return int(np.random.default_rng([self.seed, index, attempt]).integers(len(self)))

    def __getitem__(self, index: int) -> dict:
        """Returns ``{"tokens": int64 [L], "frames": uint8 [N, 3, S, S],
        "frame_mask": bool [N], "video_index": int, "skipped": int}``."""
        rng = np.random.default_rng([self.seed, int(torch.randint(2**62, ()).item()), index])
        for attempt in range(self.max_substitutions + 1):
            caption = self._candidate(index, attempt)
            video = self.split.caption_video[caption]
            path = str(self.split.video_paths[video])
            if path in self.bad_videos:
                continue
            try:
                frames, mask = load_video(
                    path, self.num_frames, self.image_size, train=True,
                    segment=self.split.segments[video], rng=rng, sampling=self.sampling,
                    pad_colour=self.pad_colour,
                )
            except VideoDecodeError as exc:
                self.bad_videos.add(path)
                log.warning("skipping unusable training video %s (%s)", exc.path, exc.reason)
                continue
            if self.augment is not None:
                frames = self.augment(frames, mask, seed=int(rng.integers(2**63)))
            return {
                "tokens": self.tokenize([self.split.captions[caption]])[0],
                "frames": frames,
                "frame_mask": mask,
                "video_index": video,
                "skipped": attempt,
            }
        raise RuntimeError(
            f"{self.split.name}: {self.max_substitutions} substitutes for item {index} all "
            "failed to decode; run data_prep/check_videos.py on this split"
        )

    def pop_bad_videos(self) -> set[str]:
        """The bad files seen by this process since the last call, and forget them."""
        bad, self.bad_videos = self.bad_videos, set()
        return bad


class VideoDataset(Dataset):
    """Evaluation videos with deterministic (segment-centre) frames; never substitutes.

    The first unusable file makes the dataset check every file of the split and raise
    :class:`BadVideosError` listing them all, so one run shows the whole repair list.
    """

    def __init__(self, split: RetrievalSplit, num_frames: int, image_size: int,
                 sampling: str = "segments", padding: str = "black") -> None:
        self.split = split
        self.num_frames = num_frames
        self.image_size = image_size
        self.sampling = sampling
        self.pad_colour = pad_colour(padding)

    def __len__(self) -> int:
        return self.split.num_videos

    def check(self, num_workers: int = 0, progress: bool = True) -> None:
        """Raise :class:`BadVideosError` now if any file of the split is unusable."""
        bad = check_videos(self.split.video_paths, num_workers, progress)
        if bad:
            raise BadVideosError(bad, self.split.name)

    def __getitem__(self, index: int) -> dict:
        """Returns ``{"frames": uint8 [N, 3, S, S], "frame_mask": bool [N],
        "video_index": int}``."""
        try:
            frames, mask = load_video(
                self.split.video_paths[index], self.num_frames, self.image_size,
                train=False, segment=self.split.segments[index], sampling=self.sampling,
                pad_colour=self.pad_colour,
            )
        except VideoDecodeError as exc:
            log.error("%s; checking every video of %s", exc, self.split.name)
            # Serial: DataLoader workers may not start processes of their own.
            bad = check_videos(self.split.video_paths, num_workers=0, progress=False)
            if exc.path not in {path for path, _ in bad}:
                bad.insert(0, (exc.path, exc.reason))
            raise BadVideosError(bad, self.split.name) from exc
        return {"frames": frames, "frame_mask": mask, "video_index": index}


class TextDataset(Dataset):
    """Evaluation captions: ``{"tokens": int64 [L], "caption_index": int}``."""

    def __init__(self, split: RetrievalSplit, tokenize: Tokenize) -> None:
        self.split = split
        self.tokenize = tokenize

    def __len__(self) -> int:
        return self.split.num_captions

    def __getitem__(self, index: int) -> dict:
        return {"tokens": self.tokenize([self.split.captions[index]])[0], "caption_index": index}
