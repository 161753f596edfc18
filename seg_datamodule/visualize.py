"""Look at a batch: images with their instance masks (upsampled from the stride grid) and boxes.

:func:`draw_instances` is a pure function over one image's arrays; :func:`save_batch_png` lays a
:class:`~seg_datamodule.structures.batch.DetectionBatch` out as a grid and writes it as a PNG.
:func:`draw_results` draws COCO results entries (RLE masks, xywh boxes) on their original image,
labelled with class names and scores (what ``COCOResultsWriter(draw_dir=...)`` writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from seg_datamodule.structures import DetectionBatch

__all__ = ["batch_grid", "draw_instances", "draw_results", "save_batch_png"]


def _palette(n: int) -> np.ndarray:
    """``n`` distinct saturated RGB colours, ``uint8 (n, 3)`` (golden-ratio hues)."""
    hues = (np.arange(n) * 0.618033988749895 % 1.0 * 180).astype(np.uint8)
    hsv = np.stack([hues, np.full(n, 220, np.uint8), np.full(n, 255, np.uint8)], axis=1)
    return cv2.cvtColor(hsv[None], cv2.COLOR_HSV2RGB)[0]


def draw_instances(
    image: np.ndarray,
    masks: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray | None = None,
    mask_stride: int = 4,
    ignore_mask: np.ndarray | None = None,
    alpha: float = 0.45,
    origins: np.ndarray | None = None,
) -> np.ndarray:
    """Overlay masks (nearest-upsampled from the stride grid), boxes and labels on one image.

    Copies pasted by copy-paste get a white outline around their mask and a ``P`` before their
    label; instances mixed in by MixUp an ``M``.

    Args:
        image (ndarray[H, W, 3] uint8): RGB image.
        masks (ndarray[N, Hp, Wp] bool): instance masks on the stride grid.
        boxes (ndarray[N, 4] float): xyxy boxes in image pixels.
        labels (ndarray[N] int | Sequence[str] | None): class indices or names, written at each
            box's corner.
        mask_stride (int): stride of the mask grid.
        ignore_mask (ndarray[Hp, Wp] bool | None): crowd regions, hatched in grey.
        alpha (float): mask opacity.
        origins (ndarray[N] uint8 | None): per instance, an index of
            :data:`~seg_datamodule.structures.sample.ORIGINS` (``DetectionBatch.origins``).

    Returns:
        ndarray[H, W, 3] uint8: a new RGB image.

    Raises:
        ValueError: ``masks`` and ``boxes`` disagree on N, or ``mask_stride`` is not positive.
    """
    if mask_stride < 1:
        raise ValueError(f"mask_stride must be a positive int, got {mask_stride!r}")
    if len(masks) != len(boxes):
        raise ValueError(f"masks has {len(masks)} instances but boxes has {len(boxes)}")
    h, w = image.shape[:2]
    out = image.astype(np.float32)
    colours = _palette(max(len(masks), 1))

    def up(m: np.ndarray) -> np.ndarray:
        big = np.repeat(np.repeat(m, mask_stride, axis=0), mask_stride, axis=1)
        return big[:h, :w]

    def window(m: np.ndarray) -> tuple[int, int, np.ndarray] | None:
        """``(top, left, the mask's bounding window upsampled)`` in image pixels; None when empty.
        Only the window is upsampled and blended: the cost follows the instance, not the image."""
        rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if not len(rows):
            return None
        top, left = int(rows[0]) * mask_stride, int(cols[0]) * mask_stride
        sub = m[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        big = np.repeat(np.repeat(sub, mask_stride, axis=0), mask_stride, axis=1)
        return top, left, big[: max(h - top, 0), : max(w - left, 0)]

    # 1. Masks, blended in turn; crowd regions as a grey checkerboard.
    for mask, colour in zip(masks, colours):
        found = window(np.asarray(mask, bool))
        if found is None:
            continue
        top, left, big = found
        region = out[top : top + big.shape[0], left : left + big.shape[1]]
        region[big] = (1 - alpha) * region[big] + alpha * colour
    if ignore_mask is not None and np.any(ignore_mask):
        big = up(np.asarray(ignore_mask, bool))
        yy, xx = np.indices((h, w))
        hatch = big & (((yy + xx) // 6) % 2 == 0)
        out[hatch] = 0.5 * out[hatch] + 0.5 * 128
    out = np.ascontiguousarray(out.clip(0, 255).astype(np.uint8))
    origins = np.zeros(len(masks), np.uint8) if origins is None else np.asarray(origins)
    for mask in np.asarray(masks)[origins == 1]:
        found = window(np.asarray(mask, bool))
        if found is None:
            continue
        top, left, big = found
        contours, _ = cv2.findContours(big.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE,
                                       offset=(left, top))
        cv2.drawContours(out, contours, -1, (255, 255, 255), 2, cv2.LINE_AA)

    # 2. Boxes and labels.
    for k, (box, colour) in enumerate(zip(np.asarray(boxes, np.float64), colours)):
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        c = tuple(int(v) for v in colour)
        cv2.rectangle(out, (x0, y0), (max(x1 - 1, x0), max(y1 - 1, y0)), c, 1, cv2.LINE_AA)
        if labels is not None:
            tag = ("", "P", "M")[int(origins[k])] if origins[k] < 3 else "?"
            text = labels[k] if isinstance(labels[k], str) else str(int(labels[k]))
            cv2.putText(out, f"{tag}{text}", (x0 + 2, max(y0 + 10, 10)),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.35, c, 1, cv2.LINE_AA)
    return out


def draw_results(image: np.ndarray, results: list[dict], names: dict[int, str], min_score: float = 0.3,
                 alpha: float = 0.45) -> tuple[np.ndarray, list[str]]:
    """Draw one image's COCO results entries: masks blended, boxes, ``"<class name> <score>"`` labels.

    Args:
        image (ndarray[H, W, 3] uint8): the original image, RGB, as the results' pixels refer to it.
        results: its entries (``bbox`` xywh, ``score``, ``category_id``, optional ``segmentation``
            RLE of size ``[H, W]``).
        names: COCO category id -> class name (an id without one is written as the id).
        min_score: entries scoring below this are not drawn.
        alpha: mask opacity.

    Returns:
        (a new RGB image, the labels drawn, best score first).
    """
    from pycocotools import mask as mask_utils

    kept = sorted((r for r in results if r["score"] >= min_score), key=lambda r: -r["score"])
    out = image.astype(np.float32)
    colours = _palette(max(len(kept), 1))
    for r, colour in zip(kept, colours):
        if "segmentation" in r:
            rle = dict(r["segmentation"])
            rle["counts"] = rle["counts"].encode() if isinstance(rle["counts"], str) else rle["counts"]
            mask = mask_utils.decode(rle).astype(bool)
            out[mask] = (1 - alpha) * out[mask] + alpha * colour
    out = np.ascontiguousarray(out.clip(0, 255).astype(np.uint8))
    labels = []
    for r, colour in zip(kept, colours):
        x, y, w, h = r["bbox"]
        c = tuple(int(v) for v in colour)
        cv2.rectangle(out, (int(round(x)), int(round(y))), (int(round(x + w)), int(round(y + h))), c, 2, cv2.LINE_AA)
        label = f"{names.get(int(r['category_id']), str(r['category_id']))} {r['score']:.2f}"
        labels.append(label)
        (tw, th), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)
        top = max(int(round(y)) - th - 4, 0)
        cv2.rectangle(out, (int(round(x)), top), (int(round(x)) + tw + 4, top + th + 4), c, -1)
        cv2.putText(out, label, (int(round(x)) + 2, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1,
                    cv2.LINE_AA)
    return out, labels


def _named(labels: list[int], names: Sequence[str] | None) -> list[str]:
    """Class names for ``labels`` (a label without one, or no names at all: the label itself)."""
    return [names[k] if names is not None and 0 <= k < len(names) else str(k) for k in labels]


def batch_grid(batch: DetectionBatch, max_images: int = 16, columns: int = 4,
               names: Sequence[str] | None = None) -> np.ndarray:
    """Draw every image of a batch (up to ``max_images``) and tile them in a grid.

    Args:
        batch (DetectionBatch): a collated batch (``images`` uint8 or float in [0, 255]).
        max_images (int): at most this many images.
        columns (int): images per row.
        names (Sequence[str] | None): class names by label (the DataModule's ``class_names``).

    Returns:
        ndarray[rows * H, columns * W, 3] uint8: RGB grid (fill 0 where no image).
    """
    images = batch.images[:max_images].permute(0, 2, 3, 1).cpu().clamp(0, 255).to(torch.uint8).numpy()
    masks = batch.split_masks()
    counts = batch.boxes_per_image.tolist()
    starts = np.cumsum([0, *counts])
    b, h, w = images.shape[:3]
    columns = max(1, min(columns, b))
    rows = -(-b // columns)
    grid = np.zeros((rows * h, columns * w, 3), np.uint8)
    for i in range(b):
        sl = slice(int(starts[i]), int(starts[i + 1]))
        drawn = draw_instances(
            images[i],
            masks[i].cpu().numpy(),
            batch.boxes[sl].cpu().numpy(),
            _named(batch.labels[sl].tolist(), names),
            mask_stride=batch.mask_stride,
            ignore_mask=batch.ignore_masks[i].cpu().numpy(),
            origins=None if batch.origins is None else batch.origins[sl].cpu().numpy(),
        )
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = drawn
    return grid


def save_batch_png(
    batch: DetectionBatch, path: str | Path, max_images: int = 16, columns: int = 4,
    names: Sequence[str] | None = None,
) -> Path:
    """Write :func:`batch_grid` of ``batch`` as a PNG.

    Args:
        batch (DetectionBatch): a collated batch.
        path (str | Path): output file (parent folders are created).
        max_images (int): at most this many images.
        columns (int): images per row.
        names (Sequence[str] | None): class names by label (the DataModule's ``class_names``).

    Returns:
        Path: the written file.

    Raises:
        OSError: the file could not be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = batch_grid(batch, max_images=max_images, columns=columns, names=names)
    if not cv2.imwrite(str(path), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR)):
        raise OSError(f"could not write PNG {str(path)!r}")
    return path
