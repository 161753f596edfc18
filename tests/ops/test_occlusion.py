"""Occlusion is exact: what copy-paste leaves of an instance, rasterised by the collate, is bit for
bit its own region AND NOT the union of everything pasted above it, both by the full-grid
reference crossing test, at strides 1, 2, 4 and 8 and on canvases the stride does not divide."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _reference import reference_rasterize
from seg_datamodule.data.batching.collate import collate_detection
from seg_datamodule.ops.occlusion import group_occluders, rasterize_visible
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.group.copy_paste import paste_instances


def _sample(instances: list[list[np.ndarray]], canvas: tuple[int, int], first_id: int, colour: int = 0) -> Sample:
    polygons = Polygons.from_instances(instances)
    return Sample(image=np.full((*canvas, 3), colour, np.uint8), image_id=first_id, polygons=polygons,
                  labels=np.arange(len(instances), dtype=np.int64),
                  annotation_ids=first_id + np.arange(len(instances), dtype=np.int64),
                  boxes=polygons.boxes().astype(np.float32))


def _shape(draw: st.DrawFn, h: int, w: int, near: tuple[float, float] | None) -> np.ndarray:
    """A triangle, quad or pentagon; near a point (to overlap, nest or touch) or anywhere."""
    k = draw(st.integers(3, 5))
    # Half-pixel and whole-pixel coordinates as well as arbitrary ones: cell centres and pixel
    # corners then lie on edges and vertices, where touching shapes meet.
    coord = st.one_of(st.integers(-4, 2 * max(h, w)).map(lambda v: v / 2.0),
                      st.floats(-3.0, float(max(h, w)) + 3.0, allow_nan=False))
    pts = np.array([[draw(coord), draw(coord)] for _ in range(k)], np.float64)
    if near is not None:
        scale = draw(st.sampled_from([0.2, 0.5, 1.0]))
        pts = near + (pts - pts.mean(axis=0)) * scale
    return pts


@st.composite
def scenes(draw: st.DrawFn):
    stride = draw(st.sampled_from([1, 2, 4, 8]))
    h, w = draw(st.integers(5, 37)), draw(st.integers(5, 37))
    own = [[_shape(draw, h, w, None)] for _ in range(draw(st.integers(1, 4)))]
    pasted = []
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["anywhere", "on", "nested", "touching"]))
        target = own[draw(st.integers(0, len(own) - 1))][0]
        if how == "anywhere":
            ring = _shape(draw, h, w, None)
        elif how == "on":
            ring = _shape(draw, h, w, tuple(target.mean(axis=0)))
        elif how == "nested":  # a shrunken copy of the target (inside it when convex) or a grown one
            factor = draw(st.sampled_from([0.5, 1.0, 1.7]))
            ring = target.mean(axis=0) + (target - target.mean(axis=0)) * factor
        else:  # sharing an edge with the target: the target mirrored about one of its vertices
            v = target[draw(st.integers(0, len(target) - 1))]
            ring = 2 * v - target
        pasted.append([ring])
    return stride, (h, w), own, pasted


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_collated_masks_are_own_and_not_the_union_above(scene) -> None:
    stride, canvas, own, pasted = scene
    target, source = _sample(own, canvas, 100), _sample(pasted, canvas, 200, colour=255)
    out, occluded = paste_instances(target, source, np.ones(len(pasted), bool), min_area_ratio=0.0,
                                    min_box_size=0.0)
    batch = collate_detection([out], mask_stride=stride)
    above = reference_rasterize(pasted, canvas, stride).any(axis=0)
    want_own = reference_rasterize(own, canvas, stride) & ~above
    masks = batch.masks.numpy()
    ids = batch.annotation_ids.tolist()
    for n in range(len(own)):
        if 100 + n in ids:
            got = masks[ids.index(100 + n)]
            assert np.array_equal(got, want_own[n]), (n, np.argwhere(got != want_own[n])[:5].tolist())
        else:  # dropped: no pixel centre of it stays visible (min_area_ratio 0)
            pix_above = reference_rasterize(pasted, canvas, 1).any(axis=0)
            mine = reference_rasterize([own[n]], canvas, 1)[0]
            assert mine.any() and not (mine & ~pix_above).any()
    assert occluded == len(own) - sum(100 + n in ids for n in range(len(own)))
    want_pasted = reference_rasterize(pasted, canvas, stride)
    for p in range(len(pasted)):
        assert np.array_equal(masks[ids.index(200 + p)], want_pasted[p])
    # Pasted pixels: exactly the pixel centres of the union of the pasted polygons.
    painted = batch.images[0, 0].numpy() == 255
    assert np.array_equal(painted, reference_rasterize(pasted, canvas, 1).any(axis=0))


@settings(max_examples=200, deadline=None)
@given(scenes())
def test_rasterize_visible_with_every_occluder_attached_matches_the_reference(scene) -> None:
    """The kernel alone, every pasted shape above every instance (no box pre-selection)."""
    stride, canvas, own, pasted = scene
    occ = Polygons.from_instances([[ring for inst in pasted for ring in inst]] * len(own))
    got = rasterize_visible(Polygons.from_instances(own).arrays, occ.arrays, canvas, stride)
    want = reference_rasterize(own, canvas, stride) & ~reference_rasterize(pasted, canvas, stride).any(axis=0)
    assert np.array_equal(got, want)


def test_group_occluders_attaches_by_box_and_handles_empty_sets() -> None:
    occ = Polygons.from_instances([[np.array([[0, 0], [4, 0], [4, 4]], float)],
                                   [np.array([[20, 20], [24, 20], [24, 24]], float)]])
    boxes = np.array([[3, 3, 8, 8], [40, 40, 50, 50], [24.5, 20, 30, 22]], float)
    grouped, touched = group_occluders(boxes, occ.arrays, occ.boxes())
    g = Polygons(*grouped)
    assert len(g) == 3 and touched.tolist() == [True, False, True]  # 24.5 is within the 1 px margin
    assert [len(g.instance(n)) for n in range(3)] == [1, 0, 1]
    assert np.array_equal(g.instance(2)[0], occ.instance(1)[0])
    empty, none = group_occluders(np.zeros((0, 4)), occ.arrays, occ.boxes())
    assert len(Polygons(*empty)) == 0 and none.shape == (0,)
    nothing, t = group_occluders(boxes, Polygons.empty().arrays, np.zeros((0, 4)))
    assert len(Polygons(*nothing)) == 3 and not t.any()


def test_rasterize_visible_refuses_mismatched_occluders() -> None:
    own = Polygons.from_instances([[np.array([[0, 0], [4, 0], [4, 4]], float)]])
    with pytest.raises(ValueError, match="occluders hold 2 instances for 1"):
        rasterize_visible(own.arrays, Polygons.concat([own, own]).arrays, (8, 8), 1)
    assert np.array_equal(rasterize_visible(own.arrays, None, (8, 8), 2), reference_rasterize([own.instance(0)], (8, 8), 2))
