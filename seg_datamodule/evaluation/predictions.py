"""Turn one batch's predictions on the validation canvas into COCO detections on the original images.

Each image's boxes go back through the inverse letterbox (clipped to the image), its masks are
resampled to the original size and thresholded, each within its window
(:mod:`~seg_datamodule.evaluation.letterbox`), and run-length encoded from those windows (COCO's
compressed RLE, byte for byte what ``pycocotools.mask.encode`` gives for the full mask); labels
become the file's category ids. Everything a
user passes is checked here, once, with an error that names the image id and the field.
The result is a :class:`CocoDetections` of flat tensors (what a ``torchmetrics`` state can hold
and gather across ranks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torch import Tensor

from seg_datamodule.evaluation.letterbox import MaskWindow, boxes_to_original, mask_windows
from seg_datamodule.evaluation.safe_rle import MaskTooLargeError
from seg_datamodule.ops.rle import RLE_SAFE_PIXELS, rle_run_problem, rle_string

__all__ = ["BatchLetterbox", "CocoDetections", "canvas_predictions_to_coco", "encode_windows", "mask_stride_of"]


@dataclass(frozen=True)
class BatchLetterbox:
    """Where a batch's images sit on its canvas: what maps canvas predictions back to the originals.

    Attributes:
        image_ids (Tensor[B] int64): COCO image ids.
        scales (Tensor[B] float): original -> canvas scale of each image.
        pads (Tensor[B, 2] float): letterbox (left, top) padding, canvas pixels.
        orig_sizes (Tensor[B, 2] int64): original (H, W).
        canvas_size (tuple[int, int]): (Hc, Wc) of the canvas.
        mask_stride (int): stride of the mask grid when masks are not full-canvas.
    """

    image_ids: Tensor
    scales: Tensor
    pads: Tensor
    orig_sizes: Tensor
    canvas_size: tuple[int, int]
    mask_stride: int

    @classmethod
    def from_batch(cls, batch: Any) -> BatchLetterbox:
        """A :class:`~seg_datamodule.structures.DetectionBatch`'s letterbox (its canvas is ``images.shape[-2:]``)."""
        return cls(
            image_ids=batch.image_ids,
            scales=batch.scales,
            pads=batch.pads,
            orig_sizes=batch.orig_sizes,
            canvas_size=tuple(batch.images.shape[-2:]),
            mask_stride=int(batch.mask_stride),
        )


@dataclass  # not frozen: Lightning moves what predict_step returns to the CPU field by field
class CocoDetections:
    """Detections of a run of image occurrences, in original pixels and COCO category ids.

    An image occurrence is one image as it came through ``update``; the same image id may occur
    twice (a ``DistributedSampler`` pads ranks with repeats). Detections are grouped by
    occurrence, in order: ``category_ids.split(dets_per_image.tolist())``.

    Attributes:
        image_ids (Tensor[K] int64): COCO image id of each occurrence.
        dets_per_image (Tensor[K] int64): detections of each occurrence; sums to N.
        category_ids (Tensor[N] int64): COCO category ids.
        scores (Tensor[N] float32): confidence scores.
        boxes (Tensor[N, 4] float32): xywh boxes in original pixels.
        rle_lengths (Tensor[N] int64): bytes of each compressed RLE ``counts`` (0 without masks).
        rle_bytes (Tensor[sum(rle_lengths)] uint8): the ``counts`` strings, one after another.
    """

    image_ids: Tensor
    dets_per_image: Tensor
    category_ids: Tensor
    scores: Tensor
    boxes: Tensor
    rle_lengths: Tensor
    rle_bytes: Tensor

    def rles(self, sizes: Mapping[int, tuple[int, int]]) -> list[dict[str, Any]]:
        """The masks as pycocotools RLE dicts, sized from ``sizes[image_id] = (H, W)``."""
        data = self.rle_bytes.cpu().numpy().tobytes()
        ends = np.cumsum(self.rle_lengths.cpu().numpy())
        starts = ends - self.rle_lengths.cpu().numpy()
        det_image = np.repeat(self.image_ids.cpu().numpy(), self.dets_per_image.cpu().numpy())
        return [
            {"size": list(sizes[int(i)]), "counts": data[s:e]} for i, s, e in zip(det_image, starts, ends)
        ]


