"""Ultralytics YOLO-seg on this project's batches: ``YOLOSegModule``.

Its batches reach Ultralytics' loss through ``to_ultralytics_batch``
(:mod:`~seg_datamodule.integrations.ultralytics_batch`, re-exported here). ``YOLOSegModule`` builds an Ultralytics
segmentation model from its YAML, trains it with the model's own criterion
(``SegmentationModel.init_criterion()``: ``v8SegmentationLoss`` for YOLOv8/YOLO11-seg) and
validates with Ultralytics' own NMS (``ultralytics.utils.nms.non_max_suppression``) and mask
decoding (``ultralytics.utils.ops.process_mask``), scored by
:class:`~seg_datamodule.evaluation.COCOMaskMAP`. It trains as Ultralytics' trainer does where
that matters for accuracy: it starts from a checkpoint's weights, validates and checkpoints an
EMA of the weights (:class:`~seg_datamodule.integrations.UltralyticsEMA`), steps, warms up and
decays the learning rate on Ultralytics' own cadence (the accumulation towards a nominal batch of
64 images ramped up over the warmup, :mod:`~seg_datamodule.integrations._ultralytics_schedule`)
and clips the gradients' norm at 10 before each step.

Ultralytics is AGPL-3.0 and optional: ``pip install "seg-datamodule[ultralytics]"``. This module
imports without it; ``YOLOSegModule`` raises an ``ImportError`` naming that extra. Before the
first import of ``ultralytics`` it sets ``YOLO_OFFLINE=1`` and ``YOLO_AUTOINSTALL=0`` (unless the
user set them), so nothing checks the network or pip-installs at run time.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from seg_datamodule.evaluation import COCOMaskMAP
from seg_datamodule.integrations._box_only import refuse_box_only
from seg_datamodule.integrations._coco import log_coco_results, make_coco_metric
from seg_datamodule.integrations._ema import UltralyticsEMA, check_ema_args
from seg_datamodule.integrations._optim import (
    SCHEDULES, apply_nominal_batch, check_max_grad_norm, check_optim_args, clip_gradients_by_default,
    configure_from_hparams, make_optimizer, own_nominal_batch,
)
from seg_datamodule.integrations._stages import NON_FINITE_CHOICES, EvaluationStages, OnceFilter, check_loss
from seg_datamodule.integrations._ultralytics_checkpoint import read_yolo_weights
from seg_datamodule.integrations._ultralytics_detections import decode_detections
from seg_datamodule.integrations._ultralytics_schedule import UltralyticsStepper, ultralytics_param_groups
from seg_datamodule.integrations._weights import Transfer, load_matching
from seg_datamodule.integrations.ultralytics_batch import semantic_masks, to_ultralytics_batch
from seg_datamodule.ops.checks import check_choice, check_number
from seg_datamodule.structures import DetectionBatch

__all__ = ["YOLOSegModule", "import_ultralytics", "semantic_masks", "to_ultralytics_batch"]

_EXTRA = 'pip install "seg-datamodule[ultralytics]"'


def import_ultralytics() -> Any:
    """Import ``ultralytics`` offline (``YOLO_OFFLINE=1``, ``YOLO_AUTOINSTALL=0`` unless set).

    Returns:
        The ``ultralytics`` module.

    Raises:
        ImportError: it is not installed; the message names the extra to install.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")  # no DNS probe, no analytics, no asset download
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")  # never pip-install a "missing" requirement
    try:
        import ultralytics
    except ImportError as err:
        raise ImportError(
            f"YOLOSegModule needs Ultralytics (AGPL-3.0), which is not installed: {_EXTRA}"
        ) from err
    return ultralytics


# ------------------------------------------------------------------------------ the module


