"""The steps of :meth:`~seg_datamodule.io.coco.index.CocoIndex.build`: options checked, tables loaded, options applied.

The tables come from the cache or from the JSON (:func:`load_tables`). ``box_only``, ``crowd_as_instances``,
``drop_crowd``, ``drop_empty`` and ``verify_images`` are applied after loading (:func:`apply_options`),
so they share one cache; ``on_bad_sample`` too (the cache records what was skipped, and ``"raise"``
raises the first recorded problem). Each option is a pure step from one :class:`Loaded` to a new
one, counting what it leaves out.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence

import numpy as np

from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco.cache import cached_tables
from seg_datamodule.io.coco.crowd import crowd_to_instances
from seg_datamodule.io.coco.errors import error_from_first
from seg_datamodule.io.coco.parse import build_tables
from seg_datamodule.io.coco.image_checks import count_image_errors
from seg_datamodule.io.coco.tables import box_only_mask, select_images, without_box_only, without_crowd
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.ops.checks import check_bool, check_choice

__all__ = ["BOX_ONLY_CHOICES", "BoxOnlyError", "IndexOptions", "Loaded", "apply_options", "box_only_counts",
           "box_only_images", "load_tables", "merge_options", "refuse_box_only"]

#: What ``box_only`` can say, the default first.
BOX_ONLY_CHOICES = ("raise", "drop_images", "drop", "keep")
#: Images a :class:`BoxOnlyError` names.
_NAMED = 3


class BoxOnlyError(UserInputError, ValueError):
    """Annotations with a box and no mask, under ``box_only: raise`` (the default): trained as they
    are, their objects would be learned as background."""


@dataclass(frozen=True)
class IndexOptions:
    """How :meth:`~seg_datamodule.io.coco.index.CocoIndex.build` turns an annotation file into an
    index, checked once; one object from the DataModule's flat keys or the converter's flags.

    Attributes:
        on_bad_sample (str): ``"raise"`` on the first bad entry (naming the file and ids), or
            ``"skip"``: leave it out and count it; a dataset over the index does the same with
            images that fail to load (``CocoIndex.on_bad_sample``).
        drop_crowd (bool): leave crowd (``iscrowd=1``) regions out.
        drop_empty (bool): leave out images without a target instance.
        verify_images (bool): decode every image at build time and check its size.
        cache_dir (str | PathLike | None): folder of the index cache; None: the default one.
        use_cache (bool): read and write the cache at all.
        crowd_as_instances (bool): train on crowd (``iscrowd=1``) regions as target instances,
            converted to exact polygons (:func:`~seg_datamodule.io.coco.crowd.crowd_to_instances`;
            for exports that mark every mask a crowd, as CVAT's does), counted under
            ``"crowd_as_instances"`` in ``dropped_counts``.
        box_only (str): annotations with a box and no mask. ``"raise"`` (the default): a
            :class:`BoxOnlyError` naming the files, so no image trains its boxed objects as
            background by surprise (Ultralytics refuses such a segment dataset too).
            ``"drop_images"``: leave out every image with one, counted (``image_box_only_dropped``
            images; their boxes as ``box_only``, their other annotations as
            ``annotation_of_box_only_image``). ``"drop"``: drop the boxes alone, counted as
            ``"box_only"`` (the rest of their images trains, those objects as background: chosen
            on purpose). ``"keep"``: targets without a ring (``DetectionBatch.has_mask`` False: a
            box loss, no mask loss). Whatever the choice, ``source_counts["image_box_only"]``
            counts the images that had one.
        index_check (str): what a start checks before an Ultralytics split's cached index serves
            it (a COCO file's cache is keyed on the file alone either way). ``"files"`` (the
            default): the walk of the image folders and every label file's size, times and inode.
            ``"folders"``: only the times and inode of each folder the split reads, its ``.txt``
            lists and the data.yaml, the listing coming from the cache (no walk, no stat per file:
            a warm start of a COCO-sized split goes under a second). It sees every image or label
            file added, removed, renamed or replaced, but not a label file rewritten in place
            (an editor saving into the same file): touch its folder, or use ``"files"`` or
            ``use_cache=False`` once, to rebuild (:mod:`~seg_datamodule.io.yolo.folder_check`).

    Raises:
        TypeError, ValueError: ``on_bad_sample`` is not a str, or neither ``"raise"`` nor ``"skip"``;
            the same for ``box_only`` (``"raise"``, ``"drop_images"``, ``"drop"`` or ``"keep"``) and
            ``index_check`` (``"files"`` or ``"folders"``).
        TypeError: a flag is not a bool.
        ValueError: ``crowd_as_instances`` and ``drop_crowd`` both set.
    """

    on_bad_sample: Literal["raise", "skip"] = "raise"
    drop_crowd: bool = False
    drop_empty: bool = False
    verify_images: bool = False
    cache_dir: str | os.PathLike[str] | None = None
    use_cache: bool = True
    crowd_as_instances: bool = False
    box_only: Literal["raise", "drop_images", "drop", "keep"] = "raise"
    index_check: Literal["files", "folders"] = "files"

    def __post_init__(self) -> None:
        check_choice("on_bad_sample", self.on_bad_sample, ("raise", "skip"))
        check_choice("box_only", self.box_only, BOX_ONLY_CHOICES)
        check_choice("index_check", self.index_check, ("files", "folders"))
        for name in ("drop_crowd", "drop_empty", "verify_images", "use_cache", "crowd_as_instances"):
            check_bool(name, getattr(self, name))
        if self.crowd_as_instances and self.drop_crowd:
            raise ValueError("crowd_as_instances=True trains on crowd regions and drop_crowd=True leaves them out: "
                             "set one of them")


def merge_options(options: IndexOptions | None, fields: Mapping[str, Any], caller: str) -> IndexOptions:
    """``options`` (None: the defaults) with ``fields`` (flat :class:`IndexOptions` keywords) over it.

    Raises:
        TypeError: ``options`` is not an IndexOptions, or a field is not one of its (naming ``caller``).
    """
    base = IndexOptions() if options is None else options
    if not isinstance(base, IndexOptions):
        raise TypeError(f"options must be an IndexOptions or None, got {type(base).__name__}")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(IndexOptions)})
    if unknown:
        raise TypeError(f"{caller} got unexpected keyword arguments {unknown}")
    return dataclasses.replace(base, **fields) if fields else base


class Loaded(NamedTuple):
    """An index's tables and what they leave out of the JSON.

    Attributes:
        tables: the arrays, by :data:`~seg_datamodule.io.coco.tables.TABLE_KEYS`.
        skip_counts: reason -> count of what was skipped as bad.
        skip_examples: reason -> the first few messages.
        dropped_counts: what was left out that is not a skip, ``"crowd_dropped"``,
            ``"image_empty_dropped"`` and ``"box_only"``.
        skipped_image_ids: the ids of the images an annotation was skipped from (skip mode).
    """

    tables: dict[str, np.ndarray]
    skip_counts: dict[str, int]
    skip_examples: dict[str, list[str]]
    dropped_counts: dict[str, int]
    skipped_image_ids: Sequence[int] = ()


def load_tables(
    ann_file: Path, options: IndexOptions
) -> tuple[tuple[dict[str, np.ndarray], dict[str, Any]], bool, Path | None]:
    """The unfiltered tables of ``ann_file`` from the cache, or built from the JSON (then cached).

    A cache built in skip mode records its problems: in ``"raise"`` mode the first one is raised.

    Args:
        ann_file: the annotation file (absolute).
        options: the build's options (``use_cache``, ``cache_dir``, ``on_bad_sample``).

    Returns:
        ((tables, meta), whether they came from the cache, the cache file or None).

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        BadAnnotationError: a problem in the JSON (in ``"raise"`` mode, also one a cache recorded).
    """
    if not ann_file.is_file():
        raise FileNotFoundError(f"annotation file {ann_file} does not exist")

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return build_tables(ann_file, options.on_bad_sample)

    if options.use_cache:
        (tables, meta), from_cache, path = cached_tables(ann_file, None if options.cache_dir is None else Path(options.cache_dir), build)
    else:
        (tables, meta), from_cache, path = build(), False, None
    if options.on_bad_sample == "raise" and meta.get("first_problem") is not None:
        raise error_from_first(meta["first_problem"], ann_file)
    return (tables, meta), from_cache, path


def apply_options(loaded: Loaded, options: IndexOptions, image_errors: Sequence[BadImageError | None]) -> Loaded:
    """The tables with the options applied, in order: box-only annotations (dropped, or kept as
    instances without a ring), bad images, crowd regions as instances, images whose every target
    was skipped as bad (left out, never trained as backgrounds), crowd regions dropped, empty images.

    Args:
        loaded: the tables as loaded (not modified).
        options: the build's options.
        image_errors: with ``verify_images``, per image the error decoding it raised, or None.

    Returns:
        the new tables and counts.

    Raises:
        BadImageError: with ``verify_images`` in ``"raise"`` mode, the first bad image.
    """
    if options.box_only == "drop_images":
        loaded = _without_box_only_images(loaded)
    elif options.box_only == "drop":
        tables, removed = without_box_only(loaded.tables)
        dropped = dict(loaded.dropped_counts)
        dropped["box_only"] = dropped.get("box_only", 0) + removed
        loaded = loaded._replace(tables=tables, dropped_counts=dropped)
    if options.verify_images:
        loaded = _without_bad_images(loaded, image_errors, options.on_bad_sample)
    if options.crowd_as_instances:
        tables, converted = crowd_to_instances(loaded.tables)
        dropped = {**loaded.dropped_counts, "crowd_as_instances": converted}
        loaded = loaded._replace(tables=tables, dropped_counts=dropped)
    loaded = _without_emptied_images(loaded)
    if options.drop_crowd:
        dropped = dict(loaded.dropped_counts)
        dropped["crowd_dropped"] += len(loaded.tables["crowd_labels"])
        loaded = loaded._replace(tables=without_crowd(loaded.tables), dropped_counts=dropped)
    if options.drop_empty:  # after drop_crowd: crowd-only images count as empty
        keep = np.diff(loaded.tables["instance_offsets"]) > 0
        dropped = dict(loaded.dropped_counts)
        dropped["image_empty_dropped"] += int((~keep).sum())
        dropped["crowd_dropped"] += int(np.diff(loaded.tables["crowd_offsets"])[~keep].sum())
        loaded = loaded._replace(tables=select_images(loaded.tables, keep), dropped_counts=dropped)
    return loaded


def box_only_images(tables: Mapping[str, np.ndarray]) -> np.ndarray:
    """(ndarray[I] int64) the number of box-only instances (a box, no ring) of each image."""
    per_image = np.diff(tables["instance_offsets"])
    owner = np.repeat(np.arange(len(per_image), dtype=np.int64), per_image)
    return np.bincount(owner[box_only_mask(tables)], minlength=len(per_image))


def box_only_counts(tables: Mapping[str, np.ndarray]) -> dict[str, int]:
    """``{"image_box_only": images with a box-only instance}``, or ``{}`` without one (a source count)."""
    images = int(np.count_nonzero(box_only_images(tables)))
    return {"image_box_only": images} if images else {}


def refuse_box_only(tables: Mapping[str, np.ndarray], source: str, file_name: Callable[[int], str],
                    where: Callable[[int, int, int], str] | None = None) -> None:
    """Raise a :class:`BoxOnlyError` when the tables hold box-only instances (``box_only: raise``).

    Args:
        tables: the unfiltered tables.
        source: the annotation file or split, as messages name it.
        file_name: image position -> its file name.
        where: (image position, its box-only instances, all its instances) -> what names them; None:
            the image id, file name and box-only annotation ids (a COCO file; a YOLO split names its
            label files).

    Raises:
        BoxOnlyError: naming the first images, the counts and the choices.
    """
    per_image = box_only_images(tables)
    images = np.flatnonzero(per_image)
    if not len(images):
        return
    counts = np.diff(tables["instance_offsets"])
    total, emptied = int(per_image.sum()), int((per_image[images] == counts[images]).sum())
    named = "; ".join((where or _annotation_ids(tables, file_name))(int(i), int(per_image[i]), int(counts[i]))
                      for i in images[:_NAMED]) + ("; ..." if len(images) > _NAMED else "")
    raise BoxOnlyError(
        f"{source}: {total} annotation{'s' if total != 1 else ''} in {len(images)} image{'s' if len(images) != 1 else ''} "
        f"ha{'ve' if total != 1 else 's'} a box and no mask ({named}); {emptied} of those images would have no target "
        "left and their objects would be learned as background. Choose box_only (--data.box_only): drop_images "
        "(leave those images out, counted), keep (box loss without mask loss; the demo model), or drop (train the "
        "images without those boxes)")


def _annotation_ids(tables: Mapping[str, np.ndarray], file_name: Callable[[int], str]) -> Callable[[int, int, int], str]:
    """Names image ``i`` of a COCO file by its id and file name, with its box-only annotation ids."""
    def where(i: int, boxes: int, instances: int) -> str:
        a, b = int(tables["instance_offsets"][i]), int(tables["instance_offsets"][i + 1])
        ids = tables["annotation_ids"][a:b][np.diff(tables["instance_ring_offsets"][a : b + 1]) == 0]
        shown = ", ".join(map(str, ids[:5].tolist())) + (", ..." if len(ids) > 5 else "")
        return f"image id {int(tables['image_ids'][i])} ({file_name(i)}): annotation id{'s' * (len(ids) > 1)} {shown}"
    return where


def _without_box_only_images(loaded: Loaded) -> Loaded:
    """Leave out every image with a box-only instance, counting the images, the boxes and the rest."""
    t = loaded.tables
    per_image = box_only_images(t)
    if not per_image.any():
        return loaded
    keep = per_image == 0
    boxes = int(per_image.sum())
    others = int(np.diff(t["instance_offsets"])[~keep].sum()) - boxes + int(np.diff(t["crowd_offsets"])[~keep].sum())
    dropped = dict(loaded.dropped_counts)
    for key, n in (("box_only", boxes), ("annotation_of_box_only_image", others),
                   ("image_box_only_dropped", int((~keep).sum()))):
        dropped[key] = dropped.get(key, 0) + n
    return loaded._replace(tables=select_images(t, keep), dropped_counts=dropped)


def _without_emptied_images(loaded: Loaded) -> Loaded:
    """Leave out the images an annotation was skipped from (skip mode) that have no target left:
    trained, their objects (or crowd) would be learned as background. Counted as ``image_all_annotations_skipped``
    (their annotations are already counted by reason), their crowd regions as ``crowd_dropped``."""
    t = loaded.tables
    if not len(loaded.skipped_image_ids):
        return loaded
    emptied = np.isin(t["image_ids"], np.asarray(loaded.skipped_image_ids, np.int64)) & (
        np.diff(t["instance_offsets"]) == 0)
    if not emptied.any():
        return loaded
    counts = {**loaded.skip_counts, "image_all_annotations_skipped": int(emptied.sum())}
    dropped = dict(loaded.dropped_counts)
    dropped["crowd_dropped"] = dropped.get("crowd_dropped", 0) + int(np.diff(t["crowd_offsets"])[emptied].sum())
    return loaded._replace(tables=select_images(t, ~emptied), skip_counts=counts, dropped_counts=dropped)


def _without_bad_images(loaded: Loaded, errors: Sequence[BadImageError | None], on_bad_sample: str) -> Loaded:
    """Raise the first bad image, or leave the bad ones out, counted with their annotations."""
    bad = [e for e in errors if e is not None]
    if not bad:
        return loaded
    if on_bad_sample == "raise":
        raise bad[0]
    keep = np.array([e is None for e in errors], bool)
    t = loaded.tables
    lost = int(np.diff(t["instance_offsets"])[~keep].sum() + np.diff(t["crowd_offsets"])[~keep].sum())
    counts, examples = count_image_errors(loaded.skip_counts, loaded.skip_examples, bad, lost)
    return loaded._replace(tables=select_images(t, keep), skip_counts=counts, skip_examples=examples)
