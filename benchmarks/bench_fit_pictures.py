"""What the run pictures cost a fit (issue 51): ``plots: true`` against ``plots: false`` in the same run.

The demo model (``YolactLite``) fits a few steps on coco-mini (``../shared/data/coco-mini``, or
``--data``) at 640 px, batch 16, with a ``CSVLogger``, alternating ``plots`` on and off
(``--repeats`` each, the order swapped every round). Printed per setting, as medians:

- ``first step``: from ``on_fit_start`` to the end of the first training step (what a user waits
  for before the loss moves);
- ``fit``: the whole ``trainer.fit`` of ``--steps`` steps;
- with plots on, ``drawing``: the CPU seconds of the picture thread (label pictures and three
  batch grids), which runs beside the training loop.

Run: ``python benchmarks/bench_fit_pictures.py [--steps 6] [--repeats 3] [--image-size 640]
[--batch-size 16] [--num-workers 1] [--data ../shared/data/coco-mini]``.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

import seg_datamodule
from seg_datamodule import COCOSegDataModule, FitPictures
from seg_datamodule.models import YolactLite


class _Clock(L.Callback):
    """The time from ``on_fit_start`` to the end of the first training step."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start, self.first = time.perf_counter(), float("nan")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if batch_idx == 0:
            self.first = time.perf_counter() - self.start


def run(args: argparse.Namespace, plots: bool, root: Path) -> dict[str, float]:
    data = Path(args.data)
    dm = COCOSegDataModule(
        train_ann=str(data / "annotations/instances_train2017.json"), train_images=str(data / "train2017"),
        val_ann=str(data / "annotations/instances_val2017.json"), val_images=str(data / "val2017"),
        image_size=args.image_size, batch_size=args.batch_size, num_workers=args.num_workers, plots=False,
        cache_dir=str(root / "cache"))
    clock = _Clock()
    pictures = FitPictures() if plots else None
    callbacks = [clock] + ([pictures] if pictures else [])
    torch.manual_seed(0)
    model = YolactLite(num_classes=dm.num_classes)
    trainer = L.Trainer(max_steps=args.steps, limit_val_batches=0, num_sanity_val_steps=0, accelerator="cpu",
                        logger=CSVLogger(root, name="run"), callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    start = time.perf_counter()
    trainer.fit(model, dm)
    out = {"first step": clock.first, "fit": time.perf_counter() - start}
    if pictures is not None:
        out["drawing"] = pictures.drawing_seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/coco-mini"))
    args = parser.parse_args()
    print(f"seg_datamodule {seg_datamodule.__version__}, torch {torch.__version__}, lightning {L.__version__}, "
          f"python {platform.python_version()}, {platform.machine()}")
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for r in range(args.repeats):
        for plots in ((True, False) if r % 2 == 0 else (False, True)):
            root = Path(tempfile.mkdtemp(prefix="bench_fit_pictures_"))
            try:
                results[plots].append(run(args, plots, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.steps} steps, {args.image_size} px, batch {args.batch_size}, {args.num_workers} workers, "
          f"medians of {args.repeats}:")
    for plots in (False, True):
        keys = results[plots][0].keys()
        line = ", ".join(f"{k} {statistics.median(r[k] for r in results[plots]):.2f} s" for k in keys)
        print(f"  plots {'on ' if plots else 'off'}: {line}")
    on, off = (statistics.median(r["first step"] for r in results[p]) for p in (True, False))
    print(f"  first step delayed by the pictures: {on - off:+.2f} s")


if __name__ == "__main__":
    main()
