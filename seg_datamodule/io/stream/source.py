"""Reading a converted dataset's two JSON files (local or remote) and refusing one that is not ours.

A stream source is a plain folder (read in place), ``local:/folder`` (copied through LitData's
cache) or a bucket URL (``s3://``, ``gs://``, ``r2://``). :func:`check_stream_source` reads
:data:`~seg_datamodule.io.stream.schema.META_FILE` and LitData's ``index.json`` itself, through
the same storage options LitData's own downloader uses (boto3 for ``s3://``), and checks both with
:mod:`seg_datamodule.io.stream.schema` before LitData constructs anything that reads the config
or a chunk. For a local folder it also refuses a chunk file that resolves outside the folder (a
symbolic link). LitData itself is imported only for a remote source.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from seg_datamodule.io.stream.schema import (
    INDEX_FILE,
    META_FILE,
    StreamFormatError,
    check_index,
    check_meta,
    parse_json,
)

__all__ = [
    "check_stream_index", "check_stream_source", "read_source_json", "read_stream_index", "read_stream_meta", "remote_error", "split_source",
]

_REMOTE = ("s3://", "gs://", "r2://", "azure://", "hf://")
# The schemes LitData 0.2.76 has a file provider for (litdata.streaming.fs_provider._get_fs_provider).
_READABLE_REMOTE = ("s3://", "gs://", "r2://")


def split_source(source: str) -> tuple[str, bool]:
    """``(path or url, remote)`` of a stream source: ``local:/path``, ``s3://...``, or a plain path."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"a stream source must be a str, got {type(source).__name__}")
    source = os.fspath(source)
    if source.startswith("local:"):
        return source[len("local:"):], False
    return source, source.startswith(_REMOTE)


def _file_of(source: str, name: str) -> tuple[str, bool]:
    path, remote = split_source(source)
    return (f"{path.rstrip('/')}/{name}" if remote else str(Path(path) / name)), remote


