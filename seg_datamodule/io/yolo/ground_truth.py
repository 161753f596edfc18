"""A COCO ground-truth file made from an index, so a split without a COCO JSON is scored with COCO AP.

An Ultralytics split has label files, not an instances JSON; ``COCOeval`` (and so
:class:`~seg_datamodule.evaluation.COCOMaskMAP`) needs one. :func:`ground_truth` writes the
index's images and instances as COCO: each image with its id, file name and (turned) size, each
instance as a polygon in pixels with its box, its polygon's area and ``iscrowd: 0``, category
ids being the labels (``0..C-1``) named as in ``names``. Instances the index left out (bad lines,
box-only lines) are left out here too, so validation scores exactly what it trains on.

:func:`crowd_as_instances_ground_truth` does the same for a COCO file read with
``crowd_as_instances``: the file with every crowd region made an instance (``iscrowd: 0``, its
RLE mask kept), so validation scores the regions training learns from rather than ignoring them.

The file is named after a digest of its content and written atomically in the index cache's
folder (or, without a usable cache, a folder of this process's own): DDP ranks that write it at
once write the same bytes, a changed split gets a new file, and a file already there is reused.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.coco.cache import default_cache_dir
from seg_datamodule.io.coco.crowd import crowd_as_instances_dict
from seg_datamodule.io.paths import make_private_dirs

__all__ = ["crowd_as_instances_ground_truth", "ground_truth", "ground_truth_dict"]

_log = logging.getLogger(__name__)
_own_folder: list[Path] = []  # the process's folder when the cache folder cannot be used


def ground_truth_dict(index: CocoIndex) -> dict[str, Any]:
    """The index as a COCO instances dict (see the module docstring).

    Returns:
        dict with ``images``, ``annotations`` and ``categories``, what ``pycocotools.coco.COCO`` reads.
    """
    images, annotations = [], []
    heights, widths, ids = index.heights, index.widths, index.image_ids
    for i in range(len(index)):
        image_id = int(ids[i])
        images.append({"id": image_id, "file_name": index.file_name(i), "height": int(heights[i]),
                       "width": int(widths[i])})
        polygons = index.polygons(i)
        if not len(polygons):
            continue
        areas, boxes = polygons.areas(), index.bboxes(i)
        for n, (label, annotation_id) in enumerate(zip(index.labels(i).tolist(), index.annotation_ids(i).tolist())):
            annotations.append({
                "id": annotation_id, "image_id": image_id, "category_id": int(index.category_ids[label]),
                "segmentation": [ring.reshape(-1).tolist() for ring in polygons.instance(n)],
                "area": float(areas[n]), "bbox": [float(v) for v in boxes[n]], "iscrowd": 0,
            })
    categories = [{"id": int(c), "name": name} for c, name in zip(index.category_ids, index.class_names)]
    return {"info": {"description": f"ground truth of {index.ann_file}, written by seg_datamodule"},
            "images": images, "annotations": annotations, "categories": categories}


def _folder(cache_dir: str | os.PathLike[str] | None, use_cache: bool) -> Path:
    if use_cache:
        folder = (default_cache_dir() if cache_dir is None else Path(cache_dir)) / "ground_truth"
        try:
            make_private_dirs(folder)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            pass
    if not _own_folder:
        _own_folder.append(Path(tempfile.mkdtemp(prefix="seg-datamodule-gt-")))
        atexit.register(shutil.rmtree, _own_folder[0], True)
        _log.info("writing ground-truth files to %s (no usable cache folder)", _own_folder[0])
    return _own_folder[0]


def ground_truth(index: CocoIndex, cache_dir: str | os.PathLike[str] | None = None, use_cache: bool = True) -> Path:
    """The COCO ground-truth file of ``index`` (written, or found already written).

    Args:
        index (CocoIndex): the split's index (an Ultralytics split's, or any other).
        cache_dir: the index cache's folder (the file goes to ``ground_truth/`` in it); None:
            :func:`~seg_datamodule.io.coco.default_cache_dir`.
        use_cache: False: a temporary folder of this process's own (removed at exit).

    Returns:
        Path: the JSON, named ``<data.yaml stem>-<digest>.json``.
    """
    return _write_once(ground_truth_dict(index), Path(index.ann_file).stem, cache_dir, use_cache)


def crowd_as_instances_ground_truth(ann_file: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None,
                                    use_cache: bool = True) -> Path:
    """``ann_file`` with its crowd regions as instances (:func:`~seg_datamodule.io.coco.crowd.crowd_as_instances_dict`), written once.

    Args:
        ann_file: a COCO instances JSON.
        cache_dir, use_cache: as for :func:`ground_truth`.

    Returns:
        Path: the JSON, named ``<stem>-crowd_as_instances-<digest>.json``; ``ann_file`` itself
        when it has no crowd region.
    """
    data = json.loads(Path(ann_file).read_bytes())
    converted = crowd_as_instances_dict(data)
    if converted is data:
        return Path(ann_file)
    return _write_once(converted, f"{Path(ann_file).stem}-crowd_as_instances", cache_dir, use_cache)


def _write_once(data: dict[str, Any], stem: str, cache_dir: str | os.PathLike[str] | None, use_cache: bool) -> Path:
    """``data`` as compact JSON in ``<folder>/<stem>-<digest>.json``, unless that file is already there."""
    text = json.dumps(data, separators=(",", ":")).encode("utf-8")
    digest = hashlib.blake2b(text, digest_size=12).hexdigest()
    path = _folder(cache_dir, use_cache) / f"{stem}-{digest}.json"
    if path.is_file() and path.stat().st_size == len(text):
        return path
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
