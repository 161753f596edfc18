"""seg-datamodule: feed instance-segmentation training with exact, worker-side mask targets.

Data path: load (``coco``) -> augment (``geometry``, ``mosaic``, ``dataset``) -> collate
(``raster``, ``collate``) -> ``COCOSegDataModule``; the ``StepTimeProfiler`` callback beside it.
"""

from seg_datamodule.sample import DetectionBatch, Sample, polygons_from_instances
from seg_datamodule.raster import rasterize_flat, rasterize_polygons
from seg_datamodule.collate import DetectionCollate, collate_detection

__all__ = [
    "DetectionBatch",
    "DetectionCollate",
    "Sample",
    "collate_detection",
    "polygons_from_instances",
    "rasterize_flat",
    "rasterize_polygons",
]

__version__ = "0.1.0"
