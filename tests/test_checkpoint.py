"""Checkpoint files: atomic writes, weights-only loading, rebuilding, mismatch errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dicosa.checkpoint import load, load_checkpoint, save_checkpoint
from dicosa.config import Config
from dicosa.model import DiCoSA
from tests.conftest import random_batch, tiny_config


def _checkpoint(path, model_cfg=None, **extra):
    model_cfg = model_cfg or tiny_config()
    torch.manual_seed(0)
    model = DiCoSA.from_config(dataclasses.replace(model_cfg, pretrained=None))
    cfg = Config(model=model_cfg)
    save_checkpoint(path, {"model": model.state_dict(), "config": cfg.to_yaml(), **extra})
    return model, cfg


def test_load_rebuilds_the_same_model_without_pretrained_weights(tmp_path):
    # "openai" weights do not exist for the tiny architecture: building them would fail, so
    # this passes only if load() never asks for them.
    model_cfg = dataclasses.replace(tiny_config(), pretrained="openai")
    model, cfg = _checkpoint(tmp_path / "best.pt", model_cfg, selected_on="val", step=7)
    loaded, loaded_cfg = load(tmp_path / "best.pt")
    assert loaded_cfg == cfg and not loaded.training
    batch = random_batch()
    with torch.no_grad():
        a = model.eval().score(model.encode_text(batch["tokens"]),
                               model.encode_video(batch["frames"], batch["frame_mask"]))
        b = loaded.score(loaded.encode_text(batch["tokens"]),
                         loaded.encode_video(batch["frames"], batch["frame_mask"]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert load_checkpoint(tmp_path / "best.pt")["selected_on"] == "val"


def test_checkpoint_of_another_config_is_a_clear_error(tmp_path):
    _checkpoint(tmp_path / "best.pt")
    other = dataclasses.replace(tiny_config(), variant="paper", temporal_layers=1)
    with pytest.raises(ValueError) as exc:
        load(tmp_path / "best.pt", model_config=other)
    message = str(exc.value)
    assert "another model configuration" in message
    # The paper variant adds projections; one temporal block fewer removes keys.
    assert "missing keys" in message and "head.text_proj.weight" in message
    assert "unexpected keys" in message and "temporal.blocks.1." in message


def test_shape_mismatch_is_named(tmp_path):
    _checkpoint(tmp_path / "best.pt")
    with pytest.raises(ValueError, match=r"shape mismatches: temporal\.position: checkpoint "
                                         r"\(4, 64\) vs model \(6, 64\)"):
        load(tmp_path / "best.pt", model_config=dataclasses.replace(tiny_config(), num_frames=6))


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(3)}, "config": "", "step": 1})

    def crash(obj, fh, *args, **kwargs):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"model": {"w": torch.zeros(3)}, "config": "", "step": 2})
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_only_safe_types_are_stored(tmp_path):
    save_checkpoint(tmp_path / "x.pt", {"model": {}, "config": "", "bad": object()})
    with pytest.raises(Exception, match=r"(?i)weights_only"):
        load_checkpoint(tmp_path / "x.pt")


def test_models_fine_tuned_from_openai_are_rebuilt_with_quick_gelu(monkeypatch):
    """OpenAI's weights use QuickGELU, open_clip's plain ViT-B-32 config nn.GELU: rebuilding
    a fine-tuned model without pretrained weights must still ask for QuickGELU."""
    import open_clip

    from dicosa import checkpoint as ckpt

    asked = []
    real = open_clip.create_model

    def record(arch, *args, **kwargs):
        asked.append((arch, kwargs.get("force_quick_gelu")))
        return real("dicosa-tiny", pretrained=None)

    monkeypatch.setattr(open_clip, "create_model", record)
    for pretrained in ("openai", None):
        cfg = dataclasses.replace(tiny_config(), arch="ViT-B-32", pretrained=pretrained)
        ckpt.offline_model(dataclasses.replace(cfg, arch="ViT-B-32"))
    assert asked == [("ViT-B-32", True), ("ViT-B-32", False)]
