"""Each stage builds only its own split; scoring nothing is an error (issue 35), on coco-mini and LVIS.

The references: coco-mini's own files (their image counts read from them, 80 categories), the LVIS API's
``lvis_val_100.json``, and the checkpoint state a DataModule saves.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import lightning as L
import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.splits.sources import CategoriesUnknownError, MissingSplitError
from seg_datamodule.data.splits.checks import CategoryMismatchError, EmptySplitError
from seg_datamodule.errors import UserInputError
from seg_datamodule.evaluation import NothingScoredError
from seg_datamodule.io.images.root import ImageRootError
from seg_datamodule.io.paths import InputPathError
from seg_datamodule.models import YolactLite


def _val(coco_mini: Path) -> tuple[str, str]:
    return str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")


def _trainer(**kwargs) -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, **kwargs)


def test_a_validate_only_datamodule_validates_without_training_data(coco_mini: Path, tmp_path: Path) -> None:
    ann, images = _val(coco_mini)
    dm = COCOSegDataModule(val_ann=ann, val_images=images, image_size=96, val_batch_size=8, num_workers=0,
                           cache_dir=str(tmp_path / "cache"), demo_dir=str(tmp_path / "demo"))
    assert dm.num_classes == 80 and dm.category_source == ann  # the split's own file
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    results = _trainer(limit_val_batches=2).validate(model, datamodule=dm, verbose=False)[0]
    assert 0.0 <= results["val/segm_AP"] <= 1.0
    assert dm.train_index is None and dm.train_dataset is None and not (tmp_path / "demo").exists()  # no demo data
    assert dm.evaluation_file("validate") == ann and dm.evaluation_file("predict") is None
    with pytest.raises(MissingSplitError, match="fit needs train_ann"):
        dm.setup("fit")
    with pytest.raises(MissingSplitError, match="test needs test_ann and test_images"):
        dm.setup("test")


def test_an_lvis_test_split_is_scored_with_lvis_ap(tmp_path: Path) -> None:
    from _lvis import load_json, write_images, write_v1

    ann = write_v1(tmp_path / "lvis_v1_val_100.json")
    write_images(load_json(ann), tmp_path / "coco", from_url=True)
    dm = COCOSegDataModule(test_ann=str(ann), test_images=str(tmp_path / "coco"), image_size=64, val_batch_size=25,
                           num_workers=0, cache_dir=str(tmp_path / "cache"))
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    results = _trainer().test(model, datamodule=dm, verbose=False)[0]
    assert {"test/segm_AP", "test/segm_APr", "test/segm_APc", "test/bbox_APf"} <= set(results)
    assert type(model.test_metric).__name__ == "LVISMaskMAP"


def test_categories_come_from_the_checkpoint_for_a_folder_and_must_agree_with_files(
    coco_mini: Path, tmp_path: Path
) -> None:
    ann, images = _val(coco_mini)
    with_file = COCOSegDataModule(val_ann=ann, val_images=images, num_workers=0, cache_dir=str(tmp_path / "cache"))
    state = with_file.state_dict()
    assert state["categories"]["ids"] == with_file.category_ids and len(state["categories"]["names"]) == 80

    folder = COCOSegDataModule(predict_images=images, num_workers=0, cache_dir=str(tmp_path / "cache"))
    assert folder.category_source is None and folder.state_dict() == {}
    with pytest.raises(CategoriesUnknownError, match="no split names the categories .* restore a checkpoint"):
        folder.num_classes  # noqa: B018
    folder.setup("predict")  # a folder needs no categories to be read
    folder.load_state_dict(state)  # what Lightning does after setup when a checkpoint is restored
    assert folder.category_ids == with_file.category_ids and folder.class_names == with_file.class_names
    assert folder.category_source == "the checkpoint restored"

    other = dict(state, categories={"ids": state["categories"]["ids"][1:], "names": state["categories"]["names"][1:]})
    with pytest.raises(CategoryMismatchError, match=r"instances_val2017\.json: category ids .* differ from those the "
                                                    r"checkpoint was trained on"):
        with_file.load_state_dict(other)
    assert issubclass(CategoryMismatchError, UserInputError) and issubclass(CategoryMismatchError, ValueError)
    with_file.load_state_dict({})  # a checkpoint saved before categories were kept: the file's stand
    assert with_file.num_classes == 80


def test_a_missing_empty_or_wrong_image_folder_stops_at_setup(coco_mini: Path, tmp_path: Path) -> None:
    ann, _ = _val(coco_mini)
    n = len(json.loads(Path(ann).read_text())["images"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputPathError, match=f"val_images: expected an existing folder, got '{tmp_path / 'missing'}'"):
        COCOSegDataModule(val_ann=ann, val_images=str(tmp_path / "missing"))  # in __init__, before a model
    cases = [(tmp_path / "empty", "is empty"),
             (coco_mini / "train2017", f"holds none of the 64 files sampled from the {n} images")]
    for folder, what in cases:
        dm = COCOSegDataModule(val_ann=ann, val_images=str(folder), num_workers=2, on_bad_sample="skip",
                               cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ImageRootError, match=f"val_images '{folder}' {what}") as err:
            # In the Trainer's setup, before any loader (or worker) exists.
            _trainer(limit_val_batches=2).validate(YolactLite(num_classes=80, width=4), datamodule=dm)
        assert err.value.key == "val_images" and dm.val_dataset is None
    with pytest.raises(ImageRootError, match=f"train_images '{tmp_path / 'empty'}' is empty; expected the {n} images"):
        COCOSegDataModule(train_ann=ann, train_images=str(tmp_path / "empty"), num_workers=2,
                          cache_dir=str(tmp_path / "cache")).setup("fit")
    empty = tmp_path / "no_images.json"
    data = json.loads(Path(ann).read_text())
    empty.write_text(json.dumps({"images": [], "annotations": [], "categories": data["categories"]}))
    with pytest.raises(EmptySplitError, match="no_images.json: no image left to use"):
        COCOSegDataModule(val_ann=str(empty), val_images=str(coco_mini / "val2017"), num_workers=0,
                          use_cache=False).setup("validate")


@pytest.mark.parametrize("on_bad_sample", ["raise", "skip"])
def test_many_missing_images_warn_once_at_setup_with_the_counts(coco_mini: Path, tmp_path: Path,
                                                                on_bad_sample: str) -> None:
    ann, images = _val(coco_mini)
    n = len(json.loads(Path(ann).read_text())["images"])
    partial = tmp_path / "val2017"
    partial.mkdir()
    names = sorted(os.listdir(images))
    for name in names[: len(names) * 2 // 3]:  # a third of the split is missing
        (partial / name).symlink_to(Path(images) / name)
    dm = COCOSegDataModule(val_ann=ann, val_images=str(partial), num_workers=0, on_bad_sample=on_bad_sample,
                           cache_dir=str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match=r"val_images '.*val2017' for .*instances_val2017\.json: (2[0-9]) of 64 "
                                         rf"files sampled from the {n} images it names are missing"):
        dm.setup("validate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup("validate")  # once


def test_a_split_whose_every_image_is_unreadable_refuses_a_number(coco_mini: Path, tmp_path: Path) -> None:
    """The files are there (the setup check passes) but none decodes: with on_bad_sample='skip'
    every validation image is an empty stand-in, and the metric refuses to report AP 0."""
    ann, images = _val(coco_mini)
    broken = tmp_path / "val2017"
    broken.mkdir()
    for name in os.listdir(images):
        (broken / name).write_bytes(b"not a jpeg")
    dm = COCOSegDataModule(val_ann=ann, val_images=str(broken), image_size=64, val_batch_size=8, num_workers=0,
                           on_bad_sample="skip", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(NothingScoredError, match="none of the images scored had loaded"):
        _trainer(limit_val_batches=2).validate(YolactLite(num_classes=80, width=4), datamodule=dm, verbose=False)
    assert dm.skip_counts["val"]["image_corrupt"] == 16 and dm.skip_counts["val"]["kept"] == 0
