"""The text index (SQLite FTS5): safe queries, phrases, BM25 order, records, checks; the
fusion's ranks and scores."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from dicosa.search.evidence import best_within, evidence_window
from dicosa.search.moment import Timeline
from dicosa.text.fts import TEXT_FILE, Done, TextIndex, TextIndexError, check_text_file
from dicosa.text.lines import MAX_LINE_CHARS, TextLine, capped, held
from dicosa.text.query import SNIPPET_CHARS, STOP_WORDS, snippet, text_query, words_of
from dicosa.text.rrf import competition_ranks, fuse, parse_sources

LINES = {0: [("subtitles", "my name is Oscar and I live by the river")],
         1: [("subtitles", "hello world"), ("speech", "Oscar says hi")],
         2: [("screen", "EXIT 42 LEFT LANE")],
         3: [("subtitles", "the exit is to the left, 42 metres")],
         4: [("speech", "nothing to see here")]}


def _filled(directory=None) -> TextIndex:
    index = TextIndex.open(directory, create=True)
    lines = [(row, TextLine("/v.mp4", 1.0, 2.0, text, source))
             for row, items in LINES.items() for source, text in items]
    done = [(row, Done(source, "e", 1)) for row, items in LINES.items() for source, _ in items]
    index.write(lines, done)
    return index


def _rows(index: TextIndex, query: str, sources=("subtitles", "speech", "screen")) -> list:
    expression = text_query(query).expression()
    return [m.row for m in index.search(expression, sources, 10)] if expression else []


NASTY = ['"', '""', '"""', "'", "NEAR(a b)", "NEAR(", "a AND", "OR", "NOT oscar", "*",
         "osc*", "-oscar", "+", "^oscar", "text:oscar", "{text}: oscar", "line_fts:oscar",
         "\x00", "oscar\x00hello", "\x00\x01\x1f", "'; DROP TABLE line; --", "()", ")(",
         "a" * 5000, " ".join(["w"] * 500), "🙂 émoji", "\\", "%", "_", "rank:", "bm25(",
         '"unbalanced quote', 'oscar"', "col1 : col2", "[", "]"]


@pytest.mark.parametrize("query", NASTY)
def test_fts5_syntax_in_user_input_never_raises_or_steers(query):
    """Each query runs without an error; its matches are exactly the rows whose lines hold
    one of its words that are not stop words, or all its words in order where it has only
    stop words (computed here from the words alone: no operator took effect)."""
    index = _filled()
    words = words_of(query.replace('"', " "))
    content = set(words) - STOP_WORDS

    def holds(text: str) -> bool:
        said = words_of(text)
        if content or not words:
            return bool(content & set(said))
        return any(said[i:i + len(words)] == words for i in range(len(said)))

    expected = sorted(row for row, items in LINES.items()
                      if any(holds(text) for _, text in items))
    if '"' in query and query.count('"') % 2 == 0 and query.strip('"'):
        return  # a quoted phrase: its own test
    assert sorted(_rows(index, query)) == expected
    assert index.problems() == []  # the table is intact (no injected statement ran)


def test_quoted_words_match_literally():
    index = _filled()
    assert sorted(_rows(index, '"exit 42"')) == [2]  # the words in this order, adjacent
    assert sorted(_rows(index, "exit 42")) == [2, 3]  # either word
    assert _rows(index, '"42 exit"') == []
    assert _rows(index, '"oscar" "river"') == [0]  # every phrase must be in the line
    assert _rows(index, '"oscar" "hello world"') == []  # row 1 has them in two lines
    assert _rows(index, 'river "says hi"') == [1]  # a phrase required, a word optional
    assert _rows(index, '"" oscar') == [1, 0] or _rows(index, '"" oscar') == [0, 1]


def test_a_stop_word_alone_never_matches_a_line():
    """OCR's "AA is Pe og 7" shares only "is" with "a man is walking": no match; a line
    with "man" matches, its stop words unmarked; a query of stop words alone is a phrase."""
    index = TextIndex.open(None, create=True)
    said = {0: "AA is Pe og 7", 1: "the man said no", 2: "to be or not to be",
            3: "or to be not"}
    index.write([(row, TextLine("/v.mp4", 0, 1, text, "screen")) for row, text in said.items()],
                [(row, Done("screen", "e", 1)) for row in said])
    assert _rows(index, "a man is walking") == [1]
    assert text_query("a man is walking").terms == {"man", "walking"}
    assert _rows(index, "is") == [0]  # the user asked for the word itself
    assert _rows(index, "To be, or not to be") == [2]  # in that order, not row 3
    assert _rows(index, '"man" is') == [1]  # a phrase: stop words never alone
    assert text_query("the").expression() == '"the"'


