"""Commands that set a limit or a parent-death signal in the child, then exec the program.

``subprocess``'s ``preexec_fn`` runs Python in a child forked from the test process, which has
threads (torch's pools, grpc's pollers after a Milvus test): a lock one of them held at the fork
stays held in the child, and grpc's fork handlers start pollers there, so the child can hang
before it ever execs (a restarted Milvus server did, once in a CI run: its log held one grpc
"epoll_wait error" line and nothing else for 180 s). A command from :func:`exec_with` starts a
fresh interpreter instead (``posix_spawn``/``vfork``, no Python before exec), which sets what
was asked and replaces itself with the program, keeping its pid, so killing ``Popen.pid`` kills
the program.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

_SET_THEN_EXEC = (
    "import ctypes, os, resource, sys\n"
    "max_bytes, death_signal = int(sys.argv[1]), int(sys.argv[2])\n"
    "if max_bytes >= 0:\n"
    "    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))\n"
    "if death_signal:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, death_signal)  # PR_SET_PDEATHSIG\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def exec_with(command: Sequence[str], *, max_file_bytes: int | None = None,
              kill_with_parent: bool = False) -> list[str]:
    """``command`` (its first item a path) run with a largest writable file size
    (RLIMIT_FSIZE) and/or SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG)."""
    max_bytes = -1 if max_file_bytes is None else max_file_bytes
    death_signal = int(signal.SIGKILL) if kill_with_parent else 0
    return [sys.executable, "-c", _SET_THEN_EXEC, str(max_bytes), str(death_signal),
            *command]
