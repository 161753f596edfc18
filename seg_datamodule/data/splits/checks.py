"""The checks every split of the DataModule passes: given in pairs (or by a data.yaml), the same categories, images to use.

The splits themselves are built by :mod:`~seg_datamodule.data.splits.sources`: the ``test`` split
is a COCO JSON (instances, or an image-info file without ``annotations`` such as COCO test-dev)
plus its folder, indexed like validation (negatives kept) and letterboxed without augmentation by
:class:`~seg_datamodule.data.samples.dataset.SegDataset` (``train=False``); ``predict`` is a folder of
images (walked recursively), or a COCO JSON plus its folder, read by
:class:`~seg_datamodule.data.samples.predict.PredictDataset`.

Labels are positions in the sorted category ids of the DataModule's categories (the first split
named of train, val, test and predict's JSON, or a restored checkpoint's), so every JSON must have
those category ids (:func:`check_categories`).

Before any worker starts, :func:`check_split_images` stops a split with no image to use (none
indexed, or an image folder that holds none of a sample of the files its index names) and
describes one whose images are largely missing or bad (issue 35).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco import CocoIndex, format_skip_summary
from seg_datamodule.io.paths import check_input_path
from seg_datamodule.io.images.root import sample_image_root

__all__ = [
    "BAD_IMAGE_WARN_SHARE", "CategoryMismatchError", "EmptySplitError", "check_categories", "check_dataset_keys",
    "check_pair", "check_split_images",
]

#: A split whose sampled files are missing, or whose indexed images were left out as bad, beyond
#: this share warns at setup, whatever ``on_bad_sample`` says.
BAD_IMAGE_WARN_SHARE = 0.05


class CategoryMismatchError(UserInputError, ValueError):
    """Two sources of one DataModule (files, or a checkpoint) name different category ids."""


class EmptySplitError(UserInputError, ValueError):
    """A split that leaves no image to train on or score (nothing to do is not a result)."""


def check_pair(name: str, ann: str | None, images: str | None) -> None:
    """Raise ``ValueError`` unless ``{name}_ann`` and ``{name}_images`` are given together or not at all."""
    if (ann is None) != (images is None):
        raise ValueError(f"give both {name}_ann and {name}_images, or neither")


def check_dataset_keys(dataset: str | None, splits: tuple[str | None, ...], anns: tuple[str | None, ...],
                       train_stream: str | None) -> None:
    """Refuse a data.yaml given with COCO files, a split name that is not a str, a stream that trains twice.

    Args:
        dataset: the DataModule's ``dataset``; splits: its ``train_split``, ``val_split`` and
            ``test_split``; anns: its ``train_ann``, ``val_ann`` and ``test_ann``; train_stream: its own.

    Raises:
        TypeError, ValueError: naming the keys.
        InputPathError: ``dataset`` is not an existing file.
    """
    for name, split in zip(("train_split", "val_split", "test_split"), splits):
        if split is not None and (not isinstance(split, str) or not split):
            raise TypeError(f"{name} must be a split name of the data.yaml or None, got {split!r}")
    if dataset is None:
        return
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset must be the path of an Ultralytics data.yaml, got {dataset!r}")
    check_input_path("dataset", dataset, "file")
    given = [name for name, ann in zip(("train_ann", "val_ann", "test_ann"), anns) if ann is not None]
    if given:
        raise ValueError(f"give dataset (a data.yaml) or {' / '.join(given)}, not both: the data.yaml names every split")
    if train_stream is not None and splits[0] is not None:
        raise ValueError("train_stream trains instead of the data.yaml's train split: set train_split to null")


def check_categories(file: str, category_ids: np.ndarray, train_ids: Sequence[int], train_source: str) -> None:
    """Raise ``ValueError`` when ``file``'s sorted category ids are not the training data's.

    Args:
        file (str): the JSON checked, for the message.
        category_ids (ndarray[C] int64): its sorted category ids.
        train_ids (Sequence[int]): the training data's sorted category ids.
        train_source (str): where those came from, for the message.
    """
    if not np.array_equal(np.asarray(category_ids), np.asarray(train_ids)):
        raise CategoryMismatchError(
            f"{file}: category ids {np.asarray(category_ids).tolist()} differ from those of {train_source}: "
            f"{list(train_ids)}; labels would not match"
        )


def check_split_images(index: CocoIndex, key: str) -> str | None:
    """Stop a split with no image to use; describe one whose images are largely missing or bad.

    Looks at the index's own count of images left out as bad (``verify_images``) and at a sample
    of the files it names in its image root (:func:`~seg_datamodule.io.images.root.sample_image_root`);
    nothing is decoded. Run at setup, before any worker starts.

    Args:
        index (CocoIndex): the split's index.
        key (str): the argument naming its image folder (``"val_images"``), for messages.

    Returns:
        str | None: a warning with the counts when more than :data:`BAD_IMAGE_WARN_SHARE` of the
        sample is missing or of the images were left out as bad; else None.

    Raises:
        EmptySplitError: the index holds no image (the message says what was skipped).
        ImageRootError: the folder does not exist, is empty, or holds none of the sample.
    """
    bad = {k: v for k, v in index.skip_counts.items() if k.startswith("image_") and v}
    n = len(index)
    if n == 0:
        raise EmptySplitError(f"{index.ann_file}: no image left to use ({format_skip_summary(index.skip_counts)}); "
                              f"check the file and {key} {str(index.image_root)!r}")
    sample = sample_image_root(index.image_root, n, index.file_name, key, str(index.ann_file))
    left_out = sum(bad.values())
    if sample.missing_share <= BAD_IMAGE_WARN_SHARE and left_out <= BAD_IMAGE_WARN_SHARE * (n + left_out):
        return None
    parts = []
    if sample.missing:
        parts.append(f"{len(sample.missing)} of {sample.sampled} files sampled from the {n} images it names are "
                     f"missing (e.g. {sample.missing[0]!r}: about {sample.missing_share:.0%} of the split)")
    if left_out:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(bad.items()))
        parts.append(f"{left_out} images were left out as bad when indexing ({reasons})")
    return (f"{key} {str(index.image_root)!r} for {index.ann_file}: {'; '.join(parts)}. With on_bad_sample='skip' "
            "they are skipped and counted, with 'raise' the first one stops the run")
