"""The demo model's network: backbone, ProtoNet and the per-instance head, as a plain ``nn.Module``.

:class:`YolactNet` is what :class:`~seg_datamodule.demo.model.YolactLite` computes, without
Lightning: images and boxes in, :class:`YolactOutput` out. ``YolactLite`` subclasses it, so the
layers keep their names in the LightningModule's ``state_dict`` (``stem.0.weight``, ...). The
mask path itself (assemble, crop, loss) is pure functions in :mod:`~seg_datamodule.demo.losses`.

Data path::

    images (B,3,H,W) uint8 -> normalise -> backbone -> p8 (B,4w,H/8,W/8) --roi_align at boxes--> head
                                                 \\-> ProtoNet -> protos (B,k,Hp,Wp), Hp = ceil(H/s)
    mask_logits[n] = coefficients[n] @ protos[image of n]                          (N, Hp, Wp)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import roi_align

from seg_datamodule.demo.losses import assemble_masks

__all__ = ["YolactNet", "YolactOutput"]

# ImageNet statistics in uint8 units; any fixed statistics would do for a model trained from scratch.
_MEAN = (123.675, 116.28, 103.53)
_STD = (58.395, 57.12, 57.375)
_FEATURE_STRIDE = 8  # the stride the coefficients are pooled from
_POOL = 7  # roi_align output side


class YolactOutput(NamedTuple):
    """What :meth:`YolactNet.forward` (and so ``YolactLite.forward``) returns.

    Attributes:
        protos (Tensor[B, k, Hp, Wp] float): prototype maps on the mask grid.
        coefficients (Tensor[N, k] float): per-instance coefficients in ``[-1, 1]``.
        class_logits (Tensor[N, C] float): per-instance class logits.
        mask_logits (Tensor[N, Hp, Wp] float): per-instance mask logits (not cropped).
    """

    protos: Tensor
    coefficients: Tensor
    class_logits: Tensor
    mask_logits: Tensor


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class YolactNet(nn.Module):
    """Backbone, ProtoNet and a per-instance head pooled at given boxes.

    Does not check its arguments: :class:`~seg_datamodule.demo.model.YolactLite`, the entry point
    users build, checks them first (with :mod:`~seg_datamodule.ops.checks`).

    Args:
        num_classes (int): C, the number of contiguous class indices.
        num_prototypes (int): k, prototype maps per image.
        width (int): channels of the first stage; later stages use 2x, 4x and 8x.
        mask_stride (int): stride of the prototype grid.
    """

    def __init__(self, num_classes: int, num_prototypes: int, width: int, mask_stride: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.num_prototypes = num_prototypes
        self.mask_stride = mask_stride
        self.register_buffer("pixel_mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)

        w = width
        # Backbone: strided 3x3 blocks, /2 /4 /8 /16; the /16 stage adds context to /8.
        self.stem = _conv(3, w, 2)
        self.stage4 = nn.Sequential(_conv(w, 2 * w, 2), _conv(2 * w, 2 * w))
        self.stage8 = nn.Sequential(_conv(2 * w, 4 * w, 2), _conv(4 * w, 4 * w))
        self.stage16 = nn.Sequential(_conv(4 * w, 8 * w, 2), _conv(8 * w, 8 * w))
        self.top_down = nn.Conv2d(8 * w, 4 * w, 1)
        self.p8 = _conv(4 * w, 4 * w)
        # ProtoNet: /8 -> upsample to the mask grid, plus a /4 skip for sharp edges.
        self.proto_in = _conv(4 * w, 2 * w)
        self.proto_skip = nn.Conv2d(2 * w, 2 * w, 1)
        self.proto_out = nn.Sequential(_conv(2 * w, 2 * w), nn.Conv2d(2 * w, num_prototypes, 1), nn.ReLU())
        # Per-instance head on roi-aligned /8 features: no batch norm, so one instance works.
        self.roi_conv = nn.Sequential(nn.Conv2d(4 * w, 2 * w, 3, padding=1), nn.ReLU(inplace=True))
        self.roi_fc = nn.Sequential(nn.Flatten(), nn.Linear(2 * w * _POOL * _POOL, 8 * w), nn.ReLU(inplace=True))
        self.coefficient_head = nn.Linear(8 * w, num_prototypes)
        self.class_head = nn.Linear(8 * w, num_classes)

    def features(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Backbone and ProtoNet.

        Args:
            images (Tensor[B, 3, H, W] uint8): RGB images.

        Returns:
            p8 (Tensor[B, 4w, ceil(H/8), ceil(W/8)] float) and
            protos (Tensor[B, k, ceil(H/s), ceil(W/s)] float), s = ``mask_stride``.
        """
        height, width = images.shape[-2:]
        x = (images.float() - self.pixel_mean) / self.pixel_std
        c4 = self.stage4(self.stem(x))
        c8 = self.stage8(c4)
        c16 = self.stage16(c8)
        p8 = self.p8(c8 + F.interpolate(self.top_down(c16), size=c8.shape[-2:], mode="nearest"))
        grid = (-(-height // self.mask_stride), -(-width // self.mask_stride))
        proto = F.interpolate(self.proto_in(p8), size=grid, mode="bilinear", align_corners=False)
        skip = self.proto_skip(c4)
        if skip.shape[-2:] != grid:
            skip = F.interpolate(skip, size=grid, mode="bilinear", align_corners=False)
        protos = self.proto_out(proto + skip)
        return p8, protos

    def forward(self, images: Tensor, boxes: Tensor, boxes_per_image: Tensor) -> YolactOutput:
        """Prototypes, and coefficients, class logits and mask logits at the given boxes.

        Args:
            images (Tensor[B, 3, H, W] uint8): RGB images.
            boxes (Tensor[N, 4] float32): xyxy boxes in canvas pixels, image after image.
            boxes_per_image (Tensor[B] int64): boxes per image; sums to N.

        Returns:
            :class:`YolactOutput`.
        """
        p8, protos = self.features(images)
        image_index = torch.repeat_interleave(
            torch.arange(images.shape[0], device=boxes.device), boxes_per_image.to(boxes.device)
        )
        # float32 whatever the autocast dtype: bf16 would move a box by up to 2 px at 640.
        rois = torch.cat([image_index[:, None].float(), boxes.float()], dim=1)
        pooled = roi_align(
            p8.float(), rois, output_size=_POOL, spatial_scale=1.0 / _FEATURE_STRIDE, sampling_ratio=2, aligned=True
        ).to(p8.dtype)
        hidden = self.roi_fc(self.roi_conv(pooled))
        coefficients = torch.tanh(self.coefficient_head(hidden))
        class_logits = self.class_head(hidden)
        mask_logits = assemble_masks(protos, coefficients, boxes_per_image)
        return YolactOutput(protos, coefficients, class_logits, mask_logits)
