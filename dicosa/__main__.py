"""Command line: ``python -m dicosa {index,search,heads,convert,demo} ...``.

    python -m dicosa index FOLDER --out INDEX [--checkpoint CKPT | --config CFG]
                           [--backend local|exact|milvus --uri URI] [--stage-option K=V]
                           [--head LEXICAL.pt]   (a sparse word stage beside the dense one)
                           [--sparse-backend exact|seismic --sparse-option K=V]
                           [--concepts HEAD.pt]  (concept codes for "A without B" searches)
    accelerate launch [--multi_gpu --num_processes P] -m dicosa index FOLDER --out INDEX ...
    torchrun --nproc_per_node P -m dicosa index FOLDER --out INDEX ...   (CPU processes)
                                              (each process encodes its share; resumable)
    python -m dicosa search INDEX "a man is skiing" -k 10 [--candidates 1000 | --exhaustive]
                           [--checkpoint CKPT] [--json]
                           [--mode dense|lexical|bow|hybrid]   (which first stage proposes:
                                              default hybrid with a --head index, else dense)
                           [--head LEXICAL.pt]  (instead of the lexical head the index recorded)
                           [--concepts HEAD.pt] [--exclude B ...] [--exclusion-set K=V]
                                              ("A without B" queries; --concepts once, then
                                              the index remembers the head)
                           [--mul2vec HEAD.pt | --fusion | --no-fusion] [--beta-semantic B]
                           [--beta-title B] [--trust T]
                                              (titles, text-only entries; recorded: later
                                              searches fuse the same way)
                           [--explain]        (with --concepts, --mul2vec, --fusion or an
                                              index built with --head: the words shared)
    python -m dicosa heads train KIND --checkpoint CKPT --out HEAD.pt [--set key=value]
    python -m dicosa heads info HEAD.pt
    python -m dicosa convert RELEASED.pth --out dicosa.pt [--config CFG] [--set key=value]
    python -m dicosa demo --out outputs/demo [--quick]

Without ``--checkpoint`` the model is built from a config (default ``configs/msrvtt.yaml``,
i.e. OpenAI's CLIP weights). Random-weight configs (``pretrained: null``) are seeded with
``train.seed`` so that ``index`` and ``search`` build the same model. ``search`` with neither
option uses the model that ``index`` recorded in the index's manifest, and the heads it
recorded (``--head``, ``--concepts`` given to ``index`` or to an earlier ``search``), unless
``search --head``/``--concepts`` names another file.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from .config import load_config
from .data.protocol import FrameProtocol
from .errors import USER_ERRORS
from .model import DiCoSA

log = logging.getLogger("dicosa")

DEFAULT_CONFIG = "configs/msrvtt.yaml"


def load_model(checkpoint: str | None, config: str | None,
               overrides: Sequence[str] = ()) -> tuple[DiCoSA, dict, FrameProtocol]:
    """The model named on the command line, a record of where it came from, and the frames
    it reads.

    Returns:
        ``(model, source, frames)``; ``source`` is ``{"checkpoint": path}`` or ``{"config":
        path, "overrides": [...]}`` with absolute paths, enough for :func:`load_model` to
        rebuild the same model; ``frames`` is the config's (a checkpoint's: the one it was
        trained with) ``data.frame_sampling`` and ``data.frame_padding``.
    """
    if checkpoint is not None:
        from .checkpoint import load

        model, cfg = load(checkpoint)
        return (model.eval(), {"checkpoint": str(Path(checkpoint).resolve())},
                FrameProtocol.of(cfg.data))
    from .config import find_config

    path = find_config(config or DEFAULT_CONFIG)
    cfg = load_config(path, overrides)
    if cfg.model.pretrained is None:
        # Random initial weights must be the same in every process that uses this index.
        torch.manual_seed(cfg.train.seed)
    model = DiCoSA.from_config(cfg.model).eval()
    return (model, {"config": str(path.resolve()), "overrides": list(overrides)},
            FrameProtocol.of(cfg.data))


def _cmd_index(args: argparse.Namespace) -> int:
    from .parallel_index import PeerFailed, build_index
    from .search.lexical_index import attach_lexical, check_sparse_backend, load_lexical_head

    sparse_options = _options(args.sparse_option) if args.sparse_option else None
    if args.head is None and (args.sparse_backend or sparse_options):
        raise ValueError("--sparse-backend and --sparse-option set up the sparse stage of a "
                         "lexical head: add --head HEAD.pt")
    if args.sparse_backend or sparse_options:
        # seismic missing or a bad option fails before any video is encoded
        check_sparse_backend(args.sparse_backend or "exact", sparse_options)
    model, source, frames = load_model(args.checkpoint, args.config, args.set)
    # A head of another model fails before anything is encoded.
    if args.head is not None:
        load_lexical_head(args.head, model)
    if args.concepts is not None:
        from .heads import load_head

        load_head(args.concepts, model, kind="concepts")
    try:
        report = build_index(model, args.videos, args.out, batch_size=args.batch_size,
                             num_workers=args.num_workers, shard_size=args.shard_size,
                             meta={"model": source}, backend=args.backend, uri=args.uri,
                             stage_options=_options(args.stage_option), titles=args.titles,
                             frame_sampling=frames.sampling, frame_padding=frames.padding,
                             **_summary(args.summary_head, model))
    except PeerFailed:
        # The main process prints why and exits non-zero, which fails the launch; a non-zero
        # status here could let torchrun stop the main process before it has printed.
        return 0
    index = report.index
    if index is None:  # not the main process: it reports for all
        return 0
    if args.head is not None:
        lexical = attach_lexical(index, args.head, args.sparse_backend, sparse_options)
        backend = "" if lexical.stage.backend == "exact" else f" ({lexical.stage.backend})"
        print(f"sparse {lexical.head.kind} stage{backend}: {len(lexical.stage)} videos, "
              f"{len(lexical.head.words)} words")
    if args.concepts is not None:
        from .search.exclusion_index import attach_exclusion

        attach_exclusion(index, args.concepts)
        print(f"concept codes of {len(index)} videos, for 'A without B' searches")
    for path, reason in index.text_only:
        print(f"  indexed from its title alone (undecodable): {path}: {reason}")
    encoded = ("" if report.encoded is None else
               f" (encoded {report.encoded} now, in {report.processes} process(es): "
               f"{' + '.join(map(str, report.per_process))})")
    print(f"indexed {len(index)} videos into {args.out}{encoded}"
          + (f"; skipped {len(index.skipped)} unreadable file(s):" if index.skipped else ""))
    for path, reason in index.skipped:
        print(f"  {path}: {reason}")
    return 0


def _summary(head_path: str | None, model) -> dict:
    """The dense stage's summary for ``index --summary-head``: its head, checked against the
    model before any video is encoded."""
    if head_path is None:
        return {}
    from .heads import load_head

    return {"summary": "distilled", "summary_head": load_head(head_path, model, kind="summary")}


def _cmd_search(args: argparse.Namespace) -> int:
    from .index import VideoIndex
    from .search.query import QueryError

    if not args.query.strip():
        raise QueryError("the query is empty: give the text to search for")
    index = VideoIndex.load(args.index)
    if args.checkpoint is None and args.config is None and "model" in index.meta:
        source = index.meta["model"]
        model = load_model(source.get("checkpoint"), source.get("config"),
                           source.get("overrides", ()))[0]
    else:
        model = load_model(args.checkpoint, args.config, args.set)[0]
    index.attach(model, strict=not args.no_strict)
    lexical = _attach_lexical(index, args.head)
    mode = _search_mode(lexical, args)
    rerank = _exclusion(index, args)
    fusion = _attach_fusion(index, args)
    if args.explain and rerank is None and fusion is None and lexical is None:
        raise QueryError("--explain needs a head to explain: --concepts HEAD.pt (exclusion), "
                         "--mul2vec HEAD.pt / --fusion (score parts) or an index built with "
                         "--head HEAD.pt (words)")
    candidates = None if args.exhaustive else args.candidates
    results, stats = index.search_with_stats(args.query, k=args.k, candidates=candidates,
                                             exclude=args.exclude, mode=mode)
    excluded = _explained(rerank, results, args)
    words = _words(index, lexical, args, mode, results)
    # One "explain" object per result: the exclusion's keys and the words' keys side by side.
    explained = [{**(excluded[i] if excluded else {}), **(words[i] if words else {})}
                 for i in range(len(results))] if excluded or words else []
    parts = _fusion_parts(index, fusion, args, results)
    if args.json:
        print(json.dumps({"query": args.query, "index": str(args.index), "mode": mode,
                          "exclude": args.exclude, "candidates": candidates, "stats": stats,
                          "results": [{"rank": r, **hit.as_dict(),
                                       **({"explain": explained[r - 1]} if explained else {})}
                                      for r, hit in enumerate(results, 1)],
                          **({"fusion": parts} if parts is not None else {})}))
        return 0
    how = ("every video scored by DiCoSA" if candidates is None else
           f"{stats['candidates'][0]} candidates from the {stats['stage']} stage ({mode} mode) "
           "reranked by DiCoSA")
    print(f'top {len(results)} of {len(index)} videos for "{args.query}" ({how})')
    print(f"{'rank':>4}  {'score':>8}  {'stage':<10}  path")
    for rank, hit in enumerate(results, 1):
        print(f"{rank:>4}  {hit.score:>8.4f}  {hit.stage:<10}  {hit.path}")
        if excluded:
            from .search.exclusion_index import format_explanation

            print(f"{'':>16}{format_explanation(excluded[rank - 1])}")
        if words:
            from .search.lexical_index import format_words

            print(f"{'':>16}{format_words(words[rank - 1])}")
    if parts is not None:
        from .search.fusion import format_parts

        print(format_parts(parts))
    return 0


def _exclusion(index, args: argparse.Namespace):
    """The exclusion hook of ``--concepts`` or of the head the index recorded (None without
    either); exclusions need one."""
    from .search.query import QueryError

    head = args.concepts or _recorded_head(index, "concepts", "--concepts")
    if head is None:  # "A without B" in the text: the index warns it is ignored
        if args.exclude:
            raise QueryError("--exclude needs a concepts head: add --concepts HEAD.pt (train "
                             "one with 'python -m dicosa heads train concepts')")
        return None
    from .search.exclusion_index import attach_exclusion, recorded_config

    # --exclusion-set changes the recorded settings (and is recorded): later searches keep it.
    return attach_exclusion(index, head, recorded_config(index, **_options(args.exclusion_set)))


def _attach_lexical(index, head: str | None):
    """The lexical stage of ``head`` (``search --head``), else of the head recorded in the
    index's manifest by ``index --head`` (None without either)."""
    head = head or _recorded_head(index, "lexical", "--head")
    if head is None:
        return None
    from .search.lexical_index import attach_lexical

    return attach_lexical(index, head)  # an overriding head is recorded in place of the old


