"""One index built on a Ray cluster: ``dicosa index FOLDER --out INDEX --engine ray``.

One Ray Data pipeline (its workers: :mod:`dicosa.index.ray_work`), one video per block: CPU
tasks decode, a pool of actors encodes (the model loaded once in each), CPU tasks write shard
files into ``INDEX/parts/ray/`` (a folder every node reaches). The driver links each shard
into that part as its record arrives, and at the end merges the part into the index as a
multi-process build does (:func:`~dicosa.index.parallel.merge_parts`). ``docs/search.md``
("On Ray") gives the faults it survives and how to run it on a cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..model import DiCoSA
from ..progress import progress as show_progress
from .listing import list_videos
from .parallel import (
    PARTS,
    RAY_PART,
    BuildReport,
    merge_parts,
    open_part,
    pending_videos,
)
from .video_index import VideoIndex

__all__ = ["RayBuildReport", "RaySettings", "build_index_on_ray", "ray_cluster"]

log = logging.getLogger(__name__)

_FAILED = "failed on every try (its worker died or raised each time; the Ray logs say why)"


@dataclass
class RaySettings:
    """Where a Ray build runs and what each stage asks of the cluster."""

    address: str | None = None  # an existing cluster; None: see ray_cluster
    encoders: int | None = None  # encoder actors (default: one per GPU; without GPUs, 1)
    encoder_cpus: float = 1.0  # CPUs each encoder actor holds
    decode_cpus: float = 1.0  # CPUs each decode task holds
    encoder_threads: int | None = None  # torch threads of a CPU encoder (None: its node's cores)
    tries: int = 3  # runs of one call before its videos are tried one by one
    # A local cluster's CPUs (default: the machine's, plus the encoders' where there is no
    # GPU: the encoding process shares the cores with the decoders, as a single-process
    # build's does with its DataLoader workers), and its session folder (default: a new
    # temporary one, deleted after).
    cpus: int | None = None
    temp_dir: str | None = None


@dataclass
class RayBuildReport(BuildReport):
    """What :func:`build_index_on_ray` did, beside :class:`BuildReport`'s counts."""

    nodes: int = 0  # nodes whose workers decoded or encoded
    encoders: int = 0
    retried: int = 0  # videos run again one per call after their call failed on every try
    # seconds summed over the workers (decode, encode, write) and the build's wall time
    seconds: dict[str, float] = field(default_factory=dict)


def build_index_on_ray(
    model: DiCoSA,
    videos: str | os.PathLike | Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    ray_settings: RaySettings | None = None,
    batch_size: int = 16,
    shard_size: int = 256,
    meta: dict | None = None,
    progress: bool = True,
    titles: dict[str, str] | str | os.PathLike | None = None,
    lock_timeout: float | None = None,
    **stage,
) -> RayBuildReport:
    """:meth:`VideoIndex.build` into ``out_dir`` on a Ray cluster (:func:`ray_cluster`).

    ``batch_size``: videos per encoder call at most (clips are encoded together; fewer
    where the job is small, see :meth:`_Plan.call_size`); ``shard_size``: rows per shard
    file at most (a file also ends at 65,536 frames, as a single process cuts them).
    ``stage``: :meth:`VideoIndex.create_or_resume`'s options. The index's writer lock is
    held from the listing to the merge.
    """
    from ..search.title_fusion import normalise_titles

    settings = ray_settings or RaySettings()
    out = Path(out_dir)
    started = time.perf_counter()
    listed = list_videos(videos)  # a folder that does not exist: nothing written
    top = VideoIndex.create_or_resume(model, out, lock_timeout=lock_timeout, **stage)
    with top.writing():
        pending = pending_videos(top, out, listed)
        part = open_part(model, out / PARTS / RAY_PART, top.frames,
                         top.segments.as_dict() if top.segments is not None else None,
                         top.store.frame_dtype)
        journal, encoders = _Journal(part, pending, progress), 0
        if pending:
            named = normalise_titles(titles)
            with ray_cluster(settings) as ray:
                plan = _Plan.make(ray, settings, model, part, batch_size, shard_size)
                encoders = plan.encoders
                journal.run(plan.pipeline(ray, pending, named,
                                          plan.call_size(len(pending), batch_size)))
                retry = journal.missing()
                if retry:
                    log.warning("%d video(s) failed on every try in a batch; running them "
                                "one per call", len(retry))
                    journal.retried = len(retry)
                    journal.run(plan.pipeline(ray, retry, named, 1))
        journal.close()
        merge_parts(top, out, pending, [journal.report()], meta)
        _remove_strays(part)
    return journal.build_report(top, encoders, time.perf_counter() - started)


