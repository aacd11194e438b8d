"""What several commands share: model options, ``KEY=VALUE`` options, counts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..config import DEFAULT_CONFIG
from ..errors import USER_ERRORS, ConfigError

__all__ = ["model_options", "options", "positive_int", "script_main"]


def model_options(parser: argparse.ArgumentParser, default_config: str | None) -> None:
    parser.add_argument("--checkpoint", help="a dicosa training checkpoint (best.pt/last.pt)")
    parser.add_argument("--config", default=default_config,
                        help=f"model config when no checkpoint is given (default "
                             f"{default_config or DEFAULT_CONFIG})")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override, repeatable (e.g. --set model.num_frames=8)")


def options(pairs: Sequence[str]) -> dict:
    """``KEY=VALUE`` strings -> a dict; whole numbers become ints, true/false booleans."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"a stage option must be KEY=VALUE, got {pair!r}")
        lowered = value.lower()
        out[key] = (int(value) if value.lstrip("-").isdigit() else
                    lowered == "true" if lowered in ("true", "false") else value)
    return out


def positive_int(text: str) -> int:
    """argparse type: a count of at least 1 (argparse prints the message as one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def script_main(prog: str, doc: str | None,
                add_arguments: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int], argv: Sequence[str] | None) -> None:
    """A command as a script of its own (``train.py``, ``evaluate.py``): its own parser named
    ``prog``; a bad config key or value is a usage error (status 2), any other error the user
    can fix exits with ``PROG: error: ...`` (status 1)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ConfigError as exc:
        parser.error(str(exc))
    except USER_ERRORS as exc:
        sys.exit(f"{prog}: error: {exc}")
