"""YolactLite and its loss functions: shapes, hand-computed losses, empty batches, and learning."""

from __future__ import annotations

import math
from typing import Iterator

import lightning as L
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule import Sample, collate_detection
from seg_datamodule.demo.data import DEMO_CATEGORIES, draw_scene
from seg_datamodule.demo.losses import box_predictions
from seg_datamodule.models import YolactLite, assemble_masks, crop_to_boxes, mask_iou, mask_loss
from seg_datamodule.structures import DetectionBatch, Polygons

CATEGORY_IDS = [c["id"] for c in DEMO_CATEGORIES]


def _scene_sample(rng: np.random.Generator, canvas: int, image_id: int) -> Sample:
    """A demo scene drawn straight onto the canvas, as a Sample (boxes from its polygons)."""
    scene = draw_scene(rng, (canvas, canvas), num_shapes=(1, 4), shape_size=(16, 64))
    polygons = [inst for inst in scene.instances if not inst.iscrowd]
    crowds = [inst.crowd_mask for inst in scene.instances if inst.iscrowd]
    vertices, ring_offsets, instance_offsets = Polygons.from_instances([inst.rings for inst in polygons]).arrays
    boxes = np.array(
        [np.concatenate([np.min(np.concatenate(i.rings), 0), np.max(np.concatenate(i.rings), 0)]) for i in polygons],
        np.float32,
    ).reshape(-1, 4)
    return Sample(
        image=scene.image,
        image_id=image_id,
        polygons=Polygons(vertices, ring_offsets, instance_offsets),
        labels=np.array([CATEGORY_IDS.index(i.category_id) for i in polygons], np.int64),
        annotation_ids=np.arange(len(polygons), dtype=np.int64) + 100 * image_id,
        boxes=np.clip(boxes, 0, canvas),
        crowd_mask=np.logical_or.reduce(crowds) if crowds else None,
    )


def _empty_sample(canvas: tuple[int, int], image_id: int) -> Sample:
    vertices, ring_offsets, instance_offsets = Polygons.empty().arrays
    return Sample(
        image=np.full((*canvas, 3), 114, np.uint8),
        image_id=image_id,
        polygons=Polygons(vertices, ring_offsets, instance_offsets),
        labels=np.zeros(0, np.int64),
        annotation_ids=np.zeros(0, np.int64),
        boxes=np.zeros((0, 4), np.float32),
    )


def _square_sample(canvas: tuple[int, int], image_id: int, box: tuple[float, float, float, float]) -> Sample:
    x0, y0, x1, y1 = box
    vertices, ring_offsets, instance_offsets = Polygons.from_instances(
        [[np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])]]
    ).arrays
    image = np.full((*canvas, 3), 114, np.uint8)
    image[int(y0) : int(y1), int(x0) : int(x1)] = (200, 40, 40)
    return Sample(
        image=image,
        image_id=image_id,
        polygons=Polygons(vertices, ring_offsets, instance_offsets),
        labels=np.array([1], np.int64),
        annotation_ids=np.array([image_id * 10], np.int64),
        boxes=np.array([box], np.float32),
    )


# ------------------------------------------------------------------------------ pure functions


def test_crop_to_boxes_empty_first() -> None:
    assert crop_to_boxes(torch.zeros(0, 4), (3, 5), 4).shape == (0, 3, 5)


def test_crop_to_boxes_uses_cell_centres() -> None:
    # stride 4: centres x = 2, 6, 10, 14 and y = 2, 6, 10; the box is closed.
    crop = crop_to_boxes(torch.tensor([[2.0, 2.0, 10.0, 6.0], [7.0, 7.0, 9.0, 9.0]]), (3, 4), 4)
    expected = torch.zeros(2, 3, 4, dtype=torch.bool)
    expected[0, 0:2, 0:3] = True  # box 1 is narrower than a cell and holds no centre
    assert torch.equal(crop, expected)


