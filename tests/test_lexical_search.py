"""Lexical search through a VideoIndex and ``dicosa index --head / search --mode``.

The index holds the toy videos of ``test_lexical.py`` (frames = a rotation of their objects'
word vectors) and a VDR head trained on them names those objects, so a bag-of-words query
("a red square") finds the videos that show them.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

import dicosa.__main__ as cli
import dicosa.loading as loading
from dicosa import visualize_words
from dicosa.heads import save_head
from dicosa.heads.lexical import D2SConfig, D2SHead, VDRConfig, VDRHead
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, VideoFeatures
from dicosa.plugins.lexical import INFO_FILE, attach_lexical, explain_words
from dicosa.search.query import QueryError
from dicosa.search.seismic import SeismicStage

from ._index import encoded
from ._videos import write_frames
from .conftest import loads, tiny_config
from .test_lexical import _toy

QUERY = "a red square"


def padded(video: VideoFeatures, frames: int) -> VideoFeatures:
    """float16 features padded with masked frames to the model's ``frames`` (the store's N)."""
    extra = frames - video.frames.shape[1]
    return VideoFeatures(
        torch.cat([video.frames, video.frames.new_zeros(len(video), extra,
                                                        video.frames.shape[2])], 1).half(),
        torch.cat([video.frame_mask, video.frame_mask.new_zeros(len(video), extra)], 1))


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def trained(model):
    """The toy data and a VDR head trained on it in a few seconds."""
    data, _ = _toy(model, rotate=True)
    head = VDRHead.fit(model, data, VDRConfig(distractors=100, epochs=12, video_k=6),
                       progress=False)
    return data, head


@pytest.fixture(scope="module")
def features(model, trained) -> VideoFeatures:
    return padded(trained[0].val.video, model.config.num_frames)  # 30 videos, 3 frames each


def new_index(model, features: VideoFeatures, head=None) -> tuple[VideoIndex, object]:
    index = VideoIndex(model, backend="exact")
    index.add_features(features, [{"path": f"/toy/v{i}.mp4"} for i in range(len(features))])
    return index, (attach_lexical(index, head) if head is not None else None)


def sparse_reference(index, head, query: str, mode: str) -> dict[int, float]:
    """Naive sparse scores: the query vector times every live row's video vector."""
    asked = encoded(index, [query], mode=mode)
    q = torch.from_numpy(asked.extra["lexical"].toarray()[0])  # [|V|]
    ids = index.ids
    videos = head.encode_videos(index.store.gather(ids).to("cpu", torch.float32))  # [n, |V|]
    scores = videos @ q  # [n]
    return {int(i): float(s) for i, s in zip(ids, scores, strict=True) if s > 0}


def dicosa_order(index, model, query: str, ids: list[int]) -> list[int]:
    with torch.no_grad():
        text = model.encode_text(index.tokenizer([query]))
        scores = model.score(text, index.store.gather(np.array(ids)).to(dtype=torch.float32))[0]
    return [ids[i] for i in scores.argsort(descending=True).tolist()]


@pytest.mark.parametrize("mode", ["bow", "lexical"])
def test_lexical_modes_rerank_exactly_the_rows_the_sparse_stage_scores(model, trained, features,
                                                                        mode):
    index, lexical = new_index(model, features, trained[1])
    reference = sparse_reference(index, lexical.head, QUERY, mode)
    assert 0 < len(reference) < len(index)  # some rows share no word: they must not come back
    hits = index.search(QUERY, k=len(index), candidates=len(index), mode=mode)
    assert {h.id for h in hits} == set(reference)
    assert {h.stage for h in hits} == {mode}
    for h in hits:
        assert h.stage_score == pytest.approx(reference[h.id], rel=1e-4)
    assert [h.id for h in hits] == dicosa_order(index, model, QUERY, list(reference))
    # A short list: the C best by sparse score (ties to the smaller id), then DiCoSA's order.
    best = sorted(reference, key=lambda i: (-reference[i], i))[:3]
    hits = index.search(QUERY, k=3, candidates=3, mode=mode)
    assert [h.id for h in hits] == dicosa_order(index, model, QUERY, best)


def test_bow_query_finds_the_videos_that_show_its_words(model, trained, features):
    objects = _toy(model, rotate=True)[1]  # the val videos' (colour, shape) pairs
    index, _ = new_index(model, features, trained[1])
    hits = index.search("a red circle", k=5, candidates=5, mode="bow")
    shows = [any(c == "red" or s == "circle" for c, s in objects[h.id]) for h in hits]
    assert sum(shows) >= 4


