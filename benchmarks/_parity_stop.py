"""``train_parity.py --stop-after N`` on this project's side: stop a run after epoch N of its schedule.

The run keeps ``trainer.max_epochs`` (so its warmup, learning-rate decay and ``close_mosaic`` are
those of the full schedule) and stops once epoch N's checkpoint is written: the same weights, epoch
for epoch, as the first N epochs of the full run. The CLI imports it by its class path
(``benchmarks._parity_stop.StopAfterEpoch``), the benchmark's subprocess running in the repository root.
"""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer


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