def test_mask_loss_hand_computed() -> None:
    # stride 1 on a 2x2 grid: cell centres at 0.5 and 1.5.
    logits = torch.tensor([[[0.0, 2.0], [-2.0, 0.0]], [[3.0, 100.0], [100.0, 100.0]]])
    targets = torch.tensor([[[1, 1], [0, 0]], [[0, 0], [0, 0]]], dtype=torch.bool)
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])  # 2nd box: cell (0, 0) only
    # Instance 0: BCE of (0, 1), (2, 1), (-2, 0), (0, 0) over its 4 cells; instance 1: (3, 0) / 1.
    first = (2 * math.log(2.0) + 2 * math.log1p(math.exp(-2.0))) / 4
    second = math.log1p(math.exp(3.0))
    loss = mask_loss(logits, targets, boxes, stride=1)
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_mask_loss_ignores_outside_the_box() -> None:
    logits = torch.zeros(1, 4, 4)
    targets = torch.zeros(1, 4, 4, dtype=torch.bool)
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    base = mask_loss(logits, targets, boxes, stride=1)
    logits[0, 3, 3] = 50.0  # far outside the box: no effect
    assert mask_loss(logits, targets, boxes, stride=1) == base
    with pytest.raises(ValueError, match="same shape"):
        mask_loss(logits, targets[:, :3], boxes, stride=1)


def test_mask_loss_zero_instances_is_a_connected_zero() -> None:
    logits = torch.zeros(0, 5, 6, requires_grad=True)
    loss = mask_loss(logits, torch.zeros(0, 5, 6, dtype=torch.bool), torch.zeros(0, 4), stride=4)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert logits.grad is not None and logits.grad.shape == (0, 5, 6)


def test_assemble_masks_matches_a_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    protos = torch.randn(3, 4, 5, 6, generator=gen)
    coefficients = torch.randn(5, 4, generator=gen)
    counts = torch.tensor([2, 0, 3])
    out = assemble_masks(protos, coefficients, counts)
    image_of = [0, 0, 2, 2, 2]
    for n, b in enumerate(image_of):
        expected = (coefficients[n, :, None, None] * protos[b]).sum(0)
        torch.testing.assert_close(out[n], expected)
    assert assemble_masks(protos, coefficients[:0], torch.zeros(3, dtype=torch.int64)).shape == (0, 5, 6)


def test_mask_iou_hand_computed() -> None:
    logits = torch.full((2, 2, 3), -5.0)
    logits[0, 0, :2] = 5.0  # predicts 2 cells, target has 3 of which 2 overlap -> 2/3
    logits[0, 1, 2] = 5.0  # outside the box: cropped away
    targets = torch.zeros(2, 2, 3, dtype=torch.bool)
    targets[0, 0, :] = True
    boxes = torch.tensor([[0.0, 0.0, 3.0, 1.0], [0.0, 0.0, 3.0, 2.0]])  # instance 1: both empty
    iou = mask_iou(logits, targets, boxes, stride=1)
    torch.testing.assert_close(iou, torch.tensor([2 / 3, 1.0]))


# -------------------------------------------------------------------------------------- model


@pytest.mark.parametrize("canvas", [(64, 96), (70, 90)])  # the second is not a multiple of 8
def test_forward_shapes(canvas: tuple[int, int]) -> None:
    model = YolactLite(num_classes=5, num_prototypes=6, width=8)
    batch = collate_detection(
        [_square_sample(canvas, 1, (4, 4, 30, 40)), _empty_sample(canvas, 2), _square_sample(canvas, 3, (10, 8, 60, 50))]
    )
    out = model(batch.images, batch.boxes, batch.boxes_per_image)
    hp, wp = batch.masks.shape[-2:]
    assert (hp, wp) == (math.ceil(canvas[0] / 4), math.ceil(canvas[1] / 4))
    assert out.protos.shape == (3, 6, hp, wp)
    assert out.coefficients.shape == (2, 6) and out.coefficients.abs().max() <= 1
    assert out.class_logits.shape == (2, 5)
    assert out.mask_logits.shape == (2, hp, wp)


