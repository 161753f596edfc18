"""The optimiser and schedule shared by the integration modules: AdamW or SGD, warmup, cosine."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from seg_datamodule.data.repeat_factors import scheduled_steps

__all__ = ["OPTIMIZERS", "check_optim_args", "configure_from_hparams", "configure_optimizer"]

OPTIMIZERS = ("AdamW", "SGD")


def check_optim_args(optimizer: str, lr: float, momentum: float, weight_decay: float, warmup_steps: int) -> None:
    """Raise ``ValueError`` naming the first bad optimiser argument (see :func:`configure_optimizer`)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(momentum, (int, float)) and 0 <= momentum < 1):
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if not (isinstance(weight_decay, (int, float)) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")


def configure_optimizer(
    model: nn.Module,
    optimizer: Literal["AdamW", "SGD"],
    lr: float,
    momentum: float,
    weight_decay: float,
    warmup_steps: int,
    total_steps: float,
    cosine_schedule: bool,
) -> Any:
    """What ``LightningModule.configure_optimizers`` returns.

    Weight decay applies to weights of rank >= 2 only (not to norms and biases), as Ultralytics'
    and torchvision's recipes do. The learning rate rises linearly over ``warmup_steps`` optimiser
    steps, then follows a cosine to 0 at ``total_steps`` when ``cosine_schedule`` and the run's
    length is known (constant otherwise).

    Args:
        model: the parameters' owner (those with ``requires_grad`` only).
        optimizer: ``"AdamW"`` (``momentum`` is its beta1) or ``"SGD"`` (Nesterov).
        lr: peak learning rate.
        momentum: SGD momentum / AdamW beta1.
        weight_decay: decoupled (AdamW) or L2 (SGD) decay of the weights.
        warmup_steps: linear warmup length in optimiser steps.
        total_steps: ``trainer.estimated_stepping_batches`` (may be ``inf``).
        cosine_schedule: decay along a cosine after the warmup.

    Returns:
        An optimizer, or ``{"optimizer", "lr_scheduler"}`` with a per-step ``LambdaLR``.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if optimizer == "AdamW":
        opt: torch.optim.Optimizer = torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    else:
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0)
    total = int(total_steps) if math.isfinite(total_steps) and total_steps >= 1 else None
    cosine = cosine_schedule and total is not None
    if not warmup_steps and not cosine:
        return opt

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def configure_from_hparams(module: Any) -> Any:
    """:func:`configure_optimizer` of ``module.model`` from the module's saved hyperparameters
    (``optimizer``, ``lr``, ``momentum``, ``weight_decay``, ``warmup_steps``, ``cosine_schedule``),
    the schedule sized to the run (:func:`~seg_datamodule.data.repeat_factors.scheduled_steps`; unbounded
    without a Trainer)."""
    h = module.hparams
    total = scheduled_steps(module._trainer)
    return configure_optimizer(module.model, h.optimizer, h.lr, h.momentum, h.weight_decay, h.warmup_steps,
                               total, h.cosine_schedule)
