"""``dicosa index FOLDER --out INDEX``: encode videos into a searchable index."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from .common import model_options, options, positive_int

__all__ = ["add_parser", "run"]


def add_parser(commands) -> None:
    p = commands.add_parser("index", help="encode a folder of videos into a searchable index")
    p.add_argument("videos", help="folder of videos (searched recursively) or one video file")
    p.add_argument("--titles", help="titles sidecar: CSV with columns path,title or JSON "
                   "{path: title}; an undecodable video with a title is indexed text-only")
    p.add_argument("--out", required=True, help="index folder (resumed if it holds one: "
                                                "then, without --checkpoint or --config, with "
                                                "the model it recorded)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=None, help="decoding processes")
    p.add_argument("--shard-size", type=int, default=256, help="videos per shard file")
    p.add_argument("--backend", default=None,
                   help="first stage over the videos' dense summaries: local (= faiss, HNSW in "
                        "the index folder, default), exact, or milvus (--uri; default a "
                        "milvus-lite file in the index folder); an existing index keeps its own")
    p.add_argument("--stage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a first-stage setting, repeatable (e.g. index=ivfpq, storage=fp16)")
    p.add_argument("--uri", help="Milvus: a file ending in .db (milvus-lite) or "
                                 "http://host:19530 (a Milvus server)")
    p.add_argument("--head", metavar="HEAD.pt",
                   help="a lexical head (heads train lexical / d2s): store each video's word "
                        "vector in a sparse stage beside the dense one, for search --mode")
    p.add_argument("--concepts", metavar="HEAD.pt",
                   help="a concepts head (heads train concepts): store each video's concept "
                        "code and record the head, so that search answers 'A without B' "
                        "without --concepts")
    p.add_argument("--sparse-backend", choices=("exact", "seismic"), default=None,
                   help="the --head's sparse stage: exact (scipy inverted index, the default) "
                        "or seismic (approximate, for large collections; pip install "
                        "pyseismic-lsr); search reopens the same one")
    p.add_argument("--sparse-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a seismic setting, repeatable (e.g. heap_factor=0.8, query_cut=16, "
                        "n_postings=6000; docs/search.md)")
    p.add_argument("--summary", "--summary-head", dest="summary", metavar="SUMMARY",
                   help="what the dense first stage compares per video: distilled (the "
                        "summary the checkpoint carries; the default when it carries one), "
                        "frames (every frame, a video ranked by its best frame: the default "
                        "without one; not on milvus), confidence (one vector per video) or a "
                        "summary head file (heads train summary)")
    p.add_argument("--rate", type=float, default=None, metavar="FPS",
                   help="frames per second decoded from a video longer than one window of the "
                        "model's N frames (default 1, the released protocol's rate); such a "
                        "video is cut into shots and windows, searched as moments")
    p.add_argument("--detector", choices=("content", "adaptive", "none"), default=None,
                   help="shot detector for long videos (PySceneDetect; default adaptive); "
                        "none: windows only")
    p.add_argument("--min-shot", type=float, default=None, metavar="SECONDS",
                   help="a shorter shot is joined to a neighbour (default 1)")
    p.add_argument("--no-segments", action="store_true",
                   help="keep one row of N frames per video, spread over the whole file, "
                        "as indexes before moments did")
    p.add_argument("--speech", metavar="ENGINE",
                   help="transcribe what is said: pocketsphinx (English model in its wheel; "
                        "fast, inaccurate) or whisper:MODEL (faster-whisper, recommended: a "
                        "model name fetched on first use, or a local model folder); off stops "
                        "transcribing new videos. An existing index keeps its own")
    p.add_argument("--ocr", action=argparse.BooleanOptionalAction, default=None,
                   help="read on-screen text with Tesseract on --ocr-frames frames per video "
                        "(Debian: tesseract-ocr tesseract-ocr-eng)")
    p.add_argument("--ocr-frames", type=positive_int, default=None,
                   help="frames read by --ocr per video (default 3)")
    p.add_argument("--subtitles", action=argparse.BooleanOptionalAction, default=None,
                   help="read subtitles beside the videos (name.srt, name.en.vtt, ...) and "
                        "inside them (default: on; cheap)")
    p.add_argument("--frame-dtype", choices=("float16", "int8"), default=None,
                   help="how a new index keeps frame features: float16 (default) or int8 with "
                        "one scale per frame (half the bytes; the rerank's scores stay within a "
                        "stated bound of float16's, docs/index-format.md); an existing index "
                        "keeps its own")
    p.add_argument("--engine", choices=("processes", "ray"), default="processes",
                   help="processes: this process, or those of a torchrun/accelerate launch "
                        "(the default); ray: one Ray Data pipeline, decode tasks and encoder "
                        "actors on a Ray cluster (pip install 'dicosa[ray]'; docs/search.md)")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="--engine ray: the cluster to run on (host:6379, as ray start --head "
                        "prints it); default a local cluster started and stopped with the "
                        "command")
    p.add_argument("--ray-encoders", type=positive_int, default=None, metavar="N",
                   help="--engine ray: encoder actors (default one per GPU; without GPUs, 1)")
    p.add_argument("--ray-decode-cpus", type=float, default=1.0, metavar="CPUS",
                   help="--engine ray: CPUs each decode task holds (default 1)")
    p.add_argument("--no-wait", action="store_true",
                   help="fail at once (one sentence) when another process is writing the index, "
                        "instead of waiting for it")
    model_options(p, None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..index.listing import require_videos
    from ..index.parallel import PeerFailed, build_index
    from ..index.plugins import chosen_plugins
    from ..index.ray_build import build_index_on_ray

    require_videos(args.videos)
    with _cluster(args) as ray:  # on Ray, the build and the text sources run in one job
        # What a plugin cannot take (an unknown --speech engine, seismic not installed) fails
        # here, and a head of another model below, before any video is encoded.
        plugins = [plugin for plugin in chosen_plugins(
            {**vars(args), "sparse_option": options(args.sparse_option), "ray": ray}).values()
            if plugin is not False]
        model, source, frames = _model(args)
        summary = _summary(args, model)
        for plugin in plugins:
            plugin.validate(model)
        common = {"batch_size": args.batch_size, "shard_size": args.shard_size,
                  "meta": {"model": source}, "backend": args.backend or "default",
                  "uri": args.uri, "stage_options": options(args.stage_option) or None,
                  "titles": args.titles, "frame_sampling": frames.sampling,
                  "frame_padding": frames.padding, "segments": _segments(args),
                  "lock_timeout": 0 if args.no_wait else None,
                  "frame_dtype": args.frame_dtype, **summary}
        try:
            report = (build_index_on_ray(model, args.videos, args.out,
                                         ray_settings=_ray_settings(args), **common)
                      if ray is not None else
                      build_index(model, args.videos, args.out, num_workers=args.num_workers,
                                  **common))
        except PeerFailed:
            # The main process prints why and exits non-zero, which fails the launch; a
            # non-zero status here could let torchrun stop the main process before it has
            # printed.
            return 0
        index = report.index
        if index is None:  # not the main process: it reports for all
            return 0
        for plugin in plugins:  # attached under the writer lock (the text read now), said
            before = index.plugins.get(plugin.key)
            with index.writing():
                index.use(plugin)
            for line in plugin.report(before):
                print(line)
    _report(index, report, args.out)
    return 0


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator:
    """``ray`` connected to the cluster ``--engine ray`` runs on (None: another engine)."""
    if args.engine != "ray":
        yield None
        return
    from ..index.parallel import launch_size
    from ..index.ray_build import ray_cluster

    if launch_size() > 1:
        raise ValueError("--engine ray runs one driver: start it with plain 'dicosa index', "
                         "not under torchrun or accelerate launch")
    if args.num_workers is not None:
        raise ValueError("--num-workers sets the decoding processes of --engine processes; "
                         "on Ray, decode tasks take --ray-decode-cpus each")
    with ray_cluster(_ray_settings(args)) as ray:
        yield ray


def _ray_settings(args: argparse.Namespace):
    from ..index.ray_build import RaySettings

    return RaySettings(address=args.ray_address, encoders=args.ray_encoders,
                       decode_cpus=args.ray_decode_cpus)


def _report(index, report, out: str) -> None:
    for path, reason in index.text_only:
        print(f"  indexed from its title alone (undecodable): {path}: {reason}")
    encoded = ("" if report.encoded is None else
               f" (encoded {report.encoded} now, in {report.processes} process(es): "
               f"{' + '.join(map(str, report.per_process))})")
    if hasattr(report, "nodes"):  # a Ray build
        work = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in report.seconds.items())
        encoded = (f" (encoded {report.encoded} now on Ray: {report.nodes} node(s), "
                   f"{report.encoders} encoder(s); {work})")
    rows = len(index.store)
    moments = f" ({rows} moments to search)" if rows != len(index) else ""
    print(f"indexed {len(index)} videos{moments} into {out}{encoded}"
          + (f"; skipped {len(index.skipped)} unreadable file(s):" if index.skipped else ""))
    for path, reason in index.skipped:
        print(f"  {path}: {reason}")
    if index.partial:
        print(f"{len(index.partial)} partial video(s), indexed from what decodes "
              "('dicosa check' lists every partial video of the index):")
    for path, damage in index.partial:
        print(f"  {path}: {damage}")


def _model(args: argparse.Namespace):
    """``(model, source, frames)``: the ``--checkpoint``/``--config`` one, or, with neither,
    the model an index already in ``--out`` recorded (adding to it needs nothing else), or
    the zero-shot preset for a new index."""
    from ..loading import load_model, model_from_source

    out = Path(args.out)
    if args.checkpoint is None and args.config is None and (out / "manifest.json").is_file():
        from ..index.manifest import Manifest

        existing = Manifest.read(out)  # only its record: the index itself opens once, later
        source = existing.meta.get("model")
        if source:
            model = model_from_source({**source, "overrides": [*source.get("overrides", ()),
                                                                *args.set]})
            return model, source, existing.frames
    return load_model(args.checkpoint, args.config, args.set)


def _segments(args: argparse.Namespace) -> dict | bool | None:
    """The ``segments`` option of the build: False (``--no-segments``), the settings given,
    or None (a new index: the defaults; an existing one: its own)."""
    given = {"rate": args.rate, "detector": args.detector, "min_shot": args.min_shot}
    given = {k: v for k, v in given.items() if v is not None}
    if args.no_segments:
        if given:
            raise ValueError("--no-segments keeps one row per video: drop --rate, --detector "
                             "and --min-shot, or --no-segments")
        return False
    return given or None


def _summary(args: argparse.Namespace, model) -> dict:
    """The dense stage's summary (``--summary``, else the one the checkpoint carries, else
    ``frames``), checked before any video is encoded; one line says which, and what recall
    to expect. An index that exists keeps its own unless ``--summary`` is given."""
    from ..heads.summary import default_summary

    if args.summary is None and (Path(args.out) / "manifest.json").is_file():
        return {}
    kwargs, notice = default_summary(args.checkpoint, model, args.summary, args.backend)
    print(notice)
    return kwargs
