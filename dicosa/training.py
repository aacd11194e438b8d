"""The training loop: Accelerate, two learning rates, resumable checkpoints.

The loop reads as open_clip's does: :func:`build_run` makes the pieces of a run once (a
:class:`Run`), a small :class:`RunState` says where the run is, and :func:`train` alternates
:func:`train_one_epoch`, :func:`evaluate_and_select` and :func:`save_state`. The learning
rate is a pure function of the step (:func:`dicosa.optim.lr_factor`), so a checkpoint needs
no scheduler state.

One process or many (``accelerate launch``): the data loader's global batch is split across
processes and the model gathers every process's features, so the contrastive loss always
sees the whole global batch. Each training item's random frames (and augmentation) are a
function of ``(seed, epoch, index)`` and each epoch's order of ``(seed, epoch)``, so a run
resumed from a mid-epoch checkpoint replays exactly the batches the killed run would have
seen.

Outputs under ``train.output_dir``: ``config.yaml``, ``log.jsonl`` (one JSON object per
logged step, epoch and evaluation), ``last.pt`` (full training state) and ``best.pt``
(weights of the best model on the selection split).
"""

from __future__ import annotations

import json
import logging
import math
import random
import resource
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import gather_object, set_seed
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from .checkpoint import (
    checkpoint_config,
    git_sha,
    load_checkpoint,
    save_checkpoint,
    write_text_atomic,
)
from .clip import get_tokenizer
from .config import Config, ConfigError, TrainConfig, resolve_config
from .data.datasets import RetrievalSplit, load_split, split_off_validation
from .data.loader import TrainDataset
from .errors import NonFiniteLossError
from .evaluation import evaluate_model, selection_score
from .model import DiCoSA
from .optim import build_optimizer, lr_factor, set_learning_rates
from .precision import resolve_mixed_precision
from .progress import progress

