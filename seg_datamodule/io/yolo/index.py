"""An Ultralytics dataset split -> the same flat, cached, worker-safe :class:`~seg_datamodule.io.coco.CocoIndex` a COCO file gives.

:func:`build_yolo_index` reads a split of a ``data.yaml`` (:mod:`~seg_datamodule.io.yolo.data_yaml`),
lists its images (:mod:`~seg_datamodule.io.yolo.image_lists`), reads every image's header (size
and EXIF orientation, :mod:`~seg_datamodule.io.images.exif`) and label file in threads, parses
the labels at once (:mod:`~seg_datamodule.io.yolo.labels`) and assembles the index's tables: no
conversion step, no JSON. Every downstream feature (mosaic, copy-paste, resume, counts, streaming
``convert``, evaluation, test and predict) then works on it unchanged.

* Image ids: an all-digit file stem is the id, other names a stable hash of the path
  (:mod:`seg_datamodule.io.images.ids`); annotation ids count the instances from 1 in index order;
  category ids are the class indices ``0..C-1``, labelled by ``names``.
* Pixels: each image is decoded with its EXIF orientation applied, as Ultralytics decodes it (its
  coordinates refer to that image); the index's sizes are the turned ones.
* Cache: the tables are cached as a COCO file's are (:mod:`seg_datamodule.io.coco.cache`), keyed
  on the split's listing, every image's inode and the size, times and inode of every label file
  and list (:func:`_cache_key`): a changed label file, or an image added, removed or replaced by
  a new file, rebuilds it. With ``index_check="folders"`` a warm start checks the folders alone
  (:mod:`~seg_datamodule.io.yolo.folder_check`). Ultralytics' ``labels.cache`` (a pickle) is never opened.
* Bad input: :mod:`seg_datamodule.io.yolo.errors`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import os
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.coco.building import merge_options
from seg_datamodule.io.coco.cache import CACHE_FORMAT_VERSION, cached_tables_at, default_cache_dir, write_cache
from seg_datamodule.io.coco.errors import MAX_EXAMPLES
from seg_datamodule.io.coco.tables import assemble, box_only_chunk
from seg_datamodule.io.images.ids import assign_image_ids
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.io.paths import file_lock
from seg_datamodule.io.yolo.data_yaml import DatasetYaml, read_dataset_yaml
from seg_datamodule.io.yolo.errors import error_from_problem
from seg_datamodule.io.yolo.folder_check import cached_by_folders, folder_record
from seg_datamodule.io.images.exif import read_image_header
from seg_datamodule.io.yolo.image_lists import IMG_FORMATS, SplitImages, label_paths, list_split_images
from seg_datamodule.io.yolo.labels import parse_label_files
from seg_datamodule.ops.geometry import instance_areas
from seg_datamodule.ops.ragged import offsets_from_lengths

__all__ = ["build_yolo_index"]

_log = logging.getLogger(__name__)
_THREADS = min(8, os.cpu_count() or 1)  # header and label reads wait on the disk, not the GIL
_CHUNK_IMAGES = 8192  # images read and parsed at once: bounds what the cold build holds beside the tables


class _Problems:
    """Counts problems by reason; keeps a few messages and the first problem in (image, line) order."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.first: tuple[tuple[int, int], dict[str, Any]] | None = None
        self.images: set[int] = set()  # ids of the images a line was skipped from

    def add(self, order: tuple[int, int], reason: str, problem: dict[str, Any]) -> None:
        self.counts[reason] += 1
        if problem["kind"] == "line":
            self.images.add(problem["image_id"])
        kept = self.examples.setdefault(reason, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(problem["message"])
        if self.first is None or order < self.first[0]:
            self.first = (order, {"reason": reason, **problem})


def _read_one(image: str, label: str) -> tuple[Any, bytes | None | OSError]:
    """An image's header (or the error reading it) and its label file's bytes (None: no such file)."""
    try:
        header: Any = read_image_header(image)
    except BadImageError as err:
        header = err
    try:
        with open(label, "rb") as f:
            content: bytes | None | OSError = f.read()
    except FileNotFoundError:
        content = None
    except OSError as err:
        content = err
    return header, content


def _read_many(pairs: list[tuple[str, str]]) -> list[tuple[Any, bytes | None | OSError]]:
    return [_read_one(image, label) for image, label in pairs]


def _folder_inodes(folder: str) -> dict[str, int]:
    """Every name in ``folder`` and its inode, from the directory listing alone (no stat per file)."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name: entry.inode() for entry in entries}
    except OSError:
        return {}


def _by_folder(paths: list[str]) -> dict[str, list[str]]:
    """``paths`` grouped by folder, each folder's names in the order given."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        folder, _, name = path.rpartition(os.sep)
        groups.setdefault(folder, []).append(name)
    return groups


def _image_inodes(listing: SplitImages, images: list[str]) -> bytes:
    """The inode of each image (-1: missing), packed: the walk's, else one listing per folder."""
    out = array("q", listing.inodes if len(listing.inodes) == len(images) else [-1] * len(images))
    unknown = [i for i, inode in enumerate(out) if inode < 0]
    if unknown:  # images a .txt list named
        groups = _by_folder([images[i] for i in unknown])
        found = {folder: _folder_inodes(folder) for folder in groups}
        for i in unknown:
            folder, _, name = images[i].rpartition(os.sep)
            out[i] = found[folder].get(name, -1)
    return out.tobytes()


def _label_stats(folder: str, names: list[str]) -> bytes:
    """Size, mtime, ctime and inode of each label file of one folder (-1 for a missing one), packed.

    Stat'ed relative to the open folder, which spares the kernel the path walk.
    """
    out = array("q")
    missing = (-1, -1, -1, -1)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return array("q", missing * len(names)).tobytes()
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd)
            except OSError:  # no label file: a background image
                out.extend(missing)
                continue
            # A copy that keeps the old mtime (cp -p, rsync -a) still changes ctime and the inode.
            out.extend((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    finally:
        os.close(fd)
    return out.tobytes()


def _in_threads(function: Any, items: list[Any], pool: concurrent.futures.Executor) -> list[Any]:
    """``function`` over slices of ``items`` (a few thousand calls per task, not one), results in order."""
    step = max(256, -(-len(items) // (4 * _THREADS)))
    return list(pool.map(function, [items[k:k + step] for k in range(0, len(items), step)]))


def _cache_key(dataset: DatasetYaml, split: str, listing: SplitImages, images: list[str],
               labels: list[str]) -> dict[str, Any]:
    """What must match for a cached index to serve the split.

    The listing (every image's name), each image's inode, and the size, times and inode of every
    label file and ``.txt`` list. Images are not stat'ed one by one (a stat is the warm start's
    largest cost, ~6 us a file on a virtual machine): a new, removed or renamed image changes the
    listing, one replaced by a new file (an export, ``rsync``, ``git``) changes its inode; an image
    rewritten in place keeps its inode, and a changed size then stops at decoding as
    ``image_size_mismatch``, as it does for a COCO file's images.
    """
    digest = hashlib.blake2b(digest_size=16)
    digest.update("\0".join(listing.file_names).encode("utf-8", "surrogatepass"))
    digest.update(_image_inodes(listing, images))
    groups = list(_by_folder(labels).items()) + list(_by_folder([str(p) for p in listing.lists]).items())
    # Each folder cut in one part per thread: a stat releases the GIL, so on a machine with cores to
    # spare the threads overlap them (on a 2-core VM they did not: wall time = CPU time).
    tasks = [(folder, names[k:k + part]) for folder, names in groups
             for part in [max(1, -(-len(names) // _THREADS))] for k in range(0, len(names), part)]
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        for packed in pool.map(lambda task: _label_stats(*task), tasks):
            digest.update(packed)
    return {"version": CACHE_FORMAT_VERSION, "source": "ultralytics", "data_yaml": str(dataset.file), "split": split,
            "root": str(listing.root), "class_names": list(dataset.class_names), "files": digest.hexdigest()}


class _Kept:
    """What the cold build keeps, chunk by chunk: images (their sizes, orientations) and instances."""

    def __init__(self) -> None:
        self.images: list[int] = []
        self.sizes: list[tuple[int, int]] = []
        self.orientations: list[int] = []
        self.pieces: list[tuple[np.ndarray, ...]] = []  # (image position, label, points, vertices)
        self.boxes: list[tuple[np.ndarray, ...]] = []  # box lines: (image position, label, xywh)
        self.counts: Counter[str] = Counter()  # image_label_missing, image_label_empty


def _take_chunk(start: int, read: list[Any], build: tuple[DatasetYaml, SplitImages, list[str], list[str], np.ndarray],
                problems: _Problems, kept: _Kept) -> None:
    """Keep the good images of ``read`` (images ``start``...) and their parsed lines; count or record the rest."""
    dataset, listing, images, labels, ids = build
    names = listing.file_names
    contents, positions = [], []
    # Images that cannot be read, or whose label file cannot: left out (or the first raised).
    for i, (header, content) in enumerate(read, start):
        if isinstance(header, BadImageError):
            problems.add((i, 0), header.reason or "image_corrupt", {
                "kind": "image", "message": f"{dataset.file}: image id {int(ids[i])}: {header}", "file": images[i],
                "image_id": int(ids[i])})
            lost = sum(1 for line in content.splitlines() if line.strip()) if isinstance(content, bytes) else 0
            if lost:  # its lines go with it, counted
                problems.counts["label_of_skipped_image"] += lost
            continue
        if isinstance(content, OSError):
            problems.add((i, 0), "image_label_unreadable", {
                "kind": "label", "message": f"{labels[i]}: label file of {images[i]} cannot be read ({content})",
                "file": labels[i], "image_id": int(ids[i])})
            continue
        kept.images.append(i)
        kept.sizes.append(header.size)
        kept.orientations.append(header.orientation)
        if content is None:
            kept.counts["image_label_missing"] += 1
        else:
            contents.append(content)
            positions.append(len(kept.images) - 1)
    # Every label line of the chunk at once, in the kept images' (turned) pixels.
    position = np.asarray(positions, np.int64)
    parsed = parse_label_files(contents, np.asarray(kept.sizes, np.int64).reshape(-1, 2)[position],
                               len(dataset.class_names))
    for problem in parsed.problems:
        i = kept.images[position[problem.file]]
        problems.add((i, problem.line), problem.reason, {
            "kind": "line", "message": f"{labels[i]}:{problem.line}: {problem.detail} (image {names[i]}, id {int(ids[i])})",
            "file": labels[i], "line": problem.line, "image_id": int(ids[i])})
    kept.pieces.append((position[parsed.file], parsed.labels, parsed.ring_lens, parsed.vertices))
    kept.boxes.append((position[parsed.box_file], parsed.box_labels, parsed.box_xywh))
    kept.counts["image_label_empty"] += int((parsed.lines == 0).sum())


def _build_tables(dataset: DatasetYaml, listing: SplitImages, images: list[str],
                  labels: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read every header and label file and assemble the unfiltered tables (the cold build).

    Chunk by chunk of :data:`_CHUNK_IMAGES` images: the headers and label files read in threads
    (they wait on the disk), then parsed at once, so what is held beside the tables is one chunk.
    """
    names, num_classes = listing.file_names, len(dataset.class_names)
    build = (dataset, listing, images, labels, assign_image_ids(names, f"{dataset.file}"))
    problems, kept = _Problems(), _Kept()
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        for start in range(0, len(images), _CHUNK_IMAGES):
            pairs = list(zip(images[start:start + _CHUNK_IMAGES], labels[start:start + _CHUNK_IMAGES]))
            read = [r for part in _in_threads(_read_many, pairs, pool) for r in part]
            _take_chunk(start, read, build, problems, kept)

    # The tables: instances (one ring each) numbered from 1 in index order, images, categories.
    image_of, classes, points, vertices = (np.concatenate(column) for column in zip(*kept.pieces))
    vertices = vertices.reshape(-1, 2)
    n = len(classes)
    ring_offsets = offsets_from_lengths(points)
    low = np.minimum.reduceat(vertices, ring_offsets[:-1]) if n else np.zeros((0, 2))
    high = np.maximum.reduceat(vertices, ring_offsets[:-1]) if n else np.zeros((0, 2))
    chunk = {
        "pos": np.arange(n, dtype=np.int64), "img": image_of.astype(np.int64), "labels": classes.astype(np.int64),
        "annotation_ids": np.arange(1, n + 1, dtype=np.int64), "bboxes": np.concatenate([low, high - low], 1),
        "areas": instance_areas(vertices, ring_offsets, np.arange(n + 1)), "nrings": np.ones(n, np.int64),
        "ring_lens": points.astype(np.int64), "vertices": vertices,
    }
    # Box lines: instances without a ring, numbered after the polygons (box_only: drop or keep).
    box_image, box_classes, xywh = (np.concatenate(column) for column in zip(*kept.boxes))
    m = len(box_classes)
    boxes = box_only_chunk(np.concatenate([np.stack([box_image, box_classes, np.arange(n + 1, n + m + 1)], 1),
                                           xywh.reshape(-1, 4), np.full((m, 1), np.nan)], 1))
    tables = assemble([chunk] * bool(n) + [boxes] * bool(m), [], len(kept.images))
    encoded = [names[i].encode("utf-8", "surrogatepass") for i in kept.images]
    sizes = np.asarray(kept.sizes, np.int64).reshape(-1, 2)
    none = np.zeros(len(kept.images) + 1, np.int64)
    tables.update(
        image_ids=build[4][np.asarray(kept.images, np.int64)], heights=sizes[:, 0].copy(), widths=sizes[:, 1].copy(),
        file_name_offsets=offsets_from_lengths(np.fromiter(map(len, encoded), np.int64, len(encoded))),
        file_name_bytes=np.frombuffer(b"".join(encoded), np.uint8).copy(),
        category_ids=np.arange(num_classes, dtype=np.int64), orientations=np.asarray(kept.orientations, np.uint8),
        neg_label_offsets=none, neg_labels=np.zeros(0, np.int64), not_exhaustive_label_offsets=none.copy(),
        not_exhaustive_labels=np.zeros(0, np.int64),
    )
    meta = {
        "class_names": list(dataset.class_names), "skip_counts": dict(problems.counts), "skip_examples": problems.examples,
        "first_problem": None if problems.first is None else problems.first[1], "skipped_image_ids": sorted(problems.images),
        "source_counts": {k: kept.counts[k] for k in ("image_label_missing", "image_label_empty")},
    }
    return tables, meta


def _cache_file(cache_dir: Path, dataset: DatasetYaml, split: str) -> Path:
    digest = hashlib.sha256(f"{dataset.file}\0{split}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return cache_dir / f"{dataset.file.stem}-{split}-{digest}.npz"


def _with_listing(meta: dict[str, Any], listing: SplitImages) -> dict[str, Any]:
    """The metadata with the lists' bad lines and the listing's counts (not cached: read each time)."""
    counts, examples = Counter(meta["skip_counts"]), {k: list(v) for k, v in meta["skip_examples"].items()}
    for problem in listing.problems:
        counts[problem.reason] += 1
        if len(examples.setdefault(problem.reason, [])) < MAX_EXAMPLES:
            examples[problem.reason].append(problem.message)
    source = {**meta.get("source_counts", {}), **listing.counts}
    return {**meta, "skip_counts": dict(counts), "skip_examples": examples,
            "source_counts": {k: int(v) for k, v in source.items() if v}}


def _check_listing(listing: SplitImages, dataset: DatasetYaml, split: str, options: IndexOptions) -> None:
    """Raise the first bad line of a ``.txt`` list (``on_bad_sample="raise"``), or that the split lists no image."""
    if listing.problems and options.on_bad_sample == "raise":
        first = listing.problems[0]
        raise error_from_problem({"kind": "line", "message": first.message, "reason": first.reason,
                                  "file": first.source, "line": first.line})
    if not listing.file_names:
        raise ValueError(f"{dataset.file}: split {split!r} lists no image ({', '.join(map(str, dataset.sources(split)))}; "
                         f"extensions: {', '.join(sorted(IMG_FORMATS))})")


def _tables(dataset: DatasetYaml, split: str, listing: SplitImages, path: Path | None, options: IndexOptions,
            taken_ns: int) -> tuple[tuple[dict[str, np.ndarray], dict[str, Any]], tuple[bool, Path | None]]:
    """The split's tables by the full path: from a cache its per-file key matches, else built (and cached).

    With ``index_check="folders"`` the cache also gets a folder record (:func:`folder_record`),
    rewritten when a cache served by the per-file key lacks a current one.
    """
    prefix = os.path.join(str(listing.root), "")
    images = [prefix + name for name in listing.file_names]
    labels = label_paths(images)
    record = None
    if path is not None and options.index_check == "folders":
        record = folder_record(dataset, dataset.sources(split), listing, images, labels, taken_ns)

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        tables, meta = _build_tables(dataset, listing, images, labels)
        return tables, meta if record is None else {**meta, "folders": record}

    if path is None:
        return build(), (False, None)
    key = _cache_key(dataset, split, listing, images, labels)
    (tables, meta), from_cache, written = cached_tables_at(path, key, build)
    if from_cache and record is not None and meta.get("folders") != record:
        meta = {**meta, "folders": record}
        with contextlib.suppress(OSError), file_lock(path.with_name(path.name + ".lock")):
            write_cache(path, tables, meta)  # the next start is warm again
    return (tables, meta), (from_cache, written)


def build_yolo_index(data_yaml: str | os.PathLike[str], split: str, options: IndexOptions | None = None,
                     **fields: Any) -> CocoIndex:
    """The index of one split of an Ultralytics dataset (see the module docstring), cached.

    Args:
        data_yaml: the dataset's ``data.yaml``.
        split: the split to read: ``"train"``, ``"val"``, ``"test"``, or any other the file names.
        options (IndexOptions | None): as for :meth:`~seg_datamodule.io.coco.CocoIndex.build`
            (an Ultralytics dataset has no crowd regions); ``**fields``: any of its fields, flat.

    Returns:
        CocoIndex: its ``ann_file`` is the data.yaml, its ``image_root`` the folder below which every image is.

    Raises:
        DatasetYamlError, DatasetNotFoundError: the data.yaml, or the split, cannot be read.
        ImageIdClashError: two images would share an id (the message names both files).
        BadLabelError: with ``on_bad_sample="raise"``, the first bad line (file and line named),
            or a bad line of a ``.txt`` list.
        BadImageError: with ``on_bad_sample="raise"``, the first image that cannot be read.
        BoxOnlyError: box lines under ``box_only="raise"`` (the default), naming the label files.
        ValueError: the split lists no image.
    """
    options = merge_options(options, fields, "build_yolo_index()")
    dataset = read_dataset_yaml(data_yaml)
    sources = dataset.sources(split)
    path = None if not options.use_cache else _cache_file(
        default_cache_dir() if options.cache_dir is None else Path(options.cache_dir), dataset, split)
    warm = None if path is None or options.index_check == "files" else cached_by_folders(path, dataset, split, sources)
    if warm is not None:  # no walk, no stat per file
        tables, meta, listing = warm
        _check_listing(listing, dataset, split, options)
        cached: tuple[bool, Path | None] = (True, path)
    else:
        taken_ns = time.time_ns()  # before the walk: what changes after it is newer (the racy rule)
        listing = list_split_images(sources)
        _check_listing(listing, dataset, split, options)
        (tables, meta), cached = _tables(dataset, split, listing, path, options, taken_ns)
    if options.on_bad_sample == "raise" and meta.get("first_problem") is not None:
        raise error_from_problem(meta["first_problem"])
    index = CocoIndex.from_tables(tables, _with_listing(meta, listing), dataset.file, listing.root, options, cached,
                                  (f"{dataset.file} [{split}]", lambda index, i, boxes, lines: (  # a BoxOnlyError's words
                                      f"{label_paths([str(index.file_path(i))])[0]}: {boxes} box lines of {lines}")))
    counts = ", ".join(f"{k} {v}" for k, v in index.source_counts.items())
    _log.info("%s [%s]: %s%s", dataset.file, split, index.summary(), f"; {counts}" if counts else "")
    return index
