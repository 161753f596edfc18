"""The DataModule's held-out sources: the ``test`` split and the ``predict`` images.

* test: a COCO JSON (instances, or an image-info file without ``annotations`` such as COCO
  test-dev) plus its folder, indexed like validation (negatives kept) and letterboxed without
  augmentation by :class:`~seg_datamodule.data.dataset.SegDataset` (``train=False``);
* predict: a folder of images (walked recursively), or a COCO JSON plus its folder, read by
  :class:`~seg_datamodule.data.predict.PredictDataset`.

Labels are positions in the sorted category ids of the training data, so a test or predict JSON
must have the training data's category ids (:func:`check_categories`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.predict_source import PredictImages, images_from_index, list_image_folder

__all__ = ["build_predict_images", "build_test_index", "check_categories", "check_pair"]


def check_pair(name: str, ann: str | None, images: str | None) -> None:
    """Raise ``ValueError`` unless ``{name}_ann`` and ``{name}_images`` are given together or not at all."""
    if (ann is None) != (images is None):
        raise ValueError(f"give both {name}_ann and {name}_images, or neither")


def check_categories(file: str, category_ids: np.ndarray, train_ids: Sequence[int], train_source: str) -> None:
    """Raise ``ValueError`` when ``file``'s sorted category ids are not the training data's.

    Args:
        file (str): the JSON checked, for the message.
        category_ids (ndarray[C] int64): its sorted category ids.
        train_ids (Sequence[int]): the training data's sorted category ids.
        train_source (str): where those came from, for the message.
    """
    if not np.array_equal(np.asarray(category_ids), np.asarray(train_ids)):
        raise ValueError(
            f"{file}: category ids {np.asarray(category_ids).tolist()} differ from those of {train_source}: "
            f"{list(train_ids)}; labels would not match"
        )


def build_test_index(
    ann: str, images: str, options: IndexOptions, train_ids: Sequence[int], train_source: str
) -> CocoIndex:
    """The test split's index: like validation, negatives kept (an image-info file has only those).

    Args:
        ann (str): the COCO JSON (``annotations`` optional).
        images (str): its image folder.
        options (IndexOptions): the DataModule's index options.
        train_ids (Sequence[int]): the training data's sorted category ids.
        train_source (str): the training data, for messages.

    Raises:
        BadAnnotationError: a bad entry with ``on_bad_sample="raise"``.
        ValueError: the file's category ids differ from the training data's.
    """
    index = CocoIndex.build(ann, images, options, drop_empty=False)
    check_categories(ann, index.category_ids, train_ids, train_source)
    return index


def build_predict_images(
    images: str, ann: str | None, options: IndexOptions, train_ids: Sequence[int], train_source: str
) -> PredictImages:
    """What ``predict`` reads: ``images`` walked recursively, or the images ``ann`` lists in it.

    Args:
        images (str): a folder of image files, or the folder ``ann``'s ``file_name`` values are in.
        ann (str | None): a COCO image-info or instances JSON (its annotations are not read for
            predicting, but a bad entry is still raised or counted by ``on_bad_sample``).
        options (IndexOptions): the DataModule's index options.
        train_ids (Sequence[int]): the training data's sorted category ids.
        train_source (str): the training data, for messages.

    Raises:
        FileNotFoundError: ``images`` is not a folder.
        ValueError: no image in the folder, or ``ann``'s category ids differ from the training data's.
    """
    if ann is None:
        return list_image_folder(images)
    index = build_test_index(ann, images, options, train_ids, train_source)
    return images_from_index(index, images, ann)
