"""SegDataset: samples, accounting, determinism across workers, epochs, bad images, real data, a picture."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch.utils.data import DataLoader

from _datasets import make_dataset
from seg_datamodule.data.batching.collate import collate_detection
from seg_datamodule.data.samples.dataset import COUNT_KEYS, SegDataset
from seg_datamodule.data.loaders.arguments import worker_init_fn
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.ops.affine import apply_affine
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.data.loaders.sampler import EpochShardSampler
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.kernels.plan import draw_batch_partners

# ----------------------------------------------------------------------------- a synthetic index


def _ring(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)


class FakeIndex:
    """The CocoIndex interface over drawn images: image ``i`` has instances with ids ``100 i + k``.

    Args:
        n: number of images.
        bad: indices whose ``load_image`` raises ``BadImageError``.
        constant: plain grey images (so a colour transform's draw can be read off a pixel).
        on_bad_sample: what a dataset over the index does with a bad image (``"raise"`` or ``"skip"``).
    """

    def __init__(self, n: int = 12, bad: frozenset[int] = frozenset(), constant: bool = False,
                 on_bad_sample: str = "raise") -> None:
        rng = np.random.default_rng(1234)
        self.on_bad_sample = on_bad_sample
        self.heights = rng.integers(180, 320, n)
        self.widths = rng.integers(180, 320, n)
        self.image_ids = np.arange(n, dtype=np.int64) + 1000
        self.bad = frozenset(bad)
        self.constant = constant
        self.polygon_calls: list[int] = []
        self._instances = []
        for i in range(n):
            h, w = int(self.heights[i]), int(self.widths[i])
            inst = []
            for k in range(3):
                x0, y0 = rng.uniform(0, w - 60), rng.uniform(0, h - 60)
                inst.append([_ring(x0, y0, x0 + rng.uniform(20, 60), y0 + rng.uniform(20, 60))])
            # One instance crossing the right border (COCO polygons may stick out a little).
            inst.append([_ring(w - 30.0, h / 3, w + 4.0, h / 3 + 40)])
            self._instances.append(inst)

    def __len__(self) -> int:
        return len(self.heights)

    def polygons(self, i: int) -> Polygons:
        return Polygons.from_instances(self._instances[i])

    def labels(self, i: int) -> np.ndarray:
        self.polygon_calls.append(i)  # once per tile drawn, and once per bad image counted
        return np.arange(len(self._instances[i]), dtype=np.int64)

    def annotation_ids(self, i: int) -> np.ndarray:
        return 100 * i + np.arange(len(self._instances[i]), dtype=np.int64)

    def crowd_mask(self, i: int):
        if i % 3:
            return None
        m = np.zeros((int(self.heights[i]), int(self.widths[i])), bool)
        m[10:50, 20:90] = True
        return m

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        if i in self.bad:
            raise BadImageError(f"image file fake/{i}.jpg is corrupt", path=f"fake/{i}.jpg",
                                reason="image_corrupt", image_index=i)
        h, w = int(self.heights[i]), int(self.widths[i])
        if self.constant:
            image = np.full((h, w, 3), 100, np.uint8)
        else:
            image = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        if reduce > 1:
            image = cv2.resize(image, (-(-w // reduce), -(-h // reduce)), interpolation=cv2.INTER_AREA)
        return image


def assert_same_sample(a: Sample, b: Sample) -> None:
    assert a.image_id == b.image_id
    np.testing.assert_array_equal(a.image, b.image)
    for x, y in zip(a.polygons.arrays, b.polygons.arrays):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.annotation_ids, b.annotation_ids)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    assert (a.crowd_mask is None) == (b.crowd_mask is None)
    if a.crowd_mask is not None:
        np.testing.assert_array_equal(a.crowd_mask, b.crowd_mask)


def loader_samples(ds: SegDataset, num_workers: int, **kwargs) -> list[Sample]:
    dl = DataLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=list,
                    worker_init_fn=worker_init_fn if num_workers else None, **kwargs)
    return [s for batch in dl for s in batch]


# ----------------------------------------------------------------------------- samples


def test_train_samples_are_valid_and_exactly_clipped() -> None:
    ds = make_dataset(FakeIndex(), image_size=128, geometry=MosaicAffine(128, degrees=10.0, shear=3.0), seed=1)
    for i in range(len(ds)):
        s = ds[i]
        s.validate()
        assert s.image.shape == (128, 128, 3) and s.image.flags.c_contiguous
        assert ((s.polygons.vertices >= 0) & (s.polygons.vertices <= 128)).all()
        wh = s.boxes[:, 2:] - s.boxes[:, :2]
        assert (wh >= 2.0).all()
        assert s.boxes.dtype == np.float32 and s.scale == 1.0 and s.orig_size is None
    assert ds.counts["kept"] > 0


def test_every_annotation_is_in_a_sample_or_counted() -> None:
    index = FakeIndex(bad=frozenset({5}), on_bad_sample="skip")
    ds = make_dataset(index, image_size=96, seed=2)
    kept = sum(ds[i].num_instances for i in range(len(ds)))
    counts = ds.counts
    drawn = sum(len(index._instances[i]) for i in index.polygon_calls)
    assert set(counts) == set(COUNT_KEYS)
    assert counts["kept"] == kept
    annotation_keys = [k for k in COUNT_KEYS if not k.startswith("image_")]
    assert sum(counts[k] for k in annotation_keys) == drawn
    assert counts["outside"] > 0 and counts["image_corrupt"] >= 1
    assert counts["bad_image"] == 4 * counts["image_corrupt"]
    ds.reset_counts()
    assert sum(ds.counts.values()) == 0


def test_mosaic_draws_other_images_and_close_mosaic_turns_it_off() -> None:
    ds = make_dataset(FakeIndex(), image_size=96, close_mosaic=2, max_epochs=5, seed=3)

    def sources(epoch: int) -> set[bool]:
        # True when a sample holds annotations of images other than its own.
        return {bool(((ds[(epoch, i)].annotation_ids // 100) != i).any()) for i in range(len(ds))}

    assert True in sources(2)
    assert sources(3) == {False} and sources(4) == {False}
    assert not ds.mosaic_active(3) and ds.mosaic_active(2)
    with pytest.raises(RuntimeError, match="close_mosaic=2 needs max_epochs"):
        make_dataset(FakeIndex(), close_mosaic=2)[0]
    late = make_dataset(FakeIndex(), close_mosaic=2)
    late.set_max_epochs(3)
    assert late.mosaic_active(0) and not late.mosaic_active(1)


def test_mosaic_probability_zero_letterboxes_the_image() -> None:
    index = FakeIndex()
    ds = make_dataset(index, image_size=96, mosaic=0.0, geometry=MosaicAffine(96, scale=(1.0, 1.0), translate=0.0, flip_lr=0.0))
    s = ds[4]
    assert set((s.annotation_ids // 100).tolist()) <= {4}
    h, w = index.heights[4], index.widths[4]
    r = 96 / max(h, w)
    assert (s.polygons.vertices[:, 0].max() - s.polygons.vertices[:, 0].min()) <= w * r + 1e-6


def test_validation_letterboxes_and_maps_back() -> None:
    index = FakeIndex()
    ds = make_dataset(index, image_size=160, train=False)
    for i in range(len(ds)):
        s = ds[i]
        s.validate()
        h, w = int(index.heights[i]), int(index.widths[i])
        assert s.orig_size == (h, w) and s.image_id == index.image_ids[i]
        assert s.scale == pytest.approx(160 / max(h, w))
        # Centred to the whole pixel (no half-pixel resample blur).
        assert all(float(p).is_integer() for p in s.pad)
        assert abs(s.pad[0] - (160 - w * s.scale) / 2) <= 0.6
        assert abs(s.pad[1] - (160 - h * s.scale) / 2) <= 0.6
        # The first three instances lie inside the image: mapped back, they are the originals.
        v, ro, io = Polygons.from_instances(index._instances[i][:3]).arrays
        back = (s.polygons.vertices[: len(v)] - np.array(s.pad)) / s.scale
        np.testing.assert_allclose(back, v, atol=1e-9)
        # The border-crossing instance is clipped at the image's right edge, not clamped.
        assert s.polygons.vertices[:, 0].max() == pytest.approx(s.pad[0] + w * s.scale)
    # Same sample every epoch: validation draws nothing.
    ds.set_epoch(3)
    assert_same_sample(ds[0], make_dataset(index, image_size=160, train=False)[0])


def test_crowd_regions_follow_the_same_transform() -> None:
    index = FakeIndex()
    ds = make_dataset(index, image_size=128, train=False)
    s = ds[0]
    assert s.crowd_mask is not None and s.crowd_mask.shape == (128, 128)
    crowd_poly = apply_affine(_ring(20, 10, 90, 50), np.array([[s.scale, 0, s.pad[0]], [0, s.scale, s.pad[1]]]))
    expected = rasterize_flat(crowd_poly, np.array([0, 4]), np.array([0, 1]), (128, 128), stride=1)[0]
    assert (expected != s.crowd_mask).sum() <= 0.1 * expected.sum()
    assert ds[1].crowd_mask is None
    # Training: through the mosaic too (image 0, 3, 6, 9 have crowd regions).
    train = make_dataset(index, image_size=128, seed=0)
    assert any(train[i].crowd_mask is not None and train[i].crowd_mask.any() for i in range(len(train)))


# ----------------------------------------------------------------------------- randomness


def test_same_seed_same_samples_and_epochs_differ() -> None:
    index = FakeIndex()
    a, b = make_dataset(index, image_size=96, seed=7), make_dataset(index, image_size=96, seed=7)
    assert_same_sample(a[3], b[3])
    assert_same_sample(a[(2, 3)], b[(2, 3)])
    assert not np.array_equal(a[(0, 3)].image, a[(1, 3)].image)
    assert not np.array_equal(a[3].image, make_dataset(index, image_size=96, seed=8)[3].image)
    b.set_epoch(2)
    assert_same_sample(a[(2, 3)], b[3])


@pytest.mark.slow
def test_same_batches_for_num_workers_0_and_2() -> None:
    transforms = A.Compose([A.RandomBrightnessContrast(p=0.5), A.GaussNoise(p=0.5)])
    ds = make_dataset(FakeIndex(), image_size=96, transforms=transforms, seed=11)
    serial = loader_samples(ds, 0)
    parallel = loader_samples(ds, 2)
    assert len(serial) == len(parallel) == len(ds)
    for a, b in zip(serial, parallel):
        assert_same_sample(a, b)


@pytest.mark.slow
def test_different_workers_draw_different_augmentations() -> None:
    """Forked workers must not share albumentations' stream (2.0.8 seeds a Compose only once).

    Grey images, no geometry: each sample's noise pattern is its albumentations draw. Samples
    0, 2, 4 come from worker 0 and 1, 3, 5 from worker 1 (batch size 1); with a shared stream,
    0 and 1 (2 and 3, ...) would be identical.
    """
    transforms = A.Compose([A.GaussNoise(std_range=(0.1, 0.1), p=1.0)])
    still = MosaicAffine(64, translate=0.0, scale=(1.0, 1.0), flip_lr=0.0)
    ds = make_dataset(FakeIndex(n=6, constant=True), image_size=64, mosaic=0.0, geometry=still,
                      transforms=transforms, seed=5)
    dl = DataLoader(ds, batch_size=1, num_workers=2, collate_fn=list, worker_init_fn=worker_init_fn)
    images = [batch[0].image for batch in dl]
    for a in range(len(images)):
        for b in range(a + 1, len(images)):
            assert not np.array_equal(images[a], images[b]), (a, b)
    for i, image in enumerate(images):
        np.testing.assert_array_equal(image, ds[i].image)


@pytest.mark.slow
def test_set_epoch_reaches_persistent_workers() -> None:
    index = FakeIndex()
    ds = make_dataset(index, image_size=96, seed=9)
    dl = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list, persistent_workers=True,
                    worker_init_fn=worker_init_fn)
    first = [s for batch in dl for s in batch]
    ds.set_epoch(1)
    second = [s for batch in dl for s in batch]
    for epoch, got in ((0, first), (1, second)):
        # Batch-partner mosaics: a sample is a function of its batch, (seed, epoch, indices).
        want = [s for b in range(0, len(ds), 4) for s in ds.__getitems__([(epoch, i) for i in range(b, b + 4)])]
        for a, b in zip(got, want):
            assert_same_sample(a, b)
    assert not all(np.array_equal(a.image, b.image) for a, b in zip(first, second))


@pytest.mark.slow
def test_epoch_shard_sampler_indices() -> None:
    ds = make_dataset(FakeIndex(), image_size=96, seed=4)
    sampler = EpochShardSampler(ds, shuffle=True, seed=4)
    sampler.set_epoch(3)
    dl = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=list,
                    worker_init_fn=worker_init_fn)
    got = [s for batch in dl for s in batch]
    order = list(sampler)
    want = [s for b in range(0, len(order), 4) for s in ds.__getitems__(order[b : b + 4])]
    for s, w in zip(got, want):
        assert_same_sample(s, w)


def test_dataset_pickles() -> None:
    ds = make_dataset(FakeIndex(), image_size=96, transforms=A.Compose([A.ToGray(p=0.5)]), cache_images=4, seed=1)
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert_same_sample(clone[1], ds[1])


# ----------------------------------------------------------------------------- albumentations


def test_geometric_albumentations_carry_polygons_exactly(tmp_path: Path) -> None:
    index = FakeIndex()
    kw = dict(image_size=96, seed=2)
    still = dict(degrees=0.0, scale=(1.0, 1.0), translate=0.0)
    ours = make_dataset(index, geometry=MosaicAffine(96, flip_lr=1.0, **still), **kw)
    no_flip = MosaicAffine(96, flip_lr=0.0, **still)
    albu = make_dataset(index, geometry=no_flip, transforms=A.Compose([A.HorizontalFlip(p=1.0)]), **kw)
    path = tmp_path / "flip.yaml"
    A.save(A.Compose([A.HorizontalFlip(p=1.0)]), str(path), data_format="yaml")
    from_file = make_dataset(index, geometry=no_flip, transforms=str(path), **kw)
    assert from_file.path.recipe.albumentations.geometric
    for i in range(len(index)):
        a, b, c = ours[i], albu[i], from_file[i]
        # Same resample, mirrored: OpenCV's fixed-point coordinates may round a few pixels apart.
        diff = np.abs(a.image.astype(int) - b.image.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
        np.testing.assert_allclose(b.polygons.vertices, a.polygons.vertices, atol=1e-4)  # float32 keypoints
        np.testing.assert_array_equal(b.annotation_ids, a.annotation_ids)
        assert_same_sample(b, c)


def test_geometric_albumentations_are_clipped_again() -> None:
    index = FakeIndex()
    transforms = A.Compose([A.Affine(translate_px={"x": 40, "y": 0}, p=1.0)])
    ds = make_dataset(index, image_size=96, transforms=transforms, seed=3)
    for i in range(len(ds)):
        s = ds[i]
        assert ((s.polygons.vertices >= 0) & (s.polygons.vertices <= 96)).all()


def test_hsv_jitter_is_ultralytics_hsv() -> None:
    from seg_datamodule.transforms.pixel.hsv import hsv_jitter

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (37, 50, 3), dtype=np.uint8)
    gains = np.array([0.012, -0.5, 0.3])
    # Ultralytics' RandomHSV.apply_image (on BGR there, RGB here), written out independently.
    hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=gains.dtype)
    lut_hue = ((x + gains[0] * 180) % 180).astype(np.uint8)
    lut_sat = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    lut_val = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    lut_sat[0] = 0
    hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    np.testing.assert_array_equal(hsv_jitter(image, gains), cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB))


def test_transforms_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="transforms must be"):
        make_dataset(FakeIndex(), transforms=A.HorizontalFlip())  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_dataset(FakeIndex(), transforms=str(tmp_path / "missing.json"))


# ----------------------------------------------------------------------------- bad images, arguments


def test_bad_images_raise_or_are_skipped_and_counted() -> None:
    # The dataset follows its index's on_bad_sample (what the index was built with).
    strict = make_dataset(FakeIndex(bad=frozenset({2})), image_size=96, mosaic=0.0)
    assert strict.on_bad_sample == "raise"
    with pytest.raises(BadImageError, match="fake/2.jpg"):
        strict[2]
    with pytest.raises(BadImageError, match="fake/2.jpg"):
        make_dataset(FakeIndex(bad=frozenset({2})), image_size=96, train=False)[2]
    index = FakeIndex(bad=frozenset({2}), on_bad_sample="skip")
    train = make_dataset(index, image_size=96, mosaic=0.0)
    assert train.on_bad_sample == "skip"
    s = train[2]
    assert s.image_id != index.image_ids[2] and not (s.annotation_ids // 100 == 2).any()
    assert train.counts["image_corrupt"] == 1 and train.counts["bad_image"] == 4
    val = make_dataset(index, image_size=96, train=False)
    s = val[2]
    assert s.image_id == index.image_ids[2] and s.num_instances == 0 and (s.image == 114).all()
    assert s.orig_size == (index.heights[2], index.widths[2])
    everything_bad = FakeIndex(n=3, bad=frozenset({0, 1, 2}), on_bad_sample="skip")
    with pytest.raises(RuntimeError, match="max_retries=2"):
        make_dataset(everything_bad, max_retries=2)[0]


def test_argument_errors() -> None:
    index = FakeIndex()
    with pytest.raises(TypeError, match="index must provide"):
        SegDataset(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mosaic must be in"):
        SegDataset(index, AugmentOptions(mosaic=1.5))
    with pytest.raises(ValueError, match="scale must satisfy"):
        SegDataset(index, AugmentOptions(MosaicAffine(scale=(1.5, 0.5))))
    with pytest.raises(TypeError, match=r"geometry must be a Layout \(MosaicAffine, LargeScaleJitter\), got dict"):
        SegDataset(index, AugmentOptions({}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="augment must be an AugmentOptions or None, got dict"):
        SegDataset(index, {"mosaic": 0.5})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="image_size must be >= 1, got 0"):
        SegDataset(index, AugmentOptions(MosaicAffine(image_size=0)))
    with pytest.raises(TypeError, match="min_box_size must be a number"):
        SegDataset(index, AugmentOptions(min_box_size="2"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="train must be a bool"):
        SegDataset(index, train=1)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="out of range"):
        SegDataset(FakeIndex(n=3))[3]


def test_canvas_size_is_the_geometrys_and_bad_samples_the_indexs() -> None:
    """The canvas size is given once, by the geometry; what a bad image does, by the index."""
    assert SegDataset(FakeIndex()).image_size == 640  # AugmentOptions() defaults: YOLO's 640 px mosaic
    ds = SegDataset(FakeIndex(), AugmentOptions(MosaicAffine(96)), train=False)
    assert ds.image_size == 96 and ds.augment.image_size == 96 and ds[0].image.shape == (96, 96, 3)
    assert ds.path.geometry is ds.augment.geometry
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.augment.mosaic = 0.5  # type: ignore[misc]
    # The dataset has no on_bad_sample of its own: it reads its index's.
    with pytest.raises(TypeError):
        SegDataset(FakeIndex(), on_bad_sample="skip")  # type: ignore[call-arg]
    assert SegDataset(FakeIndex(on_bad_sample="skip")).on_bad_sample == "skip"
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 'ignore'"):
        SegDataset(FakeIndex(on_bad_sample="ignore"))
    no_policy = FakeIndex()
    del no_policy.on_bad_sample
    with pytest.raises(TypeError, match="index must provide image_ids, heights, widths, on_bad_sample"):
        SegDataset(no_policy)


def test_image_cache_does_not_change_samples() -> None:
    index = FakeIndex()
    calls: list[tuple[int, int]] = []
    load = index.load_image

    def counting(i: int, reduce: int = 1) -> np.ndarray:
        calls.append((i, reduce))
        return load(i, reduce)

    index.load_image = counting  # type: ignore[method-assign]
    ds = make_dataset(index, image_size=96, cache_images=4 * len(index), seed=0)
    uncached = [make_dataset(index, image_size=96, seed=0)[i] for i in range(len(ds))]
    calls.clear()
    first = [ds[i] for i in range(len(ds))]
    n_first = len(calls)
    again = [ds[i] for i in range(len(ds))]
    assert len(calls) == n_first  # everything came from the cache
    for a, b, c in zip(first, again, uncached):
        assert_same_sample(a, b)
        assert_same_sample(a, c)
    small = make_dataset(index, image_size=96, cache_images=2, seed=0)
    [small[i] for i in range(len(small))]
    assert len(small.path.images._cache._kinds["images"]) <= 2 and len(small.path.images._cache._kinds["crowd"]) <= 2


# ----------------------------------------------------------------------------- real data and a picture


def _coco_index(root: Path, split: str, tmp_path: Path):
    from seg_datamodule.io.coco import CocoIndex

    return CocoIndex.build(root / "annotations" / f"instances_{split}.json", root / split,
                                cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_coco_mini_batches_and_picture(coco_mini: Path, tmp_path: Path) -> None:
    from seg_datamodule.visualize import save_batch_png

    index = _coco_index(coco_mini, "train2017", tmp_path)
    transforms = A.Compose([A.HueSaturationValue(p=0.5), A.Blur(p=0.1)])
    ds = make_dataset(index, image_size=320, transforms=transforms, geometry=MosaicAffine(320, degrees=5.0), seed=0)
    size = min(8, len(index))  # coco-mini's 80 images, or the five the tests ship
    dl = DataLoader(ds, batch_size=size, num_workers=2, collate_fn=collate_detection, worker_init_fn=worker_init_fn)
    batches = list(dl)
    batch = batches[0]
    assert batch.images.shape == (size, 3, 320, 320) and batch.masks.shape[1:] == (80, 80)
    assert len(batch.boxes) == int(batch.boxes_per_image.sum()) > 0
    # Every mask cell lies inside its box (boxes come from the clipped polygons).
    for m, (x0, y0, x1, y1) in zip(batch.masks.numpy(), batch.boxes.numpy()):
        ys, xs = np.nonzero(m)
        if len(xs):
            assert ((xs + 0.5) * 4 >= x0).all() and ((xs + 0.5) * 4 <= x1).all()
            assert ((ys + 0.5) * 4 >= y0).all() and ((ys + 0.5) * 4 <= y1).all()
    path = save_batch_png(batch, tmp_path / "mosaic_batch.png")
    picture = cv2.imread(str(path))
    assert picture.shape == (-(-size // 4) * 320, 4 * 320, 3) and picture.std() > 10
    counts = ds.counts
    assert counts["kept"] == sum(len(b.boxes) for b in batches)

    val = make_dataset(_coco_index(coco_mini, "val2017", tmp_path), image_size=320, train=False)
    vb = collate_detection([val[i] for i in range(4)])
    assert vb.images.shape == (4, 3, 320, 320) and (vb.scales > 0).all()
    assert torch.equal(vb.orig_sizes[0], torch.tensor([int(val.index.heights[0]), int(val.index.widths[0])]))


@pytest.mark.parametrize("step", [A.Resize(100, 100), A.RandomScale(0.5), A.LongestMaxSize(64)])
def test_resizing_albumentations_are_refused(step):
    # albumentations scales keypoints as x * s: polygons would drift by 0.5 * (s - 1) px.
    from seg_datamodule.transforms.pixel.albu import AlbumentationsTransform

    with pytest.raises(ValueError, match=f"must not resize \\({type(step).__name__}\\)"):
        AlbumentationsTransform(A.Compose([A.HorizontalFlip(p=0.5), A.Compose([step])]))
    AlbumentationsTransform(A.Compose([A.HorizontalFlip(p=0.5), A.Affine(scale=1.2)]))  # still fine


# ----------------------------------------------------------------------------- batch partners


@given(st.integers(2, 40), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_batch_partners_are_balanced_and_never_self(batch_size: int, seed: int) -> None:
    partners = draw_batch_partners(np.random.default_rng(seed), batch_size)
    assert partners.shape == (batch_size, 3) and partners.dtype == np.int64
    assert (partners != np.arange(batch_size)[:, None]).all()
    # Every image is a partner exactly three times (as many as it has partners).
    assert np.bincount(partners.ravel(), minlength=batch_size).tolist() == [3] * batch_size
    if batch_size > 3:
        assert all(len(set(row)) == 3 for row in partners.tolist())


def test_batch_partners_decode_each_image_once() -> None:
    """Mosaics take partners from their batch: one decode per output image, not four."""
    index = FakeIndex(n=24)
    calls: list[int] = []
    load = index.load_image

    def counting(i: int, reduce: int = 1) -> np.ndarray:
        calls.append(i)
        return load(i, reduce)

    index.load_image = counting  # type: ignore[method-assign]
    batch_ds = make_dataset(index, image_size=96, seed=3, mosaic_partners="batch")
    batch = batch_ds.__getitems__([(0, i) for i in range(8)])
    assert sorted(calls) == list(range(8))  # each image once, none from outside the batch
    for s in batch:
        assert {int(a) // 100 for a in s.annotation_ids} <= set(range(8))
    counts = batch_ds.decode_counts
    assert counts["samples"] == 8 and counts["decodes"] == 8
    calls.clear()
    uniform = make_dataset(index, image_size=96, seed=3, mosaic_partners="uniform")
    uniform.__getitems__([(0, i) for i in range(8)])
    assert len(calls) > 3 * 8 * 0.9 and uniform.decode_counts["decodes"] == len(calls)
    # A batch is a pure function of (seed, epoch, indices): rebuilding it gives the same samples.
    again = make_dataset(index, image_size=96, seed=3, mosaic_partners="batch").__getitems__([(0, i) for i in range(8)])
    for a, b in zip(batch, again):
        assert_same_sample(a, b)


def test_batch_partners_decode_each_crowd_mask_once() -> None:
    """Without a cache, an image's crowd regions are decoded once per batch, not once per mosaic
    that shows it; the samples are those built with every crowd mask cached."""
    index = FakeIndex(n=24)
    calls: list[int] = []
    crowd = index.crowd_mask

    def counting(i: int):
        calls.append(i)
        return crowd(i)

    index.crowd_mask = counting  # type: ignore[method-assign]
    keys = [(0, i) for i in range(12)]
    batch = make_dataset(index, image_size=96, seed=3, mosaic_partners="batch").__getitems__(keys)
    assert calls and len(calls) == len(set(calls)) and set(calls) <= set(range(12))
    assert any(s.crowd_mask is not None and s.crowd_mask.any() for s in batch)  # crowds do show
    cached = make_dataset(index, image_size=96, seed=3, cache_images=64, mosaic_partners="batch").__getitems__(keys)
    for a, b in zip(batch, cached):
        assert_same_sample(a, b)


def test_batch_partner_bad_image_is_replaced_and_counted() -> None:
    index = FakeIndex(n=12, bad=frozenset({5}), on_bad_sample="skip")
    ds = make_dataset(index, image_size=96, seed=1, mosaic_partners="batch")
    batch = ds.__getitems__([(0, i) for i in range(8)])
    assert len(batch) == 8
    assert all(not ((s.annotation_ids // 100) == 5).any() for s in batch)
    counts = ds.counts
    annotation_keys = [k for k in COUNT_KEYS if not k.startswith("image_")]
    drawn = sum(len(index._instances[i]) for i in index.polygon_calls)
    assert sum(counts[k] for k in annotation_keys) == drawn
    assert counts["image_corrupt"] >= 1 and counts["bad_image"] == 4 * counts["image_corrupt"]


# ----------------------------------------------------------------------------- independent checks of boxes and clips
# (issue 17) Boxes and clipped polygons checked against the reference crossing test of
# tests/_reference.py and against the pixels, never against the package function that made them.


def _reference_masks(s: Sample, stride: int = 1) -> np.ndarray:
    """bool (N, H, W): each instance of ``s`` rasterised by the reference crossing test."""
    from _reference import reference_rasterize

    return reference_rasterize([s.polygons.instance(n) for n in range(s.num_instances)], s.canvas_size, stride)


def _assert_boxes_bound_the_masks(s: Sample, tight_px: float | None = 2.0) -> None:
    """Every mask pixel centre lies in its box; boxes of instances the canvas did not cut are tight.

    An instance with no vertex on the canvas border was cut by nothing but (possibly) its tile,
    which in these tests leaves it a rectangle (any rotation): its box then reaches less than
    ``tight_px`` beyond the outermost pixel centre of its mask on every side.
    """
    h, w = s.canvas_size
    for n, mask in enumerate(_reference_masks(s)):
        x0, y0, x1, y1 = s.boxes[n].astype(np.float64)
        assert 0 <= x0 <= x1 <= w and 0 <= y0 <= y1 <= h, (s.image_id, n, s.boxes[n])
        ys, xs = np.nonzero(mask)
        if len(xs) == 0:
            continue
        eps = 1e-4  # boxes are float32
        assert x0 - eps <= xs.min() + 0.5 and xs.max() + 0.5 <= x1 + eps, (s.image_id, n)
        assert y0 - eps <= ys.min() + 0.5 and ys.max() + 0.5 <= y1 + eps, (s.image_id, n)
        v = s.polygons.instance(n)
        on_border = any(((r == 0) | (r == (w, h))).any() for r in v)
        if tight_px is not None and not on_border:
            assert xs.min() + 0.5 - x0 < tight_px and x1 - (xs.max() + 0.5) < tight_px, (s.image_id, n)
            assert ys.min() + 0.5 - y0 < tight_px and y1 - (ys.max() + 0.5) < tight_px, (s.image_id, n)


def test_validation_boxes_are_the_letterboxed_rectangles_worked_out_by_hand() -> None:
    # FakeIndex instances are axis-aligned rectangles; the letterbox maps x to x * scale + pad_x.
    # The fourth sticks out of the right border by 4 px and is cut at x = w (not clamped, which
    # for a rectangle is the same box, so this checks the mapping and the instance order).
    index = FakeIndex()
    ds = make_dataset(index, image_size=160, train=False)
    for i in range(len(ds)):
        s = ds[i]
        h, w = int(index.heights[i]), int(index.widths[i])
        want = []
        for n, (ring,) in enumerate(index._instances[i]):
            x0, y0 = ring.min(0)
            x1, y1 = ring.max(0)
            if n == 3:
                x1 = w
            want.append([x0 * s.scale + s.pad[0], y0 * s.scale + s.pad[1], x1 * s.scale + s.pad[0], y1 * s.scale + s.pad[1]])
        np.testing.assert_array_equal(s.annotation_ids, 100 * i + np.arange(4))
        np.testing.assert_allclose(s.boxes, np.array(want, np.float32), rtol=0, atol=1e-3)
        _assert_boxes_bound_the_masks(s)


@pytest.mark.parametrize("transforms", [None, A.Compose([A.HorizontalFlip(p=0.5), A.Affine(rotate=(-30, 30), p=1.0)])],
                         ids=["rotation", "rotation+albumentations"])
def test_train_boxes_bound_the_reference_masks(transforms) -> None:
    # No mosaic and no shear, so an instance the canvas does not cut stays a rotated rectangle.
    ds = make_dataset(FakeIndex(), image_size=96, mosaic=0.0, geometry=MosaicAffine(96, degrees=30.0, shear=0.0),
                      transforms=transforms, seed=5)
    kept = 0
    for i in range(len(ds)):
        s = ds[i]
        kept += s.num_instances
        _assert_boxes_bound_the_masks(s)
    assert kept > 2 * len(ds)


class PaintedIndex(FakeIndex):
    """FakeIndex whose images are white (255) exactly where an instance covers a pixel centre.

    The pixels are painted with the reference crossing test, black (0) elsewhere; the canvas
    fill is grey (114). After any augmentation, a sample's polygons must then cover the white
    pixels of its image and nothing else, up to the resampling blur along their edges. Every
    image also has a triangle leaving it through the right and bottom borders on slanted edges,
    where clamping and clipping differ even without rotation.
    """

    def __init__(self, n: int = 12) -> None:
        super().__init__(n, constant=True)
        for i in range(n):
            h, w = float(self.heights[i]), float(self.widths[i])
            self._instances[i].append([np.array([[0.55 * w, 0.5 * h], [w + 40.0, 0.75 * h], [0.7 * w, h + 30.0]])])
        self._painted: dict[int, np.ndarray] = {}

    def crowd_mask(self, i: int):
        return None

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        from _reference import reference_rasterize

        if i not in self._painted:
            h, w = int(self.heights[i]), int(self.widths[i])
            inside = reference_rasterize(self._instances[i], (h, w), 1).any(0)
            self._painted[i] = np.repeat(np.where(inside, 255, 0).astype(np.uint8)[:, :, None], 3, axis=2)
        image = self._painted[i]
        if reduce > 1:
            h, w = image.shape[:2]
            image = cv2.resize(image, (-(-w // reduce), -(-h // reduce)), interpolation=cv2.INTER_AREA)
        return image


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(geometry=MosaicAffine(96, degrees=30.0, shear=5.0)),  # rotated: the tiles' own and the output clip
        dict(geometry=MosaicAffine(96)),  # mosaic, axis aligned: one clip per tile, triangle cut slanted
        dict(mosaic=0.0, transforms=A.Compose([A.Affine(rotate=(20, 40), p=1.0)])),
        dict(mosaic=0.5, geometry=MosaicAffine(96, degrees=10.0),
             transforms=A.Compose([A.Affine(rotate=(-40, 40), shear=(-10, 10), p=1.0)])),
    ],
    ids=["mosaic-rotated", "mosaic-axis-aligned", "albumentations-rotate", "mosaic+albumentations"],
)
def test_clipped_polygons_cover_exactly_the_painted_pixels(kwargs) -> None:
    """Polygons clipped exactly match the pixels that went through the same transform.

    Clamping vertices to the canvas (instead of clipping) bends every slanted edge that leaves
    it and fills or empties whole triangles along the border, pixels far from any true edge.
    Here a pixel may disagree only within 2 px of a mask edge or the canvas border (bilinear
    resampling and the reduced-resolution decode blur the painted edges by about a pixel).
    """
    ds = make_dataset(PaintedIndex(), image_size=96, min_area_ratio=0.0, min_box_size=0.0, seed=7, **kwargs)
    band_kernel = np.ones((5, 5), np.uint8)
    compared = 0
    for i in range(len(ds)):
        s = ds[i]
        union = _reference_masks(s).any(0)
        white = s.image.min(axis=2) > 185  # white 255, black 0, canvas fill 114
        u8 = union.astype(np.uint8)
        # Edges include tile and canvas borders (beyond them the resample blends in the fill).
        band = cv2.dilate(u8, band_kernel).astype(bool) & ~cv2.erode(u8, band_kernel, borderValue=0).astype(bool)
        wrong = (union != white) & ~band
        assert not wrong.any(), f"sample {i}: {int(wrong.sum())} pixels disagree away from any edge"
        compared += int(union.sum())
        _assert_boxes_bound_the_masks(s, tight_px=None)
    assert compared > 0.1 * len(ds) * 96 * 96
