"""``python -m dicosa`` with every encoded batch slowed down by $DICOSA_TEST_ENCODE_DELAY
seconds, so that a test can kill a build while it is under way (run as a script by torchrun)."""

import os
import sys
import time

from dicosa.__main__ import main
from dicosa.index import VideoIndex

_encode = VideoIndex._encode


def _slow_encode(self, batch):
    time.sleep(float(os.environ.get("DICOSA_TEST_ENCODE_DELAY", "0")))
    return _encode(self, batch)


if __name__ == "__main__":
    VideoIndex._encode = _slow_encode
    sys.exit(main())
