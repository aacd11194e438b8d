"""Moments: where in a video a query matches, from DiCoSA's own scores and pooling (Eq. 1).

A **moment** is a time range of a video with a score: a row of the index (a segment of a long
video, or the whole of a short one, :mod:`dicosa.data.segments`) that the query scored.
:func:`best_moments` picks a video's best few that do not overlap.

A **timeline** says, frame by frame over the whole video, how well it matches: each frame
gets the DiCoSA score S of the best row that holds it and its weight in that row's pooling,
a_i = softmax_i(Tᵀ f_i / τ) (Eq. 1, :func:`dicosa.functional.matched_pooling_weights`): the
frames the score rests on (:func:`video_timeline`).

Frame times. A long video's rows keep their frames' times as the decoder gave them (the store's
``frame_time``). A video decoded as N frames (a short one, or any video of an index without
segments) keeps the frames the index's frame protocol picked (:mod:`dicosa.data.video`:
``segments`` takes the centre frame of N equal segments, ``released`` N evenly spaced among the
frames at 1 fps), decoded frames first and padding after; where the store has no times for
them, :func:`frame_times` picks them again from what the decoder saw of the file (the row's
``num_frames`` and ``fps``, :func:`~dicosa.data.video.video_info`) with the same functions. A
frame's time is then its index over the frame rate (constant-rate streams starting at 0, which
is what the decoders assume too). That cannot say for a row whose decode lost frames
(``frames_lost`` > 0: which ones is not recorded), a text-only row, a row without a frame count
or rate, or a row whose stored frames are not the picks (a mask that disagrees): every time is
NaN there, as it is for padded frames.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..data.protocol import FrameProtocol
from ..data.video import sample_indices, sample_indices_released
from ..functional import matched_pooling_weights
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["Moment", "Timeline", "best_moments", "format_span", "frame_times", "frame_weights",
           "overlaps",
           "row_frame_times", "timelines", "video_timeline", "video_timelines"]


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


def frame_times(frames: FrameProtocol, slots: int, rows: pd.DataFrame | dict,
                frame_mask: Tensor | np.ndarray, stored: np.ndarray | None = None
                ) -> np.ndarray:
    """The time of each frame slot of the store's rows ``rows`` (metadata in order: a table,
    or :meth:`FrameStore.columns` of ``num_frames``, ``fps`` and ``frames_lost``) whose
    stored frames have ``frame_mask [n, N]``: float64 ``[n, N]``. ``stored`` [n, N]: the
    times the store keeps (:meth:`FrameStore.times`), used where a row has any; the others
    are :func:`row_frame_times`."""
    mask = np.asarray(frame_mask, dtype=bool)
    out = np.full((len(mask), slots), np.nan)
    columns = zip(rows["num_frames"].tolist(), rows["fps"].tolist(),
                  rows["frames_lost"].tolist(), strict=True)
    for i, (total, rate, lost) in enumerate(columns):
        if stored is not None and not np.isnan(stored[i]).all():
            out[i] = stored[i]
        else:
            out[i] = row_frame_times(frames.sampling, slots, total, rate, int(mask[i].sum()),
                                     lost)
    return out


@dataclass(frozen=True)
class Moment:
    """A time range of a video and how well it matched the query."""

    start: float | None  # seconds into the video (None: unknown)
    end: float | None
    score: float  # the row's ranking score (DiCoSA's S after any rerank hooks)
    row: int  # the store row (segment) it is

    def as_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "score": self.score, "row": self.row}


def best_moments(rows: np.ndarray, spans: np.ndarray, scores: np.ndarray,
                 limit: int = 3) -> list[Moment]:
    """A video's best ``limit`` moments that do not overlap, best first.

    Args:
        rows: int64 ``[m]`` the video's scored rows.
        spans: ``[m, 2]`` their ``[start, end]`` seconds (NaN: unknown).
        scores: ``[m]`` their scores (``-inf``/NaN: not scored).
    """
    order = np.argsort(-np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf),
                       kind="stable")
    picked: list[Moment] = []
    for i in order.tolist():
        score = float(scores[i])
        if not math.isfinite(score) or len(picked) == limit:
            break
        moment = Moment(*(_clean(x) for x in spans[i]), score, int(rows[i]))
        if not overlaps(moment, picked):
            picked.append(moment)
    return picked


def overlaps(moment: Moment, others: list[Moment]) -> bool:
    """Whether ``moment`` shares time with any of ``others`` (unknown times share none)."""
    if moment.start is None or moment.end is None:
        return False
    return any(m.start is not None and m.end is not None and moment.start < m.end
               and m.start < moment.end for m in others)


@dataclass(frozen=True)
class Timeline:
    """A video's relevance, frame by frame (module docstring), and its best frame."""

    times: list[float | None]  # [F] seconds (None: unknown)
    weights: list[float]  # [F] Eq. 1 weight of the frame in its best row
    scores: list[float]  # [F] DiCoSA's S of the best row holding the frame
    best_frame: int  # the frame of largest weight within the best row
    best_time: float | None
    best_weight: float
    moments: list[Moment]  # the video's best rows that do not overlap, by S

    def as_dict(self, max_points: int | None = None) -> dict:
        """JSON of the timeline; with ``max_points``, a longer one keeps in each of that many
        equal stretches of frames only its most relevant frame (highest score, then weight),
        so the best frame is always there."""
        frames = range(len(self.times))
        if max_points is not None and len(self.times) > max_points:
            edges = np.linspace(0, len(self.times), max_points + 1).astype(int)
            frames = [max(range(a, b), key=self._relevance)
                      for a, b in itertools.pairwise(edges) if b > a]
        return {"frames": [{"frame": j, "time": self.times[j], "weight": self.weights[j],
                            "score": self.scores[j]} for j in frames],
                "best": {"frame": self.best_frame, "time": self.best_time,
                         "weight": self.best_weight},
                "moments": [m.as_dict() for m in self.moments]}

    def _relevance(self, j: int) -> tuple[float, float]:
        score = self.scores[j]
        return (-math.inf if score is None else score, self.weights[j])


