"""What the service reads of the machine it runs on: cores and memory (Linux's /proc; 0 where
it cannot be read, which every caller treats as "not known, do not count on it")."""

from __future__ import annotations

import os

__all__ = ["anonymous_bytes", "available_bytes", "cores"]


def cores() -> int:
    """The CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_bytes() -> int:
    """The memory Linux says new work can have without swapping (``MemAvailable``)."""
    return _kib_field("/proc/meminfo", "MemAvailable")


def anonymous_bytes() -> int:
    """The memory this process holds of its own (``RssAnon``: not the mapped files, whose
    pages the page cache shares between processes)."""
    return _kib_field("/proc/self/status", "RssAnon")


def _kib_field(path: str, name: str) -> int:
    try:
        with open(path) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields[name].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0
