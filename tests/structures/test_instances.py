"""``Instances``: select, concat (with the column table's fills), flips, and the collate's layout.

References: hand-computed cases, the per-field code mixing and the collate used before the column
table (written out here as the oracle), and the rasterised masks of flipped polygons against the
mirrored masks of the originals.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import COLUMNS, DetectionBatch, Instances, Polygons, Sample
from seg_datamodule.structures.instances import no_rings


def _squares(boxes: list[tuple[float, float, float, float]]) -> Polygons:
    return Polygons.from_instances([[[x0, y0, x1, y0, x1, y1, x0, y1]] for x0, y0, x1, y1 in boxes])


def _instances(rects: list[tuple[float, float, float, float]], first_id: int = 1, **columns) -> Instances:
    n = len(rects)
    return Instances(_squares(rects), np.arange(n, dtype=np.int64) % 3, np.arange(first_id, first_id + n, dtype=np.int64),
                     **columns)


def test_the_column_table_names_every_column_and_the_batch_fields() -> None:
    names = {f.name for f in dataclasses.fields(Instances)} - {"polygons"}
    assert [c.name for c in COLUMNS] == [n for n in (f.name for f in dataclasses.fields(Instances)) if n in names]
    batch_fields = {f.name for f in dataclasses.fields(DetectionBatch)}
    assert {c.name for c in COLUMNS if c.tensor is not None} <= batch_fields


def test_select_keeps_every_column_aligned() -> None:
    inst = _instances([(0, 0, 2, 2), (4, 4, 8, 8), (1, 1, 3, 5)],
                      boxes=np.array([[0, 0, 2, 2], [4, 4, 8, 8], [1, 1, 3, 5]], np.float32),
                      occluders=_squares([(0, 0, 1, 1), (5, 5, 6, 6), (2, 2, 3, 3)]),
                      origins=np.array([0, 1, 2], np.uint8))
    keep = np.array([True, False, True])
    out = inst.select(keep)
    assert len(out) == 2
    assert out.annotation_ids.tolist() == [1, 3] and out.labels.tolist() == [0, 2]
    assert out.boxes.tolist() == [[0, 0, 2, 2], [1, 1, 3, 5]]
    assert out.origins.tolist() == [0, 2]
    assert np.array_equal(out.occluders.vertices, inst.occluders.select(keep).vertices)
    assert np.array_equal(out.polygons.vertices, inst.polygons.select(keep).vertices)
    out.validate()


def test_concat_fills_a_column_only_some_parts_have() -> None:
    a = _instances([(0, 0, 2, 2), (4, 4, 8, 8)])  # no boxes, occluders or origins
    b = _instances([(1, 1, 3, 5)], first_id=9, boxes=np.array([[1, 1, 3, 5]], np.float64),
                   occluders=_squares([(2, 2, 3, 3)]), origins=np.array([1], np.uint8))
    out = Instances.concat([a, b])
    out.validate()
    assert out.annotation_ids.tolist() == [1, 2, 9] and out.annotation_ids.dtype == np.int64
    # The oracle: what copy-paste and MixUp wrote field by field before the column table.
    assert out.boxes.dtype == np.float32
    assert out.boxes.tolist() == np.concatenate([a.polygons.boxes(), b.boxes]).astype(np.float32).tolist()
    assert out.origins.tolist() == [0, 0, 1]
    assert len(out.occluders) == 3 and out.occluders.instance_offsets.tolist() == [0, 0, 0, 1]


def test_concat_leaves_absent_columns_absent_and_takes_empty_parts() -> None:
    a, b = _instances([(0, 0, 2, 2)]), _instances([], first_id=5)
    out = Instances.concat([a, b, Instances.empty()])
    assert len(out) == 1 and out.occluders is None and out.origins is None
    assert out.boxes is not None and out.boxes.shape == (1, 4)  # boxes: always given after mixing
    empty = Instances.concat([Instances.empty(), Instances.empty()])
    assert len(empty) == 0 and empty.labels.dtype == np.int64 and empty.boxes.shape == (0, 4)


def test_validate_names_the_column_and_the_place() -> None:
    inst = _instances([(0, 0, 2, 2), (4, 4, 8, 8)])
    with pytest.raises(ValueError, match=r"image id 7: annotation_ids must be \(2,\)"):
        inst.with_columns(annotation_ids=np.zeros(3, np.int64)).validate("image id 7")
    with pytest.raises(ValueError, match="2 instances but occluders for 0"):
        inst.with_columns(occluders=no_rings(0)).validate()
    with pytest.raises(TypeError, match="occluders must be a Polygons"):
        inst.with_columns(occluders=np.zeros(2)).validate()


def _mask(polygons: Polygons, size: tuple[int, int]) -> np.ndarray:
    return rasterize_flat(*polygons.arrays, size, 1)


@settings(max_examples=40)
@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0, 20), st.floats(1, 10), st.floats(1, 10)),
                min_size=1, max_size=4))
def test_flips_mirror_the_masks_and_undo_themselves(rects: list[tuple[float, float, float, float]]) -> None:
    # Integer vertices: no edge passes through a pixel centre, so the rasterised mask of the
    # flipped polygons is the mirrored mask exactly (no tie a half-open rule breaks one way).
    boxes = [(round(x), round(y), round(x) + round(w), round(y) + round(h)) for x, y, w, h in rects]
    inst = _instances(boxes, boxes=np.array(boxes, np.float32), occluders=_squares(boxes))
    size = (32, 42)
    lr, ud = inst.flip_lr(size[1]), inst.flip_ud(size[0])
    assert np.array_equal(_mask(lr.polygons, size), _mask(inst.polygons, size)[:, :, ::-1])
    assert np.array_equal(_mask(ud.polygons, size), _mask(inst.polygons, size)[:, ::-1, :])
    assert np.array_equal(_mask(ud.occluders, size), _mask(inst.occluders, size)[:, ::-1, :])
    # The boxes follow: each is the box of its flipped polygon.
    assert np.allclose(lr.boxes, lr.polygons.boxes()) and np.allclose(ud.boxes, ud.polygons.boxes())
    back = lr.flip_lr(size[1]).flip_ud(size[0]).flip_ud(size[0])
    assert np.array_equal(back.polygons.vertices, inst.polygons.vertices)
    assert np.array_equal(back.boxes, inst.boxes)
    assert back.labels is inst.labels  # columns a flip does not move are shared, not copied


def test_sample_round_trips_through_its_instances() -> None:
    inst = _instances([(0, 0, 2, 2)], boxes=np.array([[0, 0, 2, 2]], np.float32))
    sample = Sample(image=np.zeros((4, 4, 3), np.uint8), image_id=3, polygons=Polygons.empty(),
                    labels=np.zeros(0, np.int64), annotation_ids=np.zeros(0, np.int64))
    out = sample.with_instances(inst, image_id=4)
    out.validate()
    assert out.image_id == 4 and out.annotation_ids.tolist() == [1] and out.boxes.tolist() == [[0, 0, 2, 2]]
    assert out.instances.fields().keys() == inst.fields().keys()
    assert all(a is b for a, b in zip(out.instances.fields().values(), inst.fields().values()))
