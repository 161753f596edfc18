"""A callback that writes what each rank trained on, for tests that run the CLI or DDP."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class BatchRecorder(Callback):
    """Append ``{epoch, step, rank, image_ids, boxes_sum, masks_sum, mask_loss}`` per batch.

    Writes ``<out_dir>/batches_rank<R>.jsonl`` (``out_dir`` defaults to ``$RECORDER_DIR``).
    """

    def __init__(self, out_dir: str | None = None) -> None:
        self.out_dir = out_dir or os.environ.get("RECORDER_DIR", ".")
        self.rows: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = trainer.callback_metrics.get("train/mask_loss")
        row = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "rank": trainer.global_rank,
            "image_ids": batch.image_ids.tolist(),
            "boxes_sum": float(batch.boxes.double().sum()),
            "masks_sum": int(batch.masks.sum()),
            "mask_loss": None if loss is None else float(loss),
        }
        self.rows.append(row)
        path = Path(self.out_dir) / f"batches_rank{trainer.global_rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def read_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(Path(out_dir).glob("batches_rank*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def read_steps(out_dir: str | Path, rank: int = 0) -> dict[int, dict[str, Any]]:
    """A run's ``batches_rank<R>.jsonl`` (one fingerprint per trained batch), keyed by global step."""
    rows = [json.loads(line) for line in (Path(out_dir) / f"batches_rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def read_counts(out_dir: str | Path, rank: int = 0) -> dict[str, Any]:
    """A run's ``counts_rank<R>.json``: the DataModule's counts when fit ended."""
    return json.loads((Path(out_dir) / f"counts_rank{rank}.json").read_text())
