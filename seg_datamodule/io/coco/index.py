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

The options ``drop_crowd``, ``drop_empty`` and ``verify_images`` are applied after loading, so
they share one cache; ``on_bad_sample`` too (the cache records what was skipped, and
``"raise"`` raises the first recorded problem).

What can be wrong in the JSON, and what then happens: :mod:`seg_datamodule.io.coco.errors`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.coco.cache import cached_tables, default_cache_dir
from seg_datamodule.io.coco.errors import BadAnnotationError, error_from_first, format_skip_summary
from seg_datamodule.io.coco.parse import build_tables
from seg_datamodule.io.coco.reading import count_image_errors, find_bad_images, load_checked_image
from seg_datamodule.io.coco.tables import TABLE_KEYS, crowd_rles, image_polygons, select_images, without_crowd
from seg_datamodule.io.images import BadImageError
from seg_datamodule.ops.checks import check_choice
from seg_datamodule.ops.rle import mask_to_rings, rle_counts_from_string  # their home is ops.rle
from seg_datamodule.structures import Polygons

# mask_to_rings and rle_counts_from_string stay importable from here, where they used to live.
__all__ = [
    "BadAnnotationError", "BadImageError", "CocoIndex", "default_cache_dir", "format_skip_summary",
    "mask_to_rings", "rle_counts_from_string",
]

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
        dropped_counts (dict[str, int]): what the options left out, not counted as skips:
            ``"crowd_dropped"`` (crowd annotations, by ``drop_crowd`` or with an image dropped
            by ``drop_empty``) and ``"image_empty_dropped"`` (images, by ``drop_empty``). Merged
            with :attr:`skip_counts` it accounts for every JSON entry not delivered.
    """

    def __init__(
        self,
        tables: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        *,
        ann_file: str | os.PathLike[str],
        image_root: str | os.PathLike[str],
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
        self.dropped_counts = {"crowd_dropped": 0, "image_empty_dropped": 0}
        self.from_cache = False
        self.cache_path: Path | None = None
        self.on_bad_sample = "raise"

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        ann_file: str | os.PathLike[str],
        image_root: str | os.PathLike[str],
        *,
        on_bad_sample: Literal["raise", "skip"] = "raise",
        drop_crowd: bool = False,
        drop_empty: bool = False,
        verify_images: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
    ) -> "CocoIndex":
        """Build the index of a COCO annotation file, or load it from the cache.

        Reads only the annotation file (and the cache), never the images, unless
        ``verify_images`` is set.

        Args:
            ann_file: COCO instances JSON.
            image_root: folder holding the images named by ``file_name``.
            on_bad_sample: ``"raise"`` fails on the first problem with a message naming the file
                and ids; ``"skip"`` leaves bad entries out, counts them by reason
                (:attr:`skip_counts`) and logs a summary once.
            drop_crowd: leave crowd (``iscrowd=1``) regions out; :meth:`crowd_mask` then
                returns None.
            drop_empty: leave out images without a target instance (kept as negatives by
                default). Applied after ``drop_crowd``; crowd-only images count as empty.
            verify_images: decode every image now (threads) and check its size against the
                JSON; bad images raise, or in skip mode are left out and counted.
            cache_dir: folder of the cache (see the module docstring); None: :func:`default_cache_dir`.
            use_cache: read and write the cache at all.

        Returns:
            the index.

        Raises:
            TypeError, ValueError: ``on_bad_sample`` is not a str, or neither ``"raise"`` nor ``"skip"``.
            TypeError: a flag is not a bool.
            FileNotFoundError: ``ann_file`` does not exist.
            BadAnnotationError: a problem in the JSON (always for structural problems; in
                ``"raise"`` mode for every problem).
            BadImageError: ``verify_images`` in ``"raise"`` mode found a bad image.
        """
        check_choice("on_bad_sample", on_bad_sample, ("raise", "skip"))
        for name, value in (("drop_crowd", drop_crowd), ("drop_empty", drop_empty),
                            ("verify_images", verify_images), ("use_cache", use_cache)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        ann_path = Path(ann_file).absolute()
        if not ann_path.is_file():
            raise FileNotFoundError(f"annotation file {ann_path} does not exist")

        # 1. Cached arrays, or a build from the JSON (then cached).
        def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
            return build_tables(ann_path, on_bad_sample)

        if use_cache:
            folder = None if cache_dir is None else Path(cache_dir)
            (tables, meta), from_cache, cache_path = cached_tables(ann_path, folder, build)
        else:
            (tables, meta), from_cache, cache_path = build(), False, None
        index = cls(tables, meta, ann_file=ann_path, image_root=image_root)
        index.from_cache, index.cache_path, index.on_bad_sample = from_cache, cache_path, on_bad_sample

        # 2. A cache built in skip mode records its problems; raise mode raises the first.
        if on_bad_sample == "raise" and index._first_problem is not None:
            raise error_from_first(index._first_problem, ann_path)

        # 3. Options applied on the loaded arrays, so one cache serves them all.
        if verify_images:
            index = index._verified(on_bad_sample)
        if drop_crowd:
            index = index._without_crowd()
        if drop_empty:
            index = index._select(index.instance_counts > 0, count_empty=True)
        if index._skip_counts:
            example = next(iter(index._skip_examples.values()), [""])[0]
            _log.warning("%s: %s; e.g. %s", ann_path, format_skip_summary(index._skip_counts), example)
        return index

    def _replace(self, tables: Mapping[str, np.ndarray]) -> "CocoIndex":
        new = CocoIndex.__new__(CocoIndex)
        new.__dict__.update(self.__dict__)
        new._t = dict(tables)
        new._skip_counts = dict(self._skip_counts)
        new._skip_examples = {k: list(v) for k, v in self._skip_examples.items()}
        new.dropped_counts = dict(self.dropped_counts)
        return new

    def _select(self, keep: np.ndarray, *, count_empty: bool = False) -> "CocoIndex":
        """The index restricted to the images where ``keep`` (bool[I]) is True."""
        keep = np.asarray(keep, bool)
        out = self._replace(select_images(self._t, keep))
        if count_empty:
            out.dropped_counts["image_empty_dropped"] += int((~keep).sum())
            out.dropped_counts["crowd_dropped"] += int(self.crowd_counts[~keep].sum())
        return out

    def _without_crowd(self) -> "CocoIndex":
        out = self._replace(without_crowd(self._t))
        out.dropped_counts["crowd_dropped"] += self.num_crowd
        return out

    def _verified(self, on_bad_sample: str) -> "CocoIndex":
        """Decode every image; raise on the first bad one, or leave the bad ones out."""

        errors = find_bad_images(self.load_image, self.num_images)
        bad = [e for e in errors if e is not None]
        if not bad:
            return self
        if on_bad_sample == "raise":
            raise bad[0]
        keep = np.array([e is None for e in errors], bool)
        out = self._select(keep)
        lost = int(self.instance_counts[~keep].sum() + self.crowd_counts[~keep].sum())
        out._skip_counts, out._skip_examples = count_image_errors(out._skip_counts, out._skip_examples, bad, lost)
        return out

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
        return (
            f"{self.ann_file.name}: {self.num_images} images, {self.num_instances} instances, "
            f"{self.num_crowd} crowd regions, {self.num_classes} classes; {self.skip_summary()}"
            + (f"; dropped {dropped}" if dropped else "")
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return int(sum(a.nbytes for a in self._t.values()))

    def __repr__(self) -> str:
        return f"CocoIndex({self.summary()}, {self.nbytes / 2**20:.1f} MiB)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CocoIndex):
            return NotImplemented
        return (
            self.ann_file == other.ann_file
            and self.image_root == other.image_root
            and self._class_names == other._class_names
            and self._skip_counts == other._skip_counts
            and self.dropped_counts == other.dropped_counts
            and all(
                self._t[k].dtype == other._t[k].dtype and np.array_equal(self._t[k], other._t[k])
                for k in TABLE_KEYS
            )
        )

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
        i = self._check_index(i)
        off = self._t["file_name_offsets"]
        return self._t["file_name_bytes"][off[i] : off[i + 1]].tobytes().decode("utf-8")

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
        ids = self._t["image_ids"]
        hits = np.flatnonzero(ids == image_id)
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
        return self._per_instance("labels", i)

    def annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[N] int64) COCO annotation ids of image ``i``'s target instances (a copy)."""
        return self._per_instance("annotation_ids", i)

    def _per_instance(self, key: str, i: int) -> np.ndarray:
        i = self._check_index(i)
        off = self._t["instance_offsets"]
        return self._t[key][off[i] : off[i + 1]].copy()

    def bboxes(self, i: int) -> np.ndarray:
        """(ndarray[N, 4] float64) the JSON's ``[x, y, w, h]`` boxes of image ``i``'s target instances."""
        return self._per_instance("bboxes", i)

    def neg_labels(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) sorted labels of image ``i``'s ``neg_category_ids`` (LVIS: verified absent)."""
        return self._per_image_labels("neg", i)

    def not_exhaustive_labels(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) sorted labels of image ``i``'s ``not_exhaustive_category_ids`` (LVIS)."""
        return self._per_image_labels("not_exhaustive", i)

    def _per_image_labels(self, key: str, i: int) -> np.ndarray:
        i = self._check_index(i)
        off = self._t[f"{key}_label_offsets"]
        return self._t[f"{key}_labels"][off[i] : off[i + 1]].copy()

    def category_presence(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (image, label) pair with at least one annotation, crowd regions included.

        What repeat-factor sampling counts category frequencies from (Detectron2 counts an
        image's ``annotations``, crowd ones included).

        Returns:
            image indices (ndarray[P] int64) and labels (ndarray[P] int64), sorted by image then
            label, each pair once.
        """
        images = np.arange(len(self), dtype=np.int64)
        owner = np.concatenate([np.repeat(images, self.instance_counts), np.repeat(images, self.crowd_counts)])
        labels = np.concatenate([self._t["labels"], self._t["crowd_labels"]]).astype(np.int64)
        pairs = np.unique(owner * max(self.num_classes, 1) + labels)
        return pairs // max(self.num_classes, 1), pairs % max(self.num_classes, 1)

    def crowd_annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) annotation ids of image ``i``'s crowd regions."""
        i = self._check_index(i)
        off = self._t["crowd_offsets"]
        return self._t["crowd_annotation_ids"][off[i] : off[i + 1]].copy()

    def crowd_mask(self, i: int) -> np.ndarray | None:
        """Union of image ``i``'s crowd regions, decoded from RLE with pycocotools.

        Returns:
            ndarray[H, W] bool at the JSON's size, or None when the image has no crowd region
            (or they were dropped).
        """
        rles = crowd_rles(self._t, self._check_index(i))
        if not rles:
            return None
        merged = rles[0] if len(rles) == 1 else mask_utils.merge(rles, intersect=0)
        return np.ascontiguousarray(mask_utils.decode(merged), dtype=bool)

    def load_image(self, i: int, reduce: int = 1, *, check_size: bool = True) -> np.ndarray:
        """Decode image ``i`` to RGB ``uint8`` (see :func:`~seg_datamodule.io.images.decode_image`).

        Args:
            i: image index.
            reduce: one of ``(1, 2, 4, 8)``; the result is ``(ceil(H / reduce), ceil(W / reduce))``
                for the JSON's ``(H, W)``, decoded at reduced scale by libjpeg for JPEGs.
            check_size: raise when the file's stored size is not the JSON's (checked exactly at
                any ``reduce``: the stored size is read from the file header).

        Returns:
            ndarray[h, w, 3] uint8 RGB.

        Raises:
            BadImageError: missing, unreadable, truncated, corrupt or wrongly sized file; the
                message names the file, the image id and the annotation file, and the error
                carries ``reason``, ``image_id`` and ``image_index``.
        """
        i = self._check_index(i)
        return load_checked_image(
            self.image_root, self.file_name(i), self.image_size(i), reduce=reduce, check_size=check_size,
            where=f"{self.ann_file}: image id {int(self._t['image_ids'][i])}",
            ids={"image_id": int(self._t["image_ids"][i]), "image_index": i},
        )


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view

