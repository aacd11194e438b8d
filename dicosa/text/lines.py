"""Time-aligned text: a line of a video, what a source found, and which rows a line belongs to.

A :class:`TextLine` is a piece of text a video carries at a time: a subtitle cue, an
utterance a recogniser heard, the words OCR read on a frame. An index row covers a time
range of a video (:func:`row_spans`: the whole video, or a segment of it); a line belongs to
every row whose range holds most of it (:func:`assign`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["MAX_LINE_CHARS", "MIN_OVERLAP_S", "SOURCES", "SourceReport", "SourceUnavailable",
           "TextLine", "assign", "capped", "held", "row_spans", "spans_of"]

SOURCES = ("subtitles", "speech", "screen")
MAX_LINE_CHARS = 1000  # a line's text is cut here (at a space where there is one)
# A line belongs to a row it overlaps by this much (or by half the line, if shorter): a cue
# that ends a few frames into the next segment is timing jitter, not that segment's.
MIN_OVERLAP_S = 0.25
_NOTES = 20  # one-sentence problems kept per report (the rest are counted)


def capped(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, at the last space before the limit
    where there is one in its second half, an ellipsis ending the cut text."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip() + "\u2026"


class SourceUnavailable(RuntimeError):
    """A source that cannot run at all (its program or model is missing): one sentence."""


@dataclass(frozen=True)
class TextLine:
    """``text`` in video ``path`` from ``start`` to ``end`` seconds, found by ``source``
    (one of :data:`SOURCES`)."""

    path: str
    start: float
    end: float
    text: str
    source: str


@dataclass
class SourceReport:
    """What one source did over some videos: what it found, what it skipped and why."""

    source: str
    engine: str = ""
    videos: int = 0  # videos it looked at
    found: int = 0  # videos it found at least one line in
    lines: int = 0
    seconds: float = 0.0  # speech: seconds of audio transcribed
    frames: int = 0  # screen: frames read by OCR
    work_s: float = 0.0  # wall-clock seconds spent
    skipped: Counter = field(default_factory=Counter)  # reason -> count (cues, files, frames)
    notes: list[str] = field(default_factory=list)  # one sentence per problem, the first few
    more_notes: int = 0

    def note(self, sentence: str) -> None:
        if len(self.notes) < _NOTES:
            self.notes.append(sentence)
        else:
            self.more_notes += 1

    def merge(self, other: SourceReport) -> None:
        for name in ("videos", "found", "lines", "seconds", "frames", "work_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.engine = self.engine or other.engine
        self.skipped.update(other.skipped)
        for sentence in other.notes:
            self.note(sentence)
        self.more_notes += other.more_notes

    def summary(self) -> str:
        """One line for the ``index`` command, e.g. ``subtitles: 3 of 10 videos, 41 lines``."""
        engine = f" ({self.engine})" if self.engine and self.engine != self.source else ""
        parts = [f"{self.found} of {self.videos} videos with {self.source}", f"{self.lines} lines"]
        if self.source == "speech":
            parts.append(f"{self.seconds:.0f} s of audio transcribed")
        if self.source == "screen":
            parts.append(f"{self.frames} frames read")
        parts.append(f"{self.work_s:.1f} s")
        text = f"{self.source}{engine}: " + ", ".join(parts)
        if self.skipped:
            text += "; skipped " + ", ".join(f"{n} {why}" for why, n in
                                             self.skipped.most_common())
        return text


def spans_of(table: pd.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(paths, start [n], end [n])`` seconds of the rows of an index's metadata ``table``.

    A row covers ``start``..``end`` of its video when the table has those columns (a segment
    of a long video), else the whole video, 0..``duration``; an unknown end (a text-only
    row, a duration not recorded) is infinity.
    """
    paths = [str(p) for p in table["path"].tolist()]
    n = len(paths)
    start = _column(table, "start", n, 0.0)
    end = _column(table, "end", n, np.nan)
    duration = _column(table, "duration", n, np.inf)
    end = np.where(np.isnan(end), duration, end)
    start = np.where(np.isnan(start), 0.0, start)
    return paths, start, np.where(np.isnan(end), np.inf, end)


def _column(table: pd.DataFrame, name: str, n: int, missing: float) -> np.ndarray:
    if name not in table.columns:
        return np.full(n, missing, dtype=np.float64)
    return pd.to_numeric(table[name], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def row_spans(store, ids: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """:func:`spans_of` the rows ``ids`` of a :class:`~dicosa.search.store.FrameStore`."""
    return spans_of(store.table.rows(np.asarray(ids, dtype=np.int64)))


def assign(line_start: float, line_end: float, start: np.ndarray, end: np.ndarray
           ) -> np.ndarray:
    """Positions of the rows (spans ``start``/``end`` [n], one video's) a line belongs to.

    A line belongs to every row it overlaps by at least :data:`MIN_OVERLAP_S` or half its
    length, whichever is less (a 10-s cue over four 3-s segments is in all four); an instant
    (a line with no length) to the rows whose span contains it. Which rows a line reaches does
    not depend on which other rows are read with it."""
    length = line_end - line_start
    if length <= 0:
        return np.flatnonzero((start <= line_start) & (line_start <= end))
    overlap = np.minimum(end, line_end) - np.maximum(start, line_start)
    return np.flatnonzero(overlap >= min(MIN_OVERLAP_S, 0.5 * length))


def held(line_start: np.ndarray, line_end: np.ndarray, start: np.ndarray, end: np.ndarray
         ) -> np.ndarray:
    """The part (0..1) of each line ``[n]`` that its row (spans ``start``/``end`` [n]) holds:
    1 for an instant inside it, or where the row's span is unknown (NaN)."""
    length = line_end - line_start
    overlap = np.minimum(end, line_end) - np.maximum(start, line_start)
    with np.errstate(invalid="ignore", divide="ignore"):
        part = np.where(length > 0, overlap / np.where(length > 0, length, 1.0), 1.0)
    return np.where(np.isnan(part), 1.0, np.clip(part, 0.0, 1.0))
