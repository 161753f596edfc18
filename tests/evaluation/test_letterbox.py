"""Inverse letterbox: boxes round-trip exactly; masks match an independent grid_sample reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.evaluation.letterbox import (
    boxes_to_canvas,
    boxes_to_original,
    mask_windows,
    masks_to_original,
    resample_axis,
)
from seg_datamodule.ops.affine import apply_affine
from seg_datamodule.ops.raster import rasterize_polygons
from seg_datamodule.transforms.kernels.plan import letterbox_layout


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 5000),
    w=st.integers(1, 5000),
    canvas=st.sampled_from([64, 320, 640, 1333]),
    seed=st.integers(0, 2**31 - 1),
)
def test_box_round_trip_is_exact(h: int, w: int, canvas: int, seed: int) -> None:
    matrix, _, scale, pad = letterbox_layout((h, w), (canvas, canvas))
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 1, (16, 2)) * (w, h)
    wh = rng.uniform(0, 1, (16, 2)) * (w, h)
    boxes = torch.from_numpy(np.concatenate([xy, np.minimum(xy + wh, (w, h))], 1))
    on_canvas = boxes_to_canvas(boxes, scale, pad)
    # The same affine the dataset warps the polygons with.
    corners = apply_affine(boxes.numpy().reshape(-1, 2), matrix).reshape(-1, 4)
    np.testing.assert_allclose(on_canvas.numpy(), corners, atol=1e-9)
    back = boxes_to_original(on_canvas, scale, pad, (h, w))
    assert (back - boxes).abs().max().item() < 1e-4
    # float32 canvas boxes (what a model outputs) still come back within 1e-4 px of the float32 box.
    back32 = boxes_to_original(boxes_to_canvas(boxes.float(), scale, pad).double(), scale, pad)
    assert (back32 - boxes.float().double()).abs().max().item() < 1e-4 * max(1.0, max(h, w) / 640)


def test_boxes_are_clipped_to_the_image_and_checked() -> None:
    boxes = torch.tensor([[-10.0, 5.0, 700.0, 300.0]])
    out = boxes_to_original(boxes, 2.0, (10.0, 0.0), (100, 200))
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.5, 200.0, 100.0]]))
    assert boxes_to_original(torch.zeros(0, 4), 1.0, (0.0, 0.0)).shape == (0, 4)
    with pytest.raises(ValueError, match="boxes must have shape"):
        boxes_to_original(torch.zeros(3), 1.0, (0.0, 0.0))
    with pytest.raises(ValueError, match="scale"):
        boxes_to_canvas(boxes, 0.0, (0.0, 0.0))
    with pytest.raises(TypeError, match="pad"):
        boxes_to_canvas(boxes, 1.0, 3.0)


def _reference(masks: torch.Tensor, scale: float, pad: tuple[float, float], orig: tuple[int, int], stride: int) -> torch.Tensor:
    """Independent oracle: grid_sample at the original pixel centres mapped onto the grid."""
    h, w = orig
    n, hm, wm = masks.shape
    xs = ((torch.arange(w, dtype=torch.float64) + 0.5) * scale + pad[0]) / stride  # in cells, edge = 0
    ys = ((torch.arange(h, dtype=torch.float64) + 0.5) * scale + pad[1]) / stride
    # align_corners=False: normalised -1 / +1 are the grid's outer edges.
    gx, gy = 2 * xs / wm - 1, 2 * ys / hm - 1
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], -1)[None].expand(n, h, w, 2)
    return F.grid_sample(
        masks[:, None].double(), grid, mode="bilinear", padding_mode="border", align_corners=False
    )[:, 0]


@pytest.mark.parametrize(
    "orig, canvas, stride", [((37, 53), 64, 4), ((480, 640), 320, 4), ((90, 30), 128, 1), ((5, 7), 32, 8)]
)
def test_masks_match_grid_sample(orig: tuple[int, int], canvas: int, stride: int) -> None:
    _, _, scale, pad = letterbox_layout(orig, (canvas, canvas))
    grid = -(-canvas // stride)
    masks = torch.randn(5, grid, grid, generator=torch.Generator().manual_seed(0))
    reference = _reference(masks, scale, pad, orig, stride)
    out = masks_to_original(masks, scale, pad, orig, stride, threshold=0.0)
    decided = (reference.abs() > 1e-5)  # values at the threshold itself may round either way
    assert torch.equal(out[decided], (reference > 0)[decided])
    windows = mask_windows(masks, scale, pad, orig, stride, threshold=0.0)
    for k, (top, left, window) in enumerate(windows):  # everything on lies inside the window
        assert int(window.sum()) == int(out[k].sum())
        assert np.array_equal(out[k, top : top + window.shape[0], left : left + window.shape[1]].numpy(), window)
    # Windows: a mask that is on in one corner cell only is computed there only, and right.
    corner = torch.full((1, grid, grid), -5.0)
    corner[0, -1, -1] = 5.0
    reference = _reference(corner, scale, pad, orig, stride)[0]
    assert torch.equal(masks_to_original(corner, scale, pad, orig, stride, 0.0)[0], reference > 0)
    assert not masks_to_original(corner.neg() - 20, scale, pad, orig, stride, 0.0).any()


def test_identity_letterbox_is_exact_and_empty_works() -> None:
    masks = torch.rand(3, 17, 23) > 0.5
    assert torch.equal(masks_to_original(masks, 1.0, (0.0, 0.0), (17, 23), 1, 0.5), masks)
    assert masks_to_original(torch.zeros(0, 8, 8), 2.0, (0.0, 4.0), (3, 4), 4, 0.0).shape == (0, 3, 4)
    assert mask_windows(torch.zeros(0, 8, 8), 2.0, (0.0, 4.0), (3, 4), 4, 0.0) == []
    (off,) = mask_windows(torch.full((1, 8, 8), -1.0), 2.0, (0.0, 4.0), (3, 4), 4, 0.0)
    assert off.mask.shape == (0, 0)
    i0, i1, w = resample_axis(4, 2, 1.0, 0.0, 2)  # centres 0.5..3.5 -> cells -0.25, 0.25, 0.75, 1.25
    assert i0.tolist() == [0, 0, 0, 1] and i1.tolist() == [0, 1, 1, 1]
    np.testing.assert_allclose(w, [0.75, 0.25, 0.75, 0.25])


def test_stride4_raster_maps_back_close_to_the_full_resolution_raster() -> None:
    # A disc of radius 90 px in a 300 x 400 image, letterboxed to 640 (scale 1.6, pad 80 top).
    orig, canvas = (300, 400), 640
    _, _, scale, pad = letterbox_layout(orig, (canvas, canvas))
    t = np.linspace(0, 2 * np.pi, 200, endpoint=False)
    ring = np.stack([200 + 90 * np.cos(t), 150 + 90 * np.sin(t)], 1)
    full = rasterize_polygons([[ring]], orig, 1)[0]
    coarse = rasterize_polygons([[ring * scale + pad]], (canvas, canvas), 4)
    back = masks_to_original(torch.from_numpy(coarse), scale, pad, orig, 4, 0.5)[0].numpy()
    iou = (back & full).sum() / (back | full).sum()
    assert iou > 0.98, iou


def test_bad_masks_are_named() -> None:
    with pytest.raises(ValueError, match="masks must have shape"):
        masks_to_original(torch.zeros(4, 4), 1.0, (0.0, 0.0), (4, 4), 1, 0.5)
    with pytest.raises(ValueError, match="orig_size"):
        masks_to_original(torch.zeros(1, 4, 4), 1.0, (0.0, 0.0), (0, 4), 1, 0.5)
    with pytest.raises(ValueError, match="stride"):
        masks_to_original(torch.zeros(1, 4, 4), 1.0, (0.0, 0.0), (4, 4), 0, 0.5)
    with pytest.raises(TypeError, match="masks must be a Tensor"):
        masks_to_original(np.zeros((1, 4, 4)), 1.0, (0.0, 0.0), (4, 4), 1, 0.5)
