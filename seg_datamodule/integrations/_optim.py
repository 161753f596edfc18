"""The optimiser and schedule shared by the integration modules: AdamW or SGD, warmup, cosine,
and Ultralytics' nominal-batch gradient accumulation."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from seg_datamodule.data.loaders.repeat_factors import scheduled_steps

__all__ = [
    "OPTIMIZERS", "SCHEDULES", "apply_nominal_batch", "check_optim_args", "configure_from_hparams",
    "configure_optimizer", "make_optimizer", "nominal_batch_accumulation", "own_nominal_batch",
]

OPTIMIZERS = ("AdamW", "SGD")
SCHEDULES = ("ultralytics", "lightning")


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
    opt = make_optimizer(groups, optimizer, lr, momentum)
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


def make_optimizer(groups: list[dict[str, Any]], optimizer: str, lr: float, momentum: float) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` (``momentum`` is beta1) or Nesterov ``SGD`` over param ``groups`` (each with its decay)."""
    if optimizer == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0)


def nominal_batch_accumulation(batch_size: int, nominal_batch_size: int) -> tuple[int, float]:
    """Ultralytics' gradient accumulation towards a nominal batch (its ``nbs``, 64 by default).

    As ``ultralytics.engine.trainer.BaseTrainer`` computes it: ``accumulate = max(round(nbs /
    batch_size), 1)`` batches per optimiser step, and the weight decay scaled by ``batch_size *
    accumulate / nbs`` (so the decay per image seen stays that of the nominal batch).

    Args:
        batch_size: images per batch over all devices (Ultralytics' ``batch``).
        nominal_batch_size: the nominal batch ``nbs``.

    Returns:
        ``(accumulate, weight_decay_scale)``; e.g. ``(4, 1.0)`` for 16 images, ``(3, 1.125)`` for 24,
        ``(1, 2.0)`` for 128 (Python rounds 0.5 to even, as Ultralytics does).

    Raises:
        ValueError: a size below 1.
    """
    for name, value in (("batch_size", batch_size), ("nominal_batch_size", nominal_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    accumulate = max(round(nominal_batch_size / batch_size), 1)
    return accumulate, batch_size * accumulate / nominal_batch_size


def configure_from_hparams(module: Any, weight_decay_scale: float = 1.0) -> Any:
    """:func:`configure_optimizer` of ``module.model`` from the module's saved hyperparameters
    (``optimizer``, ``lr``, ``momentum``, ``weight_decay`` times ``weight_decay_scale``,
    ``warmup_steps``, ``cosine_schedule``), the schedule sized to the run
    (:func:`~seg_datamodule.data.loaders.repeat_factors.scheduled_steps`; unbounded without a Trainer)."""
    h = module.hparams
    total = scheduled_steps(module._trainer)
    warmup = 100 if h.warmup_steps is None else h.warmup_steps  # None: YOLOSegModule's unset default
    return configure_optimizer(module.model, h.optimizer, h.lr, h.momentum, h.weight_decay * weight_decay_scale,
                               warmup, total, h.cosine_schedule is not False)


def _trainer_accumulation(trainer: Any, nominal_batch_size: int) -> tuple[int, int, float]:
    """``(batch, accumulate, weight_decay_scale)`` of the Trainer's run: ``batch`` is the DataModule's
    ``batch_size`` times the devices, the rest :func:`nominal_batch_accumulation`'s.

    Raises:
        ValueError: the DataModule has no ``batch_size`` (plain DataLoaders).
    """
    batch_size = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if not isinstance(batch_size, int):
        raise ValueError("nominal_batch_size needs the batch size: train with a DataModule that has batch_size, "
                         "or set the model's nominal_batch_size to None (no accumulation)")
    batch = batch_size * int(trainer.world_size)
    return (batch, *nominal_batch_accumulation(batch, nominal_batch_size))


def apply_nominal_batch(trainer: Any, nominal_batch_size: int) -> tuple[float, float]:
    """Set ``trainer.accumulate_grad_batches`` as Ultralytics accumulates towards its nominal batch.

    The batch is the DataModule's ``batch_size`` (per device) times ``trainer.world_size``, as
    Ultralytics' ``batch`` counts every device. Lightning divides the loss by the accumulation and
    DDP averages the gradients over devices; Ultralytics sums both (its DDP loss is multiplied by
    the world size), so the caller multiplies the loss it returns by the first value returned.
    Called from ``setup("fit")``, before ``configure_optimizers`` sizes the schedule.

    Args:
        trainer: the Trainer being set up.
        nominal_batch_size: Ultralytics' ``nbs``.

    Returns:
        ``(loss_scale, weight_decay_scale)``: ``accumulate * world_size``, and
        :func:`nominal_batch_accumulation`'s weight-decay scale.

    Raises:
        ValueError: the DataModule has no ``batch_size`` (plain DataLoaders), or the Trainer was
            given another ``accumulate_grad_batches``.
    """
    batch, accumulate, decay_scale = _trainer_accumulation(trainer, nominal_batch_size)
    if trainer.accumulate_grad_batches not in (1, accumulate):
        raise ValueError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) conflicts with the model's "
            f"nominal_batch_size={nominal_batch_size} ({accumulate} batches of {batch}); "
            "set one of them (the model's to None to use the Trainer's)"
        )
    trainer.accumulate_grad_batches = accumulate
    return float(accumulate * int(trainer.world_size)), decay_scale


