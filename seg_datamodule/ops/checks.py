"""Argument checks used by every public entry point, so one mistake reads the same everywhere.

``TypeError`` for a wrong type, ``ValueError`` for a wrong value; every message names the
argument, what was expected and what was received: ``mask_stride must be an int >= 1, got '4'``.
Bools are never accepted where a number belongs (``True`` is an ``int`` to Python, not to a
user).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = [
    "check_bool",
    "check_canvas_size",
    "check_choice",
    "check_int",
    "check_number",
    "check_optional_bool",
]


def check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False, maximum: int | None = None) -> Any:
    """``value`` as an int in ``[minimum, maximum]`` (or None when allowed).

    Raises:
        TypeError: not an int (bools are refused).
        ValueError: out of range.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise TypeError(f"{name} must be {expected}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool; raises ``TypeError`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_optional_bool(name: str, value: Any) -> bool | None:
    """``value`` if it is a bool or None; raises ``TypeError`` otherwise."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool or None, got {value!r}")
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


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``.

    Raises:
        TypeError: not a str.
        ValueError: not one of ``choices``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {list(choices)}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_canvas_size(name: str, value: Any) -> tuple[int, int]:
    """``value`` as ``(H, W)`` of non-negative ints.

    Raises:
        TypeError: not a pair of ints.
        ValueError: a negative side.
    """
    try:
        height, width = value
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be (H, W) of non-negative ints, got {value!r}") from None
    return check_int(f"{name}[0]", height, 0), check_int(f"{name}[1]", width, 0)
