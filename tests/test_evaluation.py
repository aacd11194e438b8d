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
                 "qb_bank": "first-caption", "qb_theta_t2v": 1, "qb_theta_v2t": 1},
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

    # QB-Norm with the released MSR-VTT banks: the first caption of every training video
    # (t2v) and every training video (v2t), computed here straight from the model.
    train = load_split("synthetic", synthetic_root, "train")
    first = [train.caption_video.index(v) for v in range(train.num_videos)]
    tokenize = get_tokenizer("dicosa-tiny", 16)
    with torch.no_grad():
        bank_text = model.encode_text(tokenize([train.captions[i] for i in first]))
        train_videos = [VideoDataset(train, 4, 32)[v] for v in range(train.num_videos)]
        bank_video = model.encode_video(torch.stack([v["frames"] for v in train_videos]),
                                        torch.stack([v["frame_mask"] for v in train_videos]))
        test_text = model.encode_text(tokenize(split.captions))
        test_video = [VideoDataset(split, 4, 32)[v] for v in range(split.num_videos)]
        test_video = model.encode_video(torch.stack([v["frames"] for v in test_video]),
                                        torch.stack([v["frame_mask"] for v in test_video]))
        bank_t2v = model.score(bank_text, test_video)
        bank_v2t = model.score(test_text, bank_video)
    expected_qb = {
        "t2v": evaluate_similarity(PP.qb_norm(sim, bank_t2v, 1, 70.0, 1), caption_video)["t2v"],
        "v2t": evaluate_similarity(PP.qb_norm(sim.T, bank_v2t.T, 1, 70.0, 1).T,
                                   caption_video)["v2t"],
    }
    for direction in ("t2v", "v2t"):
        assert metrics["qbnorm"][direction] == pytest.approx(expected_qb[direction], abs=1e-9)
    bank = results["qbnorm_bank"]
    assert (bank["rule"], bank["t2v_queries"], bank["v2t_queries"]) == (
        "first-caption", train.num_videos, train.num_videos)
    assert bank["t2v_hubs"] == int(PP.hub_gallery_items(bank_t2v, 1, 1).sum())
    assert bank["v2t_hubs"] == int(PP.hub_gallery_items(bank_v2t.T, 1, 1).sum())

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
    assert [line.split("|")[0].strip() for line in table[2:5]] == ["raw", "+DSL", "+QB-Norm"]
    assert f"{expected['t2v']['R@1']:6.1f}" in table[2]
    # Multi-caption: v2t under both conventions, labelled, each row in its own table.
    assert "among V caption groups" in table[6] and len(table) == 11
    groups_mnr = metrics["raw"]["v2t_groups"]["MnR"]
    assert table[8].split("|")[2].split()[-1] == f"{groups_mnr:.1f}"


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
    # Only the concept head is random: the temporal transformer is a copy of CLIP's blocks.
    assert "only the concept head is randomly initialised" in results["note"]
    assert "copy of CLIP's first text blocks" in results["note"]
    assert "zero-shot" in summary(results)
    assert Path(results["json_path"]).parent == tmp_path


def test_split_names_imply_their_dataset():
    assert dataset_for_split("1k-A") == "msrvtt"
    assert dataset_for_split("val1") == "activitynet"
    with pytest.raises(ValueError, match="--dataset"):
        dataset_for_split("test")  # msvd, lsmdc and didemo all have one


def test_reported_numbers_are_scored_in_fp32_unless_bf16_is_asked_for(synthetic_root, tmp_path):
    ckpt = tmp_path / "best.pt"
    model = write_checkpoint(ckpt)
    sim, caption_video, _ = reference_similarity(model, synthetic_root, "test")
    # Training's mixed precision no longer reaches evaluation (it did before issue 11).
    cfg = eval_config(synthetic_root, tmp_path)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, mixed_precision="bf16"))
    fp32 = evaluate(cfg, ckpt, split="test", device="cpu", progress=False)
    assert fp32["precision"] == "fp32" and "scored in fp32" in summary(fp32)
    assert fp32["metrics"]["raw"]["t2v"] == pytest.approx(
        evaluate_similarity(sim, caption_video)["t2v"], abs=1e-9)

    bf16_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, precision="bf16"))
    calls = []
    real = evaluation.similarity
    evaluation.similarity = lambda *a, **k: calls.append(a[-1]) or real(*a, **k)
    try:
        bf16 = evaluate(bf16_cfg, ckpt, split="test", device="cpu", progress=False)
    finally:
        evaluation.similarity = real
    assert bf16["precision"] == "bf16" and calls == ["bf16"]


def test_query_banks_follow_the_released_loaders(synthetic_root):
    train = load_split("synthetic", synthetic_root, "train")
    train = dataclasses.replace(train, captions=[*train.captions, "an extra caption"],
                                caption_video=[*train.caption_video, 0])
    first = evaluation.query_banks(train, "released", "msrvtt")  # MSR-VTT: first captions
    assert first.rule == "first-caption" and first.videos == list(range(train.num_videos))
    assert first.captions == [train.captions[train.caption_video.index(v)]
                              for v in range(train.num_videos)]
    every = evaluation.query_banks(train, "released", "msvd")  # MSVD: every caption
    assert every.rule == "all-captions" and every.captions == train.captions
    assert every.videos == train.caption_video  # a video once per caption
