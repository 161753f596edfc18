"""The integrations' optimiser and schedule, and the COCO metric's class-count check."""

from __future__ import annotations

import math

import pytest
import torch

from seg_datamodule.integrations import MaskRCNNModule
from seg_datamodule.integrations._optim import configure_optimizer


def test_warmup_then_cosine_and_no_decay_on_norms_and_biases() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    out = configure_optimizer(model, "SGD", lr=0.1, momentum=0.9, weight_decay=1e-4, warmup_steps=4,
                              total_steps=14, cosine_schedule=True)
    optimizer, scheduler = out["optimizer"], out["lr_scheduler"]["scheduler"]
    decay, no_decay = optimizer.param_groups
    assert [p.ndim for p in decay["params"]] == [4] and decay["weight_decay"] == 1e-4
    assert sorted(p.ndim for p in no_decay["params"]) == [1, 1, 1] and no_decay["weight_decay"] == 0.0
    lrs = []
    for _ in range(14):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    want = [0.1 * (s + 1) / 5 for s in range(4)] + [0.05 * (1 + math.cos(math.pi * k / 10)) for k in range(10)]
    assert lrs == pytest.approx(want)
    # Unknown length: warmup, then constant; nothing to schedule: the bare optimiser.
    assert isinstance(configure_optimizer(model, "AdamW", 0.1, 0.9, 0.0, 0, math.inf, True), torch.optim.AdamW)


def test_the_coco_metric_needs_the_files_class_count(demo_dir) -> None:
    ann = str(demo_dir / "annotations" / "instances_val2017.json")
    module = MaskRCNNModule(num_classes=3, backbone="resnet18", coco_ann_file=ann)
    with pytest.raises(ValueError, match="has 4 categories but the model has num_classes=3"):
        module.setup("fit")
    module = MaskRCNNModule(num_classes=4, backbone="resnet18", coco_ann_file=ann)
    module.setup("fit")
    assert module.coco_metric is not None and module.coco_metric.ann_file == ann
