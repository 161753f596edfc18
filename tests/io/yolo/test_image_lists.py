"""A split's images as Ultralytics lists them (folders, .txt lists), its label files by Ultralytics' rule."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seg_datamodule.io.yolo import label_path, list_split_images
from seg_datamodule.io.yolo.image_lists import label_paths


@pytest.mark.parametrize("image, label", [
    ("/d/images/train/a.jpg", "/d/labels/train/a.txt"),
    ("/d/images/x/images/b.JPEG", "/d/images/x/labels/b.txt"),  # the last /images/
    ("/d/pics/c.v2.png", "/d/pics/c.v2.txt"),  # no /images/: beside it
    ("/images_2/images/d.jpg", "/images_2/labels/d.txt"),
])
def test_label_path_by_hand(image: str, label: str) -> None:
    assert label_path(image) == label


@pytest.mark.needs("ultralytics")
def test_label_path_is_ultralytics_rule() -> None:
    from ultralytics.data import utils

    images = ["/d/images/train/a.jpg", "/d/images/x/images/b.JPEG", "/d/pics/c.v2.png", "/images_2/images/d.jpg"]
    assert [label_path(p) for p in images] == utils.img2label_paths(images)


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def _tree(tmp_path: Path) -> Path:
    """Images, hidden files, other files and links, as a labelling tool's export may hold them."""
    root = tmp_path / "images"
    for name in ("b.jpg", "a.PNG", "sub/c.webp", "sub/deeper/d.tif", ".hidden.jpg", ".cache/e.jpg", "notes.txt",
                 "x.json"):
        _touch(root / name)
    outside = _touch(tmp_path / "elsewhere" / "f.jpg")
    os.symlink(outside, root / "linked.jpg")  # a linked file is listed
    os.symlink(tmp_path / "elsewhere", root / "linked_folder")  # a linked folder is not entered
    return root


def test_a_folder_is_walked_by_hand(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    listing = list_split_images([root])
    assert listing.root == root
    assert listing.file_names == ["a.PNG", "b.jpg", "linked.jpg", "sub/c.webp", "sub/deeper/d.tif"]
    assert listing.counts == {"files_ignored": 2, "image_listed_twice": 0} and listing.problems == []


@pytest.mark.needs("ultralytics")
def test_a_folder_is_walked_as_ultralytics_globs_it(tmp_path: Path) -> None:
    from ultralytics.data.base import BaseDataset

    root = _tree(tmp_path)
    listing = list_split_images([root])
    theirs = BaseDataset.get_img_files(SimpleNamespace(prefix="", fraction=1.0), str(root))
    assert [os.path.relpath(p, root) for p in theirs] == [*listing.file_names[:3], "linked_folder/f.jpg",
                                                            *listing.file_names[3:]]


def test_a_txt_list_is_read_relative_to_its_folder_and_checked(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    for name in ("images/a.jpg", "images/b.jpg", "images/sub/c.jpg"):
        _touch(ds / name)
    lines = ["./images/b.jpg", "images/a.jpg", "", "  images/sub/c.jpg  ", "images/notes.txt", "/abs/d.jpg",
             "../outside.jpg", "images/a.jpg"]
    (ds / "train.txt").write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    listing = list_split_images([ds / "train.txt", ds / "images/sub"])
    assert listing.root == ds and listing.lists == (ds / "train.txt",)
    assert listing.file_names == ["images/a.jpg", "images/b.jpg", "images/sub/c.jpg"]
    # a.jpg twice in the list, c.jpg through the list and the folder.
    assert listing.counts == {"files_ignored": 1, "image_listed_twice": 2}
    assert [(p.line, p.reason) for p in listing.problems] == [(6, "image_unsafe_file_name"),
                                                              (7, "image_unsafe_file_name")]
    assert listing.problems[0].message.startswith(f"{ds / 'train.txt'}:6: image path '/abs/d.jpg' is an absolute path")
    assert "leaves the image root through '..'" in listing.problems[1].message


def test_an_unreadable_list_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe images/a.jpg")
    listing = list_split_images([tmp_path / "bad.txt"])
    assert listing.file_names == [] and [p.reason for p in listing.problems] == ["image_list_unreadable"]


_PARTS = st.sampled_from(["images", "labels", "train", "a.b", "images_2", "x"])
_NAMES = st.sampled_from(["a.jpg", "b.v2.PNG", "images.jpg", ".c.jpg", "d.tif", "noext"])


@given(st.lists(st.tuples(st.lists(_PARTS, max_size=4), _NAMES), max_size=12))
def test_label_paths_equal_the_rule_per_image(items: list[tuple[list[str], str]]) -> None:
    """The per-folder shortcut gives what the rule gives for each path (folders shared or not)."""
    images = [os.sep + os.path.join(*parts, name) for parts, name in items]
    assert label_paths(images) == [label_path(p) for p in images]
