"""MixUp (Zhang et al., 2018; Ultralytics' ``mixup``): blend two canvases and keep both sets of instances.

A pure function over two finished samples of the same canvas size. The ratio is drawn by the
caller from the sample's own generator (``r ~ Beta(32, 32)``, Ultralytics' choice, so blends stay
near half and half). Nothing occludes anything: both images show through everywhere.
"""

from __future__ import annotations

import cv2
import numpy as np

from seg_datamodule.structures import Instances, Sample

__all__ = ["MIXUP_BETA", "mixup_samples"]

#: Both parameters of the Beta distribution the MixUp ratio is drawn from (Ultralytics uses 32, 32).
MIXUP_BETA = 32.0


def mixup_samples(sample: Sample, partner: Sample, ratio: float) -> Sample:
    """``ratio * sample + (1 - ratio) * partner``, with the instances of both.

    Args:
        sample (Sample): the sample mixed into (left unchanged).
        partner (Sample): another sample on a canvas of the same size.
        ratio (float): weight of ``sample``'s pixels, in ``[0, 1]``.

    Returns:
        Sample: a new sample: ``sample``'s instances (with their occluders and origins), then
        ``partner``'s (``origins`` 2); crowd regions are the union of both.

    Raises:
        ValueError: the canvases differ in size or ``ratio`` is outside ``[0, 1]``.
    """
    if partner.canvas_size != sample.canvas_size:
        raise ValueError(f"image id {partner.image_id}: canvas {partner.canvas_size} differs from "
                         f"image id {sample.image_id}'s {sample.canvas_size}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")
    # One rounded uint8 pass (OpenCV saturates), about 10x cheaper than blending in float.
    image = cv2.addWeighted(sample.image, float(ratio), partner.image, 1.0 - float(ratio), 0.0)
    crowds = [c for c in (sample.crowd_mask, partner.crowd_mask) if c is not None]
    # The partner's instances follow the sample's, marked as mixed in; nothing occludes them.
    mixed_in = partner.instances.with_columns(occluders=None, origins=np.full(partner.num_instances, 2, np.uint8))
    return sample.with_instances(
        Instances.concat([sample.instances, mixed_in]),
        image=image,
        crowd_mask=(crowds[0] | crowds[1]) if len(crowds) == 2 else (crowds[0].copy() if crowds else None),
        # LVIS's lists of the blend: absent only where absent from both images, possibly
        # unlabelled where either says so (as for a mosaic's tiles).
        neg_labels=_both(sample.neg_labels, partner.neg_labels, np.intersect1d),
        not_exhaustive_labels=_both(sample.not_exhaustive_labels, partner.not_exhaustive_labels, np.union1d),
    )


def _both(a: np.ndarray | None, b: np.ndarray | None, combine) -> np.ndarray | None:  # noqa: ANN001
    """``combine(a, b)`` of two sorted label lists; ``None`` when either image has none."""
    return None if a is None or b is None else combine(a, b).astype(np.int64)
