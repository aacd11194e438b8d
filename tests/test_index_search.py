"""Two-stage search: the pair rerank, candidates vs exhaustive, stages kept in step, hooks.

The indexes here are filled with features made directly (``VideoIndex.add_features``), not
decoded videos: what is tested is search, and decoding is tests/test_index.py's business.
"""

import json

import numpy as np
import pytest
import torch

from dicosa.clip import get_tokenizer
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search.query import QueryError
from dicosa.search.rerank import pair_scores
from dicosa.search.types import Candidates

from ._index import searcher
from .conftest import tiny_config

QUERIES = ["a red circle moves left", "a blue square grows", "a green cross falls",
           "two yellow triangles spin"]


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def plain() -> DiCoSA:
    """Random weights without the confidence MLP (and, "released", no projection): S is the
    mean of per-factor cosines between the text and its pooled frames, so on a collection with
    structure it ranks like a trained model does. The random MLP of ``model`` scores noise,
    which no first stage can (or should) predict; recall on the trained model is measured by
    benchmarks/search.py."""
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config(use_adaptive_pooling=False)).eval()


def _text(model, texts) -> torch.Tensor:
    tokens = get_tokenizer(model.config.arch, model.config.max_words)(texts)
    with torch.no_grad():
        return model.encode_text(tokens).text


def _features(model, count, seed=0, near=None, per_query=10) -> VideoFeatures:
    """Random frame features; with ``near`` ([Q, D] text vectors) the first ``per_query``
    videos of each query have frames close to that query's vector (relevant videos), so
    that the collection has structure as a trained model's would. Some frames are padding."""
    g = torch.Generator().manual_seed(seed)
    num, dim = model.config.num_frames, model.embed_dim
    frames = torch.randn(count, num, dim, generator=g)
    if near is not None:
        scale = near.norm(dim=1).mean()
        frames = frames * scale / dim**0.5
        for q, vector in enumerate(near):
            rows = slice(q * per_query, (q + 1) * per_query)
            frames[rows] = 0.6 * frames[rows] + vector
    mask = torch.ones(count, num, dtype=torch.bool)
    mask[::3, num // 2:] = False  # every third video is short
    return VideoFeatures(frames.half(), mask)


def _index(model, video, backend="exact", directory=None, shard=64) -> VideoIndex:
    index = VideoIndex(model, backend=backend)
    if directory is not None:
        index.save(directory)
    for start in range(0, len(video), shard):
        part = video[start:start + shard]
        index.add_features(part, [{"path": f"/v/{start + i}.mp4"} for i in range(len(part))])
    if directory is not None:
        index.save(directory)
    return index


@pytest.mark.paths
@pytest.mark.parametrize("options", [{}, {"variant": "paper"}, {"use_adaptive_pooling": False},
                                     {"use_factors": False}])
def test_pair_scores_equal_the_model_score(options):
    """The rerank pools frames before the projection and the confidence MLP's video half; it
    must equal DiCoSA.score's diagonal (the batch path keeps them per frame)."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(**options)).eval()
    video = _features(model, 12)
    video = VideoFeatures(video.frames.float(), video.frame_mask)
    text = TextFeatures(_text(model, QUERIES * 3))
    with torch.no_grad():
        expected = model.score(text, video).diagonal()
        got = pair_scores(model, text, video)
        # the text side once per query: pair i is query pairs[i] with video i
        queries = TextFeatures(_text(model, QUERIES))
        pairs = torch.tensor([3, 0, 0, 2, 1, 3, 3, 2, 0, 1, 1, 2])
        per_query = model.score(queries, video)[pairs, torch.arange(len(video))]
        shared = pair_scores(model, queries, video, pairs=pairs)
    # float32 sums in another order: a few ulps of values of order 1.
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared, per_query, atol=1e-5, rtol=1e-5)


@pytest.mark.paths
def test_all_candidates_equal_exhaustive(model):
    video = _features(model, 150, seed=1)
    index = _index(model, video)
    exhaustive = index.search(QUERIES, k=20, candidates=None)
    reranked = index.search(QUERIES, k=20, candidates=len(index))
    for ref, got in zip(exhaustive, reranked, strict=True):
        assert {h.stage for h in ref} == {"exhaustive"} and {h.stage for h in got} == {"all"}
        ref_scores = {h.id: h.score for h in ref}
        # Two code paths (per-frame batch vs pooled pairs): equal to float32 rounding, so the
        # order may differ only between scores closer than that.
        assert [h.score for h in got] == pytest.approx([h.score for h in ref], abs=1e-5)
        for h in got:
            if h.id in ref_scores:
                assert h.score == pytest.approx(ref_scores[h.id], abs=1e-5)
        assert len(set(ref_scores) ^ {h.id for h in got}) <= 2  # only a tie at the boundary


@pytest.mark.parametrize("backend", ["exact", "local"])
def test_two_stage_recall_on_a_structured_collection(plain, backend):
    """Relevant videos (frames near the query's vector) among 500 random ones: the dense
    proxy's top 50 holds the exhaustive DiCoSA top 10."""
    model = plain
    near = _text(model, QUERIES)
    index = _index(model, _features(model, 500, seed=2, near=near), backend=backend)
    exhaustive = index.search(QUERIES, k=10, candidates=None)
    two_stage = index.search(QUERIES, k=10, candidates=50)
    recall = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10
                      for a, b in zip(exhaustive, two_stage, strict=True)])
    assert recall >= 0.95
    for q, hits in enumerate(two_stage):
        assert {h.stage for h in hits} == {"dense"}
        assert all(h.stage_score is not None and h.dicosa == h.score for h in hits)
        assert sum(q * 10 <= h.id < (q + 1) * 10 for h in hits) >= 8  # finds the relevant
    # The first stage alone ranks worse than the rerank: the candidates are reordered.
    proxy_order = [h.id for h in sorted(two_stage[0], key=lambda h: -h.stage_score)]
    assert [h.id for h in two_stage[0]] != proxy_order or recall == 1.0


