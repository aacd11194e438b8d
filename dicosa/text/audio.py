"""A video's sound as a stream of mono 16-bit chunks at a recogniser's sample rate.

:func:`audio_chunks` decodes the first audio stream with PyAV from a time to a time and
resamples it (``av.AudioResampler``: FFmpeg's swresample) to mono signed 16-bit at the rate
asked, yielding ``chunk_s`` seconds at a time: an hour of audio is never in memory at once
(16 kHz x 2 bytes = 115 MB an hour; one 30 s chunk is 1 MB).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["AudioChunk", "NoAudioError", "audio_chunks"]


class NoAudioError(ValueError):
    """A video whose sound cannot be read: no audio stream, or one that does not decode."""


AudioChunk = tuple[float, np.ndarray]  # (time of the first sample in s, int16 samples)


def audio_chunks(path: str | Path, rate: int, start: float = 0.0, end: float = float("inf"),
                 chunk_s: float = 30.0) -> Iterator[AudioChunk]:
    """Contiguous chunks of ``path``'s first audio stream between ``start`` and ``end``
    seconds, mono int16 at ``rate`` Hz, ``chunk_s`` seconds each (the last one shorter).

    Raises:
        NoAudioError: the file has no audio stream, or it cannot be opened or decoded.
    """
    import av

    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as exc:
        raise NoAudioError(f"{path} cannot be opened ({exc})") from None
    with container:
        if not container.streams.audio:
            raise NoAudioError(f"{path} has no audio stream")
        stream = container.streams.audio[0]
        size = max(1, int(chunk_s * rate))
        buffer, held, first = [], 0, None
        try:
            for t0, samples in _resampled(container, stream, rate, start, end):
                if first is None:
                    first = t0
                buffer.append(samples)
                held += len(samples)
                while held >= size:
                    joined = np.concatenate(buffer)
                    yield first, joined[:size]
                    first += size / rate
                    buffer, held = [joined[size:]], len(joined) - size
        except av.FFmpegError as exc:
            raise NoAudioError(f"the audio of {path} does not decode ({exc})") from None
        if held and first is not None:
            yield first, np.concatenate(buffer)


def _resampled(container, stream, rate: int, start: float, end: float
               ) -> Iterator[AudioChunk]:
    """Resampled pieces ``(time of their first sample, int16 [n])`` from ``start`` (samples
    before it dropped) until ``end``."""
    import av

    origin = (container.start_time or 0) / av.time_base  # times count from the file's start
    if start > 0:
        container.seek(int((start + origin) / stream.time_base), stream=stream,
                       backward=True)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    clock = None  # time of the next resampled sample
    for frame in container.decode(stream):
        if clock is None:
            clock = (float(frame.pts * stream.time_base) - origin if frame.pts is not None
                     else 0.0)
        for out in resampler.resample(frame):
            piece = out.to_ndarray().reshape(-1)
            t0, clock = clock, clock + len(piece) / rate
            kept = _between(t0, piece, rate, start, end)
            if kept is not None:
                yield kept
        if clock >= end:
            return
    for out in resampler.resample(None):
        kept = _between(clock, out.to_ndarray().reshape(-1), rate, start, end)
        if kept is not None:
            yield kept


def _between(t0: float, piece: np.ndarray, rate: int, start: float, end: float
             ) -> AudioChunk | None:
    """The part of ``piece`` (first sample at ``t0``) inside ``[start, end)``."""
    first = max(0, round((start - t0) * rate))
    last = len(piece) if end == float("inf") else min(len(piece),
                                                        round((end - t0) * rate))
    if last <= first:
        return None
    return t0 + first / rate, piece[first:last].astype(np.int16, copy=False)
