"""What an existing index keeps when it is opened again to add to: an option that cannot apply
to it is one sentence, never ignored (:meth:`VideoIndex.create_or_resume`)."""

from __future__ import annotations

from pathlib import Path

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy

__all__ = ["check_frame_dtype", "check_frames", "check_segments", "check_stage",
           "segment_policy"]


def segment_policy(segments: SegmentPolicy | dict | bool | None,
                   num_frames: int) -> SegmentPolicy | None:
    """The :class:`SegmentPolicy` the ``segments`` option asks for, for a model of
    ``num_frames`` frames (see :class:`VideoIndex`)."""
    if segments is False:
        return None
    if segments is None or segments is True:
        return SegmentPolicy(window=num_frames)
    if isinstance(segments, dict):
        return SegmentPolicy.from_dict({"window": num_frames, **segments})
    if segments.window != num_frames:
        raise ValueError(f"a segment holds the model's {num_frames} frames, not "
                         f"{segments.window}")
    return segments


def check_frames(where: Path | None, frames: FrameProtocol, sampling: str | None,
                 padding: str | None) -> None:
    """Refuse to decode with another frame protocol than the index was built with: its
    rows would be features of differently picked frames (None keeps a field)."""
    asked = frames.override(sampling, padding)
    if asked != frames:
        raise ValueError(f"the index at {where or 'this index'} decodes videos with frame "
                         f"{frames} (its manifest), not {asked}; build a new index to decode "
                         "with another frame protocol")


def check_segments(where: Path | None, kept: SegmentPolicy | None,
                   segments: SegmentPolicy | dict | bool | None, num_frames: int) -> None:
    """Refuse to cut videos otherwise than the index does (None keeps what it does)."""
    if segments is None:
        return
    asked = segment_policy(segments, num_frames)
    if asked == kept:
        return
    where = where or "this index"
    if kept is None:
        raise ValueError(f"the index at {where} keeps one row per video (it was built "
                         "before segments); to search inside long videos, build a new "
                         "index: dicosa index VIDEOS --out NEW_INDEX")
    raise ValueError(f"the index at {where} cuts videos by {kept.as_dict()}, not "
                     f"{'no segments' if asked is None else asked.as_dict()}; leave the "
                     "option out to add to it, or build a new index")


def check_frame_dtype(where: Path | None, kept: str, frame_dtype: str | None) -> None:
    """Refuse to keep new frames otherwise than the index does (None keeps its way)."""
    if frame_dtype is not None and frame_dtype != kept:
        raise ValueError(f"the index at {where} keeps frames as {kept}, not {frame_dtype}; "
                         "leave the option out to add to it, or build a new index")


def check_stage(where: Path | None, spec: dict, backend: str | None, uri: str | None,
                options: dict | None, summary: str | None) -> None:
    """Options of the dense first stage that differ from ``spec`` (the index's) are one
    sentence (None or ``"default"``: keep the index's)."""
    asked = {"backend": backend, "uri": uri, "options": options or None,
             "summary": summary}
    known = {"backend": spec.get("backend"), "uri": spec.get("uri"),
             "options": spec.get("options") or None, "summary": spec.get("summary")}
    aliases = {"local": "faiss"}

    def same(a, b) -> bool:
        return (aliases.get(a, a) == aliases.get(b, b) if isinstance(a, str)
                and isinstance(b, str) else a == b)

    differ = [k for k, v in asked.items() if v is not None and v != "default"
              and not same(v, known[k])]
    if differ:
        said = ", ".join(f"{k} {asked[k]!r} (it has {known[k]!r})" for k in differ)
        raise ValueError(f"the index at {where} already exists with another first stage: "
                         f"{said}; leave the option out to add to it, or build a new index")