def _grads_after_backward(model: YolactLite, batch: DetectionBatch) -> dict[str, torch.Tensor]:
    model.train()
    losses, _ = model.compute_losses(batch)
    losses["loss"].backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_zero_instance_batch_backward_reaches_every_parameter() -> None:
    model = YolactLite(num_classes=3, width=8)
    batch = collate_detection([_empty_sample((48, 64), 1), _empty_sample((48, 64), 2)])
    assert batch.masks.shape == (0, 12, 16)
    losses, _ = model.compute_losses(batch)
    assert losses["loss"].item() == 0.0
    grads = _grads_after_backward(model, batch)
    # Every parameter gets a (zero) gradient, not None: DDP would otherwise wait on it.
    assert all(g is not None for g in grads.values())


def test_batch_size_one_and_training_step() -> None:
    model = YolactLite(num_classes=3, width=8)
    batch = collate_detection([_square_sample((64, 64), 1, (8, 8, 40, 48))])
    grads = _grads_after_backward(model, batch)
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        YolactLite(num_classes=0)
    with pytest.raises(ValueError, match="mask_stride"):
        YolactLite(num_classes=2, mask_stride=3)
    with pytest.raises(ValueError, match="lr must be > 0"):
        YolactLite(num_classes=2, lr=0.0)
    # The same words as every entry point (ops.checks): a wrong type is a TypeError.
    with pytest.raises(TypeError, match="num_classes must be an int >= 1, got '3'"):
        YolactLite(num_classes="3")
    with pytest.raises(TypeError, match="mask_stride must be an int >= 2, got True"):
        YolactLite(num_classes=2, mask_stride=True)
    with pytest.raises(ValueError, match=r"weight_decay must be a finite number >= 0, got -1\.0"):
        YolactLite(num_classes=2, weight_decay=-1.0)
    with pytest.raises(TypeError, match="coco_eval must be a bool"):
        YolactLite(num_classes=2, coco_eval="yes")
    model = YolactLite(num_classes=2, width=8)
    batch = collate_detection([_square_sample((64, 64), 1, (8, 8, 40, 48))], mask_stride=8)
    with pytest.raises(ValueError, match="mask_stride=8"):
        model.compute_losses(batch)


class _MaskLossRecorder(L.Callback):
    def __init__(self) -> None:
        self.mask_losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.mask_losses.append(float(trainer.callback_metrics["train/mask_loss"]))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a small shared CPU, OpenMP threads that spin-wait for a busy core
    make this tiny model 2-5x slower, not faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_model_learns_with_a_real_trainer() -> None:
    rng = np.random.default_rng(0)
    canvas = 128
    samples = [_scene_sample(rng, canvas, image_id=i + 1) for i in range(24)]
    samples[5] = _empty_sample((canvas, canvas), 6)  # an image without instances on the way
    loader = torch.utils.data.DataLoader(
        samples, batch_size=8, shuffle=True, collate_fn=collate_detection, generator=torch.Generator().manual_seed(0)
    )
    val_loader = torch.utils.data.DataLoader(samples[:8], batch_size=8, collate_fn=collate_detection)
    model = YolactLite(num_classes=len(CATEGORY_IDS), width=16)
    recorder = _MaskLossRecorder()
    trainer = L.Trainer(
        max_steps=90,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=10,
        callbacks=[recorder],
    )
    trainer.fit(model, loader, val_loader)
    losses = recorder.mask_losses
    assert len(losses) == 90
    first, last = np.mean(losses[:3]), np.mean(losses[-9:])
    assert last < 0.6 * first, f"mask loss {first:.3f} -> {last:.3f}"
    metrics = trainer.validate(model, val_loader, verbose=False)[0]
    assert metrics["val/mask_iou"] > 0.5
    assert metrics["val/cls_acc"] > 0.8


