"""The command line's parser and dispatch: ``dicosa COMMAND ...`` (installed as a console
script; ``dicosa`` is the same), one module per command in this package, ``--help``
on each says what it takes. Building the parser imports no torch: each command imports what
it needs when it runs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import USER_ERRORS
from . import (
    check_cmd,
    convert_cmd,
    demo_cmd,
    evaluate_cmd,
    heads_cmd,
    index_cmd,
    search_cmd,
    train_cmd,
)

__all__ = ["build_parser", "main"]

log = logging.getLogger("dicosa")

USAGE = """Text-video retrieval with DiCoSA: index videos, search them, serve a page.

  dicosa index FOLDER --out INDEX [--checkpoint CKPT | --config CFG]
  dicosa search INDEX "a man is skiing" [-k 10] [--explain] [--json]
  dicosa serve INDEX [--port 8000]
  dicosa check INDEX [--repair]
  dicosa train --dataset msrvtt [section.key=value ...]
  dicosa evaluate --split 1k-A --checkpoint CKPT
  dicosa heads train KIND --checkpoint CKPT --out HEAD.pt
  dicosa convert RELEASED.pth --out dicosa.pt
  dicosa demo --out outputs/demo
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dicosa", description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--version", action="version", version=f"dicosa {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (index_cmd, search_cmd, train_cmd, evaluate_cmd, heads_cmd, convert_cmd,
                   demo_cmd, check_cmd):
        module.add_parser(commands)
    _add_serve(commands)
    return parser


def _add_serve(commands) -> None:
    try:
        from ..serve.cli import add_serve_parser
    except ImportError:  # the serve extra (FastAPI, uvicorn) is not installed
        p = commands.add_parser("serve", help="search service and web page (needs the serve "
                                              "extra: pip install 'dicosa[serve]')")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_no_serve)
        return
    add_serve_parser(commands)


def _no_serve(args: argparse.Namespace) -> int:
    raise ValueError("dicosa serve needs FastAPI and uvicorn: pip install 'dicosa[serve]'")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # dicosa's own messages at INFO; other libraries (open_clip is chatty) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        # Wrong inputs (a mismatched model, a missing index or config, a full disk) deserve
        # a sentence, not a traceback; --verbose keeps the traceback for debugging.
        if args.verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
