"""evaluate(): metric wiring, post-processing rows, feature cache, outputs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from dicosa import evaluation
from dicosa import postprocess as PP
from dicosa.checkpoint import save_checkpoint
from dicosa.clip import get_tokenizer
from dicosa.config import Config, config_from_dict
from dicosa.data.datasets import load_split
from dicosa.data.loader import VideoDataset
from dicosa.data.synthetic import make_synthetic
from dicosa.evaluation import dataset_for_split, evaluate, format_table, summary
from dicosa.metrics import evaluate_similarity
from dicosa.model import DiCoSA
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    # Every caption of a test clip is a query: multi-caption evaluation, as for MSVD.
    root = tmp_path_factory.mktemp("synthetic")
    return make_synthetic(root, num_train=12, num_test=6, size=32, seconds=1.0, fps=8,
                          test_captions="all", num_workers=1)


def eval_config(root: Path, out: Path, postprocess=()) -> Config:
    return config_from_dict({
        "model": dataclasses.asdict(tiny_config()),
        "data": {"dataset": "synthetic", "root": str(root), "train_split": "train",
                 "test_split": "test", "num_workers": 0},
        "train": {"output_dir": str(out), "mixed_precision": "no"},
        "eval": {"batch_size": 4, "score_chunk": 5, "postprocess": list(postprocess),
                 "qb_bank_captions": 20, "qb_bank_videos": 8, "qb_theta_t2v": 1,
                 "qb_theta_v2t": 1},
    })


def write_checkpoint(path: Path, seed: int = 0) -> DiCoSA:
    torch.manual_seed(seed)
    model = DiCoSA.from_config(tiny_config()).eval()
    save_checkpoint(path, {"model": model.state_dict(), "selected_on": "val", "step": 3,
                           "config": Config(model=tiny_config()).to_yaml()})
    return model


@torch.no_grad()
def reference_similarity(model: DiCoSA, root: Path, split_name: str):
    """S for a split, computed directly from the model (no evaluation code)."""
    split = load_split("synthetic", root, split_name)
    tokens = get_tokenizer("dicosa-tiny", 16)(split.captions)
    videos = [VideoDataset(split, 4, 32)[i] for i in range(split.num_videos)]
    frames = torch.stack([v["frames"] for v in videos])
    mask = torch.stack([v["frame_mask"] for v in videos])
    sim = model.score(model.encode_text(tokens), model.encode_video(frames, mask))
    return sim, torch.tensor(split.caption_video), split


def test_metrics_and_postprocessing_are_wired_through(synthetic_root, tmp_path):
    ckpt = tmp_path / "run" / "best.pt"
    model = write_checkpoint(ckpt)
    cfg = eval_config(synthetic_root, tmp_path / "unused", postprocess=("dsl", "qbnorm"))
    results = evaluate(cfg, ckpt, split="test", device="cpu", progress=False)

    sim, caption_video, split = reference_similarity(model, synthetic_root, "test")
    assert split.multi_caption and results["multi_caption"]
    metrics = results["metrics"]
    expected = evaluate_similarity(sim, caption_video)
    for direction in ("t2v", "v2t"):
        assert metrics["raw"][direction] == pytest.approx(expected[direction], abs=1e-9)
    assert metrics["raw"]["t2v"]["num_queries"] == split.num_captions
    assert metrics["raw"]["v2t"]["num_queries"] == split.num_videos
    assert metrics["dsl"]["t2v"] == pytest.approx(
        evaluate_similarity(PP.dsl_t2v(sim), caption_video)["t2v"], abs=1e-9)
    assert metrics["dsl"]["v2t"] == pytest.approx(
        evaluate_similarity(PP.dsl_v2t(sim), caption_video)["v2t"], abs=1e-9)
    assert set(metrics) == {"raw", "dsl", "qbnorm"}
    assert results["qbnorm_bank"]["captions"] == 20 and results["qbnorm_bank"]["videos"] == 8

    # The JSON beside the checkpoint says what was evaluated, how it was chosen and where.
    saved = json.loads(Path(results["json_path"]).read_text())
    assert Path(results["json_path"]).parent == ckpt.parent
    assert saved["checkpoint_sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert saved["selected_on"] == "val" and saved["zero_shot"] is False
    assert saved["postprocess"] == ["dsl", "qbnorm"]
    assert saved["device"].startswith("cpu") and saved["date"]
    assert saved["config"]["data"]["dataset"] == "synthetic"
    assert saved["metrics"]["raw"]["t2v"]["R@1"] == pytest.approx(expected["t2v"]["R@1"])

    table = format_table(results).splitlines()
    assert [line.split("|")[0].strip() for line in table[2:]] == ["raw", "+DSL", "+QB-Norm"]
    assert f"{expected['t2v']['R@1']:6.1f}" in table[2]


def test_features_are_cached_per_checkpoint_content(synthetic_root, tmp_path, monkeypatch):
    ckpt = tmp_path / "best.pt"
    write_checkpoint(ckpt, seed=0)
    cfg = eval_config(synthetic_root, tmp_path)
    first = evaluate(cfg, ckpt, split="test", device="cpu", progress=False)
    assert list((tmp_path / "cache").glob("video-test-*.pt"))

    def no_encoding(*args, **kwargs):
        raise AssertionError("features should have come from the cache")

    monkeypatch.setattr(evaluation, "encode_videos", no_encoding)
    monkeypatch.setattr(evaluation, "encode_texts", no_encoding)
    again = evaluate(cfg, ckpt, split="test", device="cpu", progress=False)
    assert again["metrics"] == first["metrics"]

    write_checkpoint(ckpt, seed=1)  # same path, other weights: the cache must not apply
    with pytest.raises(AssertionError, match="from the cache"):
        evaluate(cfg, ckpt, split="test", device="cpu", progress=False)


def test_zero_shot_says_so(synthetic_root, tmp_path):
    cfg = eval_config(synthetic_root, tmp_path)
    results = evaluate(cfg, None, split="test", device="cpu", progress=False)
    assert results["zero_shot"] and results["checkpoint"] is None
    assert "randomly initialised" in results["note"]
    assert "zero-shot" in summary(results)
    assert Path(results["json_path"]).parent == tmp_path


def test_split_names_imply_their_dataset():
    assert dataset_for_split("1k-A") == "msrvtt"
    assert dataset_for_split("val1") == "activitynet"
    with pytest.raises(ValueError, match="--dataset"):
        dataset_for_split("test")  # msvd, lsmdc and didemo all have one