@contextlib.contextmanager
def ray_cluster(settings: RaySettings) -> Iterator:
    """``ray``, connected: to the cluster this process is already connected to, else to the
    one at ``settings.address`` or ``$RAY_ADDRESS``, else to a local cluster for this call
    (in a temporary folder of its own), stopped when it ends."""
    try:
        import ray
    except ImportError:
        raise ValueError("indexing on Ray needs Ray: pip install 'dicosa[ray]'") from None
    if ray.is_initialized():
        yield ray
        return
    temp, address = None, settings.address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as exc:
            raise ValueError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    else:
        temp = settings.temp_dir or tempfile.mkdtemp(prefix="dicosa-ray-")
        ray.init(num_cpus=_local_cpus(settings), _temp_dir=temp, include_dashboard=False,
                 log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if temp is not None and settings.temp_dir is None:
            shutil.rmtree(temp, ignore_errors=True)


def _local_cpus(settings: RaySettings) -> int:
    """A local cluster's CPUs (see :class:`RaySettings`)."""
    if settings.cpus is not None:
        return settings.cpus
    import torch

    cores = os.cpu_count() or 1
    if torch.cuda.is_available():
        return cores
    return cores + round((settings.encoders or 1) * settings.encoder_cpus)


@dataclass
class _Plan:
    """The pipeline's stages and what each asks of the cluster."""

    model: DiCoSA
    part: VideoIndex
    encoders: int
    gpus: bool
    settings: RaySettings
    shard_size: int

    @classmethod
    def make(cls, ray, settings: RaySettings, model: DiCoSA, part: VideoIndex,
             batch_size: int, shard_size: int) -> _Plan:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        encoders = settings.encoders or max(1, gpus)
        return cls(model, part, encoders, gpus > 0, settings, shard_size)

    def call_size(self, videos: int, batch_size: int) -> int:
        """Videos per encoder call: ``batch_size``, or fewer, so that each encoder gets at
        least 4 calls. An encoder call waits until its videos are decoded, so a call of the
        whole job would leave the encoders idle while every video is decoded."""
        return max(1, min(batch_size, videos // (4 * self.encoders)))

    def pipeline(self, ray, paths: list[str], titles: dict[str, str], batch_size: int):
        """The Dataset of write records over ``paths`` (lazy: iterating it runs the job)."""
        from .ray_work import EncodeVideos, decode_videos, write_shards

        part, retries = self.part, self.settings.tries - 1
        rows = [{"seq": i, "path": p, "title": titles.get(p, "")} for i, p in enumerate(paths)]
        data = ray.data.from_items(rows, override_num_blocks=len(rows))
        data.context.max_errored_blocks = -1  # a call that failed on every try is dropped
        data.context.enable_progress_bars = False
        policy = part.segments
        with warnings.catch_warnings():
            # Ray 2.60 takes a task's retries and an actor's restarts only as free remote
            # arguments, which it marks deprecated (for 2.64) without a named replacement;
            # the extra pins ray below 2.64
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            data = data.map_batches(
                decode_videos, batch_size=1, num_cpus=self.settings.decode_cpus,
                fn_kwargs={"num_frames": self.model.config.num_frames,
                           "image_size": self.model.image_size, "frames": part.frames,
                           "segments": policy},
                max_retries=retries)
            data = data.map_batches(
                EncodeVideos, batch_size=batch_size, num_cpus=self.settings.encoder_cpus,
                num_gpus=1 if self.gpus else None,
                compute=ray.data.ActorPoolStrategy(size=self.encoders,
                                                   max_tasks_in_flight_per_actor=2),
                fn_constructor_kwargs={"model": [ray.put(self.model)], "frames": part.frames,
                                       "segments": policy, "batch_size": batch_size,
                                       "threads": self.settings.encoder_threads},
                max_restarts=-1, max_task_retries=retries)
            return data.map_batches(
                write_shards, batch_size=self.shard_size, num_cpus=0,
                fn_kwargs={"folder": str(part.directory),
                           "frame_dtype": part.store.frame_dtype,
                           "window": policy.window if policy is not None else None,
                           "shard_size": self.shard_size},
                max_retries=retries)


class _Journal:
    """The driver's side of the job: links each written shard into the part's manifest as
    its record arrives, and keeps the skipped videos, the timings and the progress."""

    def __init__(self, part: VideoIndex, pending: list[str], progress: bool):
        self.part = part
        self.pending = pending
        self.linked: set[str] = set(part.paths)
        self.skipped: dict[str, str] = {}
        self.text_only: list[tuple[str, str]] = []
        self.partial: list[tuple[str, str]] = []
        self.encoded = 0
        self.retried = 0
        self.nodes: set[str] = set()
        self.seconds = {"decode_s": 0.0, "encode_s": 0.0, "write_s": 0.0}
        self.bar = show_progress(total=len(pending), desc="indexing videos on Ray",
                                 unit="video", enabled=progress)

    def run(self, records) -> None:
        for record in records.iter_rows():
            for shard in record["shards"]:
                self._link(shard)
            for path, reason in record["skipped"]:
                log.warning("skipping %s: %s", path, reason)
                self.skipped[path] = reason
            self.text_only += [tuple(t) for t in record["text_only"]]
            self.partial += [tuple(t) for t in record["partial"]]
            self.nodes.update(record["nodes"])
            for key in self.seconds:
                self.seconds[key] += float(record[key])
            self.bar.update(len(record["paths"]))

    def _link(self, shard: dict) -> None:
        paths = set(shard["paths"])
        if paths & self.linked:  # a retried call wrote these videos again: linked once
            log.warning("shard %s holds videos already linked; left out", shard["name"])
            return
        self.part.link_shards([(shard["name"], int(shard["count"]), shard["sha256"])])
        self.linked |= paths
        self.encoded += len(paths)

    def missing(self) -> list[str]:
        """The pending videos neither linked nor skipped."""
        return [p for p in self.pending if p not in self.linked and p not in self.skipped]

    def close(self) -> None:
        for path in self.missing():
            log.warning("skipping %s: %s", path, _FAILED)
            self.skipped[path] = _FAILED
        self.bar.close()

    def report(self) -> dict:
        """This job's report as :func:`~dicosa.index.parallel.merge_parts` takes it."""
        return {"encoded": self.encoded, "skipped": list(self.skipped.items()),
                "text_only": self.text_only, "partial": self.partial}

    def build_report(self, top: VideoIndex, encoders: int, wall: float) -> RayBuildReport:
        return RayBuildReport(top, encoders, self.encoded, [self.encoded],
                              nodes=len(self.nodes), encoders=encoders,
                              retried=self.retried,
                              seconds={**{k: round(v, 3) for k, v in self.seconds.items()},
                                       "wall_s": round(wall, 3)})


def _remove_strays(part: VideoIndex) -> None:
    """Delete the shard files in the part's folder that its manifest does not name (written
    by a try that was killed or whose record never arrived), under the index's lock."""
    named = {f"{s.name}.{ext}" for s in part.store.shards for ext in ("safetensors", "csv")}
    for path in part.directory.iterdir():
        stray = path.name.startswith("shard-") and path.name not in named
        if path.is_file() and (stray or ".tmp-" in path.name):
            path.unlink(missing_ok=True)
