"""One streamed training run for the stream resume and DDP tests, in its own process (SIGKILL).

``python _stream_run.py OUT STREAM --workers W [--kill-at STEP] [--ckpt PATH] [--devices 2]
[--max-cache-size 300KB|none] [--storage-options JSON]``
trains the demo model for two epochs on ``COCOSegDataModule(train_stream=STREAM)`` with a
checkpoint after every step; it records every trained batch as ``tests/data/_resume_run.py`` does
(its ``Fingerprints`` callback) and, when fit ends, the DataModule's counts.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
from pathlib import Path

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from _resume_run import Fingerprints  # noqa: E402

from seg_datamodule import COCOSegDataModule  # noqa: E402
from seg_datamodule.models import YolactLite  # noqa: E402


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # tests/_child.py asks a hung run for its stacks
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("stream")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--devices", type=int, default=1, help="> 1: DDP on that many CPU processes")
    parser.add_argument("--max-cache-size", default="300KB", help="none: LitData's default budget")
    parser.add_argument("--storage-options", default="{}", help="JSON: the S3 server's endpoint and keys")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dm = COCOSegDataModule(train_stream=args.stream, image_size=96, batch_size=args.batch_size,
                           num_workers=args.workers, seed=5, stream_cache_dir=str(args.out.parent / "cache"),
                           stream_max_cache_size=None if args.max_cache_size == "none" else args.max_cache_size,
                           stream_storage_options=json.loads(args.storage_options))
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto", max_epochs=2,
        logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[Fingerprints(args.out, args.kill_at),
                   ModelCheckpoint(dirpath=args.out.parent / "ckpt", every_n_train_steps=1, save_last=True,
                                   save_top_k=0)],
    )
    torch.manual_seed(0)
    trainer.fit(YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=4), datamodule=dm,
                ckpt_path=args.ckpt)
    rank = trainer.global_rank
    (args.out / f"counts_rank{rank}.json").write_text(json.dumps(dm.skip_counts, sort_keys=True))


if __name__ == "__main__":
    main()
