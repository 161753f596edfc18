"""The fuzz test's child process: mutate a COCO file at random, build it in both modes, check.

Run by ``test_coco_fuzz.py`` in a fresh, memory-capped interpreter, so that a crash (a signal),
a memory blow-up or a hang is a result the test reports, with the seed that reproduces it.
Prints ``START <run>`` before each run and ``DONE <runs>`` at the end; a failed check prints
``FAIL <run>: ...`` and exits 1.
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import traceback
from pathlib import Path
from typing import Any

#: Replacement values: wrong types, extremes, non-finite numbers, hostile strings.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 1.5, 2**31, 2**32, 2**63, -(2**70), 1e8, -1e9, 1e30, 1e308,
    -1e308, math.nan, math.inf, -math.inf, "", "x", "../x.jpg", "/etc/passwd", "a\x00b", "\ud800",
    [], {}, [[]], [1, 2], [[1, 2, 3, 4, 5, 6]], {"size": [1, 1], "counts": [1]}, {"counts": "0"},
]
#: Errors that name no image or annotation (the file's structure is wrong).
STRUCTURAL = {"not_json", "not_coco", "bad_category", "duplicate_category_id"}


def _entries(data: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(data, dict):
        for key in ("images", "annotations", "categories"):
            if isinstance(data.get(key), list):
                out += [e for e in data[key] if isinstance(e, dict)]
    return out


def _leaf_lists(value: Any, found: list[list[Any]]) -> None:
    """Every list inside ``value`` (polygon rings, bboxes, RLE counts...)."""
    if isinstance(value, list):
        found.append(value)
        for item in value:
            _leaf_lists(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _leaf_lists(item, found)


def mutate(data: dict[str, Any], rng: random.Random) -> None:
    """Apply 1 to 4 random mutations to ``data`` in place."""
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["delete", "replace", "replace", "number", "number", "nest", "duplicate", "top"])
        entries = _entries(data)
        if kind == "top":
            key = rng.choice(["images", "annotations", "categories"])
            if rng.random() < 0.5:
                data.pop(key, None)
            else:
                data[key] = rng.choice([None, {}, [None], [[]], "x", [1]])
            continue
        if not entries:
            continue
        entry = rng.choice(entries)
        if kind == "delete" and entry:
            del entry[rng.choice(list(entry))]
        elif kind == "replace" and entry:
            entry[rng.choice(list(entry))] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif kind == "number":
            lists: list[list[Any]] = []
            _leaf_lists(entry, lists)
            lists = [x for x in lists if x]
            if lists:
                target = rng.choice(lists)
                target[rng.randrange(len(target))] = copy.deepcopy(rng.choice(ODD_VALUES))
            elif entry:
                entry[rng.choice(list(entry))] = rng.choice([1e9, -1e9, 65536, 2**40, math.nan])
        elif kind == "nest" and entry:
            key = rng.choice(list(entry))
            value = entry[key]
            if isinstance(value, list) and value and rng.random() < 0.5:
                entry[key] = value[0]
            else:
                entry[key] = [value]
        elif kind == "duplicate":
            same = [e for e in entries if e is not entry and set(e) & {"id"}]
            if same and "id" in entry:
                entry["id"] = rng.choice(same)["id"]


def _check_error(err: Any, path: str) -> str | None:
    if err.ann_file != path or not str(err).startswith(path + ":"):
        return f"the error does not name the file: {err}"
    if err.reason not in STRUCTURAL and err.image_id is None and err.annotation_id is None:
        if "annotation #" not in str(err) and "image #" not in str(err):
            return f"the error names neither an id nor a position: {err}"
    return None


def _check_index(index: Any, data: dict[str, Any]) -> str | None:
    counts = index.skip_counts
    images = sum(v for k, v in counts.items() if k.startswith("image_"))
    annotations = sum(v for k, v in counts.items() if not k.startswith("image_"))
    if index.num_images + images != len(data["images"]):
        return f"{index.num_images} images + {images} skipped != {len(data['images'])}"
    kept = index.num_instances + index.num_crowd
    total = len(data.get("annotations", []))  # an image-info file has none
    if kept + annotations != total:
        return f"{kept} annotations + {annotations} skipped != {total}"
    for i in range(len(index)):  # what a training epoch reads (crowd masks decoded by pycocotools)
        index.polygons(i)
        if index.heights[i] * index.widths[i] <= 1 << 22:
            index.crowd_mask(i)
    return None


def main(source: str, workdir: str, seed: int, runs: int) -> None:
    from seg_datamodule.io.coco import BadAnnotationError, CocoIndex

    text = Path(source).read_text()
    path = str(Path(workdir) / "fuzzed.json")
    for run in range(runs):
        print(f"START {run} seed={seed + run}", flush=True)
        data = json.loads(text)
        mutate(data, random.Random(seed + run))
        Path(path).write_text(json.dumps(data))
        problem = None
        try:
            for mode in ("raise", "skip"):
                try:
                    index = CocoIndex.build(path, workdir, on_bad_sample=mode, use_cache=False)
                except BadAnnotationError as err:
                    problem = _check_error(err, path)
                    if problem is None and mode == "skip" and err.reason not in STRUCTURAL:
                        problem = f"skip mode raised for a skippable reason: {err}"
                else:
                    problem = _check_index(index, data) if mode == "skip" else None
                if problem is not None:
                    break
        except Exception:  # noqa: BLE001 - anything else is the failure this test looks for
            problem = traceback.format_exc()
        if problem is not None:
            print(f"FAIL {run} seed={seed + run}: {problem}", flush=True)
            sys.exit(1)
    print(f"DONE {runs}", flush=True)
