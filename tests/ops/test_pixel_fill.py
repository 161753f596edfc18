"""Ultralytics' mask-target rule (``mask_fill: ultralytics``): each instance filled only in its own
window, bit for bit the fill of the whole canvas then one resize (a plain reference written here
from the rule), and Ultralytics' own ``polygon2mask`` where Ultralytics is installed."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seg_datamodule.data.batching.collate import DetectionCollate, collate_detection
from seg_datamodule.ops.occlusion import rasterize_visible
from seg_datamodule.ops.pixel_fill import rasterize_flat_pixel_fill
from seg_datamodule.ops.ragged import flatten_rings
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons, Sample


def full_canvas_reference(instances: list[list[np.ndarray]], canvas: tuple[int, int], stride: int) -> np.ndarray:
    """The rule on the whole (padded) canvas: clip, cast, fill, resize; one instance at a time."""
    h, w = canvas
    hp, wp = -(-h // stride), -(-w // stride)
    out = np.zeros((len(instances), hp, wp), bool)
    for n, rings in enumerate(instances):
        page = np.zeros((hp * stride, wp * stride), np.uint8)
        if rings:
            cv2.fillPoly(page, [np.clip(np.asarray(r, np.float64), 0, [w, h]).astype(np.int32) for r in rings], 1)
        out[n] = cv2.resize(page, (wp, hp), interpolation=cv2.INTER_LINEAR) > 0
    return out


def _fill(instances: list[list[np.ndarray]], canvas: tuple[int, int], stride: int) -> np.ndarray:
    return rasterize_flat_pixel_fill(*flatten_rings(instances), canvas, stride)


@st.composite
def scenes(draw: st.DrawFn):
    stride = draw(st.sampled_from([1, 2, 3, 4, 8]))
    h, w = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    # Whole, half and arbitrary coordinates, some beyond the canvas (clipped), some far inside.
    coord = st.one_of(st.integers(-8, 2 * max(h, w) + 8).map(lambda v: v / 2.0),
                      st.floats(-10.0, float(max(h, w)) + 10.0, allow_nan=False))
    instances = []
    for _ in range(draw(st.integers(0, 4))):
        rings = [np.array([[draw(coord), draw(coord)] for _ in range(draw(st.integers(3, 7)))])
                 for _ in range(draw(st.integers(0, 3)))]
        instances.append(rings)
    return instances, (h, w), stride


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_the_windowed_fill_is_the_full_canvas_fill_then_resize(scene) -> None:
    instances, canvas, stride = scene
    np.testing.assert_array_equal(_fill(instances, canvas, stride), full_canvas_reference(instances, canvas, stride))


def test_a_hand_computed_square_grows_by_the_cells_half_filled() -> None:
    # Pixels 4..9 filled both ways (fillPoly includes the boundary). At stride 4 cell j reads pixels
    # 4j+1 and 4j+2 with weights 1/2: cell 1 reads 5, 6 (both in), cell 2 reads 9, 10 (one in).
    # A cell is set at half (rounded up): 4 of 4, 2 of 4, 2 of 4 set; 1 of 4 (cell (2, 2)) not.
    square = [[np.array([[4.0, 4.0], [9.0, 4.0], [9.0, 9.0], [4.0, 9.0]])]]
    expected = np.zeros((1, 4, 4), bool)
    expected[0, 1, 1] = expected[0, 1, 2] = expected[0, 2, 1] = True
    np.testing.assert_array_equal(_fill(square, (16, 16), 4), expected)
    # The exact cell-centre test keeps only the cell whose centre (6, 6) is inside.
    exact = rasterize_flat(*flatten_rings(square), (16, 16), 4)
    assert exact[0].sum() == 1 and exact[0, 1, 1]


def test_fractional_vertices_are_truncated_as_ultralytics_casts_them() -> None:
    # 4.99 -> 4 and 9.99 -> 9: the same pixels as the square above; 10.0 would reach pixel 10.
    square = [[np.array([[4.99, 4.99], [9.99, 4.99], [9.99, 9.99], [4.99, 9.99]])]]
    assert _fill(square, (16, 16), 4)[0].sum() == 3
    wider = [[np.array([[4.0, 4.0], [10.0, 4.0], [10.0, 10.0], [4.0, 10.0]])]]
    assert _fill(wider, (16, 16), 4)[0].sum() == 4


def test_a_polygon_beyond_the_canvas_is_clipped_to_it() -> None:
    # Clipped to [0, 16]: the fill reaches pixel 16, outside the canvas: the whole grid is set.
    huge = [[np.array([[-50.0, -50.0], [80.0, -50.0], [80.0, 80.0], [-50.0, 80.0]])]]
    assert _fill(huge, (16, 16), 4).all()
    # Entirely left of the canvas: clipped onto its edge column x = 0, which no cell reads at stride 4.
    left = [[np.array([[-30.0, 2.0], [-10.0, 2.0], [-10.0, 14.0]])]]
    assert not _fill(left, (16, 16), 4).any()
    # At stride 1 the edge column is the canvas's own first column, as Ultralytics' fill gives.
    assert _fill(left, (16, 16), 1)[0, 2:15, 0].all()


def test_empty_inputs() -> None:
    assert _fill([], (10, 12), 4).shape == (0, 3, 3)
    assert not _fill([[]], (10, 12), 4).any()  # an instance without rings: an empty mask


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="instance 1: ring 1 has 2 vertices"):
        rasterize_flat_pixel_fill(np.zeros((5, 2)), np.array([0, 3, 5]), np.array([0, 1, 2]), (8, 8), 4)
    with pytest.raises(ValueError, match="instance 0: NaN or infinite"):
        rasterize_flat_pixel_fill(np.array([[0.0, 0.0], [np.nan, 1.0], [2.0, 2.0]]), np.array([0, 3]),
                                  np.array([0, 1]), (8, 8), 4)
    with pytest.raises(ValueError, match="mask_fill must be one of"):
        DetectionCollate(mask_fill="pixel")


@pytest.mark.needs("ultralytics")
def test_the_fill_is_ultralytics_polygon2mask() -> None:
    from ultralytics.data.utils import polygon2mask

    rng = np.random.default_rng(0)
    for _ in range(200):
        canvas = (int(rng.integers(4, 40)) * 4, int(rng.integers(4, 40)) * 4)
        centre = rng.uniform(0, canvas[::-1])
        ring = centre + rng.normal(0, rng.uniform(2, 40), (int(rng.integers(3, 12)), 2))
        # Ultralytics clips its segments to the image before it fills them.
        clipped = np.clip(ring, 0, canvas[::-1])
        theirs = polygon2mask(canvas, [clipped.reshape(-1)], downsample_ratio=4).astype(bool)
        np.testing.assert_array_equal(_fill([[ring]], canvas, 4)[0], theirs)


def _sample(instances: list[list[np.ndarray]], canvas: tuple[int, int]) -> Sample:
    polygons = Polygons.from_instances(instances)
    return Sample(image=np.zeros((*canvas, 3), np.uint8), image_id=7, polygons=polygons,
                  labels=np.zeros(len(instances), np.int64), annotation_ids=np.arange(len(instances), dtype=np.int64),
                  boxes=polygons.boxes().astype(np.float32))


def test_the_collate_draws_the_chosen_rule_and_leaves_the_rest_alone() -> None:
    instances = [[np.array([[4.0, 4.0], [9.0, 4.0], [9.0, 9.0], [4.0, 9.0]])],
                 [np.array([[20.5, 3.0], [30.0, 11.0], [17.0, 14.5]]), np.array([[2.0, 20.0], [8.0, 30.0], [1.0, 29.0]])]]
    exact = collate_detection([_sample(instances, (32, 36))])
    filled = DetectionCollate(mask_fill="ultralytics", shared_memory=False)([_sample(instances, (32, 36))])
    np.testing.assert_array_equal(filled.masks.numpy(), full_canvas_reference(instances, (32, 36), 4))
    np.testing.assert_array_equal(exact.masks.numpy(), rasterize_flat(*flatten_rings(instances), (32, 36), 4))
    assert filled.masks.sum() > exact.masks.sum()
    for name in ("boxes", "labels", "annotation_ids", "images"):
        assert getattr(filled, name).equal(getattr(exact, name)), name
    assert "mask_fill='ultralytics'" in repr(DetectionCollate(mask_fill="ultralytics"))


def test_occlusion_takes_the_occluders_at_the_same_rule() -> None:
    own = [[np.array([[2.0, 2.0], [30.0, 2.0], [30.0, 30.0], [2.0, 30.0]])]]
    above = [[np.array([[10.0, 10.0], [21.0, 10.0], [21.0, 21.0], [10.0, 21.0]])]]
    got = rasterize_visible(flatten_rings(own), flatten_rings(above), (32, 32), 4, fill="ultralytics")
    expected = full_canvas_reference(own, (32, 32), 4) & ~full_canvas_reference(above, (32, 32), 4)
    np.testing.assert_array_equal(got, expected)
    assert got.sum() < full_canvas_reference(own, (32, 32), 4).sum()


def test_the_datamodule_key_reaches_every_loaders_collate(demo_dir, tmp_path) -> None:
    from seg_datamodule import COCOSegDataModule

    def first_batch(fill: str):
        dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, batch_size=4, num_workers=0,
                               cache_dir=str(tmp_path / "cache"), mask_fill=fill, seed=5)
        dm.setup("fit")
        train, val = dm.train_dataloader(), dm.val_dataloader()
        assert train.collate_fn.mask_fill == val.collate_fn.mask_fill == fill
        return next(iter(train))

    exact, filled = first_batch("centre"), first_batch("ultralytics")
    # The same samples, drawn by the same generators: only the masks' rule differs.
    for name in ("images", "boxes", "labels", "annotation_ids", "ignore_masks"):
        assert getattr(filled, name).equal(getattr(exact, name)), name
    assert filled.masks.shape == exact.masks.shape and filled.masks.sum() > exact.masks.sum()
    with pytest.raises(ValueError, match="mask_fill must be one of .*'centre', 'ultralytics'.*got 'exact'"):
        COCOSegDataModule(demo_dir=str(demo_dir), mask_fill="exact")
