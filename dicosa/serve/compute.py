"""The one thread that runs a service process's torch work.

PyTorch's CPU kernels run their parallel parts on OpenMP (libgomp). Every OS thread that
starts a parallel region gets its own team of worker threads, and while more threads are under
libgomp's management than there are cores, every team's workers sleep between regions (its
throttled spin), so each region pays for waking them. So a service process whose torch runs
several threads opens its index, ranks, builds pages and reopens the index on one
:class:`ComputeThread`, and no other thread of it runs torch: one team, spinning as it would
in a script. With one torch thread there are no teams to keep apart, and calls run where they
are made.

The compute thread releases the GIL in each of the hundreds of torch calls of a batch and
must take it back from whichever request thread holds it then; CPython makes it wait up to
its switch interval (5 ms by default), which turns a batch's rerank beside a busy request
thread into seconds: a service process sets :data:`SWITCH_INTERVAL_S`.

A search's large buffers (the candidates' frames, their dequantised blocks, a timeline's
rows: megabytes each) are freed when it ends. glibc's malloc maps a buffer over its threshold
(128 KiB, raised only by what the process happened to free before) apart and unmaps it on
free, so the next search faults every page of it in again: at 1,000 hours ~1,300 minor faults
a search and a tenth of a ranker's time. A service process keeps them in its heap instead
(:func:`keep_freed_buffers`).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["HEAP_BUFFER_BYTES", "SWITCH_INTERVAL_S", "ComputeThread", "freeze_heap",
           "keep_freed_buffers"]

T = TypeVar("T")

# How long a thread holding the GIL may keep it from one that asks (module docstring).
SWITCH_INTERVAL_S = 0.001
# Buffers up to this size come from the heap and stay there once freed (module docstring); the
# heap's free top is given back to the system past four times it.
HEAP_BUFFER_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


class ComputeThread:
    """Runs callables on one thread, in the order they come, and waits for each.

    ``threads``: torch's intra-op threads on it (``torch.set_num_threads`` there; None:
    torch's count now). With one, calls run on the caller's thread (module docstring). A
    call made on the compute thread itself runs at once (no deadlock)."""

    def __init__(self, threads: int | None = None, name: str = "dicosa-compute"):
        import torch

        self.threads = threads or torch.get_num_threads()
        self._ident: int | None = None
        self._executor = (None if self.threads == 1 else
                          ThreadPoolExecutor(1, thread_name_prefix=name,
                                             initializer=self._start))

    @classmethod
    def for_process(cls, threads: int | None) -> ComputeThread:
        """The compute thread of a service process: ``threads`` (None: torch's default) set as
        the process's torch threads first, so that calls run inline use them too, and the
        process's GIL switch interval set to :data:`SWITCH_INTERVAL_S`."""
        if threads:
            import torch

            torch.set_num_threads(threads)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        return cls(threads)

    @property
    def inline(self) -> bool:
        """Whether calls run on the caller's thread (one torch thread)."""
        return self._executor is None

    def _start(self) -> None:
        import torch

        self._ident = threading.get_ident()
        torch.set_num_threads(self.threads)

    def run(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on the compute thread; its result, or its exception."""
        if self._executor is None or threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """No more calls; the thread ends once the calls it holds have run."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)


def freeze_heap(again: bool = False) -> None:
    """Move every object this process holds now out of the garbage collector's reach
    (``gc.freeze``), after one collection; ``again``: first give back the ones frozen before
    (a reopened index replaces the old one: its cycles are collected now, once).

    A service process holds the opened index's Python objects (millions at 1M videos), and
    CPython's full collection walks all of them: a pause of every search in flight. Frozen,
    they are never walked; reference counting still frees them. Only service processes do
    this, never a library call: it is the whole process's setting. A snapshot still in a
    search's hands at a reopening is frozen again, and reference cycles in it, if any, then
    stay until the process ends."""
    if again:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def keep_freed_buffers() -> bool:
    """Keep the buffers a search frees in this process's heap for the next one (module
    docstring): glibc's ``mallopt`` thresholds set to :data:`HEAP_BUFFER_BYTES`. A process
    then holds up to its largest search's buffers after it. True where set (glibc); elsewhere
    nothing changes. Like :func:`freeze_heap`, a service process's setting, never a library
    call's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BUFFER_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, 4 * HEAP_BUFFER_BYTES))
