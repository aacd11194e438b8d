"""The text index: every line of every row in SQLite FTS5, ranked by BM25.

One SQLite file in the index folder, ``text.sqlite`` (Python's own ``sqlite3``; the SQLite
of the usual Python builds has FTS5 compiled in, and :func:`check_fts5` says in one sentence
where it has not):

``line(id, row, start_s, end_s, source, text)``
    one row per line and index row (a line two overlapping segments hold is stored twice),
    indexed by ``row``;
``line_fts``
    an FTS5 external-content table over ``line.text`` (``unicode61`` tokenizer, accents
    removed), kept in step by triggers;
``done(row, source, engine, lines, seconds, frames, note)``
    which source has read which row, with which engine (``pocketsphinx``, ``whisper:small``,
    ``tesseract:3``): a row is held by a source when it has a ``done`` record of the same
    engine, even one that found nothing;
``info(key, value)``
    the file's format version.

A write (:meth:`TextIndex.write`, :meth:`TextIndex.remove`) is one SQLite transaction, made
only by the process holding the index's writer lock; readers open the file read-only.
Search (:meth:`TextIndex.search`) takes an FTS5 expression built by
:mod:`dicosa.text.query` (never the user's text) and returns each matching row's best line by
BM25 (FTS5's ``bm25()``: k1 = 1.2, b = 0.75).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import fault_point, storage_error
from .lines import TextLine, capped

__all__ = ["TEXT_FILE", "Done", "Match", "TextIndex", "TextIndexError", "check_fts5",
           "check_text_file"]

TEXT_FILE = "text.sqlite"
FORMAT = "1"
_BUSY_MS = 30_000  # a reader waits this long for a writer's commit
_SCHEMA = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS line(id INTEGER PRIMARY KEY, row INTEGER NOT NULL,
    start_s REAL NOT NULL, end_s REAL NOT NULL, source TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS line_row ON line(row, source);
CREATE VIRTUAL TABLE IF NOT EXISTS line_fts USING fts5(text, content='line',
    content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER IF NOT EXISTS line_added AFTER INSERT ON line BEGIN
    INSERT INTO line_fts(rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER IF NOT EXISTS line_removed AFTER DELETE ON line BEGIN
    INSERT INTO line_fts(line_fts, rowid, text) VALUES ('delete', old.id, old.text); END;
CREATE TABLE IF NOT EXISTS done(row INTEGER NOT NULL, source TEXT NOT NULL, engine TEXT NOT NULL,
    lines INTEGER NOT NULL, seconds REAL NOT NULL, frames INTEGER NOT NULL, note TEXT,
    PRIMARY KEY(row, source));
"""


class TextIndexError(ValueError):
    """A text file that cannot be used (damaged, another format, no FTS5): one sentence."""


@dataclass(frozen=True)
class Done:
    """What one source did for one row."""

    source: str
    engine: str
    lines: int = 0
    seconds: float = 0.0
    frames: int = 0
    note: str = ""


@dataclass(frozen=True)
class Match:
    """A row's best line for a query: its BM25 score (higher is better) and the line."""

    row: int
    score: float
    line: int  # line id
    start: float
    end: float
    source: str
    text: str


def check_fts5() -> None:
    """Raise :class:`TextIndexError` when this Python's SQLite lacks FTS5."""
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError:
        raise TextIndexError(f"this Python's SQLite ({sqlite3.sqlite_version}) is built "
                             "without FTS5, which the text index needs") from None
    finally:
        connection.close()


def _writable(path: Path, mode: str) -> sqlite3.Connection | None:
    """A connection to ``path`` that can write it, None where it cannot: a read-only mount,
    folder or file (SQLite would open such a file read-only without a word, and the first
    write would fail as if the file were damaged). ``os.access`` asks the kernel, which
    answers for the mount and the permissions as they apply to this user."""
    if path.is_file() and not os.access(path, os.W_OK):
        return None
    try:
        return sqlite3.connect(path.as_uri() + f"?mode={mode}", uri=True,
                               check_same_thread=False)
    except sqlite3.OperationalError:
        return None