@pytest.mark.parametrize("backend", ["exact", "local"])
def test_add_and_remove_keep_the_stages_consistent(plain, backend, tmp_path):
    model = plain
    near = _text(model, QUERIES)
    video = _features(model, 200, seed=3, near=near)
    out = tmp_path / "index"
    index = _index(model, video[:160], backend=backend, directory=out)
    top = index.search(QUERIES[0], k=5, candidates=40)
    gone = [h.id for h in top[:3]]
    assert index.remove(np.array(gone)) == 3 and index.remove(np.array(gone)) == 0
    assert index.remove("/v/150.mp4") == 1
    gone.append(150)
    assert len(index) == 156
    for candidates in (None, 40, 1000):
        hits = index.search(QUERIES[0], k=20, candidates=candidates)
        assert not {h.id for h in hits} & set(gone)

    new = index.add_features(video[160:], [{"path": f"/w/{i}.mp4"} for i in range(40)])
    assert new.min() == 160  # ids are never reused
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == 2 and manifest["removed"] == sorted(gone)
    # add_features wrote the shard but not the stage (as a build killed between the two):
    # the stage lags the store, so opening rebuilds it from the stored proxies.
    assert manifest["first_stage"]["synced"] == [160, 4]
    lagging = VideoIndex.load(out, model)
    index.save(out)  # now the stage's files are current and are opened as they are
    manifest = json.loads((out / "manifest.json").read_text())
    stage = manifest["first_stage"]
    assert stage["synced"] == [200, 4] and stage["backend"] == backend
    assert stage["summary"] == "frames" and stage["dim"] == model.embed_dim  # no MLP: factors
    reopened = VideoIndex.load(out, model)
    for candidates in (40, None):
        expected = [[h.id for h in q] for q in index.search(QUERIES, k=10,
                                                              candidates=candidates)]
        for other in (lagging, reopened):
            got = other.search(QUERIES, k=10, candidates=candidates)
            assert [[h.id for h in q] for q in got] == expected
    assert reopened.paths == index.paths and len(reopened) == 196


