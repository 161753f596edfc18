"""Hostile input (issue 11): numbers that would crash pycocotools, unsafe paths, unwritable or
forged caches, plain Python errors and booleans where numbers belong; each one named or counted."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from _coco_cases import _ann, _base, _build, _set, _write, _write_images, run_isolated
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex, SKIP_REASONS
from seg_datamodule.io.images.decode import BadImageError


def _raises_named(path: Path, reason: str, **ids: Any) -> BadAnnotationError:
    with pytest.raises(BadAnnotationError) as info:
        _build(path)
    error = info.value
    assert error.reason == reason, str(error)
    assert str(error).startswith(f"{path}:") and error.ann_file == str(path)
    for key, value in ids.items():
        assert getattr(error, key) == value, str(error)
    return error


def _skipped(path: Path, reason: str, count: int = 1) -> CocoIndex:
    index = _build(path, on_bad_sample="skip")
    assert index.skip_counts.get(reason) == count, index.skip_counts
    assert set(index.skip_counts) <= set(SKIP_REASONS)
    return index


# --------------------------------------------------------------------------------------------
# 1. Coordinates far outside the image


_FAR_CASES = [  # (iscrowd, annotation changed, a coordinate)
    (1, 103, 1e9), (1, 103, 1e8), (1, 103, -1e9), (1, 103, 1e30), (0, 101, 1e30), (0, 101, 1e308),
]

_FAR_SCRIPT = """
import json, sys
from pathlib import Path
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
results = []
for path in sys.argv[1:]:
    for mode in ("raise", "skip"):
        try:
            index = CocoIndex.build(path, Path(path).parent, on_bad_sample=mode, use_cache=False)
            results.append(["built", index.skip_counts])
        except BadAnnotationError as err:
            results.append(["named", err.reason, err.annotation_id])
        except BaseException as err:
            results.append(["other", type(err).__name__, str(err)[:200]])
