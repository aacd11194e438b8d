"""How a video's stored pixels are shown: its display rotation and its pixels' aspect ratio.

A phone stores a portrait video as landscape pixels and a *display matrix* that turns them
upright; a DVD or an anamorphic camera stores pixels that are wider (or narrower) than tall
and a *sample aspect ratio* (SAR) that stretches them back. A player applies both, so a frame
that enters the model, a thumbnail or the page must too, or it is sideways or squeezed.

PyAV reports each decoded frame's rotation (``VideoFrame.rotation``: degrees counter-clockwise,
from the display matrix; its flips are not applied) and the stream's SAR; it leaves the turn
to the caller, decord turns frames itself, neither applies the SAR (``docs/DATA.md``, "Notes
on decoding"). :class:`Display` holds both facts; :func:`upright` turns an array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Display", "display_of", "first_rotation", "quarter_turns", "shown_pixels",
           "upright"]


def quarter_turns(rotation: float | None) -> int:
    """A display rotation (degrees counter-clockwise) as quarter turns in 0..3 (0 for a
    rotation that is not a multiple of 90 degrees, which players do not apply either)."""
    if not rotation or not math.isfinite(rotation):
        return 0
    turns = rotation / 90
    return round(turns) % 4 if abs(turns - round(turns)) < 1e-3 else 0


def upright(pixels: np.ndarray, rotation: float | None) -> np.ndarray:
    """``[..., H, W, C]`` stored pixels turned as the display matrix says (a view)."""
    turns = quarter_turns(rotation)
    return np.rot90(pixels, turns, axes=(-3, -2)) if turns else pixels


def shown_pixels(frame, **scale) -> np.ndarray:
    """A decoded PyAV frame's uint8 RGB pixels ``[H, W, 3]`` as a player shows them: turned
    as its display matrix says. ``scale``: ``to_ndarray``'s ``width``, ``height`` (and
    ``interpolation``), the stored frame's size the decoder scales to before the turn."""
    return upright(frame.to_ndarray(format="rgb24", **scale), frame.rotation)


@dataclass(frozen=True)
class Display:
    """How a stream's stored ``width`` x ``height`` pixels are shown."""

    width: int  # stored pixels
    height: int
    rotation: int = 0  # degrees counter-clockwise: 0, 90, 180 or 270
    sar: float = 1.0  # the width of a pixel over its height

    @property
    def turned(self) -> bool:
        """Whether the picture is turned a quarter (width and height trade places)."""
        return self.rotation in (90, 270)

    def unturned_size(self) -> tuple[int, int]:
        """``(width, height)`` of the stored frame with square pixels, before turning."""
        width = self.width * self.sar if self.sar > 0 else self.width
        return max(1, round(width)), self.height

    def shown_size(self) -> tuple[int, int]:
        """``(width, height)`` a player shows: square pixels, turned."""
        width, height = self.unturned_size()
        return (height, width) if self.turned else (width, height)

    def as_dict(self) -> dict:
        width, height = self.shown_size()
        return {"width": width, "height": height, "rotation": self.rotation,
                "sar": round(self.sar, 6)}


def _sar(stream) -> float:
    ratio = stream.sample_aspect_ratio or stream.codec_context.sample_aspect_ratio
    try:
        value = float(ratio) if ratio else 1.0
    except (TypeError, ZeroDivisionError):
        return 1.0
    # 0/1 means unknown; absurd ratios are damage, not intent
    return value if 0.1 <= value <= 10 else 1.0


def display_of(stream, rotation: float | None = 0) -> Display:
    """The display of ``stream`` (an open PyAV video stream): its stored size and SAR from the
    header, and ``rotation`` (:func:`first_rotation`, or a decoded frame's)."""
    return Display(stream.codec_context.width, stream.codec_context.height,
                   quarter_turns(rotation) * 90, _sar(stream))


def first_rotation(container, stream) -> int:
    """The display rotation of the first frame of ``stream`` that decodes (0 when none
    does). It decodes from where ``container`` stands: a caller that reads the packets after
    it must open the file again."""
    import av

    try:
        for frame in container.decode(stream):
            return quarter_turns(frame.rotation) * 90
    except (av.FFmpegError, ValueError):
        pass
    return 0
