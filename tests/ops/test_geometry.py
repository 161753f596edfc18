"""geometry: exact rectangle clip (hypothesis properties, a scalar clip oracle, the reference rasteriser), areas, boxes, affines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _reference import reference_clip_ring, reference_rasterize, reference_signed_area
from seg_datamodule.ops.affine import affine_scale, apply_affine, compose_affine, identity_affine, invert_affine, make_affine, to_cv2_matrix
from seg_datamodule.ops.geometry import clip_polygons, concat_polygons, instance_areas, polygon_boxes, ring_areas, select_instances
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons

# ----------------------------------------------------------------------------- strategies

coord = st.floats(-60.0, 160.0, allow_nan=False, allow_infinity=False)


@st.composite
def star_polygon(draw: st.DrawFn) -> np.ndarray:
    """A simple polygon (possibly concave): star-shaped about a centre it strictly contains.

    Angular gaps are below pi, so the centre is in the kernel and no two edges cross.
    """
    k = draw(st.integers(3, 14))
    cx, cy = draw(coord), draw(coord)
    steps = np.array(draw(st.lists(st.floats(1.0, 1.9), min_size=k, max_size=k)))
    start = draw(st.floats(0.0, 2 * np.pi))
    angles = start + 2 * np.pi * np.cumsum(steps) / steps.sum()
    radii = np.array(draw(st.lists(st.floats(1.0, 80.0), min_size=k, max_size=k)))
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1)


@st.composite
def rectangle(draw: st.DrawFn) -> np.ndarray:
    x0, x1 = sorted((draw(coord), draw(coord)))
    y0, y1 = sorted((draw(coord), draw(coord)))
    return np.array([x0, y0, x1, y1])


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1-4 instances of 1-3 star rings each."""
    inst = [[draw(star_polygon()) for _ in range(draw(st.integers(1, 3)))]
            for _ in range(draw(st.integers(1, 4)))]
    return Polygons.from_instances(inst).arrays


