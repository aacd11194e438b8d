"""One index built by several processes: ``accelerate launch -m dicosa index`` or ``torchrun``.

The main process lists the videos still to encode; process r of W encodes the r-th of W
contiguous blocks of that list into its own *part*, ``parts/rank-R/`` (an index without a
first stage, whose manifest is that process's progress record). The main process then links
every part's shards into the folder's manifest (:meth:`VideoIndex.link_shards`: no copy) and
builds the first stages once; the result is an ordinary index folder. ``docs/search.md``
("Under a launcher") and ``docs/index-format.md`` describe resuming and the files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.protocol import FrameProtocol
from ..model import DiCoSA
from .ingest import list_videos, new_or_changed
from .resume import check_frames
from .video_index import VideoIndex

__all__ = ["PARTS", "RAY_PART", "BuildReport", "Launch", "PeerFailed", "build_index",
           "launch_size", "merge_parts", "open_part", "pending_videos"]

log = logging.getLogger(__name__)

PARTS = "parts"
RAY_PART = "ray"  # the part a Ray build's workers write into (dicosa/index/ray_build.py)
# The variables through which launchers (torchrun, accelerate, MPI) give the process count.
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launch_size() -> int:
    """The number of processes a launcher says this one belongs to (1: no launcher)."""
    return max(int(os.environ.get(name, "1") or 1) for name in _WORLD_SIZE_VARIABLES)


class PeerFailed(RuntimeError):
    """Another process of the launch failed first (that process reports why)."""


@dataclass
class Launch:
    """This process's place in the launch: rank, process count, device, collectives."""

    rank: int = 0
    size: int = 1
    device: torch.device | None = None

    @classmethod
    def detect(cls) -> Launch:
        """The launch this process belongs to. Several processes (a launcher set the world
        size above 1) start Accelerate's process group: NCCL on GPUs, gloo on CPUs."""
        size = launch_size()
        if size <= 1:
            return cls()
        from accelerate import PartialState

        # Without a GPU, Accelerate only recognises several processes (gloo) in CPU mode.
        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(state.process_index, state.num_processes, state.device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, value: object) -> object:
        """The main process's ``value``, in every process."""
        if self.size == 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def gather(self, value: object) -> list:
        """Every process's ``value``, in rank order, in every process."""
        if self.size == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def close(self) -> None:
        """End the process group while Python is still whole: left to interpreter exit,
        gloo's worker threads can abort the process (SIGABRT after a finished build, seen
        on CI)."""
        if self.size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@dataclass
class BuildReport:
    """What :func:`build_index` did."""

    index: VideoIndex | None  # the merged index; None in the processes other than the main one
    processes: int
    # Videos decoded and encoded by this launch, all processes together (None: a
    # single-process build into a folder without parts, which is VideoIndex.build as it is).
    encoded: int | None = None
    per_process: list[int] = field(default_factory=list)


