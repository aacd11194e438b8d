import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from dicosa.clip import get_tokenizer
from dicosa.data.protocol import PAD_COLOURS, FrameProtocol
from dicosa.data.video import load_video
from dicosa.model import DiCoSA
from dicosa.visualize import _AttentionCapture, _vocabulary_words, visualize_factors

from ._videos import write_video
from .conftest import random_batch, tiny_config

TEXTS = ["a man is skiing down a hill", "a dog"]


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


def _scores(model, texts, frames, mask):
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    with torch.no_grad():
        return model.score(model.encode_text(tokenize(texts)),
                           model.encode_video(frames[None], mask[None]))[:, 0]


def _labels(figure):
    return [ax.get_label() for ax in figure.axes]


@pytest.mark.paths
def test_figure_layout_and_report(tiny_model):
    batch = random_batch()
    frames, mask = batch["frames"][1], batch["frame_mask"][1]  # frames 2 and 3 are padding
    figure, report = visualize_factors(tiny_model, frames, TEXTS, frame_mask=mask)
    num_k, num_frames = tiny_model.num_concepts, frames.shape[0]
    labels = _labels(figure)

    # One group per text: N frame panels + a summary, then per factor N heat maps + words.
    assert len(figure.axes) == len(TEXTS) * ((num_k + 1) * (num_frames + 1))
    for t in range(len(TEXTS)):
        assert f"text{t}/summary" in labels
        for k in range(num_k):
            assert f"text{t}/factor{k}/words" in labels
            assert sum(lab.startswith(f"text{t}/factor{k}/frame") for lab in labels) == num_frames
    assert not any(lab.startswith(f"text0/factor{num_k}/") for lab in labels)

    expected = _scores(tiny_model, TEXTS, frames, mask)
    tokenize = get_tokenizer(tiny_model.config.arch, tiny_model.config.max_words)
    grid = tiny_model.image_size // 8  # patch size 8
    for t, pair in enumerate(report.pairs):
        assert pair.text == TEXTS[t]
        np.testing.assert_allclose(pair.contributions.sum(), pair.similarity, atol=1e-6)
        np.testing.assert_allclose(pair.contributions, pair.confidences * pair.cosines, rtol=1e-6)
        assert pair.similarity == pytest.approx(float(expected[t]), abs=1e-6)
        assert pair.heatmaps.shape == (num_k, num_frames, grid, grid)
        assert np.isfinite(pair.heatmaps).all() and (pair.heatmaps >= 0).all()
        if tiny_model.config.variant == "paper":
            # Padded frames take no part in the paper's score, so nothing there is relevant.
            # (The released code's softmax runs over padding before masking, so there they
            # do move S, through the weights of the real frames.)
            assert (pair.heatmaps[:, ~mask.numpy()] == 0).all()
        assert (pair.heatmaps[:, mask.numpy()].reshape(num_k, -1).max(1) > 0).all()
        real_tokens = int((tokenize([TEXTS[t]])[0] != 0).sum())
        assert len(pair.tokens) == real_tokens
        assert pair.tokens[0] == "[SOT]" and pair.tokens[-1] == "[EOT]"
        assert pair.word_attributions.shape == (num_k, real_tokens)
        assert np.isfinite(pair.word_attributions).all()
        assert np.abs(pair.word_attributions).sum() > 0
        assert pair.weights.shape == (num_frames,) and (pair.weights[~mask.numpy()] == 0).all()
        assert len(pair.factor_names) == num_k and all(len(n) == 3 for n in pair.factor_names)
    assert "skiing" in report.pairs[0].tokens


def test_any_number_of_factors_and_png(tmp_path):
    torch.manual_seed(1)
    model = DiCoSA.from_config(tiny_config(variant="paper", num_concepts=4)).eval()
    frames = random_batch(batch=2)["frames"][0]
    out = tmp_path / "sub" / "factors.png"
    figure, report = visualize_factors(model, frames, "a red circle", save_path=out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.num_concepts == 4
    assert len(figure.axes) == (4 + 1) * (frames.shape[0] + 1)
    assert report.pairs[0].heatmaps.shape[0] == 4


def test_maps_follow_the_factor_score():
    """Each factor's map and word attribution come from its own g_k·s_k: silencing factor 2's
    text projection (e_2^t = 0, so s_2 = 0 whatever the video) empties exactly its row."""
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(variant="paper")).eval()
    width = model.embed_dim // model.num_concepts
    with torch.no_grad():
        model.head.text_proj.weight[2 * width:3 * width] = 0
    frames = random_batch(batch=2)["frames"][0]
    _, report = visualize_factors(model, frames, TEXTS[0])
    pair = report.pairs[0]
    assert pair.cosines[2] == 0
    assert (pair.heatmaps[2] == 0).all() and (pair.word_attributions[2] == 0).all()
    others = [k for k in range(model.num_concepts) if k != 2]
    assert (pair.heatmaps[others].reshape(len(others), -1).max(1) > 0).all()
    assert not np.allclose(pair.heatmaps[0], pair.heatmaps[1])


