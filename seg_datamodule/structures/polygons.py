"""``Polygons``: a set of instances as flat polygon arrays, with the operations every stage uses.

Layout (the same everywhere in the package)::

    vertices          float64 (V, 2)   x, y in pixels (COCO convention: pixel k covers [k, k+1))
    ring_offsets      int64   (R + 1,) ring r is vertices[ring_offsets[r]:ring_offsets[r + 1]]
    instance_offsets  int64   (N + 1,) instance n is rings instance_offsets[n]:instance_offsets[n + 1]

An instance's mask is the union of its rings; each ring is filled with the even-odd rule. Flat
arrays pickle in one buffer each, so handing thousands of instances between processes costs
little, and the kernels in :mod:`seg_datamodule.ops` work on all rings at once. The kernels take
the plain arrays; this type carries them together through the public functions and
:class:`~seg_datamodule.structures.sample.Sample` (as ``tv_tensors.BoundingBoxes`` carries its
format, and detectron2's ``PolygonMasks`` its operations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from seg_datamodule.ops.affine import apply_affine
from seg_datamodule.ops.geometry import (
    clip_polygons,
    concat_polygons,
    instance_areas,
    polygon_boxes,
    ring_areas,
    select_instances,
)
from seg_datamodule.ops.ragged import flatten_rings

__all__ = ["Polygons"]


@dataclass(frozen=True, eq=False)
class Polygons:
    """N instances, each a union of closed rings, as three flat arrays.

    Attributes:
        vertices (ndarray[V, 2] float64): x, y.
        ring_offsets (ndarray[R + 1] int64): ring boundaries into ``vertices``.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.
    """

    vertices: np.ndarray
    ring_offsets: np.ndarray
    instance_offsets: np.ndarray

    # ------------------------------------------------------------------ construction

    @classmethod
    def empty(cls) -> "Polygons":
        """No instance: ``(0, 2)`` vertices and ``[0]`` offsets."""
        return cls(np.zeros((0, 2), np.float64), np.zeros(1, np.int64), np.zeros(1, np.int64))

    @classmethod
    def from_instances(cls, instances: Sequence[Sequence[Any]]) -> "Polygons":
        """From nested instances (each a list of ``(K, 2)`` rings or flat COCO lists).

        Raises:
            ValueError: a malformed ring, naming the instance index (see
                :func:`~seg_datamodule.ops.ragged.flatten_rings`).
        """
        return cls(*flatten_rings(instances))

    @classmethod
    def concat(cls, parts: Iterable["Polygons"]) -> "Polygons":
        """All instances of ``parts``, in order."""
        return cls(*concat_polygons([p.arrays for p in parts]))

    # ------------------------------------------------------------------ views

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vertices, ring_offsets, instance_offsets)``, what the kernels take."""
        return self.vertices, self.ring_offsets, self.instance_offsets

    def __len__(self) -> int:
        """N, the number of instances."""
        return len(self.instance_offsets) - 1

    @property
    def num_rings(self) -> int:
        """R, the number of rings."""
        return len(self.ring_offsets) - 1

    def instance(self, n: int) -> list[np.ndarray]:
        """Instance ``n``'s rings, each ``float64 (K, 2)`` (views)."""
        r0, r1 = int(self.instance_offsets[n]), int(self.instance_offsets[n + 1])
        ro = self.ring_offsets
        return [self.vertices[ro[r] : ro[r + 1]] for r in range(r0, r1)]

    def __repr__(self) -> str:
        return f"Polygons({len(self)} instances, {self.num_rings} rings, {len(self.vertices)} vertices)"

    # ------------------------------------------------------------------ operations

    def split(self, sizes: Sequence[int]) -> list["Polygons"]:
        """Consecutive runs of ``sizes[k]`` instances (summing to N), each a ``Polygons`` of views.

        Raises:
            ValueError: ``sizes`` has a negative entry or does not sum to N.
        """
        counts = np.asarray(sizes, np.int64)
        if (counts < 0).any() or int(counts.sum()) != len(self):
            raise ValueError(f"sizes must be non-negative and sum to {len(self)}, got {list(sizes)}")
        io, ro = self.instance_offsets, self.ring_offsets
        inst = np.concatenate([[0], np.cumsum(counts)])
        rings = io[inst]
        verts = ro[rings]
        return [Polygons(self.vertices[v0:v1], ro[r0 : r1 + 1] - v0, io[i0 : i1 + 1] - r0)
                for i0, i1, r0, r1, v0, v1 in zip(inst[:-1].tolist(), inst[1:].tolist(), rings[:-1].tolist(),
                                                  rings[1:].tolist(), verts[:-1].tolist(), verts[1:].tolist())]

    def select(self, keep: np.ndarray) -> "Polygons":
        """The instances where ``keep`` (bool ``(N,)``) is True, in order."""
        out = select_instances(*self.arrays, keep)
        return self if out[0] is self.vertices and out[1] is self.ring_offsets else Polygons(*out)

    def clip(self, rect: np.ndarray | tuple[float, float, float, float]) -> "Polygons":
        """Exact clip of every ring to ``x0, y0, x1, y1`` (one rect, or one per ring ``(R, 4)``).

        Instances whose rings all vanish stay, with no rings (see :func:`clip_polygons`).
        """
        out = clip_polygons(*self.arrays, rect)
        return self if out[0] is self.vertices else Polygons(*out)

    def transform(self, matrix: np.ndarray) -> "Polygons":
        """Every vertex through the ``(2, 3)`` affine ``matrix``."""
        return Polygons(apply_affine(self.vertices, matrix), self.ring_offsets, self.instance_offsets)

    def flip_lr(self, width: float) -> "Polygons":
        """Mirror about the vertical line ``x = width / 2`` (exact: ``x -> width - x``)."""
        vertices = self.vertices.copy()
        vertices[:, 0] = width - vertices[:, 0]
        return Polygons(vertices, self.ring_offsets, self.instance_offsets)

    def flip_ud(self, height: float) -> "Polygons":
        """Mirror about the horizontal line ``y = height / 2`` (exact: ``y -> height - y``)."""
        vertices = self.vertices.copy()
        vertices[:, 1] = height - vertices[:, 1]
        return Polygons(vertices, self.ring_offsets, self.instance_offsets)

    def areas(self) -> np.ndarray:
        """float64 ``(N,)``: each instance's summed absolute ring areas (see :func:`instance_areas`)."""
        return instance_areas(*self.arrays)

    def ring_areas(self) -> np.ndarray:
        """float64 ``(R,)``: signed shoelace area of every ring."""
        return ring_areas(self.vertices, self.ring_offsets)

    def boxes(self) -> np.ndarray:
        """float64 ``(N, 4)``: tight xyxy box of each instance's vertices (zeros when it has none)."""
        return polygon_boxes(*self.arrays)

    def validate(self, where: str = "polygons") -> None:
        """Check dtypes, shapes and offsets.

        Args:
            where: what the message names (e.g. ``"image id 139"``).

        Raises:
            ValueError: wrong shape or dtype, offsets not running monotonically from 0 to the
                length they index, or NaN / infinite vertices.
        """
        v, ro, io = self.arrays
        if v.ndim != 2 or v.shape[1] != 2:
            raise ValueError(f"{where}: vertices must be (V, 2), got {v.shape}")
        for name, off, total in (("ring_offsets", ro, len(v)), ("instance_offsets", io, len(ro) - 1)):
            if off.ndim != 1 or len(off) < 1 or not np.issubdtype(off.dtype, np.integer):
                raise ValueError(f"{where}: {name} must be a 1-D int array with at least one entry")
            if off[0] != 0 or off[-1] != total or (np.diff(off) < 0).any():
                raise ValueError(f"{where}: {name} must run non-decreasing from 0 to {total}")
        if not np.isfinite(v).all():
            raise ValueError(f"{where}: NaN or infinite vertices")
