"""The command line (``dicosa``, the console script, or ``python -m dicosa``): a thin layer over
the library."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
