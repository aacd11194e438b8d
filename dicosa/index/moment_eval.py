"""Video-corpus moment retrieval measured through an index, as a user's search runs.

:func:`evaluate_split` indexes a :class:`~dicosa.data.moments.MomentSplit`'s videos (frames at
the segment rate, shots, windows: :mod:`dicosa.data.segments`, no knowledge of the annotated
boundaries) and ranks, for every caption, every row of every video with DiCoSA
(``candidates=None``, the exhaustive reference) or through the first stage; the ranked moments
(:meth:`~dicosa.index.SearchResult.top_moments`: never two overlapping ones of one video) are
measured by :func:`dicosa.moment_metrics.evaluate_moments`: corpus R@k at temporal IoU,
within-video R@1 and the video-level R@k.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..data.moments import MomentSplit
from ..model import DiCoSA
from .video_index import VideoIndex

__all__ = ["evaluate_split", "moment_ranker"]


def moment_ranker(index: VideoIndex, split: MomentSplit, *, candidates: int | None = None,
                  depth: int | None = None, join: float | None = None):
    """``rank(captions) -> [[(video_id, start, end, score), ...]]`` over ``index``, whose
    videos are ``split``'s files: each caption's best ``depth`` moments (None: every row),
    matching rows joined into ranges as ``join`` says (:meth:`SearchResult.top_moments`)."""
    ids_of = {str(Path(p).resolve()): v for v, p in zip(split.video_ids, split.video_paths,
                                                         strict=True)}
    depth = depth or len(index.store)

    def rank(captions: Sequence[str]) -> list[list[tuple[str, float, float, float]]]:
        results = index.query(list(captions), k=1, candidates=candidates)
        out = []
        for result in results:
            found = result.top_moments(depth, join)
            out.append([(ids_of.get(path, path), m.start, m.end, m.score)
                        for path, _, m in found if m.start is not None])
        return out

    return rank


def evaluate_split(model: DiCoSA, split: MomentSplit, *, index_dir: str | os.PathLike | None
                   = None, candidates: int | None = None, segments=None,
                   frame_sampling: str | None = None, frame_padding: str | None = None,
                   num_workers: int | None = None, progress: bool = True,
                   batch_size: int = 64, join: float | None = None) -> dict:
    """Index ``split``'s videos (into ``index_dir``, resumed when it holds them; None: in
    memory) and measure moment retrieval over them (module docstring). ``segments``: as
    :class:`VideoIndex` takes it (None: the default policy); ``join``: how moments join rows
    (:func:`~dicosa.search.moment.best_moments`; None: its default). Returns the metrics
    with what was measured: the split, the rows ranked, the candidates and the segment
    policy."""
    from ..moment_metrics import evaluate_moments

    missing = [str(p) for p in split.video_paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} video(s) of {split.name} are missing "
                                f"(first: {missing[0]})")
    index = VideoIndex.build(model, [str(p) for p in split.video_paths], index_dir,
                             backend="exact", num_workers=num_workers, progress=progress,
                             segments=segments, frame_sampling=frame_sampling,
                             frame_padding=frame_padding)
    if index.skipped:
        raise ValueError(f"{len(index.skipped)} video(s) of {split.name} could not be "
                         f"decoded (first: {index.skipped[0][0]}: {index.skipped[0][1]})")
    with torch.inference_mode():
        result = evaluate_moments(moment_ranker(index, split, candidates=candidates,
                                                join=join),
                                  split.captions, split.truths(), batch_size=batch_size)
    rows = len(index.store)
    return {**result, "split": split.name, "videos": len(index), "rows": rows,
            "rows_per_video": round(rows / max(1, len(index)), 3),
            "candidates": candidates, "segments": None if index.segments is None
            else index.segments.as_dict(),
            "frames_stored": int(sum(len(s.frames) for s in index.store.shards)),
            "mean_segment_seconds": _mean_span(index)}


def _mean_span(index: VideoIndex) -> float | None:
    spans = index.store.videos.spans(index.store.live())
    lengths = spans[:, 1] - spans[:, 0]
    lengths = lengths[np.isfinite(lengths)]
    return round(float(lengths.mean()), 3) if len(lengths) else None


BENCHMARKS = ("long-synthetic", "long-synthetic-clips", "didemo")


def load_benchmark(name: str, root: str | os.PathLike, split: str | None = None
                   ) -> MomentSplit:
    """A moment benchmark's queries: ``long-synthetic`` (the long videos a
    ``data_prep/make_long_synthetic.py`` folder holds), ``long-synthetic-clips`` (the same
    scenes as separate clips: the reference) or ``didemo`` (``split``, default test)."""
    if name == "didemo":
        from ..data.moments import load_didemo_moments

        return load_didemo_moments(root, split or "test")
    if name in ("long-synthetic", "long-synthetic-clips"):
        from ..data.long_synthetic import load_long_synthetic

        return load_long_synthetic(root, as_clips=name.endswith("clips"))
    raise ValueError(f"unknown moment benchmark {name!r}; choose one of "
                     f"{', '.join(BENCHMARKS)}")


def evaluate_benchmark(cfg, checkpoint: str | os.PathLike | None, benchmark: str,
                       root: str | os.PathLike, *, split: str | None = None,
                       device: str | None = None, candidates: int | None = None,
                       segments=None, index_dir: str | os.PathLike | None = None,
                       out: str | os.PathLike | None = None, progress: bool = True) -> dict:
    """``python evaluate.py --moments BENCHMARK``: the checkpoint's model (its frame protocol)
    on a moment benchmark (:func:`evaluate_split`); the results, with the checkpoint's facts
    (which split chose it), the device and the date, are written to ``out`` (default beside
    the checkpoint) and returned."""
    import datetime
    import json

    from ..evaluation import _device_name, _model_for
    from ..precision import resolve_device

    split_data = load_benchmark(benchmark, root, split)
    torch_device = resolve_device(device)
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    model, cfg, info = _model_for(cfg, checkpoint, torch_device)
    info.pop("weights_key")
    metrics = evaluate_split(model, split_data, index_dir=index_dir, candidates=candidates,
                             segments=segments, frame_sampling=cfg.data.frame_sampling,
                             frame_padding=cfg.data.frame_padding, progress=progress)
    name = checkpoint.stem if checkpoint is not None else "zeroshot"
    folder = checkpoint.parent if checkpoint is not None else Path(cfg.train.output_dir)
    out = Path(out or folder / f"moments-{benchmark}-{name}.json")
    results = {"benchmark": benchmark, "root": str(root), **metrics, **info,
               "device": _device_name(torch_device),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                   timespec="seconds")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    results["json_path"] = str(out)
    return results
