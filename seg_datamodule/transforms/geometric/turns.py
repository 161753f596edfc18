"""90-degree turns for data without an up (aerial, microscopy, medical).

A plan-phase :class:`~seg_datamodule.transforms.steps.CanvasStep`, as the flips are: drawn before
decode, right after the layout, and applied exactly to the output canvas (pixels and crowd regions
moved, not resampled; vertices mapped by the same permutation of the continuous canvas), so the
masks rasterised afterwards are the turned masks, bit for bit. It goes in a ``recipe:`` list;
nothing under ``data/`` knows it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np

from seg_datamodule.ops.checks import check_number
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, step_arguments

__all__ = ["RandomRotate90", "rotate90_matrix"]


def rotate90_matrix(turns: int, canvas_size: tuple[int, int]) -> np.ndarray:
    """The map of continuous canvas points under ``numpy.rot90(image, turns)`` (counter-clockwise).

    One turn takes pixel ``(row r, col c)`` of an ``H x W`` image to ``(W - 1 - c, r)``, so the
    continuous point ``(x, y)`` to ``(y, W - x)``.

    Args:
        turns (int): quarter turns, any int (taken modulo 4).
        canvas_size (tuple[int, int]): (H, W) before the turn.

    Returns:
        ndarray[2, 3] float64.
    """
    h, w = canvas_size
    matrix = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    for _ in range(turns % 4):
        # (x, y) -> (y, w - x), then the canvas is (w, h).
        step = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, float(w)], [0.0, 0.0, 1.0]])
        matrix = (step @ np.vstack([matrix, [0.0, 0.0, 1.0]]))[:2]
        h, w = w, h
    return matrix


class RandomRotate90(CanvasStep):
    """With probability ``p``, turn the canvas by 90, 180 or 270 degrees (drawn uniformly).

    The canvas every layout builds is square (``s x s``), so a quarter turn keeps its size.

    Args:
        p (float): probability of turning (two numbers drawn, whatever ``p``).

    Raises:
        StepValueError, StepTypeError: ``p`` is not a number in ``[0, 1]``.
    """

    phase: ClassVar[DrawPhase] = "plan"

    def __init__(self, p: float = 0.5) -> None:
        with step_arguments("RandomRotate90"):
            self.p = check_number("p", p, 0.0, 1.0)

    def __repr__(self) -> str:
        return f"RandomRotate90(p={self.p})"

    def draw(self, rng: np.random.Generator) -> int:
        """Quarter turns counter-clockwise, ``0`` to ``3`` (two numbers from ``rng``)."""
        u = rng.random(2)
        return 1 + min(int(u[1] * 3), 2) if u[0] < self.p else 0

    def apply(self, canvas: Canvas, params: int) -> Canvas:
        """Turn pixels, crowd regions and vertices by ``params`` quarter turns.

        Raises:
            ValueError: an odd turn of a canvas that is not square.
        """
        turns = int(params) % 4
        if not turns:
            return canvas
        h, w = canvas.image.shape[:2]
        if turns % 2 and h != w:
            raise ValueError(f"RandomRotate90 turns square canvases only, got {h} x {w}")
        crowd = None if canvas.crowd is None else np.ascontiguousarray(np.rot90(canvas.crowd, turns))
        return replace(canvas, image=np.ascontiguousarray(np.rot90(canvas.image, turns)), crowd=crowd,
                       polygons=canvas.polygons.transform(rotate90_matrix(turns, (h, w))))
