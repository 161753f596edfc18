"""Predict samples: each image of a :class:`~seg_datamodule.io.predict_source.PredictImages` letterboxed.

The canvas is made exactly as validation makes it (the same
:class:`~seg_datamodule.transforms.layouts.mosaic.Letterbox` plan, JPEG reduction and single resample
in :func:`~seg_datamodule.transforms.kernels.warp.warp_tiles`), so a model sees the same pixels in
``predict`` as in ``validate`` and its predictions map back with the batch's ``scales``,
``pads`` and ``orig_sizes``. No annotations are read: a predict batch has no targets.

Sizes: from the JSON when there is one (then checked against the file's header before
decoding), else from the JPEG / PNG header, else from a full decode (other formats). A folder's
images are turned by their EXIF orientation (``PredictImages.oriented``), and ``orig_size`` is
then the turned size, which the results' image file writes.

Bad images: with ``on_bad_sample="raise"`` the :class:`~seg_datamodule.io.images.decode.BadImageError`
(naming the file and its reason) ends the run; with ``"skip"`` the image leaves its batch and is
counted in the batch's ``counts`` (``predicted`` images, and one key per
:data:`~seg_datamodule.io.images.decode.IMAGE_ERROR_REASONS` reason), which
:class:`~seg_datamodule.evaluation.writer.COCOResultsWriter` sums into the results' summary.
A batch whose every image was bad has zero images (:func:`empty_batch`).
"""

from __future__ import annotations

import collections
from typing import Literal, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.io.images.decode import IMAGE_ERROR_REASONS, BadImageError, header_size, read_image_file
from seg_datamodule.io.images.exif import decode_oriented, exif_orientation, oriented_size
from seg_datamodule.io.predict_source import PredictImages
from seg_datamodule.ops.checks import check_choice
from seg_datamodule.ops.raster import grid_size
from seg_datamodule.structures import DetectionBatch, Polygons, Sample
from seg_datamodule.transforms.layouts.mosaic import Letterbox
from seg_datamodule.transforms.kernels.plan import choose_reduce
from seg_datamodule.transforms.kernels.warp import warp_tiles

__all__ = ["PREDICT_COUNT_KEYS", "PredictCollate", "PredictDataset", "SkippedImage", "empty_batch"]

#: Keys of a predict batch's ``counts``: images predicted, and bad images by reason.
PREDICT_COUNT_KEYS: tuple[str, ...] = ("predicted", *IMAGE_ERROR_REASONS)


class SkippedImage(NamedTuple):
    """What :class:`PredictDataset` returns for a bad image under ``on_bad_sample="skip"``.

    Attributes:
        image_id (int): its image id.
        reason (str): the :class:`~seg_datamodule.io.images.decode.BadImageError` reason.
        message (str): the error, naming the file.
    """

    image_id: int
    reason: str
    message: str