def encode_windows(windows: Sequence[MaskWindow], orig_size: tuple[int, int]) -> list[bytes]:
    """Compressed COCO RLE ``counts`` of full-size masks given by their windows.

    The column-major run boundaries are found inside each window only (a full-size mask is
    never built), then ``pycocotools`` compresses them (on an image of 2^24 pixels or more,
    where its encoder can overflow, :func:`~seg_datamodule.ops.rle.rle_string` does); the bytes
    equal ``pycocotools.mask.encode`` of the full mask.

    Args:
        windows: :class:`~seg_datamodule.evaluation.letterbox.MaskWindow` per mask.
        orig_size (tuple[int, int]): (H, W) of the full masks.

    Returns:
        list of ``bytes``, one per window.

    Raises:
        MaskTooLargeError: a mask holds a run of 2^29 pixels or more (pycocotools cannot hold it).
    """
    height, width = orig_size
    uncompressed = []
    for top, left, block in windows:
        if not block.any():
            uncompressed.append({"size": [height, width], "counts": [height * width]})
            continue
        # Each window column padded with an off pixel above and below: a change between
        # padded rows j - 1 and j is a run boundary at flat index (left + x) * H + top + j.
        h, w = block.shape
        padded = np.zeros((w, h + 2), bool)
        padded[:, 1:-1] = block.T
        x, j = np.nonzero(padded[:, 1:] != padded[:, :-1])
        flat = (left + x).astype(np.int64) * height + top + j
        # A run that ends at the bottom of one image column and one that starts at the top of the
        # next share a boundary: the two cancel (the runs are one).
        shared = np.flatnonzero(flat[1:] == flat[:-1])
        if shared.size:
            flat = np.delete(flat, np.concatenate([shared, shared + 1]))
        if flat.size and flat[-1] == height * width:  # on to the last pixel: no run after it
            flat = flat[:-1]
        counts = np.diff(np.concatenate([[0], flat, [height * width]]))
        uncompressed.append({"size": [height, width], "counts": counts.tolist()})
    if not uncompressed:
        return []
    if height * width < RLE_SAFE_PIXELS:
        return [rle["counts"] for rle in mask_utils.frPyObjects(uncompressed, height, width)]
    encoded = []
    for rle in uncompressed:
        problem = rle_run_problem(rle["counts"])
        if problem is not None:
            raise MaskTooLargeError(f"a predicted mask of the {height}x{width} (HxW) image holds {problem}; "
                                    "segm evaluation cannot score it (evaluate bbox only: iou_types=('bbox',))")
        encoded.append(rle_string(rle["counts"]))
    return encoded


