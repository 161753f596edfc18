"""COCO instance annotations as a compact, worker-safe index of flat numpy arrays.

:meth:`CocoIndex.build` reads a COCO-format annotation file once
(:mod:`~seg_datamodule.io.coco.parse`), checks every entry, and keeps only flat numpy arrays
(images, instances, polygon vertices with ring and instance offsets, crowd RLE bytes; see
:mod:`~seg_datamodule.io.coco.tables`), cached on disk (:mod:`~seg_datamodule.io.coco.cache`).
No per-annotation Python object survives, so DataLoader workers forked after setup read the
arrays without touching reference counts on millions of objects, and pages stay shared (pytorch
issue 13246; detectron2's ``DatasetFromList(serialize=True)`` solves the same problem). The
index pickles as a handful of buffers. ``pycocotools.mask`` does all RLE work, and the tests
hold the index against ``COCO`` as the reference.

The options are applied after loading, so they share one cache
(:mod:`~seg_datamodule.io.coco.building`).

What can be wrong in the JSON, and what then happens: :mod:`seg_datamodule.io.coco.errors`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from seg_datamodule.io.coco.building import IndexOptions, Loaded, apply_options, box_only_counts, load_tables
from seg_datamodule.io.coco.building import merge_options, refuse_box_only
from seg_datamodule.io.coco.cache import default_cache_dir
from seg_datamodule.io.coco.crowd import warn_crowd_trap
from seg_datamodule.io.coco.errors import format_skip_summary
from seg_datamodule.io.coco.image_checks import find_bad_images, load_checked_image, read_encoded_image
from seg_datamodule.io.coco.tables import TABLE_KEYS, category_presence, crowd_mask, image_polygons, tables_equal
from seg_datamodule.structures import EncodedImage, Polygons

__all__ = ["CocoIndex", "default_cache_dir"]

_log = logging.getLogger(__name__)


class CocoIndex:
    """Flat numpy arrays of one COCO split: images, target instances as polygons, crowd RLE.

    Build it with :meth:`build`. Per image ``i`` (``0 <= i < len(index)``) the target instances
    are contiguous, in file order; crowd regions are kept apart. Everything is a numpy array or
    a small container (class names, counts), so the index pickles cheaply and forked workers
    share its pages.

    Attributes:
        ann_file (Path): the annotation file.
        image_root (Path): folder the images' ``file_name`` are relative to.
        from_cache (bool): whether :meth:`build` loaded the arrays from the cache.
        cache_path (Path | None): the cache file used or written, None without a cache.
        on_bad_sample (str): what :meth:`build` was asked to do with bad entries, ``"raise"``
            or ``"skip"``; a dataset over the index does the same with images that fail to load.
        dropped_counts (dict[str, int]): what was left out that is not a skip:
            ``"crowd_dropped"`` (crowd annotations, by ``drop_crowd`` or with an image dropped
            by ``drop_empty``), ``"image_empty_dropped"`` (images, by ``drop_empty``) and
            ``"box_only"`` (annotations with a box and no mask). Merged with :attr:`skip_counts`
            it accounts for every JSON entry not delivered; and ``"crowd_as_instances"``: crowd
            regions delivered as targets (``crowd_as_instances``).
        source_counts (dict[str, int]): what the source says of images kept (Ultralytics'
            backgrounds, ``image_label_missing``: :mod:`seg_datamodule.io.yolo`); COCO: empty.
    """

    def __init__(
        self, tables: Mapping[str, np.ndarray], meta: Mapping[str, Any], *,
        ann_file: str | os.PathLike[str], image_root: str | os.PathLike[str],
    ) -> None:
        missing = [k for k in TABLE_KEYS if k not in tables]
        if missing:
            raise ValueError(f"tables lack {missing}")
        self._t = {k: np.asarray(tables[k]) for k in TABLE_KEYS}
        self.ann_file = Path(ann_file)
        self.image_root = Path(image_root)
        self._class_names = list(meta["class_names"])
        self._skip_counts = {str(k): int(v) for k, v in meta.get("skip_counts", {}).items() if v}
        self._skip_examples = {str(k): list(v) for k, v in meta.get("skip_examples", {}).items()}
        self._first_problem = meta.get("first_problem")
        self.dropped_counts = {"crowd_dropped": 0, "image_empty_dropped": 0, "box_only": 0}
        self.dropped_counts.update({str(k): int(v) for k, v in meta.get("dropped_counts", {}).items()})
        self.source_counts = {str(k): int(v) for k, v in meta.get("source_counts", {}).items()}
        self.from_cache = False
        self.cache_path: Path | None = None
        self.on_bad_sample = "raise"

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        ann_file: str | os.PathLike[str],
        image_root: str | os.PathLike[str],
        options: IndexOptions | None = None,
        **fields: Any,
    ) -> "CocoIndex":
        """The index of a COCO annotation file, from the cache or built (never the images, unless ``verify_images``).

        Args:
            ann_file: COCO instances JSON.
            image_root: folder holding the images named by ``file_name``.
            options (IndexOptions | None): the options below as one object; None: the defaults.
            **fields: any :class:`~seg_datamodule.io.coco.building.IndexOptions` field, given
                flat (``CocoIndex.build(ann, images, on_bad_sample="skip")``), over ``options``
                (``on_bad_sample``, ``drop_crowd``, ``drop_empty``, ``verify_images``, ``cache_dir``,
                ``use_cache``, ``crowd_as_instances``, ``box_only``: each explained there).

        Raises:
            TypeError, ValueError: ``on_bad_sample`` is neither ``"raise"`` nor ``"skip"``; a flag is not a bool.
            FileNotFoundError: ``ann_file`` does not exist.
            BadAnnotationError: a problem in the JSON (structural ones always; every one in ``"raise"`` mode).
            BadImageError: ``verify_images`` in ``"raise"`` mode found a bad image.
            BoxOnlyError: box-only annotations under ``box_only="raise"`` (the default).
        """
        options = merge_options(options, fields, "CocoIndex.build()")
        ann_path = Path(ann_file).absolute()
        # Cached arrays, or a build from the JSON (then cached); raise mode raises the first
        # problem a cache built in skip mode recorded.
        (tables, meta), from_cache, cache_path = load_tables(ann_path, options)
        return cls.from_tables(tables, meta, ann_path, image_root, options, (from_cache, cache_path))

    @classmethod
    def from_tables(cls, tables: Mapping[str, np.ndarray], meta: Mapping[str, Any], ann_file: str | os.PathLike[str],
                    image_root: str | os.PathLike[str], options: IndexOptions,
                    cached: tuple[bool, Path | None] = (False, None),
                    where: tuple[str, Callable[["CocoIndex", int, int, int], str]] | None = None) -> "CocoIndex":
        """The index of unfiltered tables a reader loaded or built, with ``options`` applied as :meth:`build` does.

        ``ann_file`` is what messages name; ``cached``: (:attr:`from_cache`, :attr:`cache_path`); ``where``:
        (the source, ``(index, i, boxes, instances) ->`` image ``i``'s name) for a ``BoxOnlyError``.

        Raises:
            BadImageError, BoxOnlyError: ``verify_images`` found a bad image; box-only annotations (``"raise"``).
        """
        index = cls(tables, meta, ann_file=ann_file, image_root=image_root)
        index.from_cache, index.cache_path, index.on_bad_sample = cached[0], cached[1], options.on_bad_sample
        index.source_counts.update(box_only_counts(index._t))  # images with a box and no mask
        if options.box_only == "raise":
            source, namer = where or (str(index.ann_file), None)
            refuse_box_only(index._t, source, index.file_name, namer and (lambda *image: namer(index, *image)))
        # Options applied on the loaded arrays, so one cache serves them all.
        errors = find_bad_images(index.load_image, index.num_images) if options.verify_images else []
        loaded = Loaded(index._t, index._skip_counts, index._skip_examples, index.dropped_counts,
                        meta.get("skipped_image_ids", ()))
        index._t, index._skip_counts, index._skip_examples, index.dropped_counts, _ = apply_options(
            loaded, options, errors)
        if index._skip_counts:
            example = next(iter(index._skip_examples.values()), [""])[0]
            _log.warning("%s: %s; e.g. %s", index.ann_file, format_skip_summary(index._skip_counts), example)
        # A file of crowd regions only (CVAT's export) trains on nothing: say so, once.
        warn_crowd_trap(str(index.ann_file), index.num_instances,
                        index.num_crowd + index.dropped_counts.get("crowd_dropped", 0))
        return index

    # -- sizes and metadata ------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._t["image_ids"].shape[0])

    @property
    def num_images(self) -> int:
        """I, the number of images."""
        return len(self)

    @property
    def num_instances(self) -> int:
        """N, the number of target (non-crowd) instances over all images."""
        return int(self._t["labels"].shape[0])

    @property
    def num_crowd(self) -> int:
        """K, the number of crowd regions kept."""
        return int(self._t["crowd_labels"].shape[0])

    @property
    def num_classes(self) -> int:
        """C, the number of categories."""
        return int(self._t["category_ids"].shape[0])

    @property
    def image_ids(self) -> np.ndarray:
        """(ndarray[I] int64) COCO image ids, in file order (read-only view)."""
        return _readonly(self._t["image_ids"])

    @property
    def orientations(self) -> np.ndarray:
        """(ndarray[I] uint8) the EXIF orientation each image is turned by when decoded (1: none; COCO)."""
        return _readonly(self._t["orientations"])

    @property
    def heights(self) -> np.ndarray:
        """(ndarray[I] int64) image heights from the JSON."""
        return _readonly(self._t["heights"])

    @property
    def widths(self) -> np.ndarray:
        """(ndarray[I] int64) image widths from the JSON."""
        return _readonly(self._t["widths"])

    @property
    def instance_counts(self) -> np.ndarray:
        """(ndarray[I] int64) number of target instances per image."""
        return np.diff(self._t["instance_offsets"])

    @property
    def crowd_counts(self) -> np.ndarray:
        """(ndarray[I] int64) number of crowd regions per image."""
        return np.diff(self._t["crowd_offsets"])

    @property
    def category_ids(self) -> np.ndarray:
        """(ndarray[C] int64) COCO category ids, sorted; label ``k`` is ``category_ids[k]``."""
        return _readonly(self._t["category_ids"])

    @property
    def class_names(self) -> list[str]:
        """Category names by label."""
        return list(self._class_names)

    @property
    def label_of_category(self) -> dict[int, int]:
        """COCO category id -> contiguous label ``0..C-1``."""
        return {int(c): k for k, c in enumerate(self._t["category_ids"])}

    @property
    def skip_counts(self) -> dict[str, int]:
        """Reason -> count of what was skipped at build in skip mode; see :data:`~seg_datamodule.io.coco.errors.SKIP_REASONS`."""
        return dict(self._skip_counts)

    @property
    def skip_examples(self) -> dict[str, list[str]]:
        """Reason -> the first few messages, naming files and ids."""
        return {k: list(v) for k, v in self._skip_examples.items()}

    def skip_summary(self) -> str:
        """One line of what was skipped (:func:`format_skip_summary`)."""
        return format_skip_summary(self._skip_counts)

    def summary(self) -> str:
        """One line: images, instances, crowd regions, what was skipped and dropped."""
        dropped = ", ".join(f"{k} {v}" for k, v in self.dropped_counts.items() if v)
        return (f"{self.ann_file.name}: {self.num_images} images, {self.num_instances} instances, {self.num_crowd} crowd"
                f" regions, {self.num_classes} classes; {self.skip_summary()}" + (f"; dropped {dropped}" if dropped else ""))

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return int(sum(a.nbytes for a in self._t.values()))

    def __repr__(self) -> str:
        return f"CocoIndex({self.summary()}, {self.nbytes / 2**20:.1f} MiB)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CocoIndex):
            return NotImplemented
        mine = (self.ann_file, self.image_root, self._class_names, self._skip_counts, self.dropped_counts)
        theirs = (other.ann_file, other.image_root, other._class_names, other._skip_counts, other.dropped_counts)
        return mine == theirs and tables_equal(self._t, other._t)

    __hash__ = None  # type: ignore[assignment]

    # -- per image ---------------------------------------------------------------------------

    def _check_index(self, i: int) -> int:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"image index must be an int, got {type(i).__name__}")
        if not 0 <= i < len(self):
            raise IndexError(f"image index {i} out of range for {len(self)} images")
        return int(i)

    def file_name(self, i: int) -> str:
        """The ``file_name`` of image ``i`` as in the JSON, or the path its ``coco_url`` ends in.

        LVIS v1 images have no ``file_name``: ``http://images.cocodataset.org/val2017/x.jpg``
        gives ``val2017/x.jpg`` (see :mod:`seg_datamodule.io.coco.lvis_fields`).
        """
        return self._segment("file_name_offsets", "file_name_bytes", i).tobytes().decode("utf-8")

    def file_path(self, i: int) -> Path:
        """``image_root / file_name`` of image ``i`` (for LVIS v1, the path taken from ``coco_url``)."""
        return self.image_root / self.file_name(i)

    def image_size(self, i: int) -> tuple[int, int]:
        """(H, W) of image ``i`` from the JSON."""
        i = self._check_index(i)
        return int(self._t["heights"][i]), int(self._t["widths"][i])

    def index_of_image_id(self, image_id: int) -> int:
        """Image index of a COCO image id.

        Raises:
            KeyError: no image has that id.
        """
        hits = np.flatnonzero(self._t["image_ids"] == image_id)
        if hits.size == 0:
            raise KeyError(f"no image with id {image_id} in {self.ann_file}")
        return int(hits[0])

    def polygons(self, i: int) -> Polygons:
        """The target (non-crowd) instances of image ``i``, in original image pixels.

        Returns:
            Polygons: N instances in the order of :meth:`labels` and :meth:`annotation_ids`;
            new arrays (safe to modify). No instance: ``Polygons.empty()``.
        """
        return image_polygons(self._t, self._check_index(i))

    def labels(self, i: int) -> np.ndarray:
        """(ndarray[N] int64) contiguous labels of image ``i``'s target instances (a copy)."""
        return self._segment("instance_offsets", "labels", i)

    def annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[N] int64) COCO annotation ids of image ``i``'s target instances (a copy)."""
        return self._segment("instance_offsets", "annotation_ids", i)

    def _segment(self, offsets_key: str, key: str, i: int) -> np.ndarray:
        """Image ``i``'s segment of the ragged table ``key`` (a copy)."""
        i = self._check_index(i)
        off = self._t[offsets_key]
        return self._t[key][off[i] : off[i + 1]].copy()

    def instance_columns(self) -> dict[str, np.ndarray]:
        """All target instances (read-only views): ``labels``, ``annotation_ids``, ``bboxes`` (xywh), ``areas``,
        ``instance_ring_offsets`` (no ring: box-only); image ``i``'s rows: ``instance_offsets[i : i + 2]``."""
        keys = ("labels", "annotation_ids", "bboxes", "areas", "instance_offsets", "instance_ring_offsets")
        return {k: _readonly(self._t[k]) for k in keys}

    def bboxes(self, i: int) -> np.ndarray:
        """(ndarray[N, 4] float64) the JSON's ``[x, y, w, h]`` boxes of image ``i``'s target instances."""
        return self._segment("instance_offsets", "bboxes", i)

    def neg_labels(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) sorted labels of image ``i``'s ``neg_category_ids`` (LVIS: verified absent)."""
        return self._segment("neg_label_offsets", "neg_labels", i)

    def not_exhaustive_labels(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) sorted labels of image ``i``'s ``not_exhaustive_category_ids`` (LVIS)."""
        return self._segment("not_exhaustive_label_offsets", "not_exhaustive_labels", i)

    def category_presence(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (image, label) pair with at least one annotation, crowd regions included.

        What repeat-factor sampling counts category frequencies from (Detectron2 counts an
        image's ``annotations``, crowd ones included).

        Returns:
            image indices (ndarray[P] int64) and labels (ndarray[P] int64), sorted by image then
            label, each pair once.
        """
        return category_presence(self._t)

    def crowd_annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) annotation ids of image ``i``'s crowd regions."""
        return self._segment("crowd_offsets", "crowd_annotation_ids", i)

    def crowd_mask(self, i: int) -> np.ndarray | None:
        """Union of image ``i``'s crowd regions, decoded from RLE with pycocotools.

        Returns:
            ndarray[H, W] bool at the JSON's size, or None when the image has no crowd region
            (or they were dropped).
        """
        return crowd_mask(self._t, self._check_index(i))

    def encoded_image(self, i: int) -> EncodedImage | None:
        """Image ``i``'s JPEG file for the device (``pixels_on_device``; see :func:`read_encoded_image`)."""
        i = self._check_index(i)
        return read_encoded_image(self.image_root, self.file_name(i), self.image_size(i), int(self._t["orientations"][i]))

    def load_image(self, i: int, reduce: int = 1, *, check_size: bool = True) -> np.ndarray:
        """Decode image ``i`` to RGB ``uint8`` (see :func:`~seg_datamodule.io.images.decode.decode_image`),
        turned by its :attr:`orientations` entry.

        Args:
            i: image index.
            reduce: one of ``(1, 2, 4, 8)``; the result is ``(ceil(H / reduce), ceil(W / reduce))``
                for the JSON's ``(H, W)``, decoded at reduced scale by libjpeg for JPEGs.
            check_size: raise when the file's stored size (from its header, at any ``reduce``) is not the JSON's.

        Returns:
            ndarray[h, w, 3] uint8 RGB.

        Raises:
            BadImageError: missing, unreadable, truncated, corrupt or wrongly sized file; the
                message names the file, the image id and the annotation file, and the error
                carries ``reason``, ``image_id`` and ``image_index``.
        """
        i = self._check_index(i)
        image_id = int(self._t["image_ids"][i])
        return load_checked_image(self.image_root, self.file_name(i), self.image_size(i), reduce=reduce,
                                  check_size=check_size, where=f"{self.ann_file}: image id {image_id}",
                                  ids={"image_id": image_id, "image_index": i}, orientation=int(self._t["orientations"][i]))


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view

