"""Summaries go through the progress bar, so they never land inside it (issue 40).

Before, ``epoch N: COCO val segm AP ...`` was logged while tqdm drew its bar on the same terminal
and ended up inside the bar's line (``[Aepoch 0: COCO val segm AP ...``).
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from seg_datamodule.console import print_summary

LINE = "epoch 0: a summary of the validation"


class _Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            print_summary(self.trainer, LINE)  # while the training bar is drawn

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, progress_bar: bool) -> None:
    data = DataLoader(torch.randn(8, 2), batch_size=2)
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, enable_progress_bar=progress_bar, default_root_dir=str(tmp_path),
                      num_sanity_val_steps=0, val_check_interval=2)
    trainer.fit(_Model(), data, DataLoader(torch.randn(2, 2), batch_size=2))


def test_with_a_tqdm_bar_the_line_is_written_between_its_redraws(tmp_path, capfd: pytest.CaptureFixture) -> None:
    _fit(tmp_path, progress_bar=True)
    out, err = capfd.readouterr()
    assert LINE not in err
    # Twice (val_check_interval=2 of 4 batches), each time on a line of its own: the bars were
    # cleared first (tqdm.write ends the clearing with a carriage return, and a cursor-up for the
    # validation bar below the training one) and drawn again after.
    assert len(re.findall(rf"(?:\r|\n|^)(?:\x1b\[A)*{re.escape(LINE)}\n", out)) == 2 == out.count(LINE)


def test_without_a_bar_the_line_is_logged(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        _fit(tmp_path, progress_bar=False)
    assert [r.getMessage() for r in caplog.records].count(LINE) == 2


def test_without_a_trainer_the_line_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        print_summary(None, LINE)
    assert [r.getMessage() for r in caplog.records] == [LINE]