def test_hybrid_unites_dense_and_lexical_candidates_with_stage_labels(model, trained, features):
    index, _ = new_index(model, features, trained[1])
    size = 10  # k = C: each single-stage search returns every candidate it reranked

    def found(mode):
        result = index.query(QUERY, k=size, candidates=size, mode=mode)
        return {h.id: h.stage for h in result.hits}, result.candidates

    (dense, _), (lexical, _), (hybrid, count) = found("dense"), found("lexical"), found("hybrid")
    assert set(dense) != set(lexical)  # the union is not trivially one of them
    assert count == len(set(dense) | set(lexical)) > size
    assert set(hybrid) <= set(dense) | set(lexical) and len(hybrid) == size
    for i, label in hybrid.items():
        expected = "+".join(name for name, side in (("dense", dense), ("lexical", lexical))
                            if i in side)
        assert label == expected
    assert found(None) == (hybrid, count)  # no mode: every registered stage
    assert set(dense.values()) == {"dense"}
    # Each proposing stage's own score, as that stage alone gives it; the first is stage_score.
    alone = {mode: {h.id: h.stage_score for h in index.search(QUERY, k=size, candidates=size,
                                                              mode=mode)}
             for mode in ("dense", "lexical")}
    both = 0
    for hit in index.search(QUERY, k=size, candidates=size, mode="hybrid"):
        assert list(hit.stage_scores) == hit.stage.split("+")
        assert hit.stage_score == next(iter(hit.stage_scores.values()))
        for name, score in hit.stage_scores.items():
            assert score == pytest.approx(alone[name][hit.id], rel=1e-6)
        both += len(hit.stage_scores) == 2
    assert both  # some row was proposed by both stages


def test_stored_vectors_are_reused_extended_and_removed_rows_never_return(
        model, trained, features, tmp_path, monkeypatch):
    head = trained[1]
    index, lexical = new_index(model, features, head)
    hit = index.search(QUERY, k=1, candidates=5, mode="bow")[0].id
    folder = index.save(tmp_path / "index")
    assert (folder / "sparse-lexical.npz").is_file() and (folder / INFO_FILE).is_file()
    stored = lexical.stage.vectors(index.ids).toarray()

    def no_recompute(*_):
        pytest.fail("the stored vectors were computed again")

    with monkeypatch.context() as patch:
        patch.setattr(VDRHead, "encode_videos", no_recompute)
        reopened = VideoIndex.load(folder, model)
        again = attach_lexical(reopened, head)
    np.testing.assert_array_equal(again.stage.vectors(reopened.ids).toarray(), stored)
    # Rows added later get vectors (the same features give the same vector).
    new = reopened.add_features(features[:2], [{"path": f"/toy/new{i}.mp4"} for i in range(2)])
    np.testing.assert_allclose(again.stage.vectors(new).toarray(), stored[:2], atol=1e-6)
    # Removed, attached or not, a row never comes back.
    assert reopened.remove([hit]) == 1
    assert hit not in {h.id for h in reopened.search(QUERY, k=10, candidates=10, mode="bow")}
    plain = VideoIndex.load(folder, model)
    gone = plain.search(QUERY, k=1, candidates=5, mode="dense")[0].id
    plain.remove([gone])
    with monkeypatch.context() as patch:
        patch.setattr(VDRHead, "encode_videos", no_recompute)
        last = VideoIndex.load(folder, model)
        stage = attach_lexical(last, head).stage
    assert hit not in stage.ids and gone not in stage.ids
    assert set(stage.ids) == set(last.ids) and set(new) <= set(last.ids)
    hits = last.search(QUERY, k=len(last), candidates=len(last), mode="bow")
    assert not {hit, gone} & {h.id for h in hits}


def test_explanations_sum_to_the_sparse_score(model, trained, features):
    index, lexical = new_index(model, features, trained[1])
    result = index.query(QUERY, k=4, candidates=4, mode="bow")
    hits = result.hits
    explained = explain_words(lexical, result)
    assert [result.explain(i)["lexical"] for i in range(len(hits))] == explained
    for hit, e in zip(hits, explained, strict=True):
        assert sum(e["words"].values()) == pytest.approx(hit.stage_score, rel=1e-4)
        assert e["sparse_score"] == pytest.approx(hit.stage_score, rel=1e-4)
        assert set(e["words"]) <= {"a", "red", "square"}


