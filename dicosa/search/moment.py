"""Moments: where in a video a query matches, from DiCoSA's own scores and pooling (Eq. 1).

A **moment** is a time range of a video with a score: the rows of the index (segments of a
long video, or the whole of a short one, :mod:`dicosa.data.segments`) that the query scored,
joined where they overlap and match. :func:`best_moments` picks a video's best few that do
not overlap: the best row not yet taken seeds a moment, and the rows that share time with it
(the windows of the same shot) whose scores stand out from the query's background as far as
:data:`JOIN_LEVEL` of the seed's join it, one after the other, so that a shot longer than one
window, scored by several overlapping windows, is one moment over the whole shot. Rows that
only meet at a shot boundary are not joined: the detector saw the picture change there, and
on the validation collection joining across cuts lost more moments than it found. The
*background* is what a row that does not match scores: the median score of the query's
scored rows (most rows of a collection do not match a query). A moment keeps the seed's score
and row.

A **timeline** says, frame by frame over the whole video, how well it matches: each frame
gets the DiCoSA score S of the best row that holds it and its weight in that row's pooling,
a_i = softmax_i(Tᵀ f_i / τ) (Eq. 1, :func:`dicosa.functional.matched_pooling_weights`): the
frames the score rests on (:func:`video_timelines`).

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

import math
import statistics
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..data.protocol import FrameProtocol
from ..data.video import sample_indices, sample_indices_released
from ..functional import matched_pooling_weights
from ..model import DiCoSA, TextFeatures, VideoFeatures

__all__ = ["JOIN_LEVEL", "Moment", "Timeline", "best_moments", "format_span", "frame_times",
           "frame_weights", "overlaps",
           "row_frame_times", "timeline_rows", "timelines", "video_timelines"]


# An overlapping row joins a moment when its score is at least this far from the background
# to the seed's score (module docstring). Chosen on the validation collection of
# benchmarks/moments.py (benchmarks/RESULTS.md, "Moments as ranges").
JOIN_LEVEL = 0.5
_TOUCH = 1e-3  # seconds: rows that share no more than this only meet


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
    or ``store.table.columns`` of ``num_frames``, ``fps`` and ``frames_lost``) whose
    stored frames have ``frame_mask [n, N]``: float64 ``[n, N]``. ``stored`` [n, N]: the
    times the store keeps (``store.videos.times``), used where a row has any; the others
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
                 limit: int = 3, background: float | None = None,
                 join: float | None = None) -> list[Moment]:
    """A video's best ``limit`` moments that do not overlap, best first: each the best row
    not yet taken, with the matching rows next to it joined (module docstring).

    Args:
        rows: int64 ``[m]`` the video's scored rows.
        spans: ``[m, 2]`` their ``[start, end]`` seconds (NaN: unknown).
        scores: ``[m]`` their scores (``-inf``/NaN: not scored).
        background: the score of a row that does not match (None: the median of ``scores``).
        join: the level a neighbour must reach, as a fraction of the seed's height above the
            background (None: :data:`JOIN_LEVEL`; above 1: rows are never joined).
    """
    # Python floats, not numpy: a hit has a few dozen rows, where numpy's per-call cost
    # would be most of the work (this runs twice per hit of every search).
    values = [-math.inf if math.isnan(v) else v
              for v in np.asarray(scores, np.float64).ravel().tolist()]
    spans = [tuple(s) for s in np.asarray(spans, np.float64).reshape(-1, 2).tolist()]
    usable = [math.isfinite(v) for v in values]
    if background is None:
        scored = [v for v, ok in zip(values, usable, strict=True) if ok]
        background = statistics.median(scored) if scored else 0.0
    level = JOIN_LEVEL if join is None else join
    taken = [not ok for ok in usable]  # rows already in a moment, or not scored
    picked: list[Moment] = []
    for i in sorted(range(len(values)), key=lambda j: -values[j]):
        if len(picked) == limit or not usable[i]:
            break
        if taken[i]:
            continue
        bar = background + level * (values[i] - background)
        members = _grow(i, spans, values, taken, bar) if level <= 1 else [i]
        for j in members:
            taken[j] = True
        start = min(spans[j][0] for j in members)
        end = max(spans[j][1] for j in members)
        moment = Moment(_clean(start), _clean(end), values[i], int(rows[i]))
        if not overlaps(moment, picked):
            picked.append(moment)
    return picked


def _grow(seed: int, spans: list[tuple[float, float]], values: list[float],
          taken: list[bool], bar: float) -> list[int]:
    """The rows of one moment: ``seed`` and, one after the other, the free rows reaching
    ``bar`` that overlap the range so far (rows of unknown time join nothing)."""
    lo, hi = spans[seed]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [seed]
    members = [seed]
    free = [j for j, (s, e) in enumerate(spans) if j != seed and not taken[j]
            and values[j] >= bar and math.isfinite(s) and math.isfinite(e)]
    while free:
        near = [j for j in free if spans[j][0] < hi - _TOUCH and spans[j][1] > lo + _TOUCH]
        if not near:
            break
        members += near
        lo = min(lo, *(spans[j][0] for j in near))
        hi = max(hi, *(spans[j][1] for j in near))
        joined = set(near)
        free = [j for j in free if j not in joined]
    return members


def overlaps(moment: Moment, others: list[Moment]) -> bool:
    """Whether ``moment`` shares time with any of ``others`` (unknown times share none)."""
    if moment.start is None or moment.end is None:
        return False
    return any(m.start is not None and m.end is not None and moment.start < m.end
               and m.start < moment.end for m in others)


@dataclass(frozen=True, eq=False)
class Timeline:
    """A video's relevance, frame by frame (module docstring), and its best frame.

    Kept as arrays (``frame_*``, float64 ``[F]``, NaN/-inf: none); ``times``, ``weights`` and
    ``scores`` give them as rounded lists, and :meth:`as_dict` converts only the frames it
    sends (an hour-long video has 3,600)."""

    frame_time: np.ndarray  # [F] seconds (NaN: unknown)
    frame_weight: np.ndarray  # [F] Eq. 1 weight of the frame in its best row
    frame_score: np.ndarray  # [F] DiCoSA's S of the best row holding the frame
    best_frame: int  # the frame of largest weight within the best row
    best_time: float | None
    best_weight: float
    moments: list[Moment]  # the video's best moments that do not overlap, by S
    video_rows: int = 1  # the video's rows (segments)
    scored_rows: int = 1  # those scored: all, or a sample (video_timelines' max_rows)

    @property
    def times(self) -> list[float | None]:
        """[F] seconds, rounded to 0.1 ms (None: unknown)."""
        return self._lists()[0]

    @property
    def weights(self) -> list[float | None]:
        return self._lists()[1]

    @property
    def scores(self) -> list[float | None]:
        """[F] S of the best row holding each frame (None: no scored row holds it)."""
        return self._lists()[2]

    def _lists(self, frames: np.ndarray | slice = slice(None)) -> tuple[list, list, list]:
        """Times (to 0.1 ms), weights and scores (to 6 digits) of ``frames`` as lists."""
        return (_rounded(self.frame_time[frames], 4), _rounded(self.frame_weight[frames], 6),
                _rounded(self.frame_score[frames], 6))

    def as_dict(self, max_points: int | None = None) -> dict:
        """JSON of the timeline; with ``max_points``, a longer one sends only the frames a
        scored row holds (all of them unless the rows were sampled) and of more than that many
        keeps in each of ``max_points`` equal stretches of them only its most relevant frame
        (highest score, then weight; the first of equals), so the best frame is always
        there."""
        frames = np.arange(len(self.frame_time))
        if max_points is not None and len(frames) > max_points:
            held = np.flatnonzero(np.isfinite(self.frame_score))
            frames = held if len(held) else frames
            if len(frames) > max_points:
                frames = frames[self._thinned(frames, max_points)]
        columns = zip(frames.tolist(), *self._lists(frames), strict=True)
        return {"frames": [{"frame": j, "time": t, "weight": w, "score": s}
                           for j, t, w, s in columns],
                "best": {"frame": self.best_frame, "time": self.best_time,
                         "weight": self.best_weight},
                "moments": [m.as_dict() for m in self.moments],
                "rows": self.video_rows, "scored_rows": self.scored_rows}

    def _thinned(self, frames: np.ndarray, points: int) -> np.ndarray:
        """Positions in ``frames`` of the most relevant frame of each of ``points`` equal
        stretches of them."""
        score = self.frame_score[frames]
        score = np.where(np.isfinite(score), score, -math.inf)
        place = np.arange(len(frames))
        stretch = np.searchsorted(np.linspace(0, len(frames), points + 1).astype(int), place,
                                  side="right") - 1
        # by stretch, then score, then weight, then the earlier frame: each stretch's last
        order = np.lexsort((-place, self.frame_weight[frames], score, stretch))
        return np.sort(order[np.r_[stretch[order][1:] != stretch[order][:-1], True]])


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
              rows: np.ndarray, spans: np.ndarray, row_scores: np.ndarray,
              **counts: int) -> Timeline | None:
    """A timeline of frames ``[F]`` (weights, times, valid mask, per-frame score); ``counts``:
    the video's ``video_rows`` and ``scored_rows`` where not one and one."""
    if not mask.any():
        return None
    valid = np.flatnonzero(mask)
    best_score = np.nanmax(np.where(mask, scores, -np.inf)) if np.isfinite(
        np.where(mask, scores, np.nan)).any() else np.nan
    in_best = valid if not np.isfinite(best_score) else valid[scores[valid] == best_score]
    best = int(in_best[np.argmax(weights[in_best])])  # ties: the earliest
    return Timeline(np.asarray(times, np.float64), np.asarray(weights, np.float64),
                    np.asarray(scores, np.float64), best, _clean(times[best]),
                    round(float(weights[best]), 6), best_moments(rows, spans, row_scores),
                    **counts)


