"""Ultralytics' ``ModelEMA`` as a Lightning weight-averaging callback: ``UltralyticsEMA``.

Ultralytics validates and saves an exponential moving average of the weights
(``ultralytics.utils.torch_utils.ModelEMA``): a copy of the model taken before the first step,
then after optimiser step ``k`` every floating-point entry of the state dict (parameters *and*
float buffers such as BatchNorm running statistics) moves towards the model's by
``1 - d(k)``, with the decay ramp ``d(k) = decay * (1 - exp(-k / tau))`` (0.9999 and 2000), so
early averages follow the model closely. Integer buffers (``num_batches_tracked``) keep the
copy's value.

:class:`UltralyticsEMA` is exactly that on top of Lightning's own ``WeightAveraging`` callback,
so validation scores the average, checkpoints hold it as their ``state_dict`` (the trained
weights beside it, for an exact resume) and training ends with it in the module.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning.pytorch.callbacks import WeightAveraging

__all__ = ["UltralyticsEMA", "check_ema_args", "ema_decay", "ultralytics_ema_avg_fn"]


def check_ema_args(decay: float, tau: float) -> None:
    """Raise ``ValueError`` unless ``0 <= decay < 1`` and ``tau`` is a finite number > 0."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay < 1:
        raise ValueError(f"ema decay must be in [0, 1), got {decay!r}")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"ema tau must be a finite number > 0, got {tau!r}")


def ema_decay(updates: int, decay: float = 0.9999, tau: float = 2000.0) -> float:
    """Ultralytics' EMA decay after ``updates`` optimiser steps: ``decay * (1 - exp(-updates / tau))``."""
    return decay * (1.0 - math.exp(-updates / tau))


def ultralytics_ema_avg_fn(decay: float = 0.9999,
                           tau: float = 2000.0) -> Callable[[list[Tensor], list[Tensor], Any], None]:
    """An ``AveragedModel`` ``multi_avg_fn`` doing ``ModelEMA.update``'s arithmetic.

    ``AveragedModel`` calls it with its ``n_averaged``, which :class:`UltralyticsEMA` makes count
    the starting copy as one, so the ``k``-th optimiser step sees ``n_averaged == k``, Ultralytics'
    ``updates``. Integer tensors are left as they are, as ``ModelEMA`` leaves them.
    """

    @torch.no_grad()
    def update(averaged: list[Tensor], current: list[Tensor], n_averaged: Any) -> None:
        if not averaged or not averaged[0].is_floating_point():
            return
        weight = 1.0 - ema_decay(int(n_averaged), decay, tau)
        torch._foreach_lerp_(averaged, current, weight)  # ModelEMA's own kernel (v += (1 - d) * (m - v))

    return update


class UltralyticsEMA(WeightAveraging):
    """Ultralytics' ``ModelEMA`` of a LightningModule's weights, used to validate and checkpoint.

    ``YOLOSegModule`` adds it itself (``ema: true``); any other module can list it among the
    Trainer's callbacks. Buffers are averaged like parameters (``use_buffers=True``), as
    ``ModelEMA`` averages every float entry of the state dict.

    Args:
        decay (float): the decay the ramp tends to, in ``[0, 1)``.
        tau (float): the ramp's time constant, optimiser steps (> 0).
        device: where the average lives (default: the module's device).

    Raises:
        ValueError: ``decay`` or ``tau`` out of range.
    """

    def __init__(self, decay: float = 0.9999, tau: float = 2000.0, device: torch.device | str | None = None) -> None:
        check_ema_args(decay, tau)
        super().__init__(device=device, use_buffers=True, multi_avg_fn=ultralytics_ema_avg_fn(decay, tau))
        self.decay, self.tau = float(decay), float(tau)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Make the average and count the starting weights as its first member.

        ``AveragedModel`` would otherwise replace the average by the weights after the first
        step; ``ModelEMA`` starts from the weights before it. A resumed run then loads the
        checkpoint's ``n_averaged`` over this one.
        """
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        average = getattr(self, "_average_model", None)  # both bases' attribute; warn should it be renamed
        if average is None or not hasattr(average, "n_averaged"):
            rank_zero_warn("UltralyticsEMA: this Lightning's WeightAveraging keeps its average elsewhere; the "
                           "average starts from the weights after the first step instead of before it.")
            return
        average.update_parameters(pl_module)  # n_averaged 0 -> 1: a plain copy of the starting weights

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Restore the average when fitting; validating, testing or predicting a checkpoint needs nothing
        (its ``state_dict`` is the average already), so nothing is said then either."""
        if getattr(self, "_average_model", None) is not None:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Average after a real optimiser step only: a module that accumulates itself
        (``YOLOSegModule(schedule="ultralytics")``, whose Lightning step is a batch) says
        ``optimizer_stepped = False`` between two, as Ultralytics' ``ModelEMA`` updates at its steps."""
        if getattr(pl_module, "optimizer_stepped", True):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @property
    def updates(self) -> int:
        """Optimiser steps averaged so far (Ultralytics' ``ModelEMA.updates``)."""
        average = getattr(self, "_average_model", None)
        return max(int(average.n_averaged) - 1, 0) if average is not None else 0