def _recorded_head(index, key: str, option: str) -> str | None:
    """The head file recorded in ``index.meta[key]`` (None: none is); a recorded file that
    is no longer there is one sentence naming the option that replaces it."""
    path = (index.meta.get(key) or {}).get("head")
    if path and not Path(path).is_file():
        raise FileNotFoundError(f"the {key} head recorded in the index, {path}, is missing; "
                                f"pass {option} HEAD.pt with its new location")
    return path


def _search_mode(lexical, args: argparse.Namespace) -> str:
    """``--mode``, by default hybrid where the index has a lexical stage, else dense."""
    from .search.query import QueryError

    if args.mode is None:
        return "dense" if lexical is None else "hybrid"
    if args.mode != "dense" and lexical is None:
        raise QueryError(f"--mode {args.mode} needs an index with a lexical head: build it with "
                         "'python -m dicosa index FOLDER --out INDEX --head HEAD.pt'")
    return args.mode


def _words(index, lexical, args: argparse.Namespace, mode: str, results) -> list[dict]:
    """Each result's words shared with the query (``--explain`` on a lexical index)."""
    if lexical is None or not args.explain:
        return []
    from .search.lexical_index import explain_words

    return explain_words(index, lexical, args.query, results, mode)


def _explained(rerank, results, args: argparse.Namespace) -> list[dict]:
    if rerank is None or not args.explain:
        return []
    from .search.exclusion_index import explain_hits

    return explain_hits(rerank, results)