def test_long_lines_are_cut_and_answers_show_a_snippet():
    """A 6 MB cue is stored cut at MAX_LINE_CHARS (at a space, an ellipsis after it) and
    still found; a snippet of it is at most SNIPPET_CHARS around the matched word."""
    index = TextIndex.open(None, create=True)
    huge = " ".join(["filler"] * 400_000) + " treasure " + " ".join(["filler"] * 400_000)
    early = "treasure " + " ".join(["filler"] * 400_000)
    index.write([(0, TextLine("/v.mp4", 0, 9, huge, "subtitles")),
                 (1, TextLine("/v.mp4", 0, 9, early, "subtitles"))],
                [(0, Done("subtitles", "e", 1)), (1, Done("subtitles", "e", 1))])
    stored = next(text for _, _, _, text in index.lines(1))
    assert len(stored) <= MAX_LINE_CHARS and stored.endswith("filler\u2026")
    assert _rows(index, "treasure") == [1]  # the cut text is what is searched
    assert next(t for _, _, _, t in index.lines(0)) == capped(huge)
    shown = snippet(huge, {"treasure"})
    assert len(shown) <= SNIPPET_CHARS + 2 and "treasure" in shown
    assert shown.startswith("\u2026") and shown.endswith("\u2026")
    assert snippet("short line", {"x"}) == "short line"


def test_bm25_orders_by_rare_words_and_sources_filter():
    index = _filled()
    # "oscar" is in rows 0 and 1; row 0 also holds "river": the row with both first
    assert _rows(index, "oscar river") == [0, 1]
    assert _rows(index, "oscar", ("speech",)) == [1]
    assert _rows(index, "oscar", ("screen",)) == []
    match = index.search(text_query("exit lane").expression(), ["screen", "subtitles"], 1)[0]
    assert (match.row, match.source, match.text) == (2, "screen", "EXIT 42 LEFT LANE")
    assert match.score > 0 and (match.start, match.end) == (1.0, 2.0)


def test_records_replace_remove_and_stats():
    index = _filled()
    assert index.held({"subtitles": "e"}).tolist() == [0, 1, 3]
    assert index.held({"subtitles": "e", "speech": "e"}).tolist() == [1]
    assert index.held({"speech": "other"}).tolist() == []
    # reading row 1's speech again replaces its speech lines, keeps its subtitles
    index.write([(1, TextLine("/v.mp4", 0, 1, "new words", "speech"))],
                [(1, Done("speech", "f", 1, 3.0))])
    assert [t for _, _, _, t in index.lines(1)] == ["new words", "hello world"]  # by time
    assert index.engines(np.array([1])) == {(1, "subtitles"): "e", (1, "speech"): "f"}
    index.remove([1, 4])
    assert index.rows().tolist() == [0, 2, 3] and _rows(index, "hello") == []
    stats = index.stats()
    assert stats["subtitles"] == {"rows": 2, "rows_with_lines": 2, "lines": 2,
                                  "placements": 2, "seconds": 0.0, "frames": 0}
    assert index.problems() == []


def test_an_in_memory_index_is_saved_whole(tmp_path):
    index = _filled()
    index.backup(tmp_path / TEXT_FILE)
    reopened = TextIndex.open(tmp_path, create=False)
    assert sorted(_rows(reopened, "oscar")) == [0, 1] and not reopened.problems()


def test_readers_open_nothing_or_read_only(tmp_path):
    assert TextIndex.open(tmp_path, create=False) is None
    assert not (tmp_path / TEXT_FILE).exists()
    _filled(tmp_path).close()
    (tmp_path / TEXT_FILE).chmod(0o444)
    try:
        reader = TextIndex.open(tmp_path, create=False)
        assert sorted(_rows(reader, "oscar")) == [0, 1]
    finally:
        (tmp_path / TEXT_FILE).chmod(0o644)


def test_check_finds_stray_lines_and_damage(tmp_path):
    _filled(tmp_path).close()
    live = np.array([0, 1, 2])
    problems, repaired, checked = check_text_file(tmp_path, live, repair=False)
    assert problems == [] and "2 row(s) the manifest does not hold" in checked
    problems, repaired, _ = check_text_file(tmp_path, live, repair=True)
    assert repaired == ["text lines of 2 row(s) the manifest does not hold: deleted"]
    assert TextIndex.open(tmp_path, create=False).rows().tolist() == [0, 1, 2]
    path = tmp_path / TEXT_FILE
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page overwritten
    path.write_bytes(bytes(data))
    with pytest.raises(TextIndexError) as refused:
        TextIndex.open(tmp_path, create=False)
    assert "\n" not in str(refused.value)
    problems, _, _ = check_text_file(tmp_path, live, repair=False)
    assert len(problems) == 1 and "damaged" in problems[0]
    _, repaired, _ = check_text_file(tmp_path, live, repair=True)
    assert "deleted" in repaired[0] and not path.exists()