print(json.dumps(results))
"""


def test_far_coordinates_are_named_not_a_crash(tmp_path: Path) -> None:
    # Before issue 11 a crowd polygon at 1e9 reached pycocotools' frPyObjects: a segfault under a
    # memory cap, an OOM kill without; a target at 1e308 passed with numpy overflow warnings.
    paths = []
    for k, (iscrowd, ann_id, value) in enumerate(_FAR_CASES):
        data = _base()
        ann = _ann(data, ann_id)
        ann.update(iscrowd=iscrowd, segmentation=[[10, 10, value, 10, 50, 50]])
        paths.append(str(_write(tmp_path, data, f"far{k}.json")))
    done = run_isolated(_FAR_SCRIPT.replace("sys.argv[1:]", repr(paths)))
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-2000:]}"
    results = json.loads(done.stdout)
    for (iscrowd, ann_id, value), raised, skipped in zip(_FAR_CASES, results[::2], results[1::2]):
        assert raised == ["named", "polygon_out_of_bounds", ann_id], (value, raised)
        assert skipped == ["built", {"polygon_out_of_bounds": 1}], (value, skipped)


def test_out_of_bounds_is_relative_to_the_image(tmp_path: Path) -> None:
    data = _base()  # image 20 is 30 x 50 (H x W): x may reach 101 * 50, y -100 * 30
    _set(101, "segmentation", [[0, 0, 5050, 0, 10, -3000]])(data)
    _set(103, "segmentation", [[-5000, 0, 10, 0, 10, 4000]])(data)  # crowd, image 10 (40 x 60)
    assert _build(_write(tmp_path, data)).num_instances == 4
    _set(101, "segmentation", [[0, 0, 5051, 0, 10, 10]])(data)
    error = _raises_named(_write(tmp_path, data), "polygon_out_of_bounds", annotation_id=101, image_id=20)
    assert "b.jpg" in str(error)


def test_crowd_polygon_partly_outside_is_clipped_like_pycocotools(tmp_path: Path) -> None:
    from pycocotools import mask as mask_utils

    data = _base()
    ring = [-20, -10, 70, 5, 30, 45, 5, 25]  # pokes out of the 40 x 60 image on three sides
    _set(103, "segmentation", [ring])(data)
    index = _build(_write(tmp_path, data))
    expected = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([ring], 40, 60))).astype(bool)
    np.testing.assert_array_equal(index.crowd_mask(0), expected)


# --------------------------------------------------------------------------------------------
# 3. file_name confined to the image root; only regular files, bounded, header checked first


@pytest.mark.parametrize("name", ["../x.jpg", "/etc/passwd", "sub/../../x.jpg", "a\x00.jpg"])
def test_file_name_leaving_the_root_is_a_named_bad_entry(tmp_path: Path, name: str) -> None:
    data = _base()
    data["images"][1]["file_name"] = name  # image 20, with annotations 101 and 105
    path = _write(tmp_path, data)
    error = _raises_named(path, "image_unsafe_file_name", image_id=20)
    assert "file_name" in str(error)
    index = _skipped(path, "image_unsafe_file_name")
    assert index.skip_counts["annotation_of_skipped_image"] == 2 and 20 not in index.image_ids


def test_file_names_inside_the_root_are_fine(tmp_path: Path) -> None:
    data = _base()
    data["images"][0]["file_name"] = "sub/../a.jpg"
    data["images"][1]["file_name"] = "./deep/er/b.jpg"
    assert _build(_write(tmp_path, data)).file_name(1) == "./deep/er/b.jpg"


def test_lone_surrogate_in_file_name_is_a_named_bad_entry(tmp_path: Path) -> None:
    data = _base()
    path = tmp_path / "ann.json"
    # json.dumps writes a lone surrogate as the escape \ud800, which json.load turns back into one.
    path.write_text(json.dumps(data).replace('"b.jpg"', '"b\\ud800.jpg"'))
    _raises_named(path, "image_unsafe_file_name", image_id=20)
    _skipped(path, "image_unsafe_file_name")


@pytest.fixture
def images(tmp_path: Path) -> CocoIndex:
    data = _base()
    _write_images(tmp_path, data)
    return _build(_write(tmp_path, data))


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_blocking(images: CocoIndex) -> None:
    path = images.file_path(0)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(BadImageError, match="not a regular file") as info:
        images.load_image(0)
    assert info.value.reason == "image_unreadable" and info.value.image_id == 10


def test_a_symlink_to_a_device_is_refused(images: CocoIndex) -> None:
    # /dev/zero never ends: before issue 11 it was read until MemoryError (so in a capped child).
    path = images.file_path(0)
    path.unlink()
    path.symlink_to("/dev/zero")
    script = f"""
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.images.decode import BadImageError
index = CocoIndex.build({str(images.ann_file)!r}, {str(images.image_root)!r}, use_cache=False)
try:
    index.load_image(0)
except BadImageError as err:
    print(err.reason, "|", err)
