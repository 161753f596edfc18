"""Evaluation never hands pycocotools a mask its RLE strings cannot hold: on images of 2^24 pixels
or more, ground truth and predictions are encoded by the package or refused, naming what.

Each case runs in a subprocess: pycocotools' encoder overflowing its buffer aborts the process
("free(): invalid next size"), which fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDE = (4096, 20480)  # 5 * 2^24 pixels
FULL_BUFFER = [2**24, 2**24, 2**24, 2**25]  # every number of pycocotools' string 6 characters long


def _ground_truth(tmp_path: Path, extra: list[dict] | None = None) -> Path:
    """One wide image: a crowd region pycocotools' encoder would overflow on and a small square."""
    h, w = WIDE
    square = [100.0, 100.0, 300.0, 100.0, 300.0, 300.0, 100.0, 300.0]
    data = {
        "images": [{"id": 1, "file_name": "wide.jpg", "height": h, "width": w}],
        "categories": [{"id": 7, "name": "thing"}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 7, "iscrowd": 1, "area": float(2**24 + 2**25),
             "bbox": [4096.0, 0.0, 16384.0, 4096.0], "segmentation": {"size": [h, w], "counts": FULL_BUFFER}},
            {"id": 11, "image_id": 1, "category_id": 7, "iscrowd": 0, "area": 40000.0,
             "bbox": [100.0, 100.0, 200.0, 200.0], "segmentation": [square]},
            *(extra or []),
        ],
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(data))
    return path


_EVALUATE = """
import sys
import numpy as np
import torch
from pycocotools import mask as mask_utils
from seg_datamodule.evaluation import CocoDetections, evaluate_detections, load_coco
coco = load_coco(sys.argv[1], backend=sys.argv[2])
# The square itself as the one detection: COCOeval encodes the ground truth's polygon and scores it.
h, w = 4096, 20480
rle = mask_utils.frPyObjects([[100.0, 100.0, 300.0, 100.0, 300.0, 300.0, 100.0, 300.0]], h, w)[0]
data = bytearray(rle["counts"])
dets = CocoDetections(image_ids=torch.tensor([1]), dets_per_image=torch.tensor([1]), category_ids=torch.tensor([7]),
                      scores=torch.tensor([0.9]), boxes=torch.tensor([[100.0, 100.0, 200.0, 200.0]]),
                      rle_lengths=torch.tensor([len(data)]), rle_bytes=torch.frombuffer(data, dtype=torch.uint8))
out = evaluate_detections(coco, dets, backend=sys.argv[2])
print("AP", round(out["segm_AP"], 4), round(out["bbox_AP"], 4))
crowd = coco.anns[10]["segmentation"]
print("crowd", type(crowd["counts"]).__name__, int(mask_utils.area(crowd)))
"""


def _python(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)


def test_ground_truth_pycocotools_would_overflow_on_is_encoded_here_and_scored(tmp_path: Path) -> None:
    """COCOeval's own encoding of this crowd RLE aborted the process; now it reads a string encoded
    here, and the image scores as it should (the exact detection: AP 1)."""
    gt = _ground_truth(tmp_path)
    for backend in ("pycocotools", "faster_coco_eval"):
        proc = _python(_EVALUATE, str(gt), backend)
        assert proc.returncode == 0, f"{backend}: exit {proc.returncode}: {proc.stderr[-3000:]}"
        assert proc.stdout.splitlines() == ["AP 1.0 1.0", f"crowd str {2**24 + 2**25}"], (backend, proc.stdout)


_REFUSE = """
import sys
from seg_datamodule.evaluation import MaskTooLargeError, load_coco
from seg_datamodule.errors import UserInputError
try:
    load_coco(sys.argv[1], backend="pycocotools")
except MaskTooLargeError as error:
    assert isinstance(error, (UserInputError, ValueError))
    print(error)
"""


def test_ground_truth_it_cannot_hold_is_named(tmp_path: Path) -> None:
    """A polygon spanning the full height of the wide image (its encoding could overflow), and on an
    image of 2^30 pixels a mask whose first run is 2^29 long: each refused with file and ids."""
    h, w = WIDE
    tall = {"id": 12, "image_id": 1, "category_id": 7, "iscrowd": 0, "area": 1.0, "bbox": [5.0, 0.0, 10.0, h],
            "segmentation": [[5.0, -1.0, 15.0, -1.0, 15.0, h + 1.0, 5.0, h + 1.0]]}
    proc = _python(_REFUSE, str(_ground_truth(tmp_path, [tall])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"{tmp_path / 'gt.json'}: annotation id 12 of image id 1: its polygon: it spans "
                                  "the full height"), proc.stdout
    assert "evaluate bbox only" in proc.stdout

    huge = json.loads((tmp_path / "gt.json").read_text())
    huge["images"].append({"id": 2, "file_name": "huge.jpg", "height": 2**15, "width": 2**15})
    huge["annotations"] = [{"id": 20, "image_id": 2, "category_id": 7, "iscrowd": 1, "area": 5.0,
                            "bbox": [2**14, 0.0, 1.0, 5.0], "segmentation": {"size": [2**15, 2**15],
                                                                             "counts": [2**29, 5, 2**29 - 5]}}]
    (tmp_path / "gt.json").write_text(json.dumps(huge))
    proc = _python(_REFUSE, str(tmp_path / "gt.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "annotation id 20 of image id 2: its RLE holds a run of 536870912 pixels" in proc.stdout, proc.stdout


_PREDICT = """
import numpy as np
from pycocotools import mask as mask_utils
from seg_datamodule.evaluation import MaskTooLargeError
from seg_datamodule.evaluation.letterbox import MaskWindow
from seg_datamodule.evaluation.predictions import encode_windows
from seg_datamodule.ops.rle import rle_counts_from_string
block = np.ones((4096, 4096), bool)  # columns 4096..8191 and 12288..16383 on: the overflowing case
wide = encode_windows([MaskWindow(0, 4096, block), MaskWindow(0, 12288, np.ones((4096, 8192), bool))], (4096, 20480))
print([rle_counts_from_string(c) for c in wide][0], int(mask_utils.area({"size": [4096, 20480], "counts": wide[1]})))
try:
    encode_windows([MaskWindow(0, 0, np.zeros((1, 1), bool))], (2**15, 2**15))
except MaskTooLargeError as error:
    print(error)
"""


def test_predicted_masks_are_encoded_here_or_named() -> None:
    """On the wide image pycocotools' encoder is not used (the bytes are its format, read back by it);
    on a 2^30-pixel image an empty mask is one run of 2^30 pixels: named, not encoded."""
    proc = _python(_PREDICT)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    first, second = proc.stdout.splitlines()[:2]
    assert first == f"[{2**24}, {2**24}, {5 * 2**24 - 2**25}] {2**25}", first
    assert second.startswith("a predicted mask of the 32768x32768 (HxW) image holds a run of 1073741824 pixels")
