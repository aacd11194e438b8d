import logging

import open_clip
import pytest
import torch

from dicosa import clip as dclip


@pytest.fixture(scope="module")
def tiny_clip():
    torch.manual_seed(0)
    return dclip.load_clip(dclip.TINY_ARCH, pretrained=None).eval()


def test_short_text_forward_equals_open_clip_at_the_eot(tiny_clip):
    tokenize = dclip.get_tokenizer(dclip.TINY_ARCH, context_length=16)
    tokens = tokenize(["a red circle moves left", "two squares", "word " * 40])
    assert tokens.shape == (3, 16) and (tokens.argmax(-1) <= 15).all()
    ours = dclip.encode_text_tokens(tiny_clip, tokens)
    # Causal attention: the EOT output depends on earlier positions only, so padding the
    # tokens to 77 must not change it.
    padded = torch.zeros(3, 77, dtype=torch.long)
    padded[:, :16] = tokens
    with torch.no_grad():
        torch.testing.assert_close(ours, tiny_clip.encode_text(padded), atol=1e-5, rtol=1e-5)


def test_padding_after_the_last_eot_is_not_encoded(tiny_clip):
    """The tower runs on the columns up to the batch's last EOT only, with the same result."""
    tokenize = dclip.get_tokenizer(dclip.TINY_ARCH, context_length=32)
    tokens = tokenize(["a red circle", "two small squares move left"])
    lengths = []
    hook = tiny_clip.transformer.register_forward_pre_hook(
        lambda module, args: lengths.append(args[0].shape[1]))
    try:
        short = dclip.encode_text_tokens(tiny_clip, tokens)
    finally:
        hook.remove()
    assert lengths == [int(tokens.argmax(-1).max()) + 1] and lengths[0] < 32
    with torch.no_grad():
        torch.testing.assert_close(short, tiny_clip.encode_text(
            torch.nn.functional.pad(tokens, (0, 77 - 32))), atol=1e-5, rtol=1e-5)


def test_long_captions_keep_their_eot():
    tokens = dclip.get_tokenizer(dclip.TINY_ARCH, 8)(["word " * 40])
    assert tokens[0, -1].item() == tokens.max().item()


def test_checkpoint_file_loads_and_mismatch_is_clear(tmp_path, tiny_clip):
    path = tmp_path / "clip.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in tiny_clip.state_dict().items()}}, path)
    loaded = dclip.load_clip(dclip.TINY_ARCH, pretrained=str(path))
    for (k, a), b in zip(tiny_clip.state_dict().items(), loaded.state_dict().values(),
                         strict=True):
        assert torch.equal(a, b), k
    other = tmp_path / "other.pt"
    torch.save({"visual.proj": torch.zeros(3)}, other)
    with pytest.raises(ValueError, match="does not match architecture 'dicosa-tiny'"):
        dclip.load_clip(dclip.TINY_ARCH, pretrained=str(other))
    with pytest.raises(FileNotFoundError, match="not found"):
        dclip.load_clip(dclip.TINY_ARCH, pretrained=str(tmp_path / "missing.pt"))


def test_safetensors_checkpoint_loads(tmp_path, tiny_clip):
    from safetensors.torch import save_file

    path = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_clip.state_dict().items()}, str(path))
    loaded = dclip.load_clip(dclip.TINY_ARCH, pretrained=str(path))
    assert torch.equal(loaded.logit_scale, tiny_clip.logit_scale)


def test_unknown_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown CLIP architecture 'ViT-B-23'"):
        dclip.load_clip("ViT-B-23", pretrained=None)


def test_openai_weights_force_quick_gelu(monkeypatch):
    seen = {}
    real_create_model = open_clip.create_model

    def fake_create_model(arch, pretrained=None, force_quick_gelu=False, **kwargs):
        seen.update(arch=arch, pretrained=pretrained, quick=force_quick_gelu)
        return real_create_model(dclip.TINY_ARCH, pretrained=None)

    monkeypatch.setattr(open_clip, "create_model", fake_create_model)
    dclip.load_clip("ViT-B-32", pretrained="openai")
    assert seen == {"arch": "ViT-B-32", "pretrained": "openai", "quick": True}


def test_tiny_arch_dimensions(tiny_clip):
    dims = dclip.clip_dims(tiny_clip)
    assert dims == {"embed_dim": 64, "text_width": 64, "text_heads": 2, "text_layers": 2,
                    "context_length": 77, "image_size": 32}


def test_unavailable_pretrained_weights_say_what_to_do(monkeypatch):
    def offline(*args, **kwargs):
        raise RuntimeError("Failed to download weights for tag 'openai'")

    monkeypatch.setattr(open_clip, "create_model", offline)
    with pytest.raises(dclip.PretrainedWeightsError, match=r"model\.pretrained to a local"):
        dclip.load_clip("ViT-B-32", pretrained="openai")


def test_random_weights_on_request_are_not_warned_about_but_failed_loads_are(caplog):
    with caplog.at_level(logging.WARNING):
        dclip.load_clip(dclip.TINY_ARCH, pretrained=None)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # The filter is gone afterwards: open_clip's own warning reaches the log again.
    with caplog.at_level(logging.WARNING):
        open_clip.create_model(dclip.TINY_ARCH, pretrained=None)
    assert any("No pretrained weights loaded" in r.getMessage() for r in caplog.records)
    # A tag the architecture has no weights for must fail, never fall back to random.
    with pytest.raises(dclip.PretrainedWeightsError, match="cannot load CLIP weights"):
        dclip.load_clip(dclip.TINY_ARCH, pretrained="laion2b_s34b_b79k")
