"""How the demo model is scored: the checks beside its metrics, the figures it logs, the boxes predict pools at.

The evaluation glue of :class:`~seg_datamodule.demo.model.YolactLite`, apart from its hooks (its
metrics come from :func:`~seg_datamodule.evaluation.choose.metric_for_file`): the model's
``val_ann`` and ``mask_stride`` checked against the DataModule's, the AP figures
picked from a metric's results for logging, and the whole-image boxes
:meth:`~seg_datamodule.demo.model.YolactLite.predict_step` pools at for an image without boxes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seg_datamodule.structures import DetectionBatch

__all__ = ["TEST_STATS", "VAL_STATS", "check_datamodule_agrees", "picked_stats", "prediction_boxes"]

#: The stats logged per IoU type in validation (``val/segm_AP``, ...; LVIS adds ``APr/c/f``).
VAL_STATS = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large", "APs", "APm", "APl", "APr", "APc", "APf")
#: The stats logged per IoU type in test (``test/segm_AP``, ...; an LVIS file's too).
TEST_STATS = VAL_STATS


def check_datamodule_agrees(val_ann: str | None, mask_stride: int, datamodule: Any) -> None:
    """Refuse a model whose ``val_ann`` or ``mask_stride`` contradicts the DataModule's.

    Args:
        val_ann: the model's own ``val_ann`` (``None``: take the DataModule's).
        mask_stride: the model's prototype stride.
        datamodule: the Trainer's DataModule, or ``None`` (plain DataLoaders: nothing to check).

    Raises:
        ValueError: naming both files, or both strides.
    """
    dm_ann = getattr(datamodule, "val_ann", None)
    if val_ann is not None and dm_ann is not None and not _same_file(val_ann, dm_ann):
        raise ValueError(
            f"YolactLite(val_ann={str(val_ann)!r}) differs from the DataModule's val_ann={str(dm_ann)!r}; "
            "the model scores the DataModule's validation images, so leave the model's val_ann unset "
            "(it takes the DataModule's) or give both the same file"
        )
    dm_stride = getattr(datamodule, "mask_stride", None)
    if isinstance(dm_stride, int) and dm_stride != mask_stride:
        raise ValueError(
            f"YolactLite(mask_stride={mask_stride}) differs from the DataModule's mask_stride={dm_stride}; "
            "the prototype grid must be the masks' grid"
        )


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (resolved; by inode when both exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def picked_stats(results: Mapping[str, Any], prefix: str, stats: Iterable[str]) -> dict[str, Any]:
    """``{prefix}/{iou_type}_{stat}`` of each result whose stat is one of ``stats``, in results' order."""
    stats = tuple(stats)
    return {f"{prefix}/{k}": v for k, v in results.items() if k.split("_", 1)[1] in stats}


def prediction_boxes(batch: DetectionBatch) -> tuple[Tensor, Tensor]:
    """Each image's own boxes, or for an image without any its whole-image box (the letterboxed image).

    Args:
        batch: a predict (no targets) or test / validation batch.

    Returns:
        boxes (Tensor[N, 4] float32) xyxy canvas pixels, boxes_per_image (Tensor[B] int64).
    """
    given = batch.boxes.float().split(batch.boxes_per_image.tolist())
    height, width = batch.images.shape[-2:]
    boxes = []
    for b, own in enumerate(given):
        if len(own):
            boxes.append(own)
            continue
        # The image without its letterbox pad: pad .. pad + size * scale, inside the canvas.
        pad, size, scale = batch.pads[b].float(), batch.orig_sizes[b].flip(0).float(), batch.scales[b].float()
        box = torch.cat([pad, pad + size * scale]).clamp(min=0.0)
        box = torch.minimum(box, box.new_tensor([width, height, width, height], dtype=torch.float32))
        boxes.append(box[None])
    per_image = torch.tensor([len(b) for b in boxes], dtype=torch.int64, device=batch.boxes.device)
    return (torch.cat(boxes) if boxes else batch.boxes.new_zeros((0, 4))), per_image
