"""The index cache: hits, staleness, corruption, the environment, processes building at once."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _coco_cases import _base, _set, _write, flat
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
from seg_datamodule.io.coco import index as index_module


# --------------------------------------------------------------------------------------------
# Cache


def test_cache_hit_is_equal_and_skips_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not first.from_cache and first.cache_path is not None and first.cache_path.parent == cache

    def no_build(*args: Any) -> Any:
        raise AssertionError("the JSON was parsed again")

    monkeypatch.setattr(index_module, "build_tables", no_build)
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
    else:  # one byte inside the vertex data: caught by the zip CRC
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


def _build_and_report(args: tuple[str, str, str]) -> bool:
    path, root, cache = args
    return CocoIndex.build(path, root, cache_dir=cache).from_cache


def test_processes_starting_together_build_the_cache_once(tmp_path: Path) -> None:
    # DDP ranks: one parses the JSON, the others wait on the lock and read its cache.
    import multiprocessing

    path = _write(tmp_path, _base())
    args = (str(path), str(tmp_path), str(tmp_path / "cache"))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        from_cache = pool.map(_build_and_report, [args] * 3)
    assert sorted(from_cache) == [False, True, True]
