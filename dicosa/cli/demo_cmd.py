"""``dicosa demo --out outputs/demo``: the whole pipeline on generated clips."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="synthetic data -> train -> evaluate -> visualise "
                                         "-> index -> search, on CPU")
    p.add_argument("--out", default="outputs/demo", help="folder for every output")
    p.add_argument("--quick", action="store_true", help="a few training steps (smoke test)")
    p.add_argument("--config", default="configs/synthetic.yaml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override, repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(args.out, quick=args.quick, config=args.config, overrides=args.set)
    return 0
