"""The heads an index remembers: ``index --head/--concepts`` record them, ``search`` reattaches
them, and ``search --head/--concepts`` replace them (a moved file, say)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import dicosa.__main__ as cli
import dicosa.loading as loading
from dicosa.heads import save_head
from dicosa.heads.lexical import VDRConfig, VDRHead
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA
from dicosa.plugins.exclusion import CODES_FILE, recorded_config
from dicosa.search.exclusion import ExclusionConfig

from ._scenes import trained_head
from ._videos import write_frames
from .conftest import loads, tiny_config
from .test_lexical import _toy

QUERY = "a red circle without a blue square"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An index of 3 clips built on the command line with a lexical and a concepts head."""
    folder = tmp_path_factory.mktemp("recorded")
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(use_factors=False)).eval()
    g = np.random.default_rng(0)
    for i in range(3):
        write_frames(folder / "videos" / f"clip{i}.mp4",
                     g.integers(0, 255, (8, 32, 32, 3), dtype=np.uint8))
    lexical = VDRHead.fit(model, _toy(model, rotate=True)[0],
                          VDRConfig(distractors=50, epochs=2, video_k=6), progress=False)
    heads = {"lexical": save_head(lexical, folder / "vdr.pt", model),
             "concepts": save_head(trained_head()[1], folder / "concepts.pt", model)}
    out = folder / "index"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "load_model", loads(model, {"config": "tiny"}))
        assert cli.main(["index", str(folder / "videos"), "--out", str(out), "--num-workers",
                         "0", "--head", str(heads["lexical"]), "--concepts",
                         str(heads["concepts"])]) == 0
    return {"model": model, "index": out, "heads": heads, "folder": folder}


def test_index_records_the_concepts_head_and_search_reuses_it(built, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(built["model"], {"config": "tiny"}))
    folder = shutil.copytree(built["index"], tmp_path / "index")
    meta = json.loads((folder / "manifest.json").read_text())["meta"]
    assert meta["concepts"] == {"head": str(built["heads"]["concepts"].resolve())}
    assert np.load(folder / CODES_FILE).shape[0] == 3  # computed at indexing time
    search = ["search", str(folder), QUERY, "-k", "3", "--json", "--explain"]
    assert cli.main([*search, "--concepts", str(built["heads"]["concepts"])]) == 0
    given = json.loads(capsys.readouterr().out)
    assert cli.main(search) == 0
    recorded = json.loads(capsys.readouterr().out)
    assert recorded["results"] == given["results"]
    assert all("matched" in r["explain"]["exclusion"]
               for r in recorded["results"])  # the exclusion ran


def test_exclusion_settings_are_recorded_and_kept(built, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(built["model"], {"config": "tiny"}))
    folder = shutil.copytree(built["index"], tmp_path / "index")
    search = ["search", str(folder), QUERY, "-k", "3", "--json", "--explain"]

    def recorded() -> dict:
        return json.loads((folder / "manifest.json").read_text())["meta"]["concepts"]

    assert cli.main(search) == 0
    default = json.loads(capsys.readouterr().out)["results"]
    # The paper's tiers, every window counting as showing B: every candidate is demoted
    # below the others' scores.
    assert cli.main([*search, "--exclusion-set", "method=tiers",
                     "--exclusion-set", "presence_threshold=-1e9"]) == 0
    given = json.loads(capsys.readouterr().out)["results"]
    assert [r["score"] for r in given] != [r["score"] for r in default]
    assert recorded()["settings"] == {"method": "tiers", "presence_threshold": -1e9}
    assert cli.main(search) == 0  # without the option: the recorded settings
    assert json.loads(capsys.readouterr().out)["results"] == given
    index = VideoIndex.load(folder, built["model"])
    assert recorded_config(index, window=3) == ExclusionConfig(
        method="tiers", presence_threshold=-1e9, window=3)
    # One key changed, the other kept; the default again drops a key from the record (the
    # default rule, demote, does not read the tiers' threshold).
    assert cli.main([*search, "--exclusion-set", "method=demote"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == default
    assert recorded()["settings"] == {"presence_threshold": -1e9}
    assert cli.main([*search, "--exclusion-set", "widow=1"]) == 2
    assert "widow" in capsys.readouterr().err
    assert recorded()["settings"] == {"presence_threshold": -1e9}


def test_search_head_replaces_a_moved_lexical_head(built, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(built["model"], {"config": "tiny"}))
    folder = shutil.copytree(built["index"], tmp_path / "index")
    search = ["search", str(folder), "a red circle", "-k", "3", "--json", "--mode", "lexical"]
    assert cli.main(search) == 0
    before = json.loads(capsys.readouterr().out)["results"]
    recorded = str(built["heads"]["lexical"].resolve())
    moved = shutil.copy(recorded, tmp_path / "moved.pt")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["meta"]["lexical"]["head"] = str(tmp_path / "gone.pt")  # as if it had moved
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(search) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: the lexical head recorded in the index, {tmp_path / 'gone.pt'}, is missing; "
        "pass --head HEAD.pt with its new location")
    assert cli.main([*search, "--head", str(moved)]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == before
    assert cli.main(search) == 0  # the new location is recorded
    assert json.loads(capsys.readouterr().out)["results"] == before
    assert json.loads((folder / "manifest.json").read_text())["meta"]["lexical"]["head"] == (
        str(moved))


def test_python_api_gives_the_command_lines_results(built, tmp_path, capsys, monkeypatch):
    """An index with lexical, concepts and fusion records, made on the command line: the
    Python API's open_index restores the same model and plugins and returns exactly the
    command line's ids, scores and stages."""
    from dicosa import open_index

    monkeypatch.setattr(loading, "load_model", loads(built["model"], {"config": "tiny"}))
    folder = shutil.copytree(built["index"], tmp_path / "index")
    assert cli.main(["search", str(folder), "a red circle", "--fusion", "--beta-title",
                     "0.3"]) == 0  # records late fusion
    capsys.readouterr()
    assert cli.main(["search", str(folder), QUERY, "-k", "2", "--candidates", "1",
                     "--json"]) == 0  # few candidates: the first stages propose
    said = json.loads(capsys.readouterr().out)["results"]
    index = open_index(folder)
    # text: the command line reads subtitles whenever present, so it records the text plugin
    assert set(index.plugins) == {"lexical", "concepts", "fusion", "text"}
    hits = index.search(QUERY, k=2, candidates=1)
    assert [h.id for h in hits] == [r["id"] for r in said]
    assert [h.stage for h in hits] == [r["stage"] for r in said]
    assert [h.score for h in hits] == pytest.approx([r["score"] for r in said], abs=1e-6)
    assert {"dense", "title"} <= {s for r in said for s in r["stage"].split("+")}
    lexical = index.search(QUERY, k=2, candidates=1, mode="lexical")
    assert cli.main(["search", str(folder), QUERY, "-k", "2", "--candidates", "1", "--json",
                     "--mode", "lexical"]) == 0
    assert [h.id for h in lexical] == [r["id"] for r in
                                       json.loads(capsys.readouterr().out)["results"]]