"""
    done = run_isolated(script, timeout=60, memory=1 << 30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("image_unreadable |") and "not a regular file" in done.stdout


def test_symlinked_image_folder_inside_the_root_still_works(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    data = _base()
    _write_images(real, data)
    root = tmp_path / "root"
    root.mkdir()
    (root / "imgs").symlink_to(real)
    for img in data["images"]:
        img["file_name"] = "imgs/" + img["file_name"]
    index = CocoIndex.build(_write(root, data), root, use_cache=False)
    assert index.load_image(1).shape == (30, 50, 3)


def test_file_over_the_size_cap_is_refused(images: CocoIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    from seg_datamodule.io.images import files as images_module  # the readers' module holds the limit

    size = images.file_path(0).stat().st_size
    monkeypatch.setattr(images_module, "MAX_IMAGE_BYTES", size - 1)
    with pytest.raises(BadImageError, match="bytes, over the limit") as info:
        images.load_image(0)
    assert info.value.reason == "image_unreadable"
    monkeypatch.setattr(images_module, "MAX_IMAGE_BYTES", size)
    assert images.load_image(0).shape == (40, 60, 3)


def _with_header_size(jpeg: bytes, height: int, width: int) -> bytes:
    k = jpeg.index(b"\xff\xc0")  # baseline SOF0: FF C0, length (2), precision (1), H (2), W (2)
    return jpeg[: k + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + jpeg[k + 9 :]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_header_size_is_checked_before_decoding(
    images: CocoIndex, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    from seg_datamodule.io.images import decode as images_module

    path = images.file_path(0)
    Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(path, fmt)
    blob = path.read_bytes()
    if fmt == "JPEG":
        blob = _with_header_size(blob, 30000, 30000)
    else:  # IHDR: width then height, 4 bytes each, at offset 16 (its CRC is not checked first)
        blob = blob[:16] + (30000).to_bytes(4, "big") + (30000).to_bytes(4, "big") + blob[24:]
    path.write_bytes(blob)

    def no_decode(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decoded before the size was checked")

    monkeypatch.setattr(images_module.cv2, "imdecode", no_decode)
    with pytest.raises(BadImageError, match=r"30000x30000 .*says 40x60") as info:
        images.load_image(0)
    assert info.value.reason == "image_size_mismatch" and info.value.image_id == 10


# --------------------------------------------------------------------------------------------
# 4. Plain Python errors from odd values become named entries


def test_rle_of_2_to_the_32_pixels_is_a_named_bad_entry(tmp_path: Path) -> None:
    # pycocotools keeps height * width in a C unsigned int: OverflowError before issue 11.
    data = _base()
    data["images"].append({"id": 40, "file_name": "huge.jpg", "height": 65536, "width": 65536})
    data["annotations"].append({"id": 109, "image_id": 40, "category_id": 2, "iscrowd": 1,
                                "bbox": [0, 0, 5, 5], "segmentation": {"size": [65536, 65536],
                                                                       "counts": [0, 2**32]}})
    path = _write(tmp_path, data)
    error = _raises_named(path, "image_bad_entry", image_id=40)
    assert "pixels" in str(error)
    _skipped(path, "image_bad_entry")


def test_rle_size_beyond_pycocotools_is_rle_invalid() -> None:
    from seg_datamodule.ops.rle import check_rle

    assert check_rle({"size": [65536, 65536], "counts": [2**32]}, 65536, 65536)[0] == "rle_invalid"
    assert check_rle({"size": [True, 5], "counts": [5]}, 1, 5)[0] == "rle_invalid"
    assert check_rle({"size": [1, 5], "counts": [5]}, 1, 5) is None


# --------------------------------------------------------------------------------------------
# 6. A boolean where a number belongs is always a named bad entry


@pytest.mark.parametrize("iscrowd, ann_id", [(0, 101), (1, 103)])
def test_boolean_polygon_coordinates(tmp_path: Path, iscrowd: int, ann_id: int) -> None:
    data = _base()
    _ann(data, ann_id).update(iscrowd=iscrowd, segmentation=[[True, False, 50, 10, 50, 50]])
    path = _write(tmp_path, data)
    _raises_named(path, "segmentation_invalid", annotation_id=ann_id)
    _skipped(path, "segmentation_invalid")


@pytest.mark.parametrize("alone", [False, True])
def test_boolean_bbox_alone_or_not(tmp_path: Path, alone: bool) -> None:
    data = _base()
    if alone:
        data["annotations"] = [a for a in data["annotations"] if a["id"] == 101]
    _set(101, "bbox", [True, True, True, True])(data)
    path = _write(tmp_path, data)
    _raises_named(path, "bbox_invalid", annotation_id=101)
    _skipped(path, "bbox_invalid")


@pytest.mark.parametrize(
    "key, value, reason",
    [("area", True, "annotation_bad_entry"), ("image_id", True, "annotation_unknown_image_id"),
     ("category_id", True, "annotation_unknown_category_id"), ("iscrowd", False, "annotation_bad_entry")],
)
def test_boolean_fields(tmp_path: Path, key: str, value: bool, reason: str) -> None:
    data = _base()
    _set(101, key, value)(data)
    path = _write(tmp_path, data)
    _raises_named(path, reason, annotation_id=101)
    _skipped(path, reason)


def test_boolean_rle_counts(tmp_path: Path) -> None:
    data = _base()
    counts = _ann(data, 103)["segmentation"]["counts"]
    counts.insert(0, False)  # a run of "False" zeros: the sum is unchanged
    path = _write(tmp_path, data)
    _raises_named(path, "rle_invalid", annotation_id=103)


def test_boolean_image_size(tmp_path: Path) -> None:
    data = _base()
    data["images"][2]["height"] = True
    _raises_named(_write(tmp_path, data), "image_bad_entry", image_id=30)


# --------------------------------------------------------------------------------------------
# 2. The DataModule's switch, and its setup with an unwritable cache location


def test_datamodule_use_cache_switch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from seg_datamodule.data.datamodule import COCOSegDataModule

    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    kwargs = dict(train_ann=str(path), train_images=str(tmp_path), num_workers=0)
    assert COCOSegDataModule(**kwargs, cache_dir=str(cache), use_cache=False).num_classes == 3
    assert not cache.exists()
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    kwargs.update(val_ann=str(path), val_images=str(tmp_path))  # two indexes, one warning
    with caplog.at_level(logging.WARNING):
        assert COCOSegDataModule(**kwargs, cache_dir=str(blocker)).num_classes == 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "in memory" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize("value", [10**400, "7", None, [7]])
def test_polygon_value_that_is_no_float_is_named(tmp_path: Path, value: Any) -> None:
    # The parser packs rings of ints and floats into arrays; anything else stays for the checks.
    data = _base()
    _set(101, "segmentation", [[1, 1, 9, 1, value, 9]])(data)
    path = _write(tmp_path, data)
    _raises_named(path, "segmentation_invalid", annotation_id=101)
    index = _skipped(path, "segmentation_invalid")
    assert index.num_instances == 3


# --------------------------------------------------------------------------------------------
# 7. RLE that pycocotools' string encoder would overflow (seg_datamodule/ops/rle.py)

_OVERFLOW_CHILD = """
from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
path = {path!r}
try:
    CocoIndex.build(path, ".", use_cache=False)
