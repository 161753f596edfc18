"""``Instances``: a sample's polygons and its named per-instance columns, moved as one.

The per-instance data of a :class:`~seg_datamodule.structures.sample.Sample` (labels, annotation
ids, boxes, occluders, origins) travels through selection, concatenation and flips as one value
(as detectron2's ``structures.Instances``), so mixing and the collate list no fields: they call
:meth:`Instances.select` / :meth:`Instances.concat` and lay their outputs out from
:data:`COLUMNS`. A new per-instance column (a later ``has_mask`` flag, say) is one field here
and one :class:`Column` entry; the code that moves instances around does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from seg_datamodule.structures.polygons import Polygons

__all__ = ["COLUMNS", "Column", "Instances", "no_rings"]


def no_rings(n: int) -> Polygons:
    """``n`` instances without a ring (the occluders of instances nothing covers)."""
    return Polygons(np.zeros((0, 2), np.float64), np.zeros(1, np.int64), np.zeros(n + 1, np.int64))


@dataclass(frozen=True)
class Column:
    """How one per-instance column behaves when instances are concatenated and collated.

    Attributes:
        name (str): the attribute of :class:`Instances` (and of ``DetectionBatch`` for a tensor
            column).
        dtype (numpy.dtype | None): the column's dtype; ``None`` for a :class:`Polygons` column.
        trailing (tuple[int, ...]): shape per instance (``(4,)`` for boxes, ``()`` for a code).
        fill (Callable[[Instances], Any] | None): the value of an absent optional column for the
            instances of one part, when another part has it; ``None``: the column is required.
        keep_absent (bool): whether :meth:`Instances.concat` leaves the column ``None`` when no
            part has it (else it fills every part).
        tensor (torch.dtype | None): the collated tensor's dtype; ``None``: not collated as a
            tensor (the collate rasterises a :class:`Polygons` column).
    """

    name: str
    dtype: np.dtype | None
    trailing: tuple[int, ...] = ()
    fill: Callable[["Instances"], Any] | None = None
    keep_absent: bool = True
    tensor: torch.dtype | None = None


@dataclass(frozen=True, eq=False)
class Instances:
    """N instances: their polygons and the per-instance columns of :data:`COLUMNS`.

    Attributes:
        polygons (Polygons): the N instances, in canvas pixels.
        labels (ndarray[N] int64): contiguous class indices.
        annotation_ids (ndarray[N] int64): COCO annotation ids.
        boxes (ndarray[N, 4] float | None): xyxy boxes; ``None``: derive them from the polygons.
        occluders (Polygons | None): N instances: instance ``n`` holds the rings pasted above it;
            ``None``: nothing pasted.
        origins (ndarray[N] uint8 | None): per instance, an index of
            :data:`~seg_datamodule.structures.sample.ORIGINS`; ``None``: all own.
        has_mask (ndarray[N] bool | None): False for a box-only instance (no ring: a box target
            without a mask, ``box_only: keep``); ``None``: every instance has a mask.
    """

    polygons: Polygons
    labels: np.ndarray
    annotation_ids: np.ndarray
    boxes: np.ndarray | None = None
    occluders: Polygons | None = None
    origins: np.ndarray | None = None
    has_mask: np.ndarray | None = None

    def __len__(self) -> int:
        """N, the number of instances."""
        return len(self.polygons)

    def __repr__(self) -> str:
        present = [c.name for c in COLUMNS if getattr(self, c.name) is not None]
        return f"Instances({len(self)} instances, columns {present})"

    @classmethod
    def empty(cls) -> "Instances":
        """No instance."""
        return cls(Polygons.empty(), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def columns(self) -> dict[str, Any]:
        """Column name -> its value (``None`` when absent), :data:`COLUMNS` order."""
        return {c.name: getattr(self, c.name) for c in COLUMNS}

    def fields(self) -> dict[str, Any]:
        """``polygons`` and every column, as keyword arguments of ``Sample``."""
        return {"polygons": self.polygons, **self.columns()}

    def with_columns(self, **values: Any) -> "Instances":
        """These instances with some columns replaced (``None`` removes an optional one)."""
        return replace(self, **values)

    def filled(self, name: str) -> Any:
        """Column ``name``, or its fill when absent."""
        value = getattr(self, name)
        return _COLUMN[name].fill(self) if value is None else value  # type: ignore[misc]

    # ------------------------------------------------------------------ operations

    def select(self, keep: np.ndarray) -> "Instances":
        """The instances where ``keep`` (bool ``(N,)``) is True, in order, every column with them."""
        changes: dict[str, Any] = {"polygons": self.polygons.select(keep)}
        for column in COLUMNS:
            value = getattr(self, column.name)
            if value is not None:
                changes[column.name] = value.select(keep) if column.dtype is None else value[keep]
        return replace(self, **changes)

    @classmethod
    def concat(cls, parts: Sequence["Instances"]) -> "Instances":
        """All instances of ``parts``, in order.

        A column some parts lack is filled for them (:attr:`Column.fill`); one no part has stays
        ``None`` where :attr:`Column.keep_absent` says so.
        """
        values: dict[str, Any] = {"polygons": Polygons.concat(p.polygons for p in parts)}
        for column in COLUMNS:
            present = [getattr(p, column.name) for p in parts]
            if column.keep_absent and all(v is None for v in present):
                values[column.name] = None
                continue
            full = [v if v is not None else column.fill(p) for v, p in zip(present, parts)]  # type: ignore[misc]
            values[column.name] = (Polygons.concat(full) if column.dtype is None else
                                   _concat_array(full, column))
        return cls(**values)

    def flip_lr(self, width: float) -> "Instances":
        """Mirrored about ``x = width / 2``: polygons, boxes and occluders (exact)."""
        boxes = None
        if self.boxes is not None:
            boxes = self.boxes.copy()
            boxes[:, [0, 2]] = width - self.boxes[:, [2, 0]]
        return replace(self, polygons=self.polygons.flip_lr(width), boxes=boxes,
                       occluders=None if self.occluders is None else self.occluders.flip_lr(width))

    def flip_ud(self, height: float) -> "Instances":
        """Mirrored about ``y = height / 2``: polygons, boxes and occluders (exact)."""
        boxes = None
        if self.boxes is not None:
            boxes = self.boxes.copy()
            boxes[:, [1, 3]] = height - self.boxes[:, [3, 1]]
        return replace(self, polygons=self.polygons.flip_ud(height), boxes=boxes,
                       occluders=None if self.occluders is None else self.occluders.flip_ud(height))

    def validate(self, where: str = "instances") -> None:
        """Check that every column has one entry per instance.

        Raises:
            TypeError: a :class:`Polygons` column is not a ``Polygons``.
            ValueError: a column's length or shape differs from ``(N, *trailing)``, naming ``where``.
        """
        self.polygons.validate(where)
        n = len(self)
        for column in COLUMNS:
            value = getattr(self, column.name)
            if value is None:
                if column.fill is None:
                    raise ValueError(f"{where}: {column.name} is required")
                continue
            if column.dtype is None:
                if not isinstance(value, Polygons):
                    raise TypeError(f"{where}: {column.name} must be a Polygons, got {type(value).__name__}")
                value.validate(f"{where} {column.name}")
                if len(value) != n:
                    raise ValueError(f"{where}: {n} instances but {column.name} for {len(value)}")
            elif np.shape(value) != (n, *column.trailing):
                raise ValueError(f"{where}: {column.name} must be {(n, *column.trailing)}, got {np.shape(value)}")


def _concat_array(parts: Iterable[np.ndarray], column: Column) -> np.ndarray:
    arrays = [np.asarray(p) for p in parts]
    if not arrays:
        return np.zeros((0, *column.trailing), column.dtype)
    return np.concatenate(arrays).astype(column.dtype)


#: The per-instance columns, in the order the collate lays out its tensors.
COLUMNS: tuple[Column, ...] = (
    Column("labels", np.dtype(np.int64), tensor=torch.int64),
    Column("annotation_ids", np.dtype(np.int64), tensor=torch.int64),
    # Unclipped polygon boxes (what mixing gives an instance without boxes); the collate derives
    # the clipped ones itself before it concatenates.
    Column("boxes", np.dtype(np.float32), (4,), fill=lambda p: p.polygons.boxes().astype(np.float32),
           keep_absent=False, tensor=torch.float32),
    Column("occluders", None, fill=lambda p: no_rings(len(p))),
    Column("origins", np.dtype(np.uint8), fill=lambda p: np.zeros(len(p), np.uint8), tensor=torch.uint8),
    Column("has_mask", np.dtype(bool), fill=lambda p: np.ones(len(p), bool), tensor=torch.bool),
)

_COLUMN = {c.name: c for c in COLUMNS}
assert set(_COLUMN) == {f.name for f in fields(Instances)} - {"polygons"}, "COLUMNS and Instances disagree"
