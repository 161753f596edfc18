"""transform_polygons_batch: a batch's polygons in one pass, bit for bit what each sample gave alone.

The reference is the per-sample transport as it was before the batch pass (``_per_sample`` below,
a deliberate second copy kept in the test tree): every array of every sample must be equal, not
close, since the batches the loader gives are hashed against the code before the change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.ops.affine import compose_affine, make_affine
from seg_datamodule.ops.ragged import segment_ids
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.kernels.plan import TilePlan, mosaic_layout
from seg_datamodule.transforms.kernels.polygons import transform_polygons, transform_polygons_batch


def _per_sample(polygons: list[Polygons], plan: TilePlan) -> tuple[Polygons, np.ndarray, np.ndarray]:
    """The per-sample transport before the batch pass (kept verbatim as the reference)."""
    merged = Polygons.concat(polygons)
    inst_tile = np.repeat(np.arange(len(plan), dtype=np.int64), [len(p) for p in polygons])
    dets = np.abs(np.linalg.det(plan.matrices[:, :, :2])) if len(plan) else np.zeros(0)
    area_before = merged.areas() * dets[inst_tile]
    ring_tile = inst_tile[segment_ids(merged.instance_offsets)]
    lin = plan.matrices[:, :, :2]
    axis_aligned = bool((lin[:, 0, 1] == 0).all() and (lin[:, 1, 0] == 0).all() and (lin[:, 0, 0] > 0).all()
                        and (lin[:, 1, 1] > 0).all())
    h, w = plan.output_size
    if axis_aligned:
        diag, shift = lin[:, [0, 1], [0, 1]], plan.matrices[:, :, 2]
        vert_tile = ring_tile[segment_ids(merged.ring_offsets)]
        vertices = merged.vertices
        if len(vertices):
            vertices = vertices * diag[vert_tile] + shift[vert_tile]
        mapped = plan.regions * np.tile(diag, 2) + np.tile(shift, 2)
        rects = np.concatenate([np.maximum(mapped[:, :2], 0.0), np.minimum(mapped[:, 2:], (w, h))], axis=1)
        rects[:, 2:] = np.maximum(rects[:, 2:], rects[:, :2])
        out = Polygons(vertices, merged.ring_offsets, merged.instance_offsets).clip(rects[ring_tile])
    else:
        clipped = merged.clip(plan.regions[ring_tile])
        ring_tile = inst_tile[segment_ids(clipped.instance_offsets)]
        vert_tile = ring_tile[segment_ids(clipped.ring_offsets)]
        vertices = clipped.vertices
        if len(vertices):
            m = plan.matrices[vert_tile]
            vertices = np.einsum("vij,vj->vi", m[:, :, :2], vertices) + m[:, :, 2]
        out = Polygons(vertices, clipped.ring_offsets, clipped.instance_offsets).clip((0.0, 0.0, float(w), float(h)))
    return out, area_before, out.areas()


Transported = tuple[Polygons, np.ndarray, np.ndarray]


def _assert_identical(got: Transported, want: Transported) -> None:
    for a, b in zip(got[0].arrays, want[0].arrays):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b), "not bit-identical"
    # Areas are float64 now; before, a sample clipped to no vertex at all got numpy's int64 zeros
    # (``bincount`` of an empty input), the same values.
    for a, b in zip(got[1:], want[1:]):
        assert a.dtype == np.float64 and a.shape == b.shape
        assert np.array_equal(a, b), "not bit-identical"


def _star(rng: np.random.Generator, cx: float, cy: float, radius: float) -> np.ndarray:
    """A star-shaped (often concave) ring around (cx, cy)."""
    k = int(rng.integers(3, 12))
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = rng.uniform(0.2, 1.0, k) * radius
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1)


def _tile_polygons(rng: np.random.Generator, h: int, w: int) -> Polygons:
    """0-5 instances of 1-3 rings each, some reaching past the image's edge."""
    instances = []
    for _ in range(int(rng.integers(0, 6))):
        rings = [_star(rng, rng.uniform(-20, w + 20), rng.uniform(-20, h + 20), rng.uniform(2, max(h, w) / 2))
                 for _ in range(int(rng.integers(1, 4)))]
        instances.append(rings)
    return Polygons.from_instances(instances) if instances else Polygons.empty()


