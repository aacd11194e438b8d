"""The encoding side of ingest: decoded items into what the store keeps.

:class:`Encoder` takes the items :class:`~dicosa.index.decode.VideoItems` yields and gives back
one encoded video per file, in the order of the file list:

- a clip (N frames) is encoded whole, with up to ``batch_size`` other clips
  (:meth:`DiCoSA.encode_video`);
- a long video's frames are encoded by the image tower as their batches arrive
  (:meth:`DiCoSA.encode_frames`); when its last batch is in, its run is cut into shots and
  segments (:mod:`dicosa.data.segments`), the temporal transformer runs over each shot's
  chunks of at most N frames (:meth:`DiCoSA.contextualise`), and the video becomes a
  :class:`~dicosa.search.shards.VideoRun`.

With segments every video becomes a ``VideoRun`` (a clip is a run of N frame slots, padding
included, with one segment); without, a clip stays ``(frames [N, D], mask [N], row)`` for a
``clips`` shard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy, layout_run
from ..model import DiCoSA, VideoFeatures
from ..search.shards import VideoRun

__all__ = ["Clip", "Encoder", "clips_as_features"]

log = logging.getLogger("dicosa.index.ingest")

_CHUNKS_PER_FORWARD = 256  # temporal-transformer chunks contextualised at once


@dataclass
class Clip:
    """A video encoded as one clip, for a ``clips`` shard."""

    frames: torch.Tensor  # float16 [N, D]
    mask: torch.Tensor  # bool [N]
    row: dict


def clips_as_features(clips: list[Clip]) -> tuple[VideoFeatures, list[dict]]:
    """Encoded clips as one ``clips`` shard's input: stacked features and their rows."""
    return (VideoFeatures(torch.stack([c.frames for c in clips]),
                          torch.stack([c.mask for c in clips])), [c.row for c in clips])


@dataclass
class _Streaming:
    """A long video whose frames are still arriving: image-tower vectors and times so far."""

    features: list[torch.Tensor] = field(default_factory=list)  # float32 [b, D] each
    times: list[np.ndarray] = field(default_factory=list)


