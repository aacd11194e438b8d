"""``dicosa evaluate``: a trained checkpoint (or zero-shot CLIP) on a benchmark split
(``evaluate.py`` in a checkout runs the same).

    dicosa evaluate --split 1k-A --checkpoint runs/msrvtt/best.pt
    dicosa evaluate --dataset msvd --checkpoint runs/msvd/best.pt --postprocess dsl qbnorm
    dicosa evaluate --split 1k-A                        # zero-shot CLIP, untrained head

Prints t2v and v2t R@1/5/10/50, MdR and MnR (raw, then each post-processing, labelled) and
writes them with the config, the checkpoint's sha256 and the device to a JSON file.
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
    print(summary(evaluate(cfg, args.checkpoint, args.split, args.device, out=args.out)))
    return 0


def main(argv: list[str] | None = None, prog: str = "evaluate.py") -> None:
    """``evaluate.py``: this command with its own parser (errors: one line; see script_main)."""
    script_main(prog, __doc__, add_arguments, run, argv)