def _read_only(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a write because the file, its folder or the mount is
    read-only (not because the file is damaged)."""
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text


class TextIndex:
    """The text index of one index folder (module docstring); thread-safe."""

    def __init__(self, connection: sqlite3.Connection, path: Path | None, writable: bool):
        self._db, self.path, self.writable = connection, path, writable
        self.fts_checked = False  # problems() ran FTS5's own check
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: Path | None, *, create: bool, write: bool | None = None
             ) -> TextIndex | None:
        """The text index in ``directory`` (None: a new one in memory). A missing file is
        created with ``create`` (the writer), else None (a reader: no lines yet).

        A reader (``write`` False, the default without ``create``) opens the file read-only
        and never writes it, so a read-only mount or a folder or file the user cannot write
        is searched as any other. A writer (``create``, or ``write``: ``check --repair``)
        gets a connection that can write where the file can be written, else a read-only
        one (``writable`` False).

        Raises:
            TextIndexError: the file is damaged or of another format.
        """
        if directory is None:
            check_fts5()
            return cls._ready(sqlite3.connect(":memory:", check_same_thread=False), None, True)
        path = Path(directory).absolute() / TEXT_FILE  # a file URI is absolute
        write = create if write is None else write
        if not path.is_file() and not create:
            return None
        if not path.is_file():
            check_fts5()
        connection = _writable(path, "rwc" if create else "rw") if write else None
        writable = connection is not None
        if connection is None:
            connection = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True,
                                         check_same_thread=False)
        return cls._ready(connection, path, writable)

    @classmethod
    def _ready(cls, connection: sqlite3.Connection, path: Path | None,
               writable: bool) -> TextIndex:
        connection.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        try:
            if writable:
                with connection:
                    connection.executescript(_SCHEMA)
                    connection.execute("INSERT OR IGNORE INTO info VALUES ('format', ?)",
                                       (FORMAT,))
            found = connection.execute("SELECT value FROM info WHERE key = 'format'"
                                       ).fetchone()
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise TextIndexError(f"{path} is not a usable text index ({exc}); 'dicosa check "
                                 "INDEX --repair' deletes it and the next 'dicosa index' run "
                                 "reads the videos' text again") from None
        if found is None or found[0] != FORMAT:
            connection.close()
            raise TextIndexError(f"{path} is a text index of format {found and found[0]}, "
                                 f"not {FORMAT}; delete it and run 'dicosa index' "
                                 "to read the videos' text again")
        return cls(connection, path, writable)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes (the index's writer only) ---------------------------------------------------
    def write(self, lines: Iterable[tuple[int, TextLine]], done: Iterable[tuple[int, Done]]
              ) -> None:
        """In one transaction: for each ``(row, Done)``, the row's earlier lines of that source
        are replaced by the given ``(row, line)`` pairs of it, and the record kept. A line's
        text is stored :func:`~dicosa.text.lines.capped`."""
        done, lines = list(done), list(lines)
        with self._writing():
            self._db.executemany("DELETE FROM line WHERE row = ? AND source = ?",
                                 [(row, d.source) for row, d in done])
            self._db.executemany(
                "INSERT INTO line(row, start_s, end_s, source, text) VALUES (?, ?, ?, ?, ?)",
                [(row, ln.start, ln.end, ln.source, capped(ln.text)) for row, ln in lines])
            self._db.executemany(
                "INSERT OR REPLACE INTO done VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(row, d.source, d.engine, d.lines, d.seconds, d.frames, d.note)
                 for row, d in done])

    def remove(self, ids: Iterable[int]) -> None:
        """Forget rows ``ids``: their lines and records, in one transaction."""
        ids = [(int(i),) for i in ids]
        if not ids:
            return
        with self._writing():
            self._db.executemany("DELETE FROM line WHERE row = ?", ids)
            self._db.executemany("DELETE FROM done WHERE row = ?", ids)

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed at the end, rolled back on an exception; a full disk
        or a read-only file is one sentence (:class:`~dicosa.files.StorageError`)."""
        with self._lock:
            try:
                yield self._db
                fault_point(TEXT_FILE)
                self._db.commit()
            except BaseException as exc:
                self._db.rollback()
                if isinstance(exc, sqlite3.OperationalError):
                    raise storage_error(OSError(0, str(exc)), self.path or ":memory:",
                                        "writing") from None
                if isinstance(exc, OSError):
                    raise storage_error(exc, self.path or ":memory:", "writing") from None
                raise

    # -- reads ------------------------------------------------------------------------------
    def _all(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def held(self, engines: dict[str, str]) -> np.ndarray:
        """Rows every source in ``engines`` (source -> engine) has read with that engine."""
        if not engines:
            return self.rows()
        found = None
        for source, engine in engines.items():
            rows = {r for (r,) in self._all("SELECT row FROM done WHERE source = ? AND "
                                            "engine = ?", (source, engine))}
            found = rows if found is None else found & rows
        return np.array(sorted(found or ()), dtype=np.int64)

    def engines(self, ids: np.ndarray) -> dict[tuple[int, str], str]:
        """``{(row, source): engine}`` of the records of rows ``ids``."""
        if not len(ids):
            return {}
        marks = ", ".join(str(int(i)) for i in ids)
        found = self._all(f"SELECT row, source, engine FROM done WHERE row IN ({marks})")
        return {(int(r), s): e for r, s, e in found}

    def rows(self) -> np.ndarray:
        """Every row any source has read (or holds lines of)."""
        found = self._all("SELECT row FROM done UNION SELECT row FROM line")
        return np.array(sorted(r for (r,) in found), dtype=np.int64)

    def search(self, expression: str, sources: Iterable[str], limit: int) -> list[Match]:
        """The ``limit`` best rows for an FTS5 ``expression`` over lines of ``sources``, each
        with its best line, best first (ties by row id)."""
        sources = list(sources)
        if not sources:
            return []
        marks = ", ".join("?" * len(sources))
        sql = (f"SELECT line.row, bm25(line_fts), line.id, line.start_s, line.end_s, "
               f"line.source, line.text FROM line_fts JOIN line ON line.id = line_fts.rowid "
               f"WHERE line_fts MATCH ? AND line.source IN ({marks}) "
               f"ORDER BY bm25(line_fts), line.row, line.id")
        best: dict[int, Match] = {}  # the first line met per row is its best
        with self._lock:
            cursor = self._db.execute(sql, (expression, *sources))
            while len(best) < limit:
                batch = cursor.fetchmany(512)
                if not batch:
                    break
                for r, s, i, a, b, src, text in batch:
                    if r not in best and len(best) < limit:
                        best[r] = Match(int(r), -float(s), int(i), float(a), float(b), src,
                                        text)
            cursor.close()
        return list(best.values())

    def lines(self, row: int) -> list[tuple[float, float, str, str]]:
        """``(start, end, source, text)`` of every line of ``row``, in time order."""
        return self._all("SELECT start_s, end_s, source, text FROM line WHERE row = ? "
                         "ORDER BY start_s, id", (int(row),))

    def sources(self) -> set[str]:
        """The sources that found a line in any row."""
        return {source for (source,) in self._all(
            "SELECT source FROM done WHERE lines > 0 GROUP BY source")}

    def stats(self) -> dict[str, dict]:
        """Per source: rows read, rows with lines, lines, their placements in rows, seconds
        transcribed, frames read. A line that overlaps several rows is stored with each
        (``placements``) and counted once in ``lines`` (by its time and text: the same
        words at the same time in two videos count once)."""
        counted = {source: (lines, placed) for source, lines, placed in self._all(
            "SELECT source, count(*), sum(placed) FROM (SELECT source, count(*) AS placed "
            "FROM line GROUP BY source, start_s, end_s, text) GROUP BY source")}
        out = {}
        for source, rows, found, seconds, frames in self._all(
                "SELECT source, count(*), sum(lines > 0), sum(seconds), sum(frames) FROM done "
                "GROUP BY source"):
            lines, placed = counted.get(source, (0, 0))
            out[source] = {"rows": rows, "rows_with_lines": int(found or 0),
                           "lines": int(lines or 0), "placements": int(placed or 0),
                           "seconds": float(seconds or 0), "frames": int(frames or 0)}
        return out

    def problems(self) -> list[str]:
        """What SQLite's integrity check and FTS5's own find wrong with the file.

        FTS5's check is a write statement (that writes nothing), which a read-only file
        refuses: there the word index's count of lines is compared with the table's
        instead (:attr:`fts_checked` says which ran)."""
        try:
            found = [r for (r,) in self._all("PRAGMA integrity_check") if r != "ok"]
            if self.writable and self._fts_check():
                return found[:5]
            (lines, indexed), = self._all("SELECT (SELECT count(*) FROM line), "
                                          "(SELECT count(*) FROM line_fts_docsize)")
            if lines != indexed:
                found.append(f"the word index holds {indexed} lines, the table {lines}")
        except sqlite3.DatabaseError as exc:
            return [f"integrity check failed ({exc})"]
        return found[:5]

    def _fts_check(self) -> bool:
        """FTS5's integrity check (raises where it finds damage); False where the file
        turned out read-only."""
        try:
            with self._lock:
                self._db.execute("INSERT INTO line_fts(line_fts, rank) VALUES "
                                 "('integrity-check', 1)")
        except sqlite3.OperationalError as exc:
            if not _read_only(exc):
                raise
            self.writable = False
            return False
        self.fts_checked = True
        return True

    def backup(self, path: Path) -> None:
        """Copy the whole index to ``path`` (an in-memory index saved into a folder)."""
        target = sqlite3.connect(path)
        try:
            with self._lock:
                self._db.backup(target)
        finally:
            target.close()


def check_text_file(directory: Path, live: np.ndarray, repair: bool
                    ) -> tuple[list[str], list[str], str | None]:
    """``(problems, repaired, checked)`` of ``directory``'s text index against the live rows:
    a file that does not open or fails its integrity checks (repair: deleted, read again from
    the videos by the next ``index`` run), lines of rows the manifest does not hold (left by
    a write that never committed: never searched; repair deletes them). A file that cannot be
    written is checked read-only (``checked`` says so), never called damaged for that."""
    path = Path(directory) / TEXT_FILE
    if not path.is_file():
        return [], [], None
    try:
        index = TextIndex.open(directory, create=False, write=True)
        broken = index.problems()
    except TextIndexError as exc:
        index, broken = None, [str(exc)]
    if broken:
        if index is not None:
            index.close()
        return _damaged(path, broken[0], repair)
    try:
        rows = index.rows()
        checked = f"text lines of {len(np.intersect1d(rows, live))} rows" + (
            "" if index.fts_checked else " (read-only: counted against the word index; "
            "FTS5's own check needs a file it can write)")
        stray = np.setdiff1d(rows, live)
        if not len(stray):
            return [], [], checked
        what = f"text lines of {len(stray)} row(s) the manifest does not hold"
        if repair and index.writable:
            index.remove(stray)
            return [], [what + ": deleted"], checked
        how = "--repair deletes them" if index.writable else "read-only here: not deleted"
        return [], [], checked + f"; {what} (never searched; {how})"
    finally:
        index.close()


def _damaged(path: Path, why: str, repair: bool) -> tuple[list[str], list[str], None]:
    """A damaged text file: reported, or deleted with ``repair`` (where it can be)."""
    what = f"{path} is damaged ({why})"
    if not repair:
        return [what + "; 'check --repair' deletes it (the next 'index' run reads the "
                "videos' text again)"], [], None
    try:
        path.unlink()
        Path(str(path) + "-journal").unlink(missing_ok=True)
    except OSError as exc:
        return [what + f"; it cannot be deleted here ({exc.strerror or exc})"], [], None
    return [], [what + ": deleted; the next 'index' run reads the videos' text again"], None
