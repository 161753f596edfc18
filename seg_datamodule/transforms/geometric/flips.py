"""Flips: the output canvas mirrored, left-right (:class:`RandomFlipLR`, YOLO's ``fliplr``) or up-down
(:class:`RandomFlipUD`, for data without an up: aerial, microscopy, medical).

Both are plan-phase :class:`~seg_datamodule.transforms.steps.CanvasStep` s: drawn before decode, right after
the layout, and applied exactly to the output canvas (pixels and crowd regions moved, not resampled;
vertices mapped by the same permutation of the continuous canvas), so the masks rasterised afterwards are
the flipped masks, bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import cv2
import numpy as np

from seg_datamodule.ops.checks import check_number
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, step_arguments

__all__ = ["MirrorStep", "RandomFlipLR", "RandomFlipUD", "flip_canvas"]


def flip_canvas(canvas: Canvas, axis: int) -> Canvas:
    """``canvas`` mirrored along one axis: ``0`` upside down (``y -> H - y``), ``1`` left-right (``x -> W - x``).

    Pixel row (or column) ``k`` goes to ``H - 1 - k`` (``W - 1 - k``) and vertices by the same map of
    the continuous canvas, so masks rasterised afterwards are the mirrored masks, bit for bit. The
    pixels and crowd regions are mirrored in place (the canvas is the sample's own); pixels still
    to be made on the device (``canvas.pending``) are mirrored there.

    Args:
        canvas (Canvas): the sample, image ``(H, W, 3)``.
        axis (int): ``0`` or ``1``.

    Returns:
        Canvas: the mirrored canvas.
    """
    crowd = None if canvas.crowd is None else cv2.flip(canvas.crowd, axis, dst=canvas.crowd)
    size = canvas.image.shape[axis]
    polygons = canvas.polygons.flip_lr(size) if axis == 1 else canvas.polygons.flip_ud(size)
    if canvas.pending is not None:  # pixels_on_device: the device mirrors the pixels after its warp
        return replace(canvas, pending=canvas.pending.flipped(axis), crowd=crowd, polygons=polygons)
    return replace(canvas, image=cv2.flip(canvas.image, axis, dst=canvas.image), crowd=crowd, polygons=polygons)


class MirrorStep(CanvasStep):
    """A flip along one canvas axis with probability ``p`` (:func:`flip_canvas`), drawn in the plan phase.

    The subclasses only name their axis: :class:`RandomFlipUD` here and
    :class:`~seg_datamodule.transforms.geometric.flips.RandomFlipLR`. They stay separate classes (neither
    is the other), so a recipe tells a vertical flip from the horizontal one its layout configures.

    Args:
        p (float): probability of flipping (one number drawn, whatever ``p``).

    Raises:
        StepValueError, StepTypeError: ``p`` is not a number in ``[0, 1]``.
    """

    phase: ClassVar[DrawPhase] = "plan"
    #: 0: upside down; 1: left-right.
    axis: ClassVar[int]

    def __init__(self, p: float = 0.5) -> None:
        with step_arguments(type(self).__name__):
            self.p = check_number("p", p, 0.0, 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"

    def draw(self, rng: np.random.Generator) -> bool:
        """Whether to flip (one number from ``rng``)."""
        return bool(rng.random() < self.p)

    def apply(self, canvas: Canvas, params: bool) -> Canvas:
        """The canvas mirrored along :attr:`axis` if ``params``, else ``canvas`` itself."""
        return flip_canvas(canvas, self.axis) if params else canvas


class RandomFlipUD(MirrorStep):
    """Vertical flip with probability ``p``: ``y -> H - y`` (pixel row ``k`` onto ``H - 1 - k``).

    Args:
        p (float): probability of flipping (one number drawn, whatever ``p``).

    Raises:
        StepValueError, StepTypeError: ``p`` is not a number in ``[0, 1]``.
    """

    axis: ClassVar[int] = 0


class RandomFlipLR(MirrorStep):
    """Horizontal flip with probability ``p``: the output canvas mirrored, ``x -> W - x``.

    Mirroring pixel ``k`` onto ``W - 1 - k`` and vertices with ``x -> W - x`` (continuous pixels)
    is exact for both, and costs one copy, not a resample. Drawn in the plan phase, after the
    layout; applied after the warp (folding it into the matrix would change which tiles snap).

    Args:
        p (float): probability of flipping (one number drawn, whatever ``p``).

    Raises:
        StepValueError, StepTypeError: ``p`` is not a number in ``[0, 1]``.
    """

    axis: ClassVar[int] = 1

    @staticmethod
    def matrix(width: float) -> np.ndarray:
        """The flip of a canvas ``width`` wide as an affine, ``float64 (2, 3)``."""
        return np.array([[-1.0, 0.0, float(width)], [0.0, 1.0, 0.0]])
