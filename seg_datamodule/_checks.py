"""Argument checks shared by the classes that hold parameters (messages name the argument)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_bool", "check_int", "check_number"]


def check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> int | None:
    """``value`` as an int ``>= minimum`` (or None when allowed).

    Raises:
        TypeError: not an int (bools are refused).
        ValueError: below ``minimum``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise TypeError(f"{name} must be {expected}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool; raises ``TypeError`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_number(name: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> float:
    """``value`` as a finite float in ``[minimum, maximum]`` (no upper bound when None).

    Raises:
        TypeError: not a real number (bools are refused).
        ValueError: not finite, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if maximum is None:
        if not (math.isfinite(value) and value >= minimum):
            raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    elif not minimum <= value <= maximum:
        raise ValueError(f"{name} must be in [{minimum:g}, {maximum:g}], got {value!r}")
    return value
