"""The ``zero-shot`` model preset: CLIP's text-video cosine under a parameter-free
text-conditioned pooling of the frames, with nothing untrained in the way."""

from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

from dicosa.clip import CLIP_MEAN, CLIP_STD, TINY_ARCH, get_tokenizer
from dicosa.config import MODEL_PRESETS, load_config, model_preset
from dicosa.fingerprint import model_fingerprint
from dicosa.model import DiCoSA

from ._index import exhaustive_scores
from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a red circle moves left", "a blue square grows", "two green crosses fall", "stars"]


def zero_shot(**overrides) -> DiCoSA:
    """The preset on the tiny random-weight CLIP."""
    torch.manual_seed(0)
    values = {"arch": TINY_ARCH, "pretrained": None, "num_frames": 4, **overrides}
    return DiCoSA.from_config(model_preset("zero-shot", **values)).eval()


def reference_scores(clip, texts, frames, mask, temperature) -> torch.Tensor:
    """S from open_clip's own encoders, pair by pair: CLIP's 77-token text vector and each
    frame's image vector, both unit; frame weights softmax(cos / τ) over the valid frames;
    S = cos(text, Σ a_i f_i)."""
    tokens = open_clip.get_tokenizer(TINY_ARCH)(texts)  # [B_t, 77]
    images = frames.flatten(0, 1).float() / 255.0
    mean, std = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        text = clip.encode_text(tokens, normalize=True)  # [B_t, D]
        image = clip.encode_image((images - mean) / std, normalize=True)
    image = image.view(*frames.shape[:2], -1)  # [B_v, N, D]
    out = torch.zeros(len(texts), len(frames))
    for t in range(len(texts)):
        for v in range(len(frames)):
            valid = image[v][mask[v]]  # [n, D]
            weights = torch.softmax(valid @ text[t] / temperature, dim=0)
            pooled = (weights[:, None] * valid).sum(0)
            out[t, v] = F.cosine_similarity(text[t], pooled, dim=0)
    return out


def _frames(count=5, num=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (count, num, 3, 32, 32), generator=g, dtype=torch.uint8)
    mask = torch.ones(count, num, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 1:] = False
    return frames, mask


def test_the_yaml_is_the_preset():
    cfg = load_config(ROOT / "configs" / "zero-shot.yaml")
    assert cfg.model == model_preset("zero-shot")
    assert MODEL_PRESETS["zero-shot"]["pool_temperature"] == 0.01


def test_unknown_preset_is_one_sentence():
    with pytest.raises(ValueError, match="unknown model preset 'zeroshot'; known: zero-shot"):
        model_preset("zeroshot")


@pytest.mark.parametrize("temperature", [0.01, 0.1])
def test_scores_equal_a_naive_reference_from_open_clip(temperature):
    model = zero_shot(pool_temperature=temperature)
    frames, mask = _frames()
    tokens = get_tokenizer(TINY_ARCH, model.config.max_words)(TEXTS)
    with torch.no_grad():
        got = model.score(model.encode_text(tokens), model.encode_video(frames, mask))
    want = reference_scores(model.clip, TEXTS, frames, mask, temperature)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # The pooling matters: the reference of a much sharper pooling differs.
    assert (reference_scores(model.clip, TEXTS, frames, mask, temperature / 100) - want
            ).abs().max() > 1e-3


def test_mean_pooling_is_the_limit():
    model = zero_shot(pool_temperature=1e6)
    frames, mask = _frames()
    with torch.no_grad():
        text = model.encode_text(get_tokenizer(TINY_ARCH, 77)(TEXTS))
        video = model.encode_video(frames, mask)
        got = model.score(text, video)
    weights = mask[..., None].float()
    mean = (video.frames * weights).sum(1) / weights.sum(1)
    torch.testing.assert_close(got, F.normalize(text.text, dim=-1) @ F.normalize(mean, dim=-1).T,
                               atol=1e-5, rtol=1e-4)