__all__ = [
    "EpochSampler",
    "NonFiniteLossError",
    "Run",
    "RunState",
    "SeededItems",
    "build_optimizer",
    "build_run",
    "build_train_loader",
    "evaluate_and_select",
    "fit_run_summary",
    "forward_backward",
    "make_accelerator",
    "resolve_config",
    "save_state",
    "scale_tower_gradients",
    "tower_parameters",
    "train",
    "train_one_epoch",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- data order


def _mix(*values: int) -> int:
    return int(np.random.SeedSequence([int(v) for v in values]).generate_state(1)[0])


class EpochSampler(Sampler[tuple[int, int]]):
    """A shuffled order per epoch, seeded by ``(seed, epoch)``; yields ``(epoch, index)``.

    Carrying the epoch with the index lets :class:`SeededItems` seed each item without any
    state shared with DataLoader workers.
    """

    def __init__(self, num_items: int, seed: int):
        self.num_items = num_items
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_items

    def __iter__(self) -> Iterator[tuple[int, int]]:
        generator = torch.Generator().manual_seed(_mix(self.seed, self.epoch))
        for index in torch.randperm(self.num_items, generator=generator).tolist():
            yield self.epoch, index


class SeededItems(Dataset):
    """Wraps a dataset so that item ``(epoch, index)`` is a pure function of
    ``(seed, epoch, index)``: its random draws use a torch seed derived from them."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        # fork_rng: the caller's global RNG stream (main process with num_workers=0) is kept.
        with torch.random.fork_rng(devices=[]):
            # The CPU generator alone: items draw nothing on a GPU, and torch.manual_seed,
            # which also visits every accelerator backend, costs ~0.3 ms an item.
            torch.default_generator.manual_seed(_mix(self.seed, epoch, index))
            return self.dataset[index]


def build_train_loader(dataset: Dataset, batch_size: int, seed: int, num_workers: int,
                       pin_memory: bool = False) -> tuple[DataLoader, EpochSampler]:
    """A loader of global batches (Accelerate splits them across processes); the last
    incomplete batch is dropped because the all-gather needs equal shapes everywhere.

    Workers live for the whole run rather than one epoch: each item's seed arrives with its
    key (:class:`EpochSampler`), so no worker holds epoch state, and a run of short epochs
    does not start its workers again for each (on 2 cores, 11-step epochs of 224 px clips:
    112-122 against 127-128 clips/s)."""
    sampler = EpochSampler(len(dataset), seed)
    loader = DataLoader(SeededItems(dataset, seed), batch_size=batch_size, sampler=sampler,
                        drop_last=True, num_workers=num_workers, pin_memory=pin_memory,
                        persistent_workers=num_workers > 0)
    return loader, sampler


def training_splits(cfg: Config) -> tuple[RetrievalSplit, RetrievalSplit | None, str]:
    """``(train, selection, selected_on)``: the selection split is carved from the training
    data (``"val"``) unless ``train.select_on_test`` (``"test"``); ``"none"`` when
    ``data.val_fraction`` is 0."""
    data = cfg.data
    train = load_split(data.dataset, data.root, data.train_split, data.video_dir)
    if cfg.train.select_on_test:
        test = load_split(data.dataset, data.root, data.test_split, data.video_dir)
        return train, test, "test"
    if data.val_fraction <= 0:
        return train, None, "none"
    train, val = split_off_validation(train, data.val_fraction, cfg.train.seed)
    return train, val, "val"


# ---------------------------------------------------------------- one step


def make_accelerator(train_cfg: TrainConfig) -> Accelerator:
    """The Accelerator of a run: mixed precision as configured, global batches split."""
    accelerator = Accelerator(
        mixed_precision=resolve_mixed_precision(train_cfg.mixed_precision),
        # Without a GPU, Accelerate only recognises several processes (gloo) in CPU mode.
        cpu=not torch.cuda.is_available(),
        # Each process takes its slice of every global batch, so any number of processes
        # trains on exactly the batches one process would see.
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        # The learning rate is set by hand before every optimiser step.
        step_scheduler_with_optimizer=False,
    )
    if train_cfg.batch_size % accelerator.num_processes:
        raise ConfigError(f"train.batch_size={train_cfg.batch_size} is not divisible by the "
                          f"{accelerator.num_processes} processes")
    return accelerator


def forward_backward(accelerator: Accelerator, model: torch.nn.Module,
                     batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Losses of one (per-process) batch and their gradients; returns detached losses.

    The model gathers features from every process, so with DDP averaging the gradients
    equal those of one process on the concatenated batch.
    """
    out = model(batch)
    accelerator.backward(out["loss"])
    return {k: v.detach() for k, v in out.items()}


def tower_parameters(model: DiCoSA) -> list[nn.Parameter]:
    """The parameters before the all-gather: CLIP's image and text towers and the temporal
    transformer (all of ``model.clip`` but the logit scale, which acts on gathered scores)."""
    return [p for name, p in model.named_parameters()
            if name.startswith("temporal.")
            or (name.startswith("clip.") and name != "clip.logit_scale")]


def scale_tower_gradients(model: DiCoSA, world_size: int) -> None:
    """``train.tower_grad: released``: divide the (DDP-averaged) gradients of the parameters
    before the all-gather by the number of processes, which is what the released all-gather's
    backward (local slice only) leaves them (dicosa.distributed); the head keeps its own."""
    if world_size == 1:
        return
    for param in tower_parameters(model):
        if param.grad is not None:
            param.grad.div_(world_size)


def freeze_towers(model: DiCoSA) -> None:
    """Stop training the CLIP towers (image, text, logit scale): ``train.freeze_towers``."""
    for param in model.clip.parameters():
        param.requires_grad_(False)


# ---------------------------------------------------------------- state helpers


def rng_state() -> dict[str, Any]:
    """This process's RNG states, as tensors and plain containers only."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RunLog:
    """Appends one JSON object per line to ``log.jsonl`` (main process only)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, record: Mapping[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")


@dataclass
class _Window:
    """Timings accumulated between two log lines."""

    start: float
    steps: int = 0
    data_time: float = 0.0
    step_time: float = 0.0


# ---------------------------------------------------------------- the run


@dataclass
class RunState:
    """Where a run is: all a checkpoint restores besides weights, optimiser and RNGs."""

    epoch: int = 0
    batches_done: int = 0  # in the current epoch, per process (= global batches)
    step: int = 0  # optimiser steps taken; the learning rate is a function of it
    epoch_skipped: int = 0  # bad videos substituted this epoch by this process
    best_score: float | None = None
    best_step: int | None = None
    last_metrics: dict | None = None


@dataclass
class Run:
    """The pieces of one training run, built once by :func:`build_run`."""

    cfg: Config
    accelerator: Accelerator
    model: nn.Module  # as prepared by Accelerate (DDP-wrapped under several processes)
    plain_model: DiCoSA
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    sampler: EpochSampler
    train_split: RetrievalSplit
    select_split: RetrievalSplit | None
    selected_on: str
    steps_per_epoch: int
    total_steps: int
    run_dir: Path
    log: RunLog
    git_sha: str | None

    @property
    def last_path(self) -> Path:
        return self.run_dir / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.run_dir / "best.pt"

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def lr(self, step: int) -> float:
        """The learning-rate factor of optimiser step ``step`` (from 0)."""
        tc = self.cfg.train
        return lr_factor(step, self.total_steps, tc.warmup_fraction, tc.schedule)

    def finished(self, state: RunState) -> bool:
        return state.step >= self.total_steps or state.epoch >= self.cfg.train.epochs


def build_run(cfg: Config) -> Run:
    """Accelerator, model, data and optimiser of ``cfg``, prepared by Accelerate."""
    tc = cfg.train
    run_dir = Path(tc.output_dir)
    accelerator = make_accelerator(tc)
    device = accelerator.device
    set_seed(tc.seed)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())

    # Annotations first: a missing file should fail before a weights download, not after.
    train_split, select_split, selected_on = training_splits(cfg)
    with accelerator.main_process_first():  # one download of pretrained weights
        model = DiCoSA.from_config(cfg.model)
    if tc.freeze_towers:
        freeze_towers(model)
    if tc.compile if tc.compile is not None else device.type == "cuda":
        model.compile_towers()
    model.to(device)

    data = cfg.data
    dataset = TrainDataset(train_split, get_tokenizer(cfg.model.arch, cfg.model.max_words),
                           cfg.model.num_frames, model.image_size, seed=tc.seed,
                           sampling=data.frame_sampling, padding=data.frame_padding,
                           augment=data.augment)
    if len(dataset) < tc.batch_size:
        raise ConfigError(f"{train_split.name} has {len(dataset)} captions, fewer than "
                          f"train.batch_size={tc.batch_size}")
    loader, sampler = build_train_loader(dataset, tc.batch_size, tc.seed, data.num_workers,
                                         pin_memory=device.type == "cuda")
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * tc.epochs
    if tc.max_steps is not None:
        total_steps = min(total_steps, tc.max_steps)

    optimizer = build_optimizer(model, tc)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return Run(cfg, accelerator, prepared, accelerator.unwrap_model(prepared), optimizer,
               loader, sampler, train_split, select_split, selected_on, steps_per_epoch,
               total_steps, run_dir, RunLog(run_dir / "log.jsonl", accelerator.is_main_process),
               git_sha())


def restore(run: Run, saved: Mapping[str, Any]) -> RunState:
    """Load a ``last.pt``'s weights, optimiser and RNGs into ``run``; its position."""
    run.plain_model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    rngs = saved["rng"]
    processes = run.accelerator.num_processes
    if len(rngs) != processes:
        log.warning("checkpoint has RNG states of %d processes, this run has %d",
                    len(rngs), processes)
    set_rng_state(rngs[min(run.accelerator.process_index, len(rngs) - 1)])
    # The stored count is the sum over processes, so the main process carries it alone.
    return RunState(saved["epoch"], saved["batches_done"], saved["step"],
                    saved["epoch_skipped"] if run.is_main else 0, saved["best_score"],
                    saved["best_step"], saved["metrics"])


def save_state(run: Run, state: RunState, path: Path, full: bool) -> None:
    """Write a checkpoint: weights and position, and with ``full`` the optimiser, every
    process's RNG states and the epoch's count of bad videos (all processes take part; the
    main one writes)."""
    accelerator = run.accelerator
    checkpoint: dict[str, Any] = {
        "model": run.plain_model.state_dict(), "config": run.cfg.to_yaml(),
        "git_sha": run.git_sha, "step": state.step, "epoch": state.epoch,
        "batches_done": state.batches_done, "selected_on": run.selected_on,
        "best_score": state.best_score, "best_step": state.best_step,
        "metrics": state.last_metrics, "world_size": accelerator.num_processes,
    }
    if full:
        skipped = accelerator.reduce(torch.tensor(state.epoch_skipped,
                                                  device=accelerator.device), "sum")
        checkpoint.update(optimizer=run.optimizer.state_dict(),
                          rng=gather_object([rng_state()]), epoch_skipped=int(skipped))
    if run.is_main:
        save_checkpoint(path, checkpoint)
        write_text_atomic(run.run_dir / "config.yaml", run.cfg.to_yaml())
    accelerator.wait_for_everyone()


def evaluate_and_select(run: Run, state: RunState) -> None:
    """Evaluate on the selection split (main process) and write ``best.pt`` when the
    selection score improved."""
    split = run.select_split
    if split is None:
        return
    if run.is_main:
        metrics = evaluate_model(run.plain_model, split, run.cfg, run.accelerator.device)
        score = selection_score(metrics)
        improved = state.best_score is None or score > state.best_score
        if improved:
            state.best_score, state.best_step = score, state.step
        state.last_metrics = metrics
        run.log.write({"event": "eval", "step": state.step, "epoch": state.epoch,
                       "split": split.name, "selected_on": run.selected_on,
                       "score_t2v_r1_r5_r10": score, "best": improved, **metrics})
        t2v = metrics["t2v"]
        # The split's name is in the run's first line ("model selection on: ...").
        run.accelerator.print(f"step {state.step}: {run.selected_on} t2v R@1 "
                              f"{t2v['R@1']:.1f} R@5 {t2v['R@5']:.1f} R@10 {t2v['R@10']:.1f}"
                              f"{' (best)' if improved else ''}")
    run.accelerator.wait_for_everyone()
    if gather_object([state.best_step])[0] == state.step:  # main's decision, seen by all
        save_state(run, state, run.best_path, full=False)


def train_step(run: Run, state: RunState, batch: Mapping[str, torch.Tensor]
               ) -> tuple[dict[str, torch.Tensor], dict[str, float], float | None]:
    """One optimiser step at the scheduled rate: ``(losses, rates, grad_norm)``."""
    tc = run.cfg.train
    rates = set_learning_rates(run.optimizer, tc, run.lr(state.step))
    losses = forward_backward(run.accelerator, run.model, batch)
    loss = losses["loss"].item()
    if not math.isfinite(loss):
        last = run.last_path if run.last_path.exists() else "none"
        raise NonFiniteLossError(
            f"loss is {loss} at step {state.step + 1} (epoch {state.epoch}, batch "
            f"{state.batches_done + 1}); stopped without saving this state; the last good "
            f"checkpoint is {last}")
    if tc.tower_grad == "released":
        scale_tower_gradients(run.plain_model, run.accelerator.num_processes)
    grad_norm = None
    if tc.grad_clip:
        grad_norm = run.accelerator.clip_grad_norm_(run.model.parameters(), tc.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return losses, rates, None if grad_norm is None else float(grad_norm)


def train_one_epoch(run: Run, state: RunState, bar) -> None:
    """Train from ``state``'s position to the end of its epoch (or the last step), logging
    every ``log_every`` steps and writing ``last.pt`` every ``checkpoint_every``."""
    tc, accelerator = run.cfg.train, run.accelerator
    run.sampler.set_epoch(state.epoch)
    run.loader.set_epoch(state.epoch)
    batches = (accelerator.skip_first_batches(run.loader, state.batches_done)
               if state.batches_done else run.loader)
    window = _Window(time.perf_counter())
    tick = window.start
    for batch in batches:
        loaded = time.perf_counter()
        losses, rates, grad_norm = train_step(run, state, batch)
        state.step += 1
        state.batches_done += 1
        state.epoch_skipped += int(batch["skipped"].sum())
        done = time.perf_counter()
        window.steps += 1
        window.data_time += loaded - tick
        window.step_time += done - loaded
        tick = done
        if state.step % tc.log_every == 0 or state.step == run.total_steps:
            record = {
                "event": "step", "step": state.step, "epoch": state.epoch,
                **{k: float(v) for k, v in losses.items()}, **rates, "grad_norm": grad_norm,
                "clips_per_s": tc.batch_size * window.steps / max(done - window.start, 1e-9),
                "data_time": window.data_time / window.steps,
                "step_time": window.step_time / window.steps,
                "peak_memory_mib": _peak_memory_mib(accelerator.device),
            }
            run.log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", sim=f"{record['loss_sim']:.3f}",
                            clips_s=f"{record['clips_per_s']:.0f}", refresh=False)
            window = _Window(done)
        bar.update(1)
        if tc.checkpoint_every and state.step % tc.checkpoint_every == 0:
            save_state(run, state, run.last_path, full=True)
        if state.step >= run.total_steps:
            break
    if state.batches_done >= run.steps_per_epoch:
        _end_epoch(run, state)


def _end_epoch(run: Run, state: RunState) -> None:
    skipped = int(run.accelerator.reduce(torch.tensor(state.epoch_skipped,
                                                      device=run.accelerator.device), "sum"))
    run.log.write({"event": "epoch", "epoch": state.epoch, "step": state.step,
                   "skipped_videos": skipped})
    if skipped:
        run.accelerator.print(f"epoch {state.epoch}: {skipped} unusable training videos were "
                              "replaced by other pairs")
    state.epoch += 1
    state.batches_done = 0
    state.epoch_skipped = 0


def _start_record(run: Run, state: RunState, resumed: bool) -> dict[str, Any]:
    return {
        "event": "resume" if resumed else "start", "step": state.step, "epoch": state.epoch,
        "batches_done": state.batches_done, "selected_on": run.selected_on,
        "selection_split": run.select_split.name if run.select_split is not None else None,
        "train_split": run.train_split.name, "train_captions": len(run.loader.dataset),
        "num_processes": run.accelerator.num_processes, "global_batch": run.cfg.train.batch_size,
        "steps_per_epoch": run.steps_per_epoch, "total_steps": run.total_steps,
        "mixed_precision": run.accelerator.mixed_precision,
        "device": str(run.accelerator.device), "git_sha": run.git_sha,
        "protocol": run.cfg.protocol,
        "frozen_towers": run.cfg.train.freeze_towers,
        "trainable_parameters": sum(p.numel() for p in run.plain_model.parameters()
                                    if p.requires_grad),
    }


def train(cfg: Config, resume: bool = False) -> Path:
    """Train DiCoSA as ``cfg`` says and return the run folder (``train.output_dir``).

    Args:
        cfg: the full configuration; saved beside every checkpoint.
        resume: continue from ``<output_dir>/last.pt`` (its config is used).

    Raises:
        FileExistsError: ``last.pt`` exists and ``resume`` is False.
        NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    last_path = Path(cfg.train.output_dir) / "last.pt"
    saved = None
    if resume:
        saved = load_checkpoint(last_path)
        stored = checkpoint_config(saved)
        if stored != cfg:
            log.warning("resuming with the configuration stored in %s, not the one given",
                        last_path)
        cfg = stored
    elif last_path.exists():
        raise FileExistsError(f"{last_path} exists: pass --resume to continue that run, or "
                              "set another train.output_dir")
    run = build_run(cfg)
    state = restore(run, saved) if saved is not None else RunState()
    run.log.write(_start_record(run, state, resumed=saved is not None))
    select = (f" ({run.select_split.name})" if run.select_split is not None else "")
    run.accelerator.print(f"training on {run.train_split.name} ({len(run.loader.dataset)} "
                          f"captions), model selection on: {run.selected_on}{select}")

    bar = progress(total=run.total_steps, initial=state.step, enabled=run.is_main,
                   desc="training", unit="step")
    run.model.train()
    try:
        while not run.finished(state):
            epoch = state.epoch
            train_one_epoch(run, state, bar)
            epoch_ended = state.epoch > epoch
            if run.finished(state) or (epoch_ended and
                                       state.epoch % cfg.train.eval_every_epochs == 0):
                evaluate_and_select(run, state)
            save_state(run, state, run.last_path, full=True)
    except NonFiniteLossError as exc:
        run.log.write({"event": "error", "step": state.step + 1, "error": str(exc)})
        raise
    finally:
        bar.close()

    run.log.write({"event": "end", "step": state.step, "selected_on": run.selected_on,
                   "best_step": state.best_step, "best_score_t2v_r1_r5_r10": state.best_score})
    run.accelerator.print(f"done: {state.step} steps; best.pt from step {state.best_step} "
                          f"selected on {run.selected_on}" if run.select_split is not None else
                          f"done: {state.step} steps; no selection split (last.pt only)")
    run.accelerator.end_training()
    if run.is_main and cfg.train.fit_summary and run.best_path.is_file():
        fit_run_summary(run)
    return run.run_dir


def fit_run_summary(run: Run) -> None:
    """Fit best.pt's distilled first-stage summary on the training split (minus the
    validation videos) and log what it cost; kept when one fitted for these weights is
    already there (a finished run resumed)."""
    from .checkpoint import load
    from .heads.summary import carried_summary, summary_beside
    from .heads.train import fit_checkpoint_summary

    if carried_summary(run.best_path, load(run.best_path)[0]) is not None:
        return
    started = time.perf_counter()
    path, trained = fit_checkpoint_summary(run.best_path, run.cfg.train.summary_options,
                                           device=run.accelerator.device, progress=False)
    seconds = time.perf_counter() - started
    run.log.write({"event": "summary", "path": str(path), "seconds": round(seconds, 1),
                   "encode_seconds": trained["encode_seconds"],
                   "fit_seconds": trained["fit_seconds"], "videos": trained.get("videos"),
                   "captions": trained.get("captions")})
    run.accelerator.print(
        f"fitted the first-stage summary of best.pt on {trained['train_split']} in "
        f"{seconds:.0f} s (features {trained['encode_seconds']:.0f} s, fit "
        f"{trained['fit_seconds']:.0f} s): {summary_beside(run.best_path)} (skip it: "
        "--no-summary)")


def read_log(path: str | Path, event: str | None = "step") -> list[dict]:
    """Records of a ``log.jsonl``; for steps logged twice (a run killed after logging them,
    then resumed from an earlier checkpoint) the resumed run's record wins."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    if event is not None:
        records = [r for r in records if r.get("event") == event]
    if event == "step":
        by_step = {r["step"]: r for r in records}
        records = [by_step[s] for s in sorted(by_step)]
    return records