class PredictDataset(Dataset):
    """Letterboxed images without targets, for ``predict``.

    Args:
        images (PredictImages): what to read.
        image_size (int): canvas side ``s`` (square ``s x s``), as in training.
        on_bad_sample (str): ``"raise"`` or ``"skip"`` (see the module docstring).

    Raises:
        TypeError, ValueError: a bad argument.
    """

    def __init__(self, images: PredictImages, *, image_size: int = 640,
                 on_bad_sample: Literal["raise", "skip"] = "raise") -> None:
        if not isinstance(images, PredictImages):
            raise TypeError(f"images must be a PredictImages, got {type(images).__name__}")
        self.images = images
        self.letterbox = Letterbox(image_size)
        self.image_size = self.letterbox.image_size
        self.on_bad_sample = check_choice("on_bad_sample", on_bad_sample, ("raise", "skip"))

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        return f"PredictDataset({len(self)} images of {self.images.source}, image_size={self.image_size})"

    def __getitem__(self, index: int) -> Sample | SkippedImage:
        """Image ``index`` letterboxed, or a :class:`SkippedImage` (``on_bad_sample="skip"``).

        Returns:
            Sample with no instances, ``scale``, ``pad`` and ``orig_size`` (the stored size, turned
            by the EXIF orientation for a folder's image) set.

        Raises:
            IndexError: ``index`` out of range.
            BadImageError: the image is bad and ``on_bad_sample="raise"``.
        """
        if not 0 <= int(index) < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        i = int(index)
        image_id = int(self.images.image_ids[i])
        try:
            return self._sample(i, image_id)
        except BadImageError as err:
            if self.on_bad_sample == "raise":
                raise
            reason = err.reason if err.reason in IMAGE_ERROR_REASONS else "image_corrupt"
            return SkippedImage(image_id, reason, f"image id {image_id}: {err}")

    def _sample(self, i: int, image_id: int) -> Sample:
        path = self.images.path(i)
        data = read_image_file(path)
        expected = self.images.size(i)
        # A folder's photos are predicted as a person sees them (EXIF orientation applied).
        orientation = exif_orientation(data) if self.images.oriented else 1
        stored = header_size(data)
        size = expected or (None if stored is None else oriented_size(stored, orientation))
        if size is None:  # neither JSON nor a JPEG / PNG header: decode in full to learn it
            image, size = decode_oriented(data, orientation, name=path)
            reduce = 1
        else:
            reduce = choose_reduce(self.letterbox.plan(size)[0].matrices[0])
            image, size = decode_oriented(data, orientation, reduce=reduce, name=path, expected_size=expected)
        plan, scale, pad = self.letterbox.plan(size)
        canvas = warp_tiles([image], plan, [reduce])
        return Sample(
            image=np.ascontiguousarray(canvas), image_id=image_id, polygons=Polygons.empty(),
            labels=np.zeros(0, np.int64), annotation_ids=np.zeros(0, np.int64), boxes=np.zeros((0, 4), np.float32),
            scale=float(scale), pad=(float(pad[0]), float(pad[1])), orig_size=(int(size[0]), int(size[1])),
        )


def empty_batch(image_size: int, mask_stride: int, counts: dict[str, int]) -> DetectionBatch:
    """A :class:`DetectionBatch` of zero images (every image of the batch was bad).

    Returns:
        images ``(0, 3, s, s)`` uint8, masks ``(0, Hp, Wp)``, every per-image field of length 0.
    """
    hp, wp = grid_size((image_size, image_size), mask_stride)
    none = torch.zeros(0, dtype=torch.int64)
    return DetectionBatch(
        images=torch.zeros((0, 3, image_size, image_size), dtype=torch.uint8), boxes=torch.zeros((0, 4)),
        labels=none, masks=torch.zeros((0, hp, wp), dtype=torch.bool), boxes_per_image=none.clone(),
        image_ids=none.clone(), annotation_ids=none.clone(), ignore_masks=torch.zeros((0, hp, wp), dtype=torch.bool),
        scales=torch.zeros(0), pads=torch.zeros((0, 2)), orig_sizes=torch.zeros((0, 2), dtype=torch.int64),
        mask_stride=mask_stride, counts=counts,
    )


class PredictCollate:
    """Collate predict samples, leaving skipped images out and counting them (picklable).

    Args:
        image_size (int): the canvas side (for a batch whose every image was bad).
        mask_stride (int): stride of the (empty) mask grid.
        **kwargs: :class:`~seg_datamodule.data.batching.collate.DetectionCollate` options.
    """

    def __init__(self, image_size: int, mask_stride: int = 4, **kwargs: object) -> None:
        self.collate = DetectionCollate(mask_stride=mask_stride, **kwargs)  # type: ignore[arg-type]
        self.image_size, self.mask_stride = int(image_size), int(mask_stride)

    def __call__(self, items: Sequence[Sample | SkippedImage]) -> DetectionBatch:
        """Returns: the batch of the good images; ``counts`` as in :data:`PREDICT_COUNT_KEYS`."""
        samples = [item for item in items if isinstance(item, Sample)]
        tally = collections.Counter({key: 0 for key in PREDICT_COUNT_KEYS})
        tally["predicted"] = len(samples)
        for item in items:
            if isinstance(item, SkippedImage):
                tally[item.reason] += 1
        counts = dict(tally)
        if not samples:
            return empty_batch(self.image_size, self.mask_stride, counts)
        batch = self.collate(samples)
        batch.counts = counts
        return batch
