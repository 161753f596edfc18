"""RLE helpers: the compressed-string decoder against pycocotools, masks to exact rings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from _reference import reference_rasterize
from seg_datamodule.ops.rle import mask_to_rings, rle_counts_from_string, uncompressed_rle


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 14).flatmap(
        lambda h: st.integers(1, 14).flatmap(
            lambda w: st.lists(st.booleans(), min_size=h * w, max_size=h * w).map(
                lambda bits: np.array(bits, bool).reshape(h, w)
            )
        )
    )
)
def test_mask_to_rings_round_trips_exactly(mask: np.ndarray) -> None:
    rings = mask_to_rings(mask)
    if not mask.any():
        assert rings == []
        return
    assert all(r.dtype == np.float64 and r.ndim == 2 and r.shape[1] == 2 for r in rings)
    np.testing.assert_array_equal(reference_rasterize([rings], mask.shape, 1)[0], mask)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_rle_string_decoder_matches_pycocotools(h: int, w: int, seed: int) -> None:
    mask = np.random.default_rng(seed).random((h, w)) < 0.4
    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    assert rle_counts_from_string(encoded["counts"]) == uncompressed_rle(mask)["counts"]


def test_rle_string_decoder_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid character"):
        rle_counts_from_string("ab~")
    with pytest.raises(ValueError, match="ends inside"):
        rle_counts_from_string("a`")  # the continuation bit is set on the last character


