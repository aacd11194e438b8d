"""The training loop: Accelerate, AdamW with two learning rates, resumable checkpoints.

One process or many (``accelerate launch``): the data loader's global batch is split across
processes and the model gathers every process's features, so the contrastive loss always
sees the whole global batch. Each training item's random frames are a function of
``(seed, epoch, index)`` and each epoch's order of ``(seed, epoch)``, so a run resumed from a
mid-epoch checkpoint replays exactly the batches the killed run would have seen.

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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import gather_object, set_seed
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

from .checkpoint import (
    checkpoint_config,
    git_sha,
    load_checkpoint,
    save_checkpoint,
    write_text_atomic,
)
from .clip import get_tokenizer
from .config import Config, ConfigError, TrainConfig, load_config
from .data.datasets import RetrievalSplit, load_split, split_off_validation
from .data.loader import TrainDataset
from .evaluation import evaluate_model, selection_score
from .model import DiCoSA
from .optim import build_optimizer, build_scheduler
from .precision import resolve_mixed_precision

__all__ = [
    "CONFIG_DIR",
    "EpochSampler",
    "NonFiniteLossError",
    "SeededItems",
    "build_optimizer",
    "build_scheduler",
    "build_train_loader",
    "config_path",
    "forward_backward",
    "make_accelerator",
    "resolve_config",
    "train",
]

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the state of that step was not saved."""


# ---------------------------------------------------------------- configuration


def config_path(config: str | Path | None, dataset: str | None) -> Path:
    """``config`` if given, else ``configs/<dataset>.yaml`` (msrvtt by default). A relative
    ``config`` missing from the working directory is looked up from the repository root."""
    if config is not None:
        path = Path(config)
        in_repo = CONFIG_DIR.parent / path
        if not path.is_file() and not path.is_absolute() and in_repo.is_file():
            return in_repo
        return path
    name = dataset or "msrvtt"
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"no config for dataset '{name}' ({path}); known: {known}")
    return path


