"""The real models do the whole job (issue 50): ``test`` and ``predict`` for YOLO11-seg and Mask R-CNN on real
images (a COCO JSON and a data.yaml), results files pycocotools accepts, a non-finite loss named at its step, the
checkpoint's epoch in a validation from it, and Ultralytics' NMS time limit that drops detections off by default."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from _yolo import write_data_yaml, write_yolo_split
from seg_datamodule import COCOResultsWriter, COCOSegDataModule, InterruptCheckpoint
from seg_datamodule.evaluation import CocoDetections
from seg_datamodule.integrations import MaskRCNNModule, NonFiniteLossError
from seg_datamodule.integrations._stages import OnceFilter
from seg_datamodule.visualize import draw_results
from seg_datamodule.integrations import YOLOSegModule

needs_ultralytics = pytest.mark.needs("ultralytics")

VAL = "annotations/instances_val2017.json"
# Few proposals and a small backbone keep a CPU step cheap; the mechanics are those of the default.
SMALL_RCNN = dict(backbone="resnet18", warmup_steps=1, box_score_thresh=0.0, mask_rcnn_kwargs=dict(
    rpn_pre_nms_top_n_train=300, rpn_post_nms_top_n_train=100, rpn_pre_nms_top_n_test=300,
    rpn_post_nms_top_n_test=100, box_batch_size_per_image=64))
# conf 0: an untrained model's scores are below Ultralytics' 0.001, and a results file needs detections.
SMALL_YOLO = dict(nominal_batch_size=None, ema=False, conf=0.0, max_det=20)


@pytest.fixture(scope="module")
def held_out(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the first 8 val images by id as a COCO file, their folder): the held-back test split."""
    data = json.loads((coco_mini / VAL).read_text())
    ids = sorted(im["id"] for im in data["images"])[:8]
    data["images"] = [im for im in data["images"] if im["id"] in ids]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids]
    path = tmp_path_factory.mktemp("held_out") / "test.json"
    path.write_text(json.dumps(data))
    return path, coco_mini / "val2017"


def _trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    options = dict(max_steps=1, limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)
    return L.Trainer(**{**options, **kwargs})


def _test_and_predict(module: L.LightningModule, dm: COCOSegDataModule, truth: Path, tmp_path: Path) -> dict:
    """Test on ``dm``'s test split and predict its images; check the results file against ``truth``."""
    metrics = _trainer(tmp_path).test(module, datamodule=dm, verbose=False)[0]
    assert {"test/segm_AP", "test/bbox_AP", "test/segm_AP50"} <= set(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in ("test/segm_AP", "test/bbox_AP"))  # scored: never -1
    writer = COCOResultsWriter(output=str(tmp_path / "results.json"), score_threshold=0.0,
                               draw_dir=str(tmp_path / "pictures"))
    writer.draw_min_score = 0.0  # an untrained model's scores are low
    _trainer(tmp_path, callbacks=[writer]).predict(module, datamodule=dm, return_predictions=False)
    results = json.loads((tmp_path / "results.json").read_text())
    # Returned to Python too (Lightning moves them to the CPU): the same detections per image.
    returned = _trainer(tmp_path).predict(module, datamodule=dm)
    assert all(isinstance(d, CocoDetections) for d in returned)
    assert sum(int(d.dets_per_image.sum()) for d in returned) == len(results)
    gt_data = json.loads(truth.read_text())
    sizes = {im["id"]: (im["height"], im["width"]) for im in gt_data["images"]}
    categories = {c["id"] for c in gt_data["categories"]}
    assert results and {r["image_id"] for r in results} <= set(sizes)
    for r in results:
        assert r["category_id"] in categories and 0.0 <= r["score"] <= 1.0
        height, width = sizes[r["image_id"]]
        assert r["segmentation"]["size"] == [height, width]  # RLE at the original image's resolution
        x, y, w, h = r["bbox"]
        assert -1e-3 <= x and -1e-3 <= y and x + w <= width + 1e-3 and y + h <= height + 1e-3
        # The mask lies at its box: within two canvas cells of it (Mask R-CNN pastes its 28 x 28 mask into
        # the box padded by a cell; the inverse letterbox resamples at original pixel centres).
        rle = {"size": r["segmentation"]["size"], "counts": r["segmentation"]["counts"].encode()}
        cell = 2 * max(height, width) / dm.image_size
        if mask_utils.area(rle):
            mx, my, mw, mh = mask_utils.toBbox(rle)
            assert mx >= x - cell and my >= y - cell and mx + mw <= x + w + cell and my + mh <= y + h + cell
    # Pictures: each predicted image as shown, its detections drawn with class names (not indices).
    names = {c["id"]: c["name"] for c in gt_data["categories"]}
    for image_id, (height, width) in sizes.items():
        picture = cv2.imread(str(tmp_path / "pictures" / f"{image_id}.jpg"))
        assert picture.shape == (height, width, 3)
    first = max(results, key=lambda r: r["score"])
    original = cv2.cvtColor(cv2.imread(str(dm.predict_dataset.images.path(
        dm.predict_dataset.images.image_ids.tolist().index(first["image_id"])))), cv2.COLOR_BGR2RGB)
    drawn, labels = draw_results(original, [r for r in results if r["image_id"] == first["image_id"]], names, 0.0)
    assert labels[0] == f"{names[first['category_id']]} {first['score']:.2f}"
    assert all(label.rsplit(" ", 1)[0] in names.values() for label in labels)
    assert (drawn != original).any()
    # The independent reference: pycocotools reads the file and scores it against the ground truth.
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(truth))
        evaluator = COCOeval(gt, gt.loadRes(str(tmp_path / "results.json")), "segm")
        evaluator.evaluate(), evaluator.accumulate(), evaluator.summarize()
    assert 0.0 <= evaluator.stats[0] <= 1.0
    return metrics


