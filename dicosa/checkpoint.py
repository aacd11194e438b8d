"""Checkpoint files: atomic writes, safe loading, and rebuilding a model from one.

A checkpoint is a dict of tensors and plain containers only, so it loads with
``torch.load(weights_only=True)`` (no pickled code runs). The run's configuration travels
inside it as a YAML string, which is all :func:`load` needs to rebuild the model.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import pickle
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from torch import nn

from .clip import load_clip
from .config import Config, ModelConfig, config_from_dict
from .errors import CheckpointError, NoSpaceError
from .files import write_bytes_atomic, write_text_atomic  # noqa: F401 (re-exported)
from .fingerprint import fingerprint_config, model_fingerprint, weights_sha256
from .model import DiCoSA

FORMAT_VERSION = 1
# The content digest is stored under this key (absent in files written before it existed).
DIGEST_KEY = "sha256"


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: a crash leaves the old file or the new one.

    The data goes to a temporary file in the same folder, is fsync'ed, then renamed over
    ``path`` (a rename within one filesystem is atomic). The file stores the sha256 of its
    contents (:func:`content_sha256`), so a damaged copy is detected when it is read rather
    than loaded as wrong weights. A full disk or a file-size limit raises
    :class:`NoSpaceError`, leaving the previous file at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = dict(state, format=FORMAT_VERSION)
    state[DIGEST_KEY] = content_sha256(state)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            writer = _RecordingWriter(fh)
            try:
                torch.save(state, writer)
            except RuntimeError:
                # torch's zip writer reports a failed write as "unexpected pos"; the
                # OSError behind it says what happened.
                if writer.error is None:
                    raise
                raise writer.error from None
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            kept = "the previous file is intact" if path.exists() else "nothing was written"
            raise NoSpaceError(exc.errno, f"no space left to write {path} "
                                          f"({os.strerror(exc.errno)}); {kept}") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _RecordingWriter:
    """A binary file whose first failed write is kept (torch.save hides it)."""

    def __init__(self, fh):
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def content_sha256(state: Mapping[str, Any]) -> str:
    """sha256 over a checkpoint's contents (every tensor's bytes, every plain value), in a
    fixed order, without the stored digest itself; equal before saving and after loading."""
    digest = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().contiguous()
            digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
            digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, Mapping):
            keys = sorted((k for k in value if k != DIGEST_KEY), key=repr)
            digest.update(f"M{len(keys)}".encode())
            for key in keys:
                digest.update(repr(key).encode())
                visit(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"L{len(value)}".encode())
            for item in value:
                visit(item)
        else:
            digest.update(f"V{value!r}".encode())

    visit(state)
    return digest.hexdigest()


def read_checkpoint_file(path: str | Path, map_location: str | torch.device = "cpu",
                         mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)``, with every failure as one sentence.

    ``mmap``: the tensors are views of the file's pages (``torch.load(mmap=True)``), read
    when touched and never copied into the process's own memory.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a PyTorch file, truncated or damaged (including a content hash
            that no longer matches), or holding pickled objects other than tensors and
            plain containers.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    with path.open("rb") as fh:
        head = fh.read(4)
    if head != b"PK\x03\x04":  # every torch.save since PyTorch 1.6 is a zip archive
        size = path.stat().st_size
        raise CheckpointError(f"{path} is not a checkpoint: not a PyTorch file "
                              f"({size} bytes, starting {head!r})")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "was not an allowed global" in str(exc) or "Unsupported global" in str(exc):
            raise CheckpointError(
                f"{path} holds Python objects other than tensors and plain containers, "
                "which dicosa never writes and does not unpickle (torch.load weights_only "
                "refused it)") from None
        raise CheckpointError(f"{path} is corrupted: its contents cannot be unpickled "
                              f"({_last_reason(exc)})") from None
    except (RuntimeError, EOFError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is truncated or corrupted: PyTorch cannot read it "
                              f"({_last_reason(exc)})") from None
    if (isinstance(state, dict) and DIGEST_KEY in state
            and content_sha256(state) != state[DIGEST_KEY]):
        raise CheckpointError(f"{path} is corrupted: its contents no longer match the "
                              "sha256 stored when it was written")
    return state


def _last_reason(exc: BaseException) -> str:
    """The informative part of a torch.load error in one short line: the unpickler's
    complaint ("Unsupported operand 103") or the first line of a zip reader's error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    unpickler = [line for line in lines if "Unsupported operand" in line]
    reason = (unpickler or lines or [type(exc).__name__])[0]
    return reason.split(". This is an internal")[0][:160]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict:
    """Read a training checkpoint written by :func:`save_checkpoint` (``weights_only=True``);
    see :func:`read_checkpoint_file` for the errors."""
    state = read_checkpoint_file(path, map_location, mmap)
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        if isinstance(state, dict) and state and all(
                isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(
                f"{path} is a bare state dict ({len(state)} tensors, e.g. "
                f"'{next(iter(state))}'), not a dicosa training checkpoint; a checkpoint of "
                "the authors' released code is converted with 'dicosa convert'")
        what = f"keys {sorted(map(str, state))[:6]}" if isinstance(state, dict) else (
            type(state).__name__)
        raise CheckpointError(f"{path} is not a dicosa training checkpoint (no 'model' and "
                              f"'config' entries; it holds {what})")
    version = state.get("format")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} was written in checkpoint format {version}; this dicosa "
                              f"reads format {FORMAT_VERSION}")
    return state


def checkpoint_config(state: Mapping[str, Any]) -> Config:
    """The :class:`Config` stored (as YAML) in a loaded checkpoint."""
    return config_from_dict(yaml.safe_load(state["config"]))


