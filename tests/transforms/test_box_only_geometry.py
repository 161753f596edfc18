"""Box-only instances through the geometry (issue 41): the rectangle of the box goes in, is moved and
clipped as polygons are, and comes out without a ring; its box is the reference transform of the box."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.kernels.box_only import box_corners, with_box_rings, without_rings

TRIANGLE = np.array([[1.0, 1.0], [5.0, 1.0], [1.0, 4.0]])


def test_rings_in_and_out() -> None:
    polygons = Polygons.concat([Polygons.from_instances([[TRIANGLE]]),
                                Polygons(np.zeros((0, 2)), np.zeros(1, np.int64), np.zeros(2, np.int64)),
                                Polygons.from_instances([[TRIANGLE + 10]])])
    boxed, has_mask = with_box_rings(polygons, np.array([[0, 0, 0, 0], [2, 3, 4, 5], [0, 0, 0, 0]], float))
    assert has_mask.tolist() == [True, False, True] and np.diff(boxed.instance_offsets).tolist() == [1, 1, 1]
    np.testing.assert_array_equal(boxed.instance(1)[0], [[2, 3], [6, 3], [6, 8], [2, 8]])
    np.testing.assert_array_equal(boxed.instance(2)[0], TRIANGLE + 10)
    back = without_rings(boxed, has_mask)
    np.testing.assert_array_equal(back.vertices, polygons.vertices)
    np.testing.assert_array_equal(back.instance_offsets, polygons.instance_offsets)
    np.testing.assert_array_equal(back.ring_offsets, polygons.ring_offsets)
    # Nothing box-only: the same objects back.
    plain = Polygons.from_instances([[TRIANGLE]])
    assert with_box_rings(plain, np.zeros((1, 4)))[0] is plain and without_rings(plain, np.ones(1, bool)) is plain
    assert len(with_box_rings(Polygons.empty(), np.zeros((0, 4)))[0]) == 0


@settings(max_examples=60, deadline=None)
@given(
    box=st.tuples(st.floats(-50, 150), st.floats(-50, 150), st.floats(0.5, 80), st.floats(0.5, 80)),
    scale=st.floats(0.2, 3.0), tx=st.floats(-40, 40), ty=st.floats(-40, 40), flip=st.booleans(),
)
def test_the_box_moves_as_its_corners_do(box, scale, tx, ty, flip) -> None:
    """Scale, translate and flip, then clip to a 100 x 100 canvas: the box of the moved rectangle is
    the clipped box of the moved corners (the reference transform of the original box)."""
    size = 100.0
    boxed, _ = with_box_rings(Polygons(np.zeros((0, 2)), np.zeros(1, np.int64), np.zeros(2, np.int64)),
                              np.array([box]))
    matrix = np.array([[scale, 0.0, tx], [0.0, scale, ty]])
    moved = boxed.transform(matrix)
    if flip:
        moved = moved.flip_lr(size)
    clipped = moved.clip((0.0, 0.0, size, size))
    corners = box_corners(np.array([box]))[0] @ matrix[:, :2].T + matrix[:, 2]
    if flip:
        corners[:, 0] = size - corners[:, 0]
    ref = np.clip([corners[:, 0].min(), corners[:, 1].min(), corners[:, 0].max(), corners[:, 1].max()], 0, size)
    if ref[2] > ref[0] and ref[3] > ref[1]:
        np.testing.assert_allclose(clipped.boxes()[0], ref, atol=1e-6)
    else:  # outside the canvas: nothing left, dropped as the polygons' rules drop it
        assert clipped.areas()[0] == 0
