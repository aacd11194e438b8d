"""``dicosa check INDEX [--repair]``: verify an index folder, repair what is
derivable (:func:`dicosa.index.check.check_index`)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(commands) -> None:
    p = commands.add_parser("check", help="verify an index: shard checksums, stored features, "
                                          "first stages and caches against the store")
    p.add_argument("index", help="index folder")
    p.add_argument("--repair", action="store_true",
                   help="repair what can be: encode again from their videos the rows whose "
                        "features are damaged (where a video's file is gone or changed, its "
                        "rows are removed, and said), rebuild derivable files (first stages, "
                        "caches), delete files no commit names")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..index.check import check_index

    report = check_index(args.index, repair=args.repair)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1
