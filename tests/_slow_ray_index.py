"""``dicosa`` for a Ray build whose workers are slowed, watched and broken on purpose (run as
a script, or :func:`slow_workers` given to ``ray.init`` as the job's setup hook).

Every worker of the job runs :func:`slow_workers` when it starts: each decoded item's
encoding waits $DICOSA_TEST_ENCODE_DELAY seconds, each video encoded is appended to
$DICOSA_TEST_ENCODE_LOG, and a worker that decodes a file whose name holds ``crash-worker``
dies of SIGSEGV, as a decoder crashing on a file would. So a test can kill a worker or the
whole job while it is under way, count what was encoded, and see a video fail on every try.
"""

import functools
import os
import signal
import sys
import time

VARIABLES = ("DICOSA_TEST_ENCODE_DELAY", "DICOSA_TEST_ENCODE_LOG")
CRASH = "crash-worker"


def slow_workers() -> None:
    from dicosa.index.decode import VideoItems
    from dicosa.index.encode import Encoder

    take, items = Encoder.take, VideoItems.items

    def slow_take(self, item):
        time.sleep(float(os.environ.get("DICOSA_TEST_ENCODE_DELAY") or 0))
        log = os.environ.get("DICOSA_TEST_ENCODE_LOG")
        if log and item["kind"] in ("clip", "end"):
            with open(log, "a") as f:  # one short append: whole lines from every worker
                f.write(item["path"] + "\n")
        return take(self, item)

    def crashing_items(self, path):
        if CRASH in os.path.basename(path):
            os.kill(os.getpid(), signal.SIGSEGV)
        return items(self, path)

    Encoder.take, VideoItems.items = slow_take, crashing_items


def runtime_env() -> dict:
    """The job's runtime environment: the hook, and this process's test variables."""
    return {"worker_process_setup_hook": "tests._slow_ray_index.slow_workers",
            "env_vars": {name: os.environ[name] for name in VARIABLES if name in os.environ}}


if __name__ == "__main__":
    import ray

    from dicosa.__main__ import main

    ray.init = functools.partial(ray.init, runtime_env=runtime_env())
    sys.exit(main())
