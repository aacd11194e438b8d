"""Why a video answered "A without B": the explanation types of :mod:`dicosa.search.exclusion`
and the sentence that says one.

:class:`ExclusionExplanation` is one result's: the concept dimensions of D_A \\ D_B it carries
(:func:`~dicosa.search.exclusion.explain_exclusion`, the paper's step 5), the D_B dimensions
empty in it, and the evidence of each B the demote rule weighed (:class:`Evidence`), said in
words by :func:`describe_evidence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Evidence", "ExclusionExplanation", "describe_evidence"]


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence that a result shows an exclusion, and what it cost the result.

    Attributes:
        source: ``"frames"`` (DiCoSA's S(B) on the best window) or ``"codes"`` (the concepts
            head's code similarity to B).
        exclusion: the excluded text (B).
        value: the score (S(B, window) or code similarity).
        threshold: where that source starts counting.
        penalty: what it took off the result's score (0: below the threshold).
        frames: ``(first, last)`` frame index of the best window (frames only).
    """

    source: str
    exclusion: str
    value: float
    threshold: float
    penalty: float
    frames: tuple[int, int] | None = None


@dataclass(frozen=True)
class ExclusionExplanation:
    """Why one video answered "A without B".

    Attributes:
        matched: ``(dimension, value)`` of D_A \\ D_B active in the video's code, largest first.
        excluded_empty: dimensions of D_B where the video's code is zero.
        excluded_active: ``(dimension, value)`` of D_B active in the video's code.
        presence: B's best window score (None: the per-frame check did not run).
        demoted: True if the rule moved the video back (a penalty, or the filter's tier).
        penalty: score the demote rule took off (0: kept its plain score; None: tiers).
        evidence: per exclusion and source, the evidence of B and its share of the penalty.
    """

    matched: list[tuple[int, float]]
    excluded_empty: list[int]
    excluded_active: list[tuple[int, float]]
    presence: float | None = None
    demoted: bool = False
    penalty: float | None = None
    evidence: list[Evidence] = field(default_factory=list)


def describe_evidence(explanation: ExclusionExplanation) -> str:
    """One readable line: ``demoted by 0.112: "a blue square" in frames 2-3 (0.61 >= 0.24)``,
    or ``kept its place: no evidence of "a blue square" (best 0.05 < 0.24)``."""
    def one(e: Evidence) -> str:
        where = f" in frames {e.frames[0]}-{e.frames[1]}" if e.frames else f" ({e.source})"
        relation = ">=" if e.penalty > 0 else "<"
        return f'"{e.exclusion}"{where} ({e.value:.3f} {relation} {e.threshold:.3f})'

    shown = [e for e in explanation.evidence if e.penalty > 0]
    if shown:
        return f"demoted by {explanation.penalty:.3f}: " + "; ".join(one(e) for e in shown)
    if not explanation.evidence:
        return "not checked for B (below the checked depth)"
    best = max(explanation.evidence, key=lambda e: e.value - e.threshold)
    return "kept its place: no evidence of B, closest " + one(best)