def timelines(weights: Tensor, times: np.ndarray, frame_mask: Tensor,
              scores: Tensor | np.ndarray | None = None) -> list[Timeline | None]:
    """The :class:`Timeline` of rows that are whole videos (one row each), from their
    weights ``[n, N]``, frame times ``[n, N]`` and DiCoSA scores ``[n]``; None for a row
    without a valid frame (indexed from its title alone)."""
    mask = np.asarray(frame_mask, dtype=bool)
    scores = np.full(len(mask), np.nan) if scores is None else np.asarray(scores, np.float64)
    out: list[Timeline | None] = []
    for w, t, m, s in zip(np.asarray(weights), np.asarray(times), mask, scores, strict=True):
        out.append(_timeline(w, t, m, np.full(len(w), s), np.array([]), np.zeros((0, 2)),
                             np.array([])))
    return out


def _timeline(weights: np.ndarray, times: np.ndarray, mask: np.ndarray, scores: np.ndarray,
              rows: np.ndarray, spans: np.ndarray, row_scores: np.ndarray) -> Timeline | None:
    """A timeline of frames ``[F]`` (weights, times, valid mask, per-frame score)."""
    if not mask.any():
        return None
    valid = np.flatnonzero(mask)
    best_score = np.nanmax(np.where(mask, scores, -np.inf)) if np.isfinite(
        np.where(mask, scores, np.nan)).any() else np.nan
    in_best = valid if not np.isfinite(best_score) else valid[scores[valid] == best_score]
    best = int(in_best[np.argmax(weights[in_best])])  # ties: the earliest
    clean = [_clean(x) for x in times]
    return Timeline(clean, [round(float(x), 6) for x in weights],
                    [round(float(x), 6) if math.isfinite(x) else None for x in scores],
                    best, clean[best], round(float(weights[best]), 6),
                    best_moments(rows, spans, row_scores))


