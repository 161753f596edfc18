"""Large-scale jitter: the layout worked out by hand, pixels and clipped polygons together, draws."""

from __future__ import annotations

import numpy as np
import pytest

from _reference import reference_rasterize
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.layouts.lsj import LargeScaleJitter, LSJDraw, lsj_layout
from seg_datamodule.transforms.kernels.warp import FILL_VALUE


def test_layout_by_hand() -> None:
    # 480 x 640 at half the 1024 target: 0.8x, 384 x 512, nothing cut, padded right and bottom.
    m, r = lsj_layout((480, 640), 0.5, (0.7, 0.3), 1024)
    np.testing.assert_allclose(m, [[0.8, 0, 0], [0, 0.8, 0]])
    np.testing.assert_allclose(r, [0, 0, 640, 480])
    # At twice the target: 3.2x, 1536 x 2048; the crop starts 0.5 * 1024 = 512 and 0.25 * 512 = 128 in.
    m, r = lsj_layout((480, 640), 2.0, (0.5, 0.25), 1024)
    np.testing.assert_allclose(m, [[3.2, 0, -512], [0, 3.2, -128]])
    np.testing.assert_allclose(r, [160, 40, 480, 360])
    with pytest.raises(ValueError, match="positive"):
        lsj_layout((0, 640), 1.0, (0, 0), 1024)


class _OneImage:
    """An index of one image, black with a white triangle and a white square leaving the image."""

    on_bad_sample = "raise"

    def __init__(self, h: int = 120, w: int = 160) -> None:
        self.heights, self.widths = np.array([h]), np.array([w])
        self.image_ids = np.array([7])
        self.instances = [[np.array([[20.5, 10.0], [150.0, 60.3], [60.2, 115.7]])],
                          [np.array([[120.0, 80.0], [170.0, 80.0], [170.0, 130.0], [120.0, 130.0]])]]
        inside = reference_rasterize(self.instances, (h, w), 1).any(axis=0)
        self.image = np.repeat(np.where(inside, 255, 0).astype(np.uint8)[:, :, None], 3, axis=2)

    def __len__(self) -> int:
        return 1

    def polygons(self, i: int) -> Polygons:
        return Polygons.from_instances(self.instances)

    def labels(self, i: int) -> np.ndarray:
        return np.array([0, 1])

    def annotation_ids(self, i: int) -> np.ndarray:
        return np.array([70, 71])

    def crowd_mask(self, i: int) -> None:
        return None

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        import cv2

        if reduce == 1:
            return self.image
        return cv2.resize(self.image, (-(-160 // reduce), -(-120 // reduce)), interpolation=cv2.INTER_AREA)


@pytest.mark.parametrize("epoch", range(6))
def test_pixels_and_clipped_polygons_agree_and_the_pad_is_grey(epoch: int) -> None:
    ds = SegDataset(_OneImage(), AugmentOptions(LargeScaleJitter(96, (0.3, 2.5)), min_area_ratio=0.0,
                                                min_box_size=0.0), seed=3)
    s = ds[(epoch, 0)]
    assert s.image.shape == (96, 96, 3) and s.num_instances <= 2
    union = reference_rasterize([s.polygons.instance(n) for n in range(s.num_instances)], (96, 96), 1).any(axis=0) \
        if s.num_instances else np.zeros((96, 96), bool)
    grey = (s.image == FILL_VALUE).all(axis=2)
    white = s.image.min(axis=2) > 185
    # Away from edges (bilinear blur: 2 px), white is exactly where the clipped polygons are.
    import cv2

    u8 = union.astype(np.uint8)
    k = np.ones((5, 5), np.uint8)
    band = cv2.dilate(u8, k).astype(bool) & ~cv2.erode(u8, k, borderValue=0).astype(bool)
    grown = cv2.dilate(grey.astype(np.uint8), k).astype(bool)
    wrong = (union != white) & ~band & ~grown
    assert not wrong.any(), int(wrong.sum())
    # The pad is at the right and bottom (left and bottom once flipped): the top row starts with image.
    assert not (grey[0, 0] and grey[0, -1])


def test_scales_cover_the_range_and_flip_is_drawn() -> None:
    geo = LargeScaleJitter(640, (0.1, 2.0), flip_lr=0.5)
    draws = [geo.draw(np.random.default_rng(s)) for s in range(300)]
    scales = np.array([d.scale for d in draws])
    assert 0.1 <= scales.min() < 0.2 and 1.9 < scales.max() <= 2.0
    assert 100 < sum(geo.flip.draw(np.random.default_rng(s)) for s in range(300)) < 200
    assert not geo.mosaic_capable and geo.recipe == "lsj"
    plan = geo.plan(LSJDraw(0.1, (0.0, 0.0)), np.array([[480, 640]]))
    assert plan.output_size == (640, 640) and plan.matrices[0, 0, 0] == pytest.approx(0.1, rel=1e-2)


def test_lsj_recipe_in_the_dataset_and_argument_errors() -> None:
    ds = SegDataset(_OneImage(), AugmentOptions(LargeScaleJitter(64), mosaic=1.0, close_mosaic=3), seed=0)
    assert not ds.mosaic_active(0) and isinstance(ds.augment.geometry, LargeScaleJitter)
    assert ds.augment.recipe == "lsj" and ds.image_size == 64 and ds.path.geometry is ds.augment.geometry
    assert ds.augment.geometry.scale == (0.1, 2.0)  # Detectron2's range, the default
    assert "LargeScaleJitter" in repr(ds)
    batch = ds.__getitems__([(0, 0), (1, 0)])
    assert all(s.image.shape == (64, 64, 3) for s in batch)
    # The recipe is the layout's: a MosaicAffine is the mosaic recipe, anything but a Layout is refused.
    assert AugmentOptions(MosaicAffine(64)).recipe == "mosaic"
    with pytest.raises(TypeError, match=r"geometry must be a Layout \(MosaicAffine, LargeScaleJitter\), got str"):
        AugmentOptions("lsj")  # type: ignore[arg-type]
    for scale, err in (((0.5,), TypeError), ((2.0, 1.0), ValueError), ((0.0, 1.0), ValueError), ("ab", TypeError)):
        with pytest.raises(err, match="lsj_scale"):
            LargeScaleJitter(64, scale)
