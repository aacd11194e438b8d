"""The text plugin on a real index folder: lines read at add and attach, fused search, the
matched line, ``source=``, record and restore, who writes, a crash between the text commit
and the manifest commit, ``check``, the command line."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from dicosa.__main__ import main
from dicosa.index import VideoIndex
from dicosa.index.check import check_index
from dicosa.model import DiCoSA
from dicosa.plugins.text import TextPlugin, attach_text
from dicosa.search.query import QueryError
from dicosa.text.fts import TEXT_FILE, TextIndex

from ._system import needs
from ._text_media import say, silence, write_clip
from .conftest import loads, tiny_config

SAID = {"oak": "The treasure is buried under the old oak", "gate": "Meet me at gate seven",
        "river": "The boat waits by the river"}


class FakeRecognizer:
    """Hears "a fake word" 0.5 s into every stretch of sound it is given."""

    name, rate = "fake", 16000

    def transcribe(self, chunks):
        chunks = list(chunks)
        if chunks:
            yield chunks[0][0] + 0.5, chunks[0][0] + 1.0, "a fake word"


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    """Five 2 s clips with a silent sound track; three with a sidecar SRT of one line."""
    folder = tmp_path_factory.mktemp("videos")
    for i, name in enumerate(["oak", "gate", "river", "plain", "quiet"]):
        write_clip(folder / f"{name}.mp4", 2.0, size=(32, 32), sound=silence(2.0))
        if name in SAID:
            (folder / f"{name}.srt").write_text(
                f"1\n00:00:00,{200 * i:03d} --> 00:00:01,500\n{SAID[name]}\n")
    return folder


def _build(model, videos: Path, out: Path, files: list[str] | None = None) -> VideoIndex:
    paths = [videos / f"{f}.mp4" for f in files] if files else videos
    return VideoIndex.build(model, paths, out, num_workers=0, progress=False, backend="exact")


@pytest.fixture(scope="module")
def built(model, videos, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "index"
    index = _build(model, videos, out, ["oak", "gate", "river", "plain"])
    attach_text(index)
    return out


def test_words_find_what_the_pictures_do_not_show(model, built):
    index = VideoIndex.load(built, model)
    assert index.meta["text"] == {"subtitles": True, "speech": None, "ocr_frames": 0,
                                  "rrf_k": index.plugins["text"].rrf_k,
                                  "text_weight": index.plugins["text"].text_weight}
    result = index.query("the boat by the river", k=4)
    assert Path(result.hits[0].path).name == "river.mp4"
    line = result.explain(0)["text"]
    assert line["text"] == SAID["river"] and line["source"] == "subtitles"
    assert (line["start"], line["end"]) == (pytest.approx(0.4), pytest.approx(1.5))
    assert set(line["words"]) >= {"boat", "river"} and line["text_rank"] == 1
    # pictures only: DiCoSA's own ranking and scores
    visual = index.query("the boat by the river", k=4, source="visual")
    assert all(h.score == h.dicosa for h in visual.hits)
    assert [h.id for h in visual.hits] == [h.id for h in index.query(
        "the boat by the river", k=4, source="visual").hits]
    # words only: the matching rows alone, by BM25
    words = index.query('"gate seven"', k=4, source="subtitles")
    assert [Path(h.path).name for h in words.hits] == ["gate.mp4"]
    assert index.query("gate", k=4, source="speech").hits == []


def test_a_text_source_without_the_plugin_is_one_sentence(model, videos, tmp_path):
    index = _build(model, videos, tmp_path / "bare", ["plain"])
    assert len(index.query("anything", k=1, source="visual").hits) == 1
    with pytest.raises(QueryError, match="no text lines"):
        index.query("anything", source="speech")
    with pytest.raises(QueryError, match="unknown source"):
        index.query("anything", source="sound")


def test_added_rows_are_read_in_their_transaction_and_removed(model, videos, built, tmp_path):
    folder = Path(shutil.copytree(built, tmp_path / "copy"))
    index = VideoIndex.load(folder, model)
    index.add([videos / "quiet.mp4"], num_workers=0, progress=False)
    text = index.plugins["text"]
    quiet = int(index.ids[-1])
    assert text.index.held({"subtitles": "pysubs2"}).tolist() == index.ids.tolist()
    assert text.index.lines(quiet) == []  # read: it has no subtitles
    index.remove([str(videos / "gate.mp4")])
    assert index.query("gate seven", k=5, source="subtitles").hits == []
    assert len(text.index.rows()) == len(index)


def test_speech_engine_recorded_and_read_again_when_it_changes(model, videos, tmp_path):
    index = _build(model, videos, tmp_path / "speech", ["oak", "plain"])
    plugin = attach_text(index, speech="pocketsphinx", recognizer=FakeRecognizer())
    assert plugin.reports["speech"].seconds == pytest.approx(4.0, abs=0.1)
    found = index.query("fake", k=2, source="speech")
    assert len(found.hits) == 2 and found.explain(0)["text"]["source"] == "speech"
    assert index.meta["text"]["speech"] == "pocketsphinx"
    held = plugin.index.held({"speech": "pocketsphinx"})
    # another engine: the rows are read again (and only then)
    again = attach_text(index, speech="whisper:tiny", recognizer=FakeRecognizer())
    assert again.reports["speech"].videos == 2 and held.tolist() == index.ids.tolist()
    assert again.index.held({"speech": "whisper:tiny"}).tolist() == index.ids.tolist()
    assert attach_text(index).reports == {}  # nothing left to read


def test_a_model_that_cannot_load_leaves_the_index_and_its_rows_unread(model, videos, tmp_path,
                                                                      caplog):
    index = _build(model, videos, tmp_path / "noload", ["oak"])
    with caplog.at_level(logging.WARNING):
        plugin = attach_text(index, speech=f"whisper:{tmp_path / 'missing'}")
    assert "speech" in plugin.reader.unavailable and len(index) == 1
    assert plugin.index.held({"speech": plugin.settings.speech}).tolist() == []
    assert index.query("treasure", k=1).hits[0].path.endswith("oak.mp4")  # subtitles still


def test_a_reader_never_writes_the_text_file(model, videos, built, tmp_path, caplog):
    """Rows added without the plugin stay unread by a process that only searches (its file
    untouched); the next writer reads them."""
    folder = Path(shutil.copytree(built, tmp_path / "reader"))
    bare = VideoIndex.load(folder, model, plugins=False)
    bare.add([videos / "quiet.mp4"], num_workers=0, progress=False)
    before = (folder / TEXT_FILE).read_bytes()
    with caplog.at_level(logging.INFO, logger="dicosa.plugins.text"):
        reader = VideoIndex.load(folder, model)
    assert "1 indexed video(s) have not had their text read" in caplog.text
    reader.query("treasure", k=2)
    assert (folder / TEXT_FILE).read_bytes() == before
    attach_text(reader)
    assert reader.plugins["text"].index.held({"subtitles": "pysubs2"}).tolist() == (
        reader.ids.tolist())


def test_an_in_memory_index_saves_its_text(model, videos, tmp_path):
    index = VideoIndex(model, backend="exact")
    index.add([videos / "oak.mp4", videos / "plain.mp4"], num_workers=0, progress=False)
    attach_text(index)
    index.save(tmp_path / "saved")
    reopened = VideoIndex.load(tmp_path / "saved", model)
    assert reopened.query("treasure", k=1, source="text").hits[0].path.endswith("oak.mp4")


def _add_and_die(folder: Path, model, video: Path, point: int) -> None:
    torch.set_num_threads(1)
    os.environ.pop("_DICOSA_WRITES", None)
    os.environ["DICOSA_KILL_AT_WRITE"] = str(point)
    VideoIndex.load(folder, model).add([video], num_workers=0, progress=False)


def test_a_crash_between_the_text_commit_and_the_manifest(model, videos, built, tmp_path):
    """SIGKILL at the manifest commit that follows the text commit of an add: the text file
    holds lines of a row the manifest does not (a reserved id); no search ever returns it,
    check says so, and the next write deletes them and reads the video again."""
    count = Path(shutil.copytree(built, tmp_path / "count"))
    log = tmp_path / "writes.log"
    os.environ["DICOSA_FAULT_LOG"] = str(log)
    try:
        os.environ.pop("_DICOSA_WRITES", None)
        VideoIndex.load(count, model).add([videos / "quiet.mp4"], num_workers=0,
                                          progress=False)
    finally:
        os.environ.pop("DICOSA_FAULT_LOG")
        os.environ.pop("_DICOSA_WRITES", None)
    labels = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    point = labels.index("manifest.json", labels.index(TEXT_FILE)) + 1
    folder = Path(shutil.copytree(built, tmp_path / "crash"))
    video = Path(shutil.copy(videos / "quiet.mp4", tmp_path / "late.mp4"))
    (tmp_path / "late.srt").write_text("1\n00:00:00,500 --> 00:00:01,000\nzebra crossing\n")
    child = multiprocessing.get_context("fork").Process(
        target=_add_and_die, args=(folder, model, video, point))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    index = VideoIndex.load(folder, model)
    stray = np.setdiff1d(TextIndex.open(folder, create=False).rows(), index.ids)
    assert len(stray) == 1 and str(video) not in index.paths
    assert index.query("zebra crossing", k=5, source="text").hits == []
    report = check_index(folder)
    assert report.ok and any("1 row(s) the manifest does not hold" in c for c in report.checked)
    index.add([video], num_workers=0, progress=False)
    found = index.query("zebra crossing", k=5, source="text").hits
    assert [h.path for h in found] == [str(video)] and found[0].id not in stray
    assert np.setdiff1d(index.plugins["text"].index.rows(), index.ids).size == 0


def test_check_repairs_a_damaged_text_file_and_the_writer_reads_again(model, built, tmp_path):
    folder = Path(shutil.copytree(built, tmp_path / "damaged"))
    path = folder / TEXT_FILE
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    assert not check_index(folder).ok
    repaired = check_index(folder, repair=True)
    assert repaired.ok and any(TEXT_FILE in r for r in repaired.repaired)
    reader = VideoIndex.load(folder, model)  # no file: no lines, nothing written
    assert not path.exists() and reader.query("river", k=1, source="text").hits == []
    attach_text(reader)
    assert reader.query("river", k=1, source="text").hits[0].path.endswith("river.mp4")


def test_the_command_line(model, videos, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("dicosa.loading.load_model", loads(model, {"config": "tiny"}))
    monkeypatch.setattr("dicosa.loading.model_from_source", lambda source, towers="all": model)
    out = tmp_path / "cli"
    folder = tmp_path / "videos"
    folder.mkdir()
    for name in ("oak", "gate", "plain"):
        shutil.copy(videos / f"{name}.mp4", folder)
        if name in SAID:
            shutil.copy(videos / f"{name}.srt", folder)
    assert main(["index", str(folder), "--out", str(out), "--num-workers", "0",
                 "--backend", "exact", "--speech", "nonsense"]) == 2
    assert "unknown speech engine" in capsys.readouterr().err
    assert main(["index", str(folder), "--out", str(out), "--num-workers", "0",
                 "--backend", "exact"]) == 0
    said = capsys.readouterr().out
    assert "subtitles (pysubs2): 2 of 3 videos with subtitles, 2 lines" in said
    assert "text index: subtitles 2 lines in 2 of 3 rows" in said
    assert main(["search", str(out), "where is the treasure", "--json", "-k", "2"]) == 0
    answer = json.loads(capsys.readouterr().out)
    first = answer["results"][0]
    assert first["path"].endswith("oak.mp4") and first["line"]["text"] == SAID["oak"]
    assert main(["search", str(out), "treasure", "--source", "visual", "--json"]) == 0
    assert all(r["line"] is None and r["lines"] == []  # as /api/search says it
               for r in json.loads(capsys.readouterr().out)["results"])
    assert main(["search", str(out), "gate", "--source", "subtitles"]) == 0
    table = capsys.readouterr().out
    assert 'subtitles 0:00.2-0:01.5 "Meet me at [gate] seven"' in table
    assert main(["search", str(out), "gate", "--source", "noise"]) == 2
    assert "unknown source 'noise'" in capsys.readouterr().err
    assert main(["check", str(out)]) == 0
    assert "text lines of 3 rows" in capsys.readouterr().out
    assert TextPlugin.restore(VideoIndex.load(out).meta["text"], None).asked["subtitles"]


def test_the_service_answers_with_the_line(model, built):
    """``source`` on GET and POST, each hit's matched line (null where none), an unknown
    source one sentence."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dicosa.serve.app import Settings, create_app
    from dicosa.serve.engine import Engine

    engine = Engine(VideoIndex.load(built, model))
    with TestClient(create_app(engine, Settings(reload_interval_s=0)),
                    raise_server_exceptions=False) as client:
        got = client.get("/api/search", params={"q": "meet at the gate", "k": 2}).json()
        assert got["hits"][0]["name"].startswith("gate")
        assert got["hits"][0]["line"]["text"] == SAID["gate"]
        posted = client.post("/api/search", json={"q": "gate", "source": "subtitles"}).json()
        assert [h["line"]["source"] for h in posted["hits"]] == ["subtitles"]
        visual = client.get("/api/search", params={"q": "gate", "source": "visual"}).json()
        assert all(h["line"] is None for h in visual["hits"]) and len(visual["hits"]) == 4
        bad = client.get("/api/search", params={"q": "gate", "source": "smell"})
        assert bad.status_code == 400 and "unknown source" in bad.json()["error"]


@needs("espeak-ng")
def test_a_spoken_word_is_found_at_its_time(model, videos, tmp_path):
    """espeak-ng says "the secret number is seven" from 1 s into one clip of three; with
    PocketSphinx, searching "seven" in what is said finds that clip, its line starting
    within 0.3 s of 1 s."""
    folder = tmp_path / "spoken"
    folder.mkdir()
    for name in ("oak", "plain"):
        shutil.copy(videos / f"{name}.mp4", folder)
    write_clip(folder / "said.mp4", 4.0, size=(32, 32),
               sound=np.concatenate([silence(1.0), say("the secret number is seven")]))
    index = _build(model, folder, tmp_path / "index")
    attach_text(index, subtitles=False, speech="pocketsphinx")
    hits = index.query("seven", k=3, source="speech").hits
    assert [Path(h.path).name for h in hits] == ["said.mp4"]
    line = index.plugins["text"].match(index.query("seven", k=1, source="speech"), 0)
    assert "seven" in line["words"] and abs(line["start"] - 1.0) <= 0.3
