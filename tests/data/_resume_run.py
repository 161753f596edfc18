"""One training run for the resume tests, in its own process so it can be SIGKILLed.

``python _resume_run.py OUT DEMO_DIR --workers W [--kill-at STEP] [--ckpt PATH]`` trains the demo
model for two epochs with a checkpoint after every step, writes one line per trained batch to
``OUT/batches_rank<R>.jsonl`` (epoch, step, image ids and hashes of the images and masks) and,
when fit ends, the DataModule's counts to ``OUT/counts_rank<R>.json``; ``--devices 2`` runs DDP
on two CPU processes, each rank killing itself at the same step. ``--kill-at`` sends SIGKILL to itself when
that step starts (no clean-up); ``--ckpt`` resumes from a checkpoint; ``--copy-paste`` and
``--mixup`` turn those on (copy-paste from the batch); ``--limit-train-batches`` cuts each epoch.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from seg_datamodule import COCOSegDataModule
from seg_datamodule.models import YolactLite


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


class Fingerprints(Callback):
    def __init__(self, out: Path, kill_at: int | None) -> None:
        self.out, self.kill_at = out, kill_at

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.kill_at is not None and trainer.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        row = {"epoch": trainer.current_epoch, "step": trainer.global_step, "batch_idx": batch_idx,
               "image_ids": batch.image_ids.tolist(), "images": _digest(batch.images),
               "masks": _digest(batch.masks), "ignore": _digest(batch.ignore_masks)}
        with (self.out / f"batches_rank{trainer.global_rank}.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # tests/_child.py asks a hung run for its stacks
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("demo_dir")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--devices", type=int, default=1, help="> 1: DDP on that many CPU processes")
    parser.add_argument("--copy-paste", type=float, default=0.0, help="copy_paste (batch mode) probability")
    parser.add_argument("--mixup", type=float, default=0.0)
    parser.add_argument("--limit-train-batches", type=int, default=None, help="Trainer(limit_train_batches=...)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dm = COCOSegDataModule(demo_dir=args.demo_dir, image_size=96, batch_size=args.batch_size,
                           num_workers=args.workers, persistent_workers=args.workers > 0,
                           cache_dir=str(args.out / "index"), seed=5, copy_paste=args.copy_paste,
                           copy_paste_mode="batch", mixup=args.mixup)
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto", max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        limit_train_batches=args.limit_train_batches,
        callbacks=[Fingerprints(args.out, args.kill_at),
                   ModelCheckpoint(dirpath=args.out.parent / "ckpt", every_n_train_steps=1, save_last=True,
                                   save_top_k=0)],
    )
    torch.manual_seed(0)
    trainer.fit(YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=4), datamodule=dm,
                ckpt_path=args.ckpt)
    (args.out / f"counts_rank{trainer.global_rank}.json").write_text(json.dumps(dm.skip_counts["train"], sort_keys=True))


if __name__ == "__main__":
    main()