# --------------------------------------------------------------------------- COCO AP in validation


def test_box_predictions_split_per_image_and_crop() -> None:
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0], [4.0, 4.0, 16.0, 16.0], [0.0, 0.0, 16.0, 16.0]])
    class_logits = torch.tensor([[0.0, 2.0], [3.0, 0.0], [0.0, 0.0]])
    mask_logits = torch.ones(3, 4, 4)
    preds = box_predictions(boxes, class_logits, mask_logits, torch.tensor([2, 0, 1]), stride=4)
    assert [len(p["scores"]) for p in preds] == [2, 0, 1]
    assert preds[0]["labels"].tolist() == [1, 0] and preds[2]["labels"].tolist() == [0]
    torch.testing.assert_close(preds[0]["scores"][0], torch.sigmoid(torch.tensor(2.0)))
    assert (preds[0]["mask_logits"][0] > 0).sum() == 4  # cell centres 2 and 6 inside [0, 8]
    assert preds[1]["mask_logits"].shape == (0, 4, 4)
    empty = box_predictions(torch.zeros(0, 4), torch.zeros(0, 2), torch.zeros(0, 4, 4), torch.tensor([0]), 4)
    assert empty[0]["labels"].dtype == torch.int64 and empty[0]["scores"].shape == (0,)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_coco_ap_lands_in_metrics_csv(demo_dir, tmp_path) -> None:
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from seg_datamodule import COCOSegDataModule

    dm = COCOSegDataModule(image_size=128, batch_size=8, num_workers=0, demo_dir=str(demo_dir),
                           cache_dir=str(tmp_path / "cache"), mosaic=0.0)
    model = YolactLite(num_classes=dm.num_classes, width=8)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=3, accelerator="cpu", enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=1,
                        logger=CSVLogger(str(tmp_path), name="run"), log_every_n_steps=1)
    trainer.fit(model, datamodule=dm)
    assert model.coco_metric is not None and model.coco_metric.ann_file == dm.val_ann
    with open(tmp_path / "run" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    values = [(float(r["val/segm_AP"]), float(r["val/bbox_AP"])) for r in rows if r.get("val/segm_AP")]
    assert len(values) == 2  # one per epoch, none from the sanity check
    assert all(0.0 <= v <= 1.0 for pair in values for v in pair)
    assert {"val/segm_AP50", "val/segm_AP75", "val/segm_AP_small", "val/bbox_AP_large"} <= set(rows[0])

    with pytest.raises(ValueError, match="categories but the model has num_classes=3"):
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  limit_val_batches=1).validate(YolactLite(num_classes=3, width=8), datamodule=dm)


