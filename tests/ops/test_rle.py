"""RLE helpers: the compressed-string codec against pycocotools, its overflows kept out, masks to exact rings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from _reference import reference_rasterize
from seg_datamodule.ops.rle import (
    RLE_MAX_RUN,
    check_rle,
    mask_to_rings,
    polygon_rle_problem,
    rle_counts_from_string,
    rle_run_problem,
    rle_string,
    uncompressed_rle,
)


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


@settings(max_examples=200, deadline=None)
@given(st.lists(_RUN, min_size=0, max_size=24).filter(
    lambda runs: 0 < sum(runs) < 2**32 and _pycocotools_string_length(runs) <= 6 * len(runs)))
def test_rle_string_is_pycocotools_encoder_where_that_writes_safely(runs: list[int]) -> None:
    total = sum(runs)
    assert rle_string(runs) == mask_utils.frPyObjects({"size": [1, total], "counts": runs}, 1, total)["counts"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_RUN, st.integers(2**31, 2**45)), min_size=0, max_size=24))
def test_rle_string_round_trips_any_runs(runs: list[int]) -> None:
    """Also where pycocotools' encoder would overflow (a long run, or every number 6 characters)."""
    assert rle_counts_from_string(rle_string(runs)) == runs
    assert rle_string(np.asarray(runs, np.int64)) == rle_string(runs)


# Four runs whose numbers all take 6 characters: pycocotools' encoder puts its NUL one byte past a
# 24-byte buffer, which malloc gives no slack, and glibc aborts ("corrupted size vs. prev_size").
_FULL_BUFFER = [2**24, 2**24, 2**24, 2**25]  # a 4096 x 20480 image


def test_where_pycocotools_would_overflow_its_decoder_reads_rle_string_back() -> None:
    """In a subprocess: were anything here to reach pycocotools' encoder, the abort fails this test only."""
    script = f"""
from pycocotools import mask as mask_utils
from seg_datamodule.ops.rle import rle_string
runs = {_FULL_BUFFER}
rle = {{"size": [4096, 20480], "counts": rle_string(runs)}}
print(len(rle["counts"]), int(mask_utils.area(rle)), mask_utils.toBbox(rle).tolist())
"""
    out = _python(script)
    assert out.split()[:2] == ["24", str(2**24 + 2**25)]  # 6 characters a number, read back exactly
    assert _pycocotools_string_length(_FULL_BUFFER) == 25 > 6 * len(_FULL_BUFFER)


def test_runs_pycocotools_cannot_hold_are_refused() -> None:
    assert rle_run_problem(_FULL_BUFFER) is None and rle_run_problem([]) is None
    assert "a run of 536870912 pixels" in rle_run_problem([0, RLE_MAX_RUN])
    size = [2**15, 2**15]  # 2^30 pixels: the largest image the index reads
    long_runs = [2**29 - 5, 2**29, 5]
    for counts in (long_runs, rle_string(long_runs).decode("ascii")):
        reason, detail = check_rle({"size": size, "counts": counts}, *size)
        assert reason == "rle_invalid" and "run of 536870912 pixels" in detail, detail
    assert check_rle({"size": size, "counts": [2**29 - 1, 2**29 - 1, 2]}, *size) is None
    assert check_rle({"size": [4096, 20480], "counts": _FULL_BUFFER}, 4096, 20480) is None  # encoded safely


def test_polygon_rle_problem_bounds() -> None:
    square = [np.array([[10.0, 10.0], [50.0, 10.0], [50.0, 50.0], [10.0, 50.0]])]
    assert polygon_rle_problem(square, 4000, 4000) is None  # under 2^24 pixels: always safe
    assert polygon_rle_problem(square, 4096, 8192) is None  # not the full height: runs within columns
    tall = [np.array([[10.0, -1.0], [50.0, -1.0], [50.0, 4097.0], [10.0, 4097.0]])]
    assert "spans the full height" in polygon_rle_problem(tall, 4096, 8192)
    assert "run of 2^29 pixels or more" in polygon_rle_problem(square, 2**15, 2**15)  # the runs after it


_SAFE_POLYGONS = """
import numpy as np
from pycocotools import mask as mask_utils
from seg_datamodule.ops.rle import polygon_rle_problem, rle_counts_from_string
rng = np.random.default_rng(0)
height, width = 4096, 8192  # 2^25 pixels
checked = refused = 0
for _ in range(300):
    n = int(rng.integers(3, 9))
    left, top = rng.uniform(-50, width), rng.uniform(-50, height)
    span = rng.uniform(1, [width, height], (1, 2)) * rng.choice([0.01, 0.3, 1.0])
    ring = np.stack([left, top]) + rng.random((n, 2)) * span
    if rng.random() < 0.3:  # some cross the top and bottom rows
        ring[:, 1] = np.where(np.arange(n) % 2, rng.uniform(-20, 1, n), rng.uniform(height - 1, height + 20, n))
    if polygon_rle_problem([ring], height, width) is not None:
        refused += 1
        continue
    rle = mask_utils.frPyObjects([ring.ravel().tolist()], height, width)[0]
    numbers = rle_counts_from_string(rle["counts"])
    # An empty mask (a polygon off the image) is one number: its NUL lands in malloc's slack.
    assert len(rle["counts"]) < 6 * len(numbers) or len(numbers) == 1, ring.tolist()
    assert max(numbers) < 2**29, ring.tolist()
    checked += 1
print(checked, refused)
"""


def test_polygons_called_safe_are_encoded_by_pycocotools_within_its_buffer() -> None:
    """The bound of polygon_rle_problem against pycocotools' own strings, on a 2^25-pixel image (in
    a subprocess: a wrong bound could abort it)."""
    checked, refused = map(int, _python(_SAFE_POLYGONS).split())
    assert checked > 150 and refused > 10


def _python(script: str) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    return proc.stdout
