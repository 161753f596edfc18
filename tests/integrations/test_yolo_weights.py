"""YOLOSegModule starts from an Ultralytics checkpoint's weights, read without running the file.

The checkpoints are written here by Ultralytics' own ``Model.save`` (nothing is downloaded), and
what the module loads is compared with what Ultralytics' own loader (``torch_safe_load``, a real
unpickle of the file this test wrote) and its ``intersect_dicts`` transfer give.
"""

from __future__ import annotations

import copy
import logging
import pathlib

import pytest
import torch

from seg_datamodule.errors import UserInputError
from seg_datamodule.integrations import YOLOSegModule
from seg_datamodule.integrations._weights import WeightsFileError

pytestmark = pytest.mark.needs("ultralytics")


def _torch_safe_load(path: str):
    """Ultralytics' own checkpoint loader (imported here: the module collects without the extra)."""
    from ultralytics.nn.tasks import torch_safe_load

    return torch_safe_load(path)


@pytest.fixture(scope="module")
def coco_checkpoint(tmp_path_factory) -> pathlib.Path:
    """An 80-class YOLO11n-seg checkpoint as Ultralytics writes one (``yolo11n-seg.pt``'s layout)."""
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("yolo") / "yolo11n-seg.pt"
    from ultralytics import YOLO

    YOLO("yolo11n-seg.yaml").save(str(path))
    return path


def _reference_state(path: pathlib.Path) -> dict[str, torch.Tensor]:
    ckpt = _torch_safe_load(str(path))[0]  # Ultralytics' loader (it unpickles: this test wrote the file)
    return (ckpt.get("ema") or ckpt["model"]).float().state_dict()


class _Evil:
    """Unpickling this writes a file: what a malicious checkpoint would do."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (self.marker, "this ran")


def test_an_ultralytics_checkpoint_loads_as_ultralytics_loads_it(coco_checkpoint, caplog) -> None:
    reference = _reference_state(coco_checkpoint)
    module = YOLOSegModule(num_classes=80, weights=str(coco_checkpoint))
    state = module.model.state_dict()
    assert list(state) == list(reference)
    for name, value in reference.items():
        assert torch.equal(state[name], value), name
    assert module.pretrained.skipped == () and len(module.pretrained.loaded) == len(state)
    # Another class count: Ultralytics' transfer keeps every tensor of the same shape; the class
    # branch (its width follows the class count) keeps this model's initialisation and is named.
    with caplog.at_level(logging.INFO):
        module = YOLOSegModule(num_classes=4, weights=str(coco_checkpoint))
    state = module.model.state_dict()
    from ultralytics.utils.torch_utils import intersect_dicts

    kept = intersect_dicts(reference, state)
    assert set(module.pretrained.loaded) == set(kept) and len(kept) > 0.9 * len(state)
    assert all(torch.equal(state[name], value) for name, value in kept.items())
    skipped = [name for name, _, _ in module.pretrained.skipped]
    assert skipped and all(name.startswith("model.23.cv3.") for name in skipped)
    assert skipped == [name for name in state if name not in kept]
    logged = caplog.text
    assert f"fills {len(kept)} of the model's {len(state)} tensors" in logged and "all under model.23.cv3" in logged
    assert "80 classes" in logged


def test_a_runs_checkpoint_gives_its_ema(coco_checkpoint, tmp_path) -> None:
    model = _torch_safe_load(str(coco_checkpoint))[0]["model"].float()
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(1.0)
    path = tmp_path / "last.pt"  # a run's last.pt: "model" and "ema" (Ultralytics prefers the EMA)
    torch.save({"epoch": 3, "model": model.half(), "ema": ema.half(), "updates": 10, "train_args": {"imgsz": 640}},
               path)
    state = YOLOSegModule(num_classes=80, weights=str(path)).model.state_dict()
    for name, value in _reference_state(path).items():
        assert torch.equal(state[name], value), name
    assert torch.equal(state["model.0.conv.weight"], ema.float().state_dict()["model.0.conv.weight"])


def test_nothing_in_a_checkpoint_is_run(coco_checkpoint, tmp_path) -> None:
    marker = tmp_path / "ran.txt"
    ckpt = _torch_safe_load(str(coco_checkpoint))[0]
    evil_extra = tmp_path / "evil_extra.pt"
    torch.save({**ckpt, "train_args": _Evil(marker)}, evil_extra)
    module = YOLOSegModule(num_classes=80, weights=str(evil_extra))  # the model loads; the rest is inert
    assert len(module.pretrained.loaded) == len(module.model.state_dict())
    evil_model = tmp_path / "evil_model.pt"
    torch.save({"model": _Evil(marker), "ema": None}, evil_model)
    with pytest.raises(WeightsFileError, match="the model is not a module of a model"):
        YOLOSegModule(num_classes=80, weights=str(evil_model))
    assert not marker.exists()
    torch.load(evil_model, weights_only=False)  # a plain unpickle would have run it
    assert marker.read_text() == "this ran"


def test_files_that_do_not_fit(coco_checkpoint, tmp_path) -> None:
    with pytest.raises(WeightsFileError, match="does not exist"):
        YOLOSegModule(num_classes=4, weights=str(tmp_path / "missing.pt"))
    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(WeightsFileError, match="is not a readable torch checkpoint"):
        YOLOSegModule(num_classes=4, weights=str(tmp_path / "text.pt"))
    # Another architecture: a YOLOv8 checkpoint fills too little of YOLO11 to be a head to re-learn.
    other = tmp_path / "yolov8n-seg.pt"
    from ultralytics import YOLO

    YOLO("yolov8n-seg.yaml").save(str(other))
    with pytest.raises(UserInputError, match=r"fills \d+ of the model's \d+ tensors.*another shape.*architecture"):
        YOLOSegModule(num_classes=80, weights=str(other))
    assert issubclass(WeightsFileError, ValueError)
