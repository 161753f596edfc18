"""Large-scale jitter (LSJ): the recipe of Detectron2's and MMDetection's strongest Mask R-CNN baselines.

One image is resized by a random factor of the ``s x s`` target (keeping its aspect:
``k = u * s / max(H, W)``, ``u`` uniform in ``lsj_scale``, Detectron2's ``ResizeScale``), then a
fixed ``s x s`` window is cut at a random whole-pixel offset where the resized image is larger
(``FixedSizeCrop``), padded with the mosaic fill at the right and bottom where it is smaller,
then flipped. :class:`LargeScaleJitter` is a :class:`~seg_datamodule.transforms.steps.Layout`
as :class:`~seg_datamodule.transforms.layouts.mosaic.MosaicAffine` is, so the same single-resample warp,
exact polygon clip and drop reasons apply; it never builds a mosaic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from seg_datamodule.ops.checks import check_int, check_number
from seg_datamodule.transforms.geometric.flips import RandomFlipLR
from seg_datamodule.transforms.layouts.mosaic import Letterbox
from seg_datamodule.transforms.kernels.plan import TilePlan, snap_for_resize
from seg_datamodule.transforms.steps import Layout, step_arguments

__all__ = ["LSJDraw", "LargeScaleJitter", "lsj_layout"]


@dataclass(frozen=True)
class LSJDraw:
    """The random part of one LSJ sample's placement (the flip is its own step's draw).

    Attributes:
        scale (float): the factor ``u`` of the target size.
        offset (tuple[float, float]): where the crop starts, as fractions in ``[0, 1)`` of the
            room the resized image leaves (x, y).
    """

    scale: float
    offset: tuple[float, float]


def lsj_layout(
    image_size_hw: tuple[int, int], scale: float, offset: tuple[float, float], image_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Resize by ``scale * s / max(H, W)``, then cut ``s x s`` at the drawn whole-pixel offset.

    Args:
        image_size_hw (tuple[int, int]): (H, W) of the original image.
        scale (float): ``u``, the factor of the target size.
        offset (tuple[float, float]): fractions in ``[0, 1)`` of the room left, x and y.
        image_size (int): ``s``.

    Returns:
        matrix (ndarray[2, 3] float64): original pixels -> output pixels.
        region (ndarray[4] float64): the part of the image that lands on the output.

    Raises:
        ValueError: a non-positive size or scale.
    """
    h, w = (int(v) for v in image_size_hw)
    if h <= 0 or w <= 0 or not scale > 0 or image_size <= 0:
        raise ValueError(f"lsj_layout needs positive sizes and scale, got {image_size_hw}, {scale}, {image_size}")
    k = scale * image_size / max(h, w)
    # Detectron2 rounds the resized size and the offset to whole pixels.
    room_x, room_y = max(round(w * k) - image_size, 0), max(round(h * k) - image_size, 0)
    ox, oy = float(round(offset[0] * room_x)), float(round(offset[1] * room_y))
    matrix = np.array([[k, 0.0, -ox], [0.0, k, -oy]])
    region = np.array([ox / k, oy / k, min(w, (ox + image_size) / k), min(h, (oy + image_size) / k)])
    return matrix, region


class LargeScaleJitter(Layout):
    """LSJ geometry for ``SegDataset(index, AugmentOptions(LargeScaleJitter(s)))`` (the DataModule's
    ``recipe="lsj"``): scale jitter, fixed-size crop, flip.

    Args:
        image_size (int): ``s``, the output side.
        scale (tuple[float, float]): the range of ``u`` (Detectron2: ``(0.1, 2.0)``).
        flip_lr (float): probability of a horizontal flip (:attr:`flip`, a canvas step of its own).

    Raises:
        TypeError, ValueError: ``image_size`` is not a positive int, ``scale`` not a pair
            ``0 < low <= high``.
    """

    mosaic_capable: ClassVar[bool] = False
    recipe: ClassVar[str] = "lsj"

    def __init__(self, image_size: int = 1024, scale: tuple[float, float] = (0.1, 2.0), flip_lr: float = 0.5) -> None:
        with step_arguments("LargeScaleJitter"):
            self.image_size = check_int("image_size", image_size, 1)
            if not isinstance(scale, Sequence) or isinstance(scale, str) or len(scale) != 2:
                raise TypeError(f"lsj_scale must be a pair (low, high), got {scale!r}")
            lo, hi = (check_number("lsj_scale", s) for s in scale)
            if not 0 < lo <= hi:
                raise ValueError(f"lsj_scale must satisfy 0 < low <= high, got {scale!r}")
            self.scale = (lo, hi)
            self.flip = RandomFlipLR(flip_lr)
            self.letterbox = Letterbox(image_size)

    def __repr__(self) -> str:
        return f"LargeScaleJitter(image_size={self.image_size}, scale={self.scale}, {self.flip!r})"

    def draw_indices(self, rng: np.random.Generator, first: int, num_images: int) -> np.ndarray:
        """The one image of an LSJ sample (``mosaic`` never applies; nothing is drawn)."""
        return np.array([int(first)], np.int64)

    def draw(self, rng: np.random.Generator, mosaic: bool = False) -> LSJDraw:
        """Draw the scale and the crop offset (x, y) (three numbers; the flip step draws after them)."""
        u = rng.random(3)
        scale = self.scale[0] + u[0] * (self.scale[1] - self.scale[0])
        return LSJDraw(scale=float(scale), offset=(float(u[1]), float(u[2])))

    def plan(self, draw: LSJDraw, image_sizes: np.ndarray, snap: bool = True) -> TilePlan:
        """The one-tile plan of the draw for the image's original size (the flip is not in it).

        Args:
            draw (LSJDraw): from :meth:`draw`.
            image_sizes (ndarray[1, 2] int): (H, W) of the image.
            snap (bool): let the tile be rendered by ``cv2.resize`` of an integer crop (see
                :func:`~seg_datamodule.transforms.kernels.plan.snap_for_resize`).

        Raises:
            ValueError: ``image_sizes`` is not ``(1, 2)``.
        """
        sizes = np.asarray(image_sizes)
        if sizes.shape != (1, 2):
            raise ValueError(f"an LSJ draw needs image_sizes (1, 2), got {sizes.shape}")
        s = self.image_size
        matrix, region = lsj_layout(tuple(sizes[0]), draw.scale, draw.offset, s)
        plan = TilePlan(matrix[None], region[None], (s, s))
        return snap_for_resize(plan, sizes, np.full((1, 2), -1)) if snap else plan
