"""Copy-paste (Ghiasi et al., CVPR 2021, "Simple Copy-Paste") with exact occlusion.

Pure functions over a finished :class:`~seg_datamodule.structures.Sample` and a source canvas of
the same size (its own mirror image, or another sample of the batch):

* the pasted pixels are exactly the pixels whose centres the pasted polygons cover (the
  rasteriser at stride 1), so a pasted object's pixels and its mask agree;
* every instance of the target that a pasted object may cover gets that object's rings as an
  *occluder* (:func:`~seg_datamodule.ops.occlusion.group_occluders`); the collate then rasterises
  its own region minus the union of its occluders on the stride grid, exactly;
* an instance left with less than ``min_area_ratio`` of its pixels, or with a visible box below
  ``min_box_size``, is dropped (reason ``occluded``); the others get the box of the pixels that
  stay visible (within their polygon's box).

Pasted copies keep the source's labels and annotation ids, so every target stays traceable.
"""

from __future__ import annotations

import cv2
import numpy as np

from seg_datamodule.ops.occlusion import group_occluders
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Instances, Polygons, Sample

__all__ = ["flipped_source", "paste_instances", "paste_mask", "select_for_paste"]


def paste_mask(polygons: Polygons, canvas_size: tuple[int, int]) -> np.ndarray:
    """The pixels whose centres the union of ``polygons`` covers.

    Args:
        polygons (Polygons): the pasted instances, in canvas pixels.
        canvas_size (tuple[int, int]): ``(H, W)``.

    Returns:
        ndarray[H, W] bool.
    """
    union = (polygons.vertices, polygons.ring_offsets, np.array([0, polygons.num_rings], np.int64))
    return rasterize_flat(*union, canvas_size, 1)[0]


def flipped_source(sample: Sample) -> Sample:
    """The sample mirrored left-right (pixels, polygons, boxes and crowd), the ``flip`` mode's source.

    Only the fields copy-paste reads are mirrored; the result is a new sample.
    """
    width = sample.canvas_size[1]
    instances = sample.instances.with_columns(occluders=None, origins=None).flip_lr(width)
    return sample.with_instances(instances, image=cv2.flip(sample.image, 1), crowd_mask=None)


def select_for_paste(rng: np.random.Generator, num_instances: int) -> np.ndarray:
    """Which of a source's instances to paste: a uniform subset size in ``1..N``, then a uniform subset.

    Args:
        rng (numpy.random.Generator): the target sample's generator.
        num_instances (int): N, the source's instances.

    Returns:
        ndarray[N] bool (all False when N = 0; then nothing is drawn).
    """
    keep = np.zeros(num_instances, bool)
    if num_instances:
        k = int(rng.integers(1, num_instances + 1))
        keep[rng.choice(num_instances, size=k, replace=False)] = True
    return keep


def _zip_instances(a: Polygons, b: Polygons) -> Polygons:
    """Per instance ``n``, the rings of ``a``'s instance ``n`` then those of ``b``'s (same N)."""
    parts = []
    for n in range(len(a)):
        for p in (a, b):
            rings = p.instance(n)
            parts.append(Polygons.from_instances([rings]) if rings else
                         Polygons(np.zeros((0, 2)), np.zeros(1, np.int64), np.zeros(2, np.int64)))
    merged = Polygons.concat(parts)
    # Every other boundary joins a's part and b's part of one instance.
    return Polygons(merged.vertices, merged.ring_offsets, merged.instance_offsets[::2].copy())


def _visible(
    own: np.ndarray, covered: np.ndarray, box: np.ndarray, min_area_ratio: float, min_box_size: float
) -> tuple[bool, np.ndarray]:
    """Whether an instance stays visible enough, and the box of its visible pixels.

    Args:
        own, covered (ndarray[H, W] bool): its pixels and those its occluders cover (stride 1).
        box (ndarray[4]): its box before the paste.

    Returns:
        (kept, new box).
    """
    h, w = own.shape
    x0, y0 = max(int(np.floor(box[0])) - 1, 0), max(int(np.floor(box[1])) - 1, 0)
    x1, y1 = min(int(np.ceil(box[2])) + 1, w), min(int(np.ceil(box[3])) + 1, h)
    mine = own[y0:y1, x0:x1]
    before = int(np.count_nonzero(mine))
    if before == 0:  # no pixel centre inside (a sliver): nothing a paste can take away
        return True, box
    vis = mine & ~covered[y0:y1, x0:x1]
    after = int(np.count_nonzero(vis))
    if after == before:  # nothing covered: the polygon's own box stays
        return True, box
    if after == 0 or after < min_area_ratio * before:
        return False, box
    rows, cols = np.flatnonzero(vis.any(axis=1)), np.flatnonzero(vis.any(axis=0))
    new = np.array([
        max(box[0], x0 + cols[0]), max(box[1], y0 + rows[0]),
        min(box[2], x0 + cols[-1] + 1), min(box[3], y0 + rows[-1] + 1),
    ], np.float64)
    if (new[2:] - new[:2] < min_box_size).any():
        return False, box
    return True, new