def _rounded(values: np.ndarray, digits: int) -> list[float | None]:
    """``values`` rounded to ``digits`` as a list, None where not finite."""
    values = np.asarray(values, np.float64)
    out = np.round(values, digits).astype(object)
    out[~np.isfinite(values)] = None
    return out.tolist()


@torch.inference_mode()
def video_timelines(model: DiCoSA, store, protocol: FrameProtocol, text: Tensor,
                    videos: list[int], max_rows: int | None = None,
                    keep: list[np.ndarray] | None = None,
                    scored: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> list[Timeline | None]:
    """The timelines of ``videos`` (ids in ``store``) under the text vector ``text [1, D]``:
    every row of each video scored by DiCoSA and pooled (Eq. 1), each frame given the score
    of the best row holding it and its weight there. The rows of all the videos are read and
    scored together; ``scored``: rows ``[C]`` whose S is known ``[C]`` (a search's
    candidates: -1 pads, -inf where unknown), not scored again.

    ``max_rows``: a video of more rows has only that many scored (:func:`timeline_rows`:
    ``keep[i]``, its rows that must be, and the rest spread evenly over it), and its frames
    outside them are left out of its timeline (invalid, as padding is). Scoring every row of
    an hour-long video costs the search seven times over (~760 rows against 1,000
    candidates shared by all the hits), so a service bounds it."""
    layouts = [store.videos.run(v, frames=False) for v in videos]  # None: a clip, its one row
    every = [store.videos.rows(v) if run is None else run["rows"][store.is_live(run["rows"])]
             for v, run in zip(videos, layouts, strict=True)]
    per_video = [timeline_rows(own, None if keep is None else keep[i], max_rows,
                               _starts(run, own, max_rows))
                 for i, (own, run) in enumerate(zip(every, layouts, strict=True))]
    rows = np.concatenate([np.zeros(0, np.int64), *per_video])
    if not len(rows):
        return [None] * len(videos)
    dtype = next(model.parameters()).dtype
    features = store.gather(rows, dtype)  # [R, N, D]
    text = text.to(next(model.parameters()).device, dtype)
    weights = frame_weights(model, text, features).numpy()  # [R, N]
    scores = _row_scores(model, text, features, rows, scored)  # [R]
    mask = features.frame_mask.numpy()
    metadata = store.table.columns(rows, ("num_frames", "fps", "frames_lost"))
    times = frame_times(protocol, mask.shape[1], metadata, mask,
                        stored=store.videos.times(rows))  # [R, N]
    spans = store.videos.spans(rows)
    out, first = [], 0
    for run, own, total in zip(layouts, per_video, every, strict=True):
        part = slice(first, first + len(own))
        first += len(own)
        out.append(_video_timeline(run if len(own) else None, own, weights[part],
                                   times[part], mask[part], scores[part], spans[part],
                                   len(total)))
    return out


def _row_scores(model: DiCoSA, text: Tensor, features: VideoFeatures, rows: np.ndarray,
                scored: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """DiCoSA's S of ``text [1, D]`` with each of ``rows [R]`` (their ``features``): the
    known one where ``scored`` holds a finite S for the row, else computed now: ``[R]``."""
    from .rerank import pair_scores

    out = np.full(len(rows), np.nan)
    if scored is not None:
        ids, values = scored
        known = (ids >= 0) & np.isfinite(values)
        ids, values = ids[known], np.asarray(values, np.float64)[known]
        order = np.argsort(ids, kind="stable")
        ids, values = ids[order], values[order]
        at = np.minimum(np.searchsorted(ids, rows), max(len(ids) - 1, 0))
        if len(ids):
            found = ids[at] == rows
            out[found] = values[at[found]]
    todo = np.flatnonzero(np.isnan(out))
    if len(todo):
        dtype = next(model.parameters()).dtype
        video = VideoFeatures(features.frames[todo], features.frame_mask[todo])
        one = torch.zeros(len(todo), dtype=torch.int64, device=text.device)
        out[todo] = pair_scores(model, TextFeatures(text), video.to(text.device, dtype),
                                pairs=one).cpu().numpy()
    return out


def _starts(run: dict | None, rows: np.ndarray, max_rows: int | None) -> np.ndarray | None:
    """[L] the start times of a video's ``rows`` (from its ``run``, ``store.videos.run``)
    where :func:`timeline_rows` spreads over them (more rows than ``max_rows``), else None."""
    if run is None or max_rows is None or len(rows) <= max_rows:
        return None
    return run["spans"][np.searchsorted(run["rows"], rows), 0]


def timeline_rows(rows: np.ndarray, keep: np.ndarray | None, max_rows: int | None,
                  starts: np.ndarray | None = None) -> np.ndarray:
    """The rows of one video (``rows``, in its order) a timeline scores: all of them, or with
    more than ``max_rows``, the rows in ``keep`` (those of its rows, the first ``max_rows`` of
    them) and others spread evenly over the video up to ``max_rows`` in all, in the video's
    order. ``starts`` (seconds, ascending, one per row): spread evenly in time, each the row
    starting nearest to its share of the video (segments are uneven: a fast-cut minute has
    more of them than a long shot's); without it, or with a time unknown, by position."""
    if max_rows is None or len(rows) <= max_rows:
        return rows
    chosen = np.zeros(len(rows), dtype=bool)  # [L] by position in the video
    if keep is not None and len(keep):
        keep = np.asarray(keep, np.int64)
        keep = keep[np.sort(np.unique(keep, return_index=True)[1])]  # first of each, in order
        chosen[np.isin(rows, keep[np.isin(keep, rows)][:max_rows])] = True
    chosen[_spread(len(rows), max(max_rows - int(chosen.sum()), 0), starts)] = True
    missing = max_rows - int(chosen.sum())  # the spread met kept rows: fill up in order
    if missing > 0:
        chosen[np.flatnonzero(~chosen)[:missing]] = True
    return rows[chosen]


def _spread(length: int, count: int, starts: np.ndarray | None) -> np.ndarray:
    """``count`` positions among ``length`` rows, evenly in time by ``starts`` [L] where every
    start is known, else evenly by position."""
    if starts is None or not np.isfinite(starts).all() or starts[-1] <= starts[0]:
        return np.linspace(0, length - 1, count).round().astype(int)
    targets = np.linspace(starts[0], starts[-1], count)
    after = np.searchsorted(starts, targets).clip(1, length - 1)  # [count] first start >= t
    nearer_before = targets - starts[after - 1] <= starts[after] - targets
    return np.where(nearer_before, after - 1, after)


def _video_timeline(run: dict | None, rows: np.ndarray, weights: np.ndarray,
                    times: np.ndarray, mask: np.ndarray, scored: np.ndarray,
                    spans: np.ndarray, total: int) -> Timeline | None:
    """One video's timeline from its scored rows' weights, times, masks ``[R, N]`` and scores
    [R]; ``run``: its frame run (None: one row of N slots, which is its own run); ``total``:
    the video's rows."""
    if not len(rows):
        return None
    counts = {"video_rows": total, "scored_rows": len(rows)}
    if run is None:
        return _timeline(weights[0], times[0], mask[0], np.full(mask.shape[1], scored[0]),
                         rows, spans, scored, **counts)
    length = int(run["segments"].sum(1).max())
    # [R] each row's first frame (the run's rows are its ids, ascending)
    first = run["segments"][np.searchsorted(run["rows"], rows), 0]
    r, slot = np.nonzero(mask)  # every valid slot of every row
    frame = first[r] + slot
    # each frame from its best row: sorted by frame, then by score (a stable order among
    # equal scores, the later row winning), the last of each frame's group
    rank = np.empty(len(rows), np.int64)
    rank[np.argsort(scored, kind="stable")] = np.arange(len(rows))
    order = np.lexsort((rank[r], frame))
    last = order[np.r_[frame[order][1:] != frame[order][:-1], True]]
    frame_score = np.full(length, -np.inf)
    frame_weight, frame_time = np.zeros(length), np.full(length, np.nan)
    frame_valid = np.zeros(length, dtype=bool)
    taken = frame[last]
    frame_score[taken] = scored[r[last]]
    frame_weight[taken] = weights[r[last], slot[last]]
    frame_time[taken] = times[r[last], slot[last]]
    frame_valid[taken] = True
    return _timeline(frame_weight, frame_time, frame_valid, frame_score, rows, spans, scored,
                     **counts)


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
