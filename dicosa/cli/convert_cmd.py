"""``dicosa convert RELEASED.pth --out dicosa.pt``: the authors' checkpoint."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(commands) -> None:
    p = commands.add_parser("convert", help="turn a checkpoint of the authors' released code "
                                            "into a dicosa checkpoint")
    p.add_argument("source", help="the released best.pth / pytorch_model.bin.N")
    p.add_argument("--out", required=True, help="the dicosa checkpoint to write")
    p.add_argument("--config", help="run config stored with it (default: "
                                    "configs/msrvtt-released.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override, repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..convert import convert_checkpoint, summary_hint

    out = convert_checkpoint(args.source, args.out, args.config, args.set)
    print(f"converted {args.source} into {out}; evaluate it with: python evaluate.py "
          f"--config {args.config or 'configs/msrvtt-released.yaml'} --checkpoint {out} "
          "--postprocess qbnorm data.root=...")
    print(summary_hint(out))
    return 0
