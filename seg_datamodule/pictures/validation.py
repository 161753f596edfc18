"""Pictures of what validation found, in the run folder: ``ValPictures``.

For a model that scores its detections with a COCO metric (``pl_module.coco_metric``: the demo
model, ``YOLOSegModule``, ``MaskRCNNModule``), rank 0 writes into ``trainer.log_dir``:

- at every validation of a fit (not the sanity check): ``val_batch0_labels.jpg`` (the first
  validation batch with its ground truth) beside ``val_batch0_pred.jpg`` (the same images with the
  model's detections scoring at least ``min_score``, class names and scores), on the letterboxed
  canvases the model saw;
- at the end of fit: ``results.png`` (every ``train/`` series the logger got by step and every
  ``val/`` one by epoch), ``MaskPR_curve.png`` / ``BoxPR_curve.png`` (from COCOeval's precision
  table of the last validation; not for LVIS, whose evaluation keeps none) and
  ``confusion_matrix.png`` of the last validation's detections
  (:func:`~seg_datamodule.pictures.results.confusion_matrix`).

Under DDP the pictures are rank 0's share of the validation split. The drawing runs on one
background thread (see :mod:`~seg_datamodule.pictures.callback`); a picture that fails is one line.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import cv2
import numpy as np
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.evaluation.coco_eval import image_sizes
from seg_datamodule.pictures.labels import figure_rgb
from seg_datamodule.pictures.results import confusion_figure, confusion_matrix, pr_figure, results_figure
from seg_datamodule.structures import DetectionBatch
from seg_datamodule.pictures.writer import DrawingCallback, PictureWriter, host_copy, run_folder
from seg_datamodule.visualize import batch_grid, draw_instances

__all__ = ["ValPictures", "canvas_predictions"]


def canvas_predictions(batch: DetectionBatch, results: list[dict[str, Any]], names: dict[int, str],
                       min_score: float, max_images: int = 16) -> np.ndarray:
    """The batch's first images with their COCO results entries drawn back on the letterboxed canvas.

    Args:
        batch (DetectionBatch): the validation batch (host tensors).
        results: COCO results entries (original pixels: ``bbox`` xywh, ``segmentation`` RLE).
        names: COCO category id -> class name.
        min_score: entries scoring below this are not drawn.
        max_images: at most this many images, four a row.

    Returns:
        ndarray[rows * H, 4 * W, 3] uint8: the grid.
    """
    from pycocotools import mask as mask_utils

    images = batch.images[:max_images].permute(0, 2, 3, 1).clamp(0, 255).byte().numpy()
    b, h, w = images.shape[:3]
    columns = max(1, min(4, b))
    grid = np.zeros((-(-b // columns) * h, columns * w, 3), np.uint8)
    by_image: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["score"] >= min_score:
            by_image[int(r["image_id"])].append(r)
    for i in range(b):
        scale, (left, top) = float(batch.scales[i]), (float(v) for v in batch.pads[i])
        kept = sorted(by_image.get(int(batch.image_ids[i]), []), key=lambda r: -r["score"])[:100]
        masks = np.zeros((len(kept), h, w), bool)
        boxes = np.zeros((len(kept), 4), np.float64)
        for k, r in enumerate(kept):
            x, y, bw, bh = r["bbox"]
            boxes[k] = [x * scale + left, y * scale + top, (x + bw) * scale + left, (y + bh) * scale + top]
            if "segmentation" in r:  # the original-resolution mask, resized as the image was
                rle = dict(r["segmentation"])
                mask = mask_utils.decode(rle).astype(np.uint8)
                size = (max(round(mask.shape[1] * scale), 1), max(round(mask.shape[0] * scale), 1))
                small = cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST).astype(bool)
                x0, y0 = round(left), round(top)
                part = small[: max(h - y0, 0), : max(w - x0, 0)]
                masks[k, y0 : y0 + part.shape[0], x0 : x0 + part.shape[1]] = part
        labels = [f"{names.get(int(r['category_id']), r['category_id'])} {r['score']:.2f}" for r in kept]
        row, col = divmod(i, columns)
        grid[row * h : (row + 1) * h, col * w : (col + 1) * w] = draw_instances(
            images[i], masks, boxes, labels, mask_stride=1)
    return grid


def _results_entries(dets: Any, sizes: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """COCO results entries of a :class:`~seg_datamodule.evaluation.predictions.CocoDetections`."""
    image_of = np.repeat(dets.image_ids.numpy(), dets.dets_per_image.numpy())
    masks = dets.rles(sizes) if int(dets.rle_lengths.sum()) else [None] * len(image_of)
    out = []
    for i, c, s, box, rle in zip(image_of.tolist(), dets.category_ids.tolist(), dets.scores.tolist(),
                                 dets.boxes.tolist(), masks):
        entry = {"image_id": i, "category_id": c, "score": s, "bbox": box}
        if rle is not None:
            entry["segmentation"] = rle
        out.append(entry)
    return out


class ValPictures(DrawingCallback):
    """Draw validation batches and the end-of-fit results (see the module docstring).

    Args:
        max_images: images of the first validation batch drawn.
        min_score: detections drawn on ``val_batch0_pred.jpg`` score at least this.
        conf, iou: the confusion matrix's score and box-IoU thresholds (Ultralytics' defaults).
    """

    def __init__(self, max_images: int = 16, min_score: float = 0.25, conf: float = 0.25, iou: float = 0.45) -> None:
        self.max_images, self.min_score, self.conf, self.iou = max_images, min_score, conf, iou
        super().__init__()
        self.series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self._x_labels: dict[str, str] = {}
        self._last: tuple[Any, Any] | None = None  # (detections, ground truth) of the last validation
        self._logged_step = -1

    @staticmethod
    def _metric(pl_module: LightningModule) -> Any:
        """The module's COCO metric, or None (none, or LVIS's, whose ground truth is not a ``COCO``)."""
        metric = getattr(pl_module, "coco_metric", None)
        if metric is None or not hasattr(metric, "detections"):
            return None
        truth = getattr(metric, "coco", None)
        return metric if hasattr(truth, "imgs") and hasattr(truth, "imgToAnns") else None

    # ------------------------------------------------------------------ Lightning hooks

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = run_folder(trainer)
        self._writer = None if folder is None else PictureWriter(folder, trainer)
        self.series.clear()
        self._last, self._logged_step = None, -1

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # What the logger got at this step: values Lightning has already made floats of for it.
        step = trainer.global_step
        if self._writer is None or step == self._logged_step or step % max(trainer.log_every_n_steps, 1):
            return
        self._logged_step = step
        for name, value in trainer.logged_metrics.items():
            if name.startswith("train/"):
                self.series[name].append((step, float(value)))
                self._x_labels[name] = "step"

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        try:
            self._validation_batch(trainer, pl_module, batch, batch_idx, dataloader_idx)
        except Exception as error:  # a picture is never worth a stopped fit
            rank_zero_info(f"seg_datamodule: the validation pictures were not drawn: {error!r}")

    def _validation_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                          dataloader_idx: int) -> None:
        metric = self._metric(pl_module)
        if (self._writer is None or trainer.sanity_checking or batch_idx != 0 or dataloader_idx != 0
                or metric is None or not isinstance(batch, DetectionBatch)):
            return
        host = host_copy(batch, self.max_images)
        entries = _results_entries(metric.detections(), image_sizes(metric.coco))
        names = {int(c["id"]): c["name"] for c in metric.coco.dataset["categories"]}
        labels = [names.get(int(c), str(c)) for c in metric.category_ids]
        step = trainer.global_step
        self._writer.submit("val_batch0_labels.jpg", lambda: batch_grid(host, self.max_images, 4, labels), step)
        self._writer.submit("val_batch0_pred.jpg",
                            lambda: canvas_predictions(host, entries, names, self.min_score, self.max_images), step)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        metric = self._metric(pl_module)  # before the module computes and resets it
        if self._writer is not None and not trainer.sanity_checking and metric is not None:
            self._last = (metric.detections(), metric)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._writer is None or trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val/") and value.numel() == 1:
                self.series[name].append((trainer.current_epoch, float(value)))
                self._x_labels[name] = "epoch"

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._writer is not None:
            try:
                self._submit_results(self._writer, trainer.global_step)
            except Exception as error:  # a picture is never worth a stopped fit
                rank_zero_info(f"seg_datamodule: the results pictures were not drawn: {error!r}")
        self._finish()


    # ------------------------------------------------------------------ drawing

    def _submit_results(self, writer: PictureWriter, step: int) -> None:
        series = {k: list(v) for k, v in self.series.items()}
        if series:
            writer.submit("results.png", lambda: figure_rgb(results_figure(series, dict(self._x_labels)), dpi=100), step)
        if self._last is None:
            return
        dets, metric = self._last
        coco = metric.coco
        names = {int(c["id"]): c["name"] for c in coco.dataset["categories"]}
        ordered = [names.get(int(c), str(c)) for c in metric.category_ids]
        for iou_type, precision in dict(getattr(metric, "last_precision", {}) or {}).items():
            title = "mask" if iou_type == "segm" else "box"
            writer.submit(f"{'Mask' if iou_type == 'segm' else 'Box'}PR_curve.png",
                          lambda p=precision, t=title: figure_rgb(pr_figure(p, ordered, t), dpi=100), step)
        sizes = image_sizes(coco)

        def confusion() -> np.ndarray:
            entries = _results_entries(dets, sizes)
            by_image: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for e in entries:
                by_image[e["image_id"]].append(e)
            seen = {int(i) for i in dets.image_ids.tolist()}
            truth = {i: coco.imgToAnns.get(i, []) for i in seen}
            matrix = confusion_matrix(truth, by_image, metric.category_ids, self.conf, self.iou)
            return figure_rgb(confusion_figure(matrix, ordered, self.conf, self.iou), dpi=100)

        writer.submit("confusion_matrix.png", confusion, step)