def _sample(rng: np.random.Generator, rotated: bool) -> tuple[list[Polygons], TilePlan]:
    sizes = rng.integers(40, 700, (4, 2))
    placements, regions = mosaic_layout(sizes, tuple(rng.uniform(100, 540, 2)), 320)
    matrix = make_affine((640, 640), (320, 320), angle=float(rng.uniform(-30, 30)) if rotated else 0.0,
                         scale=float(rng.uniform(0.4, 1.6)), translate=tuple(rng.uniform(-50, 50, 2)))
    plan = TilePlan(np.stack([compose_affine(matrix, p) for p in placements]), regions, (320, 320))
    return [_tile_polygons(rng, int(h), int(w)) for h, w in sizes], plan


@given(st.integers(0, 2**32 - 1), st.lists(st.booleans(), min_size=1, max_size=6))
@settings(max_examples=80, deadline=None)
def test_a_batch_equals_its_samples_alone_bit_for_bit(seed: int, rotated: list[bool]) -> None:
    rng = np.random.default_rng(seed)
    samples = [_sample(rng, r) for r in rotated]
    got = transform_polygons_batch([p for p, _ in samples], [plan for _, plan in samples])
    assert len(got) == len(samples)
    for (polygons, plan), result in zip(samples, got):
        _assert_identical(result, _per_sample(polygons, plan))
        _assert_identical(transform_polygons(polygons, plan), result)


def test_real_mosaics_on_coco_mini_equal_the_per_sample_transport(coco_mini: Path) -> None:
    """32 mosaics of real COCO polygons as the loader plans them (snapped, some flipped), in one batch."""
    from seg_datamodule.io.coco import CocoIndex

    index = CocoIndex.build(coco_mini / "annotations" / "instances_train2017.json", coco_mini / "train2017")
    sizes = np.stack([np.asarray(index.heights), np.asarray(index.widths)], axis=1).astype(np.int64)
    geometry = MosaicAffine(640)
    rng = np.random.default_rng(0)
    polygons, plans = [], []
    for b in range(32):
        ids = geometry.draw_indices(rng, b % len(index), len(index))
        plans.append(geometry.plan(geometry.draw(rng, True), sizes[ids]))
        polygons.append([index.polygons(int(i)) for i in ids])
    got = transform_polygons_batch(polygons, plans)
    assert sum(len(p) for p, _, _ in got) > 100
    for tiles, plan, result in zip(polygons, plans, got):
        _assert_identical(result, _per_sample(tiles, plan))


def test_empty_samples_and_lengths() -> None:
    rng = np.random.default_rng(1)
    tiles, plan = _sample(rng, False)
    empty = [Polygons.empty()] * 4
    got = transform_polygons_batch([empty, tiles, empty], [plan, plan, plan])
    assert [len(p) for p, _, _ in got] == [0, sum(len(t) for t in tiles), 0]
    assert transform_polygons_batch([], []) == []
    with pytest.raises(ValueError, match="polygons has 1 samples but plans has 2"):
        transform_polygons_batch([tiles], [plan, plan])
    with pytest.raises(ValueError, match="polygons has 3 tiles but the plan has 4"):
        transform_polygons_batch([tiles[:3]], [plan])


def test_split_gives_consecutive_runs_that_concatenate_back() -> None:
    rng = np.random.default_rng(2)
    whole = Polygons.concat([_tile_polygons(rng, 300, 400) for _ in range(6)])
    n = len(whole)
    cuts = sorted(rng.integers(0, n + 1, 3).tolist())
    sizes = np.diff([0, *cuts, n]).tolist()
    parts = whole.split(sizes)
    assert [len(p) for p in parts] == sizes
    for p in parts:
        p.validate()
    back = Polygons.concat(parts)
    for a, b in zip(back.arrays, whole.arrays):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match=f"sum to {n}"):
        whole.split([n + 1])
    with pytest.raises(ValueError, match="non-negative"):
        whole.split([-1, n + 1])
