"""One streamed record per image: its schema with forced dtypes, and an index over a batch of them.

A record is a flat dict of bytes, ints and 1-D numpy arrays, what ``litdata.optimize`` stores; its
fields, their order and dtypes are :data:`~seg_datamodule.io.stream.schema.RECORD_SCHEMA`. LitData
fixes a 1-D array's dtype from the first record it writes (a later record with another dtype reads
back as garbage), so :func:`record_from_index` casts every array to
:data:`RECORD_DTYPES` and :func:`check_record` refuses a record that does not match them.

:class:`RecordWindow` is an :class:`~seg_datamodule.data.samples.decoding.ImageIndex` over the records of
the batch being built: it knows every image's id and size (from the metadata beside the chunks)
and the annotations, LVIS lists and pixels of the bound records only, so
:class:`~seg_datamodule.data.samples.dataset.SegDataset` builds a streamed batch with exactly the code,
randomness and rasteriser of the map-style path. Nothing here imports LitData.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.images.decode import BadImageError, reduced_size
from seg_datamodule.io.images.exif import decode_oriented, encoded_jpeg
from seg_datamodule.io.stream.schema import RECORD_DTYPES, RECORD_INTS, RECORD_SCHEMA
from seg_datamodule.ops.checks import check_choice
from seg_datamodule.ops.rle import RLE_SAFE_PIXELS, rle_string, uncompressed_rle
from seg_datamodule.structures import EncodedImage, Polygons

__all__ = ["RECORD_DTYPES", "RECORD_INTS", "RecordWindow", "check_record", "crowd_rle", "record_from_index",
           "record_polygons"]


def crowd_rle(mask: np.ndarray | None) -> np.ndarray:
    """The compressed COCO RLE ``counts`` of a crowd mask, as uint8 bytes (empty for None).

    Args:
        mask (ndarray[H, W] bool | None): the union of an image's crowd regions.

    Returns:
        ndarray[K] uint8; pycocotools decodes it back to ``mask`` exactly.
    """
    if mask is None:
        return np.zeros(0, np.uint8)
    if mask.size >= RLE_SAFE_PIXELS:  # pycocotools' encoder can overflow there (seg_datamodule.ops.rle)
        return np.frombuffer(rle_string(uncompressed_rle(mask)["counts"]), np.uint8).copy()
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return np.frombuffer(rle["counts"], np.uint8).copy()


def record_from_index(index: Any, i: int, image: bytes) -> dict[str, Any]:
    """Image ``i`` of a ``CocoIndex`` as a record (every array cast to :data:`RECORD_DTYPES`).

    Args:
        index (CocoIndex): the source index.
        i (int): image position in ``index``.
        image (bytes): the image file's bytes, as stored (not re-encoded).

    Returns:
        dict with ``image`` (bytes), the :data:`RECORD_INTS` and the :data:`RECORD_DTYPES` arrays.
    """
    polygons = index.polygons(i)
    values: dict[str, Any] = {
        "index": i, "image_id": index.image_ids[i], "height": index.heights[i], "width": index.widths[i],
        "image": image, "vertices": np.asarray(polygons.vertices).reshape(-1), "ring_offsets": polygons.ring_offsets,
        "instance_offsets": polygons.instance_offsets, "labels": index.labels(i),
        "annotation_ids": index.annotation_ids(i), "bboxes": index.bboxes(i), "crowd_annotation_ids": index.crowd_annotation_ids(i),
        "crowd_rle": crowd_rle(index.crowd_mask(i)),
        "neg_labels": index.neg_labels(i), "not_exhaustive_labels": index.not_exhaustive_labels(i),
    }
    # Built in the schema's order: LitData writes the fields in dict order, and the reader's check
    # (schema.check_index) accepts exactly that order.
    record: dict[str, Any] = {}
    for key, kind in RECORD_SCHEMA:
        if not isinstance(kind, str):  # (a dtype compares equal to its name: int64 == "int")
            record[key] = np.ascontiguousarray(values[key], dtype=kind).reshape(-1)
        elif kind == "int":
            record[key] = int(values[key])
        else:
            record[key] = bytes(values[key])
    return record


def check_record(record: Mapping[str, Any], where: str = "record") -> None:
    """Refuse a record whose fields, dtypes or offsets do not fit together.

    Raises:
        ValueError: naming ``where``, the image id and the field: a missing field, an array of
            another dtype than :data:`RECORD_DTYPES` (what a dtype fixed by another first record
            reads back as), or offsets that do not match the array lengths.
    """
    missing = [k for k in ("image", *RECORD_INTS, *RECORD_DTYPES) if k not in record]
    if missing:
        raise ValueError(f"{where}: record lacks {missing}")
    where = f"{where}: image id {record['image_id']}"
    for key, dtype in RECORD_DTYPES.items():
        value = record[key]
        if not isinstance(value, np.ndarray) or value.dtype != dtype or value.ndim != 1:
            got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
            raise ValueError(f"{where}: field {key!r} must be a 1-D {dtype} array, got {got}")
    rings, instances = record["ring_offsets"], record["instance_offsets"]
    n = len(record["labels"])
    problems = []
    if len(record["vertices"]) % 2 or rings.size < 1 or instances.size != n + 1:
        problems.append("lengths")
    elif rings[0] != 0 or instances[0] != 0 or np.any(np.diff(rings) < 0) or np.any(np.diff(instances) < 0):
        problems.append("offsets not increasing from 0")
    elif 2 * int(rings[-1]) != len(record["vertices"]) or int(instances[-1]) != rings.size - 1:
        problems.append("offsets do not end at the array lengths")
    if len(record["annotation_ids"]) != n:
        problems.append("annotation_ids and labels differ in length")
    if len(record["bboxes"]) != 4 * n:
        problems.append("bboxes are not 4 numbers per label")
    if problems:
        raise ValueError(
            f"{where}: inconsistent polygon arrays ({'; '.join(problems)}): {len(record['vertices'])} "
            f"coordinates, {rings.size} ring offsets, {instances.size} instance offsets, {n} labels"
        )


def record_polygons(record: Mapping[str, Any]) -> Polygons:
    """The record's instances as :class:`Polygons` (new arrays, safe to modify)."""
    if len(record["labels"]) == 0:
        return Polygons.empty()
    return Polygons(record["vertices"].reshape(-1, 2).copy(), record["ring_offsets"].copy(),
                    record["instance_offsets"].copy())


