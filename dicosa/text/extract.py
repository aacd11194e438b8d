"""Reading the text sources of index rows: which source runs on which row, and with what.

:class:`TextSettings` says which sources an index reads (subtitles whenever present: cheap;
speech and OCR only when asked) and names each one's engine, which the text index records per
row: a row read by another engine (``pocketsphinx`` then ``whisper:small``) is read again.
:class:`TextReader` reads rows: it groups them by video, transcribes a video's speech once
over the union of the rows' ranges and reads OCR on each row's frames, then gives each line to
every row it overlaps (:func:`~dicosa.text.lines.assign`). A video's subtitles are parsed once
per reader and kept for its next rows: a long video's segments come in several batches (the
index commits every few rows), and each batch gets the same cues without reading the file
again or counting them again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..integers import as_int
from .fts import Done
from .lines import SourceReport, SourceUnavailable, TextLine, assign
from .ocr import screen_lines
from .speech import Recognizer, make_recognizer, merge_spans, speech_lines
from .subtitles import subtitle_lines

__all__ = ["DEFAULT_OCR_FRAMES", "ReadElsewhere", "ReadJob", "ReadOutcome", "TextReader",
           "TextSettings", "read_jobs"]

log = logging.getLogger(__name__)

DEFAULT_OCR_FRAMES = 3  # frames read by OCR per row
_KEPT_VIDEOS = 8  # videos whose subtitle lines a reader keeps for their next rows

# TextReader.read's arguments: row ids [n], their videos' paths, spans start/end [n], and
# the rows each source must read (source -> bool [n])
ReadJob = tuple[np.ndarray, list[str], np.ndarray, np.ndarray, dict[str, np.ndarray]]
# One job's outcome: (row, line) pairs, (row, Done) records, the reports, the sources that
# could not run (source -> why)
ReadOutcome = tuple[list, list, dict[str, SourceReport], dict[str, str]]
# Runs jobs somewhere else (a cluster's workers), giving back each one's outcome
ReadElsewhere = Callable[["TextSettings", list[ReadJob]], Iterable[ReadOutcome]]


@dataclass(frozen=True)
class TextSettings:
    """Which sources to read: subtitles (sidecars and streams), speech with a recogniser
    (``"pocketsphinx"``, ``"whisper:MODEL"``; None: no speech), OCR on ``ocr_frames`` frames
    per row (0: no OCR)."""

    subtitles: bool = True
    speech: str | None = None
    ocr_frames: int = 0

    def __post_init__(self) -> None:
        if self.speech is not None:
            make_recognizer(self.speech)  # an unknown engine is one sentence now
        frames = as_int(self.ocr_frames)
        if frames is None or frames < 0:
            raise ValueError(f"ocr_frames must be a number of frames >= 0, got "
                             f"{self.ocr_frames!r}")
        object.__setattr__(self, "ocr_frames", frames)  # numpy's integers as Python's

    def engines(self) -> dict[str, str]:
        """Each source read, and the engine its rows are recorded with."""
        out = {}
        if self.subtitles:
            out["subtitles"] = "pysubs2"
        if self.speech:
            out["speech"] = self.speech
        if self.ocr_frames:
            out["screen"] = f"tesseract:{self.ocr_frames}"
        return out


@dataclass
class TextReader:
    """Reads rows' text with ``settings``; ``reports`` adds up what each source did."""

    settings: TextSettings
    recognizer: Recognizer | None = None
    reports: dict[str, SourceReport] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # source -> why it cannot run
    # (source, path) read so far, and those with a line: a long video's segments may be
    # read in several batches, and count as one video in the reports
    _seen: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _found: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _subtitles: OrderedDict = field(default_factory=OrderedDict, repr=False)  # path -> found

    def __post_init__(self) -> None:
        if self.recognizer is None and self.settings.speech:
            self.recognizer = make_recognizer(self.settings.speech)

    def read(self, ids: np.ndarray, paths: list[str], start: np.ndarray, end: np.ndarray,
             todo: dict[str, np.ndarray]) -> tuple[list[tuple[int, TextLine]],
                                                    list[tuple[int, Done]]]:
        """Read rows ``ids`` (their videos ``paths`` and spans ``start``/``end``) for the
        sources in ``todo`` (source -> bool [n]: the rows it must read). Returns the
        ``(row, line)`` pairs and ``(row, Done)`` records to write; a row a source could not
        run on (its program or model missing) gets no record, so it is read again later."""
        lines: list[tuple[int, TextLine]] = []
        done: list[tuple[int, Done]] = []
        groups: dict[str, list[int]] = {}
        for position, path in enumerate(paths):
            groups.setdefault(path, []).append(position)
        for path, positions in groups.items():
            at = np.array(positions)
            for source, wanted in todo.items():
                rows = at[wanted[at]]
                if len(rows) and source not in self.unavailable:
                    found = self._source(source, path, start[rows], end[rows])
                    if found is not None:
                        self._give(found, ids[rows], start[rows], end[rows], lines, done)
        return lines, done

    def _source(self, source: str, path: str, start: np.ndarray, end: np.ndarray
                ) -> tuple[list[TextLine], SourceReport] | None:
        if source == "subtitles" and path in self._subtitles:
            self._subtitles.move_to_end(path)
            return self._subtitles[path]  # read and counted with the video's first rows
        try:
            if source == "subtitles":
                found = subtitle_lines(path)
            elif source == "speech":
                found = speech_lines(path, merge_spans(start, end), self.recognizer)
            else:
                found = screen_lines(path, list(zip(start.tolist(), end.tolist(),
                                                    strict=True)), self.settings.ocr_frames)
        except SourceUnavailable as exc:
            self.unavailable[source] = str(exc)
            log.warning("%s is not read: %s", source, exc)
            return None
        self._count(source, path, found[1])
        if source == "subtitles":
            self._subtitles[path] = found
            while len(self._subtitles) > _KEPT_VIDEOS:
                self._subtitles.popitem(last=False)
        return found

    def _count(self, source: str, path: str, report: SourceReport) -> None:
        """Add a read's report to the source's: a video counts once however many batches
        of its rows were read."""
        key = (source, path)
        if key in self._seen and source == "subtitles":
            return  # the same cues read again (the video fell out of the kept ones)
        if key in self._seen:  # another batch of this video's segments
            report.videos = 0
        report.found = int(bool(report.found) and key not in self._found)
        self._seen.add(key)
        if report.found:
            self._found.add(key)
        self.reports.setdefault(source, SourceReport(source, report.engine)).merge(report)
        for note in report.notes:
            log.warning("%s: %s", source, note)

    def _give(self, found: tuple[list[TextLine], SourceReport], ids: np.ndarray,
              start: np.ndarray, end: np.ndarray, lines: list, done: list) -> None:
        """Each line to every row it overlaps; a record per row."""
        found_lines, report = found
        count = np.zeros(len(ids), dtype=np.int64)
        for line in found_lines:
            for position in assign(line.start, line.end, start, end):
                lines.append((int(ids[position]), line))
                count[position] += 1
        length = np.where(np.isfinite(end - start), end - start, 0.0)
        share = length / length.sum() if length.sum() > 0 else np.full(len(ids), 1 / len(ids))
        note = report.notes[0] if report.notes else ""
        engine = self.settings.engines()[report.source]
        for position, row in enumerate(ids.tolist()):
            done.append((row, Done(report.source, engine, int(count[position]),
                                   float(report.seconds * share[position]),
                                   round(report.frames * share[position]), note)))


def read_jobs(settings: TextSettings, jobs: Iterable[ReadJob],
              recognizer: Recognizer | None = None) -> Iterator[ReadOutcome]:
    """Each job read by a fresh :class:`TextReader` sharing ``recognizer`` (loaded once by
    the caller): what a worker that reads for another process runs."""
    for job in jobs:
        reader = TextReader(settings, recognizer)
        lines, done = reader.read(*job)
        yield lines, done, reader.reports, reader.unavailable