def read_source_json(source: str, name: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The parsed JSON file ``name`` of a stream source, and the file's path or URL (for messages).

    Raises:
        FileNotFoundError: the file (or its bucket) is not there (naming it).
        ConnectionError, PermissionError, OSError: a remote read failed (see :func:`remote_error`).
        StreamFormatError: it is not JSON, or the scheme is one this check cannot read.
    """
    where, remote = _file_of(source, name)
    if not remote:
        try:
            return parse_json(Path(where).read_bytes(), where), where
        except FileNotFoundError:
            raise FileNotFoundError(f"{where} not found: {source} was not written by seg_datamodule's "
                                    "convert") from None
    if not where.startswith(_READABLE_REMOTE):
        raise StreamFormatError(f"{where}: cannot read it to check the chunks before streaming; stream from a local "
                                f"folder or one of {list(_READABLE_REMOTE)}", path=where, field="(file)")
    # LitData's own provider: the S3 client it streams with, built from the same storage options.
    from litdata.streaming.fs_provider import _get_fs_provider

    from seg_datamodule.io.stream.endpoint import s3_storage_options

    options = s3_storage_options(where, storage_options)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / name
        provider = _get_fs_provider(where, options)
        try:
            provider.download_file(where, str(local))
        except Exception as err:  # boto3 / google raise their own types; classified by remote_error
            raise remote_error(where, err, options, f"{source} was not written by seg_datamodule's convert, "
                                                    "or the storage options are wrong",
                               bucket_missing=_bucket_missing(provider, where)) from err
        return parse_json(local.read_bytes(), where), where


def _bucket_missing(provider: Any, url: str) -> bool:
    """Whether an ``s3://`` URL's bucket answers 404 (a HEAD on an object cannot tell bucket from key)."""
    client = getattr(getattr(provider, "client", None), "client", None)
    if not url.startswith("s3://") or client is None:
        return False
    try:
        client.head_bucket(Bucket=url[len("s3://"):].split("/", 1)[0])
    except Exception as err:
        return (getattr(err, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") == 404
    return False


def remote_error(url: str, err: BaseException, storage_options: dict[str, Any] | None = None,
                 hint: str = "", bucket_missing: bool = False) -> OSError:
    """An error naming ``url``, the endpoint and what failed, typed by what failed.

    Returns:
        OSError: ``ConnectionError`` (endpoint unreachable), ``PermissionError`` (credentials
        refused), ``FileNotFoundError`` (no such bucket or object), else ``OSError``.
    """
    from seg_datamodule.io.stream.endpoint import endpoint_of

    endpoint = endpoint_of(storage_options) or "the default AWS endpoint"
    response = getattr(err, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    text = f"{type(err).__name__}: {err}"
    kind: type[OSError]
    if bucket_missing or code == "NoSuchBucket":
        kind, what = FileNotFoundError, "the bucket does not exist"
    elif code in ("NoSuchKey", "404", "NotFound") or status == 404 or "NotFound" in type(err).__name__:
        kind, what = FileNotFoundError, "no such object (a missing prefix, or deleted)"
    elif code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken") \
            or status == 403 or "Unauthenticated" in type(err).__name__ or "PermissionDenied" in type(err).__name__:
        kind, what = PermissionError, "the credentials were refused"
    elif "Connect" in type(err).__name__ or "connect" in str(err).lower():
        kind, what = ConnectionError, f"the endpoint {endpoint} cannot be reached"
    else:
        kind, what = OSError, "the request failed"
    return kind(f"{url} cannot be read from {endpoint}: {what} ({text})" + (f": {hint}" if hint else ""))


def read_stream_meta(source: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata beside a converted dataset's chunks, schema-checked (downloaded for a remote source).

    Raises:
        FileNotFoundError: no :data:`META_FILE` there (not written by ``convert_coco``).
        StreamFormatError: not this version's metadata (see
            :func:`~seg_datamodule.io.stream.schema.check_meta`).
    """
    meta, where = read_source_json(source, META_FILE, storage_options)
    return check_meta(meta, where)


def _check_local_chunks(folder: str, index: dict[str, Any], where: str) -> None:
    """Every chunk file that exists must resolve inside ``folder`` (no symbolic link out of it)."""
    root = os.path.realpath(folder)
    for k, chunk in enumerate(index["chunks"]):
        path = os.path.join(folder, chunk["filename"])
        if os.path.lexists(path) and os.path.dirname(os.path.realpath(path)) != root:
            raise StreamFormatError(
                f"{where}: field 'chunks[{k}].filename': {chunk['filename']!r} resolves to "
                f"{os.path.realpath(path)}, outside the dataset folder {root}; refusing to stream it",
                path=where, field=f"chunks[{k}].filename")


def read_stream_index(source: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A source's ``index.json``, read and checked (see :func:`~seg_datamodule.io.stream.schema.check_index`).

    Returns:
        dict: the checked index (its ``chunks`` give each chunk's ``chunk_size``, in LitData's order).

    Raises:
        FileNotFoundError: no ``index.json`` (LitData would build one from whatever else is there).
        StreamFormatError: naming the file and the field.
    """
    index, where = read_source_json(source, INDEX_FILE, storage_options)
    check_index(index, where)
    path, remote = split_source(source)
    if not remote:
        _check_local_chunks(path, index, where)
    return index


def check_stream_index(source: str, storage_options: dict[str, Any] | None = None) -> int:
    """Read and check a source's ``index.json`` (:func:`read_stream_index`).

    Returns:
        int: the number of records its chunks hold.

    Raises:
        FileNotFoundError: no ``index.json`` (LitData would build one from whatever else is there).
        StreamFormatError: naming the file and the field.
    """
    return sum(int(chunk["chunk_size"]) for chunk in read_stream_index(source, storage_options)["chunks"])


def check_stream_source(source: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a converted dataset's metadata and ``index.json`` before anything of it is streamed.

    Args:
        source: a folder, ``local:/folder`` or a bucket URL.
        storage_options: what LitData is given for a remote source (boto3's client arguments;
            completed by :func:`~seg_datamodule.io.stream.endpoint.s3_storage_options`).

    Returns:
        dict: the checked metadata.

    Raises:
        FileNotFoundError: a file is missing.
        StreamFormatError: either file is not what this version writes, or they disagree on the
            number of records (chunks and metadata from different conversions).
    """
    meta = read_stream_meta(source, storage_options)
    total = check_stream_index(source, storage_options)
    if total != meta["num_records"]:
        where = _file_of(source, INDEX_FILE)[0]
        raise StreamFormatError(f"{where}: field 'chunks': the chunks hold {total} records but {META_FILE} says "
                                f"{meta['num_records']} (written by different conversions?); refusing to stream it",
                                path=where, field="chunks")
    return meta
