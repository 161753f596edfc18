"""Ultralytics YOLO-seg datasets (a ``data.yaml``, ``images/`` and ``labels/*.txt``) -> the same index a COCO file gives.

``data_yaml`` reads the YAML safely and resolves its splits as Ultralytics does, ``image_lists``
lists a split's images and finds their label files, ``headers`` reads each image's size and EXIF
orientation without decoding it, ``labels`` parses and checks the label lines, ``index`` builds the
cached :class:`~seg_datamodule.io.coco.CocoIndex` (:func:`build_yolo_index`), ``ground_truth``
writes a COCO ground truth of it for COCO AP (and of a COCO file read with ``crowd_as_instances``),
``labels_hint`` says where labels were looked for when none is found, ``errors`` says what can be wrong.
"""

from seg_datamodule.io.yolo.data_yaml import DatasetNotFoundError, DatasetYaml, DatasetYamlError, read_dataset_yaml
from seg_datamodule.io.yolo.errors import YOLO_SKIP_REASONS, BadLabelError
from seg_datamodule.io.yolo.ground_truth import crowd_as_instances_ground_truth, ground_truth, ground_truth_dict
from seg_datamodule.io.yolo.image_lists import IMG_FORMATS, label_path, list_split_images
from seg_datamodule.io.yolo.index import build_yolo_index

__all__ = [
    "BadLabelError", "DatasetNotFoundError", "DatasetYaml", "DatasetYamlError", "IMG_FORMATS", "YOLO_SKIP_REASONS",
    "build_yolo_index", "crowd_as_instances_ground_truth", "ground_truth", "ground_truth_dict", "label_path",
    "list_split_images", "read_dataset_yaml",
]
