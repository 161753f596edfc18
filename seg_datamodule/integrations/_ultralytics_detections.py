"""Ultralytics' eval-mode segmentation outputs as this project's detections: its own NMS
(``ultralytics.utils.nms.non_max_suppression``) and mask decoding (``ultralytics.utils.ops.process_mask``),
per image, on the canvas. Needs Ultralytics (imported when called).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from seg_datamodule.structures import DetectionBatch

__all__ = ["decode_detections"]


def decode_detections(outputs: Any, batch: DetectionBatch, *, conf: float, iou: float, num_classes: int, max_det: int,
                      end2end: bool, time_limit: float | None) -> list[dict[str, Tensor]]:
    """Detections per image of a batch's eval-mode outputs.

    Args:
        outputs: the model's eval-mode outputs: ``((B, 4 + C + k, A) head, protos (B, k, Hp, Wp)), raw``
            (the protos a ``(protos, semantic logits)`` pair for a model with a semantic branch).
        batch: the batch they are of (its canvas and ``mask_stride``).
        conf, iou: NMS confidence and IoU thresholds.
        num_classes: C.
        max_det: detections kept per image.
        end2end: the model is end-to-end (YOLO26: no NMS).
        time_limit: NMS seconds per image before it gives up on the batch's later images; ``None``: none.

    Returns:
        One dict per image: ``boxes (Tensor[n, 4] float32)`` xyxy canvas pixels, ``scores (Tensor[n])``,
        ``labels (Tensor[n] int64)`` and ``masks (Tensor[n, Hm, Wm] bool)``, cropped to the box,
        on the batch's ``mask_stride`` grid when it is the prototype grid, else on the canvas.
    """
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import process_mask

    head, proto = outputs[0]
    if isinstance(proto, tuple):  # (protos, semantic logits) of a model with a semantic branch
        proto = proto[0]
    detections = non_max_suppression(
        head.float(), conf, iou, nc=num_classes, multi_label=True, max_det=max_det, end2end=end2end,
        max_time_img=math.inf if time_limit is None else time_limit,
    )
    canvas = tuple(batch.images.shape[-2:])
    # 4 for YOLOv8/YOLO11 (the ProtoNet upsamples P3 by 2); masks go to the canvas otherwise.
    on_canvas = canvas[0] != batch.mask_stride * proto.shape[-2]
    preds = []
    for b, det in enumerate(detections):
        boxes = det[:, :4]
        masks = process_mask(proto[b].float(), det[:, 6:], boxes, shape=canvas, upsample=on_canvas)
        preds.append({"boxes": boxes, "scores": det[:, 4], "labels": det[:, 5].long(), "masks": masks.bool()})
    return preds
