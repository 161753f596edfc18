"""Copy-paste and MixUp in SegDataset: pixels agree with targets, counts add up, batches are
deterministic across workers, and samples that draw no mixing are those of a run without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from _datasets import make_dataset
from _recorder import read_rows
from _reference import reference_rasterize
import seg_datamodule.data.batching.collate as collate_module
from seg_datamodule.data.batching.collate import DetectionCollate, collate_detection
from seg_datamodule.data.samples.dataset import ADDED_KEYS, COUNT_KEYS, SegDataset
from seg_datamodule.data.loaders.arguments import worker_init_fn
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import DetectionBatch, Polygons
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine

S = 64  # canvas side; the flat images are S x S, so the letterbox and the affine are the identity


def _colour(annotation_id: int) -> np.ndarray:
    """A distinct colour per annotation id (never black, never the grey fill)."""
    rng = np.random.default_rng(annotation_id)
    return rng.integers(1, 256, 3).astype(np.uint8) | np.array([1, 0, 0], np.uint8)


class FlatIndex:
    """S x S images of disjoint axis-aligned rectangles on whole pixels, each a flat colour.

    On whole-pixel rectangles the cell centre ``((j + 0.5) s, (i + 0.5) s)`` of a stride-s mask and
    the pixel ``(i s + s / 2, j s + s / 2)`` it samples lie on the same side of every edge, so the
    image can be read off the mask at any even stride.
    """

    on_bad_sample = "raise"

    def __init__(self, n: int = 10, seed: int = 4) -> None:
        rng = np.random.default_rng(seed)
        self.heights = np.full(n, S)
        self.widths = np.full(n, S)
        self.image_ids = np.arange(n, dtype=np.int64) + 1
        self._instances: list[list[list[np.ndarray]]] = []
        self.polygon_calls: list[int] = []
        for _ in range(n):
            inst, taken = [], np.zeros((S, S), bool)
            for _ in range(40):
                x0, y0 = rng.integers(0, S - 8, 2)
                x1, y1 = x0 + rng.integers(6, 30), y0 + rng.integers(6, 30)
                x1, y1 = min(x1, S), min(y1, S)
                if taken[y0 - 1 if y0 else 0 : y1 + 1, x0 - 1 if x0 else 0 : x1 + 1].any():
                    continue
                taken[y0:y1, x0:x1] = True
                inst.append([np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)])
                if len(inst) == 5:
                    break
            self._instances.append(inst)

    def __len__(self) -> int:
        return len(self._instances)

    def polygons(self, i: int) -> Polygons:
        return Polygons.from_instances(self._instances[i])

    def labels(self, i: int) -> np.ndarray:
        self.polygon_calls.append(i)
        return np.arange(len(self._instances[i]), dtype=np.int64) % 2

    def annotation_ids(self, i: int) -> np.ndarray:
        return 100 * i + np.arange(len(self._instances[i]), dtype=np.int64)

    def crowd_mask(self, i: int) -> None:
        return None

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        image = np.zeros((S, S, 3), np.uint8)
        inside = reference_rasterize(self._instances[i], (S, S), 1)
        for n, aid in enumerate(self.annotation_ids(i)):
            image[inside[n]] = _colour(int(aid))
        return image


def _flat_dataset(**kwargs) -> SegDataset:
    return make_dataset(FlatIndex(), mosaic=0.0, geometry=MosaicAffine(S, translate=0.0, scale=(1.0, 1.0)), seed=11,
                        **kwargs)


def _wrong_cells(batch: DetectionBatch) -> tuple[int, int]:
    """(cells whose pixel shows another colour than their instance's, cells checked)."""
    s = batch.mask_stride
    images = batch.images.permute(0, 2, 3, 1).numpy()
    image_of = np.repeat(np.arange(len(batch)), batch.boxes_per_image.numpy())
    wrong = checked = 0
    for k, (mask, aid) in enumerate(zip(batch.masks.numpy(), batch.annotation_ids.tolist())):
        rows, cols = np.nonzero(mask)
        pixels = images[image_of[k], rows * s + s // 2, cols * s + s // 2]
        wrong += int((pixels != _colour(aid)).any(axis=1).sum())
        checked += len(rows)
    return wrong, checked


@pytest.mark.parametrize("mode", ["flip", "batch"])
@pytest.mark.parametrize("stride", [1, 4])
def test_every_mask_cell_shows_its_own_instance_and_a_planted_bug_is_caught(
    mode: str, stride: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = _flat_dataset(copy_paste=1.0, copy_paste_mode=mode, min_area_ratio=0.0, min_box_size=0.0)
    batches = [ds.__getitems__([(0, i) for i in range(b, b + 5)]) for b in (0, 5)]
    collate = DetectionCollate(mask_stride=stride, shared_memory=False)
    wrong, checked = zip(*(_wrong_cells(collate(samples)) for samples in batches))
    assert sum(wrong) == 0 and sum(checked) > 1000
    assert ds.counts["pasted"] > 5 and any(len(s.occluders.instance(n)) for b in batches for s in b
                                           for n in range(s.num_instances))
    # A collate that forgets the occluders leaves covered cells claiming the pasted colours.
    monkeypatch.setattr(collate_module, "rasterize_visible",
                        lambda polygons, occluders, canvas, stride, out=None, fill="centre":
                        rasterize_flat(*polygons, canvas, stride, out=out))
    assert sum(_wrong_cells(collate(samples))[0] for samples in batches) > 0


def test_boxes_are_the_extent_of_the_visible_pixels() -> None:
    ds = _flat_dataset(copy_paste=1.0, copy_paste_mode="batch", min_area_ratio=0.0, min_box_size=0.0)
    batch = collate_detection(ds.__getitems__([(0, i) for i in range(8)]), mask_stride=1)
    for mask, box in zip(batch.masks.numpy(), batch.boxes.numpy()):
        rows, cols = np.nonzero(mask)
        np.testing.assert_array_equal(box, [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1])


def test_counts_add_up_with_occluded_pasted_and_mixed_in() -> None:
    index = FlatIndex(n=12)
    ds = make_dataset(index, image_size=48, copy_paste=0.8, copy_paste_mode="batch", mixup=0.5, seed=2)
    targets = 0
    for b in range(3):
        batch = ds.__getitems__([(1, i) for i in range(4 * b, 4 * b + 4)])
        targets += sum(s.num_instances for s in batch)
        assert sum(batch.counts.get(k, 0) for k in ("kept",)) == sum(s.num_instances for s in batch)
    counts = ds.counts
    drawn = sum(len(index._instances[i]) for i in index.polygon_calls)
    assert set(counts) == set(COUNT_KEYS) and counts["kept"] == targets
    lost = [k for k in COUNT_KEYS if not k.startswith("image_") and k not in ADDED_KEYS]
    assert sum(counts[k] for k in lost) == drawn + counts["pasted"] + counts["mixed_in"]
    assert counts["occluded"] > 0 and counts["pasted"] > 0 and counts["mixed_in"] > 0


def _same_batches(a: DetectionBatch, b: DetectionBatch) -> None:
    for name in ("images", "boxes", "labels", "masks", "annotation_ids", "image_ids", "ignore_masks", "origins"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.counts == b.counts


@pytest.mark.slow
def test_same_batches_for_0_and_2_workers_with_copy_paste_and_mixup() -> None:
    ds = make_dataset(FlatIndex(n=12), image_size=48, copy_paste=0.5, copy_paste_mode="batch", mixup=0.5, seed=9)
    loaders = [DataLoader(ds, batch_size=4, num_workers=w, collate_fn=DetectionCollate(), worker_init_fn=worker_init_fn
                          if w else None) for w in (0, 2)]
    got = [list(dl) for dl in loaders]
    assert len(got[0]) == 3
    for a, b in zip(*got):
        _same_batches(a, b)
    assert any((b.origins == 1).any() for b in got[0]) and any((b.origins == 2).any() for b in got[0])


def test_samples_that_draw_no_mixing_are_those_of_a_run_without_it() -> None:
    keys = [(0, i) for i in range(12)]
    plain = make_dataset(FlatIndex(n=12), image_size=48, seed=5).__getitems__(keys)
    mixed = make_dataset(FlatIndex(n=12), image_size=48, copy_paste=0.3, mixup=0.3, seed=5).__getitems__(keys)
    untouched = 0
    for a, b in zip(plain, mixed):
        if b.origins is None:
            untouched += 1
            assert np.array_equal(a.image, b.image) and np.array_equal(a.annotation_ids, b.annotation_ids)
            assert np.array_equal(a.boxes, b.boxes) and b.occluders is None
    assert 0 < untouched < len(keys)
    # Keys at zero: the same samples as the defaults, and nothing drawn for mixing.
    zero = make_dataset(FlatIndex(n=12), image_size=48, copy_paste=0.0, mixup=0.0, seed=5).__getitems__(keys)
    assert all(np.array_equal(a.image, b.image) and b.origins is None for a, b in zip(plain, zero))


def test_a_sample_built_alone_takes_its_partners_from_the_dataset() -> None:
    index = FlatIndex(n=6)
    ds = make_dataset(index, image_size=48, mosaic=0.0, copy_paste=1.0, copy_paste_mode="batch", mixup=1.0, seed=1)
    s = ds[(0, 2)]
    assert s.origins is not None and set(s.origins.tolist()) >= {2}
    own = set(index.annotation_ids(2).tolist())
    assert set(s.annotation_ids[s.origins == 0].tolist()) <= own
    assert not set(s.annotation_ids[s.origins != 0].tolist()) & own  # partners are other images
    # Partners are not counted as samples of their own: only what they lend.
    counts = ds.counts
    assert counts["kept"] == s.num_instances and counts["mixed_in"] == int((s.origins == 2).sum())
    assert ds.decode_counts["samples"] == 1
    one = make_dataset(FlatIndex(n=1), image_size=48, copy_paste=1.0, copy_paste_mode="batch", mixup=1.0)
    assert one[0].origins is None  # no other image to take from


# ----------------------------------------------------------------------------- YAML and the CLI

ROOT = Path(__file__).resolve().parents[2]


def _run_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, RECORDER_DIR=str(tmp_path / "rec"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.extended  # default tier: test_readme.py runs every config, tests/data/test_flat_keys.py the keys
def test_the_lsj_config_trains_on_coco_mini_and_the_keys_parse(coco_mini: Path, tmp_path: Path) -> None:
    paths = ["--data.train_ann", str(coco_mini / "annotations" / "instances_train2017.json"),
             "--data.train_images", str(coco_mini / "train2017"), "--data.val_ann", "null", "--data.val_images", "null",
             "--data.cache_dir", str(tmp_path / "index")]
    small = ["--data.image_size", "128", "--data.batch_size", "4", "--data.num_workers", "0",
             "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "0",
             "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32",
             "--trainer.callbacks+=_recorder.BatchRecorder", "--model.init_args.width", "8"]
    proc = _run_cli(["fit", "--config", str(ROOT / "configs" / "coco_lsj.yaml"), *paths, *small], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(read_rows(tmp_path / "rec")) == 3
    assert "pasted" in proc.stdout + proc.stderr  # the end-of-fit report names the pasted targets
    printed = _run_cli(["fit", "--config", str(ROOT / "configs" / "coco.yaml"), "--data.copy_paste", "0.5",
                        "--data.mixup", "0.15", "--data.copy_paste_mode", "batch", "--print_config"], tmp_path)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert "copy_paste: 0.5" in printed.stdout and "mixup: 0.15" in printed.stdout and "recipe: mosaic" in printed.stdout
    bad = _run_cli(["fit", "--config", str(ROOT / "configs" / "coco.yaml"), "--data.recipe", "yolo", "--print_config"],
                   tmp_path)
    assert bad.returncode != 0 and "recipe" in bad.stderr


def test_the_batch_drawing_outlines_pasted_copies() -> None:
    from seg_datamodule.visualize import batch_grid, draw_instances

    image = np.zeros((32, 32, 3), np.uint8)
    masks = np.zeros((2, 8, 8), bool)
    masks[0, 1:3, 1:3] = masks[1, 4:7, 4:7] = True
    boxes = np.array([[4, 4, 12, 12], [16, 16, 28, 28]], np.float32)
    plain = draw_instances(image, masks, boxes, mask_stride=4)
    marked = draw_instances(image, masks, boxes, mask_stride=4, origins=np.array([0, 1], np.uint8))
    changed = (plain != marked).any(axis=2)
    assert changed[12:32, 12:32].any() and not changed[:12, :12].any()  # only around the pasted one
    assert (marked[changed] > 200).all(axis=1).sum() >= 8  # a white (anti-aliased) outline
    ds = _flat_dataset(copy_paste=1.0, copy_paste_mode="batch")
    grid = batch_grid(collate_detection(ds.__getitems__([(0, i) for i in range(4)])), columns=2)
    assert grid.shape == (2 * S, 2 * S, 3)
