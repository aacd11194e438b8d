"""The training loop: data order, 2-process equivalence, NaN stop, resume after SIGKILL."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml
from torch.utils.data import Dataset

from dicosa.checkpoint import load_checkpoint
from dicosa.config import Config, ConfigError, TrainConfig, config_from_dict
from dicosa.data.synthetic import make_synthetic
from dicosa.model import DiCoSA
from dicosa.training import (
    EpochSampler,
    NonFiniteLossError,
    SeededItems,
    build_train_loader,
    forward_backward,
    make_accelerator,
    read_log,
    resolve_config,
    scale_tower_gradients,
    train,
)
from tests._ranks import exit_rank, free_port
from tests.conftest import random_batch, tiny_config

REPO = Path(__file__).resolve().parents[1]
LOSS_KEYS = ("loss", "loss_sim", "loss_decouple", "loss_align", "lr", "grad_norm")


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    return make_synthetic(root, num_train=24, num_test=8, size=32, seconds=1.0, fps=8,
                          num_workers=1)


def run_config(root: Path, out: Path, protocol: str = "dicosa", **train) -> Config:
    values = {
        "protocol": protocol,
        "model": {"arch": "dicosa-tiny", "pretrained": None, "temporal_layers": 2,
                  "num_frames": 4, "max_words": 16},
        "data": {"dataset": "synthetic", "root": str(root), "train_split": "train",
                 "test_split": "test", "val_fraction": 0.2, "num_workers": 0},
        "train": {"batch_size": 4, "epochs": 2, "lr": 1e-3, "clip_lr": 1e-3,
                  "mixed_precision": "no", "output_dir": str(out), "log_every": 1,
                  # the first-stage summary fit is tested in test_carried_summary.py
                  "fit_summary": False,
                  **train},
        "eval": {"batch_size": 16},
    }
    return config_from_dict(values)


# ---------------------------------------------------------------- data order


class _Draws(Dataset):
    """Item i: one draw from the global torch RNG (as TrainDataset's frame offsets are)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> dict:
        return {"index": index, "draw": torch.rand(()), "skipped": 0}


def test_epoch_order_depends_on_seed_and_epoch_only():
    a, b = EpochSampler(50, seed=3), EpochSampler(50, seed=3)
    a.set_epoch(1)
    b.set_epoch(1)
    torch.manual_seed(123)  # the global RNG plays no part
    first = list(a)
    assert first == list(b)
    assert sorted(i for _, i in first) == list(range(50))
    assert {e for e, _ in first} == {1}
    b.set_epoch(2)
    assert [i for _, i in b] != [i for _, i in first]


def test_items_are_a_function_of_seed_epoch_index():
    items = SeededItems(_Draws(), seed=0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    x = items[(0, 4)]["draw"]
    # The caller's global RNG stream is untouched.
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(99)
    assert items[(0, 4)]["draw"] == x
    assert items[(1, 4)]["draw"] != x
    assert items[(0, 5)]["draw"] != x


def test_batches_do_not_depend_on_the_number_of_workers():
    def two_epochs(num_workers: int) -> list[torch.Tensor]:
        # The same loader for both epochs: its workers outlive the first (persistent).
        loader, sampler = build_train_loader(_Draws(), batch_size=4, seed=1,
                                             num_workers=num_workers)
        draws = []
        for epoch in (3, 4):
            sampler.set_epoch(epoch)
            draws += [batch["draw"] for batch in loader]
        return draws

    in_process, in_workers = two_epochs(0), two_epochs(2)
    assert len(in_process) == 4  # 10 items in batches of 4, the last dropped, twice
    for a, b in zip(in_process, in_workers, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(in_process[0], in_process[2])  # epoch 4 is not epoch 3 again


# ---------------------------------------------------------------- two processes



def _two_process_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    accelerator = make_accelerator(TrainConfig(batch_size=8, mixed_precision="no"))
    assert accelerator.num_processes == 2

    # The loader hands each process its half of every global batch.
    loader, sampler = build_train_loader(_Draws(), batch_size=4, seed=5, num_workers=0)
    loader = accelerator.prepare(loader)
    sampler.set_epoch(1)
    loader.set_epoch(1)
    first_batch = next(iter(loader))["index"].tolist()

    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config())
    model = accelerator.prepare(model)
    batch = random_batch(batch=8, seed=1)
    local = {k: v[rank * 4:(rank + 1) * 4] for k, v in batch.items()}
    losses = forward_backward(accelerator, model, local)
    plain = accelerator.unwrap_model(model)
    grads = {n: p.grad.clone() for n, p in plain.named_parameters() if p.grad is not None}
    scale_tower_gradients(plain, accelerator.num_processes)  # train.tower_grad: released
    released = {n: p.grad.clone() for n, p in plain.named_parameters() if p.grad is not None}
    torch.save({"loss": losses["loss"], "loss_sim": losses["loss_sim"], "grads": grads,
                "released_grads": released, "first_batch": first_batch},
               Path(out_dir) / f"rank{rank}.pt")
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()
    exit_rank()


@pytest.mark.paths
def test_two_processes_match_one_process_on_the_global_batch(tmp_path):
    mp.spawn(_two_process_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    # Data: the two halves are one process's global batch, in order.
    sampler = EpochSampler(len(_Draws()), seed=5)
    sampler.set_epoch(1)
    expected = [i for _, i in list(sampler)[:4]]
    assert ranks[0]["first_batch"] + ranks[1]["first_batch"] == expected

    # Model: loss and (DDP-averaged) gradients equal one process on the whole batch.
    torch.manual_seed(0)
    model = DiCoSA.from_config(tiny_config())
    out = model(random_batch(batch=8, seed=1))
    out["loss"].backward()
    for r in ranks:
        torch.testing.assert_close(r["loss"], out["loss"].detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["loss_sim"], out["loss_sim"].detach(), rtol=1e-5,
                                   atol=1e-6)
    reference = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(ranks[0]["grads"]) == set(reference)
    for name, grad in reference.items():
        for r in ranks:
            torch.testing.assert_close(r["grads"][name], grad, rtol=1e-4, atol=1e-6,
                                       msg=f"gradient of {name}")
    # train.tower_grad: released: the towers and the temporal transformer (before the gather)
    # get 1/W of the gradient, the concept head and the logit scale all of it.
    for name, grad in reference.items():
        before_gather = name.startswith(("clip.", "temporal.")) and name != "clip.logit_scale"
        expected_grad = grad / 2 if before_gather else grad
        torch.testing.assert_close(ranks[0]["released_grads"][name], expected_grad, rtol=1e-4,
                                   atol=1e-6, msg=f"released gradient of {name}")


# ---------------------------------------------------------------- failures


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        synthetic_root, tmp_path, monkeypatch):
    forward = DiCoSA.forward
    calls = {"n": 0}

    def poisoned(self, batch):
        out = forward(self, batch)
        calls["n"] += 1
        if calls["n"] == 5:  # the 5th optimiser step (no forward calls in evaluation)
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(DiCoSA, "forward", poisoned)
    cfg = run_config(synthetic_root, tmp_path / "run", checkpoint_every=2)
    with pytest.raises(NonFiniteLossError, match="at step 5"):
        train(cfg)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["step"] == 4
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    errors = read_log(tmp_path / "run" / "log.jsonl", event="error")
    assert errors and errors[-1]["step"] == 5
    assert [r["step"] for r in read_log(tmp_path / "run" / "log.jsonl")] == [1, 2, 3, 4]


def test_existing_run_is_not_overwritten(synthetic_root, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.pt").write_bytes(b"")
    with pytest.raises(FileExistsError, match="--resume"):
        train(run_config(synthetic_root, tmp_path / "run"))


def test_unknown_override_key_is_a_clear_error(capsys):
    sys.path.insert(0, str(REPO))
    try:
        import train as train_cli
    finally:
        sys.path.remove(str(REPO))
    with pytest.raises(SystemExit) as exc:
        train_cli.main(["--dataset", "synthetic", "train.lrr=1e-3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown config key 'train.lrr'" in err and "did you mean 'lr'" in err


def test_dataset_picks_its_config_and_overrides_apply():
    cfg = resolve_config(None, "msrvtt", ["train.lr=3e-5", "data.num_workers=2"])
    assert cfg.data.dataset == "msrvtt" and cfg.data.train_split == "9k"
    assert cfg.train.lr == 3e-5 and cfg.data.num_workers == 2
    with pytest.raises(ConfigError, match="no config for dataset 'nope'"):
        resolve_config(None, "nope")


# ---------------------------------------------------------------- resume after SIGKILL


def _train_cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), "--config", str(config), *extra]


def _env() -> dict:
    # As many threads as this process, so that its in-process reference run sums in the
    # same order (bitwise-equal losses).
    return dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), PYTHONPATH=str(REPO))


def test_resume_after_sigkill_replays_the_same_losses(synthetic_root, tmp_path):
    """Kill a run mid-epoch with SIGKILL, resume it, and compare every following logged
    loss with an uninterrupted run of the same config."""
    cfg = run_config(synthetic_root, tmp_path / "ref", checkpoint_every=3, epochs=2)
    killed_cfg = yaml.safe_load(cfg.to_yaml())
    killed_cfg["train"]["output_dir"] = str(tmp_path / "killed")
    killed_yaml = tmp_path / "killed.yaml"
    killed_yaml.write_text(yaml.safe_dump(killed_cfg))

    train(cfg)  # in-process: the reference needs no kill, and this saves an interpreter
    reference = {r["step"]: r for r in read_log(tmp_path / "ref" / "log.jsonl")}
    steps_per_epoch = read_log(tmp_path / "ref" / "log.jsonl", "start")[0]["steps_per_epoch"]

    log_path = tmp_path / "killed" / "log.jsonl"
    proc = subprocess.Popen(_train_cmd(killed_yaml), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log_path.exists() and any(
                    json.loads(line).get("step", 0) >= 7 and json.loads(line)["event"] == "step"
                    for line in log_path.read_text().splitlines() if line):
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    state = load_checkpoint(tmp_path / "killed" / "last.pt")
    resumed_from = state["step"]
    assert 0 < state["batches_done"] < steps_per_epoch, "the checkpoint should be mid-epoch"

    subprocess.run(_train_cmd(killed_yaml, "--resume"), check=True, env=_env(),
                   capture_output=True)
    resumed = [r for r in read_log(log_path) if r["step"] > resumed_from]
    assert [r["step"] for r in resumed] == [s for s in sorted(reference) if s > resumed_from]
    for record in resumed:
        for key in LOSS_KEYS:
            assert record[key] == reference[record["step"]][key], (record["step"], key)
    assert math.isfinite(resumed[-1]["loss"])


def test_released_protocol_trains_the_head_on_the_released_schedule(synthetic_root, tmp_path):
    """protocol: released: frozen towers, BertAdam on the not-restarted cosine, released
    frames with mean padding and RandAugment, all through the real loop."""
    from accelerate.utils import set_seed

    from dicosa.optim import lr_factor

    cfg = run_config(synthetic_root, tmp_path / "run", max_steps=3, protocol="released")
    assert (cfg.train.optimizer, cfg.train.freeze_towers, cfg.data.augment) == (
        "bertadam", True, "rand-m7-n4-mstd0.5-inc1")
    run = train(cfg)
    steps = read_log(run / "log.jsonl")
    assert [r["lr"] for r in steps] == pytest.approx(
        [1e-3 * lr_factor(s, 3, 0.1, "released") for s in range(3)])
    set_seed(cfg.train.seed)  # what build_run does before building the model
    start = DiCoSA.from_config(cfg.model).state_dict()
    trained = load_checkpoint(run / "last.pt")["model"]
    assert all(torch.equal(trained[k], start[k]) for k in start if k.startswith("clip."))
    assert any(not torch.equal(trained[k], start[k]) for k in start if k.startswith("head."))
    assert read_log(run / "log.jsonl", event="start")[0]["frozen_towers"] is True
