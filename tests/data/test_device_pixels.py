"""pixels_on_device through the data path: the worker path is the reference, on real COCO photos.

The workers ship JPEG bytes (other formats: pixels), plans and flips; ``make_pixels`` (what
``on_after_batch_transfer`` runs) makes the canvases on the CPU device here. Every target field and
the counts must equal the worker path's bit for bit; the canvases too for the default recipe (tiles
resized, OpenCV's arithmetic copied), and within rounding at rotated tiles' edges otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import albumentations as A
import numpy as np
import pytest
import torch
from PIL import Image

from _yolo import rotate_with_exif, write_data_yaml, write_yolo_split
from seg_datamodule import COCOSegDataModule, DetectionBatch
from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.batching.device_pixels import apply_pending_pixels
from seg_datamodule.structures import EncodedImage
from seg_datamodule.transforms import RandomFlipUD, RandomRotate90, SampleMixing
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.pixel.hsv import HSVJitter, apply_pending_hsv
from seg_datamodule.transforms.recipe import RecipeError

HSV = (0.015, 0.7, 0.4)


@pytest.fixture(scope="module")
def mixed(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(annotation file, image folder) of 16 real val photos stored four ways: as shipped, grey
    JPEG, CMYK JPEG, PNG (which the workers decode and ship as pixels)."""
    root = tmp_path_factory.mktemp("mixed")
    coco = json.loads((coco_mini / "annotations/instances_val2017.json").read_text())
    images = sorted(coco["images"], key=lambda im: im["id"])[:16]
    for k, entry in enumerate(images):
        src = coco_mini / "val2017" / entry["file_name"]
        if k % 4 == 0:
            (root / entry["file_name"]).symlink_to(src.resolve())
            continue
        with Image.open(src) as image:
            if k % 4 == 3:
                entry["file_name"] = Path(entry["file_name"]).with_suffix(".png").name
                image.convert("RGB").save(root / entry["file_name"])
            else:
                image.convert("L" if k % 4 == 1 else "CMYK").save(root / entry["file_name"], "JPEG", quality=92)
    ids = {im["id"] for im in images}
    coco["images"], coco["annotations"] = images, [a for a in coco["annotations"] if a["image_id"] in ids]
    ann = root / "instances.json"
    ann.write_text(json.dumps(coco))
    return ann, root


def _dm(ann: Path, images: Path, tmp_path: Path, **kwargs: Any) -> COCOSegDataModule:
    defaults = dict(train_ann=str(ann), train_images=str(images), image_size=256, batch_size=4, num_workers=0,
                    seed=7, hsv=HSV, hsv_on_device=True, cache_dir=str(tmp_path / "cache"))
    dm = COCOSegDataModule(**(defaults | kwargs))
    dm.setup("fit")
    return dm


def _made(dm: COCOSegDataModule, n: int) -> list[DetectionBatch]:
    """The first ``n`` training batches with their pending work done, as on_after_batch_transfer does it."""
    out = []
    for batch in dm.train_dataloader():
        out.append(apply_pending_hsv(apply_pending_pixels(batch)))
        if len(out) == n:
            break
    return out


def _compare(worker: list[DetectionBatch], device: list[DetectionBatch]) -> list[np.ndarray]:
    """Assert every field but the pixels equal; return the pixel differences."""
    assert len(worker) == len(device) > 0
    diffs = []
    for w, d in zip(worker, device):
        assert d.pending_pixels is None and d.hsv_gains is None
        for field in dataclasses.fields(w):
            a, b = getattr(w, field.name), getattr(d, field.name)
            if field.name == "images":
                assert b.shape == a.shape and b.dtype == a.dtype and b.stride() == a.stride()
                diffs.append((a.int() - b.int()).abs().numpy())
            elif isinstance(a, torch.Tensor):
                assert torch.equal(a, b), field.name
            else:  # the counts too: every annotation's fate, and the decodes (made on the device)
                assert a == b, field.name
    return diffs


