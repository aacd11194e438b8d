"""Retrieval evaluation: encode a split once, score every pair, report R@K both ways.

Texts and videos are encoded once (and cached on disk, keyed by the weights, the split and
the settings that change features), then scored in chunks with ``model.score``. Optional
post-processing (DSL, QB-Norm) is reported next to the raw numbers, never instead of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from . import postprocess as PP
from .checkpoint import (
    CheckpointError,
    checkpoint_config,
    file_sha256,
    load_checkpoint,
    load_model_weights,
    read_checkpoint_file,
    save_checkpoint,
)
from .clip import get_tokenizer
from .config import Config, ModelConfig
from .data.datasets import DATASETS, RetrievalSplit, load_split
from .data.loader import VideoDataset
from .metrics import evaluate_similarity
from .model import DiCoSA, TextFeatures, VideoFeatures

log = logging.getLogger(__name__)

CACHE_VERSION = 1
METRIC_KEYS = ("R@1", "R@5", "R@10", "R@50", "MdR", "MnR")
ROW_LABELS = {"raw": "raw", "dsl": "+DSL", "qbnorm": "+QB-Norm"}


# ---------------------------------------------------------------- devices and precision


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_mixed_precision(mode: str, device: torch.device | str | None = None) -> str:
    """``"auto"`` -> ``"bf16"`` on a CUDA device that supports it, else ``"no"``."""
    if mode != "auto":
        return mode
    device = resolve_device(device)
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def autocast(device: torch.device, mixed_precision: str) -> contextlib.AbstractContextManager:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


# ---------------------------------------------------------------- encoding and scoring


@torch.no_grad()
def encode_texts(model: DiCoSA, captions: Sequence[str], tokenize: Callable, batch_size: int,
                 device: torch.device, mixed_precision: str = "no",
                 progress: bool = False) -> TextFeatures:
    """Text vectors ``[C, D]`` (float32, CPU) for ``captions`` in order."""
    parts = []
    for start in tqdm(range(0, len(captions), batch_size), desc="encoding texts",
                      disable=not progress, leave=False):
        tokens = tokenize(list(captions[start:start + batch_size])).to(device)
        with autocast(device, mixed_precision):
            parts.append(model.encode_text(tokens).text.float().cpu())
    return TextFeatures(torch.cat(parts))


@torch.no_grad()
def encode_videos(model: DiCoSA, split: RetrievalSplit, batch_size: int, num_workers: int,
                  device: torch.device, mixed_precision: str = "no",
                  indices: Sequence[int] | None = None, progress: bool = False) -> VideoFeatures:
    """Per-frame video vectors ``[V, N, D]`` (float32, CPU) for the split's videos in order
    (or those at ``indices``). An unusable file raises, listing every bad file of the split."""
    dataset = VideoDataset(split, model.config.num_frames, model.image_size)
    if indices is not None:
        dataset = Subset(dataset, list(indices))
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                        pin_memory=device.type == "cuda")
    frames, masks = [], []
    for batch in tqdm(loader, desc="encoding videos", disable=not progress, leave=False):
        with autocast(device, mixed_precision):
            video = model.encode_video(batch["frames"].to(device, non_blocking=True),
                                       batch["frame_mask"].to(device, non_blocking=True))
        frames.append(video.frames.float().cpu())
        masks.append(video.frame_mask.cpu())
    return VideoFeatures(torch.cat(frames), torch.cat(masks))


@torch.no_grad()
def similarity(model: DiCoSA, text: TextFeatures, video: VideoFeatures, chunk: int,
               device: torch.device, mixed_precision: str = "no") -> torch.Tensor:
    """``S [N_t, N_v]`` (float32, CPU) for every pair, ``chunk`` texts at a time on ``device``."""
    with autocast(device, mixed_precision):
        sim = model.score(text.to(device), video.to(device), chunk=chunk)
    return sim.float().cpu()


# ---------------------------------------------------------------- feature cache


class FeatureCache:
    """Encoded features on disk, one file per (weights, data, settings) key.

    The key is a dict of everything that changes the features; its hash names the file and
    the dict itself is stored inside and compared on load, so a stale file is never used.
    """

    def __init__(self, root: Path | None):
        self.root = root

    def get(self, name: str, key: dict, compute: Callable[[], dict[str, torch.Tensor]]
            ) -> dict[str, torch.Tensor]:
        if self.root is None:
            return compute()
        text = json.dumps(key, sort_keys=True, default=str)
        path = self.root / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.pt"
        if path.is_file():
            try:
                stored = read_checkpoint_file(path)
                if stored.get("key") == text:
                    log.info("using cached features %s", path)
                    return stored["tensors"]
            except (CheckpointError, OSError) as exc:  # damaged or foreign: recompute it
                log.warning("ignoring unreadable feature cache %s (%s)", path, exc)
        _remove_orphans(self.root)
        tensors = compute()
        save_checkpoint(path, {"key": text, "tensors": tensors})
        return tensors


def _remove_orphans(folder: Path) -> None:
    """Delete the temporary files in ``folder`` left by writers that were killed (their
    process is gone); entries are renamed into place only once whole, so none was read."""
    for tmp in folder.glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _split_fingerprint(split: RetrievalSplit, indices: Sequence[int] | None = None) -> str:
    digest = hashlib.sha256(split.name.encode())
    videos = range(split.num_videos) if indices is None else indices
    for v in videos:
        digest.update(f"{split.video_paths[v]}|{split.segments[v]}\n".encode())
    return digest.hexdigest()


def _captions_fingerprint(captions: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(captions).encode()).hexdigest()


# ---------------------------------------------------------------- metrics


def retrieval_results(sim: torch.Tensor, caption_video: torch.Tensor,
                      postprocess: Sequence[str] = (), *, eval_cfg=None,
                      bank_t2v: torch.Tensor | None = None,
                      bank_v2t: torch.Tensor | None = None) -> dict[str, dict]:
    """Metrics of the raw matrix and of each requested post-processing, by row label.

    Args:
        sim: ``[N_t, N_v]`` test captions x test videos.
        caption_video: ``[N_t]`` ground-truth video of each caption.
        postprocess: any of ``"dsl"``, ``"qbnorm"``.
        eval_cfg: :class:`EvalConfig` with the QB-Norm settings.
        bank_t2v: ``[N_b, N_v]`` training captions x test videos (QB-Norm, t2v).
        bank_v2t: ``[N_t, N_bv]`` test captions x training videos (QB-Norm, v2t).
    """
    results = {"raw": evaluate_similarity(sim, caption_video)}
    if "dsl" in postprocess:
        # DSL's prior runs along the axis that is not ranked, so each direction has its own.
        results["dsl"] = {
            "t2v": evaluate_similarity(PP.dsl_t2v(sim), caption_video)["t2v"],
            "v2t": evaluate_similarity(PP.dsl_v2t(sim), caption_video)["v2t"],
        }
    if "qbnorm" in postprocess:
        if bank_t2v is None or bank_v2t is None or eval_cfg is None:
            raise ValueError("QB-Norm needs both query banks and the eval config")
        t2v = PP.qb_norm(sim, bank_t2v, eval_cfg.qb_k, eval_cfg.qb_beta, eval_cfg.qb_theta_t2v)
        v2t = PP.qb_norm(sim.T, bank_v2t.T, eval_cfg.qb_k, eval_cfg.qb_beta,
                         eval_cfg.qb_theta_v2t).T
        results["qbnorm"] = {
            "t2v": evaluate_similarity(t2v, caption_video)["t2v"],
            "v2t": evaluate_similarity(v2t, caption_video)["v2t"],
        }
    return results


def selection_score(metrics: dict) -> float:
    """Model-selection criterion: text-to-video R@1 + R@5 + R@10."""
    t2v = metrics["t2v"]
    return float(t2v["R@1"] + t2v["R@5"] + t2v["R@10"])


def evaluate_model(model: DiCoSA, split: RetrievalSplit, cfg: Config, device: torch.device,
                   mixed_precision: str = "no", progress: bool = False) -> dict:
    """Raw t2v/v2t metrics of ``model`` on ``split`` (no cache, no post-processing): the
    validation pass run during training."""
    was_training = model.training
    model.eval()
    try:
        tokenize = get_tokenizer(model.config.arch, model.config.max_words)
        text = encode_texts(model, split.captions, tokenize, cfg.eval.batch_size, device,
                            mixed_precision, progress)
        video = encode_videos(model, split, cfg.eval.batch_size, cfg.data.num_workers, device,
                              mixed_precision, progress=progress)
        sim = similarity(model, text, video, cfg.eval.score_chunk, device, mixed_precision)
    finally:
        model.train(was_training)
    return evaluate_similarity(sim, torch.tensor(split.caption_video))


# ---------------------------------------------------------------- the evaluate entry point


def dataset_for_split(split: str) -> str:
    """The benchmark a split name belongs to (``1k-A`` -> ``msrvtt``), if it is unambiguous."""
    # The synthetic benchmark reuses MSR-VTT's split names, so it never wins by name alone.
    owners = [name for name, info in DATASETS.items()
              if split in info.splits and name != "synthetic"]
    if len(owners) != 1:
        where = f"is a split of {owners}" if owners else "is not a known split name"
        raise ValueError(f"'{split}' {where}; pass --dataset")
    return owners[0]


def _model_for(cfg: Config, checkpoint: Path | None, device: torch.device
               ) -> tuple[DiCoSA, Config, dict]:
    """The model to evaluate, the config it runs under, and facts about its weights."""
    if checkpoint is None:
        # Random head: seed it so that zero-shot numbers are reproducible.
        torch.manual_seed(cfg.train.seed)
        model = DiCoSA.from_config(cfg.model)
        info = {"checkpoint": None, "checkpoint_sha256": None, "selected_on": None,
                "zero_shot": True,
                "note": f"zero-shot: CLIP weights '{cfg.model.pretrained}' with a randomly "
                        "initialised temporal transformer and concept head (not trained)",
                "weights_key": f"zero-shot:{cfg.model.arch}:{cfg.model.pretrained}:"
                               f"seed{cfg.train.seed}"}
        return model.to(device).eval(), cfg, info
    state = load_checkpoint(checkpoint)
    trained = checkpoint_config(state)
    differences = {k: (getattr(cfg.model, k), getattr(trained.model, k))
                   for k in (f.name for f in dataclasses.fields(ModelConfig))
                   if k != "pretrained" and getattr(cfg.model, k) != getattr(trained.model, k)}
    if differences:
        log.warning("using the checkpoint's model settings; ignoring config values %s",
                    {k: v[0] for k, v in differences.items()})
    model = DiCoSA.from_config(dataclasses.replace(trained.model, pretrained=None))
    load_model_weights(model, state["model"], str(checkpoint))
    sha = file_sha256(checkpoint)
    info = {"checkpoint": str(checkpoint), "checkpoint_sha256": sha,
            "selected_on": state.get("selected_on", "unknown"), "zero_shot": False,
            "trained_steps": state.get("step"), "git_sha_of_training": state.get("git_sha"),
            "weights_key": sha}
    return model.to(device).eval(), dataclasses.replace(cfg, model=trained.model), info


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.processor() or platform.machine()})"


def evaluate(cfg: Config, checkpoint: Path | None, split: str | None = None,
             device: str | torch.device | None = None, *, out: Path | None = None,
             progress: bool = True) -> dict:
    """Evaluate a checkpoint (or zero-shot CLIP when ``checkpoint`` is None) on a split.

    Args:
        cfg: data and eval settings (the model section comes from the checkpoint).
        checkpoint: a training checkpoint, or None for zero-shot weights.
        split: split of ``cfg.data.dataset``; default ``cfg.data.test_split``.
        device: default CUDA when available.
        out: the JSON results file; default ``eval-<dataset>-<split>-<name>.json`` beside
            the checkpoint (or in ``train.output_dir`` for zero-shot).

    Returns:
        The results dict that was written to ``out`` (``"metrics"`` holds one entry per row:
        ``"raw"`` always, ``"dsl"``/``"qbnorm"`` when requested), plus ``"json_path"``.
    """
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    device = resolve_device(device)
    split_name = split or cfg.data.test_split
    data = cfg.data
    # Annotations first: a missing file should fail before a weights download, not after.
    test = load_split(data.dataset, data.root, split_name, data.video_dir)
    model, cfg, info = _model_for(cfg, checkpoint, device)
    if device.type == "cuda":
        # Fuses the confidence MLP's epilogue: 16 -> 6 ms for 1k x 1k on an H100.
        model.compile_scoring(dynamic=False)
    precision = resolve_mixed_precision(cfg.train.mixed_precision, device)
    out_dir = checkpoint.parent if checkpoint is not None else Path(cfg.train.output_dir)
    cache = FeatureCache(Path(cfg.eval.cache_dir) if cfg.eval.cache_dir else out_dir / "cache")

    tokenize = get_tokenizer(cfg.model.arch, cfg.model.max_words)
    # Everything that changes a feature vector; the model config covers frames and words.
    base_key = {"version": CACHE_VERSION, "weights": info["weights_key"],
                "model": dataclasses.asdict(cfg.model), "precision": precision,
                "device": device.type}

    def texts(captions: Sequence[str], tag: str) -> TextFeatures:
        key = dict(base_key, captions=_captions_fingerprint(captions))
        stored = cache.get(f"text-{tag}", key, lambda: {"text": encode_texts(
            model, captions, tokenize, cfg.eval.batch_size, device, precision, progress).text})
        return TextFeatures(stored["text"])

    def videos(split_: RetrievalSplit, tag: str, indices: Sequence[int] | None = None
               ) -> VideoFeatures:
        key = dict(base_key, videos=_split_fingerprint(split_, indices))

        def compute() -> dict[str, torch.Tensor]:
            v = encode_videos(model, split_, cfg.eval.batch_size, data.num_workers, device,
                              precision, indices, progress)
            return {"frames": v.frames, "frame_mask": v.frame_mask}

        stored = cache.get(f"video-{tag}", key, compute)
        return VideoFeatures(stored["frames"], stored["frame_mask"])

    text, video = texts(test.captions, split_name), videos(test, split_name)
    score = lambda t, v: similarity(model, t, v, cfg.eval.score_chunk, device, precision)  # noqa: E731
    sim = score(text, video)
    caption_video = torch.tensor(test.caption_video)

    bank_t2v = bank_v2t = None
    bank_info = None
    if "qbnorm" in cfg.eval.postprocess:
        train = load_split(data.dataset, data.root, data.train_split, data.video_dir)
        rng = np.random.default_rng(cfg.train.seed)
        cap_idx = np.sort(rng.permutation(train.num_captions)[:cfg.eval.qb_bank_captions])
        vid_idx = np.sort(rng.permutation(train.num_videos)[:cfg.eval.qb_bank_videos])
        bank_captions = [train.captions[i] for i in cap_idx]
        bank_t2v = score(texts(bank_captions, f"{data.train_split}-bank"), video)
        bank_v2t = score(text, videos(train, f"{data.train_split}-bank", vid_idx.tolist()))
        bank_info = {"split": train.name, "captions": len(cap_idx), "videos": len(vid_idx)}

    metrics = retrieval_results(sim, caption_video, cfg.eval.postprocess, eval_cfg=cfg.eval,
                                bank_t2v=bank_t2v, bank_v2t=bank_v2t)
    name = checkpoint.stem if checkpoint is not None else "zeroshot"
    if out is None:
        out = out_dir / f"eval-{data.dataset}-{split_name}-{name}.json"
    out = Path(out)
    results = {
        "dataset": data.dataset,
        "split": split_name,
        "num_captions": test.num_captions,
        "num_videos": test.num_videos,
        "multi_caption": test.multi_caption,
        "metrics": metrics,
        "postprocess": list(cfg.eval.postprocess),
        "qbnorm_bank": bank_info,
        **{k: v for k, v in info.items() if k != "weights_key"},
        "device": _device_name(device),
        "mixed_precision": precision,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    results["json_path"] = str(out)
    return results


# ---------------------------------------------------------------- terminal output


def format_table(results: dict) -> str:
    """Rows raw / +DSL / +QB-Norm; R@1 R@5 R@10 R@50 MdR MnR for t2v, then for v2t."""
    metrics = results["metrics"]
    head = " ".join(f"{k:>6}" for k in METRIC_KEYS)
    lines = [f"{'':10}| {'text -> video':^{len(head)}} | {'video -> text':^{len(head)}}",
             f"{'':10}| {head} | {head}"]
    for row, label in ROW_LABELS.items():
        if row not in metrics:
            continue
        cells = [" ".join(f"{metrics[row][d][k]:6.1f}" for k in METRIC_KEYS)
                 for d in ("t2v", "v2t")]
        lines.append(f"{label:10}| {cells[0]} | {cells[1]}")
    return "\n".join(lines)


def summary(results: dict) -> str:
    """The table with a header saying what was evaluated and how it was chosen."""
    if results.get("zero_shot"):
        origin = results["note"]
    else:
        origin = (f"checkpoint {results['checkpoint']} (sha256 {results['checkpoint_sha256'][:12]}"
                  f", selected on: {results['selected_on']})")
    lines = [f"{results['dataset']}/{results['split']}: {results['num_captions']} captions, "
             f"{results['num_videos']} videos; {origin}", format_table(results)]
    if len(results["metrics"]) > 1:
        lines.append("+DSL / +QB-Norm use the whole test gallery or a training query bank; "
                     "they are not comparable with raw numbers.")
    lines.append(f"results: {results.get('json_path', '')}")
    return "\n".join(lines)
