"""Query encoding for search: the packed CPU text tower (same vectors, same ranking), the int8
one (how far it moves), and the cache of recent encodings (LRU, counted, thread-safe)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from dicosa.clip import encode_text_tokens, get_tokenizer
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search.query_text import QueryText
from dicosa.text_tower import TextTower, TextTowerError

from ._index import encoded
from .conftest import tiny_config
from .test_index_search import QUERIES, _features, _index

WORDS = {"colour": ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"],
         "shape": ["circle", "square", "triangle", "cross", "star", "ring", "bar", "heart"],
         "motion": ["moves left", "moves right", "falls", "rises", "spins", "grows", "shrinks",
                    "bounces"]}


def captions(count: int, seed: int) -> list[str]:
    """Captions of the synthetic benchmark's kind, of 7 to 13 tokens."""
    rng = np.random.default_rng(seed)
    return [" ".join(["a", *(rng.choice(WORDS[k]) for k in ("colour", "shape", "motion"))])
            + (f" next to a {rng.choice(WORDS['colour'])} {rng.choice(WORDS['shape'])}"
               if rng.random() < 0.5 else "") for _ in range(count)]


@pytest.fixture(scope="module", params=["released", "paper"])
def model(request) -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config(variant=request.param)).eval()


def _tokens(model, texts):
    return get_tokenizer(model.config.arch, model.config.max_words)(texts)


ONEDNN = torch.backends.mkldnn.is_available()


def _tower(model, onednn: bool) -> TextTower:
    """The packed tower with its linear layers on oneDNN, or on PyTorch's own Linear."""
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = onednn
    try:
        tower = TextTower(model.clip)
    finally:
        torch.backends.mkldnn.enabled = was
    kinds = {type(block.fc).__name__ for block in tower.blocks}
    assert kinds == ({"_OneDNNLinear"} if onednn else {"Linear"}), kinds
    return tower


@pytest.mark.paths
@pytest.mark.parametrize("onednn", [pytest.param(True, marks=pytest.mark.skipif(
    not ONEDNN, reason="this PyTorch has no oneDNN")), False], ids=["onednn", "linear"])
