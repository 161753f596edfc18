"""Test helpers for LVIS: the checked-in ``lvis_val_100.json``, a v1-style copy, generated images,
and ground truth as predictions (straight from pycocotools, independent of the package).

``tests/fixtures/lvis/lvis_val_100.json`` is the official LVIS API's 100-image file (CC BY 4.0;
see the README beside it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from pycocotools import mask as mask_utils

LVIS_VAL_100 = Path(__file__).resolve().parent / "fixtures" / "lvis" / "lvis_val_100.json"


def load_json(path: Path = LVIS_VAL_100) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_v1(dest: Path, data: dict[str, Any] | None = None) -> Path:
    """An LVIS v1-style copy: images without ``file_name``, the path only in ``coco_url``."""
    data = load_json() if data is None else data
    for img in data["images"]:
        img.pop("file_name", None)
    dest.write_text(json.dumps(data), encoding="utf-8")
    return dest


def write_images(data: dict[str, Any], root: Path, *, from_url: bool) -> None:
    """A small JPEG of each image's size, where the file (``file_name``, or ``coco_url``'s last
    two parts) says it is."""
    rng = np.random.default_rng(0)
    for img in data["images"]:
        rel = "/".join(img["coco_url"].split("/")[-2:]) if from_url else img["file_name"]
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (img["height"] // 16 + 1, img["width"] // 16 + 1, 3), dtype=np.uint8)
        big = cv2.resize(pixels, (img["width"], img["height"]), interpolation=cv2.INTER_NEAREST)
        cv2.imwrite(str(path), big)


def gt_masks(data: dict[str, Any], image_id: int) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The image's annotations (file order) and their masks, decoded by pycocotools."""
    img = next(i for i in data["images"] if i["id"] == image_id)
    h, w = img["height"], img["width"]
    anns = [a for a in data["annotations"] if a["image_id"] == image_id]
    masks = [mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], h, w))) for a in anns]
    return anns, (np.stack(masks).astype(bool) if masks else np.zeros((0, h, w), bool))


def gt_predictions(data: dict[str, Any], image_id: int) -> dict[str, torch.Tensor]:
    """The image's ground truth as predictions at full resolution (canvas = image)."""
    category_ids = sorted(c["id"] for c in data["categories"])
    anns, masks = gt_masks(data, image_id)
    boxes = np.array([[x, y, x + bw, y + bh] for x, y, bw, bh in (a["bbox"] for a in anns)], np.float64).reshape(-1, 4)
    return {
        "boxes": torch.from_numpy(boxes),
        "scores": torch.linspace(1.0, 0.5, len(anns)),
        "labels": torch.tensor([category_ids.index(a["category_id"]) for a in anns], dtype=torch.int64),
        "masks": torch.from_numpy(masks),
    }
