"""The frame protocol: which frames of a video a model sees, and what fills a short clip's rows.

A model is trained and evaluated on frames picked by ``data.frame_sampling`` and padded by
``data.frame_padding``; whatever encodes videos for it later (an index, a head's features)
must decode them the same way, or it stores features of frames the model was never measured
on. :class:`FrameProtocol` carries the pair as one value, from a config into the decoders and
into what is stored (an index's manifest, a feature cache's key).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..clip import CLIP_MEAN
from .video import SAMPLINGS

if TYPE_CHECKING:
    from ..config import DataConfig

__all__ = ["PAD_COLOURS", "FrameProtocol", "pad_colour"]

# data.frame_padding -> the RGB of padded rows. CLIP's mean colour is what the released loader's
# zero rows become once normalised (to 0.5/255 per channel: uint8 cannot hold it exactly).
PAD_COLOURS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "mean": tuple(round(255 * m) for m in CLIP_MEAN),  # (123, 117, 104)
}


def pad_colour(padding: str) -> tuple[int, int, int]:
    """The RGB of ``data.frame_padding`` (ValueError for an unknown name)."""
    if padding not in PAD_COLOURS:
        raise ValueError(f"frame padding must be one of {sorted(PAD_COLOURS)}, got {padding!r}")
    return PAD_COLOURS[padding]


@dataclass(frozen=True)
class FrameProtocol:
    """``data.frame_sampling`` and ``data.frame_padding`` as one value (checked when made).

    The defaults are DataConfig's: N equal segments, black padding.
    """

    sampling: str = "segments"  # "segments" | "released" (see dicosa/data/video.py)
    padding: str = "black"  # "black" | "mean"

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"frame sampling must be one of {list(SAMPLINGS)}, "
                             f"got {self.sampling!r}")
        pad_colour(self.padding)

    @classmethod
    def of(cls, data: DataConfig) -> FrameProtocol:
        """The protocol of a config's data section (a checkpoint's: what its model saw)."""
        return cls(data.frame_sampling, data.frame_padding)

    def override(self, sampling: str | None = None, padding: str | None = None
                 ) -> FrameProtocol:
        """This protocol with the fields that are given (not None) replaced."""
        return FrameProtocol(sampling or self.sampling, padding or self.padding)

    @property
    def pad_colour(self) -> tuple[int, int, int]:
        return pad_colour(self.padding)

    def as_dict(self) -> dict[str, str]:
        """``{"sampling", "padding"}``: how manifests and cache keys record it."""
        return asdict(self)

    def __str__(self) -> str:
        return f"sampling '{self.sampling}' and padding '{self.padding}'"
