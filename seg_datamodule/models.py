"""The demo model under its documented import path (``seg_datamodule.models.YolactLite``).

The code lives in :mod:`seg_datamodule.demo.model`; this module keeps the path that configs'
``class_path`` and user code name.
"""

from seg_datamodule.demo.losses import assemble_masks, box_predictions, crop_to_boxes, mask_iou, mask_loss
from seg_datamodule.demo.model import YolactLite, YolactOutput

__all__ = [
    "YolactLite",
    "YolactOutput",
    "assemble_masks",
    "box_predictions",
    "crop_to_boxes",
    "mask_iou",
    "mask_loss",
]