@pytest.mark.parametrize("partners", ["batch", "uniform"])
def test_the_default_recipe_equals_the_worker_path_bit_for_bit(mixed: tuple[Path, Path], tmp_path: Path,
                                                               partners: str) -> None:
    """Shipped, grey and CMYK JPEGs and PNGs; flips, HSV; both partner schemes; full-size decodes."""
    ann, images = mixed
    worker = _made(_dm(ann, images, tmp_path, mosaic_partners=partners, image_size=640), 4)
    raw = next(iter(_dm(ann, images, tmp_path, mosaic_partners=partners, pixels_on_device=True,
                        image_size=640).train_dataloader()))
    pending = raw.pending_pixels
    assert raw.images.shape == (4, 3, 0, 0) and pending is not None
    kinds = {type(source) for source in pending.sources}
    assert kinds == {EncodedImage, np.ndarray}  # JPEGs as bytes, the PNGs as pixels
    assert len(pending.sources) == len({(s.data.tobytes(), s.reduce) if isinstance(s, EncodedImage) else s.tobytes()
                                        for s in pending.sources})  # each image once per scale
    device = _made(_dm(ann, images, tmp_path, mosaic_partners=partners, pixels_on_device=True, image_size=640), 4)
    assert sum(w.counts.get("reduced_decodes", 0) for w in worker) == 0
    for diff in _compare(worker, device):
        assert diff.max() == 0


