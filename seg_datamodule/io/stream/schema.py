"""The record schema this version writes, and the checks that refuse any chunk set that is not it.

LitData picks each field's deserializer from the ``index.json`` beside the chunks
(``config.data_format``), so whoever can write that file chooses ``pickle`` and runs code in every
process that reads a chunk (issue 29). Nothing in a chunk set is trusted: :func:`check_index`
refuses an ``index.json`` whose ``data_format`` / ``data_spec`` is not exactly
:data:`RECORD_SCHEMA` (the int, bytes and ``no_header_numpy`` fields, in this order), whose reader
options would leave the plain path (compression, encryption, another item loader), or whose chunk
list names a file outside the dataset folder; :func:`check_meta` refuses a
:data:`META_FILE` that is not the metadata :func:`~seg_datamodule.io.stream.convert.convert_coco`
writes, of :data:`SCHEMA_VERSION`. Both are pure functions over parsed JSON; reading the files
(local or remote) is :mod:`seg_datamodule.io.stream.source`'s job. Nothing here imports LitData at
module level.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

import numpy as np

from seg_datamodule.errors import UserInputError

__all__ = [
    "INDEX_FILE", "META_FILE", "RECORD_DTYPES", "RECORD_INTS", "RECORD_SCHEMA", "SCHEMA_VERSION",
    "StreamFormatError", "check_index", "check_meta", "expected_data_format", "expected_data_spec", "parse_json",
]

#: Version of the record schema and of the metadata; readers refuse another. Bump it whenever
#: :data:`RECORD_SCHEMA` or the metadata's fields change. 2: the LVIS lists (issue 35); 3: the
#: instances' boxes (box-only instances, issue 41).
SCHEMA_VERSION = 3
#: Name of the metadata JSON written beside the chunks.
META_FILE = "seg_datamodule_stream.json"
#: LitData's index of the chunks (its ``_INDEX_FILENAME``).
INDEX_FILE = "index.json"

#: Every field of a record, in the order it is written, as ``(name, kind)``: ``"int"``,
#: ``"bytes"`` or the numpy dtype of a 1-D array (stored by LitData's ``no_header_numpy``).
#: ``index`` is the image's position in the ``CocoIndex`` the chunks were converted from (what
#: seeds its augmentation); ``vertices`` is ``(x0, y0, x1, y1, ...)`` in original pixels;
#: ``ring_offsets`` index vertices (not coordinates), ``instance_offsets`` index rings, as in
#: :class:`~seg_datamodule.structures.Polygons`; ``crowd_rle`` is the compressed COCO RLE
#: (pycocotools ``counts``) of the union of the image's crowd regions, empty when it has none;
#: ``neg_labels`` / ``not_exhaustive_labels`` are LVIS's federated lists as sorted labels
#: (``CocoIndex.neg_labels``), empty for a COCO file; ``bboxes`` is each instance's
#: ``[x, y, w, h]`` box, 4 numbers per instance (the only geometry of a box-only instance, one
#: without a ring, converted with ``box_only: keep``).
RECORD_SCHEMA: tuple[tuple[str, str | np.dtype], ...] = (
    ("index", "int"),
    ("image_id", "int"),
    ("height", "int"),
    ("width", "int"),
    ("image", "bytes"),
    ("vertices", np.dtype(np.float64)),
    ("ring_offsets", np.dtype(np.int64)),
    ("instance_offsets", np.dtype(np.int64)),
    ("labels", np.dtype(np.int64)),
    ("annotation_ids", np.dtype(np.int64)),
    ("bboxes", np.dtype(np.float64)),
    ("crowd_annotation_ids", np.dtype(np.int64)),
    ("crowd_rle", np.dtype(np.uint8)),
    ("neg_labels", np.dtype(np.int64)),
    ("not_exhaustive_labels", np.dtype(np.int64)),
)
#: The 1-D array fields and their forced dtypes (LitData fixes a dtype from the first record).
RECORD_DTYPES: dict[str, np.dtype] = {k: v for k, v in RECORD_SCHEMA if isinstance(v, np.dtype)}
#: The int fields of a record.
RECORD_INTS: tuple[str, ...] = tuple(k for k, v in RECORD_SCHEMA if isinstance(v, str) and v == "int")

# index.json `config` keys LitData 0.2.76 writes; those that change how chunks are read must be null
# (we never write them: decompression and decryption are more code run on untrusted bytes).
_CONFIG_NULL = ("compression", "compression_level", "compression_batch_size", "encryption", "ipc_compression")
_CONFIG_KEYS = frozenset({"chunk_bytes", "chunk_size", "data_format", "data_spec", "item_loader", "types",
                          *_CONFIG_NULL})
_CHUNK_KEYS = frozenset({"chunk_bytes", "chunk_size", "dim", "filename"})
# A chunk is a plain file name in the dataset folder: no separator, no `..`, no leading dot.
_CHUNK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\.bin")

# Of the metadata fields convert_coco writes, the one it writes for a local output only, and the
# EXIF orientations of an Ultralytics dataset's images (written when one is turned; absent: none is).
_META_OPTIONAL = frozenset({"chunk_bytes_total", "orientations"})


class StreamFormatError(UserInputError, ValueError):
    """A chunk set or its metadata is not what this version writes; nothing of it was deserialized.

    Args:
        message: the whole message (names the file and the field).
        path: the file (``index.json`` or :data:`META_FILE`, path or URL).
        field: the field, as ``config.data_format`` or ``chunks[3].filename``.
    """

    def __init__(self, message: str, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path, self.field = path, field


def _fail(where: str, field: str, what: str) -> StreamFormatError:
    return StreamFormatError(f"{where}: field {field!r}: {what}; refusing to stream it (nothing in it was read "
                             "beyond this JSON)", path=where, field=field)


def parse_json(text: str | bytes, where: str, field: str = "(file)") -> Any:
    """``json.loads`` that names the file (and the field holding the text) and refuses ``NaN`` / ``Infinity``.

    Raises:
        StreamFormatError: not UTF-8, not JSON, or nested too deep to parse.
    """
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as err:  # (UnicodeDecodeError is a ValueError)
        at = "" if field == "(file)" else f" field {field!r}:"
        raise StreamFormatError(f"{where}:{at} malformed JSON ({err}); refusing to stream it", path=where,
                                field=field) from None


def expected_data_format() -> list[str]:
    """``config.data_format`` of a chunk set of :data:`RECORD_SCHEMA`, as LitData 0.2.76 writes it."""
    from litdata.constants import _NUMPY_DTYPES_MAPPING  # the dtype index LitData's reader maps back

    index_of = {np.dtype(v): k for k, v in _NUMPY_DTYPES_MAPPING.items()}
    return [kind if isinstance(kind, str) else f"no_header_numpy:{index_of[kind]}" for _, kind in RECORD_SCHEMA]


def expected_data_spec() -> Any:
    """``config.data_spec`` (parsed) of a record: torch's pytree spec of a dict of the schema's keys."""
    from torch.utils._pytree import tree_structure, treespec_dumps

    return json.loads(treespec_dumps(tree_structure({name: 0 for name, _ in RECORD_SCHEMA})))


def _spec_keys(spec: Any) -> list[Any] | None:
    """The dict keys of a parsed pytree spec ``[protocol, {"type": "builtins.dict", ...}]``, else None."""
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], dict)):
        return None
    node = spec[1]
    if node.get("type") != "builtins.dict" or not isinstance(node.get("context"), str):
        return None
    try:
        keys = json.loads(node["context"])
    except (ValueError, RecursionError):
        return None
    return keys if isinstance(keys, list) else None


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_schema(config: Mapping[str, Any], where: str) -> None:
    """``data_spec`` then ``data_format``: exactly the schema's keys, in order, with its serializers."""
    want_keys = [name for name, _ in RECORD_SCHEMA]
    spec = config.get("data_spec")
    parsed = parse_json(spec, where, "config.data_spec") if isinstance(spec, str) else None
    keys = _spec_keys(parsed)
    if keys != want_keys:
        if keys is None:
            what = f"is not a pytree spec of a dict, got {str(spec)[:120]!r}"
        else:
            extra = [k for k in keys if k not in want_keys]
            missing = [k for k in want_keys if k not in keys]
            why = (f"unexpected {extra}" if extra else "") + ("; " if extra and missing else "") + (
                f"missing {missing}" if missing else "")
            what = f"record keys {keys} ({why or 'the same keys in another order'})"
        raise _fail(where, "config.data_spec", f"{what}; the record schema version {SCHEMA_VERSION} has keys "
                                                f"{want_keys} in this order")
    if parsed != expected_data_spec():
        raise _fail(where, "config.data_spec", "is not the pytree spec of a flat dict of the record schema version "
                                                f"{SCHEMA_VERSION} (nested or typed leaves)")
    formats, want = config.get("data_format"), expected_data_format()
    if not isinstance(formats, list) or len(formats) != len(want):
        raise _fail(where, "config.data_format", f"must list {len(want)} serializers, got {str(formats)[:120]!r}")
    for name, got, expected in zip(want_keys, formats, want):
        if got != expected:
            raise _fail(where, "config.data_format", f"record field {name!r} is stored with LitData serializer "
                                                      f"{got!r}; the record schema version {SCHEMA_VERSION} stores "
                                                      f"it as {expected!r}")


