"""``dicosa`` with every decoded item's encoding slowed down by $DICOSA_TEST_ENCODE_DELAY
seconds, so that a test can kill a build while it is under way (run as a script by torchrun).
After the command it prints whether this process's process group was left open."""

import os
import sys
import time

import torch

from dicosa.__main__ import main
from dicosa.index.encode import Encoder

_take = Encoder.take


def _slow_take(self, item):
    time.sleep(float(os.environ.get("DICOSA_TEST_ENCODE_DELAY", "0")))
    return _take(self, item)


if __name__ == "__main__":
    Encoder.take = _slow_take
    code = main()
    print(f"process group open after the command: {torch.distributed.is_initialized()}")
    sys.exit(code)
