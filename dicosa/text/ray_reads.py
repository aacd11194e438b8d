"""Speech and on-screen text read by the workers of a Ray cluster.

:func:`ray_reads` gives the text plugin (:class:`~dicosa.plugins.text.TextPlugin`'s
``reads``) a way to run its reading jobs (a few whole videos' rows each) on a pool of Ray
actors, each holding its speech recogniser (loaded once) and running Tesseract or the
recogniser on its node, the videos' files read from the folder every node reaches. What comes
back, a job at a time, is lines and records; the driver alone writes the text index. A job
whose worker fails on every try gives nothing back: its rows get no record, and the next
``index`` run reads them again (as a source that could not run).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .extract import ReadJob, ReadOutcome, TextSettings, read_jobs
from .speech import make_recognizer

__all__ = ["ReadText", "ray_reads"]


class ReadText:
    """A Ray actor's reader: the recogniser loaded once, each job read afresh."""

    def __init__(self, settings: TextSettings):
        self.settings = settings
        self.recognizer = make_recognizer(settings.speech) if settings.speech else None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outcomes = np.empty(len(batch["job"]), dtype=object)
        outcomes[:] = list(read_jobs(self.settings, batch["job"], self.recognizer))
        return {"outcome": outcomes}


def ray_reads(ray, readers: int, cpus: float = 1.0):
    """Reading on ``readers`` actors of ``cpus`` CPUs each, of the cluster ``ray`` (the
    module, connected) is connected to."""

    def reads(settings: TextSettings, jobs: list[ReadJob]) -> Iterator[ReadOutcome]:
        rows = [{"job": job} for job in jobs]
        data = ray.data.from_items(rows, override_num_blocks=len(rows))
        data.context.max_errored_blocks = -1
        data.context.enable_progress_bars = False
        data = data.map_batches(ReadText, batch_size=1, num_cpus=cpus,
                                compute=ray.data.ActorPoolStrategy(size=min(readers,
                                                                            len(rows))),
                                fn_constructor_kwargs={"settings": settings})
        for row in data.iter_rows():
            yield tuple(row["outcome"])

    return reads
