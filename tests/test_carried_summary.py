"""Every checkpoint dicosa trains carries its first-stage summary: fitted beside it
(``best.summary.pt``), found by fingerprint, used by default, announced in one line."""

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from dicosa.checkpoint import load
from dicosa.convert import summary_hint
from dicosa.heads.base import read_head_file
from dicosa.heads.summary import (
    DistilledSummaryHead,
    carried_summary,
    default_summary,
    summary_beside,
    summary_fit_command,
)
from dicosa.heads.train import fit_checkpoint_summary
from dicosa.model import DiCoSA

from .conftest import tiny_checkpoint, tiny_config

REPO = Path(__file__).resolve().parents[1]
SMALL = ["dim=8", "hidden=16", "steps=5", "queries_per_step=4", "shared_videos=8", "top=2",
         "near=2", "window=6", "teacher_queries=20"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny checkpoint over generated clips and the summary fitted beside it."""
    folder = tmp_path_factory.mktemp("carried")
    _, checkpoint, _ = tiny_checkpoint(folder, num_train=10)
    path, trained = fit_checkpoint_summary(checkpoint, SMALL, progress=False)
    return checkpoint, path, trained


def test_the_summary_is_fitted_beside_on_the_training_split(fitted):
    checkpoint, path, trained = fitted
    assert path == checkpoint.parent / "best.summary.pt" == summary_beside(checkpoint)
    state = read_head_file(path)
    assert state["kind"] == "summary"
    # training videos only: 10 clips, 2 held out for validation as training held them out
    assert trained["train_split"].endswith(":train") and trained["videos"] == 8
    assert trained["fit_seconds"] >= 0 and trained["encode_seconds"] >= 0


def test_carried_summary_is_found_and_checked_against_the_model(fitted, caplog):
    checkpoint, _, _ = fitted
    model, _ = load(checkpoint)
    head = carried_summary(checkpoint, model)
    assert isinstance(head, DistilledSummaryHead) and head.config.steps == 5
    # a model with other weights (best.pt rewritten after the fit): not used, and said so
    torch.manual_seed(1)
    other = DiCoSA.from_config(tiny_config()).eval()
    with caplog.at_level(logging.WARNING):
        assert carried_summary(checkpoint, other) is None
    assert "different weights" in caplog.text
    assert carried_summary(checkpoint.with_name("last.pt"), model) is None  # none beside


def test_default_summary_uses_the_carried_one(fitted):
    checkpoint, _, _ = fitted
    model, _ = load(checkpoint)
    kwargs, notice = default_summary(checkpoint, model)
    assert kwargs["summary"] == "distilled"
    assert isinstance(kwargs["summary_head"], DistilledSummaryHead)
    assert notice.startswith("first stage: the distilled summary fitted with")
    kwargs, notice = default_summary(checkpoint, model, "confidence")
    assert kwargs == {"summary": "confidence"}
    kwargs, _ = default_summary(checkpoint, model, str(summary_beside(checkpoint)))
    assert kwargs["summary"] == "distilled"
    kwargs, notice = default_summary(checkpoint, model, "frames")  # asked for: no head
    assert kwargs == {"summary": "frames"} and notice.startswith("first stage: 'frames'")


def test_without_a_carried_summary_the_notice_says_what_to_expect(tmp_path):
    model, checkpoint, _ = tiny_checkpoint(tmp_path, num_train=4)
    kwargs, notice = default_summary(checkpoint, model)
    assert kwargs == {"summary": "frames"}  # the best summary that needs no training
    assert "best frame" in notice and "78%" in notice and "38%" in notice
    assert summary_fit_command(checkpoint) in notice and "\n" not in notice
    kwargs, notice = default_summary(checkpoint, model, "confidence")
    assert kwargs == {"summary": "confidence"} and "carries no fitted summary" in notice
    # Milvus does not run the per-frame stage: its default stays 'confidence', said so
    kwargs, notice = default_summary(checkpoint, model, backend="milvus")
    assert kwargs == {"summary": "confidence"} and "not milvus" in notice
    with pytest.raises(ValueError, match=r"needs a fitted summary .* heads train summary"):
        default_summary(checkpoint, model, "distilled")


def test_convert_says_how_to_fit_the_summary(tmp_path):
    out = tmp_path / "dicosa.pt"
    hint = summary_hint(out)
    assert hint.endswith(f"dicosa heads train summary --checkpoint {out} --out "
                         f"{tmp_path / 'dicosa.summary.pt'}")


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script", REPO / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_py_no_summary_turns_the_fit_off(monkeypatch, tmp_path):
    import dicosa.training

    train_script = _train_script()
    seen = []
    # train.py runs `dicosa train`, which imports the training loop when it runs
    monkeypatch.setattr(dicosa.training, "train",
                        lambda cfg, resume: seen.append(cfg) or tmp_path)
    train_script.main(["--dataset", "synthetic"])
    train_script.main(["--dataset", "synthetic", "--no-summary"])
    assert [cfg.train.fit_summary for cfg in seen] == [True, False]


def test_a_model_without_confidence_mlp_defaults_to_its_frames():
    from dicosa.config import model_preset

    torch.manual_seed(0)
    model = DiCoSA.from_config(model_preset("zero-shot", arch="dicosa-tiny", pretrained=None,
                                            num_frames=4))
    kwargs, notice = default_summary(None, model)
    assert kwargs == {"summary": "frames"} and "best frame" in notice and "zero-shot" in notice
    kwargs, notice = default_summary(None, model, "confidence")
    assert kwargs == {"summary": "confidence"} and "frame mean" in notice


def test_training_ends_by_fitting_the_summary_and_logs_its_cost(tmp_path):
    from dicosa.config import config_from_dict
    from dicosa.data.synthetic import make_synthetic
    from dicosa.training import read_log, train

    root = make_synthetic(tmp_path / "data", num_train=12, num_test=0, size=32, seconds=0.5,
                          num_workers=1)
    run = tmp_path / "run"
    cfg = config_from_dict({
        "model": {"arch": "dicosa-tiny", "pretrained": None, "temporal_layers": 2,
                  "num_frames": 4, "max_words": 16},
        "data": {"dataset": "synthetic", "root": str(root), "val_fraction": 0.25,
                 "num_workers": 0},
        "train": {"batch_size": 4, "epochs": 1, "max_steps": 1, "mixed_precision": "no",
                  "output_dir": str(run), "summary_options": SMALL},
        "eval": {"batch_size": 16}})
    train(cfg)
    events = [r for r in read_log(run / "log.jsonl", event=None) if r["event"] == "summary"]
    assert len(events) == 1 and events[0]["videos"] == 9 and events[0]["seconds"] >= 0
    assert carried_summary(run / "best.pt", load(run / "best.pt")[0]) is not None
    fitted = (run / "best.summary.pt").stat().st_mtime_ns
    train(cfg, resume=True)  # a finished run resumed keeps the summary of its best.pt
    assert (run / "best.summary.pt").stat().st_mtime_ns == fitted
