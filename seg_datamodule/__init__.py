"""seg-datamodule: feed instance-segmentation training with exact, worker-side mask targets.

Data path: load (``coco``) -> augment (``geometry``, ``mosaic``, ``augment``, ``dataset``) ->
collate (``raster``, ``collate``) -> ``COCOSegDataModule``; the ``StepTimeProfiler`` callback
beside it.
"""

from seg_datamodule.sample import DetectionBatch, Sample, polygons_from_instances
from seg_datamodule.raster import rasterize_flat, rasterize_polygons
from seg_datamodule.collate import DetectionCollate, collate_detection
from seg_datamodule.coco import BadAnnotationError, CocoIndex
from seg_datamodule.images import BadImageError
from seg_datamodule.sampler import EpochShardSampler
from seg_datamodule.dataset import SegDataset
from seg_datamodule.datamodule import COCOSegDataModule
from seg_datamodule.profiler import StepTimeAccumulator, StepTimeProfiler
from seg_datamodule.profiler_plot import plot_step_split

__all__ = [
    "BadAnnotationError",
    "BadImageError",
    "COCOSegDataModule",
    "CocoIndex",
    "DetectionBatch",
    "DetectionCollate",
    "EpochShardSampler",
    "Sample",
    "SegDataset",
    "StepTimeAccumulator",
    "StepTimeProfiler",
    "collate_detection",
    "plot_step_split",
    "polygons_from_instances",
    "rasterize_flat",
    "rasterize_polygons",
]

__version__ = "0.1.0"
