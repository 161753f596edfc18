"""The demo model under its documented import path (``seg_datamodule.models.YolactLite``).

The code lives in :mod:`seg_datamodule.demo.model`; this module keeps the path that configs'
``class_path`` and user code name.
"""

from seg_datamodule.demo.model import YolactLite, YolactOutput, assemble_masks, crop_to_boxes, mask_iou, mask_loss

__all__ = ["YolactLite", "YolactOutput", "assemble_masks", "crop_to_boxes", "mask_iou", "mask_loss"]
