"""Incomplete entries in a real index: titles, text-only rows, lost frames, fused scores."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from dicosa.__main__ import main
from dicosa.data.synthetic import make_synthetic
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.plugins.titles import TITLES_FILE, attach_titles, explain_hits
from dicosa.search.title_fusion import read_titles

from .conftest import tiny_config

TITLE = "a purple triangle spins slowly"  # the undecodable video's title
TINY = ["--config", "configs/synthetic.yaml", "--set", "model.num_frames=4"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = make_synthetic(tmp_path_factory.mktemp("synthetic"), num_train=0, num_test=4,
                          size=32, seconds=1.0, num_workers=1)
    videos = root / "videos"
    (videos / "broken.mp4").write_bytes(b"\x00" * 64)  # undecodable, titled
    (videos / "nameless.mp4").write_bytes(b"\x00" * 64)  # undecodable, no title
    return videos


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def index(folder, model, tmp_path_factory):
    titles = {folder / "broken.mp4": TITLE, folder / "video0.mp4": "a red square",
              folder / "video1.mp4": "a green circle", folder / "video2.mp4": "a blue cross",
              folder / "video3.mp4": "a yellow star falls"}
    index = VideoIndex.build(model, folder, tmp_path_factory.mktemp("idx") / "index",
                             titles=titles, batch_size=2, num_workers=0, progress=False)
    # A partially corrupted video: half its frames did not decode (mask) and it says so.
    first = index.metadata.index[index.metadata["path"].str.endswith("video0.mp4")]
    video = index.store.gather(first.to_numpy())
    mask = video.frame_mask.clone()
    mask[:, mask.shape[1] // 2:] = False
    index.add_features(VideoFeatures(video.frames, mask),
                       [{"path": "/corrupted.mp4", "title": "", "text_only": False,
                         "frames_lost": 0.5, "valid_frames": int(mask.sum())}])
    return index


def test_titled_undecodable_video_is_indexed_text_only(index, folder):
    table = index.metadata.set_index("path")
    broken = str((folder / "broken.mp4").resolve())
    assert bool(table.loc[broken, "text_only"]) and table.loc[broken, "title"] == TITLE
    assert not index.store.gather(index.ids[table.index == broken]).frame_mask.any()
    assert [p for p, _ in index.text_only] == [broken]
    assert [p.split("/")[-1] for p, _ in index.skipped] == ["nameless.mp4"]
    assert len(index) == 4 + 1 + 1
    assert table.loc["/corrupted.mp4", "frames_lost"] == pytest.approx(0.5)


def test_plain_search_never_ranks_a_text_only_row_by_nan(index):
    for candidates in (2, None):
        hits = index.search("a red circle moves left", k=len(index), candidates=candidates)
        assert all(not math.isnan(h.score) for h in hits)
        text_only = [h for h in hits if h.path.endswith("broken.mp4")]
        assert all(h.score == float("-inf") for h in text_only) or not text_only


def test_text_only_row_is_found_by_its_title_through_fusion(index):
    hook = attach_titles(index, beta_title=5.0, trust=1.0)
    try:
        hits = index.search(TITLE, k=2, candidates=3)  # the title stage must propose it
        assert hits[0].path.endswith("broken.mp4")
        assert "title" in hits[0].stage
        assert all(math.isfinite(h.score) for h in hits)
        corrupted = index.search("a red circle", k=len(index), candidates=len(index))
        assert any(h.path == "/corrupted.mp4" and math.isfinite(h.score) for h in corrupted)
        assert hook.rows.frames_lost[corrupted[0].id] >= 0
    finally:
        index.plugins.hooks.remove(hook)


def test_fused_scores_decompose_into_their_parts(index):
    hook = attach_titles(index, beta_title=0.7, trust=0.5)
    try:
        result = index.query("a red square", k=len(index), candidates=len(index))
        hits = result.hits
        parts = explain_hits(hook, result)
    finally:
        index.plugins.hooks.remove(hook)
    assert len(parts) == len(hits)
    for hit, part in zip(hits, parts, strict=True):
        assert part["fused"] == pytest.approx(part["dicosa"] + 0.7 * part["title"], abs=1e-5)
        assert part["fused"] == pytest.approx(hit.score, abs=1e-5)
        if not part["text_only"]:
            assert part["dicosa"] == pytest.approx(hit.dicosa, abs=1e-5)


def test_cli_titles_round_trip(folder, tmp_path, capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    sidecar = folder / "titles.csv"  # not a video extension: not indexed
    sidecar.write_text(f"path,title\n{folder / 'broken.mp4'},{TITLE}\n"
                       "video0.mp4,a red square\nvideo1.mp4,a green circle\n"
                       f"video2.mp4,a blue cross\n{folder / 'video3.mp4'},\n")
    titles = read_titles(sidecar)  # relative paths: from the sidecar's folder
    assert titles[str((folder / "broken.mp4").resolve())] == TITLE
    assert titles[str((folder / "video0.mp4").resolve())] == "a red square"
    out = tmp_path / "index"
    assert main(["index", str(folder), "--out", str(out), "--titles", str(sidecar),
                 "--num-workers", "0", *TINY]) == 0
    assert "from its title alone" in capsys.readouterr().out
    table = VideoIndex.load(out).metadata.set_index("path")
    assert table.loc[str((folder / "broken.mp4").resolve()), "title"] == TITLE
    assert main(["search", str(out), TITLE, "-k", "3", "--candidates", "2", "--fusion",
                 "--beta-title", "5", "--trust", "1", "--explain", "--json", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["results"][0]["path"].endswith("broken.mp4")
    parts = [r["explain"]["fusion"] for r in result["results"]]
    assert set(parts[0]) >= {"dicosa", "title", "fused", "text_only"}
    assert parts[0]["text_only"] is True
    assert np.isfinite([p["fused"] for p in parts]).all()
    assert main(["search", str(out), TITLE, "-k", "2", "--fusion", "--explain", *TINY]) == 0
    assert "fusion parts" in capsys.readouterr().out
    recorded_fusion_is_kept(out, result, capsys)


def recorded_fusion_is_kept(out, fused: dict, capsys) -> None:
    """The index remembers the last fusion asked for; weights not given keep their values."""
    def recorded() -> dict:
        return json.loads((out / "manifest.json").read_text())["meta"]["fusion"]

    # The last search above gave --fusion alone: the weights given before are kept.
    assert recorded() == {"head": None, "beta_semantic": 0.0, "beta_title": 5.0, "trust": 1.0}
    search = ["search", str(out), TITLE, "-k", "3", "--candidates", "2", "--json", *TINY]
    assert main([*search, "--explain"]) == 0  # no fusion option: the recorded one
    again = json.loads(capsys.readouterr().out)
    assert again["results"] == fused["results"]  # their explanations too
    assert main([*search, "--fusion", "--trust", "0"]) == 0  # one weight changed
    capsys.readouterr()
    assert recorded() == {"head": None, "beta_semantic": 0.0, "beta_title": 5.0, "trust": 0.0}
    assert main([*search, "--no-fusion"]) == 0
    plain = json.loads(capsys.readouterr().out)["results"]
    assert not any(r["path"].endswith("broken.mp4") for r in plain)  # text-only: not found
    assert recorded()["trust"] == 0.0  # --no-fusion leaves the record alone
    assert main([*search, "--no-fusion", "--fusion"]) == 2
    assert "--no-fusion searches without fusion" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["meta"]["fusion"]["head"] = str(out / "gone.pt")  # a Mul2vec head that moved
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(search) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: the fusion head recorded in the index, {out / 'gone.pt'}, is missing; "
        "pass --mul2vec HEAD.pt with its new location")


def test_mul2vec_fusion_finds_the_text_only_row_and_decomposes(index, model):
    from dicosa.heads.mul2vec import Mul2vecConfig, Mul2vecHead

    torch.manual_seed(0)  # untrained: θ_q = f(e_q) equals the text-only row's g = f(e_title)
    head = Mul2vecHead(Mul2vecConfig(), dim=model.embed_dim, vocab=["a"], num_docs=1,
                       num_entities=1).eval()
    hook = attach_titles(index, head, beta_semantic=0.3)
    try:
        hits = index.search(TITLE, k=2, candidates=2)  # the semantic stage must propose it
        assert hits[0].path.endswith("broken.mp4") and "semantic" in hits[0].stage
        result = index.query(TITLE, k=len(index), candidates=len(index))
        hits = result.hits
        parts = explain_hits(hook, result)
    finally:
        index.plugins.hooks.remove(hook)
    assert "title" not in parts[0]  # Mul2vec fusion: β_title = 0 by default
    for hit, part in zip(hits, parts, strict=True):
        assert part["fused"] == pytest.approx(part["dicosa"] + 0.3 * part["semantic"], abs=1e-5)
        assert part["fused"] == pytest.approx(hit.score, abs=1e-5)


def test_a_mul2vec_head_file_is_recorded_with_its_weights(index, model, tmp_path):
    from dicosa.heads import save_head
    from dicosa.heads.mul2vec import Mul2vecConfig, Mul2vecHead

    torch.manual_seed(0)
    head = Mul2vecHead(Mul2vecConfig(), dim=model.embed_dim, vocab=["a"], num_docs=1,
                       num_entities=1).eval()
    path = save_head(head, tmp_path / "m2v.pt", model)
    folder = shutil.copytree(index.directory, tmp_path / "index")
    attach_titles(VideoIndex.load(folder, model), path, trust=0.25)
    assert VideoIndex.load(folder).meta["fusion"] == {
        "head": str(path.resolve()), "beta_semantic": 0.2, "beta_title": 0.0, "trust": 0.25}
    before = (folder / "manifest.json").stat().st_mtime_ns
    attach_titles(VideoIndex.load(folder, model), head)  # an object: nothing recorded
    assert (folder / "manifest.json").stat().st_mtime_ns == before


def test_titles_are_encoded_once_and_kept_beside_the_index(index, model, tmp_path,
                                                           monkeypatch):
    """The text tower runs once per title: not again in a later session; a row added after
    attaching joins the fusion arrays, and its title is the only one encoded then."""
    shutil.copytree(index.directory, tmp_path / "index")
    for stale in (tmp_path / "index").glob(f"{TITLES_FILE}.*"):
        stale.unlink()  # earlier tests attached fusion to this index
    encoded = []
    encode_text = model.encode_text
    monkeypatch.setattr(model, "encode_text",
                        lambda tokens: encoded.append(len(tokens)) or encode_text(tokens))

    copy = VideoIndex.load(tmp_path / "index", model)
    hook = attach_titles(copy, beta_title=5.0, trust=1.0)
    first = hook.rows.title_text.copy()
    assert sum(encoded) == 5  # broken.mp4 and video0-3 have titles
    again = attach_titles(VideoIndex.load(tmp_path / "index", model))
    np.testing.assert_array_equal(again.rows.title_text, first)
    assert sum(encoded) == 5

    video = copy.store.gather(copy.ids[:1])
    copy.add_features(video, [{"path": "/late.mp4", "title": "a late pink star",
                               "text_only": False, "frames_lost": 0.0, "valid_frames": 4}])
    assert sum(encoded) == 6 and len(hook.rows) == copy.store.next_id
    np.testing.assert_array_equal(hook.rows.title_text[:len(first)], first)
    result = copy.query("a late pink star", k=len(copy), candidates=len(copy))
    titles = {h.path: part["title"] for h, part in
              zip(result.hits, explain_hits(hook, result), strict=True)}
    assert titles["/late.mp4"] == pytest.approx(1.0, abs=1e-2)  # the query is its title
    assert max(titles, key=titles.get) == "/late.mp4"
