"""Test helpers: ground truth of a COCO file as predictions, and batches that carry a letterbox.

These build predictions straight from ``pycocotools`` (``annToMask``) and this package's own
letterbox layout, so the tests compare the metric with COCO's reading of the same file.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pycocotools.coco import COCO

from seg_datamodule.structures import DetectionBatch


def letterbox_batch(
    image_ids: Sequence[int],
    scales: Sequence[float],
    pads: Sequence[tuple[float, float]],
    orig_sizes: Sequence[tuple[int, int]],
    canvas: tuple[int, int],
    mask_stride: int = 4,
) -> DetectionBatch:
    """A DetectionBatch with no targets, only what evaluation reads (images are a cheap view)."""
    b = len(image_ids)
    hp, wp = -(-canvas[0] // mask_stride), -(-canvas[1] // mask_stride)
    return DetectionBatch(
        images=torch.zeros((), dtype=torch.uint8).expand(b, 3, *canvas),
        boxes=torch.zeros(0, 4),
        labels=torch.zeros(0, dtype=torch.int64),
        masks=torch.zeros(0, hp, wp, dtype=torch.bool),
        boxes_per_image=torch.zeros(b, dtype=torch.int64),
        image_ids=torch.tensor(list(image_ids), dtype=torch.int64),
        annotation_ids=torch.zeros(0, dtype=torch.int64),
        ignore_masks=torch.zeros(b, hp, wp, dtype=torch.bool),
        scales=torch.tensor(list(scales), dtype=torch.float32),
        pads=torch.tensor([list(p) for p in pads], dtype=torch.float32).reshape(b, 2),
        orig_sizes=torch.tensor([list(s) for s in orig_sizes], dtype=torch.int64).reshape(b, 2),
        mask_stride=mask_stride,
    )


def gt_annotations(coco: COCO, image_id: int) -> list[dict]:
    """Non-crowd annotations of an image (what a perfect model would predict), by annotation id."""
    anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id], iscrowd=False))
    return sorted(anns, key=lambda a: a["id"])


def gt_full_resolution(coco: COCO, image_id: int) -> dict[str, torch.Tensor]:
    """Ground truth as predictions on a canvas equal to the original image (scale 1, no pad)."""
    category_ids = sorted(coco.cats)
    anns = gt_annotations(coco, image_id)
    img = coco.imgs[image_id]
    h, w = img["height"], img["width"]
    boxes = np.array([[x, y, x + bw, y + bh] for x, y, bw, bh in (a["bbox"] for a in anns)], np.float64).reshape(-1, 4)
    masks = np.stack([coco.annToMask(a).astype(bool) for a in anns]) if anns else np.zeros((0, h, w), bool)
    return {
        "boxes": torch.from_numpy(boxes),
        "scores": torch.linspace(1.0, 0.5, len(anns)),
        "labels": torch.tensor([category_ids.index(a["category_id"]) for a in anns], dtype=torch.int64),
        "masks": torch.from_numpy(masks),
    }


def letterboxed(coco: COCO, image_id: int, image_size: int) -> tuple[float, tuple[float, float], tuple[int, int]]:
    """(scale, pad, orig_size) of an image letterboxed as the validation dataset does it."""
    from seg_datamodule.transforms.kernels.plan import letterbox_layout

    img = coco.imgs[image_id]
    orig = (int(img["height"]), int(img["width"]))
    _, _, scale, pad = letterbox_layout(orig, (image_size, image_size))
    return float(scale), (float(pad[0]), float(pad[1])), orig


def gt_on_canvas(coco: COCO, image_id: int, image_size: int = 640, stride: int = 4) -> dict[str, torch.Tensor]:
    """Ground truth letterboxed onto the canvas and rasterised at ``stride`` (bool masks), as a
    model trained on perfect stride-``stride`` targets would predict it."""
    from seg_datamodule.ops.raster import rasterize_polygons

    category_ids = sorted(coco.cats)
    scale, (pad_x, pad_y), _ = letterboxed(coco, image_id, image_size)
    anns = gt_annotations(coco, image_id)
    instances = []
    for a in anns:
        if not isinstance(a["segmentation"], list):
            raise NotImplementedError(f"annotation {a['id']}: a non-crowd RLE; these helpers take polygons")
        instances.append([np.asarray(r, np.float64).reshape(-1, 2) * scale + (pad_x, pad_y) for r in a["segmentation"]])
    masks = rasterize_polygons(instances, (image_size, image_size), stride)
    boxes = np.array([[x, y, x + bw, y + bh] for x, y, bw, bh in (a["bbox"] for a in anns)], np.float64).reshape(-1, 4)
    boxes = boxes * scale + np.array([pad_x, pad_y, pad_x, pad_y])
    return {
        "boxes": torch.from_numpy(boxes),
        "scores": torch.linspace(1.0, 0.5, len(anns)),
        "labels": torch.tensor([category_ids.index(a["category_id"]) for a in anns], dtype=torch.int64),
        "masks": torch.from_numpy(masks),
    }


def perturbed(pred: dict[str, torch.Tensor], num_classes: int, seed: int, image_size: int = 640) -> dict[str, torch.Tensor]:
    """A plausible, imperfect model: jittered boxes, some wrong labels, random scores, a false
    positive or two, and masks as noisy stride-grid logits (deterministic in ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    boxes = pred["boxes"].double().clone()
    n = boxes.shape[0]
    size = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
    boxes = boxes + 0.08 * size * torch.randn(n, 4, generator=gen, dtype=torch.float64)
    labels = pred["labels"].clone()
    wrong = torch.rand(n, generator=gen) < 0.2
    labels[wrong] = torch.randint(0, num_classes, (int(wrong.sum()),), generator=gen)
    masks = pred["masks"]
    extra = int(torch.randint(0, 3, (1,), generator=gen))
    xy = torch.rand(extra, 2, generator=gen, dtype=torch.float64) * image_size * 0.7
    wh = torch.rand(extra, 2, generator=gen, dtype=torch.float64) * image_size * 0.3 + 4
    boxes = torch.cat([boxes, torch.cat([xy, xy + wh], 1)])
    labels = torch.cat([labels, torch.randint(0, num_classes, (extra,), generator=gen)])
    targets = torch.cat([masks.float() * 2 - 1, torch.zeros(extra, *masks.shape[1:])])
    # Blobby noise (8 x 8 cells a value), then YOLACT's crop to the predicted box.
    hm, wm = masks.shape[1:]
    coarse = torch.randn((len(targets), -(-hm // 8), -(-wm // 8)), generator=gen)
    noise = coarse.repeat_interleave(8, 1).repeat_interleave(8, 2)[:, :hm, :wm]
    logits = targets * 3 + 2.0 * noise
    centres_x = (torch.arange(wm, dtype=torch.float64) + 0.5) * (image_size / wm)
    centres_y = (torch.arange(hm, dtype=torch.float64) + 0.5) * (image_size / hm)
    inside = ((centres_x >= boxes[:, 0, None]) & (centres_x <= boxes[:, 2, None]))[:, None, :] & (
        (centres_y >= boxes[:, 1, None]) & (centres_y <= boxes[:, 3, None]))[:, :, None]
    logits = logits.masked_fill(~inside, -10.0)
    return {
        "boxes": boxes,
        "scores": torch.rand(n + extra, generator=gen),
        "labels": labels,
        "mask_logits": logits,
    }
