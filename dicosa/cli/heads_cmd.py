"""``dicosa heads train KIND`` / ``heads info HEAD.pt``: heads on a frozen DiCoSA."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_parser"]


def add_parser(commands) -> None:
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
    p.set_defaults(func=run_train)
    p = head_commands.add_parser("info", help="what a head file holds and how it was trained")
    p.add_argument("head")
    p.set_defaults(func=run_info)


def run_train(args: argparse.Namespace) -> int:
    from ..heads.train import train_head

    path = train_head(args.kind, args.checkpoint, args.out, args.set, data_root=args.data_root,
                      seed=args.seed, device=args.device, progress=not args.quiet)
    print(f"trained the {args.kind} head on {args.checkpoint}: {path}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from ..heads.base import read_head_file

    state = read_head_file(args.head)
    facts = {"kind": state["kind"], "config": state["config"],
             "model_weights_sha256": state["fingerprint"]["weights_sha256"],
             "trained": state.get("trained", {})}
    print(json.dumps(facts, indent=1, default=str))
    return 0