@pytest.mark.parametrize("layout", ["coco", "data_yaml"])
@needs_ultralytics
def test_yolo_fits_tests_and_predicts(held_out, coco_mini: Path, tmp_path: Path, layout: str) -> None:
    truth, images = held_out
    if layout == "coco":
        dm = COCOSegDataModule(train_ann=str(truth), train_images=str(images), val_ann=str(truth),
                               val_images=str(images), test_ann=str(truth), test_images=str(images),
                               predict_images=str(images), predict_ann=str(truth),
                               image_size=64, batch_size=4, num_workers=0, cache_dir=str(tmp_path / "cache"))
        module = YOLOSegModule(num_classes=dm.num_classes, **SMALL_YOLO)
    else:
        root = tmp_path / "yolo"
        names = write_yolo_split(coco_mini / VAL, images, root, "val", limit=8)
        yaml = write_data_yaml(root, names, train="images/val", val="images/val", test="images/val")
        dm = COCOSegDataModule(dataset=str(yaml), predict_images=str(root / "images" / "val"),
                               image_size=64, batch_size=4, num_workers=0, cache_dir=str(tmp_path / "cache"))
        module = YOLOSegModule(num_classes=len(names), **SMALL_YOLO)
    _trainer(tmp_path).fit(module, datamodule=dm)
    validated = _trainer(tmp_path, limit_val_batches=2).validate(module, datamodule=dm, verbose=False)[0]
    assert 0.0 <= validated["val/segm_AP"] <= 1.0 and np.isfinite(validated["val/loss"])
    if layout == "data_yaml":  # scored against the ground truth written from its labels
        dm.setup("test")
        truth = Path(dm.evaluation_file("test"))
    _test_and_predict(module, dm, truth, tmp_path)


@pytest.mark.slow
def test_mask_rcnn_fits_tests_and_predicts(held_out, tmp_path: Path) -> None:
    truth, images = held_out
    dm = COCOSegDataModule(train_ann=str(truth), train_images=str(images), test_ann=str(truth),
                           test_images=str(images), predict_images=str(images), predict_ann=str(truth),
                           image_size=128, batch_size=2, num_workers=0, cache_dir=str(tmp_path / "cache"))
    module = MaskRCNNModule(num_classes=dm.num_classes, **SMALL_RCNN)
    _trainer(tmp_path).fit(module, datamodule=dm)
    _test_and_predict(module, dm, truth, tmp_path)


def _nan_first_conv(module: torch.nn.Module) -> None:
    with torch.no_grad():
        next(p for p in module.parameters() if p.ndim == 4).fill_(float("nan"))


