"""What the workers of a Ray build do: decode one video, encode videos, write a shard.

:mod:`dicosa.index.ray_build` hands these to Ray Data's ``map_batches``; they are the single
process's own pieces (:class:`~dicosa.index.decode.VideoItems`,
:class:`~dicosa.index.encode.Encoder`, the store's shard writer) called one batch at a time,
so they hold no Ray code and run in any process. A batch is a dict of NumPy columns, one row
per video; a column of Python objects carries what a stage hands on.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from ..model import DiCoSA
from ..search.shards import VideoRun, write_shard
from ..search.store import FrameStore
from .decode import VideoItems
from .encode import Clip, Encoder, clips_as_features
from .ingest import _SHARD_FRAMES, IngestReport, _count, _frames, _rows

__all__ = ["EncodeVideos", "decode_videos", "node_id", "write_shards"]

# what an encoder says of a video beside its features, one column each ("" where nothing)
_SAID = ("skipped", "text_only", "partial")


def node_id() -> str:
    """The Ray node this process runs on ("" outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except ImportError:
        return ""


def _column(values: list) -> np.ndarray:
    """A column of Python objects (a list of lists stays one object per row)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def decode_videos(batch: dict[str, np.ndarray], *, num_frames: int, image_size: int,
                  frames: FrameProtocol, segments: SegmentPolicy | None) -> dict:
    """Decode each video of ``batch`` whole (a CPU task, one video per call): ``seq, path,
    title`` -> ``seq, path, items, decode_s, node``; ``items`` the video's decoded items (one
    clip or error, or a long video's frame batches at the segment rate and its end)."""
    items, seconds = [], []
    node = node_id()
    for path, title in zip(batch["path"], batch["title"], strict=True):
        started = time.perf_counter()
        source = VideoItems([path], num_frames, image_size, frames, segments,
                            {path: title} if title else None)
        items.append(list(source.items(path)))
        seconds.append(time.perf_counter() - started)
    return {"seq": batch["seq"], "path": batch["path"], "items": _column(items),
            "decode_s": np.array(seconds), "node": _column([node] * len(items))}


class EncodeVideos:
    """The model on this actor's device (its GPU where Ray gave it one), encoding decoded
    videos a batch at a time with an :class:`~dicosa.index.encode.Encoder`: ``seq, path,
    encoded`` (a :class:`~dicosa.index.encode.Clip` or :class:`~dicosa.search.shards.VideoRun`:
    features, no frames), ``skipped``/``text_only``/``partial`` (the reason or what the
    decode lost, or ""), ``pad``, timings.

    ``model``: the model, or a list holding a Ray object reference to it: the driver puts it
    in the object store once, and an actor (a restarted one too) fetches it from there; the
    constructor's own arguments stay small. ``threads``: torch threads on a CPU (None: the
    node's cores).
    """

    def __init__(self, model: DiCoSA | list, frames: FrameProtocol,
                 segments: SegmentPolicy | None, batch_size: int, threads: int | None = None):
        if isinstance(model, list):
            import ray

            model = ray.get(model[0])
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            # Ray starts an actor of one CPU with OMP_NUM_THREADS=1; a CPU encoder shares its
            # node's cores with the decode tasks, as a single-process build's encoder shares
            # them with its DataLoader workers
            torch.set_num_threads(threads or os.cpu_count() or 1)
        self.model = model.to(self.device).eval()
        self.frames, self.segments, self.batch_size = frames, segments, batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict:
        started = time.perf_counter()
        encoder = Encoder(self.model, self.device, self.frames, self.segments,
                          self.batch_size)
        for local, items in enumerate(batch["items"]):
            for item in items:
                encoder.take({**item, "seq": local})
        encoder.flush()
        encoded = {e.row["path"]: e for e in encoder.ready()}
        pad = encoder.pad() if self.segments is not None else None
        paths = list(batch["path"])
        seconds = (time.perf_counter() - started) / max(1, len(paths))
        said = {key: dict(getattr(encoder, key)) for key in _SAID}  # path -> reason or loss
        return {"seq": batch["seq"], "path": batch["path"],
                "encoded": _column([encoded.get(p) for p in paths]),
                **{key: np.array([by_path.get(p, "") for p in paths], dtype=object)
                   for key, by_path in said.items()},
                "pad": _column([pad] * len(paths)), "decode_s": batch["decode_s"],
                "encode_s": np.full(len(paths), seconds), "node": batch["node"],
                "encoder_node": _column([node_id()] * len(paths))}


def write_shards(batch: dict[str, np.ndarray], *, folder: str, frame_dtype: str,
                 window: int | None, shard_size: int) -> dict:
    """Write the encoded videos of ``batch`` as shard files in ``folder`` (at most
    ``shard_size`` rows or ``_SHARD_FRAMES`` frames each); one record per call: the files
    written (name, rows, checksums, paths), what they hold, the videos skipped, where and
    how long each stage worked."""
    started = time.perf_counter()
    # (a column of nothing but None comes back from Arrow as floats: NaN)
    encoded = [e for e in batch["encoded"] if isinstance(e, (Clip, VideoRun))]
    pad = next((p for p in batch["pad"] if isinstance(p, np.ndarray)), None)
    shards = [_write(group, Path(folder), frame_dtype, pad, window)
              for group in _groups(encoded, shard_size)]
    report = IngestReport()
    _count(report, encoded)
    paths = [str(p) for p in batch["path"]]
    record = {
        "shards": shards, "videos": report.added, "rows": report.rows,
        "frames": report.frames, "seconds": report.seconds, "paths": paths,
        **{key: [(p, r) for p, r in zip(paths, batch[key], strict=True) if r] for key in _SAID},
        "decode_s": float(np.sum(batch["decode_s"])),
        "encode_s": float(np.sum(batch["encode_s"])),
        "write_s": time.perf_counter() - started,
        "nodes": sorted(set(batch["node"]) | set(batch["encoder_node"]))}
    return {key: _column([value]) for key, value in record.items()}


def _groups(encoded: list, shard_size: int) -> list[list]:
    """``encoded`` cut into shards of at most ``shard_size`` rows or ``_SHARD_FRAMES``
    frames (a video is never split)."""
    groups, group, rows, frames = [], [], 0, 0
    for video in encoded:
        more_rows, more_frames = _rows([video]), _frames([video])
        if group and (rows + more_rows > shard_size or frames + more_frames > _SHARD_FRAMES):
            groups.append(group)
            group, rows, frames = [], 0, 0
        group.append(video)
        rows, frames = rows + more_rows, frames + more_frames
    return groups + ([group] if group else [])


def _write(group: list, folder: Path, frame_dtype: str, pad: np.ndarray | None,
           window: int | None) -> dict:
    """One shard file of ``group``'s videos (checked as any append checks them), named at
    random: a retried task never overwrites another try's file, and only the driver's link
    makes it part of the index."""
    store = FrameStore(frame_dtype=frame_dtype)
    if isinstance(group[0], VideoRun):
        store.append_runs(group, pad, window)
    else:
        store.append(*clips_as_features(group))
    shard, name = store.shards[0], f"shard-{uuid.uuid4().hex[:16]}"
    write_shard(folder, shard, name)
    return {"name": name, "count": shard.count, "sha256": shard.sha256,
            "paths": [v.row["path"] for v in group]}
