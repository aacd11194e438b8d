"""What a decode lost of a video, said in one sentence: the record of a *partial* video.

A video is partial when its frames end before the duration its container states (a download
cut short: the header still promises the whole film), or when stretches or sampled frames of
it did not decode. The index keeps each video's ``duration`` (what was decoded), its
``expected_duration`` (what the container states) and ``damage``, the sentence made here
(empty for a whole video), so that ``index``, ``check``, the API and the page say the same.

A container's duration and its last frame differ a little in whole files (an encoder that
holds back its last B-frames, audio that runs past the video): a shortfall is damage only
beyond :data:`SHORT_TOLERANCE_S` or :data:`SHORT_TOLERANCE` of the stated duration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["SHORT_TOLERANCE", "SHORT_TOLERANCE_S", "cut_short", "damage_sentence"]

SHORT_TOLERANCE_S = 0.5  # seconds a video may end before its container's duration
SHORT_TOLERANCE = 0.02  # ... or this fraction of it, whichever is larger


def cut_short(decoded: float | None, expected: float | None) -> bool:
    """Whether frames that end at ``decoded`` seconds fall short of the ``expected``
    duration by more than the tolerance (False where either is unknown)."""
    if not _known(decoded) or not _known(expected):
        return False
    return expected - decoded > max(SHORT_TOLERANCE_S, SHORT_TOLERANCE * expected)


def damage_sentence(decoded: float | None, expected: float | None, *, lost_picks: int = 0,
                    picks: int = 0, lost: Sequence[tuple[float, float]] = (),
                    ended_early: str | None = None, dropped: int = 0) -> str:
    """What was lost, for the record (``""``: nothing). ``decoded``: seconds decoded;
    ``expected``: the container's duration; ``lost_picks`` of ``picks``: sampled frames that
    did not decode (a clip); ``lost``: ``(from, to)`` stretches that did not decode and
    ``ended_early``: why the decode stopped (a streamed video); ``dropped``: frames left out
    because their time went backwards."""
    parts = []
    if cut_short(decoded, expected):
        parts.append(f"its frames end at {decoded:.1f} s of the {expected:.1f} s its "
                     "container states (cut short, as an interrupted download is)")
    if lost_picks:
        parts.append(f"{lost_picks} of its {picks} sampled frames did not decode")
    if lost:
        seconds = sum(b - a for a, b in lost)
        where = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in lost[:3])
        more = ", ..." if len(lost) > 3 else ""
        parts.append(f"{seconds:.1f} s in {len(lost)} stretch(es) did not decode "
                     f"({where}{more})")
    if ended_early:
        parts.append(f"decoding stopped at {decoded or 0.0:.1f} s ({ended_early})")
    if dropped:
        parts.append(f"{dropped} frame(s) left out because their time went backwards")
    return "; ".join(parts)


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