def mask_stride_of(mask_shape: tuple[int, int], canvas_size: tuple[int, int], mask_stride: int) -> int | None:
    """1 if the mask grid is the canvas, ``mask_stride`` if it is the stride grid, else None."""
    if tuple(mask_shape) == tuple(canvas_size):
        return 1
    grid = tuple(-(-int(side) // mask_stride) for side in canvas_size)
    return mask_stride if tuple(mask_shape) == grid else None


def _field(pred: Mapping[str, Any], key: str, image_id: int) -> Tensor:
    if key not in pred:
        raise KeyError(f"predictions of image id {image_id} lack {key!r} (have {sorted(pred)})")
    value = pred[key]
    if not isinstance(value, Tensor):
        raise TypeError(f"predictions[{key!r}] of image id {image_id} must be a Tensor, got {type(value).__name__}")
    return value


def _check_image(
    pred: Mapping[str, Any], image_id: int, num_classes: int, with_masks: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, bool]:
    """Boxes, scores, labels and masks of one image, checked; whether the masks are logits."""
    if not isinstance(pred, Mapping):
        raise TypeError(f"predictions of image id {image_id} must be a dict of tensors, got {type(pred).__name__}")
    boxes, scores, labels = (_field(pred, k, image_id) for k in ("boxes", "scores", "labels"))
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"predictions['boxes'] of image id {image_id} must be (N, 4), got {tuple(boxes.shape)}")
    n = boxes.shape[0]
    if scores.shape != (n,) or labels.shape != (n,):
        raise ValueError(
            f"predictions of image id {image_id}: boxes {tuple(boxes.shape)} need scores and labels of shape "
            f"({n},), got {tuple(scores.shape)} and {tuple(labels.shape)}"
        )
    if not boxes.is_floating_point() or not scores.is_floating_point():
        raise TypeError(f"predictions['boxes'] and ['scores'] of image id {image_id} must be float tensors")
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"predictions['labels'] of image id {image_id} must be an integer tensor, got {labels.dtype}")
    if n and not torch.isfinite(scores).all():
        raise ValueError(f"predictions['scores'] of image id {image_id} contain NaN or infinite values")
    if n and not torch.isfinite(boxes).all():
        raise ValueError(f"predictions['boxes'] of image id {image_id} contain NaN or infinite values")
    if n and ((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).any():
        bad = boxes[(boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])][0].tolist()
        raise ValueError(f"predictions['boxes'] of image id {image_id} must be xyxy with x2 >= x1 and y2 >= y1, got {bad}")
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels[(labels < 0) | (labels >= num_classes)][0].item()
        raise ValueError(
            f"predictions['labels'] of image id {image_id} must be contiguous labels in [0, {num_classes - 1}], "
            f"got {bad}"
        )
    if not with_masks:
        return boxes, scores, labels, None, False
    keys = [k for k in ("masks", "mask_logits") if k in pred]
    if len(keys) != 1:
        raise KeyError(
            f"predictions of image id {image_id} need exactly one of 'masks' (bool or probabilities) and "
            f"'mask_logits' for segm evaluation, got {sorted(pred)}"
        )
    masks = _field(pred, keys[0], image_id)
    if masks.ndim != 3 or masks.shape[0] != n:
        raise ValueError(
            f"predictions[{keys[0]!r}] of image id {image_id} must be ({n}, Hm, Wm) for {n} boxes, "
            f"got {tuple(masks.shape)}"
        )
    if keys[0] == "mask_logits" and not masks.is_floating_point():
        raise TypeError(f"predictions['mask_logits'] of image id {image_id} must be float, got {masks.dtype}")
    # amax propagates NaN: one reduction, no (N, Hm, Wm) temporary.
    if masks.is_floating_point() and masks.numel() and torch.isnan(masks.amax()):
        raise ValueError(f"predictions[{keys[0]!r}] of image id {image_id} contain NaN")
    return boxes, scores, labels, masks, keys[0] == "mask_logits"


