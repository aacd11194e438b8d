"""``dicosa train``: train DiCoSA on one benchmark (``train.py`` in a checkout runs the same).

    dicosa train --dataset msrvtt                          # configs/msrvtt.yaml
    accelerate launch --multi_gpu --num_processes 4 -m dicosa train --dataset msrvtt train.lr=5e-5
    torchrun --nproc_per_node 2 -m dicosa train --dataset synthetic   # 2 CPU processes (gloo)
    dicosa train --config configs/synthetic.yaml train.epochs=2 data.root=data/synthetic
    dicosa train --dataset msrvtt --resume                 # continue <output_dir>/last.pt
    dicosa train --dataset synthetic --no-summary          # skip the first-stage summary

``--dataset NAME`` and ``--config NAME`` find the configs shipped with dicosa from any folder.
Positional ``section.key=value`` arguments override the YAML config (docs/training.md). The
run ends by fitting the distilled first-stage summary of best.pt on the training split
(best.summary.pt, which ``dicosa index`` uses); ``--no-summary`` (``train.fit_summary=false``)
skips it.
"""

from __future__ import annotations

import argparse

from .common import script_main

__all__ = ["add_arguments", "add_parser", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", help="use the shipped configs/<dataset>.yaml (default: "
                                          "msrvtt)")
    parser.add_argument("--config", help="a YAML config file, or the name of a shipped one "
                                         "(e.g. msrvtt-released), instead of --dataset's")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in train.output_dir from its last.pt")
    parser.add_argument("--select-on-test", action="store_true",
                        help="choose best.pt on the test split (not comparable with papers "
                             "that select on validation data; recorded in the outputs)")
    parser.add_argument("--no-summary", action="store_true",
                        help="do not fit best.pt's first-stage summary after training (search "
                             "then keeps less of DiCoSA's ranking unless one is fitted later "
                             "with 'dicosa heads train summary')")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")


def add_parser(commands) -> None:
    p = commands.add_parser("train", help="train DiCoSA on a benchmark (configs/NAME.yaml)",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config import resolve_config
    from ..training import train

    overrides = list(args.overrides)
    if args.select_on_test:
        overrides.append("train.select_on_test=true")
    if args.no_summary:
        overrides.append("train.fit_summary=false")
    run_dir = train(resolve_config(args.config, args.dataset, overrides), resume=args.resume)
    print(f"run folder: {run_dir}")
    return 0


def main(argv: list[str] | None = None, prog: str = "train.py") -> None:
    """``train.py``: this command with its own parser (errors: one line; see script_main)."""
    script_main(prog, __doc__, add_arguments, run, argv)
