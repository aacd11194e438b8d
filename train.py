"""Train DiCoSA on one benchmark.

    python train.py --dataset msrvtt                       # configs/msrvtt.yaml
    accelerate launch --multi_gpu --num_processes 4 train.py --dataset msrvtt train.lr=5e-5
    torchrun --nproc_per_node 2 train.py --dataset synthetic   # 2 CPU processes (gloo)
    python train.py --config configs/synthetic.yaml train.epochs=2 data.root=data/synthetic
    python train.py --dataset msrvtt --resume              # continue <output_dir>/last.pt
    python train.py --dataset synthetic --no-summary       # skip the first-stage summary

``--dataset NAME`` and ``--config NAME`` find the configs shipped with dicosa from any folder.
Positional ``section.key=value`` arguments override the YAML config (docs/training.md). The
run ends by fitting the distilled first-stage summary of best.pt on the training split
(best.summary.pt, which ``python -m dicosa index`` uses); ``--no-summary``
(``train.fit_summary=false``) skips it.
"""

from __future__ import annotations

import argparse
import sys

from dicosa.config import ConfigError, resolve_config
from dicosa.errors import USER_ERRORS
from dicosa.training import train


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
                             "with 'python -m dicosa heads train summary')")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.select_on_test:
        overrides.append("train.select_on_test=true")
    if args.no_summary:
        overrides.append("train.fit_summary=false")
    try:
        cfg = resolve_config(args.config, args.dataset, overrides)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        run_dir = train(cfg, resume=args.resume)
    except USER_ERRORS as exc:
        sys.exit(f"train.py: error: {exc}")
    print(f"run folder: {run_dir}")


if __name__ == "__main__":
    main()