def paste_instances(
    target: Sample,
    source: Sample,
    pick: np.ndarray,
    *,
    min_area_ratio: float,
    min_box_size: float,
) -> tuple[Sample, int]:
    """Paste ``source``'s picked instances (pixels and targets) onto ``target``, occluding exactly.

    Args:
        target (Sample): the sample pasted onto (left unchanged; its arrays may be shared).
        source (Sample): a canvas of the same size whose instances are pasted where they are.
        pick (ndarray[N_src] bool): which of ``source``'s instances to paste.
        min_area_ratio (float): drop a covered instance keeping fewer than this fraction of its
            pixels (pixel centres, before and after the paste).
        min_box_size (float): drop a covered instance whose visible box is narrower or lower.

    Returns:
        sample (Sample): a new sample: the target's surviving instances (with occluders and
            visible boxes), then the pasted copies (``origins`` 1).
        occluded (int): how many of the target's instances were dropped as occluded.

    Raises:
        ValueError: the canvases differ in size, or ``pick`` has the wrong length.
    """
    if source.canvas_size != target.canvas_size:
        raise ValueError(f"image id {source.image_id}: canvas {source.canvas_size} differs from the "
                         f"target's {target.canvas_size}")
    pick = np.asarray(pick, bool)
    if pick.shape != (source.num_instances,):
        raise ValueError(f"pick must be ({source.num_instances},) bool, got {pick.shape}")
    canvas = target.canvas_size
    pasted = source.polygons.select(pick)
    pasted_boxes = (source.polygons.boxes() if source.boxes is None else source.boxes)[pick].astype(np.float64)
    n = target.num_instances
    boxes = (target.polygons.boxes() if target.boxes is None else target.boxes).astype(np.float64)

    # 1. Pixels: exactly the pixel centres the pasted polygons cover; crowd there is covered.
    mask = paste_mask(pasted, canvas)
    # cv2.copyTo: a masked copy about 20x faster than np.copyto(where=) broadcast over channels.
    image = cv2.copyTo(source.image, mask.view(np.uint8), target.image.copy())
    crowd = None if target.crowd_mask is None else target.crowd_mask & ~mask

    # 2. Occluders: the pasted rings each target instance's box meets, added to what it had.
    grouped_arrays, touched = group_occluders(boxes, pasted.arrays, pasted_boxes)
    grouped = Polygons(*grouped_arrays)
    occluders = grouped if target.occluders is None else _zip_instances(target.occluders, grouped)

    # 3. What stays visible of each touched instance, on the pixel grid.
    keep = np.ones(n, bool)
    if touched.any():
        idx = np.flatnonzero(touched)
        own = rasterize_flat(*target.polygons.select(touched).arrays, canvas, 1)
        covered = rasterize_flat(*occluders.select(touched).arrays, canvas, 1)
        for k, i in enumerate(idx):
            keep[i], boxes[i] = _visible(own[k], covered[k], boxes[i], min_area_ratio, min_box_size)

    # 4. The survivors, then the pasted copies (above everything, so nothing occludes them).
    survivors = target.instances.with_columns(boxes=boxes, occluders=occluders).select(keep)
    copies = source.instances.select(pick).with_columns(boxes=pasted_boxes, occluders=None,
                                                        origins=np.ones(int(pick.sum()), np.uint8))
    sample = target.with_instances(
        Instances.concat([survivors, copies]),
        image=image,
        crowd_mask=crowd,
        # A pasted category is on the canvas now: no longer "verified absent" (LVIS neg_category_ids).
        neg_labels=None if target.neg_labels is None else np.setdiff1d(target.neg_labels, copies.labels),
    )
    return sample, int(n - keep.sum())