def _attach_fusion(index, args: argparse.Namespace):
    """The fusion hook the search options ask for (--mul2vec HEAD or --fusion), else the one
    the index recorded (None: neither, or --no-fusion). Weights not given on the command line
    are the recorded ones while the kind (Mul2vec or late) stays the same."""
    recorded = index.meta.get("fusion")
    if args.no_fusion and (args.mul2vec is not None or args.fusion):
        from .search.query import QueryError

        raise QueryError("--no-fusion searches without fusion: drop --mul2vec/--fusion, or "
                         "--no-fusion")
    if args.no_fusion or (args.mul2vec is None and not args.fusion and recorded is None):
        return None
    from .search.fusion import attach_fusion

    head = args.mul2vec
    if head is None and not args.fusion:
        head = _recorded_head(index, "fusion", "--mul2vec")  # None: late fusion recorded
    same_kind = recorded is not None and (recorded.get("head") is None) == (head is None)
    weights = {name: recorded.get(name) if getattr(args, name) is None and same_kind
               else getattr(args, name) for name in ("beta_semantic", "beta_title", "trust")}
    return attach_fusion(index, head, **weights)


def _fusion_parts(index, fusion, args: argparse.Namespace, results) -> list[dict] | None:
    if fusion is None or not args.explain:
        return None
    from .search.fusion import explain_hits

    return explain_hits(index, fusion, args.query, results)


