"""What every stage of the data path speaks: polygons, instances, per-image samples, collated batches.

Imports only :mod:`seg_datamodule.ops` from the package.
"""

from seg_datamodule.structures.batch import DetectionBatch
from seg_datamodule.structures.instances import COLUMNS, Column, Instances
from seg_datamodule.structures.pending import EncodedImage, PendingPixels, PendingTiles
from seg_datamodule.structures.polygons import Polygons
from seg_datamodule.structures.sample import ORIGINS, Sample, SampleBatch

__all__ = ["COLUMNS", "ORIGINS", "Column", "DetectionBatch", "EncodedImage", "Instances", "PendingPixels",
           "PendingTiles", "Polygons", "Sample", "SampleBatch"]
