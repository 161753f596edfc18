"""The vertical flip and the quarter turns are exact: masks rasterised after them are the turned masks.

The reference is the full-grid crossing test of ``tests/_reference.py`` at full resolution, on the
original polygons, flipped or turned with numpy; the polygons come from hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _reference import reference_rasterize
from seg_datamodule.errors import UserInputError
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms import Canvas, MirrorStep, RandomFlipLR, RandomFlipUD, RandomRotate90, flip_canvas
from seg_datamodule.transforms.geometric.turns import rotate90_matrix

# Off any pixel centre by an irrational-looking offset: a centre exactly on an edge is a tie the
# crossing test breaks one way, which a flip or a turn would break the other way.
_coord = st.integers(0, 10**6).map(lambda k: -5.0 + 42.0 * k / 10**6 + 3.14159e-7)
_ring = st.lists(st.tuples(_coord, _coord), min_size=3, max_size=7)
_instances = st.lists(st.lists(_ring, min_size=1, max_size=2), min_size=0, max_size=3)


def _canvas(polygons: Polygons, size: tuple[int, int]) -> Canvas:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    crowd = rng.integers(0, 2, size, dtype=np.uint8)
    return Canvas(image, polygons, crowd, polygons.areas(), polygons.areas())


def _masks(polygons: Polygons, size: tuple[int, int]) -> np.ndarray:
    return reference_rasterize([polygons.instance(n) for n in range(len(polygons))], size, 1)


def _polygons(instances: list) -> Polygons:
    return Polygons.from_instances([[np.asarray(r, np.float64) for r in rings] for rings in instances])


@settings(max_examples=30, deadline=None)
@given(instances=_instances, axis=st.sampled_from([0, 1]))
def test_both_flips_are_exact(instances: list, axis: int) -> None:
    polygons, size = _polygons(instances), (24, 36)
    canvas = _canvas(polygons, size)
    image, crowd, before = canvas.image.copy(), canvas.crowd.copy(), _masks(polygons, size)
    out = (RandomFlipUD if axis == 0 else RandomFlipLR)(1.0).apply(canvas, True)
    np.testing.assert_array_equal(out.image, np.flip(image, axis))
    np.testing.assert_array_equal(out.crowd, np.flip(crowd, axis))
    np.testing.assert_array_equal(_masks(out.polygons, size), np.flip(before, axis + 1))


def test_the_flips_share_one_kernel_but_stay_apart() -> None:
    # A recipe tells the layout's horizontal flip from a vertical one by class.
    assert isinstance(RandomFlipUD(0.5), MirrorStep) and isinstance(RandomFlipLR(0.5), MirrorStep)
    assert not isinstance(RandomFlipUD(0.5), RandomFlipLR) and not isinstance(RandomFlipLR(0.5), RandomFlipUD)
    assert repr(RandomFlipUD(0.25)) == "RandomFlipUD(p=0.25)" and repr(RandomFlipLR(1)) == "RandomFlipLR(p=1.0)"
    canvas = _canvas(_polygons([[[(1.0, 2.0), (5.0, 2.0), (1.0, 7.0)]]]), (10, 12))
    assert RandomFlipUD(0.0).apply(canvas, False) is canvas
    out = flip_canvas(canvas, 0)  # by hand: y -> 10 - y
    np.testing.assert_allclose(out.polygons.vertices, [[1.0, 8.0], [5.0, 8.0], [1.0, 3.0]])


@settings(max_examples=30, deadline=None)
@given(instances=_instances, turns=st.integers(0, 3))
def test_quarter_turns_are_exact(instances: list, turns: int) -> None:
    polygons, size = _polygons(instances), (32, 32)
    canvas = _canvas(polygons, size)
    image, crowd, before = canvas.image.copy(), canvas.crowd.copy(), _masks(polygons, size)
    out = RandomRotate90(1.0).apply(canvas, turns)
    np.testing.assert_array_equal(out.image, np.rot90(image, turns))
    np.testing.assert_array_equal(out.crowd, np.rot90(crowd, turns))
    np.testing.assert_array_equal(_masks(out.polygons, size), np.rot90(before, turns, axes=(1, 2)))
    np.testing.assert_allclose(out.polygons.areas(), polygons.areas(), rtol=1e-9, atol=1e-9)
    assert out.image.flags.c_contiguous


@given(turns=st.integers(-8, 8), x=st.floats(0, 30), y=st.floats(0, 20))
def test_four_turns_are_the_identity_and_one_turn_is_by_hand(turns: int, x: float, y: float) -> None:
    m = rotate90_matrix(turns, (20, 30))
    back = rotate90_matrix(4 - turns % 4, (20, 30) if turns % 2 == 0 else (30, 20))
    p = m[:, :2] @ [x, y] + m[:, 2]
    np.testing.assert_allclose(back[:, :2] @ p + back[:, 2], [x, y], atol=1e-9)
    np.testing.assert_array_equal(rotate90_matrix(1, (20, 30)), [[0.0, 1.0, 0.0], [-1.0, 0.0, 30.0]])


def test_draws_are_fixed_in_count_and_cover_every_turn() -> None:
    for p in (0.0, 0.5, 1.0):
        a, b = np.random.default_rng(5), np.random.default_rng(5)
        RandomRotate90(p).draw(a)
        RandomFlipUD(p).draw(a)
        b.random(2)
        b.random()
        assert a.bit_generator.state == b.bit_generator.state
    turns = {RandomRotate90(1.0).draw(np.random.default_rng(s)) for s in range(60)}
    assert turns == {1, 2, 3} and RandomRotate90(0.0).draw(np.random.default_rng(0)) == 0
    assert RandomFlipUD.phase == RandomRotate90.phase == "plan"


def test_bad_arguments_and_a_non_square_turn() -> None:
    for step in (RandomFlipUD, RandomRotate90):
        with pytest.raises(UserInputError, match=rf"{step.__name__}: p must be"):
            step(2.0)
    canvas = _canvas(Polygons.empty(), (8, 12))
    assert RandomRotate90().apply(canvas, 2).image.shape == (8, 12, 3)
    with pytest.raises(ValueError, match="square canvases only, got 8 x 12"):
        RandomRotate90().apply(canvas, 1)
