"""Time-aligned text of videos: subtitles, speech and on-screen text, and its FTS5 index.

- :mod:`~dicosa.text.lines`: :class:`TextLine`, what a source found (:class:`SourceReport`),
  which index rows a line belongs to (:func:`row_spans`, :func:`assign`), the longest a line
  may be (:func:`capped`);
- sources: :mod:`~dicosa.text.subtitles` (sidecar files and streams, pysubs2),
  :mod:`~dicosa.text.speech` (PocketSphinx or faster-whisper over :mod:`~dicosa.text.audio`),
  :mod:`~dicosa.text.ocr` (Tesseract); :mod:`~dicosa.text.extract` runs them on rows;
- :mod:`~dicosa.text.fts`: the SQLite FTS5 index of the lines, ranked by BM25;
  :mod:`~dicosa.text.query`: a query as a safe FTS5 expression;
- :mod:`~dicosa.text.rrf`: the sources a search looks at, and reciprocal-rank fusion of
  DiCoSA's ranking with the text ranking.

The index side is :mod:`dicosa.plugins.text`. Nothing here knows the index.
"""

from .lines import (
    MAX_LINE_CHARS,
    SOURCES,
    SourceReport,
    SourceUnavailable,
    TextLine,
    assign,
    capped,
    row_spans,
    spans_of,
)

__all__ = ["MAX_LINE_CHARS", "SOURCES", "SourceReport", "SourceUnavailable", "TextLine",
           "assign", "capped", "row_spans", "spans_of"]
