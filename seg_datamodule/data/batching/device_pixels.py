"""``pixels_on_device``: a batch's pending pixels made on its device, after the transfer.

The workers shipped each image of the batch once (JPEG bytes, or pixels for other formats) and
each sample's plan and flips (:class:`~seg_datamodule.structures.pending.PendingPixels`);
:func:`apply_pending_pixels` decodes them in one batched call, warps every tile of the batch in
one pass, and mirrors the flipped canvases. ``COCOSegDataModule.on_after_batch_transfer`` runs it
before the HSV jitter, which is the recipe's order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seg_datamodule.structures import EncodedImage, PendingPixels
from seg_datamodule.transforms.kernels.device_warp import decode_jpegs, flip_canvases, warp_tiles_device
from seg_datamodule.transforms.kernels.plan import TilePlan
from seg_datamodule.transforms.kernels.warp import FILL_VALUE

__all__ = ["apply_pending_pixels", "make_pixels"]


def make_pixels(pending: PendingPixels, device: torch.device | str) -> torch.Tensor:
    """The canvases the workers would have made, made on ``device``.

    Args:
        pending (PendingPixels): the batch's images, plans and flips.
        device (torch.device | str): where to decode and warp.

    Returns:
        Tensor[B, 3, H, W] uint8 on ``device`` (channels-last memory when the batch's collate was).

    Raises:
        RuntimeError: a JPEG does not decode (its header was sound); the message names the
            batch's image ids.
    """
    device = torch.device(device)
    jpegs = [k for k, source in enumerate(pending.sources) if isinstance(source, EncodedImage)]
    images: list[torch.Tensor | None] = [None] * len(pending.sources)
    try:
        encoded = [pending.sources[k] for k in jpegs]
        decoded = decode_jpegs([torch.from_numpy(e.data) for e in encoded], device,  # type: ignore[union-attr]
                               [e.orientation != 1 for e in encoded], [e.reduce for e in encoded])  # type: ignore[union-attr]
    except RuntimeError as err:
        raise RuntimeError(f"pixels_on_device: a JPEG of the batch of image ids {pending.image_ids.tolist()} "
                           f"does not decode on {device}: {err}") from err
    for k, image in zip(jpegs, decoded):
        images[k] = image
    for k, source in enumerate(pending.sources):
        if not isinstance(source, EncodedImage):  # decoded by the workers (not a JPEG)
            images[k] = torch.from_numpy(np.ascontiguousarray(source)).permute(2, 0, 1).to(device)
    plans = [TilePlan(m, r, pending.output_size, z) for m, r, z in zip(pending.matrices, pending.regions, pending.resize)]
    canvases = warp_tiles_device(images, plans, [list(row) for row in pending.tile_sources], FILL_VALUE, device,
                                 [list(row) for row in pending.tile_reduces])
    flips = torch.from_numpy(pending.flips)
    canvases = flip_canvases(flip_canvases(canvases, flips[:, 0], axis=0), flips[:, 1], axis=1)
    return canvases.contiguous(memory_format=torch.channels_last) if pending.channels_last else canvases


def apply_pending_pixels(batch: Any) -> Any:
    """Make a ``DetectionBatch``'s pending pixels on its device (:func:`make_pixels`) and clear them.

    Anything without pending pixels (validation batches, other types) passes unchanged.

    Args:
        batch: a ``DetectionBatch`` (or anything else), on its device.

    Returns:
        ``batch``, with ``images`` ``(B, 3, H, W)`` and ``pending_pixels`` set to ``None``.
    """
    pending = getattr(batch, "pending_pixels", None)
    if pending is not None:
        batch.images = make_pixels(pending, batch.masks.device)
        batch.pending_pixels = None  # made: a second call changes nothing
    return batch
