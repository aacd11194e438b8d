"""A search process loads a checkpoint without CLIP's image tower (``towers="text"``) and
still carries the whole checkpoint's fingerprint."""

import dataclasses

import pytest
import torch

from dicosa.checkpoint import load, save_checkpoint
from dicosa.clip import get_tokenizer
from dicosa.config import Config
from dicosa.fingerprint import model_fingerprint, weights_sha256
from dicosa.index import VideoIndex
from dicosa.model import DiCoSA

from .conftest import tiny_config
from .test_index_search import QUERIES, _features


@pytest.fixture(scope="module", params=["released", "paper"])
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    cfg = tiny_config(variant=request.param)
    model = DiCoSA.from_config(cfg).eval()
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    save_checkpoint(path, {"model": model.state_dict(), "config": Config(model=cfg).to_yaml()})
    return model, path


def test_text_model_scores_as_the_whole_model(saved):
    model, path = saved
    text_model, cfg = load(path, towers="text")
    assert not any(k.startswith("clip.visual.") for k in text_model.state_dict())
    assert len(text_model.state_dict()) < len(model.state_dict())
    tokens = get_tokenizer(cfg.model.arch, cfg.model.max_words)(QUERIES)
    video = _features(model, 7, seed=1).to(dtype=torch.float32)
    with torch.no_grad():
        want_text, got_text = model.encode_text(tokens), text_model.encode_text(tokens)
        want = model.score(want_text, video)
        got = text_model.score(got_text, video)
    torch.testing.assert_close(got_text.text, want_text.text)
    torch.testing.assert_close(got, want)


def test_fingerprint_is_the_checkpoints_recorded_not_recomputed(saved):
    model, path = saved
    text_model, _ = load(path, towers="text")
    assert model_fingerprint(text_model) == model_fingerprint(model)
    # what it holds hashes to something else: the fingerprint is the one recorded at load
    assert weights_sha256(text_model.state_dict()) != model_fingerprint(model)["weights_sha256"]
    # and a caller cannot change the record through the returned dict
    model_fingerprint(text_model)["weights_sha256"] = "x"
    assert model_fingerprint(text_model) == model_fingerprint(model)


def test_encoding_a_video_is_one_sentence(saved):
    _, path = saved
    text_model, _ = load(path, towers="text")
    frames = torch.zeros(1, 4, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"loaded for search only .* towers=.all."):
        text_model.encode_video(frames)


def test_an_index_built_with_the_whole_model_searches_with_the_text_model(saved, tmp_path):
    model, path = saved
    index = VideoIndex(model, device="cpu")
    index.add_features(_features(model, 40, seed=2), [{"path": f"v{i}"} for i in range(40)])
    index.save(tmp_path / "index")
    want = index.search(QUERIES, k=5, candidates=10)
    text_model, _ = load(path, towers="text")
    reopened = VideoIndex.load(tmp_path / "index", text_model)  # strict fingerprint check
    got = reopened.search(QUERIES, k=5, candidates=10)
    for a, b in zip(got, want, strict=True):
        assert [h.id for h in a] == [h.id for h in b]
        torch.testing.assert_close(torch.tensor([h.score for h in a]),
                                   torch.tensor([h.score for h in b]))


def test_another_architecture_is_one_sentence(saved):
    _, path = saved
    other = dataclasses.replace(tiny_config(), num_frames=6)
    with pytest.raises(ValueError, match="written for another model configuration"):
        load(path, model_config=other, towers="text")
    with pytest.raises(ValueError, match="towers must be 'all' or 'text'"):
        load(path, towers="vision")