class YOLOSegModule(EvaluationStages, L.LightningModule):
    """An Ultralytics segmentation model trained with its own loss on :class:`DetectionBatch` es.

    Args:
        num_classes (int): C (linked from ``data.num_classes`` by the CLI).
        model (str): an Ultralytics model YAML, by name (``"yolo11n-seg.yaml"``, ``"yolov8s-seg.yaml"``,
            shipped inside ultralytics) or path; the model is built from it with random weights.
        weights (str | None): the weights to start from: an Ultralytics checkpoint of that model
            (``yolo11n-seg.pt``, a run's ``best.pt``; its EMA if it has one, as Ultralytics loads
            it) or a ``state_dict`` file (``torch.load(weights_only=True)``). A checkpoint is a
            pickled model, but it is parsed without importing or calling anything it names (see
            :mod:`~seg_datamodule.integrations._ultralytics_checkpoint`). Tensors of another shape
            (the class branch of an 80-class checkpoint) keep this model's initialisation and
            are logged, as Ultralytics' ``intersect_dicts`` transfers; ``self.pretrained`` holds
            the :class:`~seg_datamodule.integrations._weights.Transfer`. ``None``: random weights.
        ema (bool): validate, checkpoint and end training with Ultralytics' EMA of the weights
            (:class:`~seg_datamodule.integrations.UltralyticsEMA`, added by ``configure_callbacks``).
        ema_decay, ema_tau (float): its decay ramp ``ema_decay * (1 - exp(-updates / ema_tau))``.
        nominal_batch_size (int | None): Ultralytics' ``nbs``: accumulate ``max(round(nbs / batch),
            1)`` batches per optimiser step (``batch`` = the DataModule's ``batch_size`` times the
            devices), sum their gradients as Ultralytics does and scale the weight decay by
            ``batch * accumulate / nbs``. ``None``: one step per batch (or, with ``schedule:
            lightning``, the Trainer's own ``accumulate_grad_batches``).
        box, cls, dfl (float): Ultralytics' loss gains (``box`` also weighs the mask loss).
        optimizer (str): ``"AdamW"`` or ``"SGD"`` (Nesterov); no weight decay on norms and biases.
        lr, momentum, weight_decay (float): its learning rate (Ultralytics' ``lr0``), momentum / beta1
            and weight decay.
        schedule (str): ``"ultralytics"`` (default): the module steps as Ultralytics' trainer does
            (:class:`~seg_datamodule.integrations._ultralytics_schedule.UltralyticsStepper`): over
            the warmup the accumulation ramps from 1 to the nominal one, the biases' learning rate
            falls from ``warmup_bias_lr`` and the others' rise from 0, SGD's momentum rises from
            ``warmup_momentum``; then the learning rate follows ``lr_factor(epoch)``, linear to
            ``lr * lrf`` (a cosine with ``cos_lr``). Lightning then sees one step per batch
            (``trainer.global_step`` counts batches; ``optimizer_steps`` counts the real ones),
            and a checkpoint taken between two steps holds the gradients accumulated so far, so
            a resumed run steps as the uninterrupted one. ``"lightning"``: a linear warmup over
            ``warmup_steps`` optimiser steps, then a cosine to 0 (``cosine_schedule``), with
            Lightning's fixed ``accumulate_grad_batches``.
        warmup_epochs, warmup_bias_lr, warmup_momentum, lrf (float), cos_lr (bool): Ultralytics' keys
            of the same names and defaults, for ``schedule: ultralytics``.
        warmup_steps (int | None): ``schedule: lightning``'s linear warmup, optimiser steps (None: 100).
        cosine_schedule (bool | None): ``schedule: lightning``'s cosine decay to 0 (None: true).
        max_grad_norm (float | None): clip the gradients' total norm at each optimiser step, as
            Ultralytics' trainer does (at 10); the Trainer's ``gradient_clip_val``, where set,
            wins. ``None``: no clipping but the Trainer's.
        conf, iou (float): validation NMS confidence and IoU thresholds (Ultralytics' val defaults).
        max_det (int): detections kept per image after NMS.
        nms_time_limit (float | None): Ultralytics' NMS gives up on a batch after ``2 + limit *
            images`` seconds, keeping no detection for the images left (and logs a warning per
            batch); ``None`` (default) sets no limit, so every image is scored, as on a GPU.
        on_nonfinite_loss (str): a NaN or infinite training loss ``"stop"`` s the run (default;
            with ``InterruptCheckpoint`` a checkpoint is saved) or is ``"skip"`` ped (no optimiser
            step), named once with the step and the terms (:func:`~seg_datamodule.integrations._stages.check_loss`).
        coco_eval (bool): score validation detections with COCO mAP (``val/segm_AP``, ...).
        coco_ann_file (str | None): the COCO JSON to score against; ``None`` takes the
            DataModule's ``val_ann`` at ``setup``.

    Logs ``train/{loss,box_loss,seg_loss,cls_loss,dfl_loss}``, the same under ``val/`` and the COCO
    ``val/{segm,bbox}_{AP,AP50,AP75,AP_small,AP_medium,AP_large}`` of the NMS detections (``test/``
    in ``trainer.test``); ``trainer.predict`` returns COCO detections (:class:`EvaluationStages`).

    Raises:
        ImportError: Ultralytics is not installed (the message names the extra).
        ValueError: a bad argument, a weights file that does not fit the model (``WeightsFileError``),
            at ``setup`` a ``nominal_batch_size`` without a DataModule's ``batch_size``, or (at
            the first batch) a canvas that is not a multiple of the model's stride.
    """

    detections_name = "YOLO detections after NMS"

    def __init__(
        self,
        num_classes: int,
        model: str = "yolo11n-seg.yaml",
        weights: str | None = None,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        optimizer: Literal["AdamW", "SGD"] = "AdamW",
        lr: float = 2e-3,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        schedule: Literal["ultralytics", "lightning"] = "ultralytics",
        warmup_epochs: float = 3.0,
        warmup_bias_lr: float = 0.1,
        warmup_momentum: float = 0.8,
        lrf: float = 0.01,
        cos_lr: bool = False,
        warmup_steps: int | None = None,
        cosine_schedule: bool | None = None,
        max_grad_norm: float | None = 10.0,
        conf: float = 0.001,
        iou: float = 0.7,
        max_det: int = 300,
        coco_eval: bool = True,
        coco_ann_file: str | None = None,
        ema: bool = True,
        ema_decay: float = 0.9999,
        ema_tau: float = 2000.0,
        nominal_batch_size: int | None = 64,
        nms_time_limit: float | None = None,
        on_nonfinite_loss: Literal["stop", "skip"] = "stop",
    ) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        for name, value in (("box", box), ("cls", cls), ("dfl", dfl)):
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        for name, value in (("conf", conf), ("iou", iou)):
            if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if isinstance(max_det, bool) or not isinstance(max_det, int) or max_det < 1:
            raise ValueError(f"max_det must be a positive int, got {max_det!r}")
        check_choice("schedule", schedule, SCHEDULES)
        if schedule == "ultralytics" and (warmup_steps is not None or cosine_schedule is not None):
            raise ValueError("warmup_steps and cosine_schedule set schedule: lightning; schedule: ultralytics warms "
                             "up over warmup_epochs and decays to lrf (cos_lr for a cosine)")
        check_optim_args(optimizer, lr, momentum, weight_decay, 100 if warmup_steps is None else warmup_steps)
        for name, value, high in (("warmup_epochs", warmup_epochs, None), ("warmup_bias_lr", warmup_bias_lr, None),
                                  ("warmup_momentum", warmup_momentum, 1.0), ("lrf", lrf, 1.0)):
            check_number(name, value, 0.0, high)
        if not isinstance(cos_lr, bool):
            raise ValueError(f"cos_lr must be a bool, got {cos_lr!r}")
        check_max_grad_norm(max_grad_norm)
        check_choice("on_nonfinite_loss", on_nonfinite_loss, NON_FINITE_CHOICES)
        if nms_time_limit is not None:
            check_number("nms_time_limit", nms_time_limit, 0.0)
        if not isinstance(ema, bool):
            raise ValueError(f"ema must be a bool, got {ema!r}")
        check_ema_args(ema_decay, ema_tau)
        if nominal_batch_size is not None and (isinstance(nominal_batch_size, bool)
                                               or not isinstance(nominal_batch_size, int) or nominal_batch_size < 1):
            raise ValueError(f"nominal_batch_size must be a positive int or None, got {nominal_batch_size!r}")
        import_ultralytics()
        from ultralytics.cfg import get_cfg
        from ultralytics.nn.tasks import SegmentationModel

        self.save_hyperparameters()
        self.num_classes = num_classes
        self.model = SegmentationModel(model, ch=3, nc=num_classes, verbose=False)
        # The hyperparameters Ultralytics' criterion reads (box/cls/dfl gains, overlap_mask, epochs).
        self.model.args = get_cfg(overrides={"box": box, "cls": cls, "dfl": dfl, "overlap_mask": False})
        self.pretrained: Transfer | None = None
        if weights is not None:
            self.pretrained = load_matching(self.model, *read_yolo_weights(weights))
        self._loss_scale, self._weight_decay_scale = 1.0, 1.0  # set by setup("fit") for nominal_batch_size
        self.stepper = UltralyticsStepper(lr=lr, momentum=momentum, lrf=lrf, cos_lr=cos_lr, warmup_epochs=warmup_epochs,
                                          warmup_bias_lr=warmup_bias_lr, warmup_momentum=warmup_momentum,
                                          ) if schedule == "ultralytics" else None
        self._skipped = False  # the batch's loss was not finite and on_nonfinite_loss skips it
        self._criterion: Any = None
        self._criterion_device: torch.device | None = None
        self.coco_metric: COCOMaskMAP | None = None
        self.test_metric: COCOMaskMAP | None = None

    # ------------------------------------------------------------------------------ loss

    def criterion(self) -> Any:
        """The model's own loss (``v8SegmentationLoss`` for YOLOv8/YOLO11), built on the model's device."""
        device = next(self.model.parameters()).device
        if self._criterion is None or self._criterion_device != device:
            self._criterion = self.model.init_criterion()
            self._criterion_device = device
        return self._criterion

    def check_batch(self, batch: DetectionBatch) -> None:
        """Raise ``ValueError`` when the canvas does not fit the model's strides."""
        stride = int(self.model.stride.max())
        height, width = batch.images.shape[-2:]
        if height % stride or width % stride:
            raise ValueError(
                f"the canvas is {height}x{width} but {self.hparams.model} needs multiples of its stride "
                f"{stride}; set data.image_size to a multiple of {stride}"
            )

    def compute_losses(self, batch: DetectionBatch, outputs: Any = None) -> tuple[Tensor, dict[str, Tensor], Any]:
        """The Ultralytics loss of a batch.

        Args:
            batch: a collated batch.
            outputs: the model's outputs (train or eval mode) on ``to_ultralytics_batch(batch)["img"]``
                (computed here when ``None``).

        Returns:
            The loss to back-propagate (``criterion(...)[0].sum()``: the gained losses times the
            batch size, as Ultralytics' trainer back-propagates), the detached per-term losses
            (``box_loss``, ``seg_loss``, ``cls_loss``, ``dfl_loss``; ``sem_loss`` for a model with
            a semantic branch), and the outputs.
        """
        self.check_batch(batch)
        ubatch = to_ultralytics_batch(batch)
        if outputs is None:
            outputs = self.model(ubatch["img"])
        raw = outputs[1] if isinstance(outputs, tuple) else outputs
        semantic = isinstance(raw.get("proto"), tuple)  # Ultralytics' own test for a semantic branch
        if semantic:
            ubatch["sem_masks"] = semantic_masks(batch.masks, batch.labels, batch.boxes_per_image)
        loss, items = self.criterion()(outputs, ubatch)
        return loss.sum(), {k: v for k, v in items.items() if k != "sem_loss" or semantic}, outputs

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Tensor:
        """Ultralytics' loss; logs ``train/loss`` (per batch) and each term.

        Returns the loss times the accumulation and the devices when ``nominal_batch_size`` is
        set, so that after Lightning's division by both the gradients are Ultralytics' sums.
        """
        loss, items, _ = self.compute_losses(batch)
        self._skipped = not check_loss(self, loss, items, "train")
        if self._skipped:
            return None  # type: ignore[return-value]  # on_nonfinite_loss: skip
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        for name, value in items.items():
            self.log(f"train/{name}", value, batch_size=len(batch))
        return loss * self._loss_scale if self._loss_scale != 1.0 else loss

    def on_train_epoch_end(self) -> None:
        """Advance an end-to-end criterion's one-to-many / one-to-one schedule (YOLO26), per epoch."""
        if self._criterion is not None and hasattr(self._criterion, "update"):
            self._criterion.update()

    # ------------------------------------------------------------------------------ validation

    def configure_callbacks(self) -> list[L.Callback]:
        """:class:`~seg_datamodule.integrations.UltralyticsEMA` when ``ema`` (it replaces one the Trainer has)."""
        return [UltralyticsEMA(self.hparams.ema_decay, self.hparams.ema_tau)] if self.hparams.ema else []

    def setup(self, stage: str) -> None:
        """Set the nominal-batch accumulation when fitting; make the COCO metric (``val_ann`` is known by now);
        refuse ``box_only: keep`` (:func:`refuse_box_only`)."""
        refuse_box_only(self, "Ultralytics YOLO-seg (YOLOSegModule)")
        if stage == "fit" and self.hparams.schedule == "ultralytics":
            self._loss_scale, self._weight_decay_scale, accumulate = own_nominal_batch(
                self.trainer, self.hparams.nominal_batch_size)
            self.stepper.set_accumulation(accumulate)
        elif stage == "fit" and self.hparams.nominal_batch_size is not None:
            self._loss_scale, self._weight_decay_scale = apply_nominal_batch(self.trainer,
                                                                             self.hparams.nominal_batch_size)
        max_epochs = self._trainer.max_epochs if self._trainer is not None else None
        if max_epochs is not None and max_epochs > 0:  # the one-to-one loss schedule of YOLO26 reads it
            self.model.args.epochs = int(max_epochs)
        if self.hparams.coco_eval and self.coco_metric is None and stage in ("fit", "validate"):
            self.coco_metric = make_coco_metric(self, self.hparams.coco_ann_file, self.num_classes)
        self.setup_stage(stage)

    def predict_batch(self, batch: DetectionBatch, outputs: Any = None) -> list[dict[str, Tensor]]:
        """Detections per image of ``batch`` (``outputs``: its eval-mode model outputs, computed here when
        ``None``): Ultralytics' NMS and mask decoding, on the canvas, as :func:`decode_detections` returns them."""
        limit = self.hparams.get("nms_time_limit")
        if limit is not None:  # Ultralytics warns per batch it gives up on: once here
            from ultralytics.utils import LOGGER

            OnceFilter.install(LOGGER, "NMS time limit", "detections of the batch's later images are dropped; "
                                                         "nms_time_limit: null sets no limit")
        if outputs is None:
            outputs = self.model(to_ultralytics_batch(batch)["img"])
        h = self.hparams
        return decode_detections(outputs, batch, conf=h.conf, iou=h.iou, num_classes=self.num_classes, max_det=h.max_det,
                                 end2end=bool(getattr(self.model, "end2end", False)), time_limit=limit)

    def validation_step(self, batch: DetectionBatch, batch_idx: int) -> None:
        """Logs ``val/loss`` and its terms; the NMS detections go into the COCO metric."""
        loss, items, outputs = self.compute_losses(batch)
        check_loss(self, loss, items, "val")
        self.log("val/loss", loss, batch_size=len(batch))
        for name, value in items.items():
            self.log(f"val/{name}", value, batch_size=len(batch))
        if self.coco_metric is not None:
            self.coco_metric.update(self.predict_batch(batch, outputs), batch)

    def on_validation_epoch_end(self) -> None:
        """Logs COCO ``val/{segm,bbox}_{AP,...}`` of the detections and prints both APs."""
        log_coco_results(self, self.coco_metric, self.detections_name)

    def configure_optimizers(self) -> Any:
        """AdamW or SGD, no decay on norms and biases, the rest scaled for the nominal batch. ``schedule:
        ultralytics``: Ultralytics' three groups, their rates set per batch by :meth:`optimizer_step`;
        ``lightning``: a warmup then a cosine (:func:`~seg_datamodule.integrations._optim.configure_optimizer`)."""
        h = self.hparams
        if h.schedule == "lightning":
            return configure_from_hparams(self, self._weight_decay_scale)
        groups = ultralytics_param_groups(self.model, h.weight_decay * self._weight_decay_scale)
        return make_optimizer(groups, h.optimizer, h.lr, h.momentum)

    # ------------------------------------------------------------------------------ Ultralytics' cadence

    @property
    def optimizer_stepped(self) -> bool:
        """Whether the last training batch ended in an optimiser step (every batch does with ``schedule: lightning``)."""
        return self.stepper is None or self.stepper.stepped

    @property
    def optimizer_steps(self) -> int:
        """``schedule: ultralytics``: the real optimiser steps of the current fit (``trainer.global_step`` counts batches)."""
        return 0 if self.stepper is None else self.stepper.steps

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """``schedule: ultralytics``: keep the gradients while a step accumulates them."""
        if self.stepper is None:
            return super().optimizer_zero_grad(epoch, batch_idx, optimizer)
        self.stepper.zero_grad(self.trainer, epoch, batch_idx, optimizer)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """``schedule: ultralytics``: the batch's rates, and a step only where Ultralytics' trainer steps."""
        if self.stepper is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._skipped = False
        self.stepper.step(self.trainer, epoch, batch_idx, optimizer, optimizer_closure, lambda: self._skipped)

    def on_train_start(self) -> None:
        """Put back the gradients a checkpoint taken between two steps held."""
        if self.stepper is not None:
            self.stepper.restore(self.model)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """``schedule: ultralytics``: between two steps, the gradients accumulated so far (``accumulated_gradients``)."""
        super().on_save_checkpoint(checkpoint)
        if self.stepper is not None:
            self.stepper.save(checkpoint, self.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep a checkpoint's accumulated gradients for :meth:`on_train_start` (and its epoch, :class:`EvaluationStages`)."""
        super().on_load_checkpoint(checkpoint)
        if self.stepper is not None:
            self.stepper.load(checkpoint)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Ultralytics' clipping at ``max_grad_norm`` unless the Trainer sets its own."""
        clip_gradients_by_default(self, optimizer, gradient_clip_val, gradient_clip_algorithm,
                                  self.hparams.max_grad_norm)