@st.composite
def touching_rect(draw: st.DrawFn, integer: bool = False) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Instances and a rectangle with vertices snapped onto its edges and corners.

    Star polygons alone almost never put a vertex exactly on a clip edge, where the inside test
    ties (``x == x0``) and a crossing would have ``t = 0`` or ``1``; here about half the
    vertices are moved onto an edge line (x0, y0, x1 or y1) or a corner, so edges also run
    along the clip boundary. The rings may then cross themselves: use for properties that hold
    for any ring under the even-odd rule, not for area monotonicity.
    """
    rect = draw(rectangle())
    if integer:
        rect = np.round(rect)
    rings_per_instance = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 4)))]
    instances_ = []
    for n_rings in rings_per_instance:
        rings = []
        for _ in range(n_rings):
            ring = draw(star_polygon()).copy()
            snaps = draw(st.lists(st.sampled_from(["none", "none", "x0", "y0", "x1", "y1", "corner"]),
                                  min_size=len(ring), max_size=len(ring)))
            for vertex, snap in zip(ring, snaps):
                if snap == "x0" or snap == "x1":
                    vertex[0] = rect[0] if snap == "x0" else rect[2]
                elif snap == "y0" or snap == "y1":
                    vertex[1] = rect[1] if snap == "y0" else rect[3]
                elif snap == "corner":
                    vertex[0] = rect[0] if abs(vertex[0] - rect[0]) < abs(vertex[0] - rect[2]) else rect[2]
                    vertex[1] = rect[1] if abs(vertex[1] - rect[1]) < abs(vertex[1] - rect[3]) else rect[3]
            rings.append(ring)
        instances_.append(rings)
    return Polygons.from_instances(instances_).arrays, rect


def as_instances(v: np.ndarray, ro: np.ndarray, io: np.ndarray, shift: np.ndarray | float = 0.0) -> list[list[np.ndarray]]:
    """Flat arrays back to nested rings (for the reference rasteriser)."""
    return [[v[ro[r] : ro[r + 1]] + shift for r in range(io[n], io[n + 1])] for n in range(len(io) - 1)]


@st.composite
def affine(draw: st.DrawFn) -> np.ndarray:
    return make_affine(
        center=(draw(coord), draw(coord)),
        output_center=(draw(coord), draw(coord)),
        angle=draw(st.floats(-180, 180)),
        scale=draw(st.floats(0.1, 10.0)),
        shear=(draw(st.floats(-60, 60)), draw(st.floats(-60, 60))),
        translate=(draw(coord), draw(coord)),
    )


def square(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)


# ----------------------------------------------------------------------------- clip properties


@settings(max_examples=300, deadline=None)
@given(polys=instances(), rect=rectangle())
def test_clipped_polygon_lies_inside_its_rectangle(polys, rect) -> None:
    _assert_inside(polys, rect)


@settings(max_examples=200, deadline=None)
@given(case=touching_rect())
def test_clipped_polygon_touching_its_rectangle_lies_inside_it(case) -> None:
    _assert_inside(*case)


def _assert_inside(polys, rect) -> None:
    v, ro, io = clip_polygons(*polys, rect)
    assert (v[:, 0] >= rect[0]).all() and (v[:, 0] <= rect[2]).all()
    assert (v[:, 1] >= rect[1]).all() and (v[:, 1] <= rect[3]).all()
    assert ro[0] == 0 and ro[-1] == len(v) and io[0] == 0 and io[-1] == len(ro) - 1
    assert len(io) == len(polys[2]), "every instance keeps its slot"
    assert (np.diff(ro) >= 3).all(), "rings with fewer than 3 vertices are removed"


@settings(max_examples=200, deadline=None)
@given(polys=instances(), margin=st.floats(0.0, 10.0))
def test_clip_of_a_polygon_wholly_inside_returns_it_unchanged(polys, margin) -> None:
    v, ro, io = polys
    rect = np.r_[v.min(0) - margin, v.max(0) + margin]
    cv, cro, cio = clip_polygons(v, ro, io, rect)
    # The inputs themselves (Polygons.clip relies on it to return self), also with vertices on
    # the rectangle's edges (margin 0).
    assert cv is v and cro is ro and cio is io


@settings(max_examples=300, deadline=None)
@given(polys=instances(), rect=rectangle())
def test_clipping_never_increases_area(polys, rect) -> None:
    before = np.abs(ring_areas(polys[0], polys[1]))
    v, ro, io = clip_polygons(*polys, rect)
    # Ring by ring: clip each ring alone so rings map one to one.
    for r in range(len(polys[1]) - 1):
        ring = polys[0][polys[1][r] : polys[1][r + 1]]
        cv, cro, _ = clip_polygons(ring, np.array([0, len(ring)]), np.array([0, 1]), rect)
        after = np.abs(ring_areas(cv, cro)).sum()
        assert after <= before[r] * (1 + 1e-12) + 1e-9
    assert (instance_areas(v, ro, io) <= instance_areas(*polys) * (1 + 1e-12) + 1e-9).all()


@settings(max_examples=120, deadline=None)
@given(case=st.one_of(st.tuples(instances(), rectangle().map(np.round)), touching_rect(integer=True)))
def test_clip_equals_mask_and_rectangle_on_a_grid(case) -> None:
    """The clipped polygon's mask is the polygon's mask AND the rectangle's.

    Both masks come from the reference full-grid crossing test (``tests/_reference.py``), not
    the package rasteriser, on a grid whose centres (k + 0.5) avoid the rectangle's integer
    edges, so ties cannot occur. Half the cases have vertices on the rectangle's edges.
    """
    (v, ro, io), rect = case
    shift = np.array([60.0, 60.0])
    size = (230, 230)
    full = reference_rasterize(as_instances(v, ro, io, shift), size, 1)
    cv, cro, cio = clip_polygons(v, ro, io, rect)
    clipped = reference_rasterize(as_instances(cv, cro, cio, shift), size, 1)
    ys, xs = np.mgrid[0 : size[0], 0 : size[1]] + 0.5
    xs, ys = xs - shift[0], ys - shift[1]
    in_rect = (xs >= rect[0]) & (xs <= rect[2]) & (ys >= rect[1]) & (ys <= rect[3])
    np.testing.assert_array_equal(clipped, full & in_rect[None])


@settings(max_examples=150, deadline=None)
@given(case=st.one_of(st.tuples(instances(), rectangle()), touching_rect(), touching_rect(integer=True)))
def test_clip_matches_a_scalar_sutherland_hodgman_oracle(case) -> None:
    """Ring by ring against ``reference_clip_ring``: the same signed area and the same mask.

    Vertex lists are not compared: where the clip region is (nearly) degenerate, rounding of a
    crossing can add or remove a duplicate vertex on the boundary, which changes no area or mask.
    """
    (v, ro, io), rect = case
    shift = np.array([60.0, 60.0])
    scale = max(1.0, float(np.abs(v).max()) ** 2)
    integer_rect = bool((rect == np.round(rect)).all())
    for r in range(len(ro) - 1):
        ring = v[ro[r] : ro[r + 1]]
        cv, cro, _ = clip_polygons(ring, np.array([0, len(ring)]), np.array([0, 1]), rect)
        expected = reference_clip_ring(ring, rect)
        assert reference_signed_area(cv) == pytest.approx(reference_signed_area(expected), rel=0, abs=1e-9 * scale)
        if len(cro) == 1:  # the package dropped the ring: nothing of positive area was left
            assert abs(reference_signed_area(expected)) <= 1e-9 * scale
        elif integer_rect and len(expected) >= 3:
            np.testing.assert_array_equal(reference_rasterize([[cv + shift]], (230, 230), 1),
                                          reference_rasterize([[expected + shift]], (230, 230), 1))


@settings(max_examples=100, deadline=None)
@given(polys=instances(), rect=rectangle(), rect2=rectangle())
def test_per_ring_rectangles_equal_separate_clips(polys, rect, rect2) -> None:
    v, ro, io = polys
    r = len(ro) - 1
    rects = np.where((np.arange(r) % 2 == 0)[:, None], rect, rect2)
    cv, cro, cio = clip_polygons(v, ro, io, rects)
    parts = []
    for k in range(r):
        ring = v[ro[k] : ro[k + 1]]
        parts.append(clip_polygons(ring, np.array([0, len(ring)]), np.array([0, 1]), rects[k]))
    ev, ero, _ = concat_polygons(parts)
    np.testing.assert_array_equal(cv, ev)
    np.testing.assert_array_equal(cro, ero)


def test_clip_of_a_concave_polygon_cut_in_two_keeps_exact_area() -> None:
    # A "U": clipping below the bar leaves two 3x5 legs joined along the clip edge.
    u = np.array([[0, 0], [3, 0], [3, 8], [7, 8], [7, 0], [10, 0], [10, 10], [0, 10]], np.float64)
    v, ro, io = clip_polygons(u, np.array([0, 8]), np.array([0, 1]), (-1, -1, 11, 5))
    assert instance_areas(v, ro, io)[0] == pytest.approx(30.0)
    mask = rasterize_flat(v, ro, io, (12, 12), stride=1)[0]
    expected = np.zeros((12, 12), bool)
    expected[0:5, 0:3] = expected[0:5, 7:10] = True
    np.testing.assert_array_equal(mask, expected)


def test_clip_differs_from_clamping_where_an_edge_crosses_the_border() -> None:
    # The Ultralytics bug class (#9429, #23663, #24935): clamping moves the slanted edge.
    tri = np.array([[-10.0, 0.0], [10.0, 0.0], [10.0, 20.0]])
    ro, io = np.array([0, 3]), np.array([0, 1])
    v, cro, cio = clip_polygons(tri, ro, io, (0, 0, 100, 100))
    assert instance_areas(v, cro, cio)[0] == pytest.approx(0.5 * 20 * 20 - 0.5 * 10 * 10)  # 150
    clamped = tri.clip(0, 100)
    assert instance_areas(clamped, ro, io)[0] == pytest.approx(100.0)  # wrong: a different shape


def test_clip_removes_instances_outside_but_keeps_their_slots() -> None:
    v, ro, io = Polygons.from_instances([[square(0, 0, 4, 4)], [square(50, 50, 60, 60)], [square(2, 2, 8, 8)]]).arrays
    cv, cro, cio = clip_polygons(v, ro, io, (0, 0, 5, 5))
    np.testing.assert_array_equal(cio, [0, 1, 1, 2])
    np.testing.assert_allclose(instance_areas(cv, cro, cio), [16, 0, 9])


def test_clip_empty_input_and_bad_rect() -> None:
    v, ro, io = Polygons.empty().arrays
    cv, cro, cio = clip_polygons(v, ro, io, (0, 0, 1, 1))
    assert cv.shape == (0, 2) and list(cro) == [0] and list(cio) == [0]
    v, ro, io = Polygons.from_instances([[square(0, 0, 1, 1)]]).arrays
    with pytest.raises(ValueError, match="x0 <= x1"):
        clip_polygons(v, ro, io, (2, 0, 1, 1))
    with pytest.raises(ValueError, match="rect must be"):
        clip_polygons(v, ro, io, np.zeros((3, 4)))
    # Per-ring rectangles: one bad row is enough.
    v, ro, io = Polygons.from_instances([[square(0, 0, 1, 1), square(2, 2, 3, 3)]]).arrays
    with pytest.raises(ValueError, match="y0 <= y1"):
        clip_polygons(v, ro, io, np.array([[0, 0, 5, 5], [0, 3, 5, 2]]))


# ----------------------------------------------------------------------------- areas, boxes, selection


def test_ring_and_instance_areas() -> None:
    v, ro, io = Polygons.from_instances([[square(0, 0, 3, 2), square(10, 10, 11, 11)], [square(0, 0, 5, 5)[::-1]]]).arrays
    np.testing.assert_allclose(ring_areas(v, ro), [6, 1, -25])
    np.testing.assert_allclose(instance_areas(v, ro, io), [7, 25])
    # Far from the origin the result stays exact (cross products are taken about the first vertex).
    far = square(1e7, 1e7, 1e7 + 3, 1e7 + 2)
    assert ring_areas(far, np.array([0, 4]))[0] == 6.0
    assert instance_areas(*Polygons.empty().arrays).shape == (0,)
    # Rings of 1 and 2 vertices have no area, and do not disturb the rings around them.
    v = np.concatenate([square(0, 0, 3, 2), [[7.0, 7.0]], square(0, 0, 5, 5)[::-1], [[1.0, 1.0], [4.0, 9.0]],
                        square(1, 1, 2, 2)])
    ro = np.array([0, 4, 5, 9, 11, 15])
    np.testing.assert_allclose(ring_areas(v, ro), [6, 0, -25, 0, 1])
    np.testing.assert_allclose(instance_areas(v, ro, np.array([0, 2, 5])), [6, 26])


@settings(max_examples=100, deadline=None)
@given(polys=instances())
def test_box_from_polygons_contains_the_mask(polys) -> None:
    v, ro, io = polys
    shift = np.array([60.0, 60.0])
    masks = rasterize_flat(v + shift, ro, io, (230, 230), stride=1)
    boxes = polygon_boxes(v + shift, ro, io)
    for mask, (x0, y0, x1, y1) in zip(masks, boxes):
        ys, xs = np.nonzero(mask)
        if len(xs):
            assert (xs + 0.5 >= x0).all() and (xs + 0.5 <= x1).all()
            assert (ys + 0.5 >= y0).all() and (ys + 0.5 <= y1).all()


def test_boxes_of_empty_instances_are_zero() -> None:
    v, ro, io = Polygons.from_instances([[square(1, 2, 3, 5)]]).arrays
    io = np.array([0, 0, 1, 1])  # empty, square, empty
    np.testing.assert_array_equal(polygon_boxes(v, ro, io), [[0, 0, 0, 0], [1, 2, 3, 5], [0, 0, 0, 0]])


def test_select_instances() -> None:
    v, ro, io = Polygons.from_instances([[square(0, 0, 1, 1)], [square(5, 5, 6, 6), square(7, 7, 9, 9)], [square(2, 2, 3, 3)]]).arrays
    sv, sro, sio = select_instances(v, ro, io, np.array([False, True, False]))
    np.testing.assert_array_equal(sv, np.concatenate([square(5, 5, 6, 6), square(7, 7, 9, 9)]))
    np.testing.assert_array_equal(sro, [0, 4, 8])
    np.testing.assert_array_equal(sio, [0, 2])
    with pytest.raises(ValueError, match="keep must be"):
        select_instances(v, ro, io, np.array([1, 0, 1]))


# ----------------------------------------------------------------------------- affines


@settings(max_examples=300, deadline=None)
@given(m=affine(), pts=st.lists(st.tuples(coord, coord), min_size=1, max_size=20))
def test_affine_then_inverse_is_identity(m, pts) -> None:
    v = np.array(pts, np.float64)
    back = apply_affine(apply_affine(v, m), invert_affine(m))
    np.testing.assert_allclose(back, v, atol=1e-7 * max(1.0, np.abs(v).max()))
    np.testing.assert_allclose(compose_affine(invert_affine(m), m), identity_affine(), atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(a=affine(), b=affine(), pts=st.lists(st.tuples(coord, coord), min_size=1, max_size=10))
def test_compose_applies_right_to_left(a, b, pts) -> None:
    v = np.array(pts)
    np.testing.assert_allclose(apply_affine(v, compose_affine(b, a)), apply_affine(apply_affine(v, a), b),
                               rtol=1e-9, atol=1e-6)


def test_make_affine_matches_opencv_rotation_convention() -> None:
    import cv2

    m = make_affine(center=(10, 20), output_center=(10, 20), angle=30, scale=2.0)
    np.testing.assert_allclose(m, cv2.getRotationMatrix2D((10, 20), 30, 2.0), atol=1e-12)
    assert affine_scale(m) == pytest.approx(2.0)


def test_to_cv2_matrix_moves_pixels_like_vertices() -> None:
    import cv2

    # A 2x upscale in continuous pixels maps pixel k to [2k, 2k + 2): nearest sampling repeats it.
    m = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    src = np.arange(12, dtype=np.uint8).reshape(3, 4)
    out = cv2.warpAffine(src, to_cv2_matrix(m), (8, 6), flags=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(out, np.repeat(np.repeat(src, 2, 0), 2, 1))


def test_affine_errors() -> None:
    with pytest.raises(ValueError, match="singular"):
        invert_affine(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        compose_affine(np.eye(3))
    with pytest.raises(ValueError, match="scale must be positive"):
        make_affine((0, 0), (0, 0), scale=0.0)
    with pytest.raises(ValueError, match="vertices must be"):
        apply_affine(np.zeros(4), identity_affine())
