"""Where a hit's best moment is shown: its timeline's best frame within the evidence's time.

A :class:`~dicosa.search.moment.Timeline` picks its best frame from the row DiCoSA scored
best. A hit ranks by its best row after every hook, and a line of its text may have decided
that row: the frame shown (its thumbnail, ``best.time``) must lie where the evidence is.
:func:`best_within` picks the timeline's frame of largest weight (Eq. 1) inside a time range:
the hit's best moment, or the line that decided it intersected with that moment; where no
scored frame lies in the range (a line between two sampled frames), the best time is the
range's middle and the frame marked is the nearest one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .moment import Timeline

__all__ = ["best_within", "evidence_window"]

_EDGE = 1e-6  # seconds: a frame exactly on the range's edge is inside it


def evidence_window(moment: tuple[float | None, float | None] | None,
                    line: tuple[float, float] | None) -> tuple[float, float] | None:
    """The range a hit's best frame is taken from: the deciding ``line`` within the best
    ``moment`` (the line alone where they do not meet: a line given to a row it overlaps
    only in part), else the moment; None where neither is known."""
    start, end = moment if moment is not None else (None, None)
    known = start is not None and end is not None
    if line is None:
        return (start, end) if known else None
    if known and min(line[1], end) > max(line[0], start):
        return max(line[0], start), min(line[1], end)
    return line


def best_within(timeline: Timeline, window: tuple[float, float] | None) -> Timeline:
    """``timeline`` with its best frame the heaviest scored frame inside ``window`` (module
    docstring); unchanged without a window."""
    if window is None:
        return timeline
    start, end = window
    times, weights = timeline.frame_time, timeline.frame_weight
    scored = np.isfinite(times) & np.isfinite(timeline.frame_score)
    inside = np.flatnonzero(scored & (times >= start - _EDGE) & (times <= end + _EDGE))
    if len(inside):
        best = int(inside[np.argmax(weights[inside])])  # ties: the earliest
        when = float(times[best])
    else:
        when = (start + end) / 2
        known = np.flatnonzero(np.isfinite(times))
        if not len(known):
            return dataclasses.replace(timeline, best_time=round(when, 4))
        best = int(known[np.argmin(np.abs(times[known] - when))])
    return dataclasses.replace(timeline, best_frame=best, best_time=round(when, 4),
                               best_weight=round(float(weights[best]), 6))
