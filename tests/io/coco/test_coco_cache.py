"""The index cache: hits, staleness, corruption, the environment, processes building at once."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _coco_cases import _base, _set, _write, flat
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
from seg_datamodule.io.coco import building as building_module
from seg_datamodule.io.coco.cache import array_checksum


# --------------------------------------------------------------------------------------------
# Cache


def test_cache_hit_is_equal_and_skips_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not first.from_cache and first.cache_path is not None and first.cache_path.parent == cache

    def no_build(*args: Any) -> Any:
        raise AssertionError("the JSON was parsed again")

    monkeypatch.setattr(building_module, "build_tables", no_build)
    second = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert second.from_cache and second == first
    for i in range(len(first)):
        for a, b in zip(flat(first, i), flat(second, i)):
            np.testing.assert_array_equal(a, b)
    # Options apply on the cached arrays.
    assert CocoIndex.build(path, tmp_path, cache_dir=cache, drop_crowd=True).num_crowd == 0


def test_modified_annotation_file_is_rebuilt(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).num_instances == 4
    data = _base()
    data["annotations"].pop()
    path.write_text(json.dumps(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    rebuilt = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not rebuilt.from_cache and rebuilt.num_instances == 3
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache
    # Same size, other content (an editor saving in place): the mtime tells.
    text = path.read_text()
    path.write_text(text.replace('"two"', '"TWO"'))
    assert path.stat().st_size == len(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    renamed = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not renamed.from_cache and renamed.class_names[0] == "TWO"
    assert len(list(cache.glob("*.npz"))) == 1  # overwritten, not accumulated


@pytest.mark.parametrize("damage", ["garbage", "truncate", "flip"])
def test_corrupt_cache_is_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert first.cache_path is not None
    blob = first.cache_path.read_bytes()
    if damage == "garbage":
        first.cache_path.write_bytes(b"not a zip file")
    elif damage == "truncate":
        first.cache_path.write_bytes(blob[: len(blob) // 2])
    else:  # one byte inside the vertex data: caught by the arrays' checksums
        k = blob.index(b"vertices.npy") + 200
        first.cache_path.write_bytes(blob[:k] + bytes([blob[k] ^ 0xFF]) + blob[k + 1 :])
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.io.coco"):
        again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache and again == first
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache  # rewritten


def test_cache_built_in_skip_mode_still_raises_in_raise_mode(tmp_path: Path) -> None:
    data = _base()
    _set(101, "segmentation", [[1, 1, 5, 5]])(data)
    path = _write(tmp_path, data)
    cache = tmp_path / "cache"
    skipped = CocoIndex.build(path, tmp_path, cache_dir=cache, on_bad_sample="skip")
    assert skipped.skip_counts == {"polygon_too_few_points": 1}
    match = r"annotation id 101 \(image id 20, file b.jpg\).*2 points"
    with pytest.raises(BadAnnotationError, match=match) as info:
        CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert info.value.reason == "polygon_too_few_points" and info.value.annotation_id == 101
    again = CocoIndex.build(path, tmp_path, cache_dir=cache, on_bad_sample="skip")
    assert again.from_cache and again.skip_counts == skipped.skip_counts


def test_default_cache_dir_honours_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEG_DATAMODULE_CACHE", str(tmp_path / "env_cache"))
    path = _write(tmp_path, _base())
    index = CocoIndex.build(path, tmp_path)
    assert index.cache_path is not None and index.cache_path.parent == tmp_path / "env_cache" / "coco_index"



def test_same_size_copy_keeping_the_mtime_rebuilds_the_cache(tmp_path: Path) -> None:
    import shutil

    data = _base()
    path = _write(tmp_path, data)
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    names = [c["name"] for c in data["categories"]]
    # Swap two category names: same file size; copy2 carries the old modification time over.
    data["categories"][0]["name"], data["categories"][1]["name"] = names[1], names[0]
    staged = _write(tmp_path, data, "staged.json")
    os.utime(staged, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    assert staged.stat().st_size == path.stat().st_size
    shutil.copy2(staged, path)
    again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache
    assert again.class_names[:2] == first.class_names[:2][::-1]


def _build_after_barrier(barrier: Any, path: str, root: str, cache: str, results: Any) -> None:
    barrier.wait()  # all three ask for the cache at the same moment
    results.put(CocoIndex.build(path, root, cache_dir=cache).from_cache)


def test_processes_starting_together_build_the_cache_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DDP ranks: one parses the JSON, the others wait on the lock and read its cache. The build
    # is slowed down and the processes released together, so without the lock all would build.
    import multiprocessing
    import time

    builds = tmp_path / "builds"
    builds.mkdir()
    real_build = building_module.build_tables

    def slow_build(*args: Any) -> Any:
        (builds / str(os.getpid())).touch()
        time.sleep(1.5)
        return real_build(*args)

    monkeypatch.setattr(building_module, "build_tables", slow_build)
    path = _write(tmp_path, _base())
    context = multiprocessing.get_context("fork")  # inherits the slow build
    barrier, results = context.Barrier(3), context.Queue()
    args = (barrier, str(path), str(tmp_path), str(tmp_path / "cache"), results)
    processes = [context.Process(target=_build_after_barrier, args=args) for _ in range(3)]
    for process in processes:
        process.start()
    from_cache = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert sorted(from_cache) == [False, True, True]
    assert len(list(builds.iterdir())) == 1


# --------------------------------------------------------------------------------------------
# An unwritable cache location: build in memory, warn once (issue 11, defect 2)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_cache_dir_that_cannot_be_a_folder_falls_back_to_memory(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, _base())
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    cache = blocker if where == "a file" else blocker / "sub"
    with caplog.at_level(logging.WARNING):
        index = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not index.from_cache and index.cache_path is None and index.num_instances == 4
    messages = _warnings(caplog)
    assert len(messages) == 1 and "building the index in memory" in messages[0] and str(cache) in messages[0]


def test_permission_error_from_the_lock_falls_back_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A read-only folder, as on many clusters' home folders (root ignores modes: simulated).
    from seg_datamodule.io.coco import cache as cache_module

    def read_only(path: Path) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cache_module, "file_lock", read_only)
    path = _write(tmp_path, _base())
    with caplog.at_level(logging.WARNING):
        index = CocoIndex.build(path, tmp_path, cache_dir=tmp_path / "cache")
    assert index.cache_path is None and index.num_instances == 4
    assert len(_warnings(caplog)) == 1


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_cache_folder_falls_back_to_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING):
            index = CocoIndex.build(path, tmp_path, cache_dir=cache)
    finally:
        cache.chmod(0o700)
    assert index.cache_path is None and index.num_instances == 4


def test_orphan_temporary_files_are_removed(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert first.cache_path is not None
    orphan = cache / (first.cache_path.name + ".abc123.tmp")  # what a kill during a write leaves
    orphan.write_bytes(b"half a cache")
    other = cache / "someone-else.npz.x.tmp"
    other.write_bytes(b"not ours")
    path.touch()  # stale: the next build rewrites the cache
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert not CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache
    assert not orphan.exists() and other.exists()


def test_symlink_at_the_lock_path_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    probe = CocoIndex.build(path, tmp_path, use_cache=False)
    from seg_datamodule.io.coco.cache import cache_path

    cache.mkdir()
    lock = cache_path(cache, path.absolute())
    lock = lock.with_name(lock.name + ".lock")
    victim = tmp_path / "victim"
    lock.symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        index = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not victim.exists()  # neither created nor written through the link
    assert index == probe and index.cache_path is None
    assert any("symlink" in m or "symbolic" in m for m in _warnings(caplog))


def test_cache_files_and_folders_are_the_owners_only(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "new" / "cache"
    index = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert index.cache_path is not None
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE(index.cache_path.stat().st_mode) == 0o600
    for lock in cache.glob("*.lock"):
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600


# --------------------------------------------------------------------------------------------
# A cache file is checked before it is trusted (issue 11, defect 5)


def _forge(cache_file: Path, change: Any) -> None:
    """Rewrite the cache with ``change(tables, meta)`` applied, keeping its key."""
    with np.load(cache_file) as npz:
        tables = {k: npz[k] for k in npz.files if k != "meta"}
        meta = json.loads(npz["meta"].tobytes().decode("utf-8"))
    change(tables, meta)
    blob = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
    with open(cache_file, "wb") as f:
        np.savez(f, meta=blob, **tables)


def _drop_class_names(t: dict, m: dict) -> None:
    del m["class_names"]


def _label_out_of_range(t: dict, m: dict) -> None:
    t["labels"][0] = 3


def _negative_label(t: dict, m: dict) -> None:
    t["crowd_labels"][0] = -1


def _offsets_backwards(t: dict, m: dict) -> None:
    t["ring_offsets"][2], t["ring_offsets"][3] = t["ring_offsets"][3], t["ring_offsets"][2]


def _offsets_past_the_end(t: dict, m: dict) -> None:
    t["instance_offsets"][-1] += 5


def _short_boxes(t: dict, m: dict) -> None:
    t["bboxes"] = t["bboxes"][:-1]


def _unsafe_file_name(t: dict, m: dict) -> None:
    name = b"/etc/passwd"
    t["file_name_bytes"] = np.concatenate([np.frombuffer(name, np.uint8), t["file_name_bytes"][5:]])
    t["file_name_offsets"][1] = len(name)
    t["file_name_offsets"][2:] += len(name) - 5


def _missing_table(t: dict, m: dict) -> None:
    del t["vertices"]


def _float_ids(t: dict, m: dict) -> None:
    t["image_ids"] = t["image_ids"].astype(np.float64)


def _bad_skip_counts(t: dict, m: dict) -> None:
    m["skip_counts"] = {"zero_area": "many"}


@pytest.mark.parametrize(
    "change",
    [_drop_class_names, _label_out_of_range, _negative_label, _offsets_backwards, _offsets_past_the_end,
     _short_boxes, _unsafe_file_name, _missing_table, _float_ids, _bad_skip_counts],
)
def test_forged_cache_with_a_matching_key_is_rebuilt(
    tmp_path: Path, change: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert first.cache_path is not None
    _forge(first.cache_path, change)
    with caplog.at_level(logging.WARNING):
        again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache and again == first
    assert any("rebuilding" in m for m in _warnings(caplog))
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache  # rewritten, good again


@given(st.integers(1, 40), st.data())
def test_the_checksum_tells_any_changed_byte(nbytes: int, data: st.DataObject) -> None:
    raw = np.frombuffer(data.draw(st.binary(min_size=nbytes, max_size=nbytes)), np.uint8).copy()
    k = data.draw(st.integers(0, nbytes - 1))
    changed = raw.copy()
    changed[k] ^= data.draw(st.integers(1, 255))
    assert array_checksum(raw) != array_checksum(changed)
    assert array_checksum(raw) == array_checksum(raw.copy())


@pytest.mark.parametrize("member", ["compressed", "object"])
def test_a_cache_the_writer_did_not_write_is_rebuilt(tmp_path: Path, member: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A compressed member or an array of Python objects (a pickle) is refused, never unpickled."""
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert first.cache_path is not None
    with np.load(first.cache_path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    if member == "compressed":
        np.savez_compressed(first.cache_path, **arrays)
    else:
        arrays["labels"] = np.array([{"a": 1}], dtype=object)
        with open(first.cache_path, "wb") as f:
            np.savez(f, **arrays)
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.io.coco"):
        again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache and again == first
    assert any("unreadable" in r.getMessage() for r in caplog.records)
