"""The model integrations refuse ``box_only: keep`` at setup (issue 41): their losses take a mask for
every target, so a box-only target would be trained as an empty mask."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.errors import UserInputError
from seg_datamodule.integrations import BoxOnlyUnsupportedError, MaskRCNNModule


def test_mask_rcnn_refuses_box_only_keep_in_one_line(coco_mini: Path) -> None:
    ann, images = coco_mini / "annotations" / "instances_val2017.json", coco_mini / "val2017"
    module = MaskRCNNModule(num_classes=80, backbone="resnet18")
    module.trainer = SimpleNamespace(datamodule=COCOSegDataModule(train_ann=str(ann), train_images=str(images),
                                                                  image_size=128, box_only="keep"))
    with pytest.raises(BoxOnlyUnsupportedError, match="box_only: keep is not supported") as raised:
        module.setup("fit")
    assert isinstance(raised.value, UserInputError) and isinstance(raised.value, ValueError)
    assert "\n" not in str(raised.value) and "--data.box_only drop" in str(raised.value)
    # The default is accepted.
    module.trainer = SimpleNamespace(datamodule=COCOSegDataModule(train_ann=str(ann), train_images=str(images),
                                                                  image_size=128))
    module.setup("predict")


@pytest.mark.needs("ultralytics")
def test_yolo_seg_refuses_box_only_keep() -> None:
    from seg_datamodule.integrations import YOLOSegModule

    module = YOLOSegModule(num_classes=2, model="yolo11n-seg.yaml", coco_eval=False)
    module.trainer = SimpleNamespace(datamodule=SimpleNamespace(index_options=SimpleNamespace(box_only="keep")))
    with pytest.raises(BoxOnlyUnsupportedError, match="YOLOSegModule"):
        module.setup("fit")
