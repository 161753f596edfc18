"""The motivating experiment: where the step time goes when masks are rasterised in the loop.

The demo model (``YolactLite``) trains on the demo data (``COCOSegDataModule`` without
``train_ann``) twice, with the ``StepTimeProfiler`` attached, and the same seed, batch size and
workers:

(a) ``main``: the workers collate images and boxes only; the masks are rasterised in
    ``training_step`` on the main process, between the forward pass and the loss (the layout the
    issue measured: the optimiser took 94 ms alone but 1,475 ms in the loop while rasterising
    competed for cores, and the accelerator idled for most of a 2,250 ms step);
(b) ``workers``: the package's ``DetectionCollate`` rasterises in the DataLoader workers.

Both runs also time the optimiser step alone on a copy of its state
(``isolated_optimizer_steps``), so the in-loop / isolated ratio shows whether the optimiser is
starved. Prints the profiler's table for each run and a side-by-side of the medians.

Run: ``python benchmarks/step_split.py [--steps 30] [--batch-size 8] [--num-workers 2]
[--image-size 320] [--width 16] [--accelerator auto] [--out runs/step_split]``. On a CPU-only
machine the model's own compute dwarfs the rasterisation unless the model is made small
(``--width 4``) and the canvas large (``--image-size 640``); the issue's figures are from a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from seg_datamodule.data.batching.collate import DetectionCollate, boxes_from_polygons
from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.models import YolactLite
from seg_datamodule.demo.losses import mask_loss
from seg_datamodule.profiling import PHASES, StepTimeProfiler
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import DetectionBatch, Polygons, Sample


@dataclass
class PolygonBatch:
    """A batch whose masks are still polygons: ``batch.masks`` is all False until rasterised."""

    batch: DetectionBatch
    polygons: Polygons  # canvas pixels, every instance of the batch

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PolygonBatch:
        return dataclasses.replace(self, batch=self.batch.to(device, non_blocking=non_blocking))

    def __len__(self) -> int:
        return len(self.batch)


class PolygonCollate:
    """Collate images and boxes in the worker; hand the polygons to the main process unrasterised."""

    def __init__(self, mask_stride: int) -> None:
        self.collate = DetectionCollate(mask_stride=mask_stride)

    def __call__(self, samples: Sequence[Sample]) -> PolygonBatch:
        stripped = []
        for s in samples:
            boxes = s.boxes
            if boxes is None:
                boxes = boxes_from_polygons(s.polygons, s.canvas_size)
            # Every instance with no ring: the collate allocates all-False masks and rasterises nothing.
            no_rings = Polygons(np.zeros((0, 2)), np.zeros(1, np.int64), np.zeros(s.num_instances + 1, np.int64))
            stripped.append(dataclasses.replace(s, polygons=no_rings, boxes=np.asarray(boxes, np.float32)))
        return PolygonBatch(self.collate(stripped), Polygons.concat(s.polygons for s in samples))


class RasterInStepDataModule(COCOSegDataModule):
    """The package's DataModule with the rasterisation taken out of the workers' collate."""

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        loader.collate_fn = PolygonCollate(self.mask_stride)
        return loader

    def val_dataloader(self) -> list:
        return []


class RasterInStepYolact(YolactLite):
    """YolactLite that rasterises the masks in ``training_step``, between forward and loss."""

    def training_step(self, batch: PolygonBatch, batch_idx: int) -> torch.Tensor:  # type: ignore[override]
        b = batch.batch
        out = self(b.images, b.boxes, b.boxes_per_image)
        height, width = b.images.shape[-2:]
        masks = np.zeros(tuple(b.masks.shape), dtype=bool)
        rasterize_flat(*batch.polygons.arrays, (height, width),
                       b.mask_stride, out=masks)
        targets = torch.from_numpy(masks).to(b.masks.device)
        m_loss = mask_loss(out.mask_logits, targets, b.boxes, b.mask_stride)
        if b.labels.numel():
            c_loss = F.cross_entropy(out.class_logits, b.labels)
        else:
            c_loss = out.class_logits.sum() * 0.0
        loss = m_loss + self.hparams.cls_weight * c_loss + out.protos.sum() * 0.0
        self.log("train/loss", loss, batch_size=len(b))
        return loss


def run(variant: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    data_cls = RasterInStepDataModule if variant == "main" else COCOSegDataModule
    data = data_cls(
        image_size=args.image_size,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=0,
    )
    model_cls = RasterInStepYolact if variant == "main" else YolactLite
    L.seed_everything(0, workers=True, verbose=False)
    model = model_cls(num_classes=data.num_classes, width=args.width)
    profiler = StepTimeProfiler(warmup_steps=args.warmup, isolated_optimizer_steps=10,
                                dirpath=str(Path(args.out) / variant))
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_steps=args.steps,
        limit_val_batches=0,
        callbacks=[profiler],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    print(f"\n=== ({'a' if variant == 'main' else 'b'}) rasterise in {variant} ===", flush=True)
    trainer.fit(model, datamodule=data)
    return profiler.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=320)
    parser.add_argument("--width", type=int, default=16, help="YolactLite's first-stage channels")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--out", default="runs/step_split")
    args = parser.parse_args()

    results = {variant: run(variant, args) for variant in ("main", "workers")}
    print(f"\nmedian ms per phase ({args.steps - args.warmup} steps after {args.warmup} warm-up, batch"
          f" {args.batch_size}, {args.image_size} px, {args.num_workers} workers)")
    print(f"{'phase':<22} {'(a) main':>12} {'(b) workers':>12}")
    for phase in PHASES:
        a, b = (results[v][phase] for v in ("main", "workers"))
        print(f"{phase:<22} {a['median_ms']:>8.1f} {a['share']:>4.0%} {b['median_ms']:>8.1f} {b['share']:>4.0%}")
    for variant in ("main", "workers"):
        opt = results[variant]["optimizer_step"]
        if "isolated_ms" in opt:
            print(f"optimizer step ({variant}): {opt['stepped_median_ms']:.1f} ms in the loop,"
                  f" {opt['isolated_ms']:.1f} ms alone, x{opt['in_loop_over_isolated']:.2f}")
        step = results[variant]["step"]
        if "device_busy_share" in step:
            print(f"accelerator busy ({variant}): >= {step['device_busy_share']:.0%} of the step")


if __name__ == "__main__":
    main()
