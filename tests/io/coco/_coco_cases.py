"""A small valid COCO dataset written into tmp_path, and the helpers the COCO tests share."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from seg_datamodule.io.coco import CocoIndex

Mutator = Callable[[dict[str, Any]], None]


def flat(index: CocoIndex, i: int) -> tuple[np.ndarray, ...]:
    """Image ``i``'s targets as (vertices, ring_offsets, instance_offsets, labels, annotation_ids)."""
    return (*index.polygons(i).arrays, index.labels(i), index.annotation_ids(i))


def _square(x: float, y: float, s: float) -> list[float]:
    return [x, y, x + s, y, x + s, y + s, x, y + s]


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a mask: column-major runs starting with zeros."""
    flat = mask.flatten(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    runs = np.diff(np.concatenate([[0], change]))
    return {"counts": [int(r) for r in runs], "size": list(mask.shape)}


def _base() -> dict[str, Any]:
    """3 images (one without annotations), categories with gaps, every kind of instance."""
    crowd = np.zeros((40, 60), bool)
    crowd[5:15, 30:50] = True
    blob = np.zeros((40, 60), bool)
    blob[20:35, 5:25] = True
    blob[25:30, 10:15] = False  # a hole
    blob[27, 12] = True  # an island in the hole
    blob_rle = mask_utils.encode(np.asfortranarray(blob.astype(np.uint8)))
    return {
        "info": {},
        "images": [
            {"id": 10, "file_name": "a.jpg", "height": 40, "width": 60},
            {"id": 20, "file_name": "b.jpg", "height": 30, "width": 50},
            {"id": 30, "file_name": "c.jpg", "height": 20, "width": 20},  # negative
        ],
        "categories": [
            {"id": 7, "name": "seven"},
            {"id": 2, "name": "two"},
            {"id": 90, "name": "ninety"},
        ],
        "annotations": [
            {"id": 101, "image_id": 20, "category_id": 7, "iscrowd": 0, "area": 100.0,
             "bbox": [1, 1, 10, 10], "segmentation": [_square(1, 1, 10)]},
            {"id": 102, "image_id": 10, "category_id": 90, "iscrowd": 0, "area": 50.5,
             "bbox": [2.5, 3.25, 20, 12],
             "segmentation": [_square(2.5, 3.25, 5.5), [30.1, 2.2, 40.7, 2.2, 35.0, 9.9]]},
            {"id": 103, "image_id": 10, "category_id": 2, "iscrowd": 1, "area": 200,
             "bbox": [30, 5, 20, 10], "segmentation": _uncompressed_rle(crowd)},
            {"id": 104, "image_id": 10, "category_id": 2, "iscrowd": 0, "area": 276,
             "bbox": [5, 20, 20, 15],
             "segmentation": {"size": [40, 60], "counts": blob_rle["counts"].decode("ascii")}},
            {"id": 105, "image_id": 20, "category_id": 2, "iscrowd": 0, "area": 12.0,
             "bbox": [20, 20, 4, 3], "segmentation": [[20, 20, 24, 20, 24, 23, 20, 23]]},
        ],
    }


def _write(tmp_path: Path, data: dict[str, Any], name: str = "ann.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _build(path: Path, **kwargs: Any) -> CocoIndex:
    kwargs.setdefault("use_cache", False)
    return CocoIndex.build(path, path.parent, **kwargs)


def _kept_annotations(index: CocoIndex) -> set[int]:
    ids: set[int] = set()
    for i in range(len(index)):
        ids.update(flat(index, i)[4].tolist())
        ids.update(index.crowd_annotation_ids(i).tolist())
    return ids


def _annotation_skips(index: CocoIndex) -> int:
    return sum(c for r, c in index.skip_counts.items() if not r.startswith("image_"))


def _image_skips(index: CocoIndex) -> int:
    return sum(c for r, c in index.skip_counts.items() if r.startswith("image_"))


def _write_images(root: Path, data: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    for img in data["images"]:
        pixels = rng.integers(0, 255, (img["height"], img["width"], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / img["file_name"], "JPEG")


def _ann(data: dict[str, Any], ann_id: int) -> dict[str, Any]:
    return next(a for a in data["annotations"] if a["id"] == ann_id)


def _set(ann_id: int, key: str, value: Any) -> Mutator:
    def mutate(data: dict[str, Any]) -> None:
        _ann(data, ann_id)[key] = value

    return mutate


def _delete(ann_id: int, key: str) -> Mutator:
    def mutate(data: dict[str, Any]) -> None:
        del _ann(data, ann_id)[key]

    return mutate


# --------------------------------------------------------------------------------------------
# Running a build in a child process, so that a crash, a hang or a memory blow-up is a result

_CHILD_PREAMBLE = """
import resource, sys, types
resource.setrlimit(resource.RLIMIT_DATA, ({memory}, {memory}))
# The package's __init__ imports Lightning (~10 s); the loader needs io, ops and structures only.
_pkg = types.ModuleType("seg_datamodule")
_pkg.__path__ = [{package!r}]
sys.modules["seg_datamodule"] = _pkg
"""


# Warnings are errors, as under pytest (a numpy overflow warning means a number got through).
_CHILD_WARNINGS = "error,ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"


def run_isolated(script: str, *, timeout: float = 120, memory: int = 3 << 30) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python with its heap capped at ``memory`` bytes.

    Returns the finished process (``returncode`` negative for a signal); a hang past ``timeout``
    raises ``subprocess.TimeoutExpired``.
    """
    spec = importlib.util.find_spec("seg_datamodule")  # the package under test, not imported here
    assert spec is not None and spec.submodule_search_locations
    package = str(spec.submodule_search_locations[0])
    code = _CHILD_PREAMBLE.format(memory=memory, package=package) + script
    env = dict(os.environ, PYTHONPATH=str(Path(package).parent), PYTHONWARNINGS=_CHILD_WARNINGS)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )
