"""``python -m dicosa``: the same command line as the installed ``dicosa`` (:mod:`dicosa.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
