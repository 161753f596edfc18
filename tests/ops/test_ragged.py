"""Ragged-array helpers, and the three input paths of ``flatten_rings`` agreeing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.ops.ragged import flatten_rings, offsets_from_lengths, ragged_index, segment_ids

coords = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
rings = st.lists(st.tuples(coords, coords), min_size=3, max_size=9)
instances = st.lists(st.lists(rings, min_size=0, max_size=3), min_size=0, max_size=6)


def test_offsets_segments_and_ranges_by_hand() -> None:
    assert offsets_from_lengths([2, 0, 3]).tolist() == [0, 2, 2, 5]
    assert segment_ids(np.array([0, 2, 2, 5])).tolist() == [0, 0, 2, 2, 2]
    assert ragged_index(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist() == [5, 6, 9, 10, 11]
    assert ragged_index(np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []


@given(instances)
@settings(max_examples=80, deadline=None)
def test_arrays_flat_lists_and_mixed_input_agree(insts) -> None:
    as_arrays = [[np.array(r, np.float64) for r in inst] for inst in insts]
    as_flat = [[[c for xy in r for c in xy] for r in inst] for inst in insts]
    mixed = [[np.array(r) if k % 2 else [c for xy in r for c in xy] for k, r in enumerate(inst)] for inst in insts]
    ref = None
    for data in (as_arrays, as_flat, mixed):
        out = flatten_rings(data)
        if ref is None:
            ref = out
        for a, b in zip(out, ref):
            np.testing.assert_array_equal(a, b)
    vertices, ring_offsets, instance_offsets = ref
    assert instance_offsets.tolist() == offsets_from_lengths([len(i) for i in insts]).tolist()
    assert np.diff(ring_offsets).tolist() == [len(r) for inst in insts for r in inst]


@pytest.mark.parametrize("make", [lambda r: np.array(r, np.float64).reshape(-1, 2), lambda r: r], ids=["arrays", "flat"])
def test_errors_name_the_instance_on_every_path(make) -> None:
    good = [0.0, 0.0, 4.0, 0.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="instance 1: a ring needs at least 3 vertices, got 2"):
        flatten_rings([[make(good)], [make(good[:4])]])
    with pytest.raises(ValueError, match="instance 2: ring has NaN or infinite coordinates"):
        flatten_rings([[make(good)], [], [make(good[:5] + [float("nan")])]])
    with pytest.raises(ValueError, match=r"instance 0: flat ring has an odd number of coordinates \(5\)"):
        flatten_rings([[good[:5]]])


def test_uniform_input_is_converted_in_one_pass(monkeypatch) -> None:
    # All (K, 2) arrays, or all flat lists, never go ring by ring (that path costs more than
    # rasterising the ring); whatever their dtype, the result is float64.
    import seg_datamodule.ops.ragged as ragged

    def ring_by_ring(*args):
        raise AssertionError("uniform input went ring by ring")

    monkeypatch.setattr(ragged, "_as_ring", ring_by_ring)
    tri = [[0, 0], [4, 0], [4, 4]]
    for rings in ([np.array(tri, np.int32), np.array(tri, np.float32)], [[0, 0, 4, 0, 4, 4], (1, 1, 5, 1, 5, 5)]):
        vertices, ring_offsets, instance_offsets = flatten_rings([rings[:1], [], rings[1:]])
        assert vertices.dtype == np.float64 and vertices.shape == (6, 2)
        assert ring_offsets.tolist() == [0, 3, 6] and instance_offsets.tolist() == [0, 1, 1, 2]


def test_other_input_goes_ring_by_ring_and_agrees() -> None:
    tri = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 4.0]])
    quad = np.array([[1.0, 1.0], [6.0, 1.0], [6.0, 6.0], [1.0, 6.0]])
    want = flatten_rings([[tri], [quad, tri]])
    for data in ([[tri.ravel()], [quad.ravel(), tri.ravel()]],  # 1-D numpy flat rings
                 [[tri.tolist()], [quad.tolist(), tri]],  # nested lists and arrays mixed
                 [tri, [quad, tri.ravel().tolist()]],  # a lone (K, 2) array is one ring
                 [[tri.ravel().tolist()], [quad.tolist(), tri.ravel().tolist()]]):  # flat and nested lists
        for a, b in zip(flatten_rings(data), want):
            np.testing.assert_array_equal(a, b)


def test_no_rings_give_empty_arrays() -> None:
    for data in ([], [[], []]):
        vertices, ring_offsets, instance_offsets = flatten_rings(data)
        assert vertices.shape == (0, 2) and vertices.dtype == np.float64
        assert ring_offsets.tolist() == [0] and instance_offsets.tolist() == [0] * (len(data) + 1)


def test_malformed_rings_name_the_instance() -> None:
    tri = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 4.0]])
    with pytest.raises(ValueError, match=r"instance 1: a ring must be \(K, 2\) or a flat list, got shape \(3, 3\)"):
        flatten_rings([[tri], [np.zeros((3, 3))]])
    with pytest.raises(ValueError, match=r"instance 2: flat ring has an odd number of coordinates \(7\)"):
        flatten_rings([[tri], [tri], [np.arange(7.0)]])
    with pytest.raises(ValueError, match=r"instance 1: ring has NaN or infinite"):
        flatten_rings([[tri, tri], [tri, np.array([[0.0, 0.0], [np.inf, 0.0], [1.0, 1.0]])], [tri]])
    with pytest.raises(ValueError, match=r"instance 0: a ring needs at least 3 vertices, got 2"):
        flatten_rings([[np.arange(4.0)]])
