"""The concepts head (paper 003): SPINE losses, sentence codes, masks, training on tiny data."""

from __future__ import annotations

import math

import pytest
import torch

from dicosa.heads import load_head, save_head
from dicosa.heads.concepts import (
    ConceptCodesHead,
    average_sparsity_loss,
    build_vocabulary,
    caption_words,
    concept_mask,
    partial_sparsity_loss,
    reconstruction_loss,
    sentence_codes,
    top_k_mask,
)

from ._scenes import scorer_model, trained_head


def test_spine_losses_on_hand_computed_activations():
    z = torch.tensor([[0.0, 0.5, 1.0],
                      [1.0, 0.5, 0.0]])
    # ρ = (0.5, 0.5, 0.5): each unit exceeds ρ* = 0.2 by 0.3, summed over units, not squared.
    assert average_sparsity_loss(z, 0.2).item() == pytest.approx(0.9)
    # Per unit over the data: a unit on for half the data is at ρ = 0.5 even though one
    # sample has every unit on.
    assert average_sparsity_loss(torch.tensor([[1.0, 1.0], [0.0, 0.0]]), 0.5).item() == 0
    assert average_sparsity_loss(z, 0.6).item() == 0  # below target: no penalty
    # PSL: z(1 - z) is 0.25 at 0.5 and 0 at 0 or 1; one 0.5 per row.
    assert partial_sparsity_loss(z).item() == pytest.approx(0.25)
    x = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    assert reconstruction_loss(x, torch.zeros(2, 2)).item() == pytest.approx(2.5)


def test_sentence_code_is_the_normalised_mean_of_word_codes():
    vocabulary = ["a", "blue", "red"]
    word_codes = torch.eye(3)
    codes, unknown = sentence_codes(word_codes, vocabulary,
                                    ["A red, red dog", "dogs run", "blue"])
    torch.testing.assert_close(codes[0], torch.tensor([1.0, 0.0, 2.0]) / math.sqrt(5))
    assert torch.all(codes[1] == 0)  # no known word: a zero code, not NaN
    torch.testing.assert_close(codes[2], torch.tensor([0.0, 1.0, 0.0]))
    assert unknown == 3  # "dog", "dogs", "run" are outside the vocabulary
    assert caption_words("A red-circle, moves!") == ["a", "red", "circle", "moves"]
    assert build_vocabulary(["b a", "a c"]) == ["a", "b", "c"]


def test_mask_is_sentence_code_or_top_k():
    latent = torch.tensor([[0.1, 0.5, -0.2, 0.3]])
    assert top_k_mask(latent, 2).tolist() == [[False, True, False, True]]
    sentence = torch.tensor([[0.4, 0.0, 0.05, 0.0]])
    assert concept_mask(latent, 2, sentence).tolist() == [[True, True, True, True]]
    assert concept_mask(latent, 2, sentence, threshold=0.1).tolist() == [
        [True, True, False, True]]
    assert concept_mask(latent, 9).all()  # k beyond d: every dimension


@pytest.fixture(scope="module")
def trained():
    data, head = trained_head()
    return scorer_model(), data, head


def test_the_head_learns_sparse_codes_that_retrieve(trained):
    _, data, head = trained
    report = head.fit_report
    assert report["loss_last"]["cl"] < 0.5 * report["loss_first"]["cl"]
    assert report["word_dead_units"] < head.config.dim  # SPINE did not switch everything off
    # 24 validation videos (chance R@1 4%; an untrained head measured 2%; the exact cosine
    # 48%, since several videos hold the same objects).
    assert report["val_codes_t2v"]["R@1"] > 30 and report["val_codes_t2v"]["R@10"] > 80
    video = head.video_codes(data.val.video.frames, data.val.video.frame_mask)
    assert torch.all((video != 0).sum(1) <= head.config.top_k)
    torch.testing.assert_close(video.norm(dim=1), torch.ones(len(video)))
    # Dimensions are named by words of the training captions.
    named = [w for d in range(head.config.dim) for w in head.dimension_words(d)]
    assert named and set(named) <= set(head.vocabulary)


def test_the_head_round_trips_with_its_fingerprint(trained, tmp_path):
    model, data, head = trained
    loaded = load_head(save_head(head, tmp_path / "concepts.pt", model), model, kind="concepts")
    assert loaded.vocabulary == head.vocabulary
    text = data.val.text.text[:5]
    torch.testing.assert_close(loaded.text_codes(text, data.val.captions[:5]),
                               head.text_codes(text, data.val.captions[:5]), rtol=0, atol=0)


def test_fit_is_seeded_and_leaves_the_global_random_state_alone():
    from dicosa.heads.features import HeadData

    from ._scenes import scene_features

    data = HeadData(scene_features(12, seed=2), None)
    config = ConceptCodesHead.make_config({"dim": 16, "top_k": 4, "spine_steps": 5, "steps": 5,
                                           "batch_size": 8})
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = ConceptCodesHead.fit(scorer_model(), data, config, seed=7, progress=False)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)
    second = ConceptCodesHead.fit(scorer_model(), data, config, seed=7, progress=False)
    torch.testing.assert_close(first.text_encoder.weight, second.text_encoder.weight,
                               rtol=0, atol=0)
