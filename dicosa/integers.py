"""Whole numbers as Python users pass them: ``int``, numpy's integer scalars, a one-element
integer tensor. Parameters that count things (``k``, ``candidates``, ``batch_size``, ...)
take any of them; a ``bool`` or a float is not a count, even where Python would allow it."""

from __future__ import annotations

import operator

__all__ = ["as_int", "at_least"]


def as_int(value: object) -> int | None:
    """``value`` as an ``int`` when it is a whole number (it has ``__index__``: int, numpy's
    integers, an integer tensor of one element) and not a truth value; None otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def at_least(value: object, name: str, least: int = 1) -> int:
    """``value`` as an int of at least ``least`` (:func:`as_int`), else one sentence naming
    the parameter ``name``."""
    number = as_int(value)
    if number is None or number < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return number