def video_timeline(model: DiCoSA, store, protocol: FrameProtocol, text: Tensor,
                   video: int) -> Timeline | None:
    """The timeline of video ``video`` (its id in ``store``) under the text vector
    ``text [1, D]`` (:func:`video_timelines` of one video)."""
    return video_timelines(model, store, protocol, text, [video])[0]


@torch.inference_mode()
def video_timelines(model: DiCoSA, store, protocol: FrameProtocol, text: Tensor,
                    videos: list[int]) -> list[Timeline | None]:
    """The timelines of ``videos`` (ids in ``store``) under the text vector ``text [1, D]``:
    every row of each video scored by DiCoSA and pooled (Eq. 1), each frame given the score
    of the best row holding it and its weight there. The rows of all the videos are read and
    scored together."""
    from .rerank import pair_scores

    per_video = [store.video_rows(v) for v in videos]
    rows = np.concatenate([np.zeros(0, np.int64), *per_video])
    if not len(rows):
        return [None] * len(videos)
    dtype = next(model.parameters()).dtype
    features = store.gather(rows, dtype)  # [R, N, D]
    text = text.to(next(model.parameters()).device, dtype)
    weights = frame_weights(model, text, features).numpy()  # [R, N]
    one = torch.zeros(len(rows), dtype=torch.int64, device=text.device)
    scored = pair_scores(model, TextFeatures(text), features.to(text.device, dtype),
                         pairs=one).cpu().numpy()  # [R]
    mask = features.frame_mask.numpy()
    metadata = store.columns(rows, ("num_frames", "fps", "frames_lost"))
    times = frame_times(protocol, mask.shape[1], metadata, mask,
                        stored=store.times(rows))  # [R, N]
    spans = store.spans(rows)
    out, first = [], 0
    for video, own in zip(videos, per_video, strict=True):
        part = slice(first, first + len(own))
        first += len(own)
        out.append(_video_timeline(store.run(video) if len(own) else None, own, weights[part],
                                   times[part], mask[part], scored[part], spans[part]))
    return out


def _video_timeline(run: dict | None, rows: np.ndarray, weights: np.ndarray,
                    times: np.ndarray, mask: np.ndarray, scored: np.ndarray,
                    spans: np.ndarray) -> Timeline | None:
    """One video's timeline from its rows' weights, times, masks ``[R, N]`` and scores [R];
    ``run``: its frame run (None: one row of N slots, which is its own run)."""
    if not len(rows):
        return None
    if run is None:
        return _timeline(weights[0], times[0], mask[0], np.full(mask.shape[1], scored[0]),
                         rows, spans, scored)
    length = int(run["segments"].sum(1).max())
    frame_score = np.full(length, -np.inf)
    frame_weight, frame_time = np.zeros(length), np.full(length, np.nan)
    frame_valid = np.zeros(length, dtype=bool)
    position = {int(r): int(f) for r, f in zip(run["rows"], run["segments"][:, 0],
                                                strict=True)}
    for r in np.argsort(scored, kind="stable"):  # the best row is written last
        first = position[int(rows[r])]
        slots = np.flatnonzero(mask[r])
        frame_score[first + slots] = scored[r]
        frame_weight[first + slots] = weights[r, slots]
        frame_time[first + slots] = times[r, slots]
        frame_valid[first + slots] = True
    return _timeline(frame_weight, frame_time, frame_valid, frame_score, rows, spans, scored)


def format_span(start: float | None, end: float | None) -> str:
    """``"00:20–00:27"``: a time range as a player shows it (start rounded down, end up;
    hours where needed); ``"–"`` where a time is unknown."""
    if start is None or end is None:
        return "–"
    return f"{_clock(math.floor(start))}–{_clock(math.ceil(end))}"


def _clock(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return (f"{hours}:" if hours else "") + f"{rest // 60:02d}:{rest % 60:02d}"


def _clean(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else round(value, 4)


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
