"""The lexical heads (VDR, Dense2Sparse): gates, masks, schedules, metrics, and heads that
learn to name the objects of toy videos."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F

from dicosa.heads import load_head, save_head
from dicosa.heads.features import HeadData, SplitFeatures
from dicosa.heads.lexical import (
    D2SConfig,
    D2SHead,
    VDRConfig,
    VDRHead,
    bernoulli_schedule,
    cts_mask,
    elu1p,
    exact_at_k,
    flops,
    semantic_at_k,
    top_k_gate,
)
from dicosa.heads.vocabulary import build_vocabulary
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures
from dicosa.search.query import parse_query
from dicosa.search.types import EncodedQueries

from .conftest import tiny_config

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
SHAPES = ("square", "circle", "triangle", "diamond", "cross")


# -- building blocks on hand-made values -----------------------------------------------------
def test_elu1p_is_eq_3():
    x = torch.tensor([-2.0, -0.5, 0.0, 1.5])
    torch.testing.assert_close(elu1p(x), torch.tensor([torch.e ** -2, torch.e ** -0.5, 1.0,
                                                       2.5]))


def test_top_k_gate_keeps_exactly_k():
    values = torch.tensor([[0.1, 0.9, 0.3, 0.7, 0.2], [5.0, 4.0, 3.0, 2.0, 1.0]])
    gate = top_k_gate(values, 2)
    assert gate.tolist() == [[0, 1, 0, 1, 0], [1, 1, 0, 0, 0]]
    assert top_k_gate(values, 9).sum() == 10  # k above |V| keeps everything


def test_cts_mask_deals_the_unused_dimensions_to_the_queries():
    active = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0, 0]]).float()
    extra, off = cts_mask(active, torch.Generator().manual_seed(0))
    assert extra.sum(1).tolist() == [3, 3]  # |V \ T(B)| / |B| = 6 / 2 each
    assert (extra * active).sum() == 0  # only dimensions no query uses
    assert extra.sum(0).max() == 1  # each goes to one query
    assert extra[:, :3].sum() == 0 and extra[:, 3:].sum() == 6
    torch.testing.assert_close(off, extra)  # switched off in the query's own video


def test_bernoulli_schedule_per_epoch():
    df = torch.tensor([0.0, 0.5, 1.0])
    p_c, p_word = bernoulli_schedule(0, 4, df)
    assert p_c == 0.0 and p_word.tolist() == [1.0, 0.5, 0.0]  # p_i = 1 - df_i
    p_c, p_word = bernoulli_schedule(1, 4, df)
    assert p_c == 0.25 and p_word.tolist() == [1.0, 0.625, 0.25]  # + df_i / epochs
    p_c, p_word = bernoulli_schedule(4, 4, df)
    assert p_c == 1.0 and p_word.tolist() == [1.0, 1.0, 1.0]


def test_expansion_mask_keeps_caption_words_and_draws_the_rest():
    bow = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]])
    ones = torch.ones(4)
    assert D2SHead.expansion_mask(bow, 0.0, ones).tolist() == bow.tolist()  # p_c = 0
    assert D2SHead.expansion_mask(bow, 1.0, ones).tolist() == [[1.0] * 4] * 2  # no control
    p_word = torch.tensor([1.0, 1.0, 0.0, 1.0])  # word 2 never expands, stays for caption 1
    assert D2SHead.expansion_mask(bow, 1.0, p_word).tolist() == [[1, 1, 0, 1], [1, 1, 1, 1]]
    g = torch.Generator().manual_seed(0)
    draws = [D2SHead.expansion_mask(bow, 0.3, ones, g)[0, 1] for _ in range(2000)]
    assert abs(float(torch.stack(draws).mean()) - 0.3) < 0.04  # E_C ~ Ber(p_c)


def test_d2s_metrics_on_hand_computed_cases():
    text = torch.tensor([[0.5, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    video = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    # Pairs sharing active dims: (0,0):1 (0,1):1 (0,2):0 (1,0):1 (1,1):0 (1,2):0 -> 3 / 6.
    assert flops(text, video) == pytest.approx(0.5)
    bow = torch.tensor([[1.0, 0, 0, 1.0], [0, 1.0, 0, 0]])
    # Caption 0's top-2 words are 2 and 0 (only 0 in it); caption 1's are 1 and any (1 in it).
    assert exact_at_k(text, bow, 2) == pytest.approx(0.5)
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    # Caption 0 top {2, 0} vs words {0, 3}: cos(2,0)=0.707, cos(0,0)=1 -> mean 0.854;
    # caption 1 top-1 {1} vs {1}: 1.
    assert semantic_at_k(text[:1], bow[:1], vectors, 2) == pytest.approx((0.5 ** 0.5 + 1) / 2)
    assert semantic_at_k(text[1:], bow[1:], vectors, 1) == pytest.approx(1.0)


# -- toy features: videos of coloured shapes, captions naming them ----------------------------
def _toy_split(name: str, vectors: dict, rotation: torch.Tensor, num_videos: int,
               seed: int) -> tuple[SplitFeatures, list]:
    """Each video holds two (colour, shape) objects: its 3 frames are a fixed rotation of the
    sum of the objects' word vectors plus noise; its captions name one or both objects and
    their text vector is the (unrotated) sum of the named words plus noise."""
    g = torch.Generator().manual_seed(seed)
    pairs = list(itertools.product(COLOURS, SHAPES))
    frames, texts, captions, caption_video, objects = [], [], [], [], []
    for v in range(num_videos):
        chosen = [pairs[int(i)] for i in torch.randperm(len(pairs), generator=g)[:2]]
        objects.append(chosen)
        total = sum(vectors[w] for obj in chosen for w in obj)
        frames.append(torch.stack([total @ rotation + 0.3 * torch.randn(len(total), generator=g)
                                   for _ in range(3)]))
        for named in (chosen, chosen[:1], chosen[1:]):
            captions.append(" and ".join(f"a {c} {s}" for c, s in named))
            text = sum(vectors[w] for obj in named for w in obj)
            texts.append(text + 0.1 * torch.randn(len(text), generator=g))
            caption_video.append(v)
    video = VideoFeatures(torch.stack(frames), torch.ones(num_videos, 3, dtype=torch.bool))
    split = SplitFeatures(name, captions, torch.tensor(caption_video),
                          TextFeatures(torch.stack(texts)), video,
                          [f"{name}{v}" for v in range(num_videos)])
    return split, objects


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


def _toy(model, rotate: bool):
    g = torch.Generator().manual_seed(0)
    dim = model.clip.text_projection.shape[1]
    vectors = {w: F.normalize(torch.randn(dim, generator=g), dim=0) * 3
               for w in COLOURS + SHAPES}
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0] if rotate else \
        torch.eye(dim)
    train, _ = _toy_split("toy:train", vectors, rotation, 120, 1)
    val, val_objects = _toy_split("toy:val", vectors, rotation, 30, 2)
    return HeadData(train, val), val_objects


@pytest.fixture(scope="module")
def toy(model):
    """Videos in a rotated space: the head must learn the video side to name words."""
    return _toy(model, rotate=True)


@pytest.fixture(scope="module")
def vdr(model, toy) -> VDRHead:
    return VDRHead.fit(model, toy[0], VDRConfig(distractors=300, epochs=25, video_k=6),
                       progress=False)


def test_vocabulary_is_caption_words_plus_distractors(toy):
    vocab = build_vocabulary(toy[0].train.captions, "dicosa-tiny", 300)
    assert set(COLOURS + SHAPES + ("a", "and")) <= set(vocab.words)
    assert len(vocab) == len(COLOURS + SHAPES) + 2 + 300
    assert "!" not in vocab.words and not any("<" in w for w in vocab.words)
    assert vocab.bow(["a red Square, a red zzqx"])[0].sum() == 3  # a, red, square


def test_vdr_learns_to_name_the_objects_of_a_video(vdr, toy):
    data, objects = toy
    report = vdr.fit_report
    assert report["loss_last_epoch"] < 0.5 * report["loss_first_epoch"]
    assert report["selected_on"] == "toy:val"
    assert vdr.evaluate(data.val)["R@5"] >= 80  # 30 videos: chance is 17%
    assert vdr.evaluate(data.val, "bow")["R@5"] >= 80
    videos = vdr.encode_videos(data.val.video)
    named = [sum(w in {c for obj in objs for c in obj} for w, _ in vdr.top_words(row, 4))
             for row, objs in zip(videos, objects, strict=True)]
    assert sum(named) / (4 * len(named)) >= 0.8  # top-4 words: its 2 colours and 2 shapes


def test_vdr_sparsity_is_as_configured(vdr, toy):
    data = toy[0].val
    videos = vdr.encode_videos(data.video)
    assert ((videos > 0).sum(1) == 6).all()  # video_k
    texts = vdr.encode_texts(data.text.text, data.captions)
    words = vdr.vocab.bow(data.captions)
    # Eq. 4: top text_k of V(q) or a word of q, so at most text_k + |words| non-zeros, and
    # every word of the caption is active.
    assert ((texts > 0).sum(1) <= vdr.config.text_k + words.sum(1)).all()
    assert ((texts > 0) | (words == 0)).all()


def test_explanations_sum_to_the_score_and_prepare_fills_queries(vdr, toy):
    data = toy[0].val
    videos = vdr.encode_videos(data.video)
    texts = vdr.encode_texts(data.text.text, data.captions)
    explained = vdr.explain(texts[0], videos[0])
    assert sum(explained.values()) == pytest.approx(float(texts[0] @ videos[0]), rel=1e-5)
    assert list(explained.values()) == sorted(explained.values(), reverse=True)
    queries = EncodedQueries([parse_query(c) for c in data.captions[:3]], data.text[:3])
    vdr.prepare(queries, "bow")
    assert queries.extra["lexical_mode"] == "bow"
    assert queries.extra["lexical"].shape == (3, len(vdr.words))
    torch.testing.assert_close(torch.tensor(queries.extra["lexical"].toarray()),
                               vdr.bow(data.captions[:3]))
    frames = vdr.frame_words(data.video[:1], 3)
    assert len(frames) == 3 and all(len(f) == 3 for f in frames)


def test_vdr_round_trips_through_a_file(vdr, model, toy, tmp_path):
    path = save_head(vdr, tmp_path / "vdr.pt", model, vdr.fit_report)
    loaded = load_head(path, model, kind="lexical")
    data = toy[0].val
    assert loaded.words == vdr.words and loaded.config == vdr.config
    torch.testing.assert_close(loaded.encode_videos(data.video), vdr.encode_videos(data.video),
                               rtol=0, atol=0)


def test_d2s_distils_and_expansion_control_keeps_caption_words(model, tmp_path):
    data = _toy(model, rotate=False)[0]  # texts and videos share a space: a good teacher
    config = D2SConfig(distractors=300, epochs=15, eta=0.01, teacher="proxy")
    head = D2SHead.fit(model, data, config, progress=False)
    free = D2SHead.fit(model, data, dataclasses.replace(config, caption_control=False,
                                                        word_control=False), progress=False)
    assert head.fit_report["loss_last_epoch"] < 0.5 * head.fit_report["loss_first_epoch"]
    val = data.val
    assert head.evaluate(val)["R@5"] >= 80  # 30 videos: chance is 17%

    def measures(h):
        texts = h.encode_texts(val.text.text, val.captions)
        return flops(texts, h.encode_videos(val.video)), exact_at_k(texts, h.vocab.bow(
            val.captions), 3)

    (flops_on, exact_on), (flops_off, exact_off) = measures(head), measures(free)
    assert flops_on < 0.6 * flops_off  # fewer co-activated dimensions
    assert exact_on > exact_off + 0.3  # the caption's own words stay on top
    loaded = load_head(save_head(head, tmp_path / "d2s.pt", model), model, kind="d2s")
    torch.testing.assert_close(loaded.encode_texts(val.text.text, val.captions),
                               head.encode_texts(val.text.text, val.captions), rtol=0, atol=0)


def test_token_states_come_from_the_same_forward_and_pool_over_valid_tokens(model, vdr):
    from dicosa.clip import encode_text_token_states, encode_text_tokens, get_tokenizer
    from dicosa.heads.lexical import TokenStates, text_token_states

    tokens = get_tokenizer("dicosa-tiny", 16)(["a red square", "a blue circle and a cross"])
    with torch.no_grad():
        eot, states, valid = encode_text_token_states(model.clip, tokens)
        torch.testing.assert_close(eot, encode_text_tokens(model.clip, tokens))
    assert valid.sum(1).tolist() == [5, 8]  # SOT, the words, EOT
    torch.testing.assert_close(states[0, 4], eot[0])  # the EOT token's state is the vector
    pooled = text_token_states(model, ["a red square"])
    assert pooled.states.shape == (1, 16, eot.shape[1]) and pooled.valid.sum() == 5
    # Max over the valid tokens: the padded states never count, one valid token is the vector.
    single = TokenStates(torch.stack([eot[:1], torch.full_like(eot[:1], 50.0)], 1),
                         torch.tensor([[True, False]]))
    torch.testing.assert_close(vdr.text_weights(single), vdr.text_weights(eot[:1]))
