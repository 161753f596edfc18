"""LVIS's image fields: the image path from ``file_name`` or ``coco_url``, and the federated lists.

LVIS files look like COCO's but differ per image (https://www.lvisdataset.org/dataset):

* v1 images have no ``file_name``, only ``coco_url``
  (``http://images.cocodataset.org/train2017/000000391895.jpg``); the image's path is then the
  URL path's last two parts (``train2017/000000391895.jpg``), relative to the image root (the
  COCO folder holding ``train2017/`` and ``val2017/``, as Detectron2's ``load_lvis_json`` reads
  it), checked like a ``file_name`` (:func:`~seg_datamodule.io.paths.file_name_problem`);
* ``neg_category_ids`` (categories verified absent from the image) and
  ``not_exhaustive_category_ids`` (categories whose instances were not all annotated) are kept as
  contiguous labels, so a federated loss or metric can ignore categories nobody checked.

COCO files have none of these fields: both lists are then empty.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Mapping

from seg_datamodule.io.paths import file_name_problem

__all__ = ["FEDERATED_FIELDS", "coco_url_path", "federated_labels", "image_file_name"]

#: The per-image category lists kept, in the order :func:`federated_labels` returns them.
FEDERATED_FIELDS = ("neg_category_ids", "not_exhaustive_category_ids")


def coco_url_path(url: str) -> tuple[str | None, str | None]:
    """The relative image path in ``coco_url``: its URL path's last two parts, percent-decoded.

    Args:
        url: e.g. ``"http://images.cocodataset.org/val2017/000000266409.jpg"``.

    Returns:
        ``(path, None)`` such as ``("val2017/000000266409.jpg", None)``, or ``(None, problem)``
        with a phrase saying why no path comes out of it.
    """
    try:
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path, errors="strict")
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"is not a URL ({err})"
    parts = path.split("/")
    if len(parts) < 3 or not parts[-1] or not parts[-2]:
        return None, "has no '<folder>/<file>' at the end of its path"
    return f"{parts[-2]}/{parts[-1]}", None


def image_file_name(img: Mapping[str, Any]) -> tuple[str | None, str | None, tuple[str, str] | None]:
    """Where an image entry's file is, relative to the image root, and what is wrong with it.

    ``file_name`` when the entry has one (COCO, LVIS v0.5), else ``coco_url`` (LVIS v1; see
    :func:`coco_url_path`).

    Args:
        img: one entry of the JSON's ``images``.

    Returns:
        ``(name, shown, problem)``: the relative path (None when there is none), what messages
        show for the image, and ``(skip reason, detail)`` or None when the path is usable.
    """
    name = img.get("file_name")
    if name is not None or "coco_url" not in img:
        shown = name if isinstance(name, str) else None
        if not shown:
            detail = f"file_name must be a non-empty string, got {name!r}"
            if "coco_url" not in img:
                detail += " (and there is no coco_url)"
            return None, shown, ("image_bad_entry", detail)
        unsafe = file_name_problem(name)
        if unsafe is not None:
            return None, shown, ("image_unsafe_file_name", f"file_name {name!r} {unsafe}")
        return name, shown, None
    url = img.get("coco_url")
    if not isinstance(url, str) or not url:
        return None, None, ("image_bad_entry", f"no file_name, and coco_url is not a non-empty string: {url!r}")
    path, problem = coco_url_path(url)
    if path is None:
        return None, url, ("image_bad_entry", f"no file_name, and coco_url {url!r} {problem}")
    unsafe = file_name_problem(path)
    if unsafe is not None:
        return None, url, ("image_unsafe_file_name", f"coco_url {url!r} gives the path {path!r}, which {unsafe}")
    return path, path, None


def federated_labels(
    img: Mapping[str, Any], label_of: Mapping[int, int]
) -> tuple[list[int], list[int]] | str:
    """An image's ``neg_category_ids`` and ``not_exhaustive_category_ids`` as sorted unique labels.

    Args:
        img: one entry of the JSON's ``images``; a missing or null field is an empty list.
        label_of: category id -> contiguous label.

    Returns:
        ``(neg_labels, not_exhaustive_labels)``, or a phrase saying what is wrong (a field that
        is not a list of integers, or an id that is not a category's).
    """
    out = []
    for field in FEDERATED_FIELDS:
        ids = img.get(field)
        if ids is None:
            out.append([])
            continue
        if type(ids) is not list or any(type(c) is not int for c in ids):
            return f"{field} must be a list of integer category ids, got {ids!r:.200}"
        unknown = [c for c in ids if c not in label_of]
        if unknown:
            return f"{field} holds {unknown[:5]}, not the id of any category"
        out.append(sorted({label_of[c] for c in ids}))
    return out[0], out[1]
