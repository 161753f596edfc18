"""MaskRCNNModule starts from torchvision's own weights, as torchvision's builders do.

Nothing is downloaded: each test points ``$TORCH_HOME`` at a folder where it wrote, under
torchvision's own file name, a state dict of the right architecture (random values); torchvision
finds it there as it finds a file it downloaded before. The reference is torchvision itself: its
builder (``maskrcnn_resnet50_fpn(weights=...)``, ``resnet_fpn_backbone(weights=...)``) reading
the same file must build the same model with the same tensors.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
import torch
from torchvision.models import ResNet18_Weights, resnet18
from torchvision.models.detection import (
    MaskRCNN_ResNet50_FPN_V2_Weights, MaskRCNN_ResNet50_FPN_Weights, maskrcnn_resnet50_fpn, maskrcnn_resnet50_fpn_v2,
)
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops import FrozenBatchNorm2d

from seg_datamodule.integrations import MaskRCNNModule
from seg_datamodule.integrations._weights import WeightsFileError

SIZE = dict(min_size=128, max_size=128)
PREDICTORS = {"roi_heads.box_predictor.cls_score.weight", "roi_heads.box_predictor.cls_score.bias",
              "roi_heads.box_predictor.bbox_pred.weight", "roi_heads.box_predictor.bbox_pred.bias",
              "roi_heads.mask_predictor.mask_fcn_logits.weight", "roi_heads.mask_predictor.mask_fcn_logits.bias"}


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> pathlib.Path:
    """An empty ``$TORCH_HOME``: torchvision's weights are found only where a test puts them."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    (tmp_path / "torch_home" / "hub" / "checkpoints").mkdir(parents=True)
    return tmp_path / "torch_home"


def _cache(torch_home: pathlib.Path, enum, state: dict) -> pathlib.Path:
    """Put ``state`` where torch.hub looks for ``enum``'s file (as if downloaded before)."""
    path = torch_home / "hub" / "checkpoints" / os.path.basename(enum.url)
    torch.save(state, path)
    return path


