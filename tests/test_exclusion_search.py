"""Exclusion queries end to end through a VideoIndex and ``dicosa search``.

The index holds the tiny scenes of ``_scenes.py`` (frames = the objects' vectors) and the
model reads its queries through a lookup table ("a red circle" -> the red circle's vector), so
DiCoSA's scores and the concepts head's codes mean what the scenes say.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

import dicosa.__main__ as cli
import dicosa.loading as loading
from dicosa.heads.base import save_head
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, TextFeatures
from dicosa.plugins.exclusion import CODES_FILE, attach_exclusion, explain_hits
from dicosa.search.exclusion import ExclusionConfig

from ._scenes import OBJECTS, article, random_scenes, split, text_vectors, trained_head
from ._scenes import video as scene_video
from .conftest import loads, tiny_config

A, B = "red circle", "blue square"
PHRASES = [article(o) for o in OBJECTS]
# The paper's tiers: the tests of the codes' cache and of the command line use them.
CONFIG = ExclusionConfig(method="tiers", top_k_results=5, mass_fraction=0.5, candidates=12,
                         window=1, presence_threshold=0.5)


def tokenize(texts: list[str]) -> torch.Tensor:
    return torch.tensor([PHRASES.index(t) for t in texts])


def lookup_model() -> DiCoSA:
    """The scenes' scorer model (same weights, so the head's fingerprint fits) reading
    queries from the table of object vectors."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(use_factors=False)).eval()
    table = text_vectors([[o] for o in OBJECTS], noise=0.0)
    model.encode_text = lambda tokens: TextFeatures(table[tokens.cpu()])
    return model


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """A with something else (0-3), A with B throughout (4-5) or in frame 0 only (6-7), then
    videos without A; an index of them in a folder, and the head saved as a file."""
    others = ["green cross", "white cross", "green circle", "white circle"]
    scenes = ([[A, o] for o in others] + [[A, B]] * 4
              + [s for s in random_scenes(40, seed=5) if A not in s])
    visible = {6: {B: [0]}, 7: {B: [0]}}
    videos = [scene_video(s, visible=visible.get(i), seed=100 + i) for i, s in enumerate(scenes)]
    features = split(scenes, videos, seed=3).video
    folder = tmp_path_factory.mktemp("exclusion")
    model = lookup_model()
    index = VideoIndex(model, tokenizer=tokenize)
    index.add_features(type(features)(features.frames.half(), features.frame_mask),
                       [{"path": str(folder / f"v{i}.mp4")} for i in range(len(scenes))])
    index.save(folder / "index")
    head = trained_head()[1]
    head_path = save_head(head, folder / "concepts.pt", model)
    return {"index": folder / "index", "head": head_path, "model": model, "scenes": scenes,
            "features": features, "folder": folder}


def has_b(collection, hits) -> list[bool]:
    return [B in collection["scenes"][h.id] for h in hits]


def test_exclusion_search_through_the_index(collection, tmp_path):
    model = collection["model"]
    folder = shutil.copytree(collection["index"], tmp_path / "index")  # attaching writes
    index = VideoIndex.load(folder, model, tokenizer=tokenize)
    plain = index.search(article(A), k=4)
    assert any(has_b(collection, plain))  # the squares rank high for the plain query
    rerank = attach_exclusion(index, collection["head"], CONFIG)
    assert (folder / CODES_FILE).is_file()
    # The head and the settings that are not the defaults are recorded.
    default = dataclasses.asdict(ExclusionConfig())
    changed = {k: v for k, v in dataclasses.asdict(CONFIG).items() if v != default[k]}
    assert changed and VideoIndex.load(folder).meta["concepts"] == {
        "head": str(collection["head"]), "settings": changed}
    after = index.search(article(A), k=4)
    assert [h.id for h in after] == [h.id for h in plain]  # no exclusion: nothing changes
    np.testing.assert_allclose([h.score for h in after], [h.score for h in plain], rtol=1e-6)
    for result in (index.query(f"{article(A)} without {article(B)}", k=4),
                   index.query(article(A), k=4, exclude=[article(B)]),
                   index.query(article(A), k=4, candidates=20, exclude=[article(B)])):
        hits = result.hits
        assert not any(has_b(collection, hits))
        assert sorted(h.id for h in hits) == [0, 1, 2, 3]
    explained = explain_hits(rerank, result)
    for i, whole in enumerate(explained):  # one hit at a time: the same, up to batch rounding
        alone = result.explain(i)["concepts"]
        assert alone.pop("presence") == pytest.approx(whole.pop("presence"), abs=1e-5)
        assert alone == whole
    assert len(explained) == 4 and all(e["matched"] and e["matched_words"] for e in explained)
    assert not any(e["demoted"] for e in explained)


