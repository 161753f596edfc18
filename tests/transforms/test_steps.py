"""The step kinds: each step draws a fixed count from the generator it is given, then applies exactly.

The flip is checked against the full-grid crossing test of ``tests/_reference.py`` (the mirrored
reference masks of the original polygons), the draw counts against a generator advanced by hand
with the numbers the steps documented before they were split (so the batches stay put).
"""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _reference import reference_rasterize
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms import (AlbumentationsTransform, Canvas, CanvasStep, HSVJitter, LargeScaleJitter,
                                       Layout, MosaicAffine, RandomFlipLR, hsv_jitter)

_H, _W = 24, 40


def _canvas(polygons: Polygons, seed: int = 0, crowd: bool = True) -> Canvas:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (_H, _W, 3), dtype=np.uint8)
    mask = rng.integers(0, 2, (_H, _W), dtype=np.uint8) if crowd else None
    areas = polygons.areas()
    return Canvas(image, polygons, mask, areas, areas.copy())


def _state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


# Off any pixel centre or edge by an irrational-looking offset: a centre exactly on an edge is a tie
# the crossing test breaks one way (``px < x``), which a mirror turns the other way. The x and y
# offsets differ: with one offset for both, an edge along a diagonal (hypothesis found
# (-5, -5) -> (3.5, 3.5)) still runs through pixel centres.
_x = st.integers(0, 10**6).map(lambda k: -5.0 + 50.0 * k / 10**6 + 3.14159e-7)
_y = st.integers(0, 10**6).map(lambda k: -5.0 + 50.0 * k / 10**6 + 2.71828e-7)
_ring = st.lists(st.tuples(_x, _y), min_size=3, max_size=7)


@settings(max_examples=40, deadline=None)
@given(instances=st.lists(st.lists(_ring, min_size=1, max_size=2), min_size=0, max_size=3))
def test_the_flip_mirrors_pixels_crowd_and_masks_exactly(instances: list) -> None:
    polygons = Polygons.from_instances([[np.asarray(r, np.float64) for r in rings] for rings in instances])
    canvas = _canvas(polygons)
    image, crowd = canvas.image.copy(), canvas.crowd.copy()
    out = RandomFlipLR(1.0).apply(canvas, True)
    np.testing.assert_array_equal(out.image, image[:, ::-1])
    np.testing.assert_array_equal(out.crowd, crowd[:, ::-1])
    # Full resolution: a pixel centre x + 0.5 mirrors onto W - x - 0.5, the centre of pixel W - 1 - x.
    before = reference_rasterize([polygons.instance(n) for n in range(len(polygons))], (_H, _W), 1)
    after = reference_rasterize([out.polygons.instance(n) for n in range(len(out.polygons))], (_H, _W), 1)
    np.testing.assert_array_equal(after, before[:, :, ::-1])
    np.testing.assert_array_equal(out.area_before, canvas.area_before)


def test_no_flip_changes_nothing_and_an_empty_canvas_flips() -> None:
    canvas = _canvas(Polygons.empty(), crowd=False)
    assert RandomFlipLR(1.0).apply(canvas, False) is canvas
    out = RandomFlipLR(1.0).apply(canvas, True)
    assert out.crowd is None and len(out.polygons) == 0


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_each_step_draws_a_fixed_count(p: float) -> None:
    """One number for the flip, two seeds for albumentations, three gains for HSV: whatever ``p``."""
    steps_and_draws = (
        (RandomFlipLR(p), lambda r: r.random()),
        (AlbumentationsTransform(A.Compose([A.Blur(p=p)])), lambda r: r.integers(0, 2**63, size=2)),
        (HSVJitter((0.015, p, 0.4)), lambda r: r.uniform(-1, 1, 3)),
    )
    for step, by_hand in steps_and_draws:
        assert isinstance(step, CanvasStep)
        a, b = np.random.default_rng(7), np.random.default_rng(7)
        step.draw(a)
        by_hand(b)
        assert _state(a) == _state(b), type(step).__name__
    assert RandomFlipLR.phase == "plan" and HSVJitter.phase == "pixels" and AlbumentationsTransform.phase == "pixels"


@pytest.mark.parametrize("mosaic", [True, False])
def test_a_layout_then_its_flip_draw_what_the_joint_draw_drew(mosaic: bool) -> None:
    """The mosaic centre (two), the affine (six), then the flip (one); LSJ: three, then the flip."""
    geo = MosaicAffine(64, flip_lr=0.5)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    geo.draw(a, mosaic)
    geo.flip.draw(a)
    if mosaic:
        b.uniform(0, 1, size=2)
    b.random(6)
    b.random()
    assert _state(a) == _state(b)
    lsj = LargeScaleJitter(64)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    lsj.draw(a, mosaic)
    lsj.flip.draw(a)
    b.random(3)
    b.random()
    assert _state(a) == _state(b)
    assert isinstance(geo, Layout) and isinstance(lsj, Layout)
    assert (geo.mosaic_capable, geo.recipe, lsj.mosaic_capable, lsj.recipe) == (True, "mosaic", False, "lsj")


def test_hsv_runs_in_the_worker_or_is_recorded_for_the_device() -> None:
    canvas = _canvas(Polygons.empty())
    image = canvas.image.copy()
    gains = HSVJitter().draw(np.random.default_rng(1))
    worker = HSVJitter().apply(canvas, gains)
    np.testing.assert_array_equal(worker.image, hsv_jitter(image, gains))
    assert worker.hsv_gains is None
    device = HSVJitter(on_device=True).apply(canvas, gains)
    assert device.image is canvas.image and device.hsv_gains is gains
    np.testing.assert_array_equal(device.image, image)


def test_albumentations_step_moves_and_reclips_the_polygons() -> None:
    """A horizontal flip in the pipeline mirrors the vertices as keypoints; a ring poking out is clipped."""
    ring = np.array([[-4.0, 2.0], [10.0, 2.0], [10.0, 8.0], [-4.0, 8.0]])
    unclipped = Polygons.from_instances([[ring]])
    clipped = unclipped.clip((0.0, 0.0, float(_W), float(_H)))
    canvas = Canvas(_canvas(Polygons.empty()).image, clipped, None, unclipped.areas(), clipped.areas())
    step = AlbumentationsTransform(A.Compose([A.HorizontalFlip(p=1.0)]))
    assert step.geometric
    out = step.apply(canvas, step.draw(np.random.default_rng(0)))
    np.testing.assert_array_equal(out.image, canvas.image[:, ::-1])
    np.testing.assert_allclose(out.polygons.boxes(), [[_W - 10.0, 2.0, _W, 8.0]], atol=1e-4)
    # The drop compares with the area before both clips: 14 x 6 before, 10 x 6 kept.
    np.testing.assert_allclose(out.area_after / out.area_before, [60.0 / 84.0], rtol=1e-5)