def _assert_same_model(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    assert [(n, type(m).__name__) for n, m in ours.named_modules()] == \
        [(n, type(m).__name__) for n, m in theirs.named_modules()]
    assert [(n, p.requires_grad) for n, p in ours.named_parameters()] == \
        [(n, p.requires_grad) for n, p in theirs.named_parameters()]
    assert [m.eps for m in ours.modules() if isinstance(m, FrozenBatchNorm2d)] == \
        [m.eps for m in theirs.modules() if isinstance(m, FrozenBatchNorm2d)]
    theirs_state = theirs.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs_state[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("enum, builder", [(MaskRCNN_ResNet50_FPN_Weights.COCO_V1, maskrcnn_resnet50_fpn),
                                           (MaskRCNN_ResNet50_FPN_V2_Weights.COCO_V1, maskrcnn_resnet50_fpn_v2)],
                         ids=["v1", "v2"])
def test_coco_weights_build_torchvisions_model(torch_home, enum, builder) -> None:
    torch.manual_seed(0)
    state = builder(weights=None, weights_backbone=None, num_classes=91).state_dict()
    if builder is maskrcnn_resnet50_fpn:  # torchvision's v1 file has frozen norms: no num_batches_tracked
        state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    _cache(torch_home, enum, state)
    name = f"{type(enum).__name__}.DEFAULT"
    # COCO's 90 classes: exactly torchvision's pretrained model (architecture, frozen stages, eps, tensors).
    ours = MaskRCNNModule(num_classes=90, weights=name, **SIZE)
    theirs = builder(weights=enum, **SIZE)
    _assert_same_model(ours.model, theirs)
    ours.model.eval(), theirs.eval()
    image = [torch.rand(3, 128, 128)]
    with torch.no_grad():
        for a, b in zip(ours.model(image), theirs(image)):
            for key in b:
                torch.testing.assert_close(a[key], b[key], msg=key)
    # Another class count: COCO's predictors start afresh (and are named); everything else is COCO's.
    module = MaskRCNNModule(num_classes=4, weights=name, **SIZE)
    assert {n for n, _, _ in module.pretrained.skipped} == PREDICTORS
    assert module.pretrained.missing == () and module.pretrained.unexpected == ()
    model_state = module.model.state_dict()
    for key in module.pretrained.loaded:
        assert torch.equal(model_state[key], state[key]), key
    assert module.model.roi_heads.box_predictor.cls_score.out_features == 5


@pytest.mark.slow
def test_an_imagenet_backbone_as_torchvision_loads_it(torch_home, tmp_path) -> None:
    torch.manual_seed(0)
    state = resnet18().state_dict()
    _cache(torch_home, ResNet18_Weights.IMAGENET1K_V1, state)
    module = MaskRCNNModule(num_classes=4, backbone="resnet18", weights_backbone="ResNet18_Weights.IMAGENET1K_V1",
                            **SIZE)
    theirs = resnet_fpn_backbone(backbone_name="resnet18", weights=ResNet18_Weights.IMAGENET1K_V1, trainable_layers=3)
    _assert_same_model(module.model.backbone.body, theirs.body)
    assert module.pretrained.unexpected == ("fc.weight", "fc.bias") and module.pretrained.skipped == ()
    assert not module.model.backbone.body.conv1.weight.requires_grad  # stages conv1 and layer1 frozen, as torchvision
    assert module.model.backbone.body.layer2[0].conv1.weight.requires_grad
    # weights_file: a state_dict of the whole model, read instead of any download (the cache is emptied).
    path = tmp_path / "mine.pt"
    torch.save(module.model.state_dict(), path)
    for cached in (torch_home / "hub" / "checkpoints").iterdir():
        cached.unlink()
    again = MaskRCNNModule(num_classes=4, backbone="resnet18", weights_backbone="ResNet18_Weights.IMAGENET1K_V1",
                           weights_file=str(path), **SIZE)
    _assert_same_model(again.model, module.model)
    scratch = MaskRCNNModule(num_classes=4, backbone="resnet18", **SIZE)  # its own architecture, its own file
    torch.save(scratch.model.state_dict(), path)
    loaded = MaskRCNNModule(num_classes=4, backbone="resnet18", weights_file=str(path), **SIZE)
    _assert_same_model(loaded.model, scratch.model)


class _Evil:
    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (self.marker, "this ran")


def test_bad_weights_files_and_failed_downloads(torch_home, tmp_path) -> None:
    marker = tmp_path / "ran.txt"
    torch.save({"model": _Evil(marker)}, tmp_path / "evil.pt")
    with pytest.raises(WeightsFileError, match="weights_file .*evil.pt' is not a plain state_dict"):
        MaskRCNNModule(num_classes=4, backbone="resnet18", weights_file=str(tmp_path / "evil.pt"))
    assert not marker.exists()
    with pytest.raises(WeightsFileError, match="weights_file .*missing.pt' does not exist"):
        MaskRCNNModule(num_classes=4, backbone="resnet18", weights_file=str(tmp_path / "missing.pt"))
    # Not cached and no network here: the error says where torchvision's file goes.
    expected = torch_home / "hub" / "checkpoints" / "maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"
    with pytest.raises(WeightsFileError, match=f"could not get torchvision's MaskRCNN_ResNet50_FPN_Weights.COCO_V1.*"
                                               f"{re.escape(str(expected))}.*weights_file"):
        MaskRCNNModule(num_classes=4, weights="MaskRCNN_ResNet50_FPN_Weights.COCO_V1")


@pytest.mark.parametrize("kwargs, match", [
    ({"weights": "MaskRCNN_ResNet50_FPN_Weights.COCO_V9"}, "weights must name torchvision weights"),
    ({"weights": "NoSuch_Weights.DEFAULT"}, "weights must name torchvision weights"),
    ({"weights": "ResNet50_Weights.IMAGENET1K_V1"}, "weights must be one of torchvision's Mask R-CNN weights"),
    ({"weights_backbone": "ResNet50_Weights.IMAGENET1K_V1"}, "is not for backbone 'resnet18'"),
    ({"weights": "MaskRCNN_ResNet50_FPN_Weights.DEFAULT"}, "is for backbone 'resnet50'"),
    ({"backbone": "resnet50", "weights": "MaskRCNN_ResNet50_FPN_Weights.DEFAULT",
      "weights_backbone": "ResNet50_Weights.DEFAULT"}, "not both"),
    ({"weights_backbone": "ResNet18_Weights.DEFAULT", "trainable_backbone_layers": 6}, r"in \[0, 5\]"),
    ({"trainable_backbone_layers": 3}, "needs torchvision's weights"),
    ({"mask_rcnn_kwargs": {"box_head": None}}, "mask_rcnn_kwargs must not set"),
])
def test_weight_arguments_are_checked_before_anything_is_read(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        MaskRCNNModule(num_classes=4, **{"backbone": "resnet18", **kwargs})
