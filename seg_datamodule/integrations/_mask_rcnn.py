"""Mask R-CNN as torchvision builds it: from scratch, or for torchvision's own pretrained weights.

Four architectures, chosen by which weights the user names (:func:`resolve_weights`):

- **none** (from scratch): :func:`build_mask_rcnn`, every layer trainable, ``BatchNorm2d``
  in the backbone and in the mask head (see its docstring for why);
- **an ImageNet backbone** (``weights_backbone: ResNet50_Weights.IMAGENET1K_V1``, any ResNet):
  what ``maskrcnn_resnet50_fpn(weights_backbone=...)`` builds: ``FrozenBatchNorm2d`` in the
  backbone, its first ``5 - trainable_backbone_layers`` stages frozen, torchvision's plain heads;
- **COCO** ``MaskRCNN_ResNet50_FPN_Weights`` (37.9 box AP): that same architecture on
  ResNet-50, with the frozen norms' ``eps`` set to 0 for ``COCO_V1`` as torchvision does;
- **COCO** ``MaskRCNN_ResNet50_FPN_V2_Weights`` (47.4 box AP): ``maskrcnn_resnet50_fpn_v2``'s
  architecture (norms in the FPN and the heads, a two-conv RPN head).

The weights are downloaded the way torchvision downloads them (``torch.hub`` into
``$TORCH_HOME/hub/checkpoints``, the file's hash checked), but read with ``weights_only=True``;
a ``weights_file`` replaces the download (the enums then only pick the architecture). COCO's
predictors (91 classes) do not fit another ``num_classes`` and keep their initialisation:
``torchvision``'s fine-tuning recipe, logged by :func:`~seg_datamodule.integrations._weights.load_matching`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from seg_datamodule.integrations._weights import Transfer, WeightsFileError, load_matching, read_state_dict

__all__ = [
    "WeightsChoice", "build_mask_rcnn", "build_pretrained_mask_rcnn", "load_pretrained", "read_pretrained",
    "resolve_weights",
]

_COCO = {"MaskRCNN_ResNet50_FPN_Weights": "v1", "MaskRCNN_ResNet50_FPN_V2_Weights": "v2"}


@dataclass(frozen=True)
class WeightsChoice:
    """The weights a ``MaskRCNNModule`` starts from, checked (see :func:`resolve_weights`).

    Attributes:
        weights: a torchvision Mask R-CNN weights enum member, or ``None``.
        weights_backbone: a torchvision ResNet weights enum member, or ``None``.
        weights_file: a local state_dict file of the whole model, or ``None``.
        trainable_layers: backbone stages that train (5: all).
    """

    weights: Any
    weights_backbone: Any
    weights_file: str | None
    trainable_layers: int

    @property
    def architecture(self) -> str:
        """``"scratch"``, ``"v1"`` (ImageNet backbone or COCO v1) or ``"v2"``."""
        if self.weights is not None:
            return _COCO[type(self.weights).__name__]
        return "v1" if self.weights_backbone is not None else "scratch"


def _enum(argument: str, name: str) -> Any:
    from torchvision.models import get_weight

    try:
        return get_weight(name)
    except (ValueError, KeyError) as err:
        raise ValueError(f"{argument} must name torchvision weights such as 'ResNet50_Weights.IMAGENET1K_V1' "
                         f"or 'MaskRCNN_ResNet50_FPN_V2_Weights.DEFAULT', got {name!r}") from err


def resolve_weights(backbone: str, weights: str | None, weights_backbone: str | None, weights_file: str | None,
                    trainable_backbone_layers: int | None) -> WeightsChoice:
    """Check the weight arguments of ``MaskRCNNModule`` against each other and the backbone.

    Raises:
        ValueError: an unknown enum name, an enum of another kind or backbone, both ``weights``
            and ``weights_backbone``, or ``trainable_backbone_layers`` outside ``[0, 5]`` or
            without torchvision's weights.
    """
    from torchvision.models import get_model_weights

    model_enum = _enum("weights", weights) if weights is not None else None
    backbone_enum = _enum("weights_backbone", weights_backbone) if weights_backbone is not None else None
    if model_enum is not None and type(model_enum).__name__ not in _COCO:
        raise ValueError(f"weights must be one of torchvision's Mask R-CNN weights ({', '.join(_COCO)}), "
                         f"got {weights!r}")
    if model_enum is not None and backbone_enum is not None:
        raise ValueError("set weights or weights_backbone, not both: the Mask R-CNN weights include the backbone")
    if model_enum is not None and backbone != "resnet50":
        raise ValueError(f"{weights} is for backbone 'resnet50', got backbone={backbone!r}")
    if backbone_enum is not None and type(backbone_enum) is not get_model_weights(backbone):
        raise ValueError(f"weights_backbone {weights_backbone} is not for backbone {backbone!r} "
                         f"(its weights are {get_model_weights(backbone).__name__})")
    pretrained = model_enum is not None or backbone_enum is not None
    if trainable_backbone_layers is not None:
        if isinstance(trainable_backbone_layers, bool) or not isinstance(trainable_backbone_layers, int) \
                or not 0 <= trainable_backbone_layers <= 5:
            raise ValueError(f"trainable_backbone_layers must be an int in [0, 5], got {trainable_backbone_layers!r}")
        if not pretrained:
            raise ValueError("trainable_backbone_layers needs torchvision's weights (weights or weights_backbone): "
                             "a backbone from scratch trains every stage")
    if weights_file is not None and not isinstance(weights_file, str):
        raise ValueError(f"weights_file must be a path, got {weights_file!r}")
    layers = trainable_backbone_layers if trainable_backbone_layers is not None else 3 if pretrained else 5
    return WeightsChoice(model_enum, backbone_enum, weights_file, layers)


def _download(enum: Any) -> dict[str, Tensor]:
    """torchvision's file for ``enum`` from its cache (downloaded once), read with ``weights_only=True``."""
    try:
        return torch.hub.load_state_dict_from_url(enum.url, map_location="cpu", progress=True, check_hash=True,
                                                  weights_only=True)
    except Exception as err:  # no network, a wrong hash, a file that is not a plain state_dict
        where = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(enum.url))
        raise WeightsFileError(
            f"could not get torchvision's {type(enum).__name__}.{enum.name} ({enum.url}): {err}. Put that file "
            f"at {where} or pass it as weights_file"
        ) from err


