"""Lightning's ``WeightAveraging`` callback where the installed Lightning has one (2.6+), ours before.

:data:`WeightAveraging` is ``lightning.pytorch.callbacks.WeightAveraging`` when it exists and
:class:`FallbackWeightAveraging` otherwise (the lowest Lightning this project supports, 2.5.0,
predates it). The fallback does what Lightning's does, hook for hook, and writes the same
checkpoint layout:

- ``setup("fit")``: a ``torch.optim.swa_utils.AveragedModel`` of the whole LightningModule
  (``use_buffers=True`` by default, so buffers are averaged by the same function);
- after each optimiser step (``trainer.global_step`` advanced): ``update_parameters``;
- validation runs on the averaged weights (swapped in at the epoch's start, out at its end);
  the end of training copies them into the module;
- a checkpoint's ``state_dict`` holds the averaged weights, ``current_model_state`` the
  trained ones and ``averaging_state`` the average's own buffers (``n_averaged``); the
  callback's own state is ``{"latest_update_step": int}``.

Only per-step updates are implemented (Lightning's ``should_update(epoch_idx=...)`` hook is
not): that is all :class:`~seg_datamodule.integrations.UltralyticsEMA` needs.
"""

from __future__ import annotations

import itertools
from copy import deepcopy
from typing import Any

import lightning as L
import torch
from lightning.pytorch import callbacks
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.optim.swa_utils import AveragedModel

__all__ = ["FallbackWeightAveraging", "WeightAveraging"]


class FallbackWeightAveraging(L.Callback):
    """An averaged copy of the module, updated after every optimiser step (Lightning < 2.6).

    Args:
        device: where the average lives (default: the module's device).
        use_buffers: average the buffers too (``False``: copy them from the module).
        **kwargs: ``AveragedModel`` arguments (``avg_fn`` or ``multi_avg_fn``).
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update after optimiser step ``step_idx`` (zero-based): always."""
        return step_idx is not None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Make the averaged copy when fitting begins."""
        if stage == "fit":
            device = self._device or pl_module.device
            self._average_model = AveragedModel(pl_module, device=device, use_buffers=self._use_buffers,
                                                **self._kwargs)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Update the average once per optimiser step (not per accumulated batch)."""
        step_idx = trainer.global_step - 1
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The trained module ends with the averaged weights."""
        for average, current in _pairs(self._average_model.module, pl_module):
            current.data.copy_(average.data)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Validate the averaged weights."""
        if self._average_model is not None:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put the trained weights back."""
        if self._average_model is not None:
            self._swap(pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The step of the last update."""
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the step of the last update."""
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Write the averaged weights as the checkpoint's ``state_dict`` (Lightning's layout)."""
        if self._average_model is None:
            rank_zero_info("WeightAveraging: a checkpoint saved outside fitting holds the module's weights only.")
            return
        average = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len("module."):]: v for k, v in average.items() if k.startswith("module.")}
        checkpoint["averaging_state"] = {k: v for k, v in average.items() if not k.startswith("module.")}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Restore the average and the trained weights (Lightning's layout)."""
        if self._average_model is None:
            rank_zero_warn("WeightAveraging: loading a checkpoint outside fitting restores no average.")
        elif "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            state = {"module." + k: v for k, v in checkpoint["state_dict"].items()}
            self._average_model.load_state_dict(state | checkpoint["averaging_state"])
            pl_module.load_state_dict(checkpoint["current_model_state"])
        else:
            rank_zero_warn("The checkpoint was not created with WeightAveraging: the average starts from its weights.")
            self._average_model.module.load_state_dict(deepcopy(checkpoint["state_dict"]), strict=False)

    def _swap(self, pl_module: L.LightningModule) -> None:
        for average, current in _pairs(self._average_model.module, pl_module):
            held = average.data.clone()
            average.data.copy_(current.data)
            current.data.copy_(held)


def _pairs(average: torch.nn.Module, current: torch.nn.Module) -> Any:
    """The (average, current) tensors: parameters then buffers, in module order."""
    return zip(itertools.chain(average.parameters(), average.buffers()),
               itertools.chain(current.parameters(), current.buffers()))


#: Lightning's callback (2.6+) or :class:`FallbackWeightAveraging`.
WeightAveraging: type[L.Callback] = getattr(callbacks, "WeightAveraging", FallbackWeightAveraging)
