"""Reading image files safely: regular files only, bounded, every failure a named error.

Two readers with the same checks and errors: :func:`read_image_file` returns the file as
``bytes`` (kept as long as the caller likes), :func:`read_image_view` reads it with one
``readv`` into this thread's reused buffer and returns a read-only view of it, valid until the
thread's next :func:`read_image_view`: for a caller that decodes the bytes at once, it saves
allocating (and the kernel zeroing the pages of) a fresh ~160 KB object per image
(``benchmarks/bench_read.py``).

Only a regular file is opened for reading (a FIFO, a device or a folder is refused, also through
a symlink; the open never blocks), and at most :data:`MAX_IMAGE_BYTES` bytes (or the caller's
limit) are read.
"""

from __future__ import annotations

import os
import stat
import threading

from seg_datamodule.io.images.errors import BadImageError

__all__ = ["MAX_IMAGE_BYTES", "read_image_file", "read_image_view"]

#: Largest image file read, in bytes (a COCO JPEG is ~160 KB; a 2^30-pixel PNG fits).
MAX_IMAGE_BYTES = 1 << 30

#: Largest file whose buffer a thread keeps for the next read (a bigger one gets a buffer of its own).
_KEEP_BUFFER_BYTES = 1 << 26

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _describe(name: str) -> str:
    return f"image file {name}"


def _unreadable(name: str, err: OSError | ValueError) -> BadImageError:
    detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return BadImageError(f"{_describe(name)} cannot be read: {detail}", path=name, reason="image_unreadable")


def _open_regular(name: str, limit: int) -> tuple[int, int]:
    """Open ``name`` for reading when it is a regular file of at most ``limit`` bytes.

    Returns:
        (the file descriptor, the size ``fstat`` reports); the caller closes the descriptor.

    Raises:
        BadImageError: ``reason`` ``image_missing`` or ``image_unreadable``.
    """
    try:
        fd = os.open(name, _OPEN_FLAGS)
    except FileNotFoundError:
        raise BadImageError(f"{_describe(name)} does not exist", path=name, reason="image_missing") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the name
        raise _unreadable(name, err) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadImageError(
                f"{_describe(name)} cannot be read: not a regular file", path=name, reason="image_unreadable"
            )
        if st.st_size > limit:
            raise BadImageError(
                f"{_describe(name)} is {st.st_size} bytes, over the limit of {limit}",
                path=name,
                reason="image_unreadable",
            )
    except OSError as err:
        os.close(fd)
        raise _unreadable(name, err) from None
    except BadImageError:
        os.close(fd)
        raise
    return fd, st.st_size


def _over_limit(name: str, limit: int) -> BadImageError:
    return BadImageError(f"{_describe(name)} is over {limit} bytes, the limit", path=name, reason="image_unreadable")


def read_image_file(path: str | os.PathLike[str], *, max_bytes: int | None = None, head: int | None = None) -> bytes:
    """The bytes of an image file, read safely.

    Only a regular file is read (a FIFO, a device or a folder is refused, also through a
    symlink; the open never blocks), and at most ``max_bytes`` bytes.

    Args:
        path (str | PathLike): the image file.
        max_bytes (int | None): the limit; None: :data:`MAX_IMAGE_BYTES`.
        head (int | None): read only the first ``head`` bytes (a header; the file may be longer).

    Returns:
        the file's content (or its first ``head`` bytes).

    Raises:
        BadImageError: ``reason`` ``image_missing`` or ``image_unreadable`` (an OS error, not a
            regular file, over the limit); the message names ``path``.
    """
    name = os.fspath(path)
    limit = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    fd, _ = _open_regular(name, limit)
    try:
        chunks, left = [], limit + 1 if head is None else head  # a file growing while read is still bounded
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as err:
        raise _unreadable(name, err) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if head is None and len(data) > limit:
        raise _over_limit(name, limit)
    return data


class _ThreadBuffer(threading.local):
    """Each thread's buffer for :func:`read_image_view` (replaced, never resized: views may hold it)."""

    def __init__(self) -> None:
        self.data = bytearray()


_buffer = _ThreadBuffer()


def _buffer_for(size: int) -> bytearray:
    """This thread's buffer, or a larger new one (kept for the next read unless it is huge)."""
    if len(_buffer.data) >= size:
        return _buffer.data
    fresh = bytearray(max(size, 2 * len(_buffer.data), 1 << 20))
    if size <= _KEEP_BUFFER_BYTES:
        _buffer.data = fresh
    return fresh


def read_image_view(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> memoryview:
    """The bytes of an image file, read safely in one call into this thread's reused buffer.

    The same checks and errors as :func:`read_image_file`. The file is read with one ``readv``
    of the size ``fstat`` reports when it is opened (bytes appended later are not read); a file
    that reads short of it, or one whose size ``fstat`` does not know, is read on to its end.

    Args:
        path (str | PathLike): the image file.
        max_bytes (int | None): the limit; None: :data:`MAX_IMAGE_BYTES`.

    Returns:
        memoryview (read-only, format ``B``): the file's content. It is overwritten by this
        thread's next :func:`read_image_view`: decode it (or copy it) before reading another file.

    Raises:
        BadImageError: ``reason`` ``image_missing`` or ``image_unreadable`` (an OS error, not a
            regular file, over the limit); the message names ``path``.
    """
    name = os.fspath(path)
    limit = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    fd, size = _open_regular(name, limit)
    try:
        buffer = _buffer_for(size)
        got = os.readv(fd, [memoryview(buffer)[:size]]) if size else 0
        if got != size or size == 0:  # a short read, or a size fstat does not know (0: e.g. procfs)
            while got <= limit:
                if got == len(buffer):
                    grown = _buffer_for(2 * len(buffer) + 1)
                    grown[:got] = buffer[:got]
                    buffer = grown
                step = os.readv(fd, [memoryview(buffer)[got : min(len(buffer), limit + 1)]])
                if step == 0:
                    break
                got += step
    except OSError as err:
        raise _unreadable(name, err) from None
    finally:
        os.close(fd)
    if got > limit:
        raise _over_limit(name, limit)
    return memoryview(buffer)[:got].toreadonly()
