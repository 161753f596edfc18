"""Reading image files: the bytes reader and the reused-buffer reader give the same bytes and errors."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seg_datamodule.io.images.files as image_files
from seg_datamodule.io.images.files import read_image_file, read_image_view
from seg_datamodule.io.images.decode import BadImageError, _last_eoi, decode_image_bytes, decode_image_with_size

READERS: dict[str, Callable[..., object]] = {"bytes": read_image_file, "view": read_image_view}


@pytest.mark.parametrize("size", [0, 1, 4095, 1 << 20, (1 << 20) + 1, 3 << 20])
def test_the_view_holds_the_file(tmp_path: Path, size: int) -> None:
    content = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(content)
    view = read_image_view(path)
    assert isinstance(view, memoryview) and view.readonly and view.format == "B"
    assert bytes(view) == content == read_image_file(path)


def test_the_buffer_is_reused_and_overwritten(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a" * 1000)
    (tmp_path / "b").write_bytes(b"b" * 10)
    first = read_image_view(tmp_path / "a")
    second = read_image_view(tmp_path / "b")
    assert first.obj is second.obj  # one buffer: no allocation per file
    assert bytes(second) == b"b" * 10
    assert bytes(first[:12]) == b"b" * 10 + b"aa"  # as documented: valid until the next read


def test_a_huge_file_gets_a_buffer_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_files, "_KEEP_BUFFER_BYTES", 1 << 21)
    small, huge = tmp_path / "small", tmp_path / "huge"
    small.write_bytes(b"s" * 100)
    huge.write_bytes(b"h" * (3 << 20))
    kept = read_image_view(small).obj
    assert bytes(read_image_view(huge)) == b"h" * (3 << 20)
    assert read_image_view(small).obj is kept


def test_short_reads_are_read_on_to_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file system may return less than asked; the reader keeps going (and grows its buffer).
    content = np.random.default_rng(1).integers(0, 256, (3 << 20) + 5, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(content)
    real_readv = os.readv
    calls: list[int] = []

    def short_readv(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers[0]))
        return real_readv(fd, [buffers[0][:100_000]])

    monkeypatch.setattr(image_files.os, "readv", short_readv)
    assert bytes(read_image_view(path)) == content
    assert len(calls) > len(content) // 100_000


def test_a_file_longer_than_fstat_said_is_still_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file growing between fstat and read (here: fstat reporting 10 bytes of 5000).
    path = tmp_path / "f.bin"
    path.write_bytes(b"g" * 5000)
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd))
        fields[6] = 10  # st_size
        return os.stat_result(fields)

    monkeypatch.setattr(image_files.os, "fstat", stale_fstat)
    assert bytes(read_image_view(path)) == b"g" * 10  # what fstat said when it was opened

    def unknown_size(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd))
        fields[6] = 0
        return os.stat_result(fields)

    monkeypatch.setattr(image_files.os, "fstat", unknown_size)  # size unknown: read to the end...
    assert bytes(read_image_view(path)) == b"g" * 5000
    with pytest.raises(BadImageError, match="f.bin is over 4999 bytes, the limit") as info:  # ...within the limit
        read_image_view(path, max_bytes=4999)
    assert info.value.reason == "image_unreadable"


@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="needs procfs")
def test_a_file_whose_size_fstat_does_not_know() -> None:
    assert os.stat("/proc/self/cmdline").st_size == 0
    assert bytes(read_image_view("/proc/self/cmdline")) == read_image_file("/proc/self/cmdline") != b""


@pytest.mark.parametrize("reader", sorted(READERS))
def test_both_readers_refuse_alike(tmp_path: Path, reader: str) -> None:
    read = READERS[reader]
    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 100)
    with pytest.raises(BadImageError, match="a.jpg is 100 bytes, over the limit of 99") as info:
        read(path, max_bytes=99)
    assert info.value.reason == "image_unreadable" and info.value.path == str(path)
    with pytest.raises(BadImageError, match="not a regular file") as info:
        read(tmp_path)
    assert info.value.reason == "image_unreadable"
    with pytest.raises(BadImageError, match="nope.jpg does not exist") as info:
        read(tmp_path / "nope.jpg")
    assert info.value.reason == "image_missing"
    with pytest.raises(BadImageError, match="cannot be read") as info:
        read(str(tmp_path / "a\x00.jpg"))
    assert info.value.reason == "image_unreadable"
    if hasattr(os, "mkfifo"):  # a FIFO is refused without blocking on its open
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(BadImageError, match="not a regular file"):
            read(tmp_path / "pipe")
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.jpg"
        locked.write_bytes(b"x")
        locked.chmod(0)
        with pytest.raises(BadImageError, match="cannot be read: Permission denied"):
            read(locked)


def test_threads_each_decode_their_own_files(coco_mini: Path) -> None:
    # Each thread has its own buffer: decoding in 4 threads gives what one thread gives.
    files = sorted(coco_mini.glob("*2017/*.jpg"))[:24] * 2
    alone = [decode_image_bytes(path.read_bytes(), reduce=2)[0] for path in files]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: decode_image_with_size(p, reduce=2)[0], files))
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 9000),
    st.lists(st.integers(0, 8999), max_size=4),
    st.sampled_from([bytes, bytearray]),
)
def test_last_eoi_is_rfind(n: int, marks: list[int], kind: type) -> None:
    data = bytearray(n)
    for k in marks:  # markers near the 4096-byte tail cut are the cases that matter
        for pos in (k, n - 4097 + k % 3, n - 4096):
            if 0 <= pos < n - 1:
                data[pos : pos + 2] = b"\xff\xd9"
    expected = bytes(data).rfind(b"\xff\xd9")
    assert _last_eoi(memoryview(kind(data))) == expected == _last_eoi(bytes(data))