def test_reduced_decodes_are_averaged_on_the_device(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    """Tiles shrunk 2x or more: the workers decode JPEGs smaller (libjpeg's scaled IDCT), the device
    averages blocks of the full decode (exact for PNGs and turned photos, which the workers average too)."""
    ann, images = mixed
    worker = _made(_dm(ann, images, tmp_path, hsv=None, hsv_on_device=False), 4)
    assert sum(w.counts.get("reduced_decodes", 0) for w in worker) >= 4
    values = np.concatenate([d.ravel() for d in _compare(worker, _made(_dm(ann, images, tmp_path, hsv=None,
                                                                        hsv_on_device=False,
                                                                        pixels_on_device=True), 4))])
    assert values.mean() < 0.5 and (values > 2).mean() < 0.01


def test_rotated_tiles_agree_within_rounding(coco_mini: Path, tmp_path: Path) -> None:
    """Rotation, shear and strong zoom: OpenCV's warpAffine paths, tiles meeting at slanted seams."""
    ann, images = coco_mini / "annotations/instances_val2017.json", coco_mini / "val2017"
    geometry = dict(degrees=15.0, shear=5.0, scale=(0.5, 1.5), image_size=640)
    worker = _made(_dm(ann, images, tmp_path, **geometry), 3)
    diffs = _compare(worker, _made(_dm(ann, images, tmp_path, pixels_on_device=True, **geometry), 3))
    values = np.concatenate([d.ravel() for d in diffs])
    # Off by more than 2 levels only where the two paths give a seam pixel to different tiles.
    assert (values > 2).mean() < 1e-3 and (values > 0).mean() < 2e-3


def test_photos_turned_by_exif_in_a_data_yaml(coco_mini: Path, tmp_path: Path) -> None:
    """Ultralytics-style data: labels refer to the turned photo; the device turns it as the workers do."""
    root = tmp_path / "yolo"
    names = write_yolo_split(coco_mini / "annotations/instances_val2017.json", coco_mini / "val2017", root, "val",
                             limit=8)
    for k, image in enumerate(sorted((root / "images/val").iterdir())[:6]):
        rotate_with_exif(image.resolve(), image, (6, 3, 8)[k % 3])
    yaml = write_data_yaml(root, names, train="images/val", val="images/val")
    # At 640 px no tile is decoded reduced (the device averages what libjpeg scales: within rounding).
    worker = _made(_dm(Path(), Path(), tmp_path, train_ann=None, train_images=None, dataset=str(yaml),
                       image_size=640), 2)
    device = _made(_dm(Path(), Path(), tmp_path, train_ann=None, train_images=None, dataset=str(yaml),
                       image_size=640, pixels_on_device=True), 2)
    assert sum(w.counts.get("reduced_decodes", 0) for w in worker) == 0
    for diff in _compare(worker, device):
        assert diff.max() == 0


def test_a_bad_file_is_skipped_and_counted_as_the_worker_path_does(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    """A truncated JPEG fails the workers' header check, so its replacement is the worker path's."""
    ann, images = mixed
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in images.iterdir():
        (broken / path.name).symlink_to(path.resolve())
    victim = sorted(p for p in broken.iterdir() if p.suffix == ".jpg")[1]
    data = victim.read_bytes()
    os.unlink(victim)
    victim.write_bytes(data[: len(data) // 2])
    worker = _made(_dm(ann, broken, tmp_path, on_bad_sample="skip", image_size=640), 4)
    device = _made(_dm(ann, broken, tmp_path, on_bad_sample="skip", pixels_on_device=True, image_size=640), 4)
    assert sum(b.counts.get("image_truncated", 0) for b in worker) > 0
    for diff in _compare(worker, device):
        assert diff.max() == 0


@pytest.mark.slow
def test_the_same_batches_for_any_num_workers(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = mixed
    # No image cache: its hits (counted as fewer decodes) follow which worker built which batch.
    alone = _made(_dm(ann, images, tmp_path, pixels_on_device=True, cache_images=0), 4)
    workers = _made(_dm(ann, images, tmp_path, pixels_on_device=True, cache_images=0, num_workers=2,
                        persistent_workers=False), 4)
    for diff in _compare(alone, workers):
        assert diff.max() == 0


def test_a_resume_mid_epoch_sees_the_same_batches(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = mixed
    straight = _made(_dm(ann, images, tmp_path, pixels_on_device=True, cache_images=0), 4)  # a resume starts cold
    first = _dm(ann, images, tmp_path, pixels_on_device=True, cache_images=0).train_dataloader()
    batches = iter(first)
    got = [apply_pending_hsv(apply_pending_pixels(next(batches))) for _ in range(2)]  # then "killed"
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = _dm(ann, images, tmp_path, pixels_on_device=True, cache_images=0).train_dataloader()
    resumed.load_state_dict(state)
    for batch in resumed:
        got.append(apply_pending_hsv(apply_pending_pixels(batch)))
    for diff in _compare(straight, got):
        assert diff.max() == 0


def test_steps_that_need_the_workers_pixels_are_refused_in_one_line(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = mixed
    keys = dict(train_ann=str(ann), train_images=str(images), pixels_on_device=True)
    for extra, words in ((dict(mixup=0.2), "copy_paste or mixup is set"),
                         (dict(copy_paste=0.5), "copy_paste or mixup is set"),
                         (dict(transforms=A.Compose([A.Blur(p=0.5)])), "transforms is set")):
        with pytest.raises(RecipeError, match=f"pixels_on_device is True but {words}") as caught:
            COCOSegDataModule(**keys, **extra)
        assert "\n" not in str(caught.value)
    layout = MosaicAffine(image_size=256)
    for steps, words in (([layout, RandomRotate90()], "the recipe has RandomRotate90"),
                         ([layout, HSVJitter(HSV)], "the recipe's HSVJitter has on_device False")):
        with pytest.raises(RecipeError, match=words):
            COCOSegDataModule(**keys, recipe=steps, image_size=256)
    # Every way of asking for copy-paste or MixUp: the flat keys beside a recipe list (their group
    # step joins the list after it is given), and the list's own group step.
    for extra in (dict(copy_paste=0.5), dict(mixup=0.2), dict(copy_paste=0.3, mixup=0.1)):
        with pytest.raises(RecipeError, match="pixels_on_device is True but copy_paste or mixup is set .*group step"):
            COCOSegDataModule(**keys, **extra, recipe=[layout, RandomFlipUD()], image_size=256)
    for group in (SampleMixing(copy_paste=0.5), SampleMixing(mixup=0.2)):
        with pytest.raises(RecipeError, match="the recipe has SampleMixing, which needs the workers' pixels"):
            COCOSegDataModule(**keys, recipe=[layout, group], image_size=256)
    # What the device runs is accepted: a layout, flips, HSV there (the flat key implies it).
    COCOSegDataModule(**keys, recipe=[layout, RandomFlipUD(), HSVJitter(HSV, on_device=True)], image_size=256)
    assert COCOSegDataModule(**keys, hsv=HSV).augment.hsv.on_device


def test_a_batch_mixing_pending_and_made_pixels_is_refused(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = mixed
    made = _dm(ann, images, tmp_path).train_dataset.__getitems__([(0, 0)])
    pending = _dm(ann, images, tmp_path, pixels_on_device=True).train_dataset.__getitems__([(0, 1)])
    with pytest.raises(ValueError, match="pixels pending on the device for some samples of the batch but not for all"):
        DetectionCollate()([made[0], pending[0]])
