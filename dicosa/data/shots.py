"""Shot boundaries, from PySceneDetect's detectors fed the frames a decode already produces.

PySceneDetect (``scenedetect``) offers ``content`` (:class:`scenedetect.ContentDetector`: a
jump in the HSV content between consecutive frames) and ``adaptive``
(:class:`scenedetect.AdaptiveDetector`: the same score against a rolling average of the frames
around it, steadier under camera motion). ``adaptive`` is the default, with a floor of
:data:`ADAPTIVE_FLOOR` on the content change (PySceneDetect's is 15) that catches jump cuts,
whose colours barely change (chosen with ``benchmarks/cuts.py``). :class:`ShotDetector` takes
small BGR frames from the one streaming decode (:mod:`dicosa.data.stream`) through the
detectors' ``process_frame`` / ``post_process`` interface, so the file is not decoded twice.
It takes every decoded frame: a cut's time is the first frame of the new shot, which a
detector shown every k-th frame places up to k - 1 frames late.

A detector that cannot be imported or fails on a file is not fatal: :attr:`ShotDetector.error`
says why and the caller cuts the video into windows alone (and logs it).
"""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["ADAPTIVE_FLOOR", "DETECT_WIDTH", "ShotDetector"]

ADAPTIVE_FLOOR = 7.0  # the adaptive detector's min_content_val (module docstring)

DETECT_WIDTH = 96  # pixels: the detector's frames are this wide (content scores are global)
_MIN_SHOT_S = 0.5  # the detector itself reports no two cuts closer than this
_UNKNOWN_FPS = 30.0  # frame numbers to detector time where the stream states no rate


class ShotDetector:
    """Feed frames with :meth:`push` (in time order), then read :meth:`cuts`.

    Args:
        kind: ``"content"`` or ``"adaptive"``.
        fps: the video's frame rate (every frame is given to the detector).
        threshold: the detector's threshold (None: PySceneDetect's default).
    """

    def __init__(self, kind: str, fps: float, threshold: float | None = None):
        self.kind = kind
        self.rate = fps if fps and fps > 0 else _UNKNOWN_FPS
        self.error: str | None = None
        self._times = array("d")  # [frames] seconds
        self._change = array("f")  # [frames] mean |difference| from the frame before (0-255)
        self._previous: np.ndarray | None = None
        self._cuts: list[int] = []
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
            return AdaptiveDetector(min_scene_len=min_len, min_content_val=ADAPTIVE_FLOOR,
                                    **({} if threshold is None
                                       else {"adaptive_threshold": threshold}))
        raise ValueError(f"unknown shot detector {kind!r}")

    def wants(self) -> bool:
        """Whether frames should still be pushed (not after a failure)."""
        return self._detector is not None and self.error is None

    def push(self, time: float, image_bgr: np.ndarray) -> None:
        """One decoded frame at ``time`` seconds (every decoded frame, in order)."""
        if not self.wants():
            return
        from scenedetect.common import FrameTimecode

        number = len(self._times)
        self._times.append(time)
        pixels = image_bgr.astype(np.int16)
        self._change.append(0.0 if self._previous is None else float(
            np.abs(pixels - self._previous).mean()))
        self._previous = pixels
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
        return [self._times[n] for n in self._numbers()]

    def changes(self) -> list[float]:
        """How much the picture changed at each of :meth:`cuts` (the mean absolute difference
        of the small frames, 0-255): which of two cuts close together is the real one."""
        return [] if self.error is not None else [float(self._change[n])
                                                  for n in self._numbers()]

    def _numbers(self) -> list[int]:
        return sorted({n for n in self._cuts if 0 < n < len(self._times)})