def check_index(index: Any, where: str) -> int:
    """Refuse an ``index.json`` that is not a chunk set of :data:`RECORD_SCHEMA` in one folder.

    Args:
        index: the parsed ``index.json``.
        where: the file (path or URL), for messages.

    Returns:
        int: the number of records the chunks hold (the sum of their ``chunk_size``).

    Raises:
        StreamFormatError: naming ``where`` and the field: not an object with ``config`` and
            ``chunks``; a ``data_spec`` with an extra, a missing or a reordered key; a
            ``data_format`` with another serializer (``pickle``, ``numpy``, ...) or dtype; a reader
            option set (compression, encryption, another item loader, an unknown key); a chunk
            whose ``filename`` is not a plain ``*.bin`` name in the folder (absolute, ``..``, a
            separator); a chunk listed twice; a size that is not a non-negative int.
    """
    if not isinstance(index, dict) or set(index) - {"chunks", "config", "updated_at"}:
        got = sorted(index) if isinstance(index, dict) else type(index).__name__
        raise _fail(where, "(top level)", f"must be an object with 'chunks', 'config' (and 'updated_at'), got {got}")
    config, chunks = index.get("config"), index.get("chunks")
    if not isinstance(config, dict):
        raise _fail(where, "config", f"must be an object, got {type(config).__name__}")
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:
        raise _fail(where, f"config.{unknown[0]}", "is not a key this version writes")
    _check_schema(config, where)
    for key in _CONFIG_NULL:
        if config.get(key) is not None:
            raise _fail(where, f"config.{key}", f"must be null (this version writes none), got {config[key]!r}")
    if config.get("item_loader") != "PyTreeLoader":
        raise _fail(where, "config.item_loader", f"must be 'PyTreeLoader', got {config.get('item_loader')!r}")
    if not isinstance(chunks, list) or not chunks:
        raise _fail(where, "chunks", f"must be a non-empty list, got {str(chunks)[:80]!r}")
    names: set[str] = set()
    total = 0
    for k, chunk in enumerate(chunks):
        field = f"chunks[{k}]"
        if not isinstance(chunk, dict) or set(chunk) != _CHUNK_KEYS:
            got = sorted(chunk) if isinstance(chunk, dict) else type(chunk).__name__
            raise _fail(where, field, f"must be an object with keys {sorted(_CHUNK_KEYS)}, got {got}")
        name = chunk["filename"]
        if not isinstance(name, str) or not _CHUNK_NAME.fullmatch(name) or ".." in name:
            raise _fail(where, f"{field}.filename", f"{name!r} is not a plain *.bin file name in the dataset folder "
                                                     "(absolute, '..' or a path separator)")
        if name in names:
            raise _fail(where, f"{field}.filename", f"{name!r} is listed twice")
        names.add(name)
        for key in ("chunk_size", "chunk_bytes"):
            if not _is_int(chunk[key]):
                raise _fail(where, f"{field}.{key}", f"must be a non-negative int, got {chunk[key]!r}")
        if chunk["dim"] is not None:
            raise _fail(where, f"{field}.dim", f"must be null, got {chunk['dim']!r}")
        total += chunk["chunk_size"]
    return total


