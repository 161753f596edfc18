"""``train_parity.py --stop-after N``: stop a run after epoch N of its schedule, on either side.

The run keeps its length (``trainer.max_epochs``, Ultralytics' ``epochs``), so its warmup,
learning-rate decay and ``close_mosaic`` are those of the full schedule, and stops once epoch N's
checkpoint is written: the same weights, epoch for epoch, as the first N epochs of the full run.
The benchmark's subprocesses import it from the repository root (the CLI by its class path,
``benchmarks._parity_stop.StopAfterEpoch``).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch import Callback, LightningModule, Trainer


def stop_ultralytics_after(epoch: int) -> Callable[[Any], None]:
    """Ultralytics' ``on_fit_epoch_end`` callback that stops its trainer after ``epoch`` (1-based).

    Its loop saves the epoch's checkpoint, runs this callback, then breaks once ``trainer.stop`` is
    set; a stop already asked for (early stopping) stands.
    """
    if epoch < 1:
        raise ValueError(f"epoch must be >= 1, got {epoch}")

    def stop(trainer: Any) -> None:
        trainer.stop = trainer.stop or trainer.epoch + 1 >= epoch  # trainer.epoch counts from 0

    return stop


class StopAfterEpoch(Callback):
    """Ask the trainer to stop at the end of epoch ``epoch`` (1-based).

    Args:
        epoch: the last epoch to train.
    """

    def __init__(self, epoch: int) -> None:
        if epoch < 1:
            raise ValueError(f"epoch must be >= 1, got {epoch}")
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Checkpoint callbacks run after this one, so epoch N's checkpoint is still written.
        if trainer.current_epoch + 1 >= self.epoch:
            trainer.should_stop = True
