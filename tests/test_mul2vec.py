"""Mul2vec (issue 14): the tensor, NTF, the triplet losses, the incomplete-gallery protocol,
a head that learns and round-trips, and fused scores that decompose into their parts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dicosa import functional as DF
from dicosa.data.incomplete import apply_gallery, incomplete_gallery, mask_words, words
from dicosa.heads import load_head, save_head
from dicosa.heads.features import HeadData, SplitFeatures, text_vectors
from dicosa.heads.mul2vec import (
    Mul2vecConfig,
    Mul2vecHead,
    TensorEntries,
    build_vocab,
    ilm_dlm_triplet,
    sample_negatives,
    tfidf_entries,
)
from dicosa.metrics import ranks_t2v
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search.query import parse_query
from dicosa.search.title_fusion import (
    FusionRerank,
    SemanticStage,
    fill_missing,
    fused_scores,
    fusion_rows,
)
from dicosa.search.types import EncodedQueries, FirstStage

from .conftest import tiny_checkpoint, tiny_config

COLOURS = ["red", "green", "blue", "yellow", "white", "purple"]
SHAPES = ["square", "circle", "triangle", "diamond"]
TEMPLATES = ["a {c} {s}", "the {s} is {c}", "a {c} {s} moves", "there is a {c} {s}"]


def test_tfidf_tensor_on_a_hand_made_corpus():
    docs = ["red square red", "blue square", "red circle"]
    vocab = build_vocab(docs)
    assert list(vocab) == ["blue", "circle", "red", "square"]
    entries = tfidf_entries(docs, torch.tensor([0, 0, 1]), vocab)
    got = {(int(d), list(vocab)[int(w)]): float(v) for d, w, v in
           zip(entries.doc, entries.word, entries.value, strict=True)}
    idf = {w: math.log(4 / (1 + df)) + 1 for w, df in
           {"red": 2, "square": 2, "blue": 1, "circle": 1}.items()}
    # doc 0: red tf 2/3, square 1/3; the largest entry of each document is 1.
    assert got[(0, "red")] == pytest.approx(1.0)
    assert got[(0, "square")] == pytest.approx((1 / 3 * idf["square"]) / (2 / 3 * idf["red"]))
    assert got[(1, "blue")] == pytest.approx(1.0)
    assert got[(1, "square")] == pytest.approx(idf["square"] / idf["blue"])
    assert got[(2, "circle")] == pytest.approx(1.0)
    assert len(entries) == 6 and entries.entity.tolist() == [0, 0, 0, 0, 1, 1]
    assert (entries.value > 0).all() and (entries.value <= 1).all()


def test_ntf_prediction_and_loss_on_known_values():
    config = Mul2vecConfig(topics=2, hidden=3, mlp_layers=1, dropout=0.0)
    head = Mul2vecHead(config, dim=1, vocab=["a"], num_docs=1, num_entities=1).eval()
    with torch.no_grad():
        head.doc_topics.copy_(torch.tensor([[1.0, 2.0]]))
        head.word_topics.copy_(torch.tensor([[3.0, -1.0]]))
        head.entity_topics.copy_(torch.tensor([[0.5, 1.0]]))
        head.mlp[0].weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0, 0], [0, 0, 2.0]]))
        head.mlp[0].bias.zero_()
        head.h.weight.copy_(torch.tensor([[1.0, 0.5, 0.25, 1.0, 1.0]]))
        head.h.bias.fill_(-1.0)
    e = {"doc": torch.tensor([[1.0]]), "word": torch.tensor([[2.0]]),
         "entity": torch.tensor([[-1.0]])}
    # θ⊙t⊙g = [1.5, -2]; MLP: relu([2, -1, -2]) = [2, 0, 0]
    expected = 1 / (1 + math.exp(-(1.5 - 1.0 + 0.25 * 2 - 1.0)))
    entries = TensorEntries(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]),
                            torch.tensor([0.25]))
    assert head.predict_entries(entries, e).item() == pytest.approx(expected)
    parts = head.losses(entries, e, torch.tensor([0]), torch.tensor([0]))
    assert parts["L_D"].item() == pytest.approx((expected - 0.25) ** 2)


def test_triplet_loss_known_values_and_same_entity_rows_are_not_negatives():
    anchor = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # row 0: d(a0,p0)=0, d(a0,p1)=0 -> hinge 0.2; row 1: d(a1,p1)=√2, d(a1,p0)=√2 -> 0.2
    assert ilm_dlm_triplet(anchor, positive, torch.tensor([0, 1]), 0.2).item() == \
        pytest.approx(0.2)
    assert ilm_dlm_triplet(anchor, positive, torch.tensor([0, 0]), 0.2).item() == 0.0
    far = torch.tensor([[-1.0, 0.0], [0.0, 1.0]])
    assert ilm_dlm_triplet(anchor, torch.stack([anchor[0], far[0]]), torch.tensor([0, 1]),
                           0.2).item() == pytest.approx((0 + max(2 - 2 + 0.2, 0)) / 2)


def test_negative_samples_are_unobserved_entries():
    docs = [" ".join(f"{c} {s}" for c, s in zip(COLOURS[i:i + 2], SHAPES[i % 3:i % 3 + 2],
                                                 strict=True)) for i in range(4)]
    doc_entity = torch.tensor([0, 1, 2, 3])
    vocab = build_vocab(docs)
    entries = tfidf_entries(docs, doc_entity, vocab)
    present = torch.zeros(len(docs), len(vocab), dtype=torch.bool)
    present[entries.doc, entries.word] = True
    negatives = sample_negatives(entries, present, 4, 3, torch.Generator().manual_seed(0))
    assert len(negatives) == 3 * len(entries) and (negatives.value == 0).all()
    observed = set(zip(entries.doc.tolist(), entries.word.tolist(), entries.entity.tolist(),
                       strict=True))
    sampled = list(zip(negatives.doc.tolist(), negatives.word.tolist(),
                       negatives.entity.tolist(), strict=True))
    assert not observed & set(sampled)
    swapped_word = sum(not present[d, w] for d, w, _ in sampled)
    assert 0.3 * len(sampled) < swapped_word < 0.7 * len(sampled)  # half each, roughly


def test_incomplete_gallery_is_deterministic_and_never_titles_with_the_query():
    captions = [[f"a {c} {s} number {i} moves", f"the {s} {c} {i}", f"{c} {s} grows"]
                for i, (c, s) in enumerate(zip(COLOURS * 2, SHAPES * 3, strict=False))]
    kw = {"seed": 3, "missing_titles": 0.25, "corrupt": 0.25, "corruption": "undecodable"}
    a = incomplete_gallery(captions, [0] * len(captions), **kw)
    b = incomplete_gallery(captions, [0] * len(captions), **kw)
    assert a.titles == b.titles and (a.text_only == b.text_only).all()
    assert a.titles != incomplete_gallery(captions, [0] * len(captions), **{**kw, "seed": 4}
                                          ).titles
    assert a.has_title.sum() == len(captions) - 3 and a.text_only.sum() == 3
    assert not (a.text_only & ~a.has_title).any()  # an undecodable clip keeps its title
    assert all(s != 0 for s in a.title_source)
    for title, caps, s in zip(a.titles, captions, a.title_source, strict=True):
        if title:
            kept = words(title)
            assert len(kept) == len(words(caps[s])) - round(0.2 * len(words(caps[s])))
            assert all(w in words(caps[s]) for w in kept)
    assert mask_words("one", 0.9, np.random.default_rng(0)) == "one"


def test_lost_and_noise_frames_and_text_only_rows():
    video = VideoFeatures(torch.randn(4, 4, 3), torch.ones(4, 4, dtype=torch.bool))
    noise = VideoFeatures(torch.full((2, 4, 3), 9.0), torch.ones(2, 4, dtype=torch.bool))
    caps = [["a b c", "d e f"]] * 4
    lost = incomplete_gallery(caps, [0] * 4, seed=0, corrupt=0.5, corruption="lost")
    out = apply_gallery(video, lost, None, seed=0)
    assert out.frame_mask.sum(1).tolist() == [4 - 2 * bool(x) for x in lost.frames_lost]
    assert (lost.flagged_lost == lost.frames_lost).all()
    noisy = incomplete_gallery(caps, [0] * 4, seed=0, corrupt=0.5, corruption="noise")
    out = apply_gallery(video, noisy, noise, seed=0)
    assert out.frame_mask.all() and (noisy.flagged_lost == 0).all()  # unnoticed
    assert (out.frames == 9.0).all(-1).sum(1).tolist() == [2 * bool(x) for x in noisy.frames_lost]
    gone = incomplete_gallery(caps, [0] * 4, seed=0, corrupt=0.5, corruption="undecodable")
    out = apply_gallery(video, gone, None, seed=0)
    assert out.frame_mask.any(1).tolist() == (~gone.text_only).tolist()


# ------------------------------------------------------------------ a head that learns


def _split(name: str, ids: range, g: torch.Generator, words_vec: dict, rotation) -> SplitFeatures:
    """Clips of one coloured shape; captions and frames are noisy views of the two words'
    vectors (frames rotated: text and video live in different bases)."""
    captions, caption_video, text, frames = [], [], [], []
    for v, i in enumerate(ids):
        c, s = COLOURS[i % len(COLOURS)], SHAPES[(i // len(COLOURS)) % len(SHAPES)]
        meaning = words_vec[c] + words_vec[s]
        for template in TEMPLATES[:3]:
            captions.append(template.format(c=c, s=s))
            caption_video.append(v)
            text.append(meaning + 0.3 * torch.randn(len(meaning), generator=g))
        frames.append((meaning @ rotation) + 0.3 * torch.randn(4, len(meaning), generator=g))
    return SplitFeatures(name, captions, torch.tensor(caption_video),
                         TextFeatures(torch.stack(text)),
                         VideoFeatures(torch.stack(frames), torch.ones(len(ids), 4, dtype=bool)),
                         [f"video{i}" for i in ids])


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval()
    g = torch.Generator().manual_seed(0)
    dim = text_vectors(model, ["red"]).shape[1]  # the width the head's word vectors have
    words_vec = {w: torch.randn(dim, generator=g) for w in COLOURS + SHAPES}
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0]
    data = HeadData(_split("train", range(24), g, words_vec, rotation),
                    _split("val", range(24, 24 + 16), g, words_vec, rotation))
    config = Mul2vecConfig(topics=16, hidden=32, steps=300, batch_size=64)
    untrained = Mul2vecHead.fit(model, data, Mul2vecConfig(topics=16, hidden=32, steps=0),
                                seed=0, progress=False)
    head = Mul2vecHead.fit(model, data, config, seed=0, progress=False)
    return model, data, rotation, untrained, head


def test_the_head_learns(toy):
    _, data, _, untrained, head = toy
    assert head.fit_report["heldout_mae"] < 0.7 * untrained.fit_report["heldout_mae"]
    chance = 100 / data.val.num_videos
    assert head.fit_report["val_semantic_t2v_r1"] > 3 * chance
    assert head.fit_report["val_semantic_t2v_r1"] > untrained.fit_report["val_semantic_t2v_r1"]


def test_fusion_beats_the_video_score_alone_on_damaged_validation_clips(toy):
    """Validation clips: a quarter undecodable, a quarter with half their frames noise.
    The stand-in for DiCoSA is the ideal clean score (cosine with the unrotated proxy)."""
    _, data, rotation, _, head = toy
    val = data.val
    captions = [[c for c, v in zip(val.captions, val.caption_video.tolist(), strict=True)
                 if v == i] for i in range(val.num_videos)]
    query = val.text.text[::3]  # the first caption of each clip
    results = {}
    for corruption in ("undecodable", "noise"):
        plan = incomplete_gallery(captions, [0] * len(captions), seed=1, corrupt=0.25,
                                  corruption=corruption)
        noise = VideoFeatures(5 * torch.randn(2, 4, rotation.shape[0], generator=torch.Generator()
                                              .manual_seed(2)), torch.ones(2, 4, dtype=bool))
        video = apply_gallery(val.video, plan, noise, seed=1)
        proxy = DF.video_proxy(video.frames, video.frame_mask) @ rotation.T
        title_text = torch.stack([val.text.text[3 * v + s]
                                  for v, s in enumerate(plan.title_source)])
        rows = fusion_rows(plan.titles, title_text, DF.video_proxy(video.frames,
                                                                   video.frame_mask),
                           plan.text_only, plan.flagged_lost, head)
        dicosa = F.normalize(query, dim=-1) @ F.normalize(proxy, dim=-1).T
        has_video = torch.as_tensor(~plan.text_only)
        semantic = head.query_vectors(query) @ torch.as_tensor(rows.semantic).T
        fused = fused_scores(dicosa, has_video, semantic, beta_semantic=1.0, trust=1.0)["fused"]
        damaged = torch.as_tensor(plan.text_only | (plan.frames_lost > 0))
        truth = torch.arange(val.num_videos)
        alone = ranks_t2v(dicosa.masked_fill(~has_video, float("-inf")), truth)[damaged]
        both = ranks_t2v(fused, truth)[damaged]
        results[corruption] = ((alone <= 2).float().mean(), (both <= 2).float().mean())
    assert results["undecodable"][0] == 0 and results["undecodable"][1] >= 0.5
    assert results["noise"][1] > results["noise"][0]


def test_save_load_round_trip(toy, tmp_path):
    model, data, _, _, head = toy
    path = save_head(head, tmp_path / "m2v.pt", model, head.fit_report)
    loaded = load_head(path, model, kind="mul2vec")
    assert loaded.vocab == head.vocab and loaded.config == head.config
    assert loaded.trained["heldout_mae"] == head.fit_report["heldout_mae"]
    text = data.val.text.text
    proxy = DF.video_proxy(data.val.video.frames, data.val.video.frame_mask)
    yes = torch.ones(len(proxy), dtype=torch.bool)
    torch.testing.assert_close(loaded.query_vectors(text), head.query_vectors(text))
    torch.testing.assert_close(loaded.entity_vectors(text[::3], yes, proxy, yes),
                               head.entity_vectors(text[::3], yes, proxy, yes))
    with pytest.raises(ValueError, match="needs a title or decodable frames"):
        head.entity_vectors(text[::3], ~yes, proxy, ~yes)


# ------------------------------------------------------------------ fused scores


def test_missing_parts_are_imputed_and_present_ones_kept():
    part = torch.tensor([[1.0, 3.0, 100.0], [2.0, 2.0, -5.0]])
    present = torch.tensor([True, True, False])
    filled = fill_missing(part, present)
    assert filled[:, :2].equal(part[:, :2]) and filled[:, 2].tolist() == [2.0, 2.0]
    evidence = torch.tensor([[0.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
    # query 0: part mean 2, std 1; evidence mean 1, std 1 over the present rows -> z = 3
    assert fill_missing(part, present, evidence, trust=1.0)[0, 2].item() == pytest.approx(5.0)
    assert fill_missing(part, present, evidence, trust=0.5)[0, 2].item() == pytest.approx(3.5)


def test_fused_scores_decompose_into_their_parts():
    g = torch.Generator().manual_seed(0)
    dicosa, semantic, title = (torch.randn(3, 5, generator=g) for _ in range(3))
    has_video = torch.tensor([True, True, True, False, True])
    has_title = torch.tensor([True, False, True, True, True])
    dicosa[:, 3] = float("nan")
    parts = fused_scores(dicosa, has_video, semantic, title, has_title, beta_semantic=0.3,
                         beta_title=0.7, trust=0.5)
    torch.testing.assert_close(parts["fused"], parts["dicosa"] + 0.3 * parts["semantic"]
                               + 0.7 * parts["title"])
    assert parts["dicosa"][:, has_video].equal(dicosa[:, has_video])
    assert parts["title"][:, has_title].equal(title[:, has_title])
    assert parts["fused"].isfinite().all()


@pytest.mark.paths
def test_the_rerank_hook_equals_the_exhaustive_matrix_on_a_tiny_index(toy):
    """A 6-row index: two text-only rows, one with half its frames lost, one untitled."""
    _, data, _, _, head = toy
    val = data.val
    titles = ["a red square", "", "the circle is blue", "green triangle", "a white diamond",
              "yellow circle moves"]
    text_only = np.array([False, False, True, False, True, False])
    lost = np.array([0, 0.5, 0, 0, 0, 0], dtype=np.float32)
    rows = fusion_rows(titles, val.text.text[:6], DF.video_proxy(val.video.frames[:6],
                                                                 val.video.frame_mask[:6]),
                       text_only, lost, head)
    assert rows.semantic.shape == (6, 16) and rows.has_title.tolist()[1] is False
    assert (rows.title_text[1] == 0).all()
    halves = fusion_rows(titles[:2], val.text.text[:2], DF.video_proxy(
        val.video.frames[:2], val.video.frame_mask[:2]), text_only[:2], lost[:2], head).extend(
        fusion_rows(titles[2:], val.text.text[2:6], DF.video_proxy(
            val.video.frames[2:6], val.video.frame_mask[2:6]), text_only[2:], lost[2:], head))
    assert len(halves) == 6 and halves.title == rows.title
    np.testing.assert_allclose(halves.semantic, rows.semantic, rtol=1e-5, atol=1e-6)
    queries = EncodedQueries([parse_query(c) for c in val.captions[:4]],
                             TextFeatures(val.text.text[:4]))
    dicosa = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    dicosa[:, text_only] = float("nan")
    hook = FusionRerank(rows, head, beta_semantic=0.5, beta_title=0.25, trust=0.5)
    ids = np.tile(np.arange(6), (4, 1))
    whole = hook(queries, ids, dicosa)
    theta = head.query_vectors(val.text.text[:4])
    e_q = F.normalize(val.text.text[:4], dim=-1)
    direct = fused_scores(dicosa, torch.as_tensor(~text_only), theta @ torch.as_tensor(
        rows.semantic).T, e_q @ torch.as_tensor(rows.title_text).T,
        torch.as_tensor(rows.has_title), beta_semantic=0.5, beta_title=0.25, trust=0.5)
    torch.testing.assert_close(whole, direct["fused"], rtol=1e-5, atol=1e-6)
    assert "mul2vec" in queries.extra  # θ_q computed once per batch
    # Candidate lists in another order, padded with -1: the same rows, the same scores.
    order = np.array([[5, 2, 0, -1], [1, 3, 4, -1], [0, 1, 2, 3], [4, 5, -1, -1]])
    padded = torch.full(order.shape, float("nan"))
    padded[order >= 0] = dicosa[np.nonzero(order >= 0)[0], order[order >= 0]]
    part = hook.explain(queries, order, padded)
    assert part["fused"][order < 0].eq(float("-inf")).all()
    assert part["semantic"][0, 0].item() == pytest.approx(
        (theta[0] @ torch.as_tensor(rows.semantic[5])).item(), abs=1e-5)
    with pytest.raises(ValueError, match="needs the head"):
        FusionRerank(rows, None, beta_semantic=0.5)


def test_the_semantic_first_stage_finds_text_only_rows(toy, tmp_path):
    _, data, _, _, head = toy
    val = data.val
    titles = [val.captions[3 * v + 1] for v in range(val.num_videos)]
    text_only = np.zeros(val.num_videos, dtype=bool)
    text_only[::2] = True
    rows = fusion_rows(titles, val.text.text[1::3], DF.video_proxy(val.video.frames,
                                                                   val.video.frame_mask),
                       text_only, np.zeros(val.num_videos, dtype=np.float32), head)
    stage = SemanticStage(head, 16)
    assert isinstance(stage, FirstStage)
    stage.add(np.arange(val.num_videos) + 100, rows.semantic)
    queries = EncodedQueries([parse_query(c) for c in val.captions[::3]],
                             TextFeatures(val.text.text[::3]))
    found = stage.search(queries, 5)
    hits = (found.ids == (np.arange(val.num_videos) + 100)[:, None]).any(1)
    assert hits[text_only].mean() >= 0.5  # text-only clips are found by their titles
    assert (np.diff(found.scores, axis=1) <= 0).all()
    stage.remove(np.array([100, 101]))
    stage.save(tmp_path)
    again = SemanticStage.load(tmp_path, head).search(queries, 30)
    assert again.ids.shape == (val.num_videos, 30) and (again.ids[:, -2:] == -1).all()
    assert not np.isin(again.ids, [100, 101]).any()


def test_heads_train_mul2vec_from_a_checkpoint(tmp_path):
    """The command-line path: registry, real encoded features, fit report in the file."""
    from dicosa.heads.train import train_head

    model, checkpoint, _ = tiny_checkpoint(tmp_path)
    path = train_head("mul2vec", checkpoint, tmp_path / "m2v.pt",
                      ["steps=5", "topics=8", "batch_size=16"], progress=False)
    head = load_head(path, model, kind="mul2vec")
    assert isinstance(head, Mul2vecHead) and head.config.topics == 8
    assert len(head.vocab) > 5 and all(w.isalpha() and w.islower() for w in head.vocab)
    assert 0 <= head.trained["heldout_mae"] <= 1 and "val_semantic_t2v_r1" in head.trained
