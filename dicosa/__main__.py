"""``python -m dicosa``: see :mod:`dicosa.cli`."""

import sys

from .cli import main
from .loading import load_model  # noqa: F401  (kept importable from here)

if __name__ == "__main__":
    sys.exit(main())