def test_modes_need_a_lexical_head(model, features):
    index, _ = new_index(model, features)
    assert set(index.plugins.modes) == {"dense"}
    with pytest.raises(QueryError, match="no 'bow' search mode"):
        index.search(QUERY, mode="bow")


def test_words_over_time_figure(trained, features, tmp_path):
    head = trained[1]
    video = features[:1]
    figure, report = visualize_words(head, video, num_words=6, save_path=tmp_path / "w.png")
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.weights.shape == (6, 3) and report.frames.tolist() == [0, 1, 2]
    # VDR's video vector is the max of the frames' weights: the rows peak where it does.
    peaks = head.video_weights(video.to(dtype=torch.float32))[0].detach()
    top = [head.words.index(w) for w in report.words]
    np.testing.assert_allclose(report.weights.max(1), peaks[top].numpy(), rtol=1e-5)
    assert peaks[top[0]] == peaks.max()
    assert figure.axes[0].get_label() == "words"
    with pytest.raises(ValueError, match="one video"):
        visualize_words(head, features[:2])
    # Dense2Sparse has no per-frame stage of its own: the shared projection of each frame.
    d2s = D2SHead(D2SConfig(), head.words, head.vocab.token_ids, head.dim).eval()
    report = visualize_words(d2s, video, num_words=4)[1]
    frames = video.frames[0, :3].float()
    top = [head.words.index(w) for w in report.words]
    np.testing.assert_allclose(report.weights, d2s.weights(frames)[:, top].T.detach().numpy(),
                               rtol=1e-5)


# -- the command line -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    g = np.random.default_rng(0)
    for i in range(4):
        write_frames(folder / f"clip{i}.mp4", g.integers(0, 255, (8, 32, 32, 3), dtype=np.uint8))
    return folder