def test_another_format_is_refused(tmp_path):
    _filled(tmp_path).close()
    with sqlite3.connect(tmp_path / TEXT_FILE) as db:
        db.execute("UPDATE info SET value = '99' WHERE key = 'format'")
    with pytest.raises(TextIndexError, match="format 99"):
        TextIndex.open(tmp_path, create=False)


# -- fusion ---------------------------------------------------------------------------------
def test_competition_ranks_share_ties():
    ranks = competition_ranks(np.array([0.5, 0.9, 0.5, -np.inf, 0.1, np.nan, 0.9]))
    assert ranks.tolist() == [3, 1, 3, 0, 5, 0, 1]


def test_fuse_against_the_formula():
    visual = np.array([3.0, 2.0, 1.0, -np.inf, -np.inf])  # row 3: no frames; row 4: padding
    text_rank = np.array([0, 2, 1, 1, 0])
    share = np.array([0.0, 0.5, 1.0, 1.0, 0.0])
    k, w = 10.0, 2.0
    fused = fuse(visual, text_rank, share, use_visual=True, k=k, weight=w)
    expected = [1 / (k + 1), 1 / (k + 2) + w * 0.5 / (k + 2), 1 / (k + 3) + w / (k + 1),
                w / (k + 1), -math.inf]
    assert fused.tolist() == pytest.approx(expected)
    alone = fuse(visual, text_rank, share, use_visual=False, k=k, weight=w)
    assert alone.tolist() == pytest.approx([-math.inf, w * 0.5 / (k + 2), w / (k + 1),
                                            w / (k + 1), -math.inf])


def test_parse_sources():
    assert parse_sources(None) == {"visual", "subtitles", "speech", "screen"}
    assert parse_sources("all") == parse_sources(None)
    assert parse_sources("text") == {"subtitles", "speech", "screen"}
    assert parse_sources("visual, Speech") == {"visual", "speech"}
    assert parse_sources(["screen"]) == {"screen"}
    for bad in ("sound", "", ","):
        with pytest.raises(ValueError):
            parse_sources(bad)


def test_a_relative_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("rel").mkdir()
    _filled(Path("rel")).close()
    assert sorted(_rows(TextIndex.open(Path("rel"), create=False), "oscar")) == [0, 1]


def test_a_row_holds_a_share_of_a_line():
    start, end = np.array([0.0, 5.0, np.nan]), np.array([5.0, 9.0, np.nan])
    part = held(np.array([4.7, 4.7, 4.7]), np.array([6.0, 6.0, 6.0]), start, end)
    assert part.tolist() == pytest.approx([0.3 / 1.3, 1.0 / 1.3, 1.0])  # unknown span: 1
    assert held(np.array([2.0]), np.array([2.0]), np.array([0.0]), np.array([5.0])) == [1.0]


def test_the_best_frame_is_taken_where_the_evidence_is():
    """The heaviest scored frame inside the range (not the video's heaviest); the range's
    middle, marked at the nearest frame, where no frame lies in it."""
    times = np.array([0.5, 1.5, 2.5, 3.5, 4.5])
    weights = np.array([0.1, 0.9, 0.2, 0.3, 0.25])
    scores = np.array([0.4, 0.4, 0.1, 0.1, -np.inf])  # frame 4: no scored row holds it
    timeline = Timeline(times, weights, scores, 1, 1.5, 0.9, [])
    assert best_within(timeline, None) is timeline
    inside = best_within(timeline, (2.0, 5.0))
    assert (inside.best_frame, inside.best_time, inside.best_weight) == (3, 3.5, 0.3)
    between = best_within(timeline, (1.8, 2.4))
    assert (between.best_frame, between.best_time) == (2, 2.1)
    assert evidence_window((2.0, 6.0), (4.7, 8.0)) == (4.7, 6.0)  # the line within the moment
    assert evidence_window((0.0, 3.0), (4.7, 6.0)) == (4.7, 6.0)  # they do not meet: the line
    assert evidence_window((2.0, 6.0), None) == (2.0, 6.0)
    assert evidence_window((None, None), None) is None
