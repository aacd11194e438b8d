"""What every benchmark script shares: the random-weight model, the environment record, and
printing + writing the JSON result."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch

from dicosa.config import ModelConfig
from dicosa.model import DiCoSA


def random_model(arch: str, variant: str, num_frames: int, max_words: int = 32,
                 grad_checkpointing: bool = False) -> DiCoSA:
    """DiCoSA with random CLIP weights (nothing is downloaded), seeded."""
    tiny = arch == "dicosa-tiny"  # its text tower has 2 blocks to copy, not 4
    cfg = ModelConfig(arch=arch, pretrained=None, variant=variant, num_frames=num_frames,
                      max_words=max_words, temporal_layers=2 if tiny else 4,
                      grad_checkpointing=grad_checkpointing)
    torch.manual_seed(0)
    return DiCoSA.from_config(cfg)


def environment(device: torch.device | str) -> dict:
    """Where and when a figure was measured."""
    device = torch.device(device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


def report(result: dict, out: str | Path | None) -> dict:
    """Print the result as JSON and write it to ``out`` (if given)."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    return result


def synthetic_checkpoint(work: str | Path, *, num_train: int = 300, num_test: int = 100,
                         seed: int = 0, smoke: bool = False, data_seed: int = 0,
                         config: str | Path = "configs/synthetic.yaml",
                         overrides: dict | None = None):
    """A tiny DiCoSA trained on the synthetic benchmark (``configs/synthetic.yaml``): the
    frozen model the head benchmarks start from.

    Data go to ``work/data-<n_train>-<n_test>-<data_seed>`` and the run to
    ``work/run-seed<seed>``; both are reused when already there, so several benchmarks
    (or a re-run) share one trained model (use another ``work`` for other ``overrides``:
    ``{section: {key: value}}``, any section). ``smoke`` trains 2 steps.

    Returns:
        ``(checkpoint, data_root, cfg)``: best.pt (chosen on the validation split carved from
        the training videos), the data folder, and the run's config.
    """
    from dicosa.config import replace, resolve_config
    from dicosa.data.synthetic import make_synthetic
    from dicosa.training import train

    work = Path(work)
    data = work / f"data-{num_train}-{num_test}-{data_seed}"
    if not (data / "MSRVTT_data.json").is_file():
        make_synthetic(data, num_train=num_train, num_test=num_test, size=32, seconds=1.0,
                       seed=data_seed)
    cfg = resolve_config(config, None)
    sections = {name: dict(values) for name, values in (overrides or {}).items()}
    train_overrides = {**sections.pop("train", {}), "seed": seed,
                       "output_dir": str(work / f"run-seed{seed}")}
    if smoke:  # the carried first-stage summary is still fitted, in a few steps
        train_overrides.update(epochs=1, max_steps=2, batch_size=8,
                               summary_options=("steps=40",))
    cfg = replace(cfg, data={**sections.pop("data", {}), "root": str(data)},
                  train=train_overrides, **sections)
    run = Path(cfg.train.output_dir)
    if not (run / "best.pt").is_file():
        if (run / "last.pt").is_file():  # an interrupted earlier run: start it again
            (run / "last.pt").unlink()
        train(cfg)
    return run / "best.pt", data, cfg