def build_index(
    model: DiCoSA,
    videos: str | os.PathLike | Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    batch_size: int = 16,
    num_workers: int | None = None,
    shard_size: int = 256,
    meta: dict | None = None,
    progress: bool = True,
    titles: dict[str, str] | str | os.PathLike | None = None,
    launch: Launch | None = None,
    **stage,
) -> BuildReport:
    """:meth:`VideoIndex.build` into ``out_dir``, split over the processes of the launch.

    One process, into a folder without ``parts/``: exactly :meth:`VideoIndex.build`. Several
    processes, or a folder a multi-process build left parts in: see the module docstring.
    Every process must call it with the same arguments; the options mean what they mean for
    :meth:`VideoIndex.build` (``batch_size``, ``num_workers`` and ``shard_size`` per process;
    ``stage``: :meth:`VideoIndex.create_or_resume`'s options, ``lock_timeout`` included).
    """
    owned = launch is None  # a launch this call detected is closed by it
    launch = launch or Launch.detect()
    out = Path(out_dir)
    if launch.size == 1 and not (out / PARTS).is_dir():
        index = VideoIndex.build(model, videos, out, batch_size=batch_size,
                                 num_workers=num_workers, shard_size=shard_size, meta=meta,
                                 progress=progress, titles=titles, **stage)
        return BuildReport(index, 1)
    try:
        top, pending, frames, policy, kept = _agree_on_pending(launch, model, videos, out,
                                                               stage)
        mine = _block(pending, launch.rank, launch.size)
        if num_workers is None:  # the processes share the machine's cores
            num_workers = min(4, max(1, (os.cpu_count() or 1) // launch.size))
        part = open_part(model, out / PARTS / f"rank-{launch.rank}", frames, policy, kept,
                         launch.device)
        encoded = part.add(mine, batch_size=batch_size, num_workers=num_workers,
                           shard_size=shard_size, progress=progress and launch.is_main,
                           titles=titles, only_new=False)
        assigned = set(mine)
        reports = launch.gather({"encoded": encoded,
                                 "skipped": [s for s in part.skipped if s[0] in assigned],
                                 "text_only": part.text_only, "partial": part.partial})
    finally:  # the merge below is the main process's alone
        if owned:
            launch.close()
    counts = [r["encoded"] for r in reports]
    if not launch.is_main:
        return BuildReport(None, launch.size, sum(counts), counts)
    assert top is not None
    merge_parts(top, out, pending, reports, meta)
    return BuildReport(top, launch.size, sum(counts), counts)


def _agree_on_pending(launch: Launch, model: DiCoSA, videos, out: Path, stage: dict
                      ) -> tuple[VideoIndex | None, list[str], FrameProtocol, dict | None, str]:
    """The main process opens the index and lists what is left; every process gets the list,
    the index's frame protocol, its segment policy and how it keeps frames (a resumed
    index's may not be the ones asked for).

    One process decides, so that all split the same list: the others have not started
    writing when it reads the parts. A failure there (another model's index, a damaged part)
    stops the others with :class:`PeerFailed` and the main process raises it.
    """
    top, agreed, failure = None, None, None
    if launch.is_main:
        try:
            listed = list_videos(videos)  # a folder that does not exist: nothing written
            top = VideoIndex.create_or_resume(model, out, device=launch.device, **stage)
            agreed = (pending_videos(top, out, listed), top.frames.as_dict(),
                      top.segments.as_dict() if top.segments is not None else None,
                      top.store.frame_dtype)
        except Exception as exc:
            failure = exc
    agreed = launch.broadcast(agreed)
    if failure is not None:
        raise failure
    if agreed is None:
        raise PeerFailed("the main process could not start the build; its message says why")
    pending, frames, policy, kept = (agreed[0], FrameProtocol(**agreed[1]), agreed[2],
                                     agreed[3])
    log.info("process %d of %d: %d video(s) left to encode, %d of them here", launch.rank,
             launch.size, len(pending), len(_block(pending, launch.rank, launch.size)))
    return top, pending, frames, policy, kept


def pending_videos(top: VideoIndex, out: Path, videos) -> list[str]:
    """The listed videos ``top`` does not hold, or holds from a file changed since
    (:func:`~dicosa.index.listing.new_or_changed`), less those an unlinked part shard in
    ``out`` holds."""
    waiting = {p for _, _, paths, _ in _unlinked(top, out, top.model) for p in paths}
    listed = [p for p in dict.fromkeys(list_videos(videos)) if p not in waiting]
    return new_or_changed(listed, top.store.table.videos())


def open_part(model: DiCoSA, folder: Path, frames: FrameProtocol, policy: dict | None,
              kept: str, device: torch.device | None = None) -> VideoIndex:
    """A part of the build (new or resumed): an index without a first stage that decodes as
    the merged index does (frame protocol, segment policy, how frames are kept)."""
    return VideoIndex.create_or_resume(model, folder, device=device, backend=None,
                                       frame_sampling=frames.sampling,
                                       frame_padding=frames.padding,
                                       segments=policy if policy is not None else False,
                                       frame_dtype=kept)


def _block(items: list[str], rank: int, size: int) -> list[str]:
    """The ``rank``-th of ``size`` contiguous blocks of ``items`` (sizes differ by at most 1)."""
    return items[len(items) * rank // size: len(items) * (rank + 1) // size]


def _part_folders(out: Path) -> list[Path]:
    """``parts/rank-R`` folders holding a manifest, in rank order, then the Ray build's
    ``parts/ray`` (:mod:`dicosa.index.ray_build`) if it holds one."""
    found = [p for p in (out / PARTS).glob("rank-*")
             if p.name.removeprefix("rank-").isdigit() and (p / "manifest.json").is_file()]
    ranks = sorted(found, key=lambda p: int(p.name.removeprefix("rank-")))
    return ranks + [p for p in [out / PARTS / RAY_PART] if (p / "manifest.json").is_file()]


def _unlinked(top: VideoIndex, out: Path, model: DiCoSA
              ) -> Iterator[tuple[str, int, list[str], dict | None]]:
    """``(name, count, paths, sha256)`` of every part shard the index does not list yet, in
    the order they are linked. A part of another model or frame protocol raises ValueError
    (as a resume does)."""
    linked = {shard.name for shard in top.store.shards}
    for folder in _part_folders(out):
        part = VideoIndex.load(folder, model, device=top.device)
        check_frames(folder, part.frames, top.frames.sampling, top.frames.padding)
        for shard in part.store.shards:
            name = f"{PARTS}/{folder.name}/{shard.name}"
            if name not in linked:
                ids = np.arange(shard.first_id, shard.first_id + shard.count)
                yield name, shard.count, sorted(set(part.store.table.paths(ids))), shard.sha256


def merge_parts(top: VideoIndex, out: Path, pending: list[str], reports: list[dict],
                meta: dict | None) -> None:
    """Link every unlinked part shard into ``top`` (the rows a changed file had before give
    way to its new ones), record the skips, write the manifest."""
    found = list(_unlinked(top, out, top.model))
    if found:  # one transaction: the first stages take every new row at once
        with top.transaction():
            top.remove([path for _, _, paths, _ in found for path in paths])
            top.link_shards([(name, count, sha256) for name, count, _, sha256 in found])
    retried = set(pending)
    top.skipped = ([s for s in top.skipped if s[0] not in retried]
                   + [tuple(s) for r in reports for s in r["skipped"]])
    top.text_only = [tuple(t) for r in reports for t in r["text_only"]]
    top.partial = [tuple(t) for r in reports for t in r["partial"]]
    top.meta.update(meta or {})
    top.save(out)  # builds and saves the first stage over every row, then the manifest
    log.info("merged %d shard(s) from %d process(es): %d videos in %s", len(found),
             len(reports), len(top), out)
