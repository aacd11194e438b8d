import pytest
import torch

from dicosa.model import DiCoSA, TextFeatures, VideoFeatures

from .conftest import random_batch, tiny_config


def _features(model, batch):
    with torch.no_grad():
        return (model.encode_text(batch["tokens"]),
                model.encode_video(batch["frames"], batch["frame_mask"]))


def test_shapes(tiny_model):
    batch = random_batch(batch=5)
    text, video = _features(tiny_model, batch)
    assert text.text.shape == (5, 64)
    assert video.frames.shape == (5, 4, 64) and video.frame_mask.shape == (5, 4)
    assert tiny_model.score(text, video[:3]).shape == (5, 3)
    parts = tiny_model.explain(text[:2], video)
    assert parts["cosines"].shape == parts["confidences"].shape == (2, 5, 8)
    assert parts["weights"].shape == (2, 5, 4)
    losses = tiny_model(batch)
    assert {"loss", "loss_sim", "loss_decouple", "loss_align"} <= set(losses)
    assert all(v.ndim == 0 and torch.isfinite(v) for v in losses.values())


@pytest.mark.paths
def test_score_is_permutation_equivariant(tiny_model):
    text, video = _features(tiny_model, random_batch(batch=6))
    scores = tiny_model.score(text, video)
    perm_t, perm_v = torch.randperm(6), torch.randperm(6)
    torch.testing.assert_close(tiny_model.score(text[perm_t], video), scores[perm_t])
    torch.testing.assert_close(tiny_model.score(text, video[perm_v]), scores[:, perm_v])


@pytest.mark.paths
def test_chunked_scoring_is_exact(tiny_model):
    text, video = _features(tiny_model, random_batch(batch=7))
    full = tiny_model.score(text, video)
    for chunk in (1, 2, 3, 7, 100):
        torch.testing.assert_close(tiny_model.score(text, video, chunk=chunk), full,
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.paths
def test_score_diagonal_matches_explained_sum(tiny_model):
    text, video = _features(tiny_model, random_batch())
    parts = tiny_model.explain(text, video)
    torch.testing.assert_close((parts["cosines"] * parts["confidences"]).sum(-1),
                               tiny_model.score(text, video))


def test_padded_frames_have_no_effect_in_paper_variant():
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant="paper")).eval()
    batch = random_batch(batch=3)
    batch["frame_mask"][:] = torch.tensor([True, True, False, False])
    text, video = _features(model, batch)
    noisy = dict(batch, frames=batch["frames"].clone())
    noisy["frames"][:, 2:] = 255 - noisy["frames"][:, 2:]
    _, video_noisy = _features(model, noisy)
    torch.testing.assert_close(model.score(text, video_noisy), model.score(text, video))
    # ... and equal to the same videos cut to their two real frames.
    short = dict(batch, frames=batch["frames"][:, :2], frame_mask=batch["frame_mask"][:, :2])
    _, video_short = _features(model, short)
    torch.testing.assert_close(model.score(text, video_short), model.score(text, video),
                               atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_trainable_parameter(variant):
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant=variant)).train()
    model(random_batch())["loss"].backward()
    dead = [n for n, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert dead == []


def test_temporal_transformer_starts_as_clips_text_blocks(tiny_model):
    clip_blocks = tiny_model.clip.transformer.resblocks
    for block, original in zip(tiny_model.temporal.blocks, clip_blocks, strict=False):
        for (name, a), (_, b) in zip(block.state_dict().items(), original.state_dict().items(),
                                     strict=True):
            assert torch.equal(a, b), name
    torch.testing.assert_close(tiny_model.temporal.position,
                               tiny_model.clip.positional_embedding[:4])
    # Copies, not shared parameters: training one must not move the other.
    assert tiny_model.temporal.blocks[0].attn.in_proj_weight is not \
        clip_blocks[0].attn.in_proj_weight


def test_variants_differ_where_the_readme_says(variant):
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant=variant))
    has_projection = model.head.text_proj is not None
    assert has_projection == (variant == "paper")
    assert model.mask_mode == ("before" if variant == "paper" else "after")


def test_ablation_switches():
    torch.manual_seed(0)
    baseline = DiCoSA.from_config(tiny_config(use_factors=False))
    losses = baseline(random_batch())
    assert set(losses) == {"loss", "loss_sim", "logit_scale"}
    text, video = _features(baseline.eval(), random_batch())
    # One factor with no confidence MLP is plain cosine similarity of T and pooled V.
    scores = baseline.score(text, video)
    assert scores.abs().max() <= 1 + 1e-5
    mean_pool = DiCoSA.from_config(tiny_config(use_adaptive_pooling=False)).eval()
    parts = mean_pool.explain(*_features(mean_pool, random_batch()))
    torch.testing.assert_close(parts["confidences"], torch.full_like(parts["confidences"], 1 / 8))


def test_bad_inputs_raise_clear_errors(tiny_model):
    batch = random_batch()
    with pytest.raises(ValueError, match=r"\[B, N, 3, H, W\]"):
        tiny_model.encode_video(batch["frames"][0])
    with pytest.raises(ValueError, match="4 captions but 3 videos"):
        tiny_model(dict(batch, frames=batch["frames"][:3], frame_mask=batch["frame_mask"][:3]))
    with pytest.raises(ValueError, match="frame_mask"):
        tiny_model.encode_video(batch["frames"], batch["frame_mask"][:, :2])
    with pytest.raises(ValueError, match="at least one valid frame"):
        tiny_model.encode_video(batch["frames"], torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="px"):
        tiny_model.encode_video(torch.zeros(1, 2, 3, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="tokens must be"):
        tiny_model.encode_text(batch["tokens"][0])


def test_temporal_layers_beyond_clip_is_an_error():
    with pytest.raises(ValueError, match="temporal_layers=4"):
        DiCoSA.from_config(tiny_config(temporal_layers=4))


def test_features_move_between_devices_and_dtypes(tiny_model):
    text, video = _features(tiny_model, random_batch())
    assert isinstance(text.to(dtype=torch.float16), TextFeatures)
    half = video.to(dtype=torch.float16)
    assert isinstance(half, VideoFeatures) and half.frame_mask.dtype == torch.bool


def test_paper_projections_start_with_clips_alignment():
    """W_k start as the identity: matched text/video factors are as aligned as CLIP's vectors,
    where independent default initialisations scramble the two modalities apart."""
    import torch.nn.functional as F

    from dicosa import functional as DF
    from dicosa.model import ConceptHead

    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant="paper")).eval()
    text = torch.randn(32, model.embed_dim)
    video = text + 0.3 * torch.randn_like(text)  # matched pairs, CLIP-like alignment
    k = model.num_concepts

    def matched_cosine(head) -> float:
        with torch.no_grad():
            return F.cosine_similarity(head.text_factors(text), head.frame_factors(video),
                                       dim=-1).mean().item()

    split = F.cosine_similarity(DF.split_concepts(text, k), DF.split_concepts(video, k),
                                dim=-1).mean().item()
    assert split > 0.9
    assert matched_cosine(model.head) == pytest.approx(split, abs=1e-6)
    scrambled = ConceptHead(model.embed_dim, k)
    scrambled.text_proj.reset_parameters()
    scrambled.video_proj.reset_parameters()
    assert abs(matched_cosine(scrambled)) < 0.3  # what the identity start avoids
