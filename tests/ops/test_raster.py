"""The rasteriser is bit-identical to the plain full-grid crossing test, and close to pycocotools."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _reference import reference_rasterize
from seg_datamodule import rasterize_flat, rasterize_polygons
import seg_datamodule.ops.raster as raster_module


def _assert_exact(instances, canvas_size, stride):
    got = rasterize_polygons(instances, canvas_size, stride)
    want = reference_rasterize(instances, canvas_size, stride)
    assert got.dtype == np.bool_ and got.shape == want.shape
    diff = np.argwhere(got != want)
    assert len(diff) == 0, f"{len(diff)} cells differ, first at {diff[:5].tolist()}"
    return got


# --- empty and degenerate -----------------------------------------------------------------------

@pytest.mark.parametrize("canvas_size, stride, shape", [((640, 640), 4, (0, 160, 160)),
                                                         ((13, 7), 4, (0, 4, 2)), ((5, 5), 1, (0, 5, 5))])
def test_no_instances_gives_empty_stack(canvas_size, stride, shape):
    out = rasterize_polygons([], canvas_size, stride)
    assert out.shape == shape and out.dtype == np.bool_


def test_instance_without_rings_is_all_false():
    vertices = np.array([[0, 0], [8, 0], [8, 8]], float)
    out = rasterize_flat(vertices, np.array([0, 3]), np.array([0, 0, 1]), (8, 8), 1)
    assert out.shape == (2, 8, 8)
    assert not out[0].any() and out[1].any()


def test_empty_canvas():
    assert rasterize_polygons([[[[0, 0], [1, 0], [0, 1]]]], (0, 5), 4).shape == (1, 0, 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_coordinates_name_the_instance(bad):
    good = [[0, 0], [4, 0], [4, 4]]
    with pytest.raises(ValueError, match=r"instance 2\b.*(NaN|infinite)"):
        rasterize_polygons([[good], [good], [good, [[0, 0], [bad, 1], [2, 2]]]], (8, 8), 1)


def test_short_and_odd_rings_are_rejected():
    with pytest.raises(ValueError, match="instance 1.*at least 3"):
        rasterize_polygons([[[0, 0, 4, 0, 4, 4]], [[0, 0, 4, 4]]], (8, 8), 1)
    with pytest.raises(ValueError, match="instance 0.*odd"):
        rasterize_polygons([[[0, 0, 4, 0, 4]]], (8, 8), 1)
    with pytest.raises(ValueError, match="instance 0: ring 0 has 2 vertices"):
        rasterize_flat(np.zeros((2, 2)), np.array([0, 2]), np.array([0, 1]), (8, 8), 1)


@pytest.mark.parametrize("stride", [0, -4])
def test_bad_stride_value(stride):
    with pytest.raises(ValueError, match=f"stride must be >= 1, got {stride}"):
        rasterize_polygons([], (8, 8), stride)


@pytest.mark.parametrize("stride", [2.0, True, "4"])
def test_bad_stride_type(stride):
    # The same message shape as every other entry point (DetectionCollate, COCOSegDataModule).
    with pytest.raises(TypeError, match="stride must be an int >= 1, got"):
        rasterize_polygons([], (8, 8), stride)


def test_offsets_are_checked():
    with pytest.raises(ValueError, match="ring_offsets"):
        rasterize_flat(np.zeros((3, 2)), np.array([0, 2]), np.array([0, 1]), (8, 8), 1)
    with pytest.raises(ValueError, match="instance_offsets"):
        rasterize_flat(np.zeros((3, 2)), np.array([0, 3]), np.array([0, 2]), (8, 8), 1)
    with pytest.raises(ValueError, match="at least one entry"):
        rasterize_flat(np.zeros((0, 2)), np.array([0]), np.array([], np.int64), (8, 8), 1)
    with pytest.raises(ValueError, match="at least one entry"):
        rasterize_flat(np.zeros((0, 2)), np.array([], np.int64), np.array([0]), (8, 8), 1)
    with pytest.raises(ValueError, match="non-decreasing"):
        rasterize_flat(np.zeros((6, 2)), np.array([0, 3, 6]), np.array([0, 2, 1, 2]), (8, 8), 1)


def test_flat_arrays_are_checked_like_lists():
    # rasterize_flat is what the collate calls: it checks its own arguments and names the
    # instance, whatever comes before the bad one.
    tri = np.array([[0, 0], [8, 0], [8, 8]], float)
    bad = tri.copy()
    bad[1, 0] = np.nan
    vertices = np.concatenate([tri, tri, tri, bad])
    with pytest.raises(ValueError, match=r"instance 2: NaN or infinite"):
        rasterize_flat(vertices, np.array([0, 3, 6, 9, 12]), np.array([0, 1, 2, 4]), (8, 8), 1)
    with pytest.raises(ValueError, match="instance 1: ring 2 has 2 vertices"):
        rasterize_flat(np.zeros((8, 2)), np.array([0, 3, 6, 8]), np.array([0, 1, 3]), (8, 8), 1)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        rasterize_flat(tri, np.array([0, 3]), np.array([0, 1]), (8, 8), 0)
    with pytest.raises(TypeError, match="stride must be an int"):
        rasterize_flat(tri, np.array([0, 3]), np.array([0, 1]), (8, 8), "4")


def test_default_stride_is_four():
    tri = np.array([[0, 0], [30, 0], [30, 30]], float)
    offsets = (np.array([0, 3]), np.array([0, 1]))
    np.testing.assert_array_equal(rasterize_flat(tri, *offsets, (32, 32)),
                                  rasterize_flat(tri, *offsets, (32, 32), 4))
    assert rasterize_polygons([[tri]], (32, 32)).shape == (1, 8, 8)


# --- hand-computed cases ------------------------------------------------------------------------

def test_square_hand_computed():
    # Square [2, 10] x [2, 10] at stride 4: centres 2, 6, 10, 14. px < 10 and 2 <= py < 10:
    # columns 0 (2), 1 (6); a centre on the left edge is inside, on the right edge outside.
    out = rasterize_polygons([[[[2, 2], [10, 2], [10, 10], [2, 10]]]], (16, 16), 4)
    want = np.zeros((4, 4), bool)
    want[0:2, 0:2] = True
    np.testing.assert_array_equal(out[0], want)


def test_flat_coco_list_equals_array_ring():
    ring = np.array([[1.5, 2.0], [30.2, 4.0], [20.0, 25.7], [3.0, 19.0]])
    a = rasterize_polygons([[ring]], (32, 40), 2)
    b = rasterize_polygons([[ring.ravel().tolist()]], (32, 40), 2)
    c = rasterize_polygons([ring], (32, 40), 2)  # a lone (K, 2) array is one ring
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_instance_is_union_of_rings_not_xor():
    sq1 = [[0, 0], [10, 0], [10, 10], [0, 10]]
    sq2 = [[5, 5], [15, 5], [15, 15], [5, 15]]
    out = _assert_exact([[sq1, sq2]], (16, 16), 1)[0]
    assert out[7, 7]  # the overlap is inside (an XOR of rings would clear it)
    assert out.sum() == 100 + 100 - 25


def test_instances_are_independent_and_ordered():
    a = [[0, 0], [8, 0], [8, 8], [0, 8]]
    b = [[8, 8], [16, 8], [16, 16], [8, 16]]
    out = rasterize_polygons([[a], [b], [a]], (16, 16), 1)
    assert out[0, 0:8, 0:8].all() and not out[0, 8:, 8:].any()
    assert out[1, 8:, 8:].all() and not out[1, :8, :8].any()
    np.testing.assert_array_equal(out[0], out[2])


# --- adversarial cases against the full-grid reference ----------------------------------------

def _star(n_points: int, r_out: float, r_in: float, cx: float, cy: float) -> np.ndarray:
    t = np.arange(2 * n_points) * np.pi / n_points
    r = np.where(np.arange(2 * n_points) % 2 == 0, r_out, r_in)
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)


def _pentagram(cx: float, cy: float, r: float) -> np.ndarray:
    t = np.arange(5) * 4 * np.pi / 5  # every second vertex: self-intersecting
    return np.stack([cx + r * np.sin(t), cy - r * np.cos(t)], 1)


ADVERSARIAL = {
    "vertices_on_cell_centres": [[[2, 2], [14, 2], [14, 14], [2, 14]], [[6, 2], [10, 10], [2, 10]]],
    "edges_through_cell_centres": [[[0, 2], [16, 2], [16, 6], [0, 6]], [[2, 0], [18, 16], [2, 16]]],
    "horizontal_and_vertical_edges": [[[1, 1], [9, 1], [9, 5], [13, 5], [13, 13], [1, 13]]],
    "duplicate_vertices": [[[1, 1], [1, 1], [12, 1], [12, 1], [12, 12], [1, 12], [1, 12]]],
    "self_intersecting_star": [_pentagram(16, 16, 14), _star(7, 15, 5, 16, 16)],
    "bow_tie": [[[0, 0], [20, 20], [20, 0], [0, 20]]],
    "partly_outside": [[[-10, -10], [12, -3], [40, 30], [5, 50]]],
    "wholly_outside": [[[-30, -30], [-10, -30], [-10, -10]], [[100, 100], [140, 100], [120, 130]]],
    "smaller_than_a_cell": [[[5.1, 5.1], [5.9, 5.2], [5.5, 5.8]], [[1.9, 1.9], [2.1, 1.9], [2.1, 2.1], [1.9, 2.1]]],
    "huge_coordinates": [[[-1e6, -1e6], [1e6, -1e6 + 3], [1e6, 1e6], [-1e6 + 7, 1e6]],
                         [[-1e6, 5], [1e6, 6], [1e6, 17.3]]],
    "collinear_zero_area": [[[0, 0], [8, 8], [16, 16]], [[2, 6], [10, 6], [20, 6]], [[6, 0], [6, 9], [6, 20]]],
    "spiral_2000_vertices": [np.stack([16 + np.linspace(0.5, 15, 2000) * np.cos(np.linspace(0, 40, 2000)),
                                       16 + np.linspace(0.5, 15, 2000) * np.sin(np.linspace(0, 40, 2000))], 1)],
    "tiny_slanted_edges": [[[0.0, 0.0], [31.999999999, 2.0000000001], [0.000000001, 30.0]]],
    "thin_sliver_on_centres": [[[0, 2], [32, 2], [32, 2.0000001], [0, 2.0000001]]],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("stride", [1, 2, 4, 8])
@pytest.mark.parametrize("canvas_size", [(32, 32), (29, 35), (17, 3)])
def test_adversarial_cases_bit_exact(name, stride, canvas_size):
    rings = ADVERSARIAL[name]
    instances = [[r] for r in rings] + [rings]  # each ring alone, then all as one instance
    _assert_exact(instances, canvas_size, stride)


def test_intercept_rounding_cannot_leak_a_column(monkeypatch):
    # The intercept x0 + t * dx can round across a cell centre px; the column count is fixed by
    # exact comparisons, not by rounding x / stride. Lines through centres at many slopes.
    rng = np.random.default_rng(3)
    instances = []
    for _ in range(300):
        a = (rng.integers(0, 16, 2) + 0.5) * 4
        b = (rng.integers(0, 16, 2) + 0.5) * 4
        c = a + rng.integers(-3, 4, 2) * 1e-12
        instances.append([[a, b, c]])
    _assert_exact(instances, (64, 64), 4)


@pytest.mark.parametrize("chunk_vertices", [1, 7, 20, 1 << 20])
def test_chunking_is_invisible(monkeypatch, chunk_vertices):
    # Rings of one instance may land in different chunks: the union must not notice.
    rng = np.random.default_rng(5)
    instances = [[rng.uniform(-5, 70, (rng.integers(3, 12), 2)) for _ in range(rng.integers(1, 4))]
                 for _ in range(20)]
    monkeypatch.setattr(raster_module, "_CHUNK_VERTICES", chunk_vertices)
    np.testing.assert_array_equal(rasterize_polygons(instances, (64, 64), 2),
                                  reference_rasterize(instances, (64, 64), 2))


def test_wide_sort_keys_equal_narrow_ones(monkeypatch):
    # Sort keys pack (ring, row, column); they fit 32 bits for stride 4 on 640, but not for
    # hundreds of rings on a 2,000-pixel stride-1 grid, which takes 64-bit keys. One ring per
    # chunk always fits, so the two must agree.
    # Many rings in few instances: the keys overflow 32 bits while the output stays 8 masks
    # (300 one-ring instances made two 1.3 GB stacks and a 10 GB peak).
    rng = np.random.default_rng(11)
    instances = [[rng.uniform(-50, 2100, (rng.integers(3, 9), 2)) for _ in range(64)] for _ in range(8)]
    rings, row_bits, col_bits = 8 * 64, (2048 - 1).bit_length(), 2048 .bit_length()
    assert (rings + 1) << (row_bits + col_bits) > np.iinfo(np.int32).max  # one chunk: 64-bit keys
    wide = rasterize_polygons(instances, (2048, 2048), 1)
    monkeypatch.setattr(raster_module, "_CHUNK_VERTICES", 1)
    narrow = rasterize_polygons(instances, (2048, 2048), 1)
    assert wide.any()
    np.testing.assert_array_equal(wide, narrow)


def test_writes_into_given_zeroed_output():
    out = np.zeros((1, 8, 8), bool)
    res = rasterize_flat(np.array([[0, 0], [32, 0], [32, 32]], float), np.array([0, 3]),
                         np.array([0, 1]), (32, 32), 4, out=out)
    assert res is out and out.any()
    with pytest.raises(ValueError, match="out must be C-contiguous bool"):
        rasterize_flat(np.zeros((3, 2)), np.array([0, 3]), np.array([0, 1]), (32, 32), 4,
                       out=np.zeros((1, 8, 8), np.uint8))


# --- hypothesis properties --------------------------------------------------------------------

coordinate = st.one_of(
    st.floats(-40, 80, allow_nan=False, allow_infinity=False),
    st.integers(-10, 70).map(float),
    st.integers(-2, 18).map(lambda k: (k + 0.5) * 4.0),  # exactly on stride-4 centres
    st.integers(-4, 36).map(lambda k: (k + 0.5) * 2.0),
)
ring_strategy = st.lists(st.tuples(coordinate, coordinate), min_size=3, max_size=12)
instance_strategy = st.lists(ring_strategy, min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    instances=st.lists(instance_strategy, min_size=0, max_size=4),
    height=st.integers(1, 70),
    width=st.integers(1, 70),
    stride=st.sampled_from([1, 2, 3, 4, 5, 8]),
)
def test_matches_full_grid_reference(instances, height, width, stride):
    # 3 and 5 take the corrected estimate of the column count, powers of two the exact one.
    _assert_exact(instances, (height, width), stride)


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300)), min_size=1, max_size=40),
    size=st.integers(1, 300),
)
def test_fill_spans_equals_slice_assignment(spans, size):
    # Two stores per span, through byte-strided views of 1..256-byte elements: against plain
    # slicing, with spans of every length class, touching, overlapping and ending at the last cell.
    spans = [(min(s, size - 1), min(n, size - min(s, size - 1))) for s, n in spans]
    starts = np.array([s for s, _ in spans], np.int64)
    lengths = np.array([n for _, n in spans], np.int64)
    got = np.zeros(size, bool)
    raster_module._fill_spans(got, starts.copy(), lengths)
    want = np.zeros(size, bool)
    for s, n in spans:
        want[s : s + n] = True
    np.testing.assert_array_equal(got, want)
    assert got.view(np.uint8).max(initial=0) <= 1  # every cell a valid bool


@settings(max_examples=300, deadline=None)
@given(
    stride=st.integers(1, 64),
    n=st.integers(0, 300),
    picks=st.lists(st.tuples(st.integers(-2, 302), st.integers(-3, 3)), min_size=1, max_size=30),
    others=st.lists(st.floats(allow_nan=False), max_size=10),
)
def test_centre_count_equals_a_binary_search(stride, n, picks, others):
    # ceil(v / stride - 0.5) with no correction must equal a search of the exact float64
    # centres, for values on a centre and a few ulps either side of it, and anything else.
    values = [float(v) for v in others]
    for k, ulps in picks:
        v = (k + 0.5) * stride
        for _ in range(abs(ulps)):
            v = float(np.nextafter(v, np.inf if ulps > 0 else -np.inf))
        values.append(v)
    values = np.array(values)
    centres = (np.arange(n) + 0.5) * stride
    got = raster_module._count_centres_below(values, stride, n)
    np.testing.assert_array_equal(got, np.searchsorted(centres, values, side="left"))


@pytest.mark.parametrize("stride", [3, 6, 7])
def test_non_power_of_two_strides_on_centres(stride):
    # Vertices exactly on cell centres and one ulp either side, where x / stride rounds.
    rng = np.random.default_rng(stride)
    instances = []
    for _ in range(200):
        ring = (rng.integers(0, 12, (rng.integers(3, 7), 2)) + 0.5) * stride
        ring = np.nextafter(ring, ring + rng.choice([-1.0, 0.0, 1.0], ring.shape))
        instances.append([ring])
    _assert_exact(instances, (12 * stride, 12 * stride), stride)


@settings(max_examples=100, deadline=None)
@given(
    ring=ring_strategy,
    dx=st.integers(-3, 3),
    dy=st.integers(-3, 3),
    stride=st.sampled_from([1, 2, 4]),
)
def test_shift_by_whole_cells_shifts_the_mask(ring, dx, dy, stride):
    # Moving a ring by whole cells moves its mask (away from the borders): a geometric property,
    # independent of the reference.
    ring = np.asarray(ring) + 100.0
    moved = ring + np.array([dx, dy]) * stride
    a = rasterize_polygons([[ring]], (400, 400), stride)[0]
    b = rasterize_polygons([[moved]], (400, 400), stride)[0]
    np.testing.assert_array_equal(np.roll(a, (dy, dx), axis=(0, 1)), b)


@settings(max_examples=100, deadline=None)
@given(ring=ring_strategy, stride=st.sampled_from([1, 2, 4, 8]))
def test_mask_lies_inside_the_ring_bounding_box(ring, stride):
    ring = np.asarray(ring)
    mask = rasterize_polygons([[ring]], (64, 64), stride)[0]
    rows, cols = np.nonzero(mask)
    if len(rows):
        assert ((cols + 0.5) * stride >= ring[:, 0].min()).all()
        assert ((cols + 0.5) * stride < ring[:, 0].max()).all()
        assert ((rows + 0.5) * stride >= ring[:, 1].min()).all()
        assert ((rows + 0.5) * stride < ring[:, 1].max()).all()


# --- real annotations against pycocotools ------------------------------------------------------

def test_stride_one_matches_pycocotools_on_coco_mini(coco_mini):
    from pycocotools import mask as mask_utils

    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    sizes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    ious = []
    exact_checked = 0
    for ann in data["annotations"]:
        if ann["iscrowd"] or not isinstance(ann["segmentation"], list):
            continue
        h, w = sizes[ann["image_id"]]
        rings = [r for r in ann["segmentation"] if len(r) >= 6]
        ours = rasterize_polygons([rings], (h, w), 1)[0]
        theirs = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(rings, h, w))).astype(bool)
        union = np.logical_or(ours, theirs).sum()
        ious.append(np.logical_and(ours, theirs).sum() / union if union else 1.0)
        if exact_checked < 40:  # and bit-exact against the reference on real rings, stride 4
            _assert_exact([rings], (h, w), 4)
            exact_checked += 1
    # Every non-crowd polygon of the file (619 in coco-mini val, 66 in the shipped ten images).
    assert len(ious) == sum(not a["iscrowd"] and isinstance(a["segmentation"], list) for a in data["annotations"]) > 50
    assert np.mean(ious) >= 0.95, f"mean IoU {np.mean(ious):.4f}"


def test_non_contiguous_output_is_refused():
    # Writing into a reshaped copy would silently lose every mask.
    out = np.zeros((1, 8, 12), bool)[:, :, :8]
    with pytest.raises(ValueError, match="not contiguous"):
        rasterize_flat(np.array([[0, 0], [32, 0], [32, 32]], float), np.array([0, 3]),
                       np.array([0, 1]), (32, 32), 4, out=out)