def test_hooks_and_a_second_stage(plain):
    model = plain
    near = _text(model, QUERIES)
    index = _index(model, _features(model, 120, seed=4, near=near))
    plain = index.search(QUERIES[0], k=5, candidates=30)
    banned = plain[0].id

    def demote(queries, ids, scores):
        assert ids.shape == scores.shape and len(queries) == 1
        assert queries.extra["seen"] == [QUERIES[0]]  # filled once by the query encoder
        return scores - 10.0 * torch.from_numpy(ids == banned).float()

    index.plugins.encoders.append(lambda q: q.extra.update(seen=[x.text for x in q.queries]))

    hooked = index.search(QUERIES[0], k=5, candidates=30, hooks=[demote])
    assert banned not in {h.id for h in hooked}
    assert [h.id for h in hooked[:4]] == [h.id for h in plain[1:5]]
    index.plugins.hooks.append(demote)  # the index's own hooks apply by default
    assert [h.id for h in index.search(QUERIES[0], k=5, candidates=30)] == [
        h.id for h in hooked]
    index.plugins.hooks.clear()

    class Fixed:
        """A first stage that always proposes rows 100-109 (a stand-in for a lexical one)."""

        name = "lexical"

        def __init__(self):
            self.added, self.removed = [], []

        def add(self, ids, videos):
            self.added.extend(ids.tolist())

        def remove(self, ids):
            self.removed.extend(ids.tolist())

        def search(self, queries, k):
            ids = np.tile(np.arange(100, 110), (len(queries), 1))
            return Candidates(ids, np.ones(ids.shape, np.float32), self.name)

        def save(self, directory):
            pass

    second = Fixed()
    index.stages.register(second, lambda ids, video: video.frames.shape)
    assert second.added == list(range(120))
    index.remove(np.array([105]))
    assert second.removed == [105]
    seen = []

    def boost(queries, ids, scores):  # the second stage's rows first, to see their labels
        seen.append(ids.copy())
        return scores + 10.0 * torch.from_numpy((ids >= 100) & (ids < 110)).float()

    hits = index.search(QUERIES[0], k=10, candidates=10, hooks=[boost])
    assert len(seen[0][0]) > 10  # the union of both stages' lists was reranked
    assert [h.id for h in hits[:9]] == sorted((i for i in range(100, 110) if i != 105),
                                              key=lambda i: -next(h.dicosa for h in hits
                                                                  if h.id == i))
    assert {h.stage for h in hits[:9]} <= {"lexical", "dense+lexical"}
    assert hits[9].stage == "dense" and 105 not in {h.id for h in hits}


@pytest.mark.paths
def test_a_vector_query_is_a_search_without_its_own_video_and_without_hooks(plain):
    """"More like this": a video's dense proxy asks through the same Searcher. Its own video
    never comes back; the dense stage alone proposes (a stage of words is not asked); no hook
    or query encoder runs (a vector has no words); DiCoSA's score ranks, as
    DiCoSA.score of every other video does (another code path: close, not equal)."""
    near = _text(plain, QUERIES)
    index = _index(plain, _features(plain, 90, seed=5, near=near))
    calls = []
    index.plugins.hooks.append(lambda queries, ids, scores: calls.append("hook") or scores)
    index.plugins.encoders.append(lambda encoded: calls.append("encoder"))

    class Words:
        """A second first stage, of words: a vector has none to ask it with."""

        name = "lexical"

        def add(self, ids, videos):
            pass

        def remove(self, ids):
            pass

        def search(self, queries, k):
            calls.append("words")

        def save(self, directory):
            pass

    index.stages.register(Words())
    seed = 3
    proxy = torch.from_numpy(index.store.proxies(np.array([seed])))  # [1, D]
    (result,) = searcher(index).run(proxy, 10, 30, skip_videos=[seed])
    assert calls == [] and result.stage == "dense" and result.query == ""
    assert seed not in {h.id for h in result.hits} and seed not in result.ids.tolist()
    assert {h.stage for h in result.hits} == {"dense"} and result.candidates in (29, 30)
    others = np.array([i for i in index.ids if i != seed])
    with torch.no_grad():
        reference = plain.score(TextFeatures(proxy), index.store.gather(others, torch.float32))[0]
    by_id = dict(zip(others.tolist(), reference.tolist(), strict=True))
    for hit in result.hits:
        assert hit.dicosa == pytest.approx(by_id[hit.id], abs=1e-5) and hit.score == hit.dicosa
    # every row reranked (C covers the index): the top 10 of all the other videos
    (every,) = searcher(index).run(proxy, 10, 1000, skip_videos=[seed])
    assert every.stage == "all" and every.candidates == len(others)
    best = sorted(by_id, key=lambda i: -by_id[i])[:10]
    assert [h.id for h in every.hits] == best


