"""``COCOMaskMAP``: a ``torchmetrics.Metric`` for COCO mask and box mAP in validation.

``update`` takes a batch's per-image predictions on the validation canvas together with the
:class:`~seg_datamodule.structures.DetectionBatch` they were made on, maps them back to the
original images with the batch's exact letterbox (``scales``, ``pads``, ``orig_sizes``) and
keeps them as RLE-encoded COCO detections in tensor states (so ``torchmetrics`` gathers them
across ranks). ``compute`` de-duplicates images that a ``DistributedSampler`` repeated to even
out the ranks (by image id, keeping the first), then runs ``COCOeval`` against the original
annotation JSON, once: on rank 0 of the process group, which broadcasts the numbers.

Scoring nothing is not a result: a metric whose updates held no image that loaded (a wrong image
folder under ``on_bad_sample: skip`` turns every validation image into an empty stand-in) raises
:class:`NothingScoredError` instead of reporting AP 0 (issue 35).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from pycocotools.coco import COCO
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from seg_datamodule.evaluation.coco_eval import (
    IOU_TYPES,
    STAT_NAMES,
    Backend,
    backend_classes,
    deduplicate,
    evaluate_detections,
    image_sizes,
    load_coco,
    resolve_backend,
)
from seg_datamodule.evaluation.lvis_eval import LVISFileError, is_lvis_dataset
from seg_datamodule.errors import UserInputError
from seg_datamodule.evaluation.predictions import BatchLetterbox, CocoDetections, canvas_predictions_to_coco
from seg_datamodule.ops.checks import check_number

__all__ = ["COCOMaskMAP", "NothingScoredError", "images_loaded"]


class NothingScoredError(UserInputError, RuntimeError):
    """A metric was asked for a number but none of the images it was given had loaded."""


def images_loaded(batch: Any) -> int:
    """Images of ``batch`` that really loaded.

    A validation or test batch keeps an image that failed to load as an empty stand-in and counts
    it under an ``image_*`` key of ``batch.counts``; a predict batch (``counts["predicted"]``)
    leaves it out; a batch without counts loaded every image.
    """
    counts = getattr(batch, "counts", None) or {}
    n = len(batch.image_ids)
    if "predicted" in counts:
        return n
    return max(0, n - sum(int(v) for k, v in counts.items() if k.startswith("image_")))

_STATES = ("image_ids", "dets_per_image", "category_ids", "scores", "boxes", "rle_lengths", "rle_bytes")


class COCOMaskMAP(Metric):
    """COCO segm and bbox AP of canvas predictions, evaluated on the original images.

    Use it like any ``torchmetrics`` metric in a ``LightningModule``::

        metric = COCOMaskMAP(ann_file=datamodule.val_ann)    # e.g. in setup()
        metric.update(preds, batch)                           # in validation_step
        results = metric.compute(); metric.reset()            # in on_validation_epoch_end
        self.log_dict({f"val/{k}": v for k, v in results.items()})

    Labels are the DataModule's contiguous labels: label ``k`` is the ``k``-th smallest category
    id of the file (the rule :class:`~seg_datamodule.io.coco.CocoIndex` uses). Every detection is
    kept (``COCOeval`` itself keeps the 100 best per image and category); images are scored once
    each, only those that were updated.

    Args:
        ann_file (str | PathLike): the COCO instances JSON of the validation set (the
            DataModule's ``val_ann``).
        iou_types (Sequence[str]): any of ``"segm"`` (needs masks) and ``"bbox"``.
        category_ids (Sequence[int] | None): COCO category id of each label; ``None`` takes the
            file's category ids, sorted.
        mask_threshold (float): probability above which a resampled mask pixel is foreground
            (logits are compared with its logit; bool masks are read as 0 / 1).
        backend (str): ``"pycocotools"``, ``"faster_coco_eval"`` (the same numbers,
            ``COCOeval``'s per-image loop in C++; ``pip install 'seg-datamodule[fast-eval]'``),
            or ``"auto"`` (default): faster-coco-eval when installed. ``self.backend`` holds the
            one in use.
        **kwargs: ``torchmetrics.Metric`` options (``process_group``, ``sync_on_compute``, ...).

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        ModuleNotFoundError: ``backend="faster_coco_eval"`` without faster-coco-eval installed.
        TypeError, ValueError: a bad argument.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    _stat_names: tuple[str, ...] = STAT_NAMES

    def __init__(
        self,
        ann_file: str | os.PathLike[str],
        iou_types: Sequence[str] = IOU_TYPES,
        category_ids: Sequence[int] | None = None,
        mask_threshold: float = 0.5,
        backend: Backend = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(ann_file, (str, os.PathLike)):
            raise TypeError(f"ann_file must be a path, got {ann_file!r}")
        if not os.path.isfile(ann_file):
            raise FileNotFoundError(f"ann_file {str(ann_file)!r} does not exist")
        if isinstance(iou_types, str):
            iou_types = (iou_types,)
        iou_types = tuple(iou_types)
        if not iou_types or any(t not in IOU_TYPES for t in iou_types) or len(set(iou_types)) != len(iou_types):
            raise ValueError(f"iou_types must be distinct values among {list(IOU_TYPES)}, got {iou_types!r}")
        check_number("mask_threshold", mask_threshold, 0.0, 1.0)
        if not 0.0 < mask_threshold < 1.0:
            raise ValueError(f"mask_threshold must be in (0, 1), got {mask_threshold!r}")
        backend_classes(backend)  # fails now, not at the end of the first validation epoch
        self.backend = resolve_backend(backend)
        self.ann_file = os.fspath(ann_file)
        self.iou_types = iou_types
        self.mask_threshold = float(mask_threshold)
        self._category_ids = None if category_ids is None else [int(c) for c in category_ids]
        self._coco: COCO | None = None
        self._sizes: dict[int, tuple[int, int]] | None = None
        for name in _STATES:  # one list of tensors per CocoDetections field, "det_" + field
            self.add_state(f"det_{name}", default=[], dist_reduce_fx="cat")
        self.add_state("images_loaded", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    # -------------------------------------------------------------------------- ground truth

    @property
    def coco(self) -> COCO:
        """The annotation file as the backend's ``COCO`` reads it (loaded on first use).

        Raises:
            ValueError: ``category_ids`` names a category the file does not have.
            LVISFileError: the file is LVIS's (a ``ValueError``; use
                :class:`~seg_datamodule.evaluation.lvis_metric.LVISMaskMAP`).
        """
        if self._coco is None:
            coco = load_coco(self.ann_file, self.backend)
            if is_lvis_dataset(coco.dataset):
                # COCOeval would fail on the missing iscrowd, or score LVIS non-federated.
                raise LVISFileError(
                    f"{self.ann_file} is an LVIS annotation file (frequency / neg_category_ids): COCO AP "
                    "is the wrong metric there; use seg_datamodule.evaluation.LVISMaskMAP"
                )
            file_ids = sorted(int(c) for c in coco.cats)
            if self._category_ids is not None:
                unknown = sorted(set(self._category_ids) - set(file_ids))
                if unknown:
                    raise ValueError(f"category_ids {unknown} are not categories of {self.ann_file}")
            else:
                self._category_ids = file_ids
            self._coco, self._sizes = coco, image_sizes(coco)
        return self._coco

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of each contiguous label."""
        self.coco  # noqa: B018 (loads the file, which fills in the default)
        assert self._category_ids is not None
        return list(self._category_ids)

    def __getstate__(self) -> dict[str, Any]:
        # The parsed JSON stays behind (val2017's is large as Python objects, and a copy per
        # process buys nothing); a copy or a spawned process reloads it on first use.
        state = super().__getstate__()
        state["_coco"], state["_sizes"] = None, None
        return state

    # -------------------------------------------------------------------------------- update

    def update(self, preds: Sequence[Mapping[str, Tensor]], batch: Any) -> None:
        """Add a batch's predictions.

        Args:
            preds: one dict per image of ``batch``, on its canvas: ``boxes (Tensor[N, 4] float)``
                xyxy canvas pixels, ``scores (Tensor[N] float)``, ``labels (Tensor[N] int64)``
                contiguous ``0..C-1``, and for segm exactly one of ``masks (Tensor[N, Hm, Wm])``
                (bool, or float probabilities) and ``mask_logits (Tensor[N, Hm, Wm] float)``,
                where ``(Hm, Wm)`` is the canvas ``(H, W)`` or the stride grid
                ``(ceil(H / s), ceil(W / s))``, ``s = batch.mask_stride``.
            batch (DetectionBatch): the batch the predictions were made on; its ``image_ids``,
                ``scales``, ``pads``, ``orig_sizes``, ``mask_stride`` and canvas size
                (``images.shape[-2:]``) are read.

        Raises:
            TypeError, KeyError, ValueError: predictions of the wrong type or shape, NaN scores, a
                label out of range, an image id not in ``ann_file`` or an original size that is
                not the file's; the message names the image id.
        """
        for name in ("image_ids", "scales", "pads", "orig_sizes", "images", "mask_stride"):
            if not hasattr(batch, name):
                raise TypeError(f"batch must be a DetectionBatch (with .{name}), got {type(batch).__name__}")
        coco = self.coco
        assert self._sizes is not None and coco is not None
        dets = canvas_predictions_to_coco(
            preds,
            BatchLetterbox.from_batch(batch),
            self.category_ids,
            self._sizes,
            with_masks="segm" in self.iou_types,
            mask_threshold=self.mask_threshold,
            source=self.ann_file,
        )
        self._add(dets)
        self.images_loaded += images_loaded(batch)

    def _add(self, dets: CocoDetections) -> None:
        # Always append (even empty tensors): a rank whose lists stayed empty would be gathered as
        # float32 placeholders, which cannot be concatenated with the other ranks' int64 states.
        for name in _STATES:
            getattr(self, f"det_{name}").append(getattr(dets, name).to(self.device))

    # ------------------------------------------------------------------------------- compute

    def detections(self) -> CocoDetections:
        """Everything updated so far (all ranks' after a sync), repeats included, on the CPU."""
        values = {}
        for name in _STATES:
            state = getattr(self, f"det_{name}")
            if isinstance(state, list) and not state:  # nothing updated
                dtype = {"scores": torch.float32, "boxes": torch.float32, "rle_bytes": torch.uint8}.get(name, torch.int64)
                values[name] = torch.zeros(0, dtype=dtype)
            else:
                values[name] = dim_zero_cat(state).cpu()
        values["boxes"] = values["boxes"].reshape(-1, 4)
        return CocoDetections(**values)

    def _evaluate(self) -> dict[str, float]:
        # The precision tables of the last evaluation, for the run pictures' PR curves (rank 0's).
        self.last_precision: dict[str, Any] = {}
        return evaluate_detections(self.coco, deduplicate(self.detections()), self.iou_types, self.backend,
                                   curves=self.last_precision)

    def _distributed(self) -> bool:
        available = self.distributed_available_fn
        return bool(self.sync_on_compute and callable(available) and available())

    def compute(self) -> dict[str, Tensor]:
        """COCO stats of everything updated (on all ranks), each image once.

        Returns:
            ``{f"{iou_type}_{name}": Tensor[] float32}`` for ``name`` in ``AP, AP50, AP75,
            AP_small, AP_medium, AP_large, AR1, AR10, AR100, AR_small, AR_medium, AR_large``;
            ``-1`` where COCO has nothing to score.

        Raises:
            NothingScoredError: no image given to :meth:`update` had loaded (on any rank).
        """
        if int(self.images_loaded) == 0:
            raise NothingScoredError(
                f"{self.ann_file}: none of the images scored had loaded (every one missing or unreadable; the "
                "DataModule's report counts them by reason): refusing to report an AP over nothing")
        keys = [f"{t}_{name}" for t in self.iou_types for name in self._stat_names]
        if not self._distributed():
            results = self._evaluate()
            return {k: torch.tensor(results[k], dtype=torch.float32, device=self.device) for k in keys}
        # One evaluation for the whole group: rank 0 runs COCOeval, the others wait for its numbers.
        group = self.process_group
        src = 0 if group is None else dist.get_global_rank(group, 0)
        values = torch.zeros(len(keys) + 1, dtype=torch.float64, device=self.device)
        error: Exception | None = None
        if dist.get_rank(group) == 0:
            try:
                results = self._evaluate()
                values[:-1] = torch.tensor([results[k] for k in keys], dtype=torch.float64)
                values[-1] = 1.0
            except Exception as err:  # broadcast the failure too, or the other ranks would hang
                error = err
        dist.broadcast(values, src=src, group=group)
        if error is not None:
            raise error
        if values[-1] != 1.0:
            raise RuntimeError("COCO evaluation failed on rank 0 of the process group; see its error")
        return {k: values[i].float() for i, k in enumerate(keys)}
