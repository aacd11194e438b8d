"""One writer at a time per index folder, across processes and threads; readers never block.

The lock is an advisory ``flock`` on ``INDEX/.writer.lock`` (through ``filelock``): the kernel
releases it when the holding process exits for any reason, SIGKILL included, so a crash never
leaves a stale lock. A second writer waits (saying once who holds it) or, with ``timeout=0``,
fails at once with :class:`IndexBusyError`. Readers take no lock: they read the committed
manifest and the immutable files it names. Network filesystems: ``docs/data-safety.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import IndexBusyError
from ..files import storage_error

__all__ = ["IndexBusyError", "WriterLock"]

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
OWNER_FILE = ".writer.json"  # who holds it: for the waiting writer's message only


class WriterLock:
    """Re-entrant writer lock of one index folder (see the module docstring).

    ``timeout``: seconds to wait before :class:`IndexBusyError` (None: wait as long as it
    takes; 0: do not wait).
    """

    def __init__(self, directory: str | os.PathLike, timeout: float | None = None):
        self.directory = Path(directory)
        self.timeout = timeout
        self._lock = FileLock(self.directory / LOCK_FILE, thread_local=False)
        self._threads = threading.RLock()  # threads sharing this object take turns
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> WriterLock:
        self._threads.acquire()
        try:
            if self._depth == 0:
                self._acquire()
        except BaseException:
            self._threads.release()
            raise
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._lock.release()
        self._threads.release()

    def _acquire(self) -> None:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            self._wait()
        except OSError as exc:  # cannot create the lock file: read-only, permission
            raise storage_error(exc, self.directory / LOCK_FILE, "locking") from None
        self._write_owner()

    def _wait(self) -> None:
        holder = self._owner()
        if self.timeout == 0:
            raise IndexBusyError(f"the index at {self.directory} is being written by {holder}; "
                                 "try again once it has finished")
        log.warning("waiting for %s to finish writing the index at %s", holder, self.directory)
        start = time.monotonic()
        try:
            self._lock.acquire(timeout=-1 if self.timeout is None else self.timeout)
        except Timeout:
            raise IndexBusyError(f"the index at {self.directory} was still being written by "
                                 f"{holder} after {self.timeout:g} s") from None
        log.info("got the index's writer lock after %.1f s", time.monotonic() - start)

    def _owner(self) -> str:
        try:
            info = json.loads((self.directory / OWNER_FILE).read_text())
            return f"process {info['pid']} ({info['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def _write_owner(self) -> None:
        command = " ".join(os.path.basename(a) if i == 0 else a
                           for i, a in enumerate(sys.argv[:4])) or "python"
        tmp = self.directory / f".{OWNER_FILE}.tmp-{os.getpid()}"
        with contextlib.suppress(OSError):  # informational only; whole or absent
            tmp.write_text(json.dumps({"pid": os.getpid(), "command": command,
                                       "since": time.time()}))
            os.replace(tmp, self.directory / OWNER_FILE)