def test_a_snapshot_keeps_the_parts_it_was_taken_with(plain):
    """A search borrows a frozen snapshot: a hook attached afterwards changes no search that
    holds it, and the index's next snapshot has it."""
    index = _index(plain, _features(plain, 40, seed=6))
    before = searcher(index)
    index.plugins.hooks.append(lambda queries, ids, scores: -scores)
    assert before.parts.hooks == () and len(index.snapshot().hooks) == 1
    with pytest.raises(TypeError):
        before.parts.modes["new"] = before.parts.modes["dense"]
    (kept,) = before.run(["a red circle"], 5, 40)
    assert [h.id for h in kept.hits] == [h.id for h in index.search("a red circle", k=5,
                                                                  candidates=40, hooks=[])]


@pytest.mark.parametrize("candidates", [0, -3, True, 2.5, "10"])
def test_bad_candidates_are_one_sentence(model, candidates):
    index = _index(model, _features(model, 8))
    with pytest.raises(QueryError, match="candidates must be a positive number"):
        index.search("a dog", candidates=candidates)


def test_unknown_backend_is_one_sentence(model):
    with pytest.raises(ValueError, match="unknown first-stage backend 'annoy'"):
        _index(model, _features(model, 8), backend="annoy")


def test_confidence_summary_is_the_linearised_score(model):
    """The dense stage's inner product is Σ_k (G_k(t) + c_k(v)) cos_k(t, v) (search/proxy.py),
    computed here term by term from the model's weights."""
    import torch.nn.functional as F

    from dicosa.functional import video_proxy
    from dicosa.search.proxy import Summary

    video = _features(model, 40, seed=5)
    proxies = video_proxy(video.frames.float(), video.frame_mask)
    summary = Summary(model, "confidence")
    summary.calibrate(proxies.numpy())
    text = _text(model, QUERIES)
    got = summary.queries(text) @ torch.from_numpy(summary.videos(proxies.numpy())).T  # [Q, V]

    head = model.head
    with torch.no_grad():
        raw_t, raw_v = head.text_factors(text), head.frame_factors(proxies)  # [Q|V, K, d]
        cos = torch.einsum("qkd,vkd->qvk", F.normalize(raw_t, dim=-1), F.normalize(raw_v, dim=-1))
        hidden_v = raw_v @ head.conf_video.t()  # [V, K, H]
        mean_v = hidden_v.mean(0)
        active = ((raw_t.new_tensor(0) + head.text_factors(proxies) @ head.conf_text.t()
                   + head.conf_bias + mean_v) > 0).float().mean(0)
        w2, b2 = head.conf_out.weight[0], head.conf_out.bias[0]
        weight = F.relu(raw_t @ head.conf_text.t() + head.conf_bias + mean_v) @ w2 + b2  # [Q, K]
        shift = ((hidden_v - mean_v) * active * w2).sum(-1)  # [V, K]
        expected = ((weight[:, None] + shift[None]) * cos).sum(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert summary.dim == 2 * model.embed_dim and not summary.normalize


@pytest.mark.paths
def test_milvus_lite_backend_gives_the_local_top_k(plain, tmp_path):
    """The same index through milvus-lite (a .db file in the index folder): build, search,
    remove, reopen; the top k equals the exact stage's."""
    pytest.importorskip("pymilvus")
    model = plain
    video = _features(model, 120, seed=6, near=_text(model, QUERIES))
    exact = _index(model, video, backend="exact")
    lite = _index(model, video, backend="milvus", directory=tmp_path / "index")

    def ids(index):
        return [[h.id for h in q] for q in index.search(QUERIES, k=5, candidates=20)]

    assert ids(lite) == ids(exact)
    best = ids(exact)[0][0]
    for index in (exact, lite):
        assert index.remove(np.array([best])) == 1
    lite.save(tmp_path / "index")
    reopened = VideoIndex.load(tmp_path / "index", model)
    assert ids(reopened) == ids(exact) and len(reopened) == 119
