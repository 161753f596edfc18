"""COCO annotation file + image folder (or an Ultralytics data.yaml split) -> LitData chunks, one record per image.

The converter builds a :class:`~seg_datamodule.io.coco.CocoIndex` first (:func:`convert_coco`; an
Ultralytics split's, :func:`convert_yolo`) and converts from it (:func:`convert_index`), so
every bad entry is handled exactly as the map-style loader handles it (raise, or skip and count,
with the same reasons and messages); a file that cannot be read when converting is handled the
same way (reason ``image_missing`` / ``image_unreadable``). The JPEG bytes are stored as they are
on disk, never re-encoded. Inputs are shuffled (from ``seed``) before ``litdata.optimize`` so
chunks mix images; LitData does not keep item order, so every record carries its ``index`` and
``image_id``.

Beside the chunks, :data:`META_FILE` holds the categories, the skip and drop counts, and every
image's id and size by position (what a streamed batch plans its mosaic from), and for an
Ultralytics split whose images carry an EXIF orientation, each image's orientation (the stored
bytes are decoded turned, as the map-style loader decodes the file).

The options travel as two frozen types built once at the edge (the ``seg-datamodule convert``
flags, :mod:`~seg_datamodule.io.stream.cli`): :class:`~seg_datamodule.io.coco.IndexOptions` (how
the index is built, as for the DataModule) and :class:`ChunkOptions` (how the chunks are written).
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from seg_datamodule.io.coco import CocoIndex, IndexOptions, format_skip_summary
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.io.stream.endpoint import s3_storage_options
from seg_datamodule.io.stream.records import record_from_index
from seg_datamodule.io.stream.schema import META_FILE, SCHEMA_VERSION
from seg_datamodule.io.stream.source import check_stream_source, read_stream_meta, split_source
from seg_datamodule.io.yolo import build_yolo_index
from seg_datamodule.ops.checks import check_bool, check_int

__all__ = [
    "ChunkOptions", "FORMAT_VERSION", "META_FILE", "convert_coco", "convert_index", "convert_yolo", "read_stream_meta",
    "require_litdata", "split_source",
]

#: The record schema's version (:data:`~seg_datamodule.io.stream.schema.SCHEMA_VERSION`), written to
#: the metadata; readers refuse another.
FORMAT_VERSION = SCHEMA_VERSION


def require_litdata() -> Any:
    """The ``litdata`` module, or an ImportError saying how to install the optional extra."""
    try:
        import litdata
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "streaming needs LitData: pip install 'seg-datamodule[stream]' (litdata==0.2.76)"
        ) from err
    return litdata


@dataclass(frozen=True)
class ChunkOptions:
    """How the converter writes the chunks with ``litdata.optimize``.

    Attributes:
        chunk_bytes: target chunk size (LitData syntax, ``"64MB"``).
        num_workers: ``litdata.optimize`` worker processes.
        seed: seed of the input shuffle.
        overwrite: replace existing chunks in the output.
        start_method: how ``litdata.optimize`` starts its workers (``"fork"`` starts in about a
            second, LitData's default ``"spawn"`` re-imports torch in every worker).

    Raises:
        TypeError, ValueError: ``num_workers`` < 1, a negative ``seed``, a non-bool
            ``overwrite``.
    """

    chunk_bytes: int | str = "64MB"
    num_workers: int = 1
    seed: int = 0
    overwrite: bool = False
    start_method: str | None = None

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, 1)
        check_int("seed", self.seed, 0)
        check_bool("overwrite", self.overwrite)


_DEFAULT_INDEX = IndexOptions()
_DEFAULT_CHUNKS = ChunkOptions()


def _read_bytes(index: CocoIndex, i: int) -> bytes:
    """Image ``i``'s file as stored; raises ``BadImageError`` naming the file and image id."""
    path = index.file_path(i)
    where = f"{index.ann_file}: image id {int(index.image_ids[i])}: image file {path}"
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise BadImageError(f"{where} does not exist", path=path, reason="image_missing",
                            image_id=int(index.image_ids[i]), image_index=i) from None
    except OSError as err:
        raise BadImageError(f"{where} cannot be read: {err.strerror or err}", path=path,
                            reason="image_unreadable", image_id=int(index.image_ids[i]), image_index=i) from None


def _record(index: CocoIndex, i: int) -> dict[str, Any]:
    """``litdata.optimize``'s per-input function (runs in its workers; the index pickles)."""
    return record_from_index(index, i, _read_bytes(index, i))


def _readable(index: CocoIndex, on_bad_sample: str) -> tuple[np.ndarray, dict[str, int], dict[str, list[str]]]:
    """Positions whose file can be opened; the others raise or are counted (skip mode)."""
    keep, counts, examples = [], {}, {}
    for i in range(len(index)):
        path = index.file_path(i)
        try:
            if not os.path.isfile(path):
                raise BadImageError(
                    f"{index.ann_file}: image id {int(index.image_ids[i])}: image file {path} does not exist",
                    path=path, reason="image_missing", image_id=int(index.image_ids[i]), image_index=i)
            if not os.access(path, os.R_OK):
                raise BadImageError(
                    f"{index.ann_file}: image id {int(index.image_ids[i])}: image file {path} cannot be read",
                    path=path, reason="image_unreadable", image_id=int(index.image_ids[i]), image_index=i)
        except BadImageError as err:
            if on_bad_sample == "raise":
                raise
            reason = str(err.reason)
            counts[reason] = counts.get(reason, 0) + 1
            examples.setdefault(reason, [])
            if len(examples[reason]) < 5:
                examples[reason].append(str(err))
            continue
        keep.append(i)
    return np.asarray(keep, np.int64), counts, examples


def convert_coco(
    ann_file: str | os.PathLike[str],
    images_root: str | os.PathLike[str],
    output_dir: str,
    index_options: IndexOptions = _DEFAULT_INDEX,
    chunk_options: ChunkOptions = _DEFAULT_CHUNKS,
    *,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert a COCO dataset to LitData chunks (a local folder, or ``s3://...`` via LitData's upload).

    Args:
        ann_file: COCO instances JSON.
        images_root: folder of the images (``file_name`` is relative to it).
        output_dir: where the chunks go: a folder, ``local:/folder`` or a bucket URL.
        index_options (IndexOptions): how the index is built (``on_bad_sample``, ``drop_crowd``,
            ``crowd_as_instances``, ``box_only``, ``drop_empty``, ``verify_images``, ``cache_dir``, ``use_cache``).
        chunk_options (ChunkOptions): how the chunks are written (``chunk_bytes``,
            ``num_workers``, the shuffle ``seed``, ``overwrite``, ``start_method``).
        storage_options: passed to LitData for a remote ``output_dir`` (completed by
            :func:`~seg_datamodule.io.stream.endpoint.s3_storage_options`: ``AWS_ENDPOINT_URL``,
            bounded retries, plain ``http://``).

    Returns:
        dict: the metadata written to :data:`META_FILE` (counts under ``skip_counts``,
        ``dropped_counts``, ``num_records``, sizes under ``image_bytes`` and ``chunk_bytes_total``).

    Raises:
        ImportError: LitData is not installed.
        BadAnnotationError, BadImageError: a bad entry with ``on_bad_sample="raise"``.
        TypeError, ValueError: a bad argument (the options check theirs when made).
    """
    _check_options(index_options, chunk_options)
    return convert_index(CocoIndex.build(ann_file, images_root, index_options), output_dir, index_options,
                         chunk_options, storage_options=storage_options)


def convert_yolo(
    data_yaml: str | os.PathLike[str],
    split: str,
    output_dir: str,
    index_options: IndexOptions = _DEFAULT_INDEX,
    chunk_options: ChunkOptions = _DEFAULT_CHUNKS,
    *,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert a split of an Ultralytics dataset (a ``data.yaml``) to LitData chunks, as :func:`convert_coco` does.

    The index is :func:`~seg_datamodule.io.yolo.build_yolo_index`'s (every bad line raised or
    counted as the map-style loader does); the images' EXIF orientations go to the metadata, so a
    streamed batch decodes them as the map-style one does.

    Raises:
        ImportError: LitData is not installed.
        BadLabelError, BadImageError: a bad line or image with ``on_bad_sample="raise"``.
        DatasetYamlError, DatasetNotFoundError: the data.yaml or the split cannot be read.
    """
    _check_options(index_options, chunk_options)
    return convert_index(build_yolo_index(data_yaml, split, index_options), output_dir, index_options,
                         chunk_options, storage_options=storage_options)


def _check_options(index_options: IndexOptions, chunk_options: ChunkOptions) -> None:
    """Refuse a missing LitData and options of the wrong type before any index is built."""
    require_litdata()
    for name, value, kind in (("index_options", index_options, IndexOptions),
                              ("chunk_options", chunk_options, ChunkOptions)):
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be of type {kind.__name__}, got {value!r}")


_STAGING = "DATA_OPTIMIZER_CACHE_FOLDER"  # litdata.processing.data_processor._get_cache_dir


@contextlib.contextmanager
def _own_staging_folder(remote: bool) -> Iterator[None]:
    """Stage a remote conversion's chunks in a folder of its own, removed afterwards.

    LitData 0.2.76's ``optimize`` writes a remote output's chunks first into one folder per machine
    (``<tmp>/chunks``, or ``DATA_OPTIMIZER_CACHE_FOLDER``) and empties it when done, so two
    conversions at once on one machine deleted each other's files (an ``index.json`` gone before
    its upload, seen in CI). Here the variable names a fresh folder (under the user's, where set)
    while ``optimize`` runs; its worker processes inherit it.
    """
    if not remote:
        yield
        return
    before = os.environ.get(_STAGING)
    if before:
        os.makedirs(before, exist_ok=True)
    own = tempfile.mkdtemp(prefix="seg-datamodule-convert-", dir=before or None)
    os.environ[_STAGING] = own
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_STAGING, None)
        else:
            os.environ[_STAGING] = before
        shutil.rmtree(own, ignore_errors=True)


def convert_index(
    index: CocoIndex, output_dir: str, index_options: IndexOptions = _DEFAULT_INDEX,
    chunk_options: ChunkOptions = _DEFAULT_CHUNKS, *, storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a built index's images and instances as LitData chunks (what :func:`convert_coco` and
    :func:`convert_yolo` do once they have the index, built with ``index_options``); see
    :func:`convert_coco` for the arguments.

    Raises:
        ImportError: LitData is not installed.
        BadImageError: an image file cannot be opened and the index's ``on_bad_sample`` is ``"raise"``.
        ValueError: no image is left to convert.
    """
    litdata = require_litdata()
    out, remote = split_source(output_dir)
    storage_options = s3_storage_options(out, storage_options)  # endpoint, bounded retries, http://
    start = time.perf_counter()
    ann_file = index.ann_file
    # 1. Files that cannot be opened: raised or counted like the images verify_images finds.
    positions, read_counts, read_examples = _readable(index, index_options.on_bad_sample)
    if positions.size == 0:
        raise ValueError(f"{ann_file}: no image left to convert ({format_skip_summary(read_counts)})")
    # 2. Shuffle so chunks mix images, then write the chunks.
    inputs = np.random.default_rng([chunk_options.seed, 0x636F6E76]).permutation(positions).tolist()
    if not remote:
        Path(out).mkdir(parents=True, exist_ok=True)
    # litdata.optimize sets the process's start method (spawn unless told) and leaves it set: a
    # DataLoader made later in the process would then spawn its workers. Put it back.
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        with _own_staging_folder(remote):
            litdata.optimize(
                functools.partial(_record, index), inputs, output_dir if remote else out,
                chunk_bytes=chunk_options.chunk_bytes, num_workers=chunk_options.num_workers,
                mode="overwrite" if chunk_options.overwrite else None, verbose=False, storage_options=storage_options,
                start_method=chunk_options.start_method,
            )
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    # 3. The metadata beside the chunks.
    skip_counts = dict(index.skip_counts)
    for reason, count in read_counts.items():
        skip_counts[reason] = skip_counts.get(reason, 0) + count
    skip_examples = index.skip_examples | read_examples
    options = index_options
    meta: dict[str, Any] = {
        "format": "seg_datamodule.stream",
        "version": SCHEMA_VERSION,
        "litdata_version": getattr(litdata, "__version__", "unknown"),
        "ann_file": str(ann_file),
        "images_root": str(index.image_root),
        "options": {"on_bad_sample": options.on_bad_sample, "drop_crowd": options.drop_crowd,
                    "drop_empty": options.drop_empty, "verify_images": options.verify_images,
                    "seed": chunk_options.seed, "chunk_bytes": chunk_options.chunk_bytes},
        "num_records": int(positions.size),
        "num_instances": int(sum(len(index.labels(int(i))) for i in positions)),
        "category_ids": [int(c) for c in index.category_ids],
        "class_names": list(index.class_names),
        "skip_counts": skip_counts,
        "skip_examples": skip_examples,
        "dropped_counts": dict(index.dropped_counts),
        "image_ids": [int(v) for v in index.image_ids],
        "heights": [int(v) for v in index.heights],
        "widths": [int(v) for v in index.widths],
        "positions": [int(i) for i in positions],
        "image_bytes": int(sum(os.path.getsize(index.file_path(int(i))) for i in positions)),
        "ann_file_bytes": int(os.path.getsize(ann_file)),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if (index.orientations != 1).any():  # an Ultralytics dataset's turned images
        meta["orientations"] = [int(v) for v in index.orientations]
    if not remote:
        meta["chunk_bytes_total"] = int(sum(p.stat().st_size for p in Path(out).iterdir() if p.name != META_FILE))
    _write_meta(meta, out, remote, storage_options)
    # 4. What was written must pass the reader's check (one schema: a drift fails here, not in training).
    check_stream_source(output_dir if remote else out, storage_options)
    return meta


def _write_meta(meta: dict[str, Any], out: str, remote: bool, storage_options: dict[str, Any] | None) -> None:
    text = json.dumps(meta)
    if not remote:
        tmp = Path(out) / f".{META_FILE}.tmp"
        tmp.write_text(text)
        tmp.replace(Path(out) / META_FILE)
        return
    # LitData's own filesystem providers (a private module; there is no public upload helper).
    from litdata.streaming.fs_provider import _get_fs_provider

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / META_FILE
        local.write_text(text)
        _get_fs_provider(out, storage_options).upload_file(str(local), f"{out.rstrip('/')}/{META_FILE}")
