"""``dicosa`` with every encoded batch slowed down by $DICOSA_TEST_ENCODE_DELAY
seconds, so that a test can kill a build while it is under way (run as a script by torchrun).
After the command it prints whether this process's process group was left open."""

import os
import sys
import time

import torch

from dicosa.__main__ import main
from dicosa.index import ingest

_encode = ingest.encode_batch


def _slow_encode(model, device, batch):
    time.sleep(float(os.environ.get("DICOSA_TEST_ENCODE_DELAY", "0")))
    return _encode(model, device, batch)


if __name__ == "__main__":
    ingest.encode_batch = _slow_encode
    code = main()
    print(f"process group open after the command: {torch.distributed.is_initialized()}")
    sys.exit(code)