def read_pretrained(choice: WeightsChoice) -> tuple[dict[str, Tensor], str, bool] | None:
    """The state the model starts from: ``(state, source, whole_model)``, or ``None`` from scratch.

    ``whole_model`` is ``False`` for backbone weights (a classification ResNet's state dict).
    """
    if choice.weights_file is not None:
        return read_state_dict(choice.weights_file, "weights_file"), choice.weights_file, True
    enum = choice.weights if choice.weights is not None else choice.weights_backbone
    if enum is None:
        return None
    return _download(enum), f"{type(enum).__name__}.{enum.name}", choice.weights is not None


def build_mask_rcnn(num_classes: int, backbone: str, min_size: int, max_size: int, **kwargs: Any) -> nn.Module:
    """A torchvision ``MaskRCNN`` with ``num_classes + 1`` outputs on a random-weight ResNet-FPN.

    Without pretrained weights every backbone stage trains and uses ``BatchNorm2d`` (frozen
    batch norm suits only pretrained statistics), as ``maskrcnn_resnet50_fpn(weights=None)`` does,
    and the mask head normalises each of its four convolutions with ``BatchNorm2d`` as
    ``maskrcnn_resnet50_fpn_v2`` does: without it a random backbone starts the mask logits near
    +-10 (mask loss ~6.5) and SGD diverges within a few steps.

    Args:
        num_classes: C, the classes without the background.
        backbone: a ``torchvision.models.detection.backbone_utils.resnet_fpn_backbone`` name
            (``"resnet18"``, ``"resnet50"``, ``"resnext50_32x4d"``, ...).
        min_size, max_size: torchvision's internal resize (``GeneralizedRCNNTransform``).
        **kwargs: further ``MaskRCNN`` arguments (``box_detections_per_img``, ...).
    """
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads

    body = resnet_fpn_backbone(backbone_name=backbone, weights=None, norm_layer=nn.BatchNorm2d, trainable_layers=5)
    mask_head = MaskRCNNHeads(body.out_channels, [256, 256, 256, 256], 1, norm_layer=nn.BatchNorm2d)
    return MaskRCNN(body, num_classes=num_classes + 1, min_size=min_size, max_size=max_size, mask_head=mask_head,
                    **kwargs)


def build_pretrained_mask_rcnn(num_classes: int, backbone: str, choice: WeightsChoice, **kwargs: Any) -> nn.Module:
    """The architecture torchvision builds for ``choice``'s weights (not loaded yet), ``num_classes + 1`` outputs.

    Args:
        num_classes: C, the classes without the background.
        backbone: the ResNet name (``"resnet50"`` for the COCO weights).
        choice: from :func:`resolve_weights`, with ``weights`` or ``weights_backbone`` set.
        **kwargs: further ``MaskRCNN`` arguments (``min_size``, ``max_size``, ...).
    """
    from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn_v2
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.ops import FrozenBatchNorm2d

    if choice.architecture == "v2":
        # torchvision's v2 builder without weights trains every stage; freeze as it does with weights.
        model = maskrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None, num_classes=num_classes + 1, **kwargs)
        trained = ["layer4", "layer3", "layer2", "layer1", "conv1"][:choice.trainable_layers]
        trained += ["bn1"] if choice.trainable_layers == 5 else []
        for name, parameter in model.backbone.body.named_parameters():
            if not name.startswith(tuple(trained)):
                parameter.requires_grad_(False)
        return model
    body = resnet_fpn_backbone(backbone_name=backbone, weights=None, norm_layer=FrozenBatchNorm2d,
                               trainable_layers=choice.trainable_layers)
    return MaskRCNN(body, num_classes=num_classes + 1, **kwargs)


def load_pretrained(model: nn.Module, choice: WeightsChoice, state: dict[str, Tensor], source: str,
                    whole_model: bool) -> Transfer:
    """Load :func:`read_pretrained`'s state into :func:`build_pretrained_mask_rcnn`'s (or the scratch) model."""
    from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights
    from torchvision.ops import FrozenBatchNorm2d

    target = model if whole_model else model.backbone.body  # a classification ResNet fills the FPN's body
    transfer = load_matching(target, state, source)
    if choice.weights is MaskRCNN_ResNet50_FPN_Weights.COCO_V1:  # trained before pytorch/vision#2933 fixed eps
        for module in model.modules():
            if isinstance(module, FrozenBatchNorm2d):
                module.eps = 0.0
    return transfer