def test_the_packed_tower_computes_the_models_text_vectors(model, onednn):
    texts = ["a red circle moves left", "a dog", "", "two yellow triangles spin around "
             "slowly in the dark night sky today and again tomorrow", *captions(12, 1)]
    tokens = _tokens(model, texts)
    assert (tokens[:, -1] != 0).any()  # one text fills the context (cut short)
    tower = _tower(model, onednn)
    with torch.inference_mode():
        want = encode_text_tokens(model.clip, tokens)
        packed = tower(tokens)
        alone = torch.cat([tower(tokens[i:i + 1]) for i in range(len(texts))])
    # float32 products over other row counts: a few ulps of values of order 1
    torch.testing.assert_close(packed, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch has no oneDNN")
@pytest.mark.parametrize("fault", ["raises", "differs"])
def test_the_tower_keeps_pytorchs_linear_where_the_onednn_ops_fail_a_probe(model, monkeypatch,
                                                                           fault):
    """The oneDNN ops are underscored PyTorch internals: one that is gone, or that gives other
    products, leaves the layers as nn.Linear (the same vectors, at MKL's speed)."""
    import dicosa.text_tower as text_tower

    def forward(self, x):
        if fault == "raises":
            raise RuntimeError("mkldnn::_linear_pointwise: no such op")
        return torch.zeros(len(x), self.bias.shape[0])

    monkeypatch.setattr(text_tower._OneDNNLinear, "forward", forward)
    tower = TextTower(model.clip)
    assert {type(block.fc).__name__ for block in tower.blocks} == {"Linear"}
    tokens = _tokens(model, captions(4, 5))
    with torch.inference_mode():
        torch.testing.assert_close(tower(tokens), encode_text_tokens(model.clip, tokens),
                                   atol=1e-5, rtol=1e-5)


def _gallery(model, count=1000, clusters=100) -> VideoFeatures:
    """Videos around the text vectors of ``clusters`` captions (benchmarks/search.py's
    generator): a centre, a per-video offset and per-frame noise."""
    with torch.inference_mode():
        centres = model.encode_text(_tokens(model, captions(clusters, 1))).text
    g = torch.Generator().manual_seed(2)
    num, dim = model.config.num_frames, model.embed_dim
    spread = centres.std(dim=1, keepdim=True).mean()
    cluster = torch.randint(clusters, (count,), generator=g)
    frames = (centres[cluster, None] + torch.randn(count, 1, dim, generator=g) * 0.5 * spread
              + torch.randn(count, num, dim, generator=g) * 0.5 * spread)
    return VideoFeatures(frames, torch.ones(count, num, dtype=torch.bool))


def _top10_agreement(model, tower, texts, gallery) -> float:
    tokens = _tokens(model, texts)
    with torch.inference_mode():
        want = model.score(model.encode_text(tokens), gallery).topk(10).indices
        got = model.score(model.encode_text(tokens, tower=tower), gallery).topk(10).indices
    return float(np.mean([set(a.tolist()) == set(b.tolist()) for a, b in zip(want, got,
                                                                              strict=True)]))


def test_the_packed_tower_keeps_the_top_10(model):
    """The bar for a faster text path: the top 10 over a fixed gallery unchanged for >= 99%
    of the queries (the gallery's tenth and eleventh are close: a relative error of 1e-3 in
    the text vector already changes about 1% of them)."""
    gallery, texts = _gallery(model), captions(200, 3)
    tower = _tower(model, ONEDNN)
    for size in (1, 5):  # queries alone, and in batches of mixed lengths

        def in_batches(tokens, size=size):
            return torch.cat([tower(tokens[i:i + size]) for i in range(0, len(tokens), size)])

        assert _top10_agreement(model, in_batches, texts, gallery) >= 0.99


def test_the_int8_tower_approximates_the_text_vector(model):
    """int8 linear layers: the same function, roughly (cosine >= 0.99 to the float vector);
    the top 10 it gives is what docs/serve.md reports, and does not meet the bar above."""
    tokens = _tokens(model, captions(50, 4))
    with torch.inference_mode():
        want = model.encode_text(tokens).text
        got = model.encode_text(tokens, tower=TextTower(model.clip, int8=True)).text
    cosine = torch.nn.functional.cosine_similarity(want, got)
    assert cosine.min() > 0.99 and (want - got).abs().max() > 1e-4  # quantised, not float


def test_a_cuda_or_unknown_tower_is_one_sentence(model):
    with pytest.raises(ValueError, match="runs on the CPU only"):
        QueryText(model, _tokens, torch.device("cuda"), tower="int8")
    with pytest.raises(ValueError, match="one of auto, float, packed, int8"):
        QueryText(model, _tokens, torch.device("cpu"), tower="bf16")


def test_auto_is_the_packed_tower_on_a_cpu_and_the_models_own_elsewhere(model, monkeypatch):
    cpu = QueryText(model, _tokens, torch.device("cpu"), tower="auto")
    assert cpu.tower == "packed" and isinstance(cpu._tower, TextTower)
    gpu = QueryText(model, _tokens, torch.device("cuda"), tower="auto")  # nothing runs on it
    assert gpu.tower == "float" and gpu._tower is None

    def refuse(clip, int8=False):
        raise TextTowerError("not open_clip's standard text blocks")

    monkeypatch.setattr("dicosa.search.query_text.TextTower", refuse)
    other = QueryText(model, _tokens, torch.device("cpu"), tower="auto")
    assert other.tower == "float" and other._tower is None


def test_the_cache_keeps_the_most_recent_texts_and_counts(model):
    tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
    cached = QueryText(model, tokenizer, torch.device("cpu"), cache=3)
    plain = QueryText(model, tokenizer, torch.device("cpu"))
    long = "a very long query " * 10
    first, cut = cached.encode(["a", "b", "a", long])
    assert cut == [False, False, False, True]
    assert cached.stats()["cache"] == {"capacity": 3, "size": 3, "hits": 0, "misses": 4}
    again, cut = cached.encode([long, "b", "c"])  # "a" is now the least recent: "c" evicts it
    assert cut == [True, False, False]
    assert cached.stats()["cache"] == {"capacity": 3, "size": 3, "hits": 2, "misses": 5}
    torch.testing.assert_close(again[0], first[3], atol=0, rtol=0)  # the kept vector itself
    cached.encode(["a"])
    assert cached.stats()["cache"]["misses"] == 6  # "a" was evicted
    want, _ = plain.encode(["a", "b", "c", long])
    got, _ = cached.encode(["a", "b", "c", long])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert plain.stats() == {"tower": "float", "cache": {"capacity": 0, "size": 0, "hits": 0,
                                                          "misses": 4}}


def test_the_cache_is_safe_for_the_services_threads(model):
    tokenizer = get_tokenizer(model.config.arch, model.config.max_words)
    cached = QueryText(model, tokenizer, torch.device("cpu"), cache=8)
    texts = captions(16, 7)
    with torch.inference_mode():
        want = {t: v for t, v in zip(texts, model.encode_text(tokenizer(texts)).text,
                                     strict=True)}
    barrier = threading.Barrier(8)

    def ask(worker: int) -> list[tuple[str, torch.Tensor]]:
        barrier.wait()
        out = []
        for i in range(40):
            batch = [texts[(worker * 3 + i * 5 + j) % len(texts)] for j in range(1 + i % 3)]
            vectors, _ = cached.encode(batch)
            out += list(zip(batch, vectors, strict=True))
        return out

    with ThreadPoolExecutor(8) as pool:
        answers = [pair for part in pool.map(ask, range(8)) for pair in part]
    for text, vector in answers:
        torch.testing.assert_close(vector, want[text], atol=1e-5, rtol=1e-5)
    stats = cached.stats()["cache"]
    assert stats["hits"] + stats["misses"] == len(answers) and stats["size"] == 8
    assert stats["hits"] > 0


def test_an_index_searches_with_the_packed_tower_and_the_cache(model):
    video = _features(model, 60, seed=1)
    index = _index(model, video)
    want = index.query(QUERIES, k=5)
    used = index.configure_queries("packed", cache=16)
    got = index.query(QUERIES, k=5)
    again = index.query(QUERIES[:2], k=5)
    for a, b in zip(want + want[:2], got + again, strict=True):
        assert [h.id for h in a.hits] == [h.id for h in b.hits]
        np.testing.assert_allclose([h.score for h in a.hits], [h.score for h in b.hits],
                                   atol=1e-5)
    assert used.stats()["cache"]["hits"] == 2 and used.stats()["tower"] == "packed"
    assert index.snapshot().text is used
    with torch.inference_mode():
        text = TextFeatures(encoded(index, QUERIES).text.text)
    assert text.text.shape == (len(QUERIES), model.embed_dim)
