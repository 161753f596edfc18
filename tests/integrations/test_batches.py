"""to_ultralytics_batch and to_torchvision against hand-computed values (no Ultralytics needed)."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from _reference import reference_rasterize
from seg_datamodule import COCOSegDataModule, collate_detection
from seg_datamodule.integrations import full_resolution_masks, semantic_masks, to_torchvision, to_ultralytics_batch


def test_the_network_guard_refuses_at_once() -> None:
    with pytest.raises(RuntimeError, match="reach the network"):
        socket.getaddrinfo("one.one.one.one", 443)
    with socket.socket() as sock, pytest.raises(RuntimeError, match="reach the network"):
        sock.connect(("1.1.1.1", 443))


def test_ultralytics_batch_fields(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples, mask_stride=4)
    out = to_ultralytics_batch(batch)
    assert set(out) == {"img", "cls", "bboxes", "masks", "batch_idx"}
    n = int(batch.boxes_per_image.sum())
    assert out["img"].dtype == torch.float32 and out["img"].shape == (4, 3, 128, 128)
    assert torch.equal(out["img"] * 255, batch.images.float())
    assert out["cls"].shape == (n, 1) and torch.equal(out["cls"][:, 0].long(), batch.labels)
    assert out["batch_idx"].tolist() == [0.0] * 4 + [1.0] * 3 + [2.0] * 2
    assert out["masks"].shape == (n, 32, 32) and torch.equal(out["masks"].bool(), batch.masks)
    # xywh normalised by the canvas, back to xyxy pixels by hand.
    x, y, w, h = (out["bboxes"] * 128).unbind(1)
    torch.testing.assert_close(torch.stack([x - w / 2, y - h / 2, x + w / 2, y + h / 2], 1), batch.boxes)


def test_ultralytics_batch_without_instances(demo_val_samples) -> None:
    out = to_ultralytics_batch(collate_detection(demo_val_samples[3:], mask_stride=4), semantic=True)
    assert out["cls"].shape == (0, 1) and out["bboxes"].shape == (0, 4) and out["masks"].shape == (0, 32, 32)
    assert out["batch_idx"].shape == (0,) and out["sem_masks"].shape == (1, 32, 32) and not out["sem_masks"].any()


def test_semantic_masks_smallest_instance_wins() -> None:
    masks = torch.zeros(3, 4, 4, dtype=torch.bool)
    masks[0, :3, :3] = True  # class 2, 9 cells
    masks[1, 1:3, 1:3] = True  # class 5, 4 cells, inside the first
    masks[2, 0, 0] = True  # class 7, image 1
    out = semantic_masks(masks, torch.tensor([2, 5, 7]), torch.tensor([2, 1]))
    want = torch.zeros(2, 4, 4)
    want[0, :3, :3] = 2
    want[0, 1:3, 1:3] = 5
    want[1, 0, 0] = 7
    assert torch.equal(out, want)


def test_full_resolution_masks_repeat_cells_and_crop() -> None:
    masks = torch.tensor([[[1, 0], [0, 1]]], dtype=torch.bool)  # a 2x2 grid of a 7x8 canvas at stride 4
    full = full_resolution_masks(masks, (7, 8), 4)
    want = torch.zeros(1, 7, 8, dtype=torch.bool)
    want[0, :4, :4] = True
    want[0, 4:, 4:] = True
    assert torch.equal(full, want)
    assert full_resolution_masks(masks, (2, 2), 1) is masks
    with pytest.raises(ValueError, match=r"\(N, 2, 3\)"):
        full_resolution_masks(masks, (7, 9), 4)


def test_to_torchvision_fields(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples, mask_stride=4)
    images, targets = to_torchvision(batch)
    assert len(images) == len(targets) == 4
    counts = batch.boxes_per_image.tolist()
    for b, (image, target) in enumerate(zip(images, targets)):
        assert image.dtype == torch.float32 and image.shape == (3, 128, 128) and image.is_contiguous()
        assert torch.equal(image * 255, batch.images[b].float())
        first = sum(counts[:b])
        torch.testing.assert_close(target["boxes"], batch.boxes[first:first + counts[b]])  # xyxy canvas pixels
        assert torch.equal(target["labels"], batch.labels[first:first + counts[b]] + 1)
        assert target["masks"].dtype == torch.uint8 and target["masks"].shape == (counts[b], 128, 128)
    assert targets[3]["boxes"].shape == (0, 4) and targets[3]["masks"].shape == (0, 128, 128)


def test_to_torchvision_masks_at_stride_1_equal_the_full_grid_reference(coco_mini) -> None:
    # Real COCO polygons letterboxed onto a 160 px canvas: each target mask is the independent
    # crossing test of that instance's canvas polygons at stride 1, bit for bit.
    dm = COCOSegDataModule(
        val_ann=str(coco_mini / "annotations/instances_val2017.json"), val_images=str(coco_mini / "val2017"),
        train_ann=str(coco_mini / "annotations/instances_val2017.json"), train_images=str(coco_mini / "val2017"),
        image_size=160, mask_stride=1, num_workers=0, use_cache=False,
    )
    dm.setup("validate")
    samples = [dm.val_dataset[i] for i in range(min(6, len(dm.val_dataset)))]
    batch = collate_detection(samples, mask_stride=1)
    _, targets = to_torchvision(batch)
    checked = 0
    for sample, target in zip(samples, targets):
        instances = [sample.polygons.instance(n) for n in range(sample.num_instances)]
        want = reference_rasterize(instances, (160, 160), 1) if instances else np.zeros((0, 160, 160), bool)
        np.testing.assert_array_equal(target["masks"].numpy().astype(bool), want)
        checked += len(instances)
    assert checked > 20


def test_the_package_imports_without_ultralytics() -> None:
    code = (
        "import sys; sys.modules['ultralytics'] = None\n"
        "import seg_datamodule.integrations as i\n"
        "try:\n    i.YOLOSegModule(num_classes=2)\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert 'pip install "seg-datamodule[ultralytics]"' in out.stdout and "AGPL-3.0" in out.stdout
