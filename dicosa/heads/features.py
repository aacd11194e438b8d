"""The frozen features heads learn from: each split encoded once by DiCoSA, cached on disk.

Heads never run the encoders while training. :func:`head_data` encodes the training split
(minus the validation videos that DiCoSA's own training held out, carved the same way) and
that validation split, through the evaluation feature cache, so a second head trained on
the same checkpoint reads the features back instead of decoding videos again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..clip import get_tokenizer
from ..config import Config
from ..data.datasets import RetrievalSplit, load_split, split_off_validation
from ..data.protocol import FrameProtocol
from ..fingerprint import model_fingerprint
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["HeadData", "SplitFeatures", "head_data", "split_features", "text_vectors"]

log = logging.getLogger(__name__)

FEATURES_VERSION = 1


@dataclass
class SplitFeatures:
    """One split's captions and videos as the frozen model encodes them.

    Attributes:
        name: the split's name (``"synthetic/9k:train"``).
        captions: ``[C]`` caption strings.
        caption_video: ``[C]`` long, the video each caption describes.
        text: T ``[C, D]`` float32.
        video: per-frame features ``[V, N, D]`` float32 and their mask.
        video_paths: ``[V]`` the files, for reports.
    """

    name: str
    captions: list[str]
    caption_video: Tensor
    text: TextFeatures
    video: VideoFeatures
    video_paths: list[str]

    @property
    def num_videos(self) -> int:
        return len(self.video)

    @functools.cached_property
    def _captions_of(self) -> list[list[int]]:
        by_video = [[] for _ in range(self.num_videos)]
        for c, v in enumerate(self.caption_video.tolist()):
            by_video[v].append(c)
        return by_video

    def one_caption_each(self, videos: Tensor, generator: torch.Generator) -> Tensor:
        """A random caption of each of ``videos [B]``: ``[B]`` long."""
        return torch.tensor([c[int(torch.randint(len(c), (1,), generator=generator))]
                             for c in (self._captions_of[v] for v in videos.tolist())])


@dataclass
class HeadData:
    """What :meth:`Head.fit` receives: training features, and validation features for
    choosing hyper-parameters or stopping (never the test split)."""

    train: SplitFeatures
    val: SplitFeatures | None


def split_features(model: DiCoSA, split: RetrievalSplit, *, frames: FrameProtocol,
                   cache_dir: str | Path | None, batch_size: int = 64, num_workers: int = 0,
                   device: torch.device | str = "cpu", progress: bool = False) -> SplitFeatures:
    """Encode ``split`` with the frozen ``model`` (float32, CPU), reading and filling the
    feature cache in ``cache_dir`` (None: no cache).

    ``frames`` is the model's frame protocol (``FrameProtocol.of(cfg.data)`` of its
    checkpoint's config): a head must learn from the frames the model is evaluated and
    indexed on. There is no default, so that no caller falls back to another protocol.
    """
    from ..evaluation import (
        FeatureCache,
        _captions_fingerprint,
        _split_fingerprint,
        encode_texts,
        encode_videos,
    )

    device = torch.device(device)
    cache = FeatureCache(Path(cache_dir) if cache_dir is not None else None)
    # The protocol is in the key: features of another protocol are recomputed, not read.
    base = {"version": FEATURES_VERSION, "weights": model_fingerprint(model)["weights_sha256"],
            "model": dataclasses.asdict(model.config), "precision": "no",
            "device": device.type, "frames": frames.as_dict()}
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    texts = cache.get("head-text", dict(base, captions=_captions_fingerprint(split.captions)),
                      lambda: {"text": encode_texts(model, split.captions, tokenize, batch_size,
                                                    device, progress=progress).text})

    def videos() -> dict[str, Tensor]:
        v = encode_videos(model, split, batch_size, num_workers, device, progress=progress,
                          sampling=frames.sampling, padding=frames.padding)
        return {"frames": v.frames, "frame_mask": v.frame_mask}

    stored = cache.get("head-video", dict(base, videos=_split_fingerprint(split)), videos)
    return SplitFeatures(split.name, list(split.captions),
                         torch.tensor(split.caption_video, dtype=torch.long),
                         TextFeatures(texts["text"]),
                         VideoFeatures(stored["frames"], stored["frame_mask"]),
                         [str(p) for p in split.video_paths])


def head_data(model: DiCoSA, cfg: Config, *, cache_dir: str | Path | None,
              device: torch.device | str = "cpu", progress: bool = False) -> HeadData:
    """The training split of ``cfg.data`` minus its validation videos, and those videos.

    The validation part is carved with ``data.val_fraction`` and ``train.seed`` exactly as
    :func:`dicosa.training.training_splits` carves it, so the videos that chose DiCoSA's
    checkpoint are also the only ones that choose a head's hyper-parameters. Videos are
    decoded with ``data.frame_sampling``/``data.frame_padding``, as the model was evaluated.
    """
    data = cfg.data
    split = load_split(data.dataset, data.root, data.train_split, data.video_dir)
    val = None
    if data.val_fraction > 0:
        split, val = split_off_validation(split, data.val_fraction, cfg.train.seed)
    common = {"frames": FrameProtocol.of(data), "cache_dir": cache_dir,
              "batch_size": cfg.eval.batch_size,
              "num_workers": data.num_workers, "device": device, "progress": progress}
    return HeadData(split_features(model, split, **common),
                    split_features(model, val, **common) if val is not None else None)


@torch.no_grad()
def text_vectors(model: DiCoSA, texts: list[str], batch_size: int = 256) -> Tensor:
    """T ``[len(texts), D]`` of ``texts`` through the frozen text tower (float32, CPU)."""
    from ..evaluation import encode_texts

    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    device = next(model.parameters()).device
    return encode_texts(model, texts, tokenize, batch_size, device).text