@pytest.mark.slow
@pytest.mark.extended  # default tier: tests/evaluation/test_coco_metric_ddp.py (two ranks equal one process)
def test_coco_ap_under_ddp_spawn_on_two_cpu_processes(demo_dir, tmp_path) -> None:
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from seg_datamodule import COCOSegDataModule

    # 16 validation images: 8 per rank, in batches of 5 and 3; rank 0 evaluates, both log the result.
    dm = COCOSegDataModule(image_size=128, batch_size=8, val_batch_size=5, num_workers=0, demo_dir=str(demo_dir),
                           cache_dir=str(tmp_path / "cache"), mosaic=0.0)
    model = YolactLite(num_classes=dm.num_classes, width=8)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, accelerator="cpu", strategy="ddp_spawn", devices=2,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        num_sanity_val_steps=0, logger=CSVLogger(str(tmp_path), name="run"))
    trainer.fit(model, datamodule=dm)
    with open(tmp_path / "run" / "version_0" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/segm_AP")]
    assert len(rows) == 1 and 0.0 <= float(rows[0]["val/segm_AP"]) <= 1.0 and 0.0 <= float(rows[0]["val/bbox_AP"]) <= 1.0


# ------------------------------------------------------------------ the model beside the DataModule


def _files_dm(demo_dir, tmp_path, **kwargs):
    """A DataModule given the demo's files explicitly, as a user gives COCO's (both val_ann set)."""
    from seg_datamodule import COCOSegDataModule

    ann = demo_dir / "annotations"
    return COCOSegDataModule(train_ann=str(ann / "instances_train2017.json"), train_images=str(demo_dir / "train2017"),
                             val_ann=str(ann / "instances_val2017.json"), val_images=str(demo_dir / "val2017"),
                             image_size=128, batch_size=8, num_workers=0, cache_dir=str(tmp_path / "cache"),
                             mosaic=0.0, **kwargs)


def _logged_trainer(tmp_path, **kwargs) -> L.Trainer:
    from lightning.pytorch.loggers import CSVLogger

    return L.Trainer(accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, logger=CSVLogger(str(tmp_path), name="run"), **kwargs)


def test_val_ann_is_not_a_hyperparameter() -> None:
    # Lightning refuses a key that the model and the DataModule log with different values; the
    # DataModule logs val_ann, so the model must not (whatever the user passes).
    assert "val_ann" not in YolactLite(num_classes=3, width=8).hparams
    model = YolactLite(num_classes=3, width=8, val_ann="instances_val2017.json")
    assert "val_ann" not in model.hparams and model.val_ann == "instances_val2017.json"


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_fit_with_a_logger_and_the_datamodules_val_ann(demo_dir, tmp_path) -> None:
    """The README's Python example's shape: val_ann on the DataModule only, a logger attached."""
    dm = _files_dm(demo_dir, tmp_path)
    model = YolactLite(num_classes=dm.num_classes, width=8)
    trainer = _logged_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=1.0,
                              num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(model, datamodule=dm)  # crashed: "the keys ['val_ann'] are present in both ..."
    assert model.coco_metric is not None and model.coco_metric.ann_file == dm.val_ann
    # Both sides logged (the file holds tuples, which safe_load refuses: read it line by line).
    lines = (tmp_path / "run" / "version_0" / "hparams.yaml").read_text().splitlines()
    assert f"val_ann: {dm.val_ann}" in lines and "num_prototypes: 16" in lines


def test_a_model_val_ann_that_differs_from_the_datamodules_is_refused(demo_dir, tmp_path) -> None:
    other = tmp_path / "other_val.json"
    other.write_text((demo_dir / "annotations" / "instances_val2017.json").read_text())
    dm = _files_dm(demo_dir, tmp_path)
    model = YolactLite(num_classes=dm.num_classes, width=8, val_ann=str(other))
    with pytest.raises(ValueError, match=r"val_ann='.*other_val\.json'\) differs from the DataModule's "
                                         r"val_ann='.*instances_val2017\.json'"):
        _logged_trainer(tmp_path, max_steps=1).fit(model, datamodule=dm)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_same_file_spelled_another_way_is_accepted(demo_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(demo_dir)
    dm = _files_dm(demo_dir, tmp_path)
    model = YolactLite(num_classes=dm.num_classes, width=8, val_ann="annotations/../annotations/instances_val2017.json")
    trainer = _logged_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1.0,
                              num_sanity_val_steps=0)
    trainer.validate(model, datamodule=dm)
    assert model.coco_metric is not None


def test_a_mask_stride_that_differs_from_the_datamodules_is_refused(demo_dir, tmp_path) -> None:
    dm = _files_dm(demo_dir, tmp_path, mask_stride=8)
    model = YolactLite(num_classes=dm.num_classes, width=8, mask_stride=4)
    with pytest.raises(ValueError, match=r"YolactLite\(mask_stride=4\) differs from the DataModule's mask_stride=8"):
        _logged_trainer(tmp_path, max_steps=1).fit(model, datamodule=dm)
@pytest.mark.slow
def test_trainer_test_logs_the_validation_coco_numbers(coco_mini, tmp_path) -> None:
    import json

    from seg_datamodule import COCOSegDataModule

    ann, images = str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")
    dm = COCOSegDataModule(train_ann=str(coco_mini / "annotations" / "instances_train2017.json"),
                           train_images=str(coco_mini / "train2017"), val_ann=ann, val_images=images,
                           test_ann=ann, test_images=images, image_size=160, batch_size=8, num_workers=0,
                           cache_dir=str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    val = trainer.validate(model, datamodule=dm, verbose=False)[0]
    test = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert model.test_metric is not None and model.test_metric.ann_file == ann
    keys = [k for k in val if k.startswith("val/segm_") or k.startswith("val/bbox_")]
    # Untrained: AP may be 0, but a ground truth with objects scores (-1 would be "nothing to score").
    assert len(keys) == 12 and val["val/bbox_AP"] >= 0 and val["val/segm_AP"] >= 0
    for key in keys:
        assert test[key.replace("val/", "test/")] == val[key], key
    assert test["test/loss"] == pytest.approx(val["val/loss"])

    # An image-info file (COCO test-dev's shape): losses over no targets, no COCO AP.
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    info = tmp_path / "image_info.json"
    info.write_text(json.dumps({"images": data["images"][:4], "categories": data["categories"]}))
    dm_info = COCOSegDataModule(train_ann=dm.train_ann, train_images=dm.train_images, test_ann=str(info),
                                test_images=images, image_size=160, batch_size=8, num_workers=0,
                                cache_dir=str(tmp_path / "cache"))
    model_info = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    test_info = trainer.test(model_info, datamodule=dm_info, verbose=False)[0]
    assert model_info.test_metric is None and not any("AP" in k for k in test_info)
    assert test_info["test/mask_loss"] == 0.0


_BOX_MODEL = YolactLite(num_classes=2, width=4)  # predict_boxes reads only the batch


@settings(max_examples=100, deadline=None)
@given(h=st.integers(1, 5000), w=st.integers(1, 5000), canvas=st.sampled_from([64, 320, 640]))
def test_whole_image_box_maps_back_to_the_whole_image(h, w, canvas) -> None:
    """predict_boxes' box for an image without boxes is the letterboxed image: back in pixels, [0, 0, W, H]."""
    from seg_datamodule.evaluation import boxes_to_original
    from seg_datamodule.transforms.kernels.plan import letterbox_layout

    _, _, scale, pad = letterbox_layout((h, w), (canvas, canvas))
    batch = DetectionBatch(
        images=torch.zeros((1, 3, canvas, canvas), dtype=torch.uint8), boxes=torch.zeros(0, 4),
        labels=torch.zeros(0, dtype=torch.int64), masks=torch.zeros(0, canvas // 4, canvas // 4, dtype=torch.bool),
        boxes_per_image=torch.zeros(1, dtype=torch.int64), image_ids=torch.tensor([1]),
        annotation_ids=torch.zeros(0, dtype=torch.int64),
        ignore_masks=torch.zeros(1, canvas // 4, canvas // 4, dtype=torch.bool),
        scales=torch.tensor([scale], dtype=torch.float32), pads=torch.tensor([pad], dtype=torch.float32),
        orig_sizes=torch.tensor([[h, w]]))
    boxes, per_image = _BOX_MODEL.predict_boxes(batch)
    assert per_image.tolist() == [1]
    x1, y1, x2, y2 = boxes[0].tolist()
    assert 0 <= x1 < x2 <= canvas and 0 <= y1 < y2 <= canvas
    back = boxes_to_original(boxes.double(), float(batch.scales[0]), tuple(batch.pads[0].tolist()), (h, w))[0]
    assert back.tolist() == pytest.approx([0.0, 0.0, w, h], abs=max(h, w) * 1e-5 + 1e-3)
