"""What a fit's validation found, drawn: the results plot, PR curves and a confusion matrix (pure functions).

- :func:`results_figure`: every logged series (training losses by step, validation losses and AP
  by epoch), one small panel each, as Ultralytics' ``results.png``;
- :func:`pr_figure`: precision against recall at IoU 0.5 from COCOeval's own precision table (the
  one its AP is the mean of), per class and their mean, as Ultralytics' ``MaskPR_curve.png``;
- :func:`confusion_matrix` / :func:`confusion_figure`: detections scoring at least ``conf``
  matched to the ground truth by box IoU, whatever their class, greedily by score (Ultralytics'
  rule and defaults: conf 0.25, IoU 0.45); a ground truth nothing matched is counted in the
  background column, a detection that matched nothing in the background row. Crowd regions are
  not targets: a detection inside one (intersection over its own area at least ``iou``) is not
  counted at all, as COCOeval ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["confusion_figure", "confusion_matrix", "pr_figure", "results_figure"]


def results_figure(series: Mapping[str, Sequence[tuple[float, float]]], x_labels: Mapping[str, str]) -> Figure:
    """One panel per series, in the order given.

    Args:
        series: name -> ``(x, value)`` points (a step or an epoch, and the value logged there).
        x_labels: name -> the x axis' label (``"step"``, ``"epoch"``).

    Returns:
        matplotlib.figure.Figure: up to five panels a row.
    """
    from matplotlib.figure import Figure

    names = [n for n in series if series[n]]
    columns = min(max(len(names), 1), 5)
    rows = max(-(-len(names) // columns), 1)
    figure = Figure(figsize=(3.2 * columns, 2.6 * rows), layout="constrained")
    for k, name in enumerate(names):
        ax = figure.add_subplot(rows, columns, k + 1)
        x, y = (np.asarray(v, np.float64) for v in zip(*series[name]))
        ax.plot(x, y, marker="." if len(x) < 30 else None, linewidth=1.2, color="#1f77b4")
        if len(x) >= 10:  # a moving mean over a tenth of the points, as Ultralytics' smoothed line
            width = max(len(x) // 10, 2)
            ax.plot(x[width - 1 :], np.convolve(y, np.ones(width) / width, mode="valid"), ":", color="#ff7f0e")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(x_labels.get(name, ""), fontsize=8)
        ax.tick_params(labelsize=7)
    return figure


def pr_figure(precision: np.ndarray, names: Sequence[str], title: str = "mask") -> Figure:
    """Precision-recall curves at IoU 0.5 (all areas, 100 detections), per class and their mean.

    Args:
        precision: COCOeval's ``eval["precision"]``, ``ndarray[T, R, K, A, M]`` (R = 101 recall
            points; -1 where a class has no ground truth).
        names: class names, in the table's class order (the file's categories sorted by id).
        title: what was matched (``"mask"``, ``"box"``).

    Returns:
        matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure

    recall = np.linspace(0.0, 1.0, precision.shape[1])
    at50 = precision[0, :, :, 0, -1]  # [R, K]
    present = (at50 > -1).any(axis=0)
    figure = Figure(figsize=(7, 6), layout="constrained")
    ax = figure.add_subplot()
    for k in np.flatnonzero(present):
        if present.sum() <= 20:
            ax.plot(recall, at50[:, k], linewidth=1, label=f"{names[k]} {at50[:, k].mean():.3f}")
        else:
            ax.plot(recall, at50[:, k], linewidth=0.5, color="grey")
    if present.any():
        mean = at50[:, present].mean(axis=1)
        ax.plot(recall, mean, linewidth=3, color="#1f77b4", label=f"all classes {mean.mean():.3f} AP50")
        ax.legend(fontsize=7, loc="lower left")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(f"{title} precision-recall at IoU 0.5 ({int(present.sum())} classes with ground truth)", fontsize=10)
    return figure


