"""``index_check="folders"``: a warm start checks folders, not files; what it sees, what it misses, racy folders."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from _yolo_cases import SQUARE, TRIANGLE, make_dataset, write_image
from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.coco.cache import _stored_members, read_cache_where
from seg_datamodule.io.yolo import build_yolo_index, read_dataset_yaml
from seg_datamodule.io.yolo.folder_check import RACY_NS, unchanged_listing
from seg_datamodule.io.yolo.image_lists import list_split_images

HOUR_NS = 3600 * 10**9


def _age(root: Path) -> None:
    """Every folder and file below ``root`` modified an hour ago: safely older than any record taken now."""
    past = time.time_ns() - HOUR_NS
    for folder, _, files in os.walk(root):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            os.utime(path, ns=(past, past))


class _Calls:
    """The paths ``os.stat`` and ``os.scandir`` were called on while counting."""

    def __init__(self) -> None:
        self.stat: list[str] = []
        self.scandir: list[str] = []


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Calls]:
    seen = _Calls()
    stat, scandir = os.stat, os.scandir

    def counted_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        seen.stat.append(os.fsdecode(path) if not isinstance(path, int) else str(path))
        return stat(path, *args, **kwargs)

    def counted_scandir(path: Any = ".") -> Any:
        seen.scandir.append(os.fsdecode(path))
        return scandir(path)

    monkeypatch.setattr(os, "stat", counted_stat)
    monkeypatch.setattr(os, "scandir", counted_scandir)
    yield seen


def _dataset(root: Path) -> Path:
    yaml = make_dataset(root, {"a.jpg": TRIANGLE, "b.jpg": SQUARE, "c.jpg": None, "sub/d.jpg": None})
    (root / "labels/train/sub").mkdir()
    (root / "labels/train/sub/d.txt").write_text(f"{SQUARE}\n{TRIANGLE}")
    _age(root)
    return yaml


def _build(yaml: Path, cache: Path, check: str = "folders", **fields: Any) -> CocoIndex:
    return build_yolo_index(yaml, "train", cache_dir=cache, index_check=check, **fields)


def _fields(index: CocoIndex) -> tuple[Any, ...]:
    return (index.skip_counts, index._skip_examples, index._first_problem, index.source_counts, index.dropped_counts,
            index.class_names, [index.file_name(i) for i in range(len(index))])


def test_a_warm_start_walks_no_folder_and_stats_no_file(tmp_path: Path, calls: _Calls) -> None:
    yaml, cache = _dataset(tmp_path / "data"), tmp_path / "cache"
    cold = _build(yaml, cache)
    assert not cold.from_cache and calls.scandir and any(p.endswith("b.txt") for p in calls.stat)
    calls.stat.clear(), calls.scandir.clear()
    warm = _build(yaml, cache)
    assert warm.from_cache and warm == cold and _fields(warm) == _fields(cold)
    assert calls.scandir == []
    data, stats = str(tmp_path / "data"), list(calls.stat)
    # The folders, the data.yaml and the cache file: no image, no label file.
    assert not [p for p in stats if p.startswith(data) and not os.path.isdir(p) and p != str(yaml)]
    folders = {f"{data}/{part}/train{sub}" for part in ("images", "labels") for sub in ("", "/sub")}
    assert {p for p in stats if p.startswith(data)} == {*folders, str(yaml)}


def test_files_mode_is_todays_key(tmp_path: Path, calls: _Calls) -> None:
    yaml, cache = _dataset(tmp_path / "data"), tmp_path / "cache"
    assert not _build(yaml, cache, "files").from_cache
    calls.stat.clear(), calls.scandir.clear()
    assert _build(yaml, cache, "files").from_cache
    assert calls.scandir and len([p for p in calls.stat if not os.path.isabs(p)]) >= 3  # label files, at the folder
    # One cache for both checks: "folders" after "files" takes the full path once, then is warm.
    calls.scandir.clear()
    assert _build(yaml, cache).from_cache and calls.scandir
    calls.scandir.clear()
    assert _build(yaml, cache).from_cache and calls.scandir == []


def _add_image(root: Path) -> None:
    write_image(root / "images/train/e.jpg", (40, 60), seed=9)
    (root / "labels/train/e.txt").write_text(TRIANGLE)


@pytest.mark.parametrize(("change", "files"), [
    (_add_image, ["a", "b", "c", "e", "sub/d"]),
    (lambda root: (root / "images/train/b.jpg").unlink(), ["a", "c", "sub/d"]),
    (lambda root: os.rename(root / "images/train/b.jpg", root / "images/train/f.jpg"), ["a", "c", "f", "sub/d"]),
    (lambda root: os.rename(root / "images/train/sub/d.jpg", root / "images/train/sub/g.jpg"), ["a", "b", "c", "sub/g"]),
])
def test_an_added_removed_or_renamed_image_rebuilds(tmp_path: Path, change: Any, files: list[str]) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    _build(yaml, cache)
    assert _build(yaml, cache).from_cache
    change(root)
    index = _build(yaml, cache)
    assert [index.file_name(i) for i in range(len(index))] == [f"{f}.jpg" for f in files]
    assert index == build_yolo_index(yaml, "train", use_cache=False)


@pytest.mark.parametrize(("change", "labels"), [
    (lambda root: (root / "labels/train/c.txt").write_text(TRIANGLE), [[0], [1], [0], [1, 0]]),  # added
    (lambda root: (root / "labels/train/b.txt").unlink(), [[0], [], [], [1, 0]]),  # removed
    (lambda root: os.rename(root / "labels/train/b.txt", root / "labels/train/c.txt"), [[0], [], [1], [1, 0]]),
    (lambda root: os.rename(root / "labels/train/sub/d.txt", root / "labels/train/sub/x.txt"), [[0], [1], [], []]),
])
def test_an_added_removed_or_renamed_label_file_rebuilds(tmp_path: Path, change: Any, labels: list[list[int]]) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    _build(yaml, cache)
    change(root)
    index = _build(yaml, cache)
    assert not index.from_cache and [index.labels(i).tolist() for i in range(len(index))] == labels


def test_a_label_rewritten_in_place_is_missed_by_folders_only(tmp_path: Path) -> None:
    """The documented trade-off: the folder's mtime does not move when a file in it is rewritten."""
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    _build(yaml, cache)
    label = root / "labels/train/b.txt"
    inode = label.stat().st_ino
    label.write_text(SQUARE.replace("1 ", "0 ", 1))
    assert label.stat().st_ino == inode
    stale = _build(yaml, cache)
    assert stale.from_cache and stale.labels(1).tolist() == [1]  # the old label, served
    fresh = _build(yaml, cache, "files")
    assert not fresh.from_cache and fresh.labels(1).tolist() == [0]
    # The documented way back under "folders": touch the folder (or one start with "files", as above).
    label.write_text(SQUARE)
    os.utime(label.parent, ns=(time.time_ns() - HOUR_NS // 2,) * 2)
    touched = _build(yaml, cache)
    assert not touched.from_cache and touched.labels(1).tolist() == [1]


def test_a_racy_folder_takes_the_full_path(tmp_path: Path, calls: _Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    folder_mtime = (root / "images/train").stat().st_mtime_ns
    with monkeypatch.context() as clock:
        clock.setattr(time, "time_ns", lambda: folder_mtime)  # the record taken in the folder's own tick
        _build(yaml, cache)
    calls.scandir.clear()
    again = _build(yaml, cache)
    assert again.from_cache and calls.scandir  # checked in full (the per-file key still matches)
    calls.scandir.clear()
    assert _build(yaml, cache).from_cache and calls.scandir == []  # the record retaken: warm again
    # Just inside the margin is racy too; just outside is not.
    path = cache / next(p.name for p in cache.glob("*.npz"))
    dataset = read_dataset_yaml(yaml)
    sources = dataset.sources("train")
    meta = _meta(path)
    newest = max(s[0] for s in meta["folders"]["stats"])
    for taken, served in ((newest + RACY_NS - 1, False), (newest + RACY_NS, True)):
        record = {**meta["folders"], "taken_ns": taken}
        assert (unchanged_listing({**meta, "folders": record}, dataset, "train", sources) is not None) == served


def _meta(path: Path) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    read_cache_where(path, lambda meta: seen.append(meta) or False)
    return seen[0]


def test_the_cached_listing_equals_the_walk(tmp_path: Path) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    listed = root / "more.txt"
    listed.write_text("images/train/a.jpg\n/etc/passwd.jpg\nimages/train/a.jpg\nnotes.md\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: [images/train, more.txt]\nnames: [a, b]\n")
    _age(root)
    cold = _build(yaml, cache, on_bad_sample="skip")
    warm = _build(yaml, cache, on_bad_sample="skip")
    assert warm.from_cache and warm == cold and _fields(warm) == _fields(cold)
    assert warm.skip_counts == {"image_unsafe_file_name": 1} and warm.source_counts["image_listed_twice"] == 2
    dataset = read_dataset_yaml(yaml)
    sources = dataset.sources("train")
    cached = unchanged_listing(_meta(next(cache.glob("*.npz"))), dataset, "train", sources)
    assert cached == list_split_images(sources)
    listed.write_text("images/train/a.jpg\n")  # a list rewritten in place: its own mtime moves
    assert _build(yaml, cache, on_bad_sample="skip").skip_counts == {}


def test_a_damaged_cache_is_refused(tmp_path: Path, calls: _Calls, caplog: pytest.LogCaptureFixture) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    cold = _build(yaml, cache)
    path = next(cache.glob("*.npz"))
    with open(path, "r+b") as f:
        start, size = _stored_members(f)["vertices"]
        f.seek(start + size - 3)
        byte = f.read(1)
        f.seek(start + size - 3)
        f.write(bytes([byte[0] ^ 1]))
    rebuilt = _build(yaml, cache)
    assert not rebuilt.from_cache and rebuilt == cold and "fail their checksums" in caplog.text
    # A damaged listing (a name changed, its length kept): its digest refuses it, the full path serves.
    raw = path.read_bytes()
    assert raw.count(b'\\"b.jpg\\"') == 1
    path.write_bytes(raw.replace(b'\\"b.jpg\\"', b'\\"z.jpg\\"'))
    calls.scandir.clear()
    index = _build(yaml, cache)
    assert index.from_cache and calls.scandir and index == cold and index.file_name(1) == "b.jpg"


def test_nothing_is_unpickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(np, "load", refuse)
    yaml, cache = _dataset(tmp_path / "data"), tmp_path / "cache"
    cold = _build(yaml, cache)
    assert _build(yaml, cache).from_cache and _build(yaml, cache) == cold


@pytest.mark.parametrize(("value", "error"), [("dirs", ValueError), (1, TypeError)])
def test_the_option_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"index_check must be one of \['files', 'folders'\], got"):
        IndexOptions(index_check=value)


def test_a_folder_modified_one_second_before_the_record_is_racy(tmp_path: Path) -> None:
    """The racy window, in seconds as a filesystem's timestamps are coarse (ext3/HFS+: 1 s, FAT: 2 s),
    not read from the module: a folder modified 1 s (or 1.9 s) before the record counts as changed, one
    modified 3 s before does not. A window shrunk below the coarsest granularity fails here."""
    root, cache = tmp_path / "data", tmp_path / "cache"
    yaml = _dataset(root)
    _build(yaml, cache)
    path = cache / next(p.name for p in cache.glob("*.npz"))
    dataset = read_dataset_yaml(yaml)
    sources = dataset.sources("train")
    meta = _meta(path)
    newest = max(s[0] for s in meta["folders"]["stats"])
    for seconds_after, served in ((0.0, False), (1.0, False), (1.9, False), (3.0, True), (3600.0, True)):
        record = {**meta["folders"], "taken_ns": newest + int(seconds_after * 10**9)}
        assert (unchanged_listing({**meta, "folders": record}, dataset, "train", sources) is not None) == served, \
            seconds_after
