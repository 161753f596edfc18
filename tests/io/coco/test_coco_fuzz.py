"""Fuzz the COCO loader with mutated real annotation files (issue 11).

Every run of a randomly mutated coco-mini file (keys deleted, types swapped, extreme and
non-finite numbers, wrong nesting, duplicate ids) must end with a :class:`BadAnnotationError`
naming the file and an id (raise mode) or with skip counts that add up to the file's entries
(skip mode): never another exception, never a signal, never a hang. The runs happen in a child
process with a capped heap, so a crash is reported with the seed that reproduces it.

``SEG_FUZZ_RUNS`` (default 40, a few seconds) and ``SEG_FUZZ_SEED`` (default 0) set how many
runs and where their seeds start: ``SEG_FUZZ_RUNS=5000 pytest tests/io/coco/test_coco_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from _coco_cases import run_isolated


def _small_copy(coco_mini: Path, out: Path, num_images: int = 12) -> Path:
    """The first images of coco-mini train with their annotations (crowd ones included)."""
    data = json.loads((coco_mini / "annotations" / "instances_train2017.json").read_text())
    crowd_images = {a["image_id"] for a in data["annotations"] if a["iscrowd"]}
    images = [img for img in data["images"] if img["id"] in crowd_images][:3]
    images += [img for img in data["images"] if img not in images][: num_images - len(images)]
    ids = {img["id"] for img in images}
    data["images"] = images
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids]
    out.write_text(json.dumps(data))
    return out


def test_mutated_annotation_files_are_named_or_counted(coco_mini: Path, tmp_path: Path) -> None:
    runs = int(os.environ.get("SEG_FUZZ_RUNS", "40"))
    seed = int(os.environ.get("SEG_FUZZ_SEED", "0"))
    source = _small_copy(coco_mini, tmp_path / "source.json")
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import _coco_fuzz; _coco_fuzz.main({str(source)!r}, {str(tmp_path)!r}, {seed}, {runs})\n"
    )
    try:
        done = run_isolated(script, timeout=60 + 2 * runs)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        pytest.fail(f"a build hung: {out.strip().splitlines()[-1:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(("START", "FAIL", "DONE"))]
    last = lines[-1] if lines else "(nothing)"
    assert done.returncode == 0, (
        f"child ended with {done.returncode} at {last!r} "
        f"(rerun with SEG_FUZZ_SEED=<seed> SEG_FUZZ_RUNS=1):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert last == f"DONE {runs}"
