"""Image ids of files named only by their paths: COCO's all-digit stems as numbers, other names hashed, clashes refused."""

from __future__ import annotations

import pytest

from seg_datamodule.io.images.ids import ImageIdClashError, assign_image_ids, image_id_of, stable_image_id


def test_an_all_digit_stem_is_the_id() -> None:
    assert image_id_of("000000397133.jpg") == 397133
    assert image_id_of("val2017/000000000139.JPG") == 139
    assert image_id_of("0.png") == 0
    assert image_id_of(f"{2**53}.jpg") == 2**53


@pytest.mark.parametrize("name", ["IMG_0042.jpg", "a1.jpg", "12a.png", "1.2.jpg", "٣.jpg", f"{2**53 + 1}.jpg",
                                  "-5.jpg", ".jpg", "sub/x"])
def test_other_names_are_hashed_from_the_whole_path(name: str) -> None:
    assert image_id_of(name) == stable_image_id(name)
    assert 1 <= image_id_of(name) <= 2**53
    assert image_id_of("other/" + name) != image_id_of(name)


def test_a_clash_is_refused_naming_both_files() -> None:
    ids = assign_image_ids(["b/000001.jpg", "a/2.png", "c/photo.jpg"], "folder")
    assert ids.tolist() == [1, 2, stable_image_id("c/photo.jpg")]
    with pytest.raises(ImageIdClashError, match=r"'a/7.jpg' and 'b/007.png' would both have image id 7") as info:
        assign_image_ids(["a/7.jpg", "c/8.jpg", "b/007.png"], "folder")
    assert str(info.value).startswith("folder:") and isinstance(info.value, ValueError)
    assert assign_image_ids([], "empty").tolist() == []
