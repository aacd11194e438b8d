"""The text plugin: search what is said and written in the videos beside what they show.

:class:`TextPlugin` (``attach_text(index, speech=..., ocr=...)``, or ``dicosa
index``, which reads subtitles whenever present) gives an index:

- its text index, ``text.sqlite`` in the folder (:mod:`dicosa.text.fts`): every row's lines
  from subtitles, speech and on-screen text (:mod:`dicosa.text.extract`), read when the row
  is added (inside the add's transaction, before its manifest commit) or, for rows the index
  held before, when the plugin is attached by the writer;
- a first stage (``"text"``) proposing the rows whose lines match the query, so that a video
  whose pictures do not show what was said is still reranked;
- the search option ``source`` (:data:`~dicosa.plugins.text_ranking.SOURCE`): what a query
  is matched against, the pictures and each text source (``index.query(text,
  source="speech")``; an index without this plugin takes ``visual`` alone);
- a query encoder: each query's text ranking (BM25 over FTS5, best line per row,
  :class:`~dicosa.plugins.text_ranking.TextRanking`), once per search, in
  ``EncodedQueries.extra["text"]``, for the sources the search asks for
  (``extra["source"]``);
- a rerank hook fusing DiCoSA's ranking with the text ranking (:mod:`dicosa.text.rrf`);
- ``explain``: the line that matched, its time and source, and the query's words in it;
  each hit's matched lines and a search's ``ranked_by`` in answers, and the line that decided
  a hit's best moment (its thumbnail is taken there).

**Who writes.** Only the process holding the index's writer lock writes ``text.sqlite``
(:attr:`~dicosa.index.plugins.IndexContext.writing`); docs/text.md ("Writes and crashes") says
what a reader and a crash leave.

Its record (``meta["text"]``): ``{"subtitles", "speech", "ocr_frames", "rrf_k",
"text_weight"}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..index.plugins import FileCheck, IndexPlugin
from ..index.searcher import MOMENTS_PER_HIT
from ..search.dense import candidates_of
from ..search.types import Candidates, EncodedQueries
from ..text.extract import DEFAULT_OCR_FRAMES, ReadElsewhere, ReadJob, TextReader, TextSettings
from ..text.fts import TEXT_FILE, TextIndex, TextIndexError, check_text_file
from ..text.lines import SourceReport, row_spans
from ..text.query import text_query
from ..text.rrf import (
    DEFAULT_RRF_K,
    DEFAULT_TEXT_WEIGHT,
    TEXT_SOURCES,
    VISUAL,
    parse_sources,
)
from ..text.speech import Recognizer, make_recognizer
from .text_ranking import SOURCE, TEXT_RANKED, TextRanking, line_text, ranked_by, ranking_of

if TYPE_CHECKING:
    from ..index.searcher import SearchResult

__all__ = ["TextPlugin", "attach_text"]

log = logging.getLogger(__name__)

STAGE = "text"
_READ_CHUNK = 16  # rows read and committed at once when filling an index


class TextPlugin(IndexPlugin):
    """Text sources, their FTS5 index and fused search (:class:`~dicosa.index.plugins
    .IndexPlugin`; module docstring).

    Args:
        subtitles: read sidecar files and subtitle streams (default True).
        speech: ``"pocketsphinx"`` or ``"whisper:MODEL"`` to transcribe speech; False: none.
        ocr: read on-screen text with Tesseract on ``ocr_frames`` frames per row.
        rrf_k, text_weight: the fusion's constants (:mod:`dicosa.text.rrf`).
        recognizer: a recogniser object to use for ``speech`` (tests; not recorded).

    Options left None keep what the index recorded, else the defaults (subtitles only).
    """

    key = "text"
    api_name = "text"

    def __init__(self, *, subtitles: bool | None = None, speech: str | bool | None = None,
                 ocr: bool | None = None, ocr_frames: int | None = None,
                 rrf_k: float | None = None, text_weight: float | None = None,
                 recognizer: Recognizer | None = None, reads: ReadElsewhere | None = None):
        self.asked = {"subtitles": subtitles, "speech": speech, "ocr": ocr,
                      "ocr_frames": ocr_frames, "rrf_k": rrf_k, "text_weight": text_weight}
        self.recognizer = recognizer
        self.reads = reads  # where speech and OCR run (None: here); see fill
        self.settings: TextSettings | None = None
        self.rrf_k, self.text_weight = DEFAULT_RRF_K, DEFAULT_TEXT_WEIGHT
        self.index: TextIndex | None = None
        self.reader: TextReader | None = None
        self._ctx = None
        self._present: set[str] | None = None

    @classmethod
    def restore(cls, record: dict, ctx) -> TextPlugin:
        frames = record.get("ocr_frames") or 0
        return cls(subtitles=record.get("subtitles", True), speech=record.get("speech") or False,
                   ocr=bool(frames), ocr_frames=frames or None, rrf_k=record.get("rrf_k"),
                   text_weight=record.get("text_weight"))

    @classmethod
    def from_options(cls, options: Mapping[str, object], record: dict | None
                     ) -> TextPlugin | None:
        """``subtitles``, ``speech`` (an engine; "off" or "none": no speech), ``ocr`` and
        ``ocr_frames`` (options left None keep what the index recorded); ``ray``: a
        connected Ray module, whose workers then read speech and on-screen text. An unknown
        speech engine is one sentence here, before any work. None where nothing is read."""
        if not {"subtitles", "speech", "ocr", "ocr_frames"} & set(options):
            return None
        speech = options.get("speech")
        if speech is not None and str(speech).lower() in ("off", "none"):
            speech = False
        elif speech is not None:
            make_recognizer(speech)
        if options.get("subtitles") is False and not speech and not options.get("ocr"):
            return None
        plugin = cls(subtitles=options.get("subtitles"), speech=speech, ocr=options.get("ocr"),
                     ocr_frames=options.get("ocr_frames"))
        ray = options.get("ray")
        if ray is not None:
            from ..text.ray_reads import ray_reads

            cpus = int(ray.cluster_resources().get("CPU", 1))
            plugin.reads = ray_reads(ray, readers=max(1, cpus - 1))
        return plugin

    @classmethod
    def check_files(cls, directory: Path, live: np.ndarray, repair: bool) -> FileCheck:
        """The text index against the live rows (:func:`~dicosa.text.fts.check_text_file`);
        a repair deletes lines under the index's writer lock, as every write."""
        from ..index.lock import WriterLock

        with WriterLock(directory) if repair else nullcontext():
            problems, repaired, checked = check_text_file(directory, live, repair)
        return FileCheck(problems, repaired, [checked] if checked else [])

    def _resolve(self, recorded: dict) -> None:
        asked = self.asked

        def pick(name: str, default):
            value = asked[name]
            return value if value is not None else recorded.get(name, default)

        speech = pick("speech", None) or None
        frames = asked["ocr_frames"] or recorded.get("ocr_frames") or DEFAULT_OCR_FRAMES
        ocr = asked["ocr"] if asked["ocr"] is not None else bool(recorded.get("ocr_frames"))
        self.settings = TextSettings(bool(pick("subtitles", True)), speech,
                                     int(frames) if ocr else 0)
        self.rrf_k = float(pick("rrf_k", DEFAULT_RRF_K))
        self.text_weight = float(pick("text_weight", DEFAULT_TEXT_WEIGHT))

    def attach(self, ctx) -> None:
        self._resolve(ctx.meta.get("text") or {})
        self._ctx = ctx
        self.reader = TextReader(self.settings, self.recognizer)
        self.index = self._open(ctx)
        ctx.add_stage(_TextStage(self), videos=lambda ids, _: ids, indexed=ctx.store.live())
        ctx.add_query_encoder(self._encode)
        ctx.add_hook(self._hook)
        ctx.add_option(SOURCE)
        if ctx.writing():
            self.fill()
        else:
            self._say_missing()

    def _open(self, ctx) -> TextIndex | None:
        """The folder's text index (a damaged one is deleted and read again by the writer;
        a reader goes without text)."""
        writer = ctx.writing()
        try:
            return TextIndex.open(ctx.directory, create=writer)
        except TextIndexError as exc:
            if not writer:
                log.warning("searching without text lines: %s", exc)
                return None
            log.warning("reading the videos' text again: %s", exc)
            path = ctx.directory / TEXT_FILE
            path.unlink(missing_ok=True)
            path.with_name(TEXT_FILE + "-journal").unlink(missing_ok=True)
            return TextIndex.open(ctx.directory, create=True)

    def for_writing(self) -> TextIndex | None:
        """The text index to write, None where this process is not the index's writer. An
        index opened to search (read-only) that now holds the writer lock (``add`` after
        ``load``) opens the file again for writing."""
        if self._ctx is None or not self._ctx.writing():
            return None
        if self.index is None or not self.index.writable:
            if self.index is not None:
                self.index.close()
            self.index = self._open(self._ctx)
        return self.index

    def record(self) -> dict | None:
        return {"subtitles": self.settings.subtitles, "speech": self.settings.speech,
                "ocr_frames": self.settings.ocr_frames, "rrf_k": self.rrf_k,
                "text_weight": self.text_weight}

    # -- reading rows (the writer) ----------------------------------------------------------
    def fill(self) -> int:
        """Bring the text index in step with the store: forget rows it no longer holds, read
        the live rows a wanted source has not read (``_READ_CHUNK`` rows per commit, so an
        interrupted fill keeps what it read). Returns the rows read."""
        stray = np.setdiff1d(self.index.rows(), self._ctx.store.live())
        if len(stray):
            self.index.remove(stray)
        missing = self._unread()
        if self.reads is not None and (self.settings.speech or self.settings.ocr_frames):
            self._read_elsewhere(missing)
        else:
            self.read(missing)
        return len(missing)

    def _unread(self) -> np.ndarray:
        """The live rows a wanted source has not read with its engine."""
        return np.setdiff1d(self._ctx.store.live(), self.index.held(self.settings.engines()))

    def read(self, ids: np.ndarray) -> None:
        """Read rows ``ids`` for every wanted source that has not read them with its engine,
        committing their lines ``_READ_CHUNK`` rows per transaction."""
        ids = np.asarray(ids, dtype=np.int64)
        for start in range(0, len(ids), _READ_CHUNK):
            job = self._job(ids[start:start + _READ_CHUNK])
            if job is not None:
                lines, done = self.reader.read(*job)
                if done:
                    self.index.write(lines, done)

    def _job(self, ids: np.ndarray) -> ReadJob | None:
        """What reading rows ``ids`` takes (:meth:`TextReader.read`'s arguments), or None
        when every wanted source has read them with its engine."""
        engines = self.settings.engines()
        if not len(ids) or not engines or self.index is None:
            return None
        have = self.index.engines(ids)
        todo = {source: np.array([have.get((int(r), source)) != engine for r in ids])
                for source, engine in engines.items()}
        todo = {s: m for s, m in todo.items() if m.any()}
        if not todo:
            return None
        paths, start, end = row_spans(self._ctx.store, ids)
        return np.asarray(ids), paths, start, end, todo

    def _read_elsewhere(self, missing: np.ndarray) -> None:
        """Rows ``missing`` read by :attr:`reads` (workers of a cluster, each holding its
        recogniser), a video's rows in one job; each job's lines committed here as it comes
        back (this process alone writes the text index), its reports added up."""
        videos = self._ctx.store.videos.of(missing)
        chunks, start = [], 0
        for end in range(1, len(missing) + 1):  # whole videos, about _READ_CHUNK rows each
            if end == len(missing) or (end - start >= _READ_CHUNK
                                       and videos[end] != videos[end - 1]):
                chunks.append(missing[start:end])
                start = end
        jobs = [job for job in map(self._job, chunks) if job is not None]
        if not jobs:
            return
        for lines, done, reports, unavailable in self.reads(self.settings, jobs):
            if done:
                self.index.write(lines, done)
            for source, report in reports.items():
                self.reader.reports.setdefault(source, SourceReport(source, report.engine)
                                               ).merge(report)
            self.reader.unavailable.update(unavailable)

    def _say_missing(self) -> None:
        missing = 0 if self.index is None else len(self._unread())
        if missing:
            log.info("%d indexed video(s) have not had their text read (%s); the next "
                     "'dicosa index' run reads it", missing,
                     ", ".join(self.settings.engines()))

    def present(self) -> set[str]:
        """The text sources the index holds lines of (counted once)."""
        if self._present is None:
            self._present = set() if self.index is None else self.index.sources()
        return self._present

    def sources(self) -> dict[str, dict]:
        """Each text source the index reads or holds lines of: its engine (None: no longer
        read) and what the text index holds of it (:meth:`TextIndex.stats`)."""
        held = self.index.stats() if self.index is not None else {}
        engines, counts = self.settings.engines(), ("rows", "rows_with_lines", "lines")
        return {source: {"engine": engines.get(source),
                         **{k: held.get(source, {}).get(k, 0) for k in counts}}
                for source in TEXT_SOURCES if source in engines or source in held}

    @property
    def reports(self) -> dict[str, SourceReport]:
        """What each source read since the plugin was attached."""
        return self.reader.reports if self.reader is not None else {}

    # -- search -----------------------------------------------------------------------------
    def _encode(self, encoded: EncodedQueries) -> None:
        """Each query's text ranking, in ``encoded.extra["text"]``."""
        began = time.perf_counter()
        sources = parse_sources(encoded.extra.get("source"))
        text_sources = tuple(s for s in TEXT_SOURCES if s in sources)
        rankings = []
        for query in encoded.queries:
            parsed = text_query(query.text)
            ranking = TextRanking(VISUAL in sources, text_sources, parsed.terms,
                                  held=tuple(s for s in text_sources if s in self.present()))
            expression = parsed.expression()
            if expression and text_sources and self.index is not None:
                ranking.take(self.index.search(expression, text_sources, TEXT_RANKED + 64),
                             self._ctx.store)
            rankings.append(ranking)
        encoded.extra["text"] = rankings
        # the words' own search, apart from the query's encoding in the search's times
        encoded.extra.setdefault("encoder_times", {})["words_s"] = time.perf_counter() - began

    def _hook(self, queries: EncodedQueries, ids: np.ndarray, scores: torch.Tensor
              ) -> torch.Tensor:
        """Fused scores of the candidates ``ids [Q, C]`` (module docstring of
        :mod:`dicosa.text.rrf`); a query that looks at no text, or matches none among its
        candidates, keeps its scores."""
        rankings = queries.extra.get("text")
        if rankings is None:
            return scores
        out = scores.clone()
        for q, ranking in enumerate(rankings):
            fused = ranking.fused(ids[q], scores[q], self.rrf_k, self.text_weight)
            if fused is not None:
                out[q] = torch.from_numpy(fused).to(out.dtype)
        return out

    def matched(self, result: SearchResult, i: int, limit: int = MOMENTS_PER_HIT
                ) -> list[dict]:
        """The lines of hit ``i`` that matched the query (:func:`said`), best moment first:
        the line of each of its moments' rows that has one, each once (at most ``limit``);
        where none has, the best line of any row of its video (a long video's line may be in
        a row that is not among its moments)."""
        ranking = ranking_of(result)
        if ranking is None or not ranking.matches:
            return []
        hit = result.hits[i]
        rows = dict.fromkeys([hit.row, *(m.row for m in hit.moments)])
        lines = {}  # a line two moments hold (stored once per row), once
        for row in rows:
            if row in ranking.by_row:
                m = ranking.by_row[row]
                lines.setdefault((m.source, m.start, m.end, m.text), m)
        found = list(lines.values())[:limit]
        if not found and self._ctx is not None:
            matched = np.array([m.row for m in ranking.matches], dtype=np.int64)
            videos = self._ctx.store.videos.of(matched)
            found = [m for m, v in zip(ranking.matches, videos, strict=True) if v == hit.id][:1]
        return [ranking.said(m) for m in found]

    def match(self, result: SearchResult, i: int) -> dict | None:
        """The line of hit ``i`` that matched the query best (None: none did)."""
        found = self.matched(result, i, 1)
        return found[0] if found else None

    def annotate(self, result: SearchResult, i: int) -> dict:
        """``line``: the line of hit ``i`` that matched best (None: none did); ``lines``: its
        matched lines, best moment first (:meth:`matched`)."""
        lines = self.matched(result, i)
        return {"line": lines[0] if lines else None, "lines": lines}

    def annotate_row(self, result: SearchResult, row: int) -> dict:
        """``line``: the line of row ``row`` (a moment) that matched the query, where one
        did."""
        ranking = ranking_of(result)
        found = ranking.by_row.get(int(row)) if ranking is not None else None
        return {} if found is None else {"line": ranking.said(found)}

    def summary(self, result: SearchResult) -> dict:
        return {"ranked_by": ranked_by(result)}

    def readable(self, said: dict) -> list[str]:
        """Each matched line: ``speech 0:03.0-0:05.2 "the [secret] number"``."""
        lines = said.get("lines") or ([said["line"]] if said.get("line") else [])
        return [line_text(line) for line in lines]

    def describe(self) -> dict:
        return {"sources": self.sources()}

    def report(self, before: IndexPlugin | None) -> list[str]:
        """What each source read (since ``before``, the plugin this one replaced, was
        attached) and what the text index holds."""
        reports = dict(before.reports) if isinstance(before, TextPlugin) else {}
        for source, report in self.reports.items():
            reports.setdefault(source, SourceReport(source, report.engine)).merge(report)
        lines = []
        for source in self.settings.engines():
            if source in reports:
                lines.append(reports[source].summary())
            if source in self.reader.unavailable:
                lines.append(f"{source}: not read: {self.reader.unavailable[source]}")
        totals = self.index.stats() if self.index is not None else {}
        held = ", ".join(f"{s} {t['lines']} lines in {t['rows_with_lines']} of {t['rows']} "
                         "rows" for s, t in sorted(totals.items()))
        return [*lines, f"text index: {held or 'no lines'}"]

    def evidence(self, result: SearchResult, i: int
                 ) -> tuple[str, tuple[float, float]] | None:
        """``("words", (start, end))`` of the line that decided hit ``i``'s best moment, None
        where the pictures did or no line of that row matched
        (:meth:`~dicosa.plugins.text_ranking.TextRanking.decides`)."""
        ranking = ranking_of(result)
        row = result.hits[i].row
        found = None if ranking is None else ranking.by_row.get(row)
        if found is None or not ranking.decides(row, result, self.rrf_k, self.text_weight):
            return None
        return "words", (found.start, found.end)

    def explain(self, result: SearchResult, i: int) -> dict | None:
        """The matched line (:meth:`match`): its text, time, source and the query's words in
        it, with the hit's text rank and BM25."""
        return self.match(result, i)

    def lines(self, row: int) -> list[dict]:
        """Every line of row ``row``, in time order."""
        if self.index is None:
            return []
        return [{"start": a, "end": b, "source": s, "text": t}
                for a, b, s, t in self.index.lines(row)]


