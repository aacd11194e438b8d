"""How the service spreads its searches over processes and torch threads, and why.

This process ranks the searches (``rankers == 0``), or it keeps HTTP and the one batcher
while ``rankers`` processes rank whole batches (:mod:`dicosa.serve.rankers`). Given no
``--rankers``, :func:`choose` picks from the machine as docs/serve.md ("Where searches rank,
picked from the machine") says: rankers only on a CPU of 2 cores or more whose available
memory holds twice what they would (a ranker holds about what the server holds, and twice
that while it reopens the index).

Threads: one process runs ``--threads`` or torch's default (every core); a ranker runs
``--threads`` or ``cores // rankers`` while another ranker is busy and every core when it
ranks alone, and the server process then runs one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RANKERS", "Topology", "choose"]

RANKERS = 2  # the ranker processes a CPU of 2 cores or more gets (module docstring)
_GIB = 1 << 30


@dataclass(frozen=True)
class Topology:
    """Where searches are ranked: ``rankers`` processes (0: this one) and their threads."""

    rankers: int = 0
    threads: int | None = None  # torch threads of whoever ranks (None: torch's default); a
    # ranker's while another ranker is busy
    alone_threads: int | None = None  # a ranker's while it ranks alone (None: ``threads``)
    chosen: str = "options"  # "options": as given; "machine": picked from the machine
    why: str = "this process"  # where searches rank and why, a phrase ("2 ranker processes: ...")

    @property
    def server_threads(self) -> int | None:
        """Torch threads of the server process (one where rankers rank)."""
        return 1 if self.rankers else self.threads

    def as_dict(self) -> dict:
        return {"rankers": self.rankers, "chosen": self.chosen, "why": self.why}


def choose(*, rankers: int | None, threads: int | None, device: str, cores: int,
           available: int, held: int) -> Topology:
    """The topology for ``rankers`` and ``threads`` as given (None: not given) on a machine
    of ``cores`` cores with ``available`` bytes of memory available, the server holding
    ``held`` bytes with the index open, searching on ``device`` (module docstring)."""
    if rankers is not None:
        why = (f"{rankers} ranker processes, as --rankers {rankers} says" if rankers else
               "this process, as --rankers 0 says")
        return _ranked_by(rankers, threads, cores, "options", why)
    if not device.startswith("cpu"):
        why = (f"this process: searches run on {device} (ranker processes each holding the "
               "model there are not measured)")
    elif cores < 2:
        why = "this process: 1 CPU core, none for a second process"
    elif not (available and held):
        why = "this process: the memory available could not be read"
    elif available < 2 * RANKERS * held:
        why = (f"this process: {RANKERS} ranker processes would hold ~"
               f"{RANKERS * held / _GIB:.1f} GiB (twice that while they reopen the index), "
               f"{available / _GIB:.1f} GiB is available")
    else:
        return _ranked_by(RANKERS, threads, cores, "machine", f"{RANKERS} ranker processes: "
                          f"{cores} CPU cores, {available / _GIB:.1f} GiB available, ~"
                          f"{held / _GIB:.1f} GiB each; on 2 cores they served 8 clients at "
                          "54.1 searches/s, p99 213 ms, against 44.6/s, 238 ms in one process "
                          "(100,000 videos, docs/serve.md)")
    return _ranked_by(0, threads, cores, "machine", why)

def _ranked_by(rankers: int, threads: int | None, cores: int, chosen: str,
               why: str) -> Topology:
    if not rankers:
        return Topology(0, threads, None, chosen, why)
    return Topology(rankers, threads or max(1, cores // rankers), max(1, cores), chosen, why)