def test_uniform_confidences_without_adaptive_pooling():
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config(use_adaptive_pooling=False)).eval()
    _, report = visualize_factors(model, random_batch(batch=2)["frames"][0], TEXTS[0])
    pair = report.pairs[0]
    np.testing.assert_allclose(pair.confidences, 1 / model.num_concepts)
    np.testing.assert_allclose(pair.contributions.sum(), pair.similarity, atol=1e-6)


def test_frozen_weights_and_no_grad_context():
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config()).eval().requires_grad_(False)
    frames = random_batch(batch=2)["frames"][0]
    with torch.no_grad():
        _, report = visualize_factors(model, frames, TEXTS[0])
    assert report.pairs[0].heatmaps.max() > 0
    assert np.abs(report.pairs[0].word_attributions).max() > 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.paths
def test_attention_capture_leaves_the_forward_unchanged(model):
    frames = random_batch(batch=2)["frames"][:1]
    with torch.no_grad():
        plain = model.encode_video(frames).frames
        capture = _AttentionCapture(model.clip.visual.transformer.resblocks)
        try:
            hooked = model.encode_video(frames).frames
        finally:
            capture.remove()
        after = model.encode_video(frames).frames
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=1e-5)
    assert torch.equal(after, plain)  # hooks removed
    layers = len(model.clip.visual.transformer.resblocks)
    assert len(capture.probs) == layers
    probs = capture.probs[0]  # [N, heads, 1 + patches, 1 + patches]
    assert probs.shape == (frames.shape[1], 2, 17, 17)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


def test_factor_names_rank_vocabulary_by_factor_cosine(model):
    frames = random_batch(batch=2)["frames"][0]
    captions = ["The dog runs on the grass.", "A dog and a cat play", "a red car drives away"]
    _, report = visualize_factors(model, frames, TEXTS[0], vocabulary=captions,
                                  num_names=2)
    words = _vocabulary_words(captions)
    assert words[0] == "dog"  # most frequent first; "the"/"a"/"and" dropped
    assert not {"the", "a", "and", "on"} & set(words)
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    with torch.no_grad():
        word_factors = model.head.text_factors(model.encode_text(tokenize(words)).text)
        video = model.encode_video(frames[None])
        weights = torch.tensor(report.pairs[0].weights)
        video_factors = torch.einsum("n,nkc->kc", weights,
                                     model.head.frame_factors(video.frames)[0])
    cos = torch.nn.functional.cosine_similarity(word_factors, video_factors[None], dim=-1)
    for k, names in enumerate(report.pairs[0].factor_names):
        best = cos[:, k].argsort(descending=True)[:2].tolist()
        assert names == [words[i] for i in best]


def test_video_file_input(tmp_path, model):
    path = write_video(tmp_path / "clip.mp4", num_frames=12, width=40, height=32)
    _, report = visualize_factors(model, path, TEXTS[0])
    assert report.video == str(path)
    assert report.frames.shape == (model.config.num_frames, 3, 32, 32)
    assert report.frame_mask.all()


def test_video_file_decoded_with_the_given_frame_protocol(tmp_path, model):
    # 3 s at 10 fps: the released grid takes one frame per second and pads the rest with the
    # mean colour, where the default takes segment centres of all 30 frames.
    path = write_video(tmp_path / "clip.mp4", num_frames=30, fps=10)
    n, size = model.config.num_frames, model.image_size
    released, released_mask = load_video(path, n, size, sampling="released",
                                          pad_colour=PAD_COLOURS["mean"])
    segments, _ = load_video(path, n, size)
    assert not torch.equal(released, segments)
    _, report = visualize_factors(model, path, TEXTS[0],
                                  protocol=FrameProtocol("released", "mean"))
    assert np.array_equal(report.frames, released.numpy())
    assert np.array_equal(report.frame_mask, released_mask.numpy())
    _, default = visualize_factors(model, path, TEXTS[0])
    assert np.array_equal(default.frames, segments.numpy())


def test_bad_inputs(model):
    frames = random_batch(batch=2)["frames"][0]
    with pytest.raises(ValueError, match="uint8"):
        visualize_factors(model, frames.float(), TEXTS)
    with pytest.raises(ValueError, match="at least one"):
        visualize_factors(model, frames, [])
    with pytest.raises(ValueError, match="frame_mask"):
        visualize_factors(model, frames, TEXTS, frame_mask=torch.ones(2, dtype=torch.bool))