except BadAnnotationError as error:
    print("raised", error.reason, error.annotation_id, error.image_id)
index = CocoIndex.build(path, ".", use_cache=False, on_bad_sample="skip")
i = index.image_ids.tolist().index(50)
print("skipped", sorted(index.skip_counts.items()))
print("crowd", int(index.crowd_mask(i).sum()), index.crowd_annotation_ids(i).tolist())
"""


def test_rle_pycocotools_would_overflow_is_encoded_safely_or_named(tmp_path: Path) -> None:
    """Two crowd RLEs that aborted the build (in a subprocess here, so an abort fails this test
    only): one whose numbers all take 6 characters of pycocotools' string (its encoder puts the
    NUL past its buffer; now encoded by the package, read back exactly), and one with runs of 2^29
    pixels, which its strings cannot hold (refused, naming the annotation)."""
    data = _base()
    data["images"] += [{"id": 50, "file_name": "wide.jpg", "height": 4096, "width": 20480},
                       {"id": 51, "file_name": "huge.jpg", "height": 2**15, "width": 2**15}]
    data["annotations"] += [
        {"id": 150, "image_id": 50, "category_id": 2, "iscrowd": 1, "bbox": [4096, 0, 4096, 4096],
         "segmentation": {"size": [4096, 20480], "counts": [2**24, 2**24, 2**24, 2**25]}},
        {"id": 151, "image_id": 51, "category_id": 2, "iscrowd": 1, "bbox": [2**14, 0, 2**14, 2**15],
         "segmentation": {"size": [2**15, 2**15], "counts": [2**29, 2**29]}},
    ]
    path = _write(tmp_path, data)
    proc = run_isolated(_OVERFLOW_CHILD.format(path=str(path)), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines[0] == "raised rle_invalid 151 51", proc.stdout
    # Image 51 lost its only annotation: left out, counted apart.
    assert lines[1] == "skipped [('image_all_annotations_skipped', 1), ('rle_invalid', 1)]"
    assert lines[2] == f"crowd {2**24 + 2**25} [150]"