class RecordWindow:
    """An ``ImageIndex`` over all images' ids and sizes, with the annotations of bound records only.

    Positions are the source ``CocoIndex``'s (a record's ``index``), so a sample seeds and plans
    exactly as the map-style dataset does. Only the records of the batch being built are bound
    (:meth:`bind`): streaming cannot read other images without stalling the stream.

    Args:
        image_ids, heights, widths (ndarray[N] int64): every image of the converted dataset, by
            position.
        name (str): the stream, for messages.
        on_bad_sample (str): ``"raise"`` or ``"skip"``: what a dataset over the window does with
            an image that fails to decode.
        orientations (ndarray[N] | None): the EXIF orientation each image is decoded with, as the
            source index did (an Ultralytics dataset's); None: none turned.
    """

    def __init__(self, image_ids: np.ndarray, heights: np.ndarray, widths: np.ndarray, name: str = "stream",
                 on_bad_sample: str = "raise", orientations: np.ndarray | None = None) -> None:
        self.image_ids = np.asarray(image_ids, np.int64)
        self.heights = np.asarray(heights, np.int64)
        self.widths = np.asarray(widths, np.int64)
        if not self.image_ids.shape == self.heights.shape == self.widths.shape or self.image_ids.ndim != 1:
            raise ValueError("image_ids, heights and widths must be 1-D arrays of one length, got shapes "
                             f"{self.image_ids.shape}, {self.heights.shape}, {self.widths.shape}")
        self.name = name
        self.on_bad_sample = check_choice("on_bad_sample", on_bad_sample, ("raise", "skip"))
        self.orientations = np.ones(len(self.image_ids), np.uint8) if orientations is None else np.asarray(
            orientations, np.uint8)
        self._records: dict[int, Mapping[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.image_ids)

    def bind(self, records: Sequence[Mapping[str, Any]]) -> list[int]:
        """Make ``records`` the readable ones (replacing the previous batch's); returns their positions.

        Raises:
            ValueError: a record fails :func:`check_record`, or its id or size differs from the
                metadata's at its position (chunks and metadata from different conversions).
        """
        bound: dict[int, Mapping[str, Any]] = {}
        for record in records:
            check_record(record, self.name)
            i = int(record["index"])
            if not 0 <= i < len(self) or (int(record["image_id"]), int(record["height"]), int(record["width"])) != (
                int(self.image_ids[i]), int(self.heights[i]), int(self.widths[i])
            ):
                raise ValueError(
                    f"{self.name}: record of image id {record['image_id']} at position {i} does not match "
                    "the metadata beside the chunks (were they written by different conversions?)"
                )
            bound[i] = record
        self._records = bound
        return list(bound)

    def _record(self, i: int) -> Mapping[str, Any]:
        try:
            return self._records[int(i)]
        except KeyError:
            raise RuntimeError(
                f"{self.name}: image at position {i} is not in the batch being built; a streamed batch "
                "reads only its own images (convert with verify_images=True to leave bad images out)"
            ) from None

    def polygons(self, i: int) -> Polygons:
        return record_polygons(self._record(i))

    def labels(self, i: int) -> np.ndarray:
        return self._record(i)["labels"].copy()

    def annotation_ids(self, i: int) -> np.ndarray:
        return self._record(i)["annotation_ids"].copy()

    def bboxes(self, i: int) -> np.ndarray:
        """(ndarray[N, 4] float64) the instances' ``[x, y, w, h]`` boxes."""
        return self._record(i)["bboxes"].reshape(-1, 4).copy()

    def neg_labels(self, i: int) -> np.ndarray:
        """Sorted labels verified absent from the image (LVIS ``neg_category_ids``; empty for COCO)."""
        return self._record(i)["neg_labels"].copy()

    def not_exhaustive_labels(self, i: int) -> np.ndarray:
        """Sorted labels maybe not all annotated in the image (LVIS ``not_exhaustive_category_ids``)."""
        return self._record(i)["not_exhaustive_labels"].copy()

    def crowd_mask(self, i: int) -> np.ndarray | None:
        record = self._record(i)
        if record["crowd_rle"].size == 0:
            return None
        rle = {"size": [int(record["height"]), int(record["width"])], "counts": record["crowd_rle"].tobytes()}
        return np.ascontiguousarray(mask_utils.decode(rle), dtype=bool)

    def encoded_image(self, i: int) -> EncodedImage | None:
        """The record's JPEG bytes kept encoded for the device (``pixels_on_device``), checked as
        ``CocoIndex.encoded_image`` checks a file; None for another format or a bad header."""
        record = self._record(i)
        expected = (int(record["height"]), int(record["width"]))
        return encoded_jpeg(record["image"], expected, int(self.orientations[int(i)]))

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        """Decode the record's stored bytes exactly as ``CocoIndex.load_image`` decodes the file.

        Raises:
            BadImageError: the bytes do not decode, or their stored size is not the JSON's.
        """
        record = self._record(i)
        image_id = int(record["image_id"])
        where = f"{self.name}: image id {image_id}"
        try:
            image, stored = decode_oriented(record["image"], int(self.orientations[int(i)]), reduce=reduce,
                                            name=f"{where} bytes")
        except BadImageError as err:
            raise BadImageError(str(err), path=self.name, reason=err.reason, image_id=image_id,
                                image_index=int(i)) from None
        expected = (int(record["height"]), int(record["width"]))
        if stored != expected or image.shape[:2] != reduced_size(expected, reduce):
            raise BadImageError(
                f"{where}: image is {stored[0]}x{stored[1]} (HxW) but the annotation file says "
                f"{expected[0]}x{expected[1]}", path=self.name, reason="image_size_mismatch",
                image_id=image_id, image_index=int(i),
            )
        return image