class _TextStage:
    """The first stage over the text index: the rows whose lines match, by BM25."""

    name = STAGE

    def __init__(self, plugin: TextPlugin):
        self.plugin = plugin

    def add(self, ids: np.ndarray, videos: object) -> None:
        """New rows: read now by the writer (before their manifest commit), committed
        ``_READ_CHUNK`` rows at a time."""
        if self.plugin.for_writing() is not None:
            self.plugin.read(ids)

    def remove(self, ids: np.ndarray) -> None:
        index = self.plugin.for_writing()
        if index is not None:
            index.remove(np.asarray(ids).tolist())

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        rankings = queries.extra.get("text") or [None] * len(queries)
        found = [ranking.matches[:k] if ranking is not None else [] for ranking in rankings]
        return candidates_of([([m.row for m in f], [m.score for m in f]) for f in found], k,
                             STAGE)

    def save(self, directory) -> None:
        """An in-memory text index goes into the folder the index is saved to."""
        plugin = self.plugin
        if plugin.index is not None and plugin.index.path is None and directory is not None:
            target = Path(directory) / TEXT_FILE
            plugin.index.backup(target)
            plugin.index.close()
            plugin.index = TextIndex.open(Path(directory), create=True)

    def __len__(self) -> int:
        return 0 if self.plugin.index is None else len(self.plugin.index.rows())


def attach_text(index, *, subtitles: bool | None = None, speech: str | bool | None = None,
                ocr: bool | None = None, ocr_frames: int | None = None,
                rrf_k: float | None = None, text_weight: float | None = None,
                recognizer: Recognizer | None = None) -> TextPlugin:
    """``index.use(TextPlugin(...))`` under the index's writer lock: the rows' text is read
    now (what was read before is kept) and the settings recorded."""
    with index.writing():
        return index.use(TextPlugin(subtitles=subtitles, speech=speech, ocr=ocr,
                                    ocr_frames=ocr_frames, rrf_k=rrf_k, text_weight=text_weight,
                                    recognizer=recognizer))