def test_codes_are_reused_on_reopening_and_extended_for_new_rows(collection, monkeypatch,
                                                                 tmp_path):
    folder = shutil.copytree(collection["index"], tmp_path / "index")
    head = trained_head()[1]
    attach_exclusion(VideoIndex.load(folder, collection["model"], tokenizer=tokenize), head)
    index = VideoIndex.load(folder, collection["model"], tokenizer=tokenize)
    stored = np.load(folder / CODES_FILE)
    before = len(stored)
    # Reopened: the stored codes are read, not recomputed.
    with monkeypatch.context() as patch:
        patch.setattr(type(head), "encode_videos", lambda *a: pytest.fail("recomputed"))
        attach_exclusion(index, head, CONFIG)
    features = collection["features"]
    index.add_features(type(features)(features.frames[:2].half(), features.frame_mask[:2]),
                       [{"path": str(collection["folder"] / f"new{i}.mp4")} for i in range(2)])
    hits = index.search(f"{article(A)} without {article(B)}", k=len(index))
    assert {before, before + 1} <= {h.id for h in hits}  # the new rows are ranked, with codes
    codes = np.load(folder / CODES_FILE)
    assert len(codes) == before + 2
    np.testing.assert_allclose(codes[before:], codes[:2], atol=1e-3)  # same frames, same code


