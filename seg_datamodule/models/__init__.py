"""Demo models that train from a :class:`~seg_datamodule.sample.DetectionBatch`."""

from seg_datamodule.models.yolact import (
    YolactLite,
    YolactOutput,
    assemble_masks,
    crop_to_boxes,
    mask_iou,
    mask_loss,
)

__all__ = ["YolactLite", "YolactOutput", "assemble_masks", "crop_to_boxes", "mask_iou", "mask_loss"]
