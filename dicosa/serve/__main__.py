"""``dicosa.serve INDEX ...``: the serve command on its own (see ``cli.py``)."""

import sys

from .cli import main

sys.exit(main())
