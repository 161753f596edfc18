"""seg-datamodule: feed instance-segmentation training with exact, worker-side mask targets.

Data path, one folder a stage: ``io`` (load) -> ``transforms`` (augment) -> ``data`` (dataset,
collate, ``COCOSegDataModule``), all speaking ``structures`` and built on the pure kernels in
``ops``; ``profiling`` (the ``StepTimeProfiler`` callback) beside it, importing nothing from it;
``pictures`` (``FitPictures``: the data drawn into the run folder at fit start).
"""

from seg_datamodule.structures import DetectionBatch, Polygons, Sample
from seg_datamodule.ops.raster import rasterize_flat, rasterize_polygons
from seg_datamodule.data.batching.collate import DetectionCollate, collate_detection
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.data.loaders.sampler import EpochShardSampler
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.demo.data import ensure_demo_dataset
from seg_datamodule.profiling import StepTimeAccumulator, StepTimeProfiler, plot_step_split
from seg_datamodule.evaluation import COCOMaskMAP, COCOResultsWriter
from seg_datamodule.checkpointing import InterruptCheckpoint
from seg_datamodule.pictures import FitPictures, attach_run_pictures

__all__ = [
    "BadAnnotationError",
    "BadImageError",
    "COCOMaskMAP",
    "COCOResultsWriter",
    "COCOSegDataModule",
    "CocoIndex",
    "DetectionBatch",
    "DetectionCollate",
    "EpochShardSampler",
    "FitPictures",
    "InterruptCheckpoint",
    "Polygons",
    "Sample",
    "SegDataset",
    "StepTimeAccumulator",
    "StepTimeProfiler",
    "collate_detection",
    "plot_step_split",
    "rasterize_flat",
    "rasterize_polygons",
]

# With no split named the DataModule trains on the embedded demo dataset, and with ``plots: true`` it
# adds the picture callbacks; both are wired here, above data/, which imports neither.
COCOSegDataModule.fallback_splits = ensure_demo_dataset
COCOSegDataModule.run_pictures = attach_run_pictures

__version__ = "0.1.0"