def _cmd_heads_train(args: argparse.Namespace) -> int:
    from .heads.train import train_head

    path = train_head(args.kind, args.checkpoint, args.out, args.set, data_root=args.data_root,
                      seed=args.seed, device=args.device, progress=not args.quiet)
    print(f"trained the {args.kind} head on {args.checkpoint}: {path}")
    return 0


def _cmd_heads_info(args: argparse.Namespace) -> int:
    from .heads.base import read_head_file

    state = read_head_file(args.head)
    facts = {"kind": state["kind"], "config": state["config"],
             "model_weights_sha256": state["fingerprint"]["weights_sha256"],
             "trained": state.get("trained", {})}
    print(json.dumps(facts, indent=1, default=str))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert_checkpoint

    out = convert_checkpoint(args.source, args.out, args.config, args.set)
    print(f"converted {args.source} into {out}; evaluate it with: python evaluate.py "
          f"--config {args.config or 'configs/msrvtt-released.yaml'} --checkpoint {out} "
          "--postprocess qbnorm data.root=...")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out, quick=args.quick, config=args.config, overrides=args.set)
    return 0


def _model_options(parser: argparse.ArgumentParser, default_config: str | None) -> None:
    parser.add_argument("--checkpoint", help="a dicosa training checkpoint (best.pt/last.pt)")
    parser.add_argument("--config", default=default_config,
                        help=f"model config when no checkpoint is given (default "
                             f"{default_config or DEFAULT_CONFIG})")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override, repeatable (e.g. --set model.num_frames=8)")


