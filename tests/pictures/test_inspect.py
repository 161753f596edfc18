"""``seg-datamodule inspect`` (issue 51): a static HTML report a real browser renders, whose gallery shows
every reason found in a CVAT-style export, a YOLO split with a box-only file, and a clean split
through the training recipe. The browser is Debian's headless Chromium (``.ci/run`` installs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from _optional import chromium, require
from _yolo import write_data_yaml, write_yolo_split

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "coco-cc-by"
CHROMIUM = chromium()


def _inspect(args: list[str], cwd: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "seg_datamodule", "inspect", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = Path(re.search(r"wrote (\S+index\.html)", proc.stdout).group(1))
    return page if page.is_absolute() else cwd / page


def _gallery(page: Path) -> set[str]:
    return set(re.findall(r"<h3>([a-z_]+) \(\d+ shown\)</h3>", page.read_text()))


def _browser(page: Path, tmp_path: Path) -> None:
    """The page in headless Chromium: every picture decoded, and a screenshot that shows them."""
    require("chromium")  # the report's checks above ran; only the browser's is skipped
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'c'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    images = page.read_text().count("<img ")
    assert images > 0 and f'data-images-loaded="{images}"' in dom, re.findall(r"data-images-loaded=\"\d+\"", dom)
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1280,1800", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    picture = cv2.imread(str(shot))
    assert picture is not None and picture.shape[:2] == (1800, 1280)
    # pictures, not only text: many distinct colours, and most of the page not white
    assert len(np.unique(picture.reshape(-1, 3) // 16, axis=0)) > 200 and (picture < 240).any(axis=2).mean() > 0.2


def _cvat_export(root: Path) -> Path:
    """The fixture's train split as CVAT exports it: every mask a crowd RLE, plus a two-point polygon,
    a zero-area one, a box without a mask, and one image file that is not a JPEG."""
    data = json.loads((FIXTURE / "annotations" / "instances_train2017.json").read_text())
    images = root / "images"
    shutil.copytree(FIXTURE / "train2017", images)
    sizes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    for a in data["annotations"]:
        if not a["iscrowd"]:
            h, w = sizes[a["image_id"]]
            rle = mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], h, w))
            a["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode()}
            a["iscrowd"] = 1
    first = data["annotations"][0]
    extra = [{"segmentation": [[10, 10, 50, 50]]}, {"segmentation": [[10, 10, 50, 10, 90, 10]]},
             {"segmentation": []}]
    next_id = max(a["id"] for a in data["annotations"]) + 1
    for k, fields in enumerate(extra):
        data["annotations"].append({**first, "id": next_id + k, "iscrowd": 0, "bbox": [10, 10, 40, 40], "area": 1600,
                                    **fields})
    corrupt = data["images"][-1]["file_name"]
    (images / corrupt).write_bytes(b"not a jpeg, as a failed download leaves it")
    path = root / "instances.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow
@pytest.mark.needs("chromium", partly=True)
def test_a_cvat_export_shows_every_reason_and_opens_in_a_browser(tmp_path: Path) -> None:
    ann = _cvat_export(tmp_path / "cvat")
    page = _inspect(["--config", str(ROOT / "configs" / "coco.yaml"), "--data.train_ann", str(ann),
                     "--data.train_images", str(tmp_path / "cvat" / "images"), "--data.val_ann", "null",
                     "--data.val_images", "null", "--data.on_bad_sample", "skip", "--data.image_size", "128",
                     "--data.cache_dir", str(tmp_path / "cache"), "--output", str(tmp_path / "report")], tmp_path)
    assert {"crowd", "polygon_too_few_points", "zero_area", "box_only", "image_corrupt"} <= _gallery(page)
    text = page.read_text()
    assert "setup stops this split" in text and "crowd_as_instances" in text  # all crowd: nothing to learn, said
    _browser(page, tmp_path)


@pytest.mark.slow
@pytest.mark.needs("chromium", partly=True)
def test_a_yolo_split_with_a_box_only_file_and_a_clean_split_through_the_recipe(coco_mini: Path,
                                                                                tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    names = write_yolo_split(coco_mini / "annotations" / "instances_train2017.json", coco_mini / "train2017", root,
                             "train2017", limit=8)
    label = sorted((root / "labels" / "train2017").iterdir())[0]
    label.write_text("0 0.5 0.5 0.2 0.3\n1 0.3 0.3 0.1 0.1\n")  # a file of box lines (a detection export)
    yaml = write_data_yaml(root, names, train="images/train2017")
    page = _inspect(["--config", str(ROOT / "configs" / "demo.yaml"), "--data.dataset", str(yaml),
                     "--data.val_split", "null", "--data.image_size", "128", "--data.cache_dir",
                     str(tmp_path / "cache"), "--output", str(tmp_path / "yolo_report")], tmp_path)
    assert "box_only" in _gallery(page) and label.name in page.read_text() or f"id {int(label.stem)}" in page.read_text()

    # A clean split: its images beside their training samples, and what the mosaic drops, by reason.
    page = _inspect(["--config", str(ROOT / "configs" / "coco.yaml"), "--data.train_ann",
                     str(coco_mini / "annotations" / "instances_train2017.json"), "--data.train_images",
                     str(coco_mini / "train2017"), "--data.val_ann", "null", "--data.val_images", "null",
                     "--data.image_size", "128", "--data.cache_dir", str(tmp_path / "cache"), "--samples", "4",
                     "--output", str(tmp_path / "clean")], tmp_path)
    text = page.read_text()
    assert "setup stops" not in text and text.count('src="images/raw_') == 4 and text.count('src="images/recipe_') == 4
    assert {"outside", "clipped"} <= _gallery(page)
    _browser(page, tmp_path)