def git_sha() -> str | None:
    """The commit of the source tree, with ``-dirty`` when it has local changes; None for an
    installed copy (whose folder may lie inside some other repository)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():  # a folder in a clone, a file in a worktree
        return None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty.strip() else sha


def load_model_weights(model: DiCoSA, weights: Mapping[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict(weights)``, or a ValueError naming every key/shape difference.

    A plain ``RuntimeError`` from PyTorch lists hundreds of keys; this says what kind of
    mismatch it is (another architecture, another variant, other frame/word counts).
    """
    _check_weights(model.state_dict(), weights, source)
    model.load_state_dict(weights)


def _check_weights(expected: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor],
                   source: str) -> None:
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(weights) if weights[k].shape != expected[k].shape
    )
    parts = []
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected),
                         ("shape mismatches", shapes)):
        if items:
            more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
            parts.append(f"{len(items)} {label}: {', '.join(items[:5])}{more}")
    if parts:
        raise ValueError(f"{source} was written for another model configuration/architecture; "
                         + "; ".join(parts))


def offline_model(model_cfg: ModelConfig, device: str | None = None) -> DiCoSA:
    """The architecture of ``model_cfg`` with random weights (on ``device``: ``"meta"``
    allocates none), for a checkpoint's weights.

    The checkpoint holds every weight, so CLIP's pretrained ones are never downloaded; a
    model fine-tuned from OpenAI's weights keeps their QuickGELU activation (open_clip's
    plain ``ViT-B-32`` config would otherwise build nn.GELU and change every feature).
    """
    quick_gelu = True if model_cfg.pretrained == "openai" else None
    clip = load_clip(model_cfg.arch, None, quick_gelu=quick_gelu, device=device)
    return DiCoSA(clip, dataclasses.replace(model_cfg, pretrained=None))


class ImageTowerNotLoaded(nn.Module):
    """Stands where CLIP's image tower is in a model loaded for search
    (``load(..., towers="text")``): encoding a video with it is one clear error."""

    def __init__(self, image_size: int):
        super().__init__()
        self.image_size = image_size

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        pass

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model was loaded for search only (towers='text'), without "
                         "CLIP's image tower; load the checkpoint with towers='all' to encode "
                         "videos")


def drop_image_tower(model: DiCoSA) -> DiCoSA:
    """``model`` without CLIP's image tower (for search), fingerprinted as it was whole."""
    model.recorded_fingerprint = model_fingerprint(model)
    model.clip.visual = ImageTowerNotLoaded(model.image_size)
    return model


def text_model(model_cfg: ModelConfig, weights: Mapping[str, torch.Tensor],
               source: str) -> DiCoSA:
    """The model of ``model_cfg`` holding ``weights`` (a whole checkpoint's) but for CLIP's
    image tower: what search needs (the text tower, the temporal transformer's and the
    head's weights, the logit scale). The architecture is built on the meta device, so the
    image tower is never allocated; the model records the fingerprint of all of
    ``weights`` (:func:`dicosa.fingerprint.model_fingerprint` returns it), so an index built
    with the whole model accepts it.
    """
    model = offline_model(model_cfg, device="meta")
    # CLIP's causal mask (additive, -inf above the diagonal) is a buffer left out of state
    # dicts: built again, on the CPU.
    context = model.clip.positional_embedding.shape[0]
    model.clip.attn_mask = torch.full((context, context), float("-inf")).triu_(1)
    expected = model.state_dict()  # meta tensors: names, shapes, dtypes
    _check_weights(expected, weights, source)
    weights = {k: v.to(expected[k].dtype) for k, v in weights.items()}
    recorded = {"weights_sha256": weights_sha256(weights),
                "config": fingerprint_config(model.config)}
    model.clip.visual = ImageTowerNotLoaded(model.image_size)
    # clone: the model's own memory, not views of a (possibly mapped) checkpoint file
    model.load_state_dict({k: v.clone() for k, v in weights.items()
                           if not k.startswith("clip.visual.")}, assign=True)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
            if t.is_meta]
    if left:
        raise RuntimeError(f"loading the text tower left {left[:5]} unset")
    model.recorded_fingerprint = recorded
    return model


def load(path: str | Path, device: str | torch.device = "cpu",
         model_config: ModelConfig | None = None,
         towers: Literal["all", "text"] = "all") -> tuple[DiCoSA, Config]:
    """Rebuild a trained model from a checkpoint file, in eval mode on ``device``.

    Args:
        path: a ``best.pt``/``last.pt`` written by training.
        model_config: build this architecture instead of the checkpoint's own (e.g. to check
            a checkpoint against a config); a mismatch raises ValueError.
        towers: ``"all"``, or ``"text"`` for a search process: no CLIP image tower (about
            a third of ViT-B/32's weights), fingerprinted as the whole checkpoint
            (:func:`text_model`).

    Returns:
        ``(model, config)``; the config is the one the checkpoint was trained with.
    """
    if towers not in ("all", "text"):
        raise ValueError(f"towers must be 'all' or 'text', got {towers!r}")
    # Read for search, the file is mapped: the image tower's pages are hashed (the file's
    # checksum, the fingerprint) but never copied into the process's memory.
    state = load_checkpoint(path, mmap=towers == "text")
    cfg = checkpoint_config(state)
    if towers == "text":
        model = text_model(model_config or cfg.model, state.pop("model"), str(path))
    else:
        model = offline_model(model_config or cfg.model)
        load_model_weights(model, state["model"], str(path))
    return model.to(device).eval(), cfg
