"""The index cache: where it lives, its key, reading (checked) and writing (atomic) it.

The built arrays are saved as one uncompressed ``.npz`` in ``cache_dir`` (default ``coco_index/``
in :func:`~seg_datamodule.io.paths.cache_root`: ``$SEG_DATAMODULE_CACHE``, else
``$XDG_CACHE_HOME/seg_datamodule``, else ``~/.cache/seg_datamodule``; datasets are often
read-only), named after the annotation file's stem and a hash of its absolute path. Inside, the
key is the absolute path, the file's size, ``st_mtime_ns``, ``st_ctime_ns`` and inode, and the
format version: a file that changed is rebuilt and the cache overwritten; a cache that fails to
read (truncated, a member compressed or of another size than its header says) is rebuilt too.
Writes are atomic (temporary file + ``os.replace``), so ranks that build at once do not tear it.
Hashing the content instead would cost ~1 s per start on a 600 MB file; for the same reason the
arrays are read straight into place (:func:`_read_member`: one ``readinto`` per array), not
through :func:`numpy.load`'s zip reader, whose CRC pass over every byte cost 1.2 s of a 5 s warm
start on a 422 MiB index. Instead each array's sum and XOR of its 64-bit words, kept in the
metadata (:func:`array_checksum`, at memory speed), catch a damaged byte.

Nothing in a cache file is trusted: what is read is checked
(:func:`~seg_datamodule.io.coco.tables.check_tables`: keys, dtypes, offsets, label range,
lengths, file names) and rebuilt with a warning when anything fails. Folders and files are
created readable by their owner only; orphan temporary files of a killed writer are removed by
the next writer; a symlink at the lock path is not followed. When the cache cannot be used at
all (a read-only or uncreatable folder, ``cache_dir`` naming a file), the index is built in
memory with one warning.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from seg_datamodule.io.coco.tables import TABLE_KEYS, check_tables
from seg_datamodule.io.paths import cache_root, file_lock, make_private_dirs

__all__ = ["CACHE_FORMAT_VERSION", "array_checksum", "cached_tables", "cached_tables_at", "default_cache_dir", "read_cache",
           "read_cache_where", "write_cache"]

Tables = tuple[dict[str, np.ndarray], dict[str, Any]]

_log = logging.getLogger(__name__)
_warned_folders: set[str] = set()  # cache folders found unusable in this process

#: Bump when the cached arrays change meaning; older caches are then rebuilt.
CACHE_FORMAT_VERSION = 6  # 2: LVIS's per-image neg / not-exhaustive label lists; 3: orientations, box_only;
# 4: box-only annotations stored as instances without a ring; 5: a checksum of every array in the metadata;
# 6: the ids of the images an annotation was skipped from (skipped_image_ids)


def default_cache_dir() -> Path:
    """Where indexes are cached when ``cache_dir`` is None: ``cache_root() / "coco_index"``."""
    return cache_root() / "coco_index"


def cache_key(ann_file: Path) -> dict[str, Any]:
    """What must match for a cache to serve ``ann_file``: format version, path, size, times, inode."""
    st = ann_file.stat()
    return {
        "version": CACHE_FORMAT_VERSION, "ann_file": str(ann_file), "size": st.st_size,
        # A copy that keeps the old mtime (cp -p, rsync -a) still changes ctime and the inode.
        "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
    }


def cache_path(cache_dir: Path, ann_file: Path) -> Path:
    """The cache file of ``ann_file`` in ``cache_dir``: its stem and a hash of its absolute path."""
    digest = hashlib.sha256(str(ann_file).encode("utf-8")).hexdigest()[:16]
    return cache_dir / f"{ann_file.stem}-{digest}.npz"


def read_cache(path: Path, key: Mapping[str, Any]) -> Tables | None:
    """The cached tables, or None when absent, stale or unreadable (then it is rebuilt)."""
    return read_cache_where(path, lambda meta: meta.get("key") == dict(key))


def read_cache_where(path: Path, accept: Callable[[dict[str, Any]], bool]) -> Tables | None:
    """The cached tables when ``accept(meta)`` says the cache still serves (its metadata, read first), else None.

    Args:
        path: the cache file.
        accept: True when the cache's metadata (its ``key`` and whatever its writer recorded)
            matches the source; it must not raise. :func:`read_cache` compares the key.

    Returns:
        (tables, meta), or None when absent, stale, unreadable or failing its checks.
    """
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            members = _stored_members(f)
            meta = json.loads(_read_member(f, members["meta"]).tobytes().decode("utf-8"))
            if not isinstance(meta, dict) or not accept(meta):
                _log.info("index cache %s is stale (its source changed); rebuilding", path)
                return None
            missing = [k for k in TABLE_KEYS if k not in members]
            tables = {k: _read_member(f, members[k]) for k in TABLE_KEYS if k not in missing}
            sums = meta.get("checksums", {})
            damaged = [k for k, v in tables.items() if sums.get(k) != array_checksum(v)]
            if damaged:
                raise ValueError(f"arrays {damaged} fail their checksums")
    except Exception as err:  # noqa: BLE001 - any failure to read means: rebuild
        _log.warning("index cache %s is unreadable (%s: %s); rebuilding", path, type(err).__name__, err)
        return None
    problem = f"arrays {missing} missing" if missing else check_tables(tables, meta)
    if problem is not None:
        _log.warning("index cache %s fails its checks (%s); rebuilding", path, problem)
        return None
    return tables, meta


def array_checksum(array: np.ndarray) -> str:
    """The sum and the XOR of an array's bytes read as 64-bit words (and its tail bytes), as hex.

    Not a cryptographic hash: it tells a damaged byte (any single changed byte changes the sum)
    at memory speed, where a CRC over a 422 MiB index costs a second.
    """
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    cut = len(data) // 8 * 8
    words = data[:cut].view("<u8")
    total = int(words.sum(dtype=np.uint64)) if cut else 0
    xor = int(np.bitwise_xor.reduce(words)) if cut else 0
    return f"{total:x}.{xor:x}.{data[cut:].tobytes().hex()}"


def _stored_members(f: Any) -> dict[str, tuple[int, int]]:
    """The ``.npy`` members of an uncompressed ``.npz`` (what :func:`write_cache` writes): name -> (data start, size).

    Raises:
        ValueError: a member is compressed, or its local header is not where the directory says.
    """
    members = {}
    with zipfile.ZipFile(f) as archive:  # reads the central directory only
        infos = archive.infolist()
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
            raise ValueError(f"member {info.filename!r} is not a stored .npy array")
        f.seek(info.header_offset)
        local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"member {info.filename!r}: no local header at {info.header_offset}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        members[info.filename[:-4]] = (info.header_offset + 30 + name_len + extra_len, info.file_size)
    return members


def _read_member(f: Any, member: tuple[int, int]) -> np.ndarray:
    """One ``.npy`` member read straight into a new array (no pickle: object dtypes are refused)."""
    start, size = member
    f.seek(start)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(f)
    if dtype.hasobject:
        raise ValueError("an array of Python objects")
    out = np.empty(shape[::-1] if fortran_order else shape, dtype)
    if f.tell() - start + out.nbytes != size:
        raise ValueError(f"an array of {out.nbytes} bytes in a member of {size}")
    view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise ValueError("the file ends inside an array")
        done += n
    return out.T if fortran_order else out


def write_cache(path: Path, tables: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bool:
    """Write the cache atomically; False (and a warning) when it cannot be written."""
    try:
        make_private_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                sums = {k: array_checksum(tables[k]) for k in TABLE_KEYS}
                blob = np.frombuffer(json.dumps({**meta, "checksums": sums}).encode("utf-8"), np.uint8)
                np.savez(f, meta=blob, **{k: tables[k] for k in TABLE_KEYS})
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        _log.warning("cannot write the index cache %s (%s); continuing without it", path, err)
        return False
    return True


def cached_tables(
    ann_file: Path, cache_dir: Path | None, build: Callable[[], Tables]
) -> tuple[Tables, bool, Path | None]:
    """The tables of ``ann_file`` from the cache, or built by ``build()`` and cached.

    Args:
        ann_file: the annotation file (absolute).
        cache_dir: folder of the cache; None: :func:`default_cache_dir`.
        build: makes the tables from the JSON.

    Returns:
        ((tables, meta), whether they came from the cache, the cache file or None when none was
        written).
    """
    path = cache_path(cache_dir if cache_dir is not None else default_cache_dir(), ann_file)
    return cached_tables_at(path, cache_key(ann_file), build)


def cached_tables_at(path: Path, key: Mapping[str, Any], build: Callable[[], Tables]) -> tuple[Tables, bool, Path | None]:
    """The tables cached at ``path`` under ``key``, or built by ``build()`` and cached there.

    What :func:`cached_tables` does for an annotation file, for a source with its own key (an
    Ultralytics dataset's key covers its label files and images, :mod:`seg_datamodule.io.yolo`).

    Returns:
        ((tables, meta), whether they came from the cache, the cache file or None when none was
        written).
    """
    loaded = read_cache(path, key)
    if loaded is not None:
        return loaded, True, path
    with contextlib.ExitStack() as stack:
        try:
            # DDP ranks (and the CLI, which reads num_classes in every rank) start together: one
            # builds, the others wait and read its cache instead of each parsing the JSON.
            stack.enter_context(file_lock(path.with_name(path.name + ".lock")))
        except OSError as err:
            # Once per folder and process: the train and val indexes of one setup share it.
            level = logging.INFO if str(path.parent) in _warned_folders else logging.WARNING
            _warned_folders.add(str(path.parent))
            _log.log(
                level,
                "cannot use the index cache folder %s (%s); building the index in memory, which "
                "repeats at every start (set cache_dir to a writable folder, or use_cache=False)",
                path.parent, err,
            )
            return build(), False, None
        loaded = read_cache(path, key)
        if loaded is not None:
            return loaded, True, path
        _remove_orphans(path)
        tables, meta = build()
        meta = {**meta, "key": key}
        written = write_cache(path, tables, meta)
    return (tables, meta), False, path if written else None


def _remove_orphans(path: Path) -> None:
    """Remove temporary files a writer killed mid-write left (the lock holder is the only writer)."""
    for orphan in path.parent.glob(glob.escape(path.name) + ".*.tmp"):
        with contextlib.suppress(OSError):
            orphan.unlink()
