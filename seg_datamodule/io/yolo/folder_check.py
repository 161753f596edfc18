"""The ``index_check="folders"`` warm start: a cached Ultralytics index checked by its folders' stats alone.

With ``index_check="files"`` (the default) every start walks the split's image folders and stats
every label file (:func:`~seg_datamodule.io.yolo.index.build_yolo_index`'s key). With
``"folders"`` the cache also holds a :func:`folder_record`: the ``(st_mtime_ns, st_ctime_ns,
st_ino)`` of every folder the split reads (the image folders the walk listed, the folders of the
images a ``.txt`` list names, the label folders) and of the ``.txt`` lists and the ``data.yaml``,
the time the record was taken, and the split's listing (:class:`SplitImages`, as JSON with its
digest). A warm start (:func:`unchanged_listing`) stats those few paths and takes the listing from
the cache: no walk, no stat per file.

A folder's mtime changes when a name in it is added, removed or renamed, so an added, removed,
renamed or replaced image or label file is seen; a label file rewritten in place is not (the
documented trade-off of the option).

Racy folders (git's "racy git" problem): a folder modified within the filesystem's timestamp
granularity of the moment the record was taken can change again without its mtime moving. As git
does, a folder whose recorded mtime is not at least :data:`RACY_NS` older than the record's time
counts as changed, so the next start takes the full path (the walk and the per-file key).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from seg_datamodule.io.coco.cache import CACHE_FORMAT_VERSION, read_cache_where
from seg_datamodule.io.yolo.data_yaml import DatasetYaml
from seg_datamodule.io.yolo.image_lists import ListProblem, SplitImages

__all__ = ["RACY_NS", "cached_by_folders", "folder_record", "unchanged_listing"]

#: A folder modified less than this before its record was taken is "racy": checked in full next start.
RACY_NS = 2_000_000_000

_MISSING = [-1, -1, -1]


def _stat(path: str) -> list[int]:
    """``[st_mtime_ns, st_ctime_ns, st_ino]`` of ``path``; ``[-1, -1, -1]`` when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return list(_MISSING)
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _parent(path: str) -> str:
    return path.rpartition(os.sep)[0]


def _listing_json(listing: SplitImages) -> str:
    return json.dumps({
        "root": str(listing.root), "file_names": listing.file_names, "problems": [list(p) for p in listing.problems],
        "counts": listing.counts, "lists": [str(p) for p in listing.lists], "inodes": listing.inodes,
        "folders": list(listing.folders),
    })


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def folder_record(dataset: DatasetYaml, sources: Sequence[Path], listing: SplitImages, images: list[str],
                  labels: list[str], taken_ns: int) -> dict[str, Any]:
    """What a ``"folders"`` warm start checks, taken after the walk (stored in the cache's metadata).

    Args:
        dataset: the data.yaml read.
        sources: the split's sources.
        listing: the split's listing, walked after ``taken_ns``.
        images, labels (list[str]): every image's and label file's absolute path.
        taken_ns: ``time.time_ns()`` before the walk began.

    Returns:
        a JSON-able dict: ``taken_ns``, ``sources``, ``paths`` (folders, then the lists and the
        data.yaml), ``stats`` (one ``[mtime_ns, ctime_ns, inode]`` per path), ``listing`` and
        ``listing_digest``.
    """
    folders = set(listing.folders)
    folders.update(map(_parent, images))
    folders.update(map(_parent, labels))
    paths = [*sorted(folders), *(str(p) for p in listing.lists), str(dataset.file)]
    text = _listing_json(listing)
    return {"taken_ns": int(taken_ns), "sources": [str(s) for s in sources], "paths": paths,
            "stats": [_stat(p) for p in paths], "listing": text, "listing_digest": _digest(text)}


def _is_current(meta: dict[str, Any], dataset: DatasetYaml, split: str, sources: Sequence[Path]) -> bool:
    """Whether ``meta``'s record holds for the split now: the same data.yaml and sources, no racy or changed path."""
    key, record = meta.get("key"), meta.get("folders")
    if not isinstance(key, dict) or not isinstance(record, dict):
        return False
    expected = {"version": CACHE_FORMAT_VERSION, "source": "ultralytics", "data_yaml": str(dataset.file),
                "split": split, "class_names": list(dataset.class_names)}
    if any(key.get(k) != v for k, v in expected.items()) or record.get("sources") != [str(s) for s in sources]:
        return False
    paths, stats, taken = record.get("paths"), record.get("stats"), record.get("taken_ns")
    if not (isinstance(paths, list) and isinstance(stats, list) and len(paths) == len(stats)
            and isinstance(taken, int)):
        return False
    # Racy first (no system call): a path modified too near the record's time may change unseen.
    if any(not isinstance(s, list) or len(s) != 3 or s[0] > taken - RACY_NS for s in stats):
        return False
    return all(_stat(path) == recorded for path, recorded in zip(paths, stats))


def _listing_from(record: dict[str, Any]) -> SplitImages:
    """The :class:`SplitImages` a record holds (its digest checked).

    Raises:
        ValueError: the listing fails its digest.
        KeyError, TypeError: it lacks a field.
    """
    text = record["listing"]
    if not isinstance(text, str) or record.get("listing_digest") != _digest(text):
        raise ValueError("the cached listing fails its digest")
    raw = json.loads(text)
    return SplitImages(Path(raw["root"]), list(raw["file_names"]), [ListProblem(*p) for p in raw["problems"]],
                       dict(raw["counts"]), tuple(Path(p) for p in raw["lists"]), list(raw["inodes"]),
                       tuple(raw["folders"]))


def unchanged_listing(meta: dict[str, Any], dataset: DatasetYaml, split: str,
                      sources: Sequence[Path]) -> SplitImages | None:
    """The split's listing from a cache's metadata when its folder record holds now, else None.

    Args:
        meta: the cache's metadata (:func:`~seg_datamodule.io.coco.cache.read_cache_where`).
        dataset, split, sources: the split asked for.

    Returns:
        the cached :class:`SplitImages`, or None (no record, a changed or racy path, another
        data.yaml or split, a damaged listing): then the full path is taken.
    """
    try:
        return _listing_from(meta["folders"]) if _is_current(meta, dataset, split, sources) else None
    except (KeyError, TypeError, ValueError):
        return None


def cached_by_folders(path: Path, dataset: DatasetYaml, split: str,
                      sources: Sequence[Path]) -> tuple[dict[str, np.ndarray], dict[str, Any], SplitImages] | None:
    """The cached tables, metadata and listing at ``path`` when its folder record holds now, else None.

    The record is checked on the metadata alone (:func:`unchanged_listing`) before any array is
    read; the arrays are then checked as every cache read checks them
    (:func:`~seg_datamodule.io.coco.cache.read_cache_where`).
    """
    found: list[SplitImages | None] = [None]

    def accept(meta: dict[str, Any]) -> bool:
        found[0] = unchanged_listing(meta, dataset, split, sources)
        return found[0] is not None

    loaded = read_cache_where(path, accept)
    return None if loaded is None or found[0] is None else (*loaded, found[0])