def _options(pairs: Sequence[str]) -> dict:
    """``KEY=VALUE`` strings -> a dict; whole numbers become ints, true/false booleans."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"a stage option must be KEY=VALUE, got {pair!r}")
        lowered = value.lower()
        out[key] = (int(value) if value.lstrip("-").isdigit() else
                    lowered == "true" if lowered in ("true", "false") else value)
    return out


def _positive_int(text: str) -> int:
    """argparse type: a count of at least 1 (argparse prints the message as one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dicosa", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("index", help="encode a folder of videos into a searchable index")
    p.add_argument("videos", help="folder of videos (searched recursively) or one video file")
    p.add_argument("--titles", help="titles sidecar: CSV with columns path,title or JSON "
                   "{path: title}; an undecodable video with a title is indexed text-only")
    p.add_argument("--out", required=True, help="index folder (resumed if it holds one)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=None, help="decoding processes")
    p.add_argument("--shard-size", type=int, default=256, help="videos per shard file")
    p.add_argument("--backend", default="local",
                   help="first stage over the videos' dense summaries: local (= faiss, HNSW in "
                        "the index folder, default), exact, or milvus (--uri; default a "
                        "milvus-lite file in the index folder)")
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
                        "n_postings=6000; README, 'The seismic backend')")
    p.add_argument("--summary-head", metavar="HEAD.pt",
                   help="a summary head (heads train summary): the dense stage compares its "
                        "distilled vectors instead of the default 'confidence' summary")
    _model_options(p, None)
    p.set_defaults(func=_cmd_index)

    p = commands.add_parser("search", help="rank the videos of an index for a text query")
    p.add_argument("index", help="index folder written by 'index'")
    p.add_argument("query", help="the text to search for")
    p.add_argument("--mul2vec", metavar="HEAD.pt",
                   help="fuse DiCoSA with a trained Mul2vec head (finds text-only entries)")
    p.add_argument("--fusion", action="store_true",
                   help="late fusion with the titles (no head): DiCoSA + beta * title match")
    p.add_argument("--beta-semantic", type=float, default=None,
                   help="weight of the Mul2vec part (default 0.2)")
    p.add_argument("--beta-title", type=float, default=None,
                   help="weight of the title part (default 0.2 without a head, 0 with one)")
    p.add_argument("--trust", type=float, default=None,
                   help="how far a missing part follows the part a row has (default 0.5)")
    p.add_argument("--no-fusion", action="store_true",
                   help="search without the fusion the index recorded (the record stays)")
    p.add_argument("--explain", action="store_true",
                   help="why each result ranks where it does: the concept dimensions it "
                        "matched (with --concepts), its score parts, dicosa / semantic / "
                        "title / fused (with --mul2vec or --fusion), and the words it shares "
                        "with the query (on an index built with --head)")
    p.add_argument("--mode", choices=("dense", "lexical", "bow", "hybrid"), default=None,
                   help="which first stage proposes candidates: dense (the dense stage), "
                        "lexical (the head's query on the sparse stage), bow (the query's own "
                        "words on the sparse stage, no network) or hybrid (dense and lexical "
                        "united; the default on an index built with --head, else dense)")
    p.add_argument("-k", type=_positive_int, default=10, help="number of results")
    p.add_argument("--candidates", type=_positive_int, default=1000,
                   help="videos the first stage proposes for DiCoSA to rerank (default 1000)")
    p.add_argument("--exhaustive", action="store_true",
                   help="score every video with DiCoSA (the reference; slow on large indexes)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--exclude", action="append", default=[], metavar="B",
                   help="leave out videos showing B (repeatable; needs --concepts)")
    p.add_argument("--concepts", metavar="HEAD.pt",
                   help="a concepts head: answers 'A without B' and --exclude; recorded in "
                        "the index, so later searches use it without this option (which "
                        "still overrides it)")
    p.add_argument("--head", metavar="HEAD.pt",
                   help="a lexical head instead of the one the index recorded (e.g. its file "
                        "moved); recorded in its place")
    p.add_argument("--exclusion-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an ExclusionConfig field: top_k_results, mass_fraction, candidates, "
                        "window, presence_threshold (the per-frame check; off by default; "
                        "choose it on validation with benchmarks/exclusion.py)")
    p.add_argument("--no-strict", action="store_true",
                   help="warn instead of failing when the model differs from the index's")
    _model_options(p, None)
    p.set_defaults(func=_cmd_search)

    heads = commands.add_parser("heads", help="heads trained on a frozen DiCoSA (lexical, d2s, "
                                              "concepts, mul2vec)")
    head_commands = heads.add_subparsers(dest="heads_command", required=True)
    p = head_commands.add_parser("train", help="train a head on a checkpoint's training split")
    p.add_argument("kind", help="lexical, d2s, concepts or mul2vec")
    p.add_argument("--checkpoint", required=True, help="the frozen dicosa checkpoint")
    p.add_argument("--out", required=True, help="the head file to write")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the head's config, repeatable")
    p.add_argument("--data-root", help="dataset folder (default: the checkpoint's data.root)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_heads_train)
    p = head_commands.add_parser("info", help="what a head file holds and how it was trained")
    p.add_argument("head")
    p.set_defaults(func=_cmd_heads_info)

    p = commands.add_parser("convert", help="turn a checkpoint of the authors' released code "
                                            "into a dicosa checkpoint")
    p.add_argument("source", help="the released best.pth / pytorch_model.bin.N")
    p.add_argument("--out", required=True, help="the dicosa checkpoint to write")
    p.add_argument("--config", help="run config stored with it (default: "
                                    "configs/msrvtt-released.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override, repeatable")
    p.set_defaults(func=_cmd_convert)

    p = commands.add_parser("demo", help="synthetic data -> train -> evaluate -> visualise "
                                         "-> index -> search, on CPU")
    p.add_argument("--out", default="outputs/demo", help="folder for every output")
    p.add_argument("--quick", action="store_true", help="a few training steps (smoke test)")
    p.add_argument("--config", default="configs/synthetic.yaml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override, repeatable")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # dicosa's own messages at INFO; other libraries (open_clip is chatty) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        # Wrong inputs (a mismatched model, a missing index or config) deserve a sentence,
        # not a traceback; --verbose keeps the traceback for debugging.
        if args.verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
