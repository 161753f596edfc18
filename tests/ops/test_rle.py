"""RLE helpers: the compressed-string decoder against pycocotools, masks to exact rings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from _reference import reference_rasterize
from seg_datamodule.ops.rle import check_rle, mask_to_rings, rle_counts_from_string, uncompressed_rle


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




# Runs of every size class: short (one character), medium, and long (up to 2^31, 7 characters),
# so that every continuation character's 5-bit shift and the delta coding of runs ``k - 2`` are
# exercised; 12x12 masks never produce a run needing more than two characters.
_RUN = st.one_of(st.integers(0, 40), st.integers(41, 2**16), st.integers(2**16, 2**31))


def _pycocotools_string_length(runs: list[int]) -> int:
    """Characters ``rleToString`` writes for ``runs``, its terminating NUL included.

    pycocotools (maskApi.c) allocates ``6 * len(runs)`` bytes for the string, but a run or a
    delta of 2^29 or more takes 7 characters: given such runs its encoder writes past the buffer
    and the process aborts later, at some unrelated ``free`` (``free(): invalid next size``, as
    the ops tests once did at exit). The reference is only asked for strings that fit.
    """
    length = 1
    for i, x in enumerate(runs):
        x -= runs[i - 2] if i > 2 else 0  # its delta coding, from the fourth run on
        while True:
            c, x = x & 0x1F, x >> 5
            length += 1
            if not (x != -1 if c & 0x10 else x != 0):
                break
    return length


@settings(max_examples=150, deadline=None)
@given(st.lists(_RUN, min_size=1, max_size=24).filter(
    lambda runs: 0 < sum(runs) < 2**32 and _pycocotools_string_length(runs) <= 6 * len(runs)))
def test_rle_string_decoder_on_long_runs(runs: list[int]) -> None:
    total = sum(runs)
    encoded = mask_utils.frPyObjects({"size": [1, total], "counts": runs}, 1, total)["counts"]
    assert rle_counts_from_string(encoded) == runs


def test_check_rle_accepts_what_pycocotools_writes_and_refuses_the_rest() -> None:
    mask = np.zeros((6, 7), bool)
    mask[1:4, 2:6] = True
    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode("ascii")
    assert check_rle({"size": [6, 7], "counts": encoded}, 6, 7) is None
    assert check_rle(uncompressed_rle(mask), 6, 7) is None
    assert check_rle({"size": [6, 7], "counts": encoded}, 6, 8)[0] == "rle_size_mismatch"
    for counts in ([41, 2], [-1, 43], [True, 41], [1.0, 41], "~~", 42):
        assert check_rle({"size": [6, 7], "counts": counts}, 6, 7)[0] == "rle_invalid", counts
