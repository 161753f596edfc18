"""What a split holds, drawn: the label picture of a run folder (Ultralytics' ``labels.jpg``, with COCO's sizes).

:func:`label_stats` reads a split's index (nothing from disk) into :class:`LabelStats`;
:func:`label_figure` draws them in six panels: instances per class, instances per image, object
sizes in COCO's small / medium / large (by the annotation's ``area``, the ranges COCOeval scores),
box width against height and box centres (both as fractions of their image), and the split's
totals. Both are pure; :func:`figure_rgb` renders a figure to an array without pyplot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["COCO_SIZES", "LabelStats", "figure_rgb", "label_figure", "label_stats"]

#: COCOeval's area ranges (``params.areaRng``): small below 32², medium below 96², large from 96².
COCO_SIZES: dict[str, tuple[float, float]] = {"small": (0.0, 32.0**2), "medium": (32.0**2, 96.0**2),
                                               "large": (96.0**2, float("inf"))}
#: The classes a bar chart names at most (the most frequent); the rest are summed into one bar.
MAX_CLASS_BARS = 40


@dataclass(frozen=True)
class LabelStats:
    """A split's target instances, counted (crowd regions are not targets; their count is kept).

    Attributes:
        split (str): the split's name.
        names (tuple[str, ...]): class names by contiguous label.
        class_counts (ndarray[C] int64): instances per class.
        instances_per_image (ndarray[I] int64): instances per image, backgrounds included.
        sizes (dict[str, int]): instances per COCO size (:data:`COCO_SIZES`).
        box_wh (ndarray[N, 2] float64): box width and height as fractions of their image's.
        box_centers (ndarray[N, 2] float64): box centre (x, y) as fractions of their image's.
        crowd (int): crowd regions (not targets).
    """

    split: str
    names: tuple[str, ...]
    class_counts: np.ndarray
    instances_per_image: np.ndarray
    sizes: dict[str, int]
    box_wh: np.ndarray
    box_centers: np.ndarray
    crowd: int

    @property
    def instances(self) -> int:
        return int(self.class_counts.sum())


def label_stats(split: str, index: Any) -> LabelStats:
    """Count a split's target instances from its index.

    Args:
        split: the split's name, for the title.
        index (CocoIndex): its index (``instance_columns``, ``widths``, ``heights``, ``class_names``).

    Returns:
        LabelStats: the counts.
    """
    columns = index.instance_columns()
    labels, boxes, areas = columns["labels"], columns["bboxes"], columns["areas"]
    per_image = np.diff(columns["instance_offsets"]).astype(np.int64)
    # Each instance's image size: the per-image sizes repeated by their instance counts.
    size = np.stack([np.repeat(index.widths, per_image), np.repeat(index.heights, per_image)], 1).astype(np.float64)
    size = np.maximum(size, 1.0)
    wh = boxes[:, 2:4] / size if len(boxes) else np.zeros((0, 2))
    centers = (boxes[:, 0:2] + boxes[:, 2:4] / 2) / size if len(boxes) else np.zeros((0, 2))
    sizes = {name: int(((areas >= lo) & (areas < hi)).sum()) for name, (lo, hi) in COCO_SIZES.items()}
    names = tuple(index.class_names)
    return LabelStats(split=split, names=names, class_counts=np.bincount(labels, minlength=len(names)).astype(np.int64),
                      instances_per_image=per_image, sizes=sizes, box_wh=wh, box_centers=centers,
                      crowd=int(index.num_crowd))


def _class_bars(ax: Any, stats: LabelStats) -> None:
    order = np.argsort(-stats.class_counts, kind="stable")
    shown = order[:MAX_CLASS_BARS]
    counts = [int(stats.class_counts[k]) for k in shown]
    names = [stats.names[k] for k in shown]
    rest = int(stats.class_counts[order[MAX_CLASS_BARS:]].sum())
    if rest:
        counts.append(rest)
        names.append(f"{len(order) - MAX_CLASS_BARS} more")
    ax.bar(range(len(counts)), counts, color="#1f77b4")
    ax.set_xticks(range(len(counts)), names, rotation=90, fontsize=6)
    ax.set_ylabel("instances")
    ax.set_title(f"instances per class ({int((stats.class_counts > 0).sum())} of {len(stats.names)} classes present)",
                 fontsize=9)


def _density(ax: Any, xy: np.ndarray, title: str, labels: tuple[str, str]) -> None:
    if len(xy):
        ax.hist2d(xy[:, 0].clip(0, 1), xy[:, 1].clip(0, 1), bins=40, range=[[0, 1], [0, 1]], cmap="Blues", cmin=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title, fontsize=9)


def label_figure(stats: LabelStats) -> Figure:
    """Draw :class:`LabelStats` in six panels (see the module docstring).

    Args:
        stats: a split's counts.

    Returns:
        matplotlib.figure.Figure: 16 x 9 inches (no pyplot state).
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(16, 9), layout="constrained")
    grid = figure.add_gridspec(2, 3)
    _class_bars(figure.add_subplot(grid[0, :2]), stats)

    ax = figure.add_subplot(grid[0, 2])
    total = max(stats.instances, 1)
    values = [stats.sizes[name] for name in COCO_SIZES]
    bars = ax.bar(list(COCO_SIZES), values, color=["#d62728", "#ff7f0e", "#2ca02c"])
    for bar, value in zip(bars, values):
        ax.annotate(f"{value} ({100 * value / total:.0f}%)", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_title("object sizes (COCO: area < 32², < 96², larger)", fontsize=9)

    ax = figure.add_subplot(grid[1, 0])
    per_image = stats.instances_per_image
    top = int(per_image.max()) if len(per_image) else 0
    ax.hist(per_image, bins=np.arange(0, top + 2) - 0.5 if top < 60 else 60, color="#9467bd")
    ax.set_xlabel("instances in the image")
    ax.set_ylabel("images")
    ax.set_title(f"instances per image ({int((per_image == 0).sum())} backgrounds of {len(per_image)})", fontsize=9)

    _density(figure.add_subplot(grid[1, 1]), stats.box_wh, "box width and height (fraction of the image)",
             ("width", "height"))
    ax = figure.add_subplot(grid[1, 2])
    _density(ax, stats.box_centers, "box centres", ("x", "y"))
    ax.invert_yaxis()  # as on the image: y down
    figure.suptitle(f"{stats.split}: {len(per_image)} images, {stats.instances} instances, {stats.crowd} crowd regions")
    return figure


def figure_rgb(figure: Figure, dpi: int = 80) -> np.ndarray:
    """Render ``figure`` off-screen (Agg, no pyplot).

    Returns:
        ndarray[H, W, 3] uint8: the RGB pixels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    figure.set_dpi(dpi)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