def confusion_matrix(truth: Mapping[int, list[dict[str, Any]]], detections: Mapping[int, list[dict[str, Any]]],
                     category_ids: Sequence[int], conf: float = 0.25, iou: float = 0.45) -> np.ndarray:
    """Count ground truths by their class and the class of the detection matched to them.

    Args:
        truth: image id -> its COCO annotations (``bbox`` xywh, ``category_id``, ``iscrowd``).
        detections: image id -> its COCO results entries (``bbox``, ``category_id``, ``score``);
            every image of ``truth`` is scored, an image missing here has no detection.
        category_ids: the classes, in the matrix's order.
        conf: detections scoring below this are left out.
        iou: the box IoU a match needs.

    Returns:
        ndarray[C + 1, C + 1] int64: ``[true, predicted]``; index C is the background.
    """
    from pycocotools import mask as mask_utils

    index = {int(c): k for k, c in enumerate(category_ids)}
    background = len(category_ids)
    matrix = np.zeros((background + 1, background + 1), np.int64)
    for image_id, annotations in truth.items():
        targets = [a for a in annotations if not a.get("iscrowd", 0) and int(a["category_id"]) in index]
        crowd = [a["bbox"] for a in annotations if a.get("iscrowd", 0)]
        dets = sorted((d for d in detections.get(image_id, []) if d["score"] >= conf), key=lambda d: -d["score"])
        if crowd and dets:  # inside a crowd region: ignored, as COCOeval ignores it
            inside = mask_utils.iou([d["bbox"] for d in dets], crowd, [1] * len(crowd)).max(axis=1) >= iou
            dets = [d for d, skip in zip(dets, inside) if not skip]
        taken = np.zeros(len(targets), bool)
        if targets and dets:
            overlaps = np.asarray(mask_utils.iou([d["bbox"] for d in dets], [a["bbox"] for a in targets],
                                                 [0] * len(targets)))
        for j, det in enumerate(dets):
            predicted = index.get(int(det["category_id"]), background)
            best = -1
            if targets:
                candidates = np.where(taken, -1.0, overlaps[j])
                best = int(candidates.argmax()) if candidates.max() >= iou else -1
            if best < 0:
                matrix[background, predicted] += 1  # a detection of nothing
            else:
                taken[best] = True
                matrix[index[int(targets[best]["category_id"])], predicted] += 1
        for k in np.flatnonzero(~taken):
            matrix[index[int(targets[k]["category_id"])], background] += 1  # missed
    return matrix


def confusion_figure(matrix: np.ndarray, names: Sequence[str], conf: float = 0.25, iou: float = 0.45) -> Figure:
    """Draw :func:`confusion_matrix` normalised per true class (each column of the picture sums to 1).

    Args:
        matrix: ``[true, predicted]`` counts, the background last.
        names: class names in the matrix's order (without the background).
        conf, iou: the thresholds it was counted with, for the title.

    Returns:
        matplotlib.figure.Figure: true classes along x, predicted along y, as Ultralytics draws it.
    """
    from matplotlib.figure import Figure

    labels = [*names, "background"]
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)
    side = min(max(6.0, 0.18 * len(labels)), 22.0)
    figure = Figure(figsize=(side + 1.5, side), layout="constrained")
    ax = figure.add_subplot()
    image = ax.imshow(shares.T, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=ax, shrink=0.6)
    font = 8 if len(labels) <= 30 else 4
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=font)
    ax.set_yticks(range(len(labels)), labels, fontsize=font)
    if len(labels) <= 30:
        for (t, p), value in np.ndenumerate(shares):
            if value >= 0.005:
                ax.text(t, p, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if value > 0.5 else "black")
    ax.set_xlabel("true")
    ax.set_ylabel("predicted")
    ax.set_title(f"confusion matrix, normalised per true class (score >= {conf}, box IoU >= {iou}; "
                 f"{int(matrix.sum())} counted)", fontsize=10)
    return figure
