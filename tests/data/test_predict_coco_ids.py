"""Predicting a folder: COCO-named files keep their COCO ids (so the results score against COCO's ground
truth), other names a stable hash, clashes refused; a phone photo is predicted as a person sees it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
from PIL import Image, ImageOps
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from _yolo import rotate_with_exif
from seg_datamodule import COCOResultsWriter, COCOSegDataModule
from seg_datamodule.data.samples.predict import PredictDataset
from seg_datamodule.io.images.ids import ImageIdClashError
from seg_datamodule.io.predict_source import list_image_folder, stable_image_id
from seg_datamodule.models import YolactLite


def _dm(coco_mini: Path, tmp_path: Path, folder: Path) -> COCOSegDataModule:
    ann = coco_mini / "annotations" / "instances_val2017.json"
    return COCOSegDataModule(train_ann=str(ann), train_images=str(coco_mini / "val2017"), predict_images=str(folder),
                             image_size=96, val_batch_size=4, num_workers=0, cache_dir=str(tmp_path / "cache"))


@pytest.mark.slow
def test_a_predicted_coco_folder_scores_against_the_coco_ground_truth(coco_mini: Path, tmp_path: Path) -> None:
    ann = coco_mini / "annotations" / "instances_val2017.json"
    folder = tmp_path / "val2017"
    folder.mkdir()
    names = sorted(p.name for p in (coco_mini / "val2017").iterdir())[:10]
    for name in names:
        (folder / name).symlink_to(coco_mini / "val2017" / name)
    dm = _dm(coco_mini, tmp_path, folder)
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    out = tmp_path / "out" / "results.json"
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[COCOResultsWriter(str(out))])
    trainer.predict(model, datamodule=dm, return_predictions=False)
    results = json.loads(out.read_text())
    assert {r["image_id"] for r in results} == {int(Path(n).stem) for n in names}
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ann))
        dets = coco.loadRes(str(out))  # refused before: "Results do not correspond to current coco set"
        evaluator = COCOeval(coco, dets, "segm")
        evaluator.params.imgIds = sorted({r["image_id"] for r in results})
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert len(dets.anns) == len(results) and 0.0 <= evaluator.stats[0] <= 1.0
    listed = json.loads(out.with_name("results_images.json").read_text())["images"]
    sizes = {i["id"]: (i["height"], i["width"]) for i in listed}
    assert sizes == {i: (coco.imgs[i]["height"], coco.imgs[i]["width"]) for i in sizes}


def test_a_photo_is_predicted_turned_and_its_size_says_so(coco_mini: Path, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    source = coco_mini / "val2017" / sorted(p.name for p in (coco_mini / "val2017").iterdir())[0]
    rotate_with_exif(source, folder / "IMG_0001.jpg", 6)  # stored turned; shows as the original
    images = list_image_folder(folder)
    assert images.oriented and images.image_ids.tolist() == [stable_image_id("IMG_0001.jpg")]
    sample = PredictDataset(images, image_size=320)[0]
    with Image.open(folder / "IMG_0001.jpg") as stored, Image.open(source) as original:
        shown = np.asarray(ImageOps.exif_transpose(stored).convert("RGB"))
        assert stored.size != original.size and sample.orig_size == original.size[::-1] == shown.shape[:2]
    # The canvas is the letterbox of the image as shown (the same as validation makes of it).
    scale, pad = sample.scale, sample.pad
    height, width = round(shown.shape[0] * scale), round(shown.shape[1] * scale)
    left, top = int(round(pad[0])), int(round(pad[1]))
    inside = sample.image[top + 2:top + height - 2, left + 2:left + width - 2].astype(np.int64)
    expected = cv2.resize(shown, (width, height), interpolation=cv2.INTER_AREA)[2:-2, 2:-2].astype(np.int64)
    assert np.abs(inside - expected).mean() < 3  # the same picture, not a turned one (that differs by ~40)


def test_a_clash_between_a_number_and_a_name_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for name in ("1.png", "sub/001.png"):
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / name)
    with pytest.raises(ImageIdClashError, match="'1.png' and 'sub/001.png' would both have image id 1"):
        list_image_folder(folder)
