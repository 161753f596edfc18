"""Real models on this project's batches: Ultralytics YOLO-seg and torchvision Mask R-CNN.

:mod:`~seg_datamodule.integrations.ultralytics` (``to_ultralytics_batch``, ``YOLOSegModule``;
needs the AGPL-3.0 extra ``seg-datamodule[ultralytics]`` for the module only) and
:mod:`~seg_datamodule.integrations.torchvision` (``to_torchvision``, ``MaskRCNNModule``), and
``UltralyticsEMA``, Ultralytics' EMA of the weights as a Lightning callback (no extra needed).
Importing this package never imports ``ultralytics``.
"""

from seg_datamodule.integrations._box_only import BoxOnlyUnsupportedError
from seg_datamodule.integrations._ema import UltralyticsEMA
from seg_datamodule.integrations._stages import NonFiniteLossError
from seg_datamodule.integrations.torchvision import MaskRCNNModule, full_resolution_masks, to_torchvision
from seg_datamodule.integrations.ultralytics import YOLOSegModule, semantic_masks, to_ultralytics_batch

__all__ = [
    "BoxOnlyUnsupportedError",
    "MaskRCNNModule",
    "NonFiniteLossError",
    "UltralyticsEMA",
    "YOLOSegModule",
    "full_resolution_masks",
    "semantic_masks",
    "to_torchvision",
    "to_ultralytics_batch",
]
