"""Shot boundaries, from PySceneDetect's detectors fed the frames a decode already produces.

PySceneDetect (``scenedetect``) is the well-kept open detector of hard cuts: ``content``
(:class:`scenedetect.ContentDetector`: a jump in the HSV content between consecutive frames)
and ``adaptive`` (:class:`scenedetect.AdaptiveDetector`: the same score against a rolling
average, steadier under camera motion). Opening the file again through PySceneDetect's own
backends would decode it twice; instead :class:`ShotDetector` takes small BGR frames from the
one streaming decode (:mod:`dicosa.data.stream`), at most :data:`DETECT_FPS` a second, through
the detectors' documented ``process_frame`` / ``post_process`` interface.

A detector that cannot be imported or fails on a file is not fatal: :attr:`ShotDetector.error`
says why and the caller cuts the video into windows alone (and logs it).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DETECT_FPS", "DETECT_WIDTH", "ShotDetector"]

DETECT_FPS = 12.0  # frames a second given to the detector (every frame of slower video)
DETECT_WIDTH = 96  # pixels: the detector's frames are this wide (content scores are global)
_MIN_SHOT_S = 0.5  # the detector itself reports no two cuts closer than this


class ShotDetector:
    """Feed frames with :meth:`push` (in time order), then read :meth:`cuts`.

    Args:
        kind: ``"content"`` or ``"adaptive"``.
        fps: the video's frame rate; frames are thinned to at most :data:`DETECT_FPS`.
        threshold: the detector's threshold (None: PySceneDetect's default).
    """

    def __init__(self, kind: str, fps: float, threshold: float | None = None):
        self.kind = kind
        self.every = max(1, math.ceil(fps / DETECT_FPS)) if fps and fps > 0 else 1
        self.rate = (fps / self.every) if fps and fps > 0 else DETECT_FPS
        self.error: str | None = None
        self._times: list[float] = []
        self._cuts: list[int] = []
        self._seen = 0
        self._detector = None
        try:
            self._detector = self._make(kind, threshold)
        except Exception as exc:  # no scenedetect, or an option it refuses
            self.error = f"the {kind} shot detector is unavailable ({exc})"

    def _make(self, kind: str, threshold: float | None):
        from scenedetect import AdaptiveDetector, ContentDetector

        min_len = max(1, round(_MIN_SHOT_S * self.rate))
        if kind == "content":
            return ContentDetector(min_scene_len=min_len,
                                   **({} if threshold is None else {"threshold": threshold}))
        if kind == "adaptive":
            return AdaptiveDetector(min_scene_len=min_len,
                                    **({} if threshold is None
                                       else {"adaptive_threshold": threshold}))
        raise ValueError(f"unknown shot detector {kind!r}")

    def wants(self) -> bool:
        """Whether the next decoded frame should be pushed (the others are skipped)."""
        return self._detector is not None and self.error is None and (
            self._seen % self.every == 0)

    def push(self, time: float, image_bgr: np.ndarray) -> None:
        """One decoded frame at ``time`` seconds (call for every decoded frame, in order; the
        frames :meth:`wants` declines may pass None)."""
        take = self.wants()
        self._seen += 1
        if not take:
            return
        from scenedetect.common import FrameTimecode

        number = len(self._times)
        self._times.append(time)
        try:
            found = self._detector.process_frame(FrameTimecode(number, fps=self.rate),
                                                 image_bgr)
        except Exception as exc:
            self.error = f"the {self.kind} shot detector failed ({type(exc).__name__}: {exc})"
            return
        self._cuts.extend(int(tc.frame_num) for tc in found)

    def cuts(self) -> list[float]:
        """Times (seconds) at which a new shot begins, ascending; empty after a failure."""
        if self._detector is not None and self.error is None and self._times:
            from scenedetect.common import FrameTimecode

            try:
                last = FrameTimecode(len(self._times) - 1, fps=self.rate)
                self._cuts.extend(int(tc.frame_num) for tc in self._detector.post_process(last))
            except Exception as exc:
                self.error = (f"the {self.kind} shot detector failed "
                              f"({type(exc).__name__}: {exc})")
            self._detector = None  # post_process runs once
        if self.error is not None:
            return []
        return sorted({self._times[n] for n in self._cuts if 0 < n < len(self._times)})
