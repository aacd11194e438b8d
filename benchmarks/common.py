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