def test_index_with_a_head_and_search_by_words_on_the_command_line(model, trained, videos,
                                                                   tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(model, {"config": "tiny"}))
    head = save_head(trained[1], tmp_path / "vdr.pt", model)
    out = tmp_path / "index"
    assert cli.main(["index", str(videos), "--out", str(out), "--head", str(head),
                     "--num-workers", "0", "--config", "x"]) == 0
    assert "sparse lexical stage: 4 videos" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["meta"]["lexical"] == {"head": str(head.resolve()), "kind": "lexical"}
    # Query a word the first video carries, so that the sparse stage has something to find.
    index = VideoIndex.load(out, model)
    row = attach_lexical(index, head).stage.vectors(index.ids[:1]).toarray()[0]
    word = trained[1].words[int(row.argmax())]
    assert cli.main(["search", str(out), word, "--mode", "bow", "--explain", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["mode"] == "bow" and answer["results"]
    for result in answer["results"]:
        assert result["stage"] == "bow"
        words = result["explain"]["words"]["words"]
        assert sum(words.values()) == pytest.approx(result["stage_score"], rel=1e-4)
        assert list(words) == [word]
    assert cli.main(["search", str(out), word, "--explain"]) == 0
    table = capsys.readouterr().out  # 4 videos: every row reranked, no stage to name
    assert "all 4 rows reranked by DiCoSA" in table and "words " in table
    assert cli.main(["search", str(out), word, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "hybrid"  # the default with a head


def test_command_line_errors_are_one_sentence(model, trained, videos, tmp_path, capsys,
                                              monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(model, {"config": "tiny"}))
    out = tmp_path / "plain"
    assert cli.main(["index", str(videos), "--out", str(out), "--num-workers", "0"]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(out), QUERY, "--mode", "bow"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: this index has no 'bow' search mode (it has dense); it comes with a lexical "
        "head: build it with 'dicosa index FOLDER --out INDEX --head HEAD.pt'")
    torch.manual_seed(1)
    other = DiCoSA.from_config(tiny_config())
    alien = save_head(trained[1], tmp_path / "alien.pt", other)
    assert cli.main(["index", str(videos), "--out", str(tmp_path / "x"), "--head", str(alien),
                     "--num-workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the lexical head") and "was trained on a model with" in err
    assert "\n" not in err and not (tmp_path / "x").exists()  # refused before encoding


def test_searching_a_lexical_index_writes_nothing(model, trained, features, tmp_path):
    index, _ = new_index(model, features, trained[1])
    folder = index.save(tmp_path / "index")
    head = save_head(trained[1], tmp_path / "vdr.pt", model)
    attach_lexical(VideoIndex.load(folder, model), head)  # records the head: writes
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    reopened = VideoIndex.load(folder, model)
    attach_lexical(reopened, head)
    assert reopened.search(QUERY, k=3, candidates=3, mode="bow")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


# -- the seismic backend ----------------------------------------------------------------------
needs_seismic = pytest.mark.skipif(importlib.util.find_spec("seismic") is None,
                                   reason="pyseismic-lsr is not installed")


@needs_seismic
def test_seismic_backend_reuses_the_stored_vectors_and_is_reopened(model, trained, features,
                                                                   tmp_path, monkeypatch):
    head = trained[1]
    index, _ = new_index(model, features, head)
    everything = len(index)  # C = every row: seismic's heap never fills, so it skips nothing
    expected = [(h.id, h.stage_score) for h in index.search(QUERY, k=everything,
                                                              candidates=everything, mode="bow")]
    folder = index.save(tmp_path / "index")
    path = save_head(head, tmp_path / "vdr.pt", model)

    def no_recompute(*_):
        pytest.fail("the stored vectors were computed again")

    with monkeypatch.context() as patch:
        patch.setattr(VDRHead, "encode_videos", no_recompute)
        switched = VideoIndex.load(folder, model)
        stage = attach_lexical(switched, path, backend="seismic",
                               options={"heap_factor": 0.8}).stage
    assert isinstance(stage, SeismicStage)
    recorded = json.loads((folder / "manifest.json").read_text())["meta"]["lexical"]["sparse"]
    assert recorded["backend"] == "seismic" and recorded["options"]["heap_factor"] == 0.8
    assert len(list(folder.glob("sparse-lexical.*.seismic"))) == 1  # built and saved at once
    found = switched.search(QUERY, k=everything, candidates=everything, mode="bow")
    assert [(h.id, h.stage_score) for h in found] == expected  # the same rows, exact scores
    # Reopened without naming a backend: the recorded one, from its files, writing nothing.
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    with monkeypatch.context() as patch:
        patch.setattr(SeismicStage, "_build", lambda self: pytest.fail("rebuilt"))
        reopened = VideoIndex.load(folder, model)
        again = attach_lexical(reopened, path).stage
        assert [h.id for h in reopened.search(QUERY, k=3, candidates=3, mode="bow")]
    assert isinstance(again, SeismicStage) and again.config.heap_factor == 0.8
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    # Switched back to exact: recorded, and the seismic file is gone.
    back = attach_lexical(VideoIndex.load(folder, model), path, backend="exact").stage
    assert not isinstance(back, SeismicStage)
    assert not list(folder.glob("*.seismic"))
    assert "sparse" not in json.loads((folder / "manifest.json").read_text())["meta"]["lexical"]


@needs_seismic
def test_index_with_the_seismic_backend_on_the_command_line(model, trained, videos, tmp_path,
                                                            capsys, monkeypatch):
    monkeypatch.setattr(loading, "load_model", loads(model, {"config": "tiny"}))
    head = save_head(trained[1], tmp_path / "vdr.pt", model)
    out = tmp_path / "index"
    assert cli.main(["index", str(videos), "--out", str(out), "--head", str(head),
                     "--sparse-backend", "seismic", "--sparse-option", "query_cut=8",
                     "--num-workers", "0"]) == 0
    assert "sparse lexical stage (seismic): 4 videos" in capsys.readouterr().out
    sparse = json.loads((out / "manifest.json").read_text())["meta"]["lexical"]["sparse"]
    assert sparse["backend"] == "seismic" and sparse["options"]["query_cut"] == 8
    index = VideoIndex.load(out, model)
    stage = attach_lexical(index, head).stage
    assert isinstance(stage, SeismicStage) and stage.config.query_cut == 8
    word = trained[1].words[int(stage.vectors(index.ids[:1]).toarray()[0].argmax())]
    assert cli.main(["search", str(out), word, "--mode", "lexical", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["mode"] == "lexical" and answer["results"]
    assert {r["stage"] for r in answer["results"]} == {"lexical"}


def test_sparse_backend_errors_are_one_sentence(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "seismic", None)  # pyseismic-lsr not installed
    out = tmp_path / "index"
    assert cli.main(["index", str(tmp_path), "--out", str(out), "--head", "vdr.pt",
                     "--sparse-backend", "seismic"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the seismic sparse backend needs the pyseismic-lsr package")
    assert "pip install pyseismic-lsr" in err and "\n" not in err and not out.exists()
    assert cli.main(["index", str(tmp_path), "--out", str(out), "--sparse-backend",
                     "seismic"]) == 2
    assert capsys.readouterr().err.strip().endswith("add --head HEAD.pt")