def own_nominal_batch(trainer: Any, nominal_batch_size: int | None) -> tuple[float, float, int]:
    """The nominal batch for a module that accumulates itself (``schedule: ultralytics``): Lightning
    steps at every batch, so its ``accumulate_grad_batches`` must stay 1.

    Args:
        trainer: the Trainer being set up.
        nominal_batch_size: Ultralytics' ``nbs``; ``None``: a step per batch.

    Returns:
        ``(loss_scale, weight_decay_scale, accumulate)``: the devices (Ultralytics sums their gradients,
        DDP averages them), :func:`nominal_batch_accumulation`'s decay scale and accumulation.

    Raises:
        ValueError: the Trainer accumulates itself, or (with a nominal batch) there is no DataModule
            ``batch_size``.
    """
    if trainer.accumulate_grad_batches != 1:
        raise ValueError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) conflicts with the model's "
            "schedule: ultralytics, which accumulates towards nominal_batch_size itself; set the model's "
            "nominal_batch_size, or its schedule: lightning to use the Trainer's"
        )
    world_size = float(trainer.world_size)
    if nominal_batch_size is None:
        return world_size, 1.0, 1
    _, accumulate, decay_scale = _trainer_accumulation(trainer, nominal_batch_size)
    return world_size, decay_scale, accumulate


def check_max_grad_norm(max_grad_norm: float | None) -> None:
    """Raise unless ``max_grad_norm`` is a number > 0 or None."""
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                      or not max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be a number > 0 or None, got {max_grad_norm!r}")


def clip_gradients_by_default(module: Any, optimizer: Any, gradient_clip_val: float | None,
                              gradient_clip_algorithm: str | None, max_grad_norm: float | None) -> None:
    """``LightningModule.configure_gradient_clipping`` with a default: the Trainer's
    ``gradient_clip_val`` where it sets one, else the gradients' total norm clipped to
    ``max_grad_norm`` (Ultralytics' trainer clips every optimiser step at norm 10, after AMP's
    unscale, which Lightning also does first). ``None``: only what the Trainer asks.

    Args:
        module: the LightningModule.
        optimizer: the optimiser about to step.
        gradient_clip_val, gradient_clip_algorithm: what the Trainer passes.
        max_grad_norm: the default norm.
    """
    if gradient_clip_val is None and max_grad_norm is not None:
        module.clip_gradients(optimizer, gradient_clip_val=float(max_grad_norm), gradient_clip_algorithm="norm")
    else:
        module.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                              gradient_clip_algorithm=gradient_clip_algorithm)