def resolve_config(config: str | Path | None, dataset: str | None,
                   overrides: Iterable[str] = ()) -> Config:
    """The config :func:`config_path` finds, with ``section.key=value`` overrides applied."""
    path = config_path(config, dataset)
    cfg = load_config(path, overrides)
    if dataset is not None and cfg.data.dataset != dataset:
        raise ConfigError(f"--dataset {dataset} but {path} is for '{cfg.data.dataset}'")
    return cfg


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
    incomplete batch is dropped because the all-gather needs equal shapes everywhere."""
    sampler = EpochSampler(len(dataset), seed)
    loader = DataLoader(SeededItems(dataset, seed), batch_size=batch_size, sampler=sampler,
                        drop_last=True, num_workers=num_workers, pin_memory=pin_memory)
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
        # The scheduler is stepped by hand once per optimiser step.
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


def _learning_rates(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """``lr`` (new modules) and ``clip_lr`` (CLIP towers) as the scheduler has set them."""
    rates = {}
    for group in optimizer.param_groups:
        key = "clip_lr" if group.get("name", "").startswith("clip") else "lr"
        rates.setdefault(key, group["lr"])
    return rates


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


@dataclass
class _Progress:
    epoch: int = 0
    batches_done: int = 0  # in the current epoch, per process (= global batches)
    step: int = 0
    epoch_skipped: int = 0  # bad videos substituted so far this epoch, all processes
    best_score: float | None = None
    best_step: int | None = None
    last_metrics: dict | None = None


# ---------------------------------------------------------------- the loop


def train(cfg: Config, resume: bool = False) -> Path:
    """Train DiCoSA as ``cfg`` says and return the run folder (``train.output_dir``).

    Args:
        cfg: the full configuration; saved beside every checkpoint.
        resume: continue from ``<output_dir>/last.pt`` (its config is used).

    Raises:
        FileExistsError: ``last.pt`` exists and ``resume`` is False.
        NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    run_dir = Path(cfg.train.output_dir)
    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    saved = None
    if resume:
        saved = load_checkpoint(last_path)
        resumed_cfg = checkpoint_config(saved)
        if resumed_cfg != cfg:
            log.warning("resuming with the configuration stored in %s, not the one given",
                        last_path)
        cfg = resumed_cfg
    elif last_path.exists():
        raise FileExistsError(f"{last_path} exists: pass --resume to continue that run, or "
                              "set another train.output_dir")
    tc = cfg.train

    accelerator = make_accelerator(tc)
    device = accelerator.device
    is_main = accelerator.is_main_process
    set_seed(tc.seed)
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())
    runlog = RunLog(run_dir / "log.jsonl", is_main)

    # Annotations first: a missing file should fail before a weights download, not after.
    train_split, select_split, selected_on = training_splits(cfg)
    with accelerator.main_process_first():  # one download of pretrained weights
        model = DiCoSA.from_config(cfg.model)
    if tc.compile if tc.compile is not None else device.type == "cuda":
        model.compile_towers()
    model.to(device)

    tokenize = get_tokenizer(cfg.model.arch, cfg.model.max_words)
    dataset = TrainDataset(train_split, tokenize, cfg.model.num_frames, model.image_size,
                           seed=tc.seed)
    if len(dataset) < tc.batch_size:
        raise ConfigError(f"{train_split.name} has {len(dataset)} captions, fewer than "
                          f"train.batch_size={tc.batch_size}")
    loader, sampler = build_train_loader(dataset, tc.batch_size, tc.seed, cfg.data.num_workers,
                                         pin_memory=device.type == "cuda")
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * tc.epochs
    if tc.max_steps is not None:
        total_steps = min(total_steps, tc.max_steps)

    optimizer = build_optimizer(model, tc)
    scheduler = build_scheduler(optimizer, total_steps, tc.warmup_fraction)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    plain_model: DiCoSA = accelerator.unwrap_model(model)

    p = _Progress()
    if saved is not None:
        plain_model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        rngs = saved["rng"]
        if len(rngs) != accelerator.num_processes:
            log.warning("checkpoint has RNG states of %d processes, this run has %d",
                        len(rngs), accelerator.num_processes)
        set_rng_state(rngs[min(accelerator.process_index, len(rngs) - 1)])
        p = _Progress(saved["epoch"], saved["batches_done"], saved["step"],
                      saved["epoch_skipped"] if is_main else 0, saved["best_score"],
                      saved["best_step"], saved["metrics"])
    sha = git_sha()

    def save(path: Path, full: bool) -> None:
        # Every process takes part (RNG states are gathered); only the main one writes.
        state: dict[str, Any] = {
            "model": plain_model.state_dict(), "config": cfg.to_yaml(), "git_sha": sha,
            "step": p.step, "epoch": p.epoch, "batches_done": p.batches_done,
            "selected_on": selected_on, "best_score": p.best_score, "best_step": p.best_step,
            "metrics": p.last_metrics, "world_size": accelerator.num_processes,
        }
        if full:
            skipped = accelerator.reduce(torch.tensor(epoch_skipped, device=device), "sum")
            state.update(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                         rng=gather_object([rng_state()]), epoch_skipped=int(skipped))
        if is_main:
            save_checkpoint(path, state)
            write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())
        accelerator.wait_for_everyone()

    def evaluate_selection() -> None:
        if select_split is None:
            return
        if is_main:
            metrics = evaluate_model(plain_model, select_split, cfg, device)
            score = selection_score(metrics)
            improved = p.best_score is None or score > p.best_score
            if improved:
                p.best_score, p.best_step = score, p.step
            p.last_metrics = metrics
            runlog.write({"event": "eval", "step": p.step, "epoch": p.epoch,
                          "split": select_split.name, "selected_on": selected_on,
                          "score_t2v_r1_r5_r10": score, "best": improved, **metrics})
            accelerator.print(f"step {p.step}: {selected_on} ({select_split.name}) "
                              f"t2v R@1 {metrics['t2v']['R@1']:.1f} R@5 {metrics['t2v']['R@5']:.1f}"
                              f" R@10 {metrics['t2v']['R@10']:.1f}{' (best)' if improved else ''}")
        accelerator.wait_for_everyone()
        best = gather_object([p.best_step])[0]  # main's decision, seen by all
        if best == p.step:
            save(best_path, full=False)

    global_batch = tc.batch_size
    runlog.write({
        "event": "resume" if saved is not None else "start", "step": p.step, "epoch": p.epoch,
        "batches_done": p.batches_done, "selected_on": selected_on,
        "selection_split": select_split.name if select_split is not None else None,
        "train_split": train_split.name, "train_captions": len(dataset),
        "num_processes": accelerator.num_processes, "global_batch": global_batch,
        "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
        "mixed_precision": accelerator.mixed_precision, "device": str(device), "git_sha": sha,
    })
    accelerator.print(f"training on {train_split.name} ({len(dataset)} captions), model "
                      f"selection on: {selected_on}"
                      + (f" ({select_split.name})" if select_split is not None else ""))

    bar = tqdm(total=total_steps, initial=p.step, disable=not is_main, unit="step",
               dynamic_ncols=True)
    model.train()
    epoch_skipped = p.epoch_skipped
    try:
        while p.step < total_steps and p.epoch < tc.epochs:
            sampler.set_epoch(p.epoch)
            loader.set_epoch(p.epoch)
            batches = (accelerator.skip_first_batches(loader, p.batches_done)
                       if p.batches_done else loader)
            window = _Window(time.perf_counter())
            tick = time.perf_counter()
            for batch in batches:
                loaded = time.perf_counter()
                losses = forward_backward(accelerator, model, batch)
                loss = losses["loss"].item()
                if not math.isfinite(loss):
                    raise NonFiniteLossError(
                        f"loss is {loss} at step {p.step + 1} (epoch {p.epoch}, batch "
                        f"{p.batches_done + 1}); stopped without saving this state; the last "
                        f"good checkpoint is {last_path if last_path.exists() else 'none'}")
                grad_norm = None
                if tc.grad_clip:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), tc.grad_clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                p.step += 1
                p.batches_done += 1
                epoch_skipped += int(batch["skipped"].sum())
                done = time.perf_counter()
                window.steps += 1
                window.data_time += loaded - tick
                window.step_time += done - loaded
                tick = done

                if p.step % tc.log_every == 0 or p.step == total_steps:
                    elapsed = done - window.start
                    record = {
                        "event": "step", "step": p.step, "epoch": p.epoch,
                        **{k: float(v) for k, v in losses.items()},
                        **_learning_rates(optimizer),
                        "grad_norm": float(grad_norm) if grad_norm is not None else None,
                        "clips_per_s": global_batch * window.steps / max(elapsed, 1e-9),
                        "data_time": window.data_time / window.steps,
                        "step_time": window.step_time / window.steps,
                        "peak_memory_mib": _peak_memory_mib(device),
                    }
                    runlog.write(record)
                    bar.set_postfix(loss=f"{loss:.3f}", sim=f"{float(losses['loss_sim']):.3f}",
                                    clips_s=f"{record['clips_per_s']:.0f}", refresh=False)
                    window = _Window(done)
                bar.update(1)
                if tc.checkpoint_every and p.step % tc.checkpoint_every == 0:
                    save(last_path, full=True)
                if p.step >= total_steps:
                    break

            epoch_finished = p.batches_done >= steps_per_epoch
            if epoch_finished:
                skipped = int(accelerator.reduce(torch.tensor(epoch_skipped, device=device),
                                                 "sum"))
                runlog.write({"event": "epoch", "epoch": p.epoch, "step": p.step,
                              "skipped_videos": skipped})
                if skipped:
                    accelerator.print(f"epoch {p.epoch}: {skipped} unusable training videos "
                                      "were replaced by other pairs")
                p.epoch += 1
                p.batches_done = 0
                epoch_skipped = 0
            finished = p.step >= total_steps or p.epoch >= tc.epochs
            if finished or (epoch_finished and p.epoch % tc.eval_every_epochs == 0):
                evaluate_selection()
            save(last_path, full=True)
    except NonFiniteLossError as exc:
        runlog.write({"event": "error", "step": p.step + 1, "error": str(exc)})
        raise
    finally:
        bar.close()

    runlog.write({"event": "end", "step": p.step, "selected_on": selected_on,
                  "best_step": p.best_step, "best_score_t2v_r1_r5_r10": p.best_score})
    accelerator.print(f"done: {p.step} steps; best.pt from step {p.best_step} selected on "
                      f"{selected_on}" if select_split is not None else
                      f"done: {p.step} steps; no selection split (last.pt only)")
    accelerator.end_training()
    return run_dir


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


