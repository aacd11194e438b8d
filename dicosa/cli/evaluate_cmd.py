"""``dicosa evaluate``: a trained checkpoint (or zero-shot CLIP) on a benchmark split
(``evaluate.py`` in a checkout runs the same).

    dicosa evaluate --split 1k-A --checkpoint runs/msrvtt/best.pt
    dicosa evaluate --dataset msvd --checkpoint runs/msvd/best.pt --postprocess dsl qbnorm
    dicosa evaluate --split 1k-A                        # zero-shot CLIP, untrained head

Prints t2v and v2t R@1/5/10/50, MdR and MnR (raw, then each post-processing, labelled) and
writes them with the config, the checkpoint's sha256 and the device to a JSON file.

Moments in long videos (video-corpus moment retrieval through an index: every segment of every
video ranked for each caption; R@k at temporal IoU 0.5 and 0.7, within-video R@1, video R@k):

    dicosa evaluate --moments long-synthetic --root data/long_synthetic --checkpoint CKPT
    dicosa evaluate --moments long-synthetic-clips --root data/long_synthetic ...  # reference
    dicosa evaluate --moments didemo --root /data/didemo --checkpoint runs/didemo/best.pt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import script_main

__all__ = ["add_arguments", "add_parser", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", help="split to evaluate (default: the config's test split);"
                                        " implies the dataset when unambiguous (1k-A: msrvtt)")
    parser.add_argument("--dataset", help="use the shipped configs/<dataset>.yaml")
    parser.add_argument("--config", help="a YAML config file, or the name of a shipped one "
                                         "(e.g. msrvtt-released), instead of --dataset's")
    parser.add_argument("--checkpoint", type=Path,
                        help="best.pt/last.pt from training; omitted: zero-shot CLIP weights")
    parser.add_argument("--postprocess", nargs="*", choices=["dsl", "qbnorm"],
                        help="also report these, next to the raw numbers")
    parser.add_argument("--device", help="default: cuda when available")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("--moments", metavar="BENCHMARK",
                        help="moment retrieval instead: long-synthetic, long-synthetic-clips "
                             "(the same scenes as separate clips) or didemo")
    parser.add_argument("--root", type=Path,
                        help="--moments: the benchmark's folder (default the config's "
                             "data.root)")
    parser.add_argument("--candidates", type=int, default=None,
                        help="--moments: rows the first stage proposes (default: every row "
                             "scored by DiCoSA)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")


def add_parser(commands) -> None:
    p = commands.add_parser("evaluate", help="evaluate a checkpoint (or zero-shot CLIP) on a "
                                             "benchmark split", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config import resolve_config
    from ..evaluation import dataset_for_split, evaluate, summary

    overrides = list(args.overrides)
    if args.postprocess is not None:
        overrides.append(f"eval.postprocess={','.join(args.postprocess)}")
    dataset = args.dataset
    if dataset is None and args.config is None and args.split is not None:
        dataset = dataset_for_split(args.split)
    cfg = resolve_config(args.config, dataset, overrides)
    if args.moments:
        print(_moments(cfg, args))
        return 0
    print(summary(evaluate(cfg, args.checkpoint, args.split, args.device, out=args.out)))
    return 0


def _moments(cfg, args: argparse.Namespace) -> str:
    """``--moments``: the benchmark measured through an index, as a printed table."""
    from ..index.moment_eval import evaluate_benchmark
    from ..moment_metrics import format_moment_table

    results = evaluate_benchmark(cfg, args.checkpoint, args.moments, args.root or cfg.data.root,
                                 split=args.split, device=args.device,
                                 candidates=args.candidates, out=args.out)
    ranked = "every row" if args.candidates is None else f"{args.candidates} candidates"
    title = (f"{results['split']}: {results['videos']} videos, {results['rows']} rows ranked "
             f"({ranked}), checkpoint {results.get('checkpoint')} (chosen on "
             f"{results.get('selected_on')}), {results['device']}, {results['date']}")
    return format_moment_table(results, title) + f"\nwritten to {results['json_path']}"


def main(argv: list[str] | None = None, prog: str = "evaluate.py") -> None:
    """``evaluate.py``: this command with its own parser (errors: one line; see script_main)."""
    script_main(prog, __doc__, add_arguments, run, argv)
