"""The paths a user names are checked where they are given, one line naming the key (issue 40)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.errors import UserInputError
from seg_datamodule.io.paths import InputPathError, check_input_path


def test_each_kind_of_wrong_path_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ann.json").write_text("{}")
    (tmp_path / "images").mkdir()
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    monkeypatch.chdir(tmp_path)
    cases = [
        ("train_ann", str(tmp_path / "nope.json"), "file",
         f"train_ann: expected an existing file, got '{tmp_path / 'nope.json'}': no such file or folder"),
        ("train_ann", "images", "file",
         f"train_ann: expected an existing file, got 'images' ({tmp_path / 'images'}): a folder"),
        ("val_images", "ann.json", "folder",
         f"val_images: expected an existing folder, got 'ann.json' ({tmp_path / 'ann.json'}): a file, not a folder"),
        ("val_images", tmp_path / "gone", "folder",
         f"val_images: expected an existing folder, got '{tmp_path / 'gone'}': no such file or folder (a broken link)"),
    ]
    for name, value, kind, message in cases:
        with pytest.raises(InputPathError) as info:
            check_input_path(name, value, kind)
        assert str(info.value) == message
        assert isinstance(info.value, UserInputError) and isinstance(info.value, FileNotFoundError)
    for name, value, kind in (("a", None, "file"), ("a", "ann.json", "file"), ("a", Path("images"), "folder"),
                              ("a", os.fspath(tmp_path / "images"), "folder")):
        check_input_path(name, value, kind)


def test_the_datamodule_checks_its_paths_when_built(tmp_path: Path) -> None:
    (tmp_path / "ann.json").write_text("{}")
    (tmp_path / "images").mkdir()
    ann, images = str(tmp_path / "ann.json"), str(tmp_path / "images")
    for kwargs, key in (
        (dict(train_ann=str(tmp_path / "x.json"), train_images=images), "train_ann"),
        (dict(train_ann=ann, train_images=str(tmp_path / "x")), "train_images"),
        (dict(train_ann=ann, train_images=images, val_ann=images, val_images=images), "val_ann"),
        (dict(train_ann=ann, train_images=images, test_ann=ann, test_images=ann), "test_images"),
        (dict(train_ann=ann, train_images=images, predict_images=str(tmp_path / "x")), "predict_images"),
        (dict(train_ann=ann, train_images=images, predict_images=images, predict_ann=images), "predict_ann"),
    ):
        with pytest.raises(InputPathError, match=f"^{key}: expected an existing"):
            COCOSegDataModule(**kwargs)
    COCOSegDataModule(train_ann=ann, train_images=images, val_ann=ann, val_images=images)  # nothing read yet