def test_exclusion_on_the_command_line(collection, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "load_model", loads(collection["model"]))
    monkeypatch.setattr("dicosa.clip.get_tokenizer", lambda *a: tokenize)
    folder = shutil.copytree(collection["index"], tmp_path / "index")  # searches record heads
    base = ["search", str(folder), article(A), "-k", "4", "--config", "x"]
    # Exclusions without a head (none given, none recorded): one sentence each.
    assert cli.main([*base, "--exclude", article(B)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: this index cannot leave things out; that takes a concepts head: add "
        "--concepts HEAD.pt (train one with 'dicosa heads train concepts')")
    assert cli.main([*base, "--explain"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --explain needs a head to explain: --concepts HEAD.pt (exclusion), "
        "--mul2vec HEAD.pt / --fusion (score parts) or an index built with --head HEAD.pt "
        "(words)")
    # Another model's head: one sentence, and nothing recorded.
    torch.manual_seed(1)
    other = DiCoSA.from_config(tiny_config(use_factors=False))
    alien = save_head(trained_head()[1], tmp_path / "alien.pt", other)
    assert cli.main([*base, "--exclude", article(B), "--concepts", str(alien)]) == 2
    assert "was trained on a model with" in capsys.readouterr().err
    assert "concepts" not in VideoIndex.load(folder).meta

    assert cli.main([*base, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["results"]
    assert any(B in collection["scenes"][r["id"]] for r in plain)
    settings = [f"--exclusion-set={key}={value}" for key, value in
                dataclasses.asdict(CONFIG).items()]
    options = ["--exclude", article(B), "--explain", *settings]
    assert cli.main([*base, *options, "--concepts", str(collection["head"]), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert not any(B in collection["scenes"][r["id"]] for r in results)
    assert all(r["explain"]["exclusion"]["matched"] for r in results)
    # The index remembers the head: the same search without --concepts answers the same.
    assert cli.main([*base, *options, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == results
    assert cli.main([*base, *options]) == 0
    table = capsys.readouterr().out
    assert table.count("matched A on") == 4 and "B empty on" in table

    # The recorded head moved: one sentence until --concepts says where, which is recorded.
    moved = shutil.move(collection["head"], tmp_path / "moved.pt")
    try:
        assert cli.main([*base, *options]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: the concepts head recorded in the index, {collection['head']}, is "
            "missing; pass --concepts HEAD.pt with its new location")
        assert cli.main([*base, *options, "--concepts", str(moved), "--json"]) == 0
        capsys.readouterr()
        assert cli.main([*base, *options, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["results"] == results
    finally:
        shutil.move(moved, collection["head"])


def test_demo_pair_has_a_with_and_without_b():
    from dicosa.demo_exclusion import exclusion_pair

    objects = {"v0": {"red circle", "blue square"}, "v1": {"red circle"}, "v2": {"red circle"},
               "v3": {"blue square"}, "v4": {"green cross", "white cross"},
               "v5": {"green cross", "white cross"}}
    # The crosses come together most often, but never apart. The circle and the square come
    # together once; the circle without the square twice, the reverse once.
    assert exclusion_pair(objects, list(objects)) == ("red circle", "blue square")
    objects["v6"] = objects["v7"] = {"green cross"}  # as many answers: together more often
    assert exclusion_pair(objects, list(objects)) == ("green cross", "white cross")
    assert exclusion_pair({"v": {"a b"}}, ["v"]) is None


# ---------------------------------------------------------------- the default rule, demote

CLEAR = ["green circle", "green cross", "white circle", "white cross"]  # nothing of B's


def scene_index(folder, scenes: list[list[str]], visible: dict | None = None) -> VideoIndex:
    """An index (in memory) of ``scenes`` for the lookup model."""
    videos = [scene_video(s, visible=(visible or {}).get(i), seed=200 + i)
              for i, s in enumerate(scenes)]
    features = split(scenes, videos, seed=4).video
    index = VideoIndex(lookup_model(), tokenizer=tokenize)
    index.add_features(type(features)(features.frames.half(), features.frame_mask),
                       [{"path": str(folder / f"s{i}.mp4")} for i in range(len(scenes))])
    return index


def test_a_without_b_keeps_the_plain_top_10_where_b_never_comes_with_a(tmp_path):
    """B shows up in the collection, never with A: the default "A without B" returns the
    plain query's top 10, in its order and with its scores."""
    others = [s for s in random_scenes(60, seed=11) if A not in s]
    scenes = [[A, CLEAR[i % 4]] for i in range(12)] + others
    assert any(B in s for s in others)
    index = scene_index(tmp_path, scenes)
    plain = index.search(article(A), k=10)
    assert not any(has_b({"scenes": scenes}, plain))  # nothing to exclude there
    plugin = attach_exclusion(index, trained_head()[1])  # recorded settings: none, defaults
    assert index.plugins.hooks[-1].config == ExclusionConfig()
    for result in (index.query(f"{article(A)} without {article(B)}", k=10),
                   index.query(article(A), k=10, exclude=[article(B)])):
        hits = result.hits
        assert [h.id for h in hits] == [h.id for h in plain]
        np.testing.assert_allclose([h.score for h in hits], [h.score for h in plain],
                                   rtol=1e-6)
    assert not any(e["demoted"] for e in explain_hits(plugin, result))
    # The paper's tiers on the same collection do reorder it (the codes' top C by magnitude).
    tiers = attach_exclusion(index, trained_head()[1], ExclusionConfig(
        method="tiers", top_k_results=5, mass_fraction=0.5, candidates=12))
    hits = index.search(article(A), k=10, exclude=[article(B)], hooks=[tiers.rerank])
    assert [h.id for h in hits] != [h.id for h in plain]


def test_a_without_b_demotes_the_clips_that_show_b(tmp_path):
    """B comes with A in most of A's clips (throughout, or in one frame): the default rule
    moves every clip with B down, keeps the others' scores, and says why each one fell."""
    scenes = ([[A, B]] * 8 + [[A, CLEAR[i]] for i in range(4)]
              + [s for s in random_scenes(40, seed=12) if A not in s])
    visible = {i: {B: [i % 4]} for i in range(4)}  # clips 0-3: B in one frame only
    index = scene_index(tmp_path, scenes, visible)
    plain = index.search(article(A), k=4)
    assert sum(B in scenes[h.id] for h in plain) >= 2
    rerank = attach_exclusion(index, trained_head()[1])
    result = index.query(f"{article(A)} without {article(B)}", k=len(scenes))
    hits = result.hits
    assert not any(B in scenes[h.id] for h in hits[:12])
    assert {8, 9, 10, 11} <= {h.id for h in hits[:8]}
    explained = explain_hits(rerank, result)
    for hit, e in zip(hits, explained, strict=True):
        assert e["demoted"] == (e["penalty"] > 0)
        assert e["penalty"] == pytest.approx(hit.dicosa - hit.score, abs=1e-5)
        frames = next(x for x in e["evidence"] if x["source"] == "frames")
        assert frames["exclusion"] == article(B)
        if B in scenes[hit.id]:
            assert e["demoted"] and frames["value"] >= frames["threshold"] > 0
            assert frames["penalty"] > 0
            if hit.id < 4:  # the window found is the frame that shows B
                assert tuple(frames["frames"]) == (hit.id % 4, hit.id % 4)
        if not e["demoted"]:
            assert hit.score == pytest.approx(hit.dicosa)  # kept its plain score
