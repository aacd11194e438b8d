"""Every model configuration, and the documented Python example of the model, actually run."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest
import torch
import yaml

from dicosa.checkpoint import load, save_checkpoint
from dicosa.config import Config
from dicosa.model import DiCoSA
from tests._videos import write_video
from tests.conftest import random_batch, tiny_config

REPO = Path(__file__).resolve().parents[1]
SWEEP = list(itertools.product(["released", "paper"], [True, False], [True, False], [2, 8]))


@pytest.mark.parametrize("variant,factors,adaptive,k", SWEEP)
def test_every_configuration_trains_scores_and_round_trips(variant, factors, adaptive, k,
                                                           tmp_path):
    cfg = tiny_config(variant=variant, use_factors=factors, use_adaptive_pooling=adaptive,
                      num_concepts=k)
    torch.manual_seed(0)
    model = DiCoSA.from_config(cfg)
    batch = random_batch()
    losses = model(batch)
    assert torch.isfinite(losses["loss"])
    assert ("loss_decouple" in losses) == factors  # factor losses only with factors
    losses["loss"].backward()
    assert model.head.adaptive == (factors and adaptive)
    assert all(p.grad is not None for n, p in model.named_parameters()
               if n.startswith("head.") or n.startswith("temporal."))

    model.eval()
    with torch.no_grad():
        text = model.encode_text(batch["tokens"])
        video = model.encode_video(batch["frames"], batch["frame_mask"])
        sim = model.score(text, video)
    assert sim.shape == (4, 4) and torch.isfinite(sim).all()
    # Cosines weighted by confidences: fixed 1/K weights bound S by 1.
    if not model.head.adaptive:
        assert sim.abs().max() <= 1 + 1e-5

    save_checkpoint(tmp_path / "m.pt", {"model": model.state_dict(),
                                        "config": Config(model=cfg).to_yaml()})
    loaded, loaded_cfg = load(tmp_path / "m.pt")
    assert loaded_cfg.model == cfg
    with torch.no_grad():
        again = loaded.score(loaded.encode_text(batch["tokens"]),
                             loaded.encode_video(batch["frames"], batch["frame_mask"]))
    torch.testing.assert_close(again, sim, rtol=0, atol=0)  # same weights, same path


def _documented_python(section: str) -> str:
    page = (REPO / "docs" / "training.md").read_text()
    body = page.split(f"### {section}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_the_documented_python_example_runs(tmp_path, monkeypatch):
    """'Load a model' and 'Encode and score' as printed, with a tiny checkpoint, a tiny
    config and a real video file in place of the MSR-VTT ones."""
    torch.manual_seed(0)
    model_cfg = tiny_config()
    save_checkpoint(tmp_path / "best.pt", {
        "model": DiCoSA.from_config(model_cfg).state_dict(),
        "config": Config(model=model_cfg).to_yaml()})
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({"model": dataclasses.asdict(model_cfg)}))
    write_video(tmp_path / "clip.mp4", 20)
    code = (_documented_python("Load a model") + _documented_python("Encode and score"))
    for printed, ours in (("runs/msrvtt/best.pt", "best.pt"),
                          ('find_config("msrvtt")', 'find_config("tiny.yaml")')):
        assert printed in code
        code = code.replace(printed, ours)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/training.md", "exec"), scope)  # the page's own code
    assert scope["S"].shape == (2, 1)
    torch.testing.assert_close(scope["parts"]["similarity"], scope["S"])