class _NanAt(L.Callback):
    """Makes the model's first convolution NaN before training batch ``step`` (a diverged run)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            _nan_first_conv(pl_module)


@needs_ultralytics
def test_a_nan_training_loss_stops_at_its_step_with_a_checkpoint(held_out, tmp_path: Path) -> None:
    truth, images = held_out
    dm = COCOSegDataModule(train_ann=str(truth), train_images=str(images), image_size=64, batch_size=4,
                           num_workers=0, cache_dir=str(tmp_path / "cache"))
    module = YOLOSegModule(num_classes=dm.num_classes, **SMALL_YOLO)
    trainer = _trainer(tmp_path, max_steps=3, callbacks=[_NanAt(1), InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))])
    with pytest.raises(NonFiniteLossError) as caught:
        trainer.fit(module, datamodule=dm)
    message = str(caught.value)
    assert message.startswith("YOLOSegModule: the training loss is nan at step 1 (epoch 0); not finite: ")
    assert "box_loss nan" in message and "on_nonfinite_loss: skip" in message
    assert (tmp_path / "ckpt" / "interrupted.ckpt").is_file()


@needs_ultralytics
def test_skip_goes_on_without_a_step_and_says_it_once(held_out, tmp_path: Path) -> None:
    truth, images = held_out
    dm = COCOSegDataModule(train_ann=str(truth), train_images=str(images), image_size=64, batch_size=4,
                           num_workers=0, cache_dir=str(tmp_path / "cache"))
    module = YOLOSegModule(num_classes=dm.num_classes, on_nonfinite_loss="skip", **SMALL_YOLO)
    _nan_first_conv(module)
    with pytest.warns(UserWarning, match="non-finite training loss at step 0") as caught:
        _trainer(tmp_path, max_epochs=1, max_steps=-1).fit(module, datamodule=dm)
    assert sum("non-finite training loss" in str(w.message) for w in caught) == 1
    assert module._nonfinite_skipped == 2  # 8 images in batches of 4: both skipped, no optimiser step
    with pytest.raises(ValueError, match="on_nonfinite_loss"):
        YOLOSegModule(num_classes=2, on_nonfinite_loss="ignore")


@needs_ultralytics
def test_a_validation_from_a_checkpoint_prints_its_epoch(held_out, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    truth, images = held_out
    dm = COCOSegDataModule(train_ann=str(truth), train_images=str(images), val_ann=str(truth), val_images=str(images),
                           image_size=64, batch_size=4, num_workers=0, cache_dir=str(tmp_path / "cache"))
    module = YOLOSegModule(num_classes=dm.num_classes, **SMALL_YOLO)
    trainer = _trainer(tmp_path, max_steps=-1, max_epochs=3, limit_train_batches=1)
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "epoch3.ckpt")
    fresh = YOLOSegModule(num_classes=dm.num_classes, **SMALL_YOLO)
    with caplog.at_level(logging.INFO):
        _trainer(tmp_path, limit_val_batches=1).validate(fresh, datamodule=dm, ckpt_path=str(tmp_path / "epoch3.ckpt"),
                                                         verbose=False)
    saved = torch.load(tmp_path / "epoch3.ckpt", weights_only=False)["epoch"]
    said = [r.getMessage() for r in caplog.records if "COCO val segm AP" in r.getMessage()]
    assert saved == 3 and said and said[-1].startswith("epoch 3: COCO val segm AP")  # the checkpoint's, not 0


@needs_ultralytics
def test_nms_has_no_time_limit_by_default(held_out, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow device (time jumps 100 s per call here) keeps every image's detections, with no warning;
    with a limit set, Ultralytics gives up on the batch as it does."""
    import ultralytics.utils.nms as nms

    truth, images = held_out
    dm = COCOSegDataModule(val_ann=str(truth), val_images=str(images), image_size=64, batch_size=4, num_workers=0,
                           cache_dir=str(tmp_path / "cache"))
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    clock = iter(np.arange(0.0, 1e6, 100.0))
    monkeypatch.setattr(nms.time, "time", lambda: float(next(clock)))
    warned: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    handler = Collect()
    nms.LOGGER.addHandler(handler)
    try:
        module = YOLOSegModule(num_classes=dm.num_classes, **SMALL_YOLO).eval()
        with torch.no_grad():
            preds = module.predict_batch(batch)
        assert [len(p["boxes"]) for p in preds] == [20] * len(batch) and not warned
        limited = YOLOSegModule(num_classes=dm.num_classes, nms_time_limit=0.05, **SMALL_YOLO).eval()
        limited.load_state_dict(module.state_dict())
        with torch.no_grad():
            cut = [limited.predict_batch(batch) for _ in range(3)]
    finally:
        nms.LOGGER.removeHandler(handler)
        for once in [f for f in nms.LOGGER.filters if isinstance(f, OnceFilter)]:
            nms.LOGGER.removeFilter(once)
    assert all(sum(len(p["boxes"]) for p in preds) < 20 * len(batch) for preds in cut)
    # Three batches given up on: one line, with what to change.
    assert len(warned) == 1 and "NMS time limit" in warned[0] and "nms_time_limit: null" in warned[0]
