"""The moment: where in a video a query matches, from DiCoSA's own pooling (Eq. 1).

Before it compares concepts, DiCoSA pools a video's frames under the query with the weights
a_i = softmax_i(Tᵀ f_i / τ) (Eq. 1, :func:`dicosa.functional.matched_pooling_weights`): they
say which stored frames the score rests on. With each stored frame's time in the video they
give a relevance timeline and the best moment (the frame of largest weight).

Frame times. The N stored frames of a row are the frames the index's frame protocol picked
when the video was decoded (:mod:`dicosa.data.video`: ``segments`` takes the centre frame of N
equal segments, ``released`` N evenly spaced among the frames at 1 fps), decoded frames first
and padding after. :func:`frame_times` picks them again from what the decoder saw of the file
(the row's ``num_frames`` and ``fps``, :func:`~dicosa.data.video.video_info`), with the same
functions, so an index that did not record the times still has them; a frame's time is its
index over the frame rate (constant-rate streams starting at 0, which is what the decoders
assume too). It cannot say for a row whose decode lost frames (``frames_lost`` > 0: which
ones is not recorded), a text-only row, a row without a frame count or rate, or a row whose
stored frames are not the picks (a mask that disagrees): every time is NaN there, as it is
for padded frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..data.protocol import FrameProtocol
from ..data.video import sample_indices, sample_indices_released
from ..functional import matched_pooling_weights
from ..model import DiCoSA, VideoFeatures

__all__ = ["Moment", "frame_times", "frame_weights", "moments", "row_frame_times"]


@torch.inference_mode()
def frame_weights(model: DiCoSA, text: Tensor, video: VideoFeatures) -> Tensor:
    """Eq. 1's weight of each stored frame of video i under text i: ``[n, N]`` float32.

    Args:
        model: gives τ (``pool_temperature``) and how padded frames are masked (its
            ``mask_mode``: ``"before"`` renormalises over the valid frames, ``"after"`` keeps
            the softmax over all N, as the released code does), so the weights are exactly
            those :meth:`DiCoSA.score` pools with.
        text: ``[n, D]`` or ``[1, D]`` (one query for every video) raw text vectors T.
        video: ``frames [n, N, D]`` (float16 from the store is fine) and ``frame_mask [n, N]``.
    """
    frames = video.frames.to(text.device, torch.float32)
    mask = video.frame_mask.to(text.device)
    text = text.float().expand(len(frames), -1)
    weights = matched_pooling_weights(text, frames, mask, model.config.pool_temperature,
                                      model.mask_mode)  # [n, N]
    return weights.masked_fill(~mask, 0.0).cpu()


def row_frame_times(sampling: str, slots: int, num_frames: object, fps: object,
                    valid: int, frames_lost: object = 0.0) -> np.ndarray:
    """The times in seconds of the ``slots`` stored frames of one video: float64 ``[slots]``,
    NaN for padding and wherever the picks cannot be recomputed (module docstring).

    Args:
        sampling: the index's ``frame_sampling`` (``"segments"`` or ``"released"``).
        slots: N, frames stored per video.
        num_frames, fps: the row's frames in the file and frame rate (as the store's metadata
            holds them: numbers, or empty/NaN when unknown).
        valid: the stored frames that are real (the frame mask's count).
        frames_lost: the row's fraction of picked frames that did not decode.
    """
    times = np.full(slots, np.nan)
    total, rate, lost = _number(num_frames), _number(fps), _number(frames_lost)
    if total is None or rate is None or total < 1 or rate <= 0 or (lost or 0.0) > 0:
        return times
    total = int(total)
    if sampling == "released":
        picked = sample_indices_released(total, slots, rate)
    else:  # evaluation sampling: the segment centres, as indexing decodes
        picked = sample_indices(total, slots, train=False)
    if len(picked) != valid or valid > slots:
        return times  # the stored frames are not these picks: say nothing rather than lie
    times[:valid] = picked / rate
    return times


def frame_times(frames: FrameProtocol, slots: int, rows: pd.DataFrame,
                frame_mask: Tensor | np.ndarray) -> np.ndarray:
    """:func:`row_frame_times` of each row of the store's metadata ``rows`` (in order) whose
    stored frames have ``frame_mask [n, N]``: float64 ``[n, N]``."""
    mask = np.asarray(frame_mask, dtype=bool)
    out = np.full((len(rows), slots), np.nan)
    columns = zip(rows["num_frames"].tolist(), rows["fps"].tolist(),
                  rows["frames_lost"].tolist(), strict=True)
    for i, (total, rate, lost) in enumerate(columns):
        out[i] = row_frame_times(frames.sampling, slots, total, rate, int(mask[i].sum()), lost)
    return out


@dataclass(frozen=True)
class Moment:
    """One video's relevance timeline under a query and its best moment."""

    weights: list[float]  # [N] Eq. 1 weight per stored frame (0 for padding)
    times: list[float | None]  # [N] seconds into the video; None: padding or unknown
    best_frame: int  # the stored frame of largest weight
    best_time: float | None  # its time (None: unknown)
    best_weight: float

    def as_dict(self) -> dict:
        return {"frames": [{"frame": j, "time": t, "weight": w} for j, (t, w)
                           in enumerate(zip(self.times, self.weights, strict=True))],
                "best": {"frame": self.best_frame, "time": self.best_time,
                         "weight": self.best_weight}}


def moments(weights: Tensor, times: np.ndarray, frame_mask: Tensor) -> list[Moment | None]:
    """Each video's :class:`Moment` from its weights ``[n, N]`` and frame times ``[n, N]``;
    None for a video without a valid frame (indexed from its title alone)."""
    out: list[Moment | None] = []
    mask = np.asarray(frame_mask, dtype=bool)
    for w, t, m in zip(weights.tolist(), times.tolist(), mask, strict=True):
        if not m.any():
            out.append(None)
            continue
        best = max(np.flatnonzero(m).tolist(), key=lambda j: w[j])  # ties: the earliest
        clean = [None if math.isnan(x) else round(x, 4) for x in t]
        out.append(Moment([round(x, 6) for x in w], clean, best, clean[best], round(w[best], 6)))
    return out


def _number(value: object) -> float | None:
    """A metadata cell as a finite number (None: empty, NaN or not a number)."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
