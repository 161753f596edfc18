"""mosaic: placement, single-resample warp, pixels and polygons through the same matrices."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from seg_datamodule.transforms.geometric.flips import RandomFlipLR
from seg_datamodule.transforms.layouts.mosaic import Letterbox, MosaicAffine
from seg_datamodule.ops.affine import apply_affine, compose_affine, make_affine, to_cv2_matrix
from seg_datamodule.ops.geometry import instance_areas, polygon_boxes
from seg_datamodule.transforms.kernels.polygons import DROP_REASONS, drop_reasons, transform_polygons
from seg_datamodule.transforms.kernels.plan import TilePlan, choose_reduce, letterbox_layout, mosaic_layout, visible_tiles
from seg_datamodule.transforms.kernels.warp import warp_tiles
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons


def _arrays(polygons: Polygons, before: np.ndarray, after: np.ndarray) -> tuple:
    """transform_polygons' result with the polygons as their flat arrays."""
    return polygons.arrays, before, after

SIZES = np.array([[480, 640], [640, 427], [500, 500], [300, 640]])


def rect_ring(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)


def whole_image_polygons(sizes: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [Polygons.from_instances([[rect_ring(0, 0, w, h)]]) for h, w in sizes]


def plan_for(global_matrix: np.ndarray, center=(700.0, 600.0), sizes=SIZES, s: int = 640) -> TilePlan:
    placements, regions = mosaic_layout(sizes, center, s)
    return TilePlan(np.stack([compose_affine(global_matrix, p) for p in placements]), regions, (s, s))


AXIS_ALIGNED = make_affine((640, 640), (320, 320), scale=0.9, translate=(10.3, -5.7))
ROTATED = make_affine((640, 640), (320, 320), angle=20, scale=0.9, shear=(3, 2), translate=(10, -5))
# Shear along one axis only: one off-diagonal entry is zero, so the plan is not axis aligned.
SHEAR_X = make_affine((640, 640), (320, 320), scale=0.9, shear=(8, 0))
SHEAR_Y = make_affine((640, 640), (320, 320), scale=0.9, shear=(0, 8))


# ----------------------------------------------------------------------------- layouts


def test_mosaic_layout_places_four_images_around_the_centre() -> None:
    s, center = 640, (700.0, 600.0)
    matrices, regions = mosaic_layout(SIZES, center, s)
    corners = [apply_affine(rect_ring(0, 0, w, h), m) for (h, w), m in zip(SIZES, matrices)]
    # Long side scaled to s; each image touches the centre with the corner facing it.
    for (h, w), c in zip(SIZES, corners):
        ext = c.max(0) - c.min(0)
        assert max(ext) == pytest.approx(s)
        assert ext[0] / ext[1] == pytest.approx(w / h)
    np.testing.assert_allclose(corners[0][2], center)  # top-left image: bottom-right corner
    np.testing.assert_allclose(corners[1][3], center)  # top-right: bottom-left
    np.testing.assert_allclose(corners[2][1], center)  # bottom-left: top-right
    np.testing.assert_allclose(corners[3][0], center)  # bottom-right: top-left
    # Regions: the part of each image inside the 2s canvas.
    for (h, w), m, r in zip(SIZES, matrices, regions):
        visible = apply_affine(rect_ring(*r), m)
        assert visible.min() >= -1e-9 and visible.max() <= 2 * s + 1e-9
        assert 0 <= r[0] <= r[2] <= w and 0 <= r[1] <= r[3] <= h
    with pytest.raises(ValueError, match="image_sizes"):
        mosaic_layout(SIZES[:3], center, s)


def test_letterbox_layout_maps_back_exactly() -> None:
    m, region, scale, pad = letterbox_layout((480, 640), (640, 640))
    assert scale == pytest.approx(1.0) and pad == (0.0, 80.0)
    m, region, scale, pad = letterbox_layout((427, 300), (320, 320))
    assert scale == pytest.approx(320 / 427)
    pts = np.array([[0.0, 0.0], [300.0, 427.0], [12.5, 99.25]])
    out = apply_affine(pts, m)
    np.testing.assert_allclose((out - pad) / scale, pts, atol=1e-12)
    # Whole pixels, so the resample does not blur: (320 - 224.8) / 2 = 47.6 -> 47.
    assert pad == (float(round((320 - 300 * scale) / 2 - 0.1)), 0.0) and pad[0] == 47.0
    # An odd leftover (640 - 427 = 213) at scale 1 is a plain copy, not a half-pixel average.
    m, region, scale, pad = letterbox_layout((640, 427), (640, 640))
    assert scale == 1.0 and pad == (106.0, 0.0)


def test_choose_reduce_never_decodes_below_the_output_resolution() -> None:
    assert choose_reduce(make_affine((0, 0), (0, 0), scale=1.0)) == 1
    assert choose_reduce(make_affine((0, 0), (0, 0), scale=0.5)) == 2
    assert choose_reduce(make_affine((0, 0), (0, 0), scale=0.3)) == 2
    assert choose_reduce(make_affine((0, 0), (0, 0), scale=0.1)) == 8
    # Shear stretches some directions: largest singular value 0.26 -> 1 / 0.26 < 4.
    assert choose_reduce(make_affine((0, 0), (0, 0), scale=0.2, shear=(30, 0))) == 2


# ----------------------------------------------------------------------------- warp


@pytest.mark.parametrize("matrix", [AXIS_ALIGNED, ROTATED, SHEAR_X, SHEAR_Y],
                         ids=["axis-aligned", "rotated", "shear-x", "shear-y"])
def test_tiles_own_exactly_the_pixels_their_polygons_cover(matrix) -> None:
    """Each output pixel shows the tile whose (clipped, mapped) region polygon covers its centre."""
    plan = plan_for(matrix)
    images = [np.full((h, w, 3), 40 * (k + 1), np.uint8) for k, (h, w) in enumerate(SIZES)]
    out = warp_tiles(images, plan)
    (v, ro, io), _, _ = _arrays(*transform_polygons(whole_image_polygons(SIZES), plan))
    masks = rasterize_flat(v, ro, io, (640, 640), stride=1)
    for k in range(4):
        np.testing.assert_array_equal(out[..., 0] == 40 * (k + 1), masks[k])
    np.testing.assert_array_equal(out[..., 0] == 114, ~masks.any(0))


def _bilinear_reference(image: np.ndarray, inverse: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Float64 bilinear sampling at the exact preimages of output pixel centres (edges replicated)."""
    u = inverse[0, 0] * (xs + 0.5) + inverse[0, 1] * (ys + 0.5) + inverse[0, 2] - 0.5
    v = inverse[1, 0] * (xs + 0.5) + inverse[1, 1] * (ys + 0.5) + inverse[1, 2] - 0.5
    h, w = image.shape[:2]
    u, v = u.clip(0, w - 1), v.clip(0, h - 1)
    u0, v0 = np.minimum(np.floor(u).astype(int), w - 2), np.minimum(np.floor(v).astype(int), h - 2)
    fu, fv = (u - u0)[:, None], (v - v0)[:, None]
    img = image.astype(np.float64)
    top = img[v0, u0] * (1 - fu) + img[v0, u0 + 1] * fu
    bottom = img[v0 + 1, u0] * (1 - fu) + img[v0 + 1, u0 + 1] * fu
    return top * (1 - fv) + bottom * fv


@pytest.mark.parametrize("seed", [1, 2, 3, 5])
def test_snapped_mosaic_tiles_meet_exactly_and_resize_realises_their_matrices(seed: int) -> None:
    """The default (snapped) plan: every tile rendered by cv2.resize, the tiles meeting at the
    integer centre without gap or overlap, each pixel the exact bilinear sample of its matrix."""
    rng = np.random.default_rng(seed)
    sizes = np.stack([rng.integers(200, 641, 4), np.full(4, 640)], 1)[:, ::(1 if seed % 2 else -1)]
    geo = MosaicAffine(640)
    draw = geo.draw(rng, True)
    designed, plan = geo.plan(draw, sizes, snap=False), geo.plan(draw, sizes)
    visible = visible_tiles(plan)
    assert plan.resize is not None and (plan.resize[visible, 0] >= 0).all()
    # Snapping barely moves the geometry; the centre lands on an integer output point.
    np.testing.assert_allclose(plan.matrices[:, :, :2], designed.matrices[:, :, :2], rtol=5e-3)
    centre = apply_affine(np.array([draw.center]), draw.matrix)[0]
    np.testing.assert_array_equal(centre, np.round(centre))
    # Ownership: constant tiles against the clipped region polygons (exact, seams included).
    flat = [np.full((h, w, 3), 40 * (k + 1), np.uint8) for k, (h, w) in enumerate(sizes)]
    assert visible.sum() >= 2
    out = warp_tiles(flat, plan)
    (v, ro, io), _, _ = _arrays(*transform_polygons(whole_image_polygons(sizes), plan))
    masks = rasterize_flat(v, ro, io, (640, 640), stride=1)
    for k in range(4):
        np.testing.assert_array_equal(out[..., 0] == 40 * (k + 1), masks[k])
    np.testing.assert_array_equal(out[..., 0] == 114, ~masks.any(0))
    # Content: within one level of float64 bilinear sampling through the realised matrix.
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    out = warp_tiles(images, plan)
    for k in range(4):
        ys, xs = np.nonzero(masks[k])
        ref = _bilinear_reference(images[k], np.linalg.inv(np.vstack([plan.matrices[k], [0, 0, 1]]))[:2], xs, ys)
        assert np.abs(out[ys, xs].astype(np.float64) - ref).max() <= 1.0


def test_letterbox_at_scale_one_copies_pixels_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    plan, scale, pad = Letterbox(640).plan((480, 640))
    out = warp_tiles([image], plan)
    np.testing.assert_array_equal(out[80:560], image)
    assert (out[:80] == 114).all() and (out[560:] == 114).all()


def test_single_resample_matches_a_direct_warp_of_the_source() -> None:
    """The tile's pixels are one cv2.warpAffine of the source with the composed matrix."""
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    plan = plan_for(AXIS_ALIGNED)
    out = warp_tiles(images, plan)
    (v, ro, io), _, _ = _arrays(*transform_polygons(whole_image_polygons(SIZES), plan))
    masks = rasterize_flat(v, ro, io, (640, 640), stride=1)
    for k in range(4):
        direct = cv2.warpAffine(images[k], to_cv2_matrix(plan.matrices[k]), (640, 640),
                                flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        diff = np.abs(out[masks[k]].astype(int) - direct[masks[k]].astype(int))
        assert diff.max() <= 1  # OpenCV's fixed-point coordinates may round a sub-window differently


def test_reduced_decode_lands_where_the_full_decode_does() -> None:
    """A tile decoded at reduce 2 (pixel k covers [2k, 2k + 2)) lands on the same output pixels."""
    image = np.zeros((400, 600, 3), np.uint8)
    image[100:300, 200:400] = 255
    reduced = cv2.resize(image, (300, 200), interpolation=cv2.INTER_AREA)  # what DCT scaling gives
    plan = TilePlan(make_affine((300, 200), (160, 160), scale=0.4)[None], np.array([[0, 0, 600, 400]]), (320, 320))
    a = warp_tiles([image], plan)[..., 0] > 127
    b = warp_tiles([reduced], plan, reduces=[2])[..., 0] > 127
    assert (a != b).sum() <= 0.01 * a.sum()
    assert a.sum() == pytest.approx(200 * 200 * 0.16, rel=0.05)


def test_invisible_tiles_need_no_image() -> None:
    # Scale 1.5 about a centre far to the bottom-right: the top-left tile falls outside.
    plan = plan_for(make_affine((640, 640), (320, 320), scale=1.5), center=(1200.0, 1200.0))
    visible = visible_tiles(plan)
    assert not visible.all() and visible.any()
    images = [np.zeros((h, w, 3), np.uint8) if v else None for (h, w), v in zip(SIZES, visible)]
    warp_tiles(images, plan)  # does not need the invisible ones
    with pytest.raises(ValueError, match="tile .* is visible"):
        warp_tiles([None] * 4, plan, out=np.zeros((640, 640, 3), np.uint8))


# ----------------------------------------------------------------------------- polygons


def test_border_case_an_instance_cut_by_a_tile_edge_keeps_its_exact_shape() -> None:
    """Diamonds cut by a tile's edge and by the output's edge: exact intersections.

    The top-left image sticks out of the 2s canvas on the left, so its region starts 240 px into
    the image; diamond A straddles that edge. Diamond B, in the bottom-left tile, straddles the
    output's bottom edge. Each clipped polygon's mask must be exactly the unclipped polygon's mask
    AND the half-plane, its area the analytic one, and the tile's pixels must stop at the same
    edge; clamping the vertices instead gives other shapes.
    """
    s = 640
    sizes = np.array([[400, 640], [640, 640], [640, 640], [640, 640]])
    center = (400.0, 700.0)  # top-left image spans canvas x in [-240, 400]
    matrices, regions = mosaic_layout(sizes, center, s)
    assert regions[0][0] == pytest.approx(240.0)
    # canvas -> output: x + 10, y - 320 (scale 1), so the canvas edge x = 0 lands on output x = 10.
    g = make_affine((640, 640), (320, 320), scale=1.0, translate=(330.0, 0.0))
    plan = TilePlan(np.stack([compose_affine(g, m) for m in matrices]), regions, (s, s))

    def diamond(cx: float, cy: float, r: float = 60.0) -> np.ndarray:
        return np.array([[cx - r, cy], [cx, cy - r], [cx + r, cy], [cx, cy + r]])

    a, b = diamond(260.0, 200.0), diamond(400.0, 240.0)
    empty = Polygons.from_instances([])
    polys = [Polygons.from_instances([[a]]), empty, Polygons.from_instances([[b]]), empty]
    (v, ro, io), before, after = _arrays(*transform_polygons(polys, plan))

    # Areas: each loses a 40-deep tip (a triangle of 1600 px): A left of image x = 240, B below
    # output y = 640.
    np.testing.assert_allclose(before, [7200.0, 7200.0])
    np.testing.assert_allclose(after, [7200.0 - 1600.0, 7200.0 - 1600.0])
    mapped_a, mapped_b = apply_affine(a, plan.matrices[0]), apply_affine(b, plan.matrices[2])
    assert mapped_a[:, 0].min() < 10.0 < mapped_a[:, 0].max()
    assert mapped_b[:, 1].min() < 640.0 < mapped_b[:, 1].max()

    # Masks: exactly the unclipped polygon's mask cut by the half-plane (no ties: centres at k + .5).
    pad = 100
    ring = np.array([0, 4])
    full_a = rasterize_flat(mapped_a + pad, ring, np.array([0, 1]), (s + 2 * pad, s + 2 * pad), stride=1)[0]
    full_b = rasterize_flat(mapped_b + pad, ring, np.array([0, 1]), (s + 2 * pad, s + 2 * pad), stride=1)[0]
    full_a, full_b = full_a[pad:-pad, pad:-pad], full_b[pad:-pad, pad:-pad]
    full_a[:, :10] = False
    clipped = rasterize_flat(v, ro, io, (s, s), stride=1)
    np.testing.assert_array_equal(clipped[0], full_a)
    np.testing.assert_array_equal(clipped[1], full_b)

    # Pixels stop at the same tile edge.
    images = [np.full((h, w, 3), 40 * (k + 1), np.uint8) for k, (h, w) in enumerate(sizes)]
    out = warp_tiles(images, plan)
    rows = slice(0, 380)  # tile 0 covers output y in [-20, 380)
    assert (out[rows, :10] == 114).all() and (out[rows, 10:410] == 40).all()

    # Clamping the vertices instead would change both shapes.
    for mapped, exact in ((mapped_a, after[0]), (mapped_b, after[1])):
        clamped = np.stack([mapped[:, 0].clip(10.0 if mapped is mapped_a else 0.0, s), mapped[:, 1].clip(0, s)], 1)
        assert instance_areas(clamped, ring, np.array([0, 1]))[0] != pytest.approx(exact)


def test_flip_mirrors_pixels_and_polygons_together() -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    polys = [Polygons.from_instances([[rect_ring(10, 20, 200, 180) + k]]) for k in range(4)]
    base = make_affine((640, 640), (320, 320), scale=1.0, translate=(17.0, -9.0))
    flipped = compose_affine(RandomFlipLR.matrix(640), base)
    a_plan, b_plan = plan_for(base), plan_for(flipped)
    a, b = warp_tiles(images, a_plan), warp_tiles(images, b_plan)
    # Integer translation at scale 1: the resample is a copy, so the mirror is bit for bit.
    np.testing.assert_array_equal(b, a[:, ::-1])
    (va, roa, ioa), _, _ = _arrays(*transform_polygons(polys, a_plan))
    (vb, rob, iob), _, _ = _arrays(*transform_polygons(polys, b_plan))
    ma = rasterize_flat(va, roa, ioa, (640, 640), stride=1)
    mb = rasterize_flat(vb, rob, iob, (640, 640), stride=1)
    np.testing.assert_array_equal(mb, ma[:, :, ::-1])
    np.testing.assert_allclose(np.sort(vb[:, 0]), np.sort(640 - va[:, 0]))


def test_drop_reasons() -> None:
    # 0 kept, 1 degenerate (zero area), 2 outside, 3 mostly clipped, 4 tiny box.
    insts = [
        [rect_ring(10, 10, 50, 50)],
        [np.array([[0.0, 0.0], [5.0, 5.0], [10.0, 10.0]])],
        [rect_ring(700, 700, 800, 800)],
        [rect_ring(-95, 0, 5, 100)],
        [rect_ring(100, 100, 101.5, 140)],
    ]
    plan = TilePlan(make_affine((0, 0), (0, 0))[None], np.array([[-1000, -1000, 1000, 1000.0]]), (640, 640))
    (v, ro, io), before, after = _arrays(*transform_polygons([Polygons.from_instances(insts)], plan))
    codes, boxes = drop_reasons(Polygons(v, ro, io), before, after, min_area_ratio=0.1, min_box_size=2.0)
    assert [DROP_REASONS[c] for c in codes] == ["kept", "degenerate", "outside", "clipped", "small_box"]
    np.testing.assert_allclose(boxes[0], [10, 10, 50, 50])


@pytest.mark.parametrize("matrix", [make_affine((0, 0), (0, 0), scale=2.0),
                                    make_affine((0, 0), (0, 0), scale=2.0, angle=90.0, translate=(0, 640))],
                         ids=["scale-2", "scale-2-rotated-90"])
def test_areas_and_drop_reasons_at_their_thresholds(matrix) -> None:
    """Areas and reasons worked out by hand, with each instance exactly at a threshold.

    The matrix doubles every length (areas x 4); the rotated one (90 degrees, then shifted
    back onto the canvas) takes the general path (clip in source pixels, map, clip) and must
    agree with the axis-aligned one.
    """
    insts = [
        [rect_ring(10, 10, 11, 12)],  # 2 x 4 px: a box exactly min_box_size wide is kept
        [rect_ring(-1, 0, 1, 10)],  # half of it in view: exactly min_area_ratio is kept
        [rect_ring(-5, 0, 0, 10)],  # touches the canvas along an edge: a zero-area ring is "outside"
        [rect_ring(100, 100, 100.25, 100.5)],  # 0.5 px^2 in the output: small, but not degenerate
    ]
    plan = TilePlan(matrix[None], np.array([[-1000, -1000, 1000, 1000.0]]), (640, 640))
    polygons, before, after = transform_polygons([Polygons.from_instances(insts)], plan)
    np.testing.assert_allclose(before, [8, 80, 200, 0.5], rtol=1e-12)
    np.testing.assert_allclose(after, [8, 40, 0, 0.5], rtol=1e-12, atol=1e-9)
    codes, _ = drop_reasons(polygons, before, after, min_area_ratio=0.5, min_box_size=2.0)
    assert [DROP_REASONS[c] for c in codes] == ["kept", "kept", "outside", "small_box"]
    codes, _ = drop_reasons(polygons, before, after, min_area_ratio=0.0, min_box_size=0.0)
    assert [DROP_REASONS[c] for c in codes] == ["kept", "kept", "outside", "kept"]


# ----------------------------------------------------------------------------- real data


def _coco_polygons(root: Path):
    """pycocotools straight from the JSON, independent of seg_datamodule.coco."""
    from pycocotools.coco import COCO

    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(root / "annotations" / "instances_train2017.json"))
    out = []
    for img_id in sorted(coco.getImgIds()):
        info = coco.loadImgs(img_id)[0]
        anns = [a for a in coco.loadAnns(coco.getAnnIds(imgIds=img_id, iscrowd=False))
                if isinstance(a["segmentation"], list) and all(len(r) >= 6 for r in a["segmentation"])]
        out.append(((info["height"], info["width"]), Polygons.from_instances([a["segmentation"] for a in anns])))
    return out


def test_pixels_and_polygons_agree_on_coco_mini(coco_mini: Path) -> None:
    """Rasterise each instance at full resolution, warp the mask with the tile's matrix (nearest),
    and compare with the mask rasterised from the transformed, clipped polygons.

    Instances of at least 32 x 32 px (before and after the transform), over mosaics with and
    without rotation and shear. Nearest-neighbour resampling of a rasterised mask is off by up to
    about half a source pixel along the outline, which is what keeps the IoU below 1; thin parts
    (poles, legs) suffer most, so the per-instance floor is lower than the mean.
    """
    data = _coco_polygons(coco_mini)
    sizes = np.array([hw for hw, _ in data])
    ious, inter_total, union_total = [], 0, 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        geo = MosaicAffine(640, degrees=15.0 * (seed % 2), shear=5.0 * (seed % 2))
        ids = geo.draw_indices(rng, (7 * seed) % len(data), len(data))
        plan = geo.plan(geo.draw(rng, True), sizes[ids])
        for k, i in enumerate(ids):
            (h, w), polygons = data[i]
            v, ro, io = polygons.arrays
            if len(io) == 1:
                continue
            sub = TilePlan(plan.matrices[k : k + 1], plan.regions[k : k + 1], plan.output_size)
            (tv, tro, tio), _, _ = _arrays(*transform_polygons([Polygons(v, ro, io)], sub))
            after = rasterize_flat(tv, tro, tio, (640, 640), stride=1)
            before = rasterize_flat(v, ro, io, (h, w), stride=1)
            boxes = polygon_boxes(v, ro, io)
            for n in range(len(io) - 1):
                bw, bh = boxes[n, 2:] - boxes[n, :2]
                if bw < 32 or bh < 32 or after[n].sum() < 32 * 32:
                    continue
                warped = warp_tiles([before[n].view(np.uint8)], sub, fill=0, interpolation=cv2.INTER_NEAREST,
                                    out=np.zeros((640, 640), np.uint8)).astype(bool)
                inter, union = (after[n] & warped).sum(), (after[n] | warped).sum()
                ious.append(inter / union)
                inter_total += inter
                union_total += union
    ious = np.array(ious)
    assert len(ious) >= 30
    assert ious.mean() >= 0.97, np.sort(ious)[:10]
    assert inter_total / union_total >= 0.97
    assert ious.min() >= 0.9, np.sort(ious)[:10]
