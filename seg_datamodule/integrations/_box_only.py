"""The integrations' refusal of ``box_only: keep``: their losses cannot skip one target's mask.

Ultralytics' segmentation loss and torchvision's Mask R-CNN take a mask for every target, so a
box-only target (``DetectionBatch.has_mask`` False, an all-False mask row) would teach them an
empty mask. Rather than train on that, their ``setup`` refuses the DataModule's ``box_only: keep``
with one line naming the key and the fix.
"""

from __future__ import annotations

import lightning as L

from seg_datamodule.errors import UserInputError

__all__ = ["BoxOnlyUnsupportedError", "refuse_box_only"]


class BoxOnlyUnsupportedError(UserInputError, ValueError):
    """A model that needs a mask for every target was given box-only targets (``box_only: keep``)."""


def refuse_box_only(module: L.LightningModule, model: str) -> None:
    """Raise when the module's DataModule keeps box-only targets.

    Args:
        module: the LightningModule at ``setup`` (its trainer's DataModule, if any, is read).
        model: what the module trains, named in the message.

    Raises:
        BoxOnlyUnsupportedError: the DataModule's ``box_only`` is ``"keep"``.
    """
    trainer = getattr(module, "_trainer", None)
    options = getattr(getattr(trainer, "datamodule", None), "index_options", None)
    if getattr(options, "box_only", "drop") == "keep":
        raise BoxOnlyUnsupportedError(
            f"{model} takes a mask loss on every target and cannot skip box-only ones: the DataModule's "
            "box_only: keep is not supported here; set box_only: drop (--data.box_only drop), or train the "
            "demo model (YolactLite), which takes no mask loss where DetectionBatch.has_mask is False"
        )
