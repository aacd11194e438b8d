"""Progress that suits where it is written: a tqdm bar on a terminal, log lines elsewhere.

A bar redraws itself with carriage returns, which a file, a pipe or a CI log keeps as
thousands of partial lines. :func:`progress` therefore draws a bar only when its stream is a
terminal; anywhere else it writes one plain line each time another ``every_percent`` of the
total is done or ``every_s`` seconds have passed (whichever comes first, but never two within
``min_interval_s``: a loop done in seconds writes its last line only), and one when it
closes, each with the count, the rate and the latest ``set_postfix`` values.

Both kinds answer the part of tqdm's interface dicosa uses: iteration, ``update``,
``set_postfix``, ``close`` and ``with``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["LogProgress", "NoProgress", "progress"]


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             unit: str = "it", initial: int = 0, enabled: bool = True, leave: bool = True,
             stream: TextIO | None = None, every_percent: float = 20.0,
             every_s: float = 60.0, min_interval_s: float = 5.0) -> Any:
    """A progress display over ``iterable`` (or updated by hand up to ``total``).

    Args:
        enabled: False shows nothing (no tqdm object at all: even a disabled one takes
            tqdm's global lock, which a process forked while it is held inherits locked).
        leave: on a terminal, keep the finished bar (False: erase it); a log keeps its lines.
        stream: where to write (default: standard error, read when called).
        every_percent, every_s, min_interval_s: how often the log lines come where there is
            no terminal.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if not enabled:
        return NoProgress(iterable)
    stream = stream if stream is not None else sys.stderr
    if _is_terminal(stream):
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial,
                    file=stream, dynamic_ncols=True, leave=leave)
    return LogProgress(iterable, total=total, desc=desc, unit=unit, initial=initial,
                       stream=stream, every_percent=every_percent, every_s=every_s,
                       min_interval_s=min_interval_s)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class NoProgress:
    """Shows nothing; iterates ``iterable`` unchanged."""

    def __init__(self, iterable: Iterable | None = None):
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self.iterable if self.iterable is not None else ())

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogProgress(NoProgress):
    """One line per ``every_percent`` of ``total`` or per ``every_s`` seconds (at least
    ``min_interval_s`` apart), and one at the end:
    ``DESC: 40/100 video (40%), 12.5 video/s, 8 s[, key=value ...]``."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None, desc: str,
                 unit: str, initial: int, stream: TextIO, every_percent: float = 20.0,
                 every_s: float = 60.0, min_interval_s: float = 5.0, clock=time.monotonic):
        super().__init__(iterable)
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n = self._written = self._start_n = initial
        self.every_percent, self.every_s, self.clock = every_percent, every_s, clock
        self.min_interval_s = min_interval_s
        self._start = self._last_time = clock()
        self._postfix: dict[str, Any] = {}
        self._closed = False

    def __iter__(self) -> Iterator:
        for item in super().__iter__():
            yield item
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        since = now - self._last_time
        if since >= self.min_interval_s and (self._step_passed() or since >= self.every_s):
            self._write(now)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        self._postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.n != self._written:
                self._write(self.clock())

    def _step_passed(self) -> bool:
        """Whether ``n`` reached another ``every_percent`` of the total since the last line."""
        if not self.total:
            return False
        step = max(1.0, self.total * self.every_percent / 100)
        return int(self.n / step) > int(self._written / step)

    def _write(self, now: float) -> None:
        elapsed = now - self._start
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        extra = "".join(f", {k}={v}" for k, v in self._postfix.items())
        label = f"{self.desc}: " if self.desc else ""
        self.stream.write(f"{label}{done} {self.unit}{share}, {rate:.3g} {self.unit}/s, "
                          f"{elapsed:.0f} s{extra}\n")
        self.stream.flush()
        self._written, self._last_time = self.n, now
