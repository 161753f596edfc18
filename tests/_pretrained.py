"""The pretrained weights a config names, written for a test run: the real files' layout, random values.

``configs/yolo11n_seg.yaml`` starts from Ultralytics' ``yolo11n-seg.pt`` and ``configs/maskrcnn.yaml``
from torchvision's ImageNet ResNet-50. Tests have no network, so :func:`write_pretrained_weights`
writes a stand-in for each: an Ultralytics checkpoint of the config's model by Ultralytics' own
``Model.save`` (80 classes, as a released one), and a torchvision state dict of the enum's
architecture under the enum's file name in ``$TORCH_HOME/hub/checkpoints``, where ``torch.hub``
finds a file it downloaded before.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import yaml

__all__ = ["write_pretrained_weights"]


def _torchvision_state(enum: object) -> dict[str, torch.Tensor]:
    """A state dict of the model torchvision builds for weights ``enum`` (random values)."""
    import inspect

    from torchvision.models import get_model_builder, get_model_weights, list_models

    builder = get_model_builder(next(m for m in list_models() if get_model_weights(m) is type(enum)))
    kwargs = {"weights_backbone": None} if "weights_backbone" in inspect.signature(builder).parameters else {}
    return builder(weights=None, **kwargs).state_dict()


def write_pretrained_weights(configs: list[Path], folder: Path, torch_home: Path) -> None:
    """Write the weights ``configs`` name (those not written yet) for runs in ``folder``.

    Args:
        configs: config files; their ``model.init_args`` ``weights`` / ``weights_backbone`` are read.
        folder: where a run starts (a relative ``.pt`` path is resolved from it).
        torch_home: the ``$TORCH_HOME`` of the runs.
    """
    for config in configs:
        init = ((yaml.safe_load(config.read_text()) or {}).get("model") or {}).get("init_args") or {}
        for name in (init.get("weights"), init.get("weights_backbone")):
            if not isinstance(name, str):
                continue
            if name.endswith(".pt") and not (folder / name).exists():
                from seg_datamodule.integrations.ultralytics import import_ultralytics

                try:
                    ultralytics = import_ultralytics()
                except ImportError:  # without the extra, the runs of that config fail on their own
                    continue
                ultralytics.YOLO(init.get("model", "yolo11n-seg.yaml")).save(str(folder / name))
            elif "_Weights." in name:
                from torchvision.models import get_weight

                enum = get_weight(name)
                path = torch_home / "hub" / "checkpoints" / os.path.basename(enum.url)
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(_torchvision_state(enum), path)
