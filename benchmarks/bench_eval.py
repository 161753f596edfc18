"""Benchmark COCOMaskMAP on coco-mini val: its own cost per image, extrapolated to val2017, and
the AP ceiling of stride-4 mask targets.

Predictions are made up front (not timed) on the 640 x 640 validation canvas from the ground
truth, as stride-4 mask logits (160 x 160), in two loads:

* ``oracle``: one detection per ground-truth instance (about 8 per image; what ``YolactLite``
  logs, its boxes being the ground truth), jittered boxes, some wrong labels, noisy logits;
* ``detector``: the same plus smooth false positives up to 100 detections per image, the usual
  ``max_det`` of a COCO detector.

Timed, on one thread (``torch.set_num_threads(1)``), best of ``--repeats``: ``update`` (inverse
letterbox, resample, threshold, RLE encode) and ``compute`` (COCOeval segm + bbox) with each
backend installed (pycocotools; faster-coco-eval if present), each per image, then times 5,000
for COCO val2017. COCOeval's work grows with images x categories x detections per category, so
the per-image extrapolation is an estimate, not a measurement.

The ceiling: ground-truth polygons letterboxed and rasterised at stride 4 (the targets the
model trains on), fed back as predictions with score 1; ``--pipeline`` also runs the
DataModule's own validation batches through the metric (what ``validation_step`` sees,
including any annotation the batches drop).

Usage::

    python benchmarks/bench_eval.py                 # ../shared/data/coco-mini
    python benchmarks/bench_eval.py --coco-mini PATH --pipeline
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# The ground-truth-as-predictions helpers the tests use (one home for them).
sys.path.insert(0, str(ROOT / "tests" / "evaluation"))

from _coco_gt import gt_on_canvas, letterbox_batch, letterboxed, perturbed  # noqa: E402

from seg_datamodule.evaluation import COCOMaskMAP  # noqa: E402
from seg_datamodule.evaluation.coco_eval import stats_table  # noqa: E402

CANVAS, STRIDE, BATCH, VAL2017_IMAGES = 640, 4, 8, 5000


def _false_positives(num: int, num_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """Smooth elliptic blobs in random boxes (YOLACT-like masks, not noise)."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(num, 2, generator=gen, dtype=torch.float64) * CANVAS * 0.8
    wh = torch.rand(num, 2, generator=gen, dtype=torch.float64) * CANVAS * 0.25 + 8
    boxes = torch.cat([xy, xy + wh], 1)
    centres = (torch.arange(CANVAS // STRIDE, dtype=torch.float64) + 0.5) * STRIDE
    cx, cy = ((boxes[:, 0] + boxes[:, 2]) / 2)[:, None, None], ((boxes[:, 1] + boxes[:, 3]) / 2)[:, None, None]
    rx, ry = (wh[:, 0] / 2)[:, None, None], (wh[:, 1] / 2)[:, None, None]
    radius = ((centres[None, None, :] - cx) / rx) ** 2 + ((centres[None, :, None] - cy) / ry) ** 2
    return {
        "boxes": boxes,
        "scores": torch.rand(num, generator=gen) * 0.3,
        "labels": torch.randint(0, num_classes, (num,), generator=gen),
        "mask_logits": (4.0 * (1.0 - radius)).float(),
    }


def make_predictions(metric: COCOMaskMAP, load: str) -> list[tuple[list[dict], object]]:
    coco, num_classes = metric.coco, len(metric.category_ids)
    image_ids = sorted(coco.imgs)
    batches = []
    for start in range(0, len(image_ids), BATCH):
        ids = image_ids[start : start + BATCH]
        preds = []
        for i in ids:
            pred = perturbed(gt_on_canvas(coco, i, CANVAS, STRIDE), num_classes, i)
            if load == "detector":
                extra = _false_positives(max(0, 100 - len(pred["scores"])), num_classes, i)
                pred = {k: torch.cat([pred[k].to(extra[k].dtype), extra[k]]) for k in pred}
            preds.append(pred)
        geometry = [letterboxed(coco, i, CANVAS) for i in ids]
        batch = letterbox_batch(ids, [g[0] for g in geometry], [g[1] for g in geometry], [g[2] for g in geometry],
                                (CANVAS, CANVAS), STRIDE)
        batches.append((preds, batch))
    return batches


def _backends() -> list[str]:
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return ["pycocotools"]
    return ["pycocotools", "faster_coco_eval"]


def time_load(ann_file: str, load: str, repeats: int) -> None:
    batches = make_predictions(COCOMaskMAP(ann_file), load)
    n_images = sum(len(b.image_ids) for _, b in batches)
    n_dets = sum(len(p["scores"]) for preds, _ in batches for p in preds)
    print(f"\n[{load}] {n_images} images, {n_dets / n_images:.1f} detections per image")
    for backend in _backends():
        metric = COCOMaskMAP(ann_file, backend=backend)
        metric.coco  # noqa: B018 (load the JSON outside the timing)
        t_update = t_compute = float("inf")
        for _ in range(repeats):
            metric.reset()
            t0 = time.perf_counter()
            for preds, batch in batches:
                metric.update(preds, batch)
            t_update = min(t_update, time.perf_counter() - t0)
            t0 = time.perf_counter()
            results = metric.compute()
            t_compute = min(t_compute, time.perf_counter() - t0)
        per_update, per_compute = t_update / n_images, t_compute / n_images
        total = (per_update + per_compute) * VAL2017_IMAGES
        print(f"  {backend}:")
        print(f"    update  {1e3 * per_update:7.1f} ms/image   (inverse letterbox, resample, threshold, RLE)")
        print(f"    compute {1e3 * per_compute:7.1f} ms/image   (COCOeval segm + bbox, all images at once)")
        print(f"    -> val2017 ({VAL2017_IMAGES} images): update {per_update * VAL2017_IMAGES:.0f} s spread over "
              f"the validation steps + compute {per_compute * VAL2017_IMAGES:.0f} s at epoch end = {total:.0f} s")
    print("  " + stats_table({k: float(v) for k, v in results.items()}).replace("\n", "\n  "))


def ceiling(ann_file: str) -> None:
    metric = COCOMaskMAP(ann_file)
    coco = metric.coco
    image_ids = sorted(coco.imgs)
    for start in range(0, len(image_ids), BATCH):
        ids = image_ids[start : start + BATCH]
        geometry = [letterboxed(coco, i, CANVAS) for i in ids]
        batch = letterbox_batch(ids, [g[0] for g in geometry], [g[1] for g in geometry], [g[2] for g in geometry],
                                (CANVAS, CANVAS), STRIDE)
        metric.update([gt_on_canvas(coco, i, CANVAS, STRIDE) for i in ids], batch)
    print(f"\n[ceiling] ground truth rasterised at stride {STRIDE} on the {CANVAS} canvas, mapped back:")
    print("  " + stats_table({k: float(v) for k, v in metric.compute().items()}).replace("\n", "\n  "))


def pipeline_ceiling(coco_mini: Path) -> None:
    from seg_datamodule import COCOSegDataModule

    ann = coco_mini / "annotations" / "instances_val2017.json"
    with tempfile.TemporaryDirectory() as cache:
        dm = COCOSegDataModule(train_ann=str(ann), train_images=str(coco_mini / "val2017"), val_ann=str(ann),
                               val_images=str(coco_mini / "val2017"), image_size=CANVAS, mask_stride=STRIDE,
                               batch_size=BATCH, num_workers=0, cache_dir=cache, pin_memory=False)
        dm.setup("validate")
        metric = COCOMaskMAP(str(ann))
        targets = 0
        for batch in dm.val_dataloader():
            counts = batch.boxes_per_image.tolist()
            preds = [{"boxes": b, "scores": torch.ones(len(b)), "labels": lab, "masks": m}
                     for b, lab, m in zip(batch.boxes.split(counts), batch.labels.split(counts), batch.split_masks())]
            targets += len(batch.labels)
            metric.update(preds, batch)
        print(f"\n[pipeline] the DataModule's validation batches as predictions ({targets} targets of "
              f"{len(metric.coco.getAnnIds(iscrowd=False))} non-crowd annotations):")
        print("  " + stats_table({k: float(v) for k, v in metric.compute().items()}).replace("\n", "\n  "))
        print("  " + dm.report().replace("\n", "\n  "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=ROOT.parent / "shared" / "data" / "coco-mini")
    parser.add_argument("--pipeline", action="store_true", help="also the DataModule's own validation batches")
    parser.add_argument("--repeats", type=int, default=2, help="timings are the best of this many runs")
    args = parser.parse_args()
    ann_file = str(args.coco_mini / "annotations" / "instances_val2017.json")
    torch.set_num_threads(1)
    np.random.seed(0)
    print(f"COCOMaskMAP on {ann_file} (torch threads: 1)")
    ceiling(ann_file)
    for load in ("oracle", "detector"):
        time_load(ann_file, load, args.repeats)
    if args.pipeline:
        pipeline_ceiling(args.coco_mini)


if __name__ == "__main__":
    main()
