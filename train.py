"""Train DiCoSA on one benchmark.

    python train.py --dataset msrvtt                       # configs/msrvtt.yaml
    accelerate launch --multi_gpu --num_processes 4 train.py --dataset msrvtt train.lr=5e-5
    torchrun --nproc_per_node 2 train.py --dataset synthetic   # 2 CPU processes (gloo)
    python train.py --config configs/synthetic.yaml train.epochs=2 data.root=data/synthetic
    python train.py --dataset msrvtt --resume              # continue <output_dir>/last.pt

``--dataset NAME`` and ``--config NAME`` find the configs shipped with dicosa from any folder.
Positional ``section.key=value`` arguments override the YAML config (docs/training.md).
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
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.select_on_test:
        overrides.append("train.select_on_test=true")
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