class Encoder:
    """See the module docstring. Feed :meth:`take`; read :meth:`ready` (in file order)."""

    def __init__(self, model: DiCoSA, device: torch.device, frames: FrameProtocol,
                 segments: SegmentPolicy | None, batch_size: int = 16):
        self.model = model
        self.device = device
        self.frames = frames
        self.segments = segments
        self.batch_size = batch_size
        self.skipped: list[tuple[str, str]] = []  # (path, reason)
        self.text_only: list[tuple[str, str]] = []
        self.partial: list[tuple[str, str]] = []  # (path, what its decode lost)
        self._clips: list[dict] = []
        self._open: dict[int, _Streaming] = {}
        self._done: dict[int, Clip | VideoRun | None] = {}
        self._next = 0
        self._pad: np.ndarray | None = None

    # -- items ----------------------------------------------------------------------------
    @torch.inference_mode()
    def take(self, item: dict) -> None:
        kind, seq = item["kind"], item["seq"]
        if kind == "error":
            log.warning("skipping %s: %s", item["path"], item["reason"])
            self.skipped.append((item["path"], item["reason"]))
            self._done[seq] = None
        elif kind == "clip":
            if "text_only" in item:
                log.warning("indexing %s from its title alone: %s", item["path"],
                            item["text_only"])
                self.text_only.append((item["path"], item["text_only"]))
            else:
                self._partial(item)
            self._clips.append(item)
            if len(self._clips) >= self.batch_size:
                self.flush()
        elif kind == "frames":
            state = self._open.setdefault(seq, _Streaming())
            images = item["frames"].to(self.device, non_blocking=True)
            state.features.append(self.model.encode_frames(images).float().cpu())
            state.times.append(np.asarray(item["times"], dtype=np.float64))
        elif kind == "end":
            self._partial(item)
            self._done[seq] = self._finish(self._open.pop(seq, _Streaming()), item)
        else:
            raise ValueError(f"unknown ingest item {kind!r}")

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode the clips waiting for a full batch."""
        if not self._clips:
            return
        items, self._clips = self._clips, []
        for item, clip in zip(items, self._encode_clips(items), strict=True):
            self._done[item["seq"]] = self._as_run(clip, item) if self.segments else clip

    def ready(self) -> list[Clip | VideoRun]:
        """The encoded videos that come next in file order (skipped files left out)."""
        out = []
        while self._next in self._done:
            encoded = self._done.pop(self._next)
            self._next += 1
            if encoded is not None:
                out.append(encoded)
        return out

    @property
    def frames_waiting(self) -> int:
        """Frames encoded and not yet handed on (a measure of what an interrupt loses)."""
        return sum(len(r.frames) if isinstance(r, VideoRun) else 1
                   for r in self._done.values() if r is not None)

    # -- clips ----------------------------------------------------------------------------
    def _encode_clips(self, items: list[dict]) -> list[Clip | None]:
        """Each clip's per-frame features (float16, CPU), or None where they are not finite.
        A text-only clip has no frame to encode: zeros and an empty mask."""
        frames = torch.stack([it["frames"] for it in items]).to(self.device, non_blocking=True)
        mask = torch.stack([it["frame_mask"] for it in items]).to(self.device)
        seen = mask.any(dim=1)
        out = torch.zeros(*mask.shape, self.model.embed_dim, device=self.device)
        if seen.any():
            out[seen] = self.model.encode_video(frames[seen], mask[seen]).frames.float()
        out, mask = out.to("cpu", torch.float16), mask.cpu()
        clips = []
        for i, item in enumerate(items):
            if not torch.isfinite(out[i][mask[i]].float()).all():
                self._non_finite(item["path"])
                clips.append(None)
            else:
                clips.append(Clip(out[i], mask[i], item["row"]))
        return clips

    def _as_run(self, clip: Clip | None, item: dict) -> VideoRun | None:
        """A clip as a run of N frame slots with one segment, [0, duration]."""
        if clip is None:
            return None
        times = item.get("times")
        num = clip.mask.shape[0]
        duration = float(clip.row.get("duration") or np.nan)
        return VideoRun(clip.frames.numpy(), clip.mask.numpy(),
                        np.full(num, np.nan) if times is None else np.asarray(times),
                        np.array([[0, num]]), np.array([[0.0 if duration == duration else
                                                         np.nan, duration]]), clip.row)

    def _non_finite(self, path: str) -> None:
        log.warning("skipping %s: the model gave non-finite features", path)
        self.skipped.append((path, "non-finite features"))

    # -- long videos ----------------------------------------------------------------------
    def _finish(self, state: _Streaming, item: dict) -> VideoRun | None:
        """A streamed video's run: shots, chunks through the temporal transformer, segments."""
        report, row, policy = item["report"], item["row"], self.segments
        path = item["path"]
        features = torch.cat(state.features)  # [F, D]
        times = np.concatenate(state.times)  # [F]
        if report.detector_error:
            log.warning("%s: %s; cut into windows alone", path, report.detector_error)
        layout = layout_run(times, report.cuts, report.holes, policy, row["duration"],
                            report.cut_changes)
        frames = self._contextualise(features, layout.chunks)  # [F, D]
        if not torch.isfinite(frames).all():
            self._non_finite(path)
            return None
        return VideoRun(frames.to(torch.float16).numpy(), np.ones(len(times), dtype=bool),
                        times.astype(np.float32), layout.segments,
                        layout.spans.astype(np.float32), row)

    def _contextualise(self, features: torch.Tensor, chunks: np.ndarray) -> torch.Tensor:
        """The temporal transformer over each chunk ``(first, count)`` of the run, padded to N
        slots with the image tower's vector of a padding frame (as a short clip is)."""
        num = self.segments.window
        slot = torch.arange(num)
        out = torch.empty_like(features)
        pad = self._padding_frame()
        for start in range(0, len(chunks), _CHUNKS_PER_FORWARD):
            part = torch.from_numpy(chunks[start:start + _CHUNKS_PER_FORWARD])  # [c, 2]
            mask = slot[None] < part[:, 1:2]  # [c, N]
            positions = (part[:, :1] + slot[None]).clamp(max=len(features) - 1)  # [c, N]
            clips = torch.where(mask[..., None], features[positions], pad)  # [c, N, D]
            encoded = self.model.contextualise(clips.to(self.device), mask.to(self.device))
            out[positions[mask]] = encoded.frames.float().cpu()[mask]
        return out

    def _padding_frame(self) -> torch.Tensor:
        """The image tower's vector of a frame of the padding colour: [D]."""
        size = self.model.image_size
        colour = torch.tensor(self.frames.pad_colour, dtype=torch.uint8).view(1, 3, 1, 1)
        image = colour.expand(1, 3, size, size).to(self.device)
        return self.model.encode_frames(image)[0].float().cpu()

    @torch.inference_mode()
    def pad(self) -> np.ndarray:
        """What fills the slots of a segment under N frames: the model's vector of a padding
        frame, contextualised alone (float16 [D])."""
        if self._pad is None:
            frame = self._padding_frame().to(self.device)[None, None]  # [1, 1, D]
            alone = torch.ones(1, 1, dtype=torch.bool, device=self.device)
            self._pad = (self.model.contextualise(frame, alone).frames[0, 0]
                         .to("cpu", torch.float16).numpy())
        return self._pad

    def _partial(self, item: dict) -> None:
        """Log and list a video whose decode lost part of it (its row's ``damage``)."""
        damage = item["row"].get("damage")
        if damage:
            log.warning("%s is partial: %s; indexed the rest", item["path"], damage)
            self.partial.append((item["path"], damage))