def canvas_predictions_to_coco(
    preds: Sequence[Mapping[str, Tensor]],
    letterbox: BatchLetterbox,
    category_ids: Sequence[int],
    image_sizes: Mapping[int, tuple[int, int]],
    *,
    with_masks: bool = True,
    mask_threshold: float = 0.5,
    source: str = "the annotation file",
) -> CocoDetections:
    """Map a batch's per-image canvas predictions to COCO detections on the original images.

    Args:
        preds: one mapping per image with ``boxes (Tensor[N, 4] float)`` xyxy canvas pixels,
            ``scores (Tensor[N] float)``, ``labels (Tensor[N] int)`` contiguous ``0..C-1``, and
            (when ``with_masks``) exactly one of ``masks (Tensor[N, Hm, Wm] bool or float
            probabilities)`` and ``mask_logits (Tensor[N, Hm, Wm] float)``, on the canvas
            (``Hm, Wm = Hc, Wc``) or its stride grid (``ceil(Hc / mask_stride)``, ...).
        letterbox (BatchLetterbox): the batch's image ids, scales, pads, original sizes, canvas
            size ``(Hc, Wc)`` and mask stride (:meth:`BatchLetterbox.from_batch`).
        category_ids (Sequence[int]): label ``k`` is category ``category_ids[k]``.
        image_sizes (Mapping[int, tuple[int, int]]): (H, W) of every image of the annotation file.
        with_masks (bool): encode masks (segm evaluation); boxes only otherwise.
        mask_threshold (float): probability above which a pixel is foreground (logits are
            compared with ``log(t / (1 - t))``, bool masks with 0.5).
        source (str): the annotation file, for error messages.

    Returns:
        :class:`CocoDetections` on the CPU.

    Raises:
        TypeError, KeyError, ValueError: a prediction of the wrong type, shape or value (NaN
            scores, a label out of range), an image id not in ``image_sizes`` or an original size
            that differs from the file's, naming the image id.
    """
    image_ids, scales, pads, orig_sizes = letterbox.image_ids, letterbox.scales, letterbox.pads, letterbox.orig_sizes
    canvas_size, mask_stride = letterbox.canvas_size, letterbox.mask_stride
    batch = int(image_ids.shape[0])
    if not isinstance(preds, Sequence) or isinstance(preds, (str, bytes)) or isinstance(preds, Mapping):
        raise TypeError(f"preds must be a list with one dict per image, got {type(preds).__name__}")
    if len(preds) != batch:
        raise ValueError(f"preds has {len(preds)} entries but the batch has {batch} images")
    if scales.shape != (batch,) or pads.shape != (batch, 2) or orig_sizes.shape != (batch, 2):
        raise ValueError(
            f"scales, pads and orig_sizes must be ({batch},), ({batch}, 2), ({batch}, 2), got "
            f"{tuple(scales.shape)}, {tuple(pads.shape)}, {tuple(orig_sizes.shape)}"
        )
    num_classes = len(category_ids)
    category_table = torch.as_tensor(list(category_ids), dtype=torch.int64)
    logit_threshold = math.log(mask_threshold / (1.0 - mask_threshold))
    ids, counts, cats, scores_out, boxes_out, lengths, chunks = [], [], [], [], [], [], []
    for b in range(batch):
        image_id = int(image_ids[b])
        if image_id not in image_sizes:
            raise ValueError(f"image id {image_id} is not in {source}")
        orig = (int(orig_sizes[b, 0]), int(orig_sizes[b, 1]))
        if orig != tuple(image_sizes[image_id]):
            raise ValueError(
                f"image id {image_id}: orig_size {orig} differs from its (height, width) "
                f"{tuple(image_sizes[image_id])} in {source}"
            )
        boxes, scores, labels, masks, logits = _check_image(preds[b], image_id, num_classes, with_masks)
        scale, pad = float(scales[b]), (float(pads[b, 0]), float(pads[b, 1]))
        xyxy = boxes_to_original(boxes.detach().double(), scale, pad, orig).cpu()
        ids.append(image_id)
        counts.append(boxes.shape[0])
        cats.append(category_table[labels.detach().cpu().long()])
        scores_out.append(scores.detach().float().cpu())
        boxes_out.append(torch.cat([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], dim=1).float())
        if masks is None:
            lengths.append(torch.zeros(boxes.shape[0], dtype=torch.int64))
            continue
        stride = mask_stride_of(tuple(masks.shape[1:]), canvas_size, mask_stride)
        if stride is None:
            grid = tuple(-(-int(s) // mask_stride) for s in canvas_size)
            raise ValueError(
                f"masks of image id {image_id} are {tuple(masks.shape[1:])} but must be the canvas {tuple(canvas_size)} "
                f"or its stride-{mask_stride} grid {grid}"
            )
        threshold = logit_threshold if logits else (0.5 if masks.dtype == torch.bool else mask_threshold)
        try:
            encoded = encode_windows(mask_windows(masks.detach(), scale, pad, orig, stride, threshold), orig)
        except MaskTooLargeError as err:
            raise MaskTooLargeError(f"image id {image_id}: {err}") from None
        lengths.append(torch.tensor([len(c) for c in encoded], dtype=torch.int64))
        chunks.extend(encoded)
    return CocoDetections(
        image_ids=torch.tensor(ids, dtype=torch.int64),
        dets_per_image=torch.tensor(counts, dtype=torch.int64),
        category_ids=torch.cat(cats) if cats else torch.zeros(0, dtype=torch.int64),
        scores=torch.cat(scores_out) if scores_out else torch.zeros(0),
        boxes=torch.cat(boxes_out) if boxes_out else torch.zeros(0, 4),
        rle_lengths=torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.int64),
        rle_bytes=_bytes_tensor(b"".join(chunks)),
    )


def _bytes_tensor(data: bytes) -> Tensor:
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