def test_nothing_untrained_touches_features_or_scores():
    """No temporal transformer, no factor projections, no confidence MLP: every weight of
    the model is CLIP's (so a CLIP checkpoint alone fixes its fingerprint)."""
    model = zero_shot()
    assert model.temporal is None and not model.head.adaptive
    assert model.head.text_proj is None and model.num_concepts == 1
    assert all(name.startswith("clip.") for name in model.state_dict())
    # features are unit vectors, on which Eq. 1 pools by cosine
    frames, mask = _frames()
    with torch.no_grad():
        video = model.encode_video(frames, mask)
    torch.testing.assert_close(video.frames.norm(dim=-1), torch.ones(5, 4))


def test_normalize_features_changes_the_fingerprint_only_when_on():
    torch.manual_seed(0)
    plain = DiCoSA.from_config(tiny_config())
    assert "normalize_features" not in model_fingerprint(plain)["config"]
    assert model_fingerprint(zero_shot())["config"]["normalize_features"] is True


def test_temporal_layers_zero_passes_clip_frames_through():
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(temporal_layers=0)).eval()
    frames, mask = _frames()
    images = (frames.flatten(0, 1).float() / 255 - model.pixel_mean) / model.pixel_std
    with torch.no_grad():
        want = model.clip.encode_image(images).view(5, 4, -1)
        got = model.encode_video(frames, mask).frames
    torch.testing.assert_close(got, want)


def test_two_stage_search_equals_exhaustive_on_generated_clips(tmp_path):
    """An index of generated clips searched with the zero-shot model: its top 10 are the
    exhaustive top 10, scored as the open_clip reference scores the decoded frames."""
    from dicosa.data.datasets import load_split
    from dicosa.data.synthetic import make_synthetic
    from dicosa.data.video import load_video
    from dicosa.index import VideoIndex

    root = make_synthetic(tmp_path / "data", num_train=24, num_test=0, size=32, seconds=0.5,
                          num_workers=1)
    split = load_split("synthetic", root, "9k")
    model = zero_shot()
    index = VideoIndex.build(model, split.video_paths, device="cpu", progress=False,
                             num_workers=0)
    queries = [split.captions[i] for i in range(0, len(split.captions), 9)][:6]
    two_stage = index.search(queries, k=10)
    exhaustive = index.search(queries, k=10, candidates=None)
    for got, want in zip(two_stage, exhaustive, strict=True):
        assert [h.id for h in got] == [h.id for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-6)
    # the index's scores are the reference's on the frames it decoded (stored in float16)
    clips = [load_video(p, model.config.num_frames, model.image_size) for p in index.paths]
    frames = torch.stack([frames for frames, _ in clips])
    mask = torch.stack([mask for _, mask in clips])
    want = reference_scores(model.clip, queries, frames, mask, model.config.pool_temperature)
    scores = exhaustive_scores(index, queries)
    torch.testing.assert_close(scores.float(), want, atol=5e-3, rtol=0)


TINY_ZERO_SHOT = ["model.arch=dicosa-tiny", "model.pretrained=null", "model.num_frames=4"]


def test_without_checkpoint_or_config_the_model_is_zero_shot_and_says_so(caplog):
    import logging

    from dicosa.loading import ZERO_SHOT_NOTICE, load_model, model_from_source

    with caplog.at_level(logging.INFO, logger="dicosa"):
        model, source, _ = load_model(None, None, TINY_ZERO_SHOT)
    assert model.config == model_preset("zero-shot", arch=TINY_ARCH, pretrained=None,
                                        num_frames=4)
    assert Path(source["config"]).name == "zero-shot.yaml"
    assert caplog.text.count(ZERO_SHOT_NOTICE) == 1 and "\n" not in ZERO_SHOT_NOTICE
    # the recorded source rebuilds the same model (a search process: no image tower)
    again = model_from_source(source, towers="text")
    assert model_fingerprint(again) == model_fingerprint(model)
    assert not any(k.startswith("clip.visual.") for k in again.state_dict())