def _int_list(meta: Mapping[str, Any], key: str, where: str, low: int = 0) -> list[int]:
    value = meta[key]
    if not isinstance(value, list) or not all(_is_int(v, low) for v in value):
        raise _fail(where, key, f"must be a list of ints >= {low}")
    return value


def _counts(meta: Mapping[str, Any], key: str, where: str) -> None:
    value = meta[key]
    if not isinstance(value, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in value.items()):
        raise _fail(where, key, "must map reasons (str) to counts (ints >= 0)")


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """Refuse a :data:`META_FILE` that is not the metadata :func:`~seg_datamodule.io.stream.convert.convert_coco` writes, of this version.

    Args:
        meta: the parsed file.
        where: the file (path or URL), for messages.

    Returns:
        dict: ``meta`` itself, checked.

    Raises:
        StreamFormatError: naming ``where`` and the field: another format or schema version (both
            versions named), a missing or unknown field, a field of the wrong type, image lists of
            different lengths, a position outside them or listed twice, class names that do not
            match the category ids.
    """
    if not isinstance(meta, dict):
        raise _fail(where, "(top level)", f"must be an object, got {type(meta).__name__}")
    if meta.get("format") != "seg_datamodule.stream":
        raise _fail(where, "format", f"must be 'seg_datamodule.stream', got {meta.get('format')!r}")
    if meta.get("version") != SCHEMA_VERSION or not _is_int(meta.get("version")):
        older = _is_int(meta.get("version")) and meta["version"] < SCHEMA_VERSION
        why = " (version 2 added LVIS's neg / not-exhaustive category lists to every record)" if older else ""
        raise _fail(where, "version", f"the chunks were written by schema version {meta.get('version')!r}; this "
                                      f"package reads version {SCHEMA_VERSION}{why}: convert them again with "
                                      "seg-datamodule convert")
    types: dict[str, type | tuple[type, ...]] = {
        "litdata_version": str, "ann_file": str, "images_root": str, "options": dict, "num_records": int,
        "num_instances": int, "category_ids": list, "class_names": list, "skip_counts": dict,
        "skip_examples": dict, "dropped_counts": dict, "image_ids": list, "heights": list, "widths": list,
        "positions": list, "image_bytes": int, "ann_file_bytes": int, "seconds": (int, float),
        "chunk_bytes_total": int, "orientations": list,
    }
    known = {"format", "version", *types}
    unknown = sorted(set(meta) - known)
    if unknown:
        raise _fail(where, unknown[0], f"is not a field of schema version {SCHEMA_VERSION}")
    for key, kind in types.items():
        if key not in meta:
            if key in _META_OPTIONAL:
                continue
            raise _fail(where, key, "is missing")
        value = meta[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise _fail(where, key, f"must be {getattr(kind, '__name__', 'a number')}, got {type(value).__name__}")
    ids, heights, widths = (_int_list(meta, k, where, low) for k, low in
                            (("image_ids", 0), ("heights", 1), ("widths", 1)))
    if not len(ids) == len(heights) == len(widths):
        raise _fail(where, "heights", f"image_ids, heights and widths differ in length: {len(ids)}, "
                                      f"{len(heights)}, {len(widths)}")
    if len(set(ids)) != len(ids):
        raise _fail(where, "image_ids", "lists an image id twice")
    if "orientations" in meta and (len(_int_list(meta, "orientations", where, 1)) != len(ids)
                                   or any(o > 8 for o in meta["orientations"])):
        raise _fail(where, "orientations", f"must be {len(ids)} EXIF orientations 1..8, one per image")
    positions = _int_list(meta, "positions", where)
    if len(set(positions)) != len(positions) or any(p >= len(ids) for p in positions):
        raise _fail(where, "positions", f"must be distinct positions below {len(ids)}")
    if meta["num_records"] != len(positions) or not positions:
        raise _fail(where, "num_records", f"is {meta['num_records']} but {len(positions)} positions are listed")
    categories = _int_list(meta, "category_ids", where)
    names = meta["class_names"]
    if len(names) != len(categories) or not all(isinstance(n, str) for n in names):
        raise _fail(where, "class_names", f"must be {len(categories)} strings, one per category id")
    for key in ("skip_counts", "dropped_counts"):
        _counts(meta, key, where)
    examples = meta["skip_examples"]
    if not all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in examples.values()):
        raise _fail(where, "skip_examples", "must map reasons to lists of messages")
    return meta
