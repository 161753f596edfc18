"""pixels_on_device through the DataModule's own ``on_after_batch_transfer`` (issue 62), on small generated JPEGs:
the batches equal the worker path's (same seed, ``pixels_on_device`` false) bit for bit, a canvas flipped several
times is mirrored by the parity of its flips (twice: not at all; three times: once), and every refusal rule says
what it refuses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from seg_datamodule import COCOSegDataModule, DetectionBatch
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.transforms import RandomFlipUD, SampleMixing
from seg_datamodule.transforms.geometric.flips import RandomFlipLR
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.pixel.hsv import HSVJitter
from seg_datamodule.transforms.recipe import RecipeError

HSV = (0.015, 0.7, 0.4)
S = 128  # canvas side; the images' long side, so no tile is decoded reduced
N = 8  # images


@pytest.fixture(scope="module")
def smooth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a COCO file, its folder) of :data:`N` JPEGs, 96 x 128, smooth gradients with a bright square each (annotated),
    every one different and none symmetric, so a wrong mirror or a wrong order of steps shows in the pixels."""
    root = tmp_path_factory.mktemp("smooth")
    images, annotations = [], []
    y, x = np.mgrid[0:96, 0:128]
    for k in range(N):
        pixels = np.stack([(x * 2 + 9 * k) % 256, (y * 2 + x // 3 + 17 * k) % 256, (3 * y + 5 * k) % 256], -1)
        top, left = 8 + 6 * k, 10 + 9 * k
        pixels[top:top + 24, left:left + 20] = (240, 220, 40)
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"{k + 1}.jpg", "JPEG", quality=92)
        images.append({"id": k + 1, "file_name": f"{k + 1}.jpg", "height": 96, "width": 128})
        annotations.append({"id": k + 1, "image_id": k + 1, "category_id": 1 + k % 2, "iscrowd": 0, "area": 480.0,
                            "bbox": [left, top, 20, 24],
                            "segmentation": [[left, top, left + 20, top, left + 20, top + 24, left, top + 24]]})
    ann = root / "smooth.json"
    ann.write_text(json.dumps({"images": images, "annotations": annotations,
                               "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}))
    return ann, root


def _hooked(smooth: tuple[Path, Path], tmp_path: Path, n: int = 2, **kwargs: Any) -> list[DetectionBatch]:
    """The first ``n`` training batches after the DataModule's own ``on_after_batch_transfer`` (no Trainer)."""
    ann, images = smooth
    dm = COCOSegDataModule(**{"train_ann": str(ann), "train_images": str(images), "image_size": S, "batch_size": 4,
                              "num_workers": 0, "seed": 3, "cache_dir": str(tmp_path / "cache"), **kwargs})
    dm.setup("fit")
    out = []
    for batch in dm.train_dataloader():
        out.append(dm.on_after_batch_transfer(batch, 0))
        if len(out) == n:
            return out
    return out


def _assert_same(a: list[DetectionBatch], b: list[DetectionBatch]) -> None:
    """Every field of every batch equal, the pixels bit for bit; nothing left pending."""
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.pending_pixels is None and y.pending_pixels is None and x.hsv_gains is None and y.hsv_gains is None
        assert x.images.shape[-2:] == (S, S)
        for field in dataclasses.fields(x):
            p, q = getattr(x, field.name), getattr(y, field.name)
            if isinstance(p, torch.Tensor):
                assert p.shape == q.shape and p.stride() == q.stride() and torch.equal(p, q), field.name
            else:
                assert p == q, field.name


def test_the_hook_makes_the_worker_paths_batches_bit_for_bit(smooth: tuple[Path, Path], tmp_path: Path) -> None:
    """The default recipe (mosaic, its left-right flip) with HSV, which the hook jitters after the pixels are made."""
    worker = _hooked(smooth, tmp_path, hsv=HSV, hsv_on_device=True)
    assert sum(b.counts.get("reduced_decodes", 0) for b in worker) == 0
    assert all(b.images.float().std() > 20 for b in worker)  # real pixels, not a blank canvas
    _assert_same(worker, _hooked(smooth, tmp_path, hsv=HSV, pixels_on_device=True))
    plain = _hooked(smooth, tmp_path)  # the jitter does change the pixels, so its order is seen
    assert not any(torch.equal(p.images, w.images) for p, w in zip(plain, worker))


@pytest.mark.parametrize("pixels_on_device", [False, True])
def test_a_canvas_flipped_twice_is_not_mirrored_and_three_times_is_mirrored_once(
        smooth: tuple[Path, Path], tmp_path: Path, pixels_on_device: bool) -> None:
    """Reference: the same recipe with flips of ``p=0`` in place of the extra ones (one number drawn either way,
    so every other draw is the same). Both axes, each flipped a different number of times."""
    def recipe(*ps: float) -> list[Any]:
        ud, lr = ps[:len(ps) // 2], ps[len(ps) // 2:]
        return [MosaicAffine(image_size=S, flip_lr=0.0), *map(RandomFlipUD, ud), *map(RandomFlipLR, lr)]

    def run(*ps: float) -> list[DetectionBatch]:
        return _hooked(smooth, tmp_path, recipe=recipe(*ps), pixels_on_device=pixels_on_device)

    none = run(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    _assert_same(none, run(1.0, 1.0, 0.0, 1.0, 1.0, 0.0))  # each axis twice: as never
    once = run(1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    _assert_same(once, run(1.0, 1.0, 1.0, 0.0, 0.0, 0.0))  # three times upside down: once
    assert all(torch.equal(o.images, n.images.flip(-2)) for o, n in zip(once, none))
    both = run(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # three times each way: once each
    assert all(torch.equal(b.images, n.images.flip(-2).flip(-1)) for b, n in zip(both, none))
    _assert_same(both, run(1.0, 0.0, 0.0, 1.0, 0.0, 0.0))  # the targets too: once each way
    # A mask mirrors its unflipped one but at cells whose centre lies on a polygon edge (a tile edge
    # at an integer x here): the crossing test's half-open rule is not symmetric under a mirror.
    assert all((b.masks != n.masks.flip(-2).flip(-1)).float().mean() < 0.01 for b, n in zip(both, none))
    if pixels_on_device:  # the device's parity equals the workers' flips, bit for bit
        _assert_same(both, _hooked(smooth, tmp_path, recipe=recipe(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)))


# ---------------------------------------------------------------------------------------- refusals


def test_every_refusal_says_what_needs_the_workers_pixels() -> None:
    layout = MosaicAffine(image_size=S)
    prefix = "pixels_on_device is True but "
    suffix = ": the device makes the pixels, and only a layout, flips and HSV on the device run there"
    # The flat fields: an HSV jitter left in the workers (the DataModule's keys move it; the options do not).
    with pytest.raises(RecipeError) as caught:
        AugmentOptions(layout, hsv=HSVJitter(HSV, on_device=False), pixels_on_device=True)
    assert str(caught.value) == f"{prefix}hsv runs in the workers (hsv_on_device is False){suffix}"
    assert AugmentOptions(layout, hsv=HSVJitter(HSV, on_device=True), pixels_on_device=True).pixels_on_device
    # Each flat refusal, with its words.
    for fields, words in ((dict(copy_paste=0.5), "copy_paste or mixup is set (they mix the workers' pixels)"),
                          (dict(mixup=0.1, hsv=HSVJitter(HSV, on_device=True)),
                           "copy_paste or mixup is set (they mix the workers' pixels)")):
        with pytest.raises(RecipeError) as caught:
            AugmentOptions(layout, pixels_on_device=True, **fields)
        assert str(caught.value) == f"{prefix}{words}{suffix}"
    # A recipe list whose group step mixes nothing needs no worker pixels: accepted, flips and all.
    steps = [layout, RandomFlipUD(), RandomFlipLR(), SampleMixing()]
    assert COCOSegDataModule(recipe=steps, image_size=S, pixels_on_device=True).augment.pixels_on_device
    with pytest.raises(TypeError, match=r"^pixels_on_device must be a bool, got 1$"):
        AugmentOptions(layout, pixels_on_device=1)  # type: ignore[arg-type]
