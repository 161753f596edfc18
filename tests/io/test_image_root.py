"""The image-root sample check: a folder that is missing, empty, or holds none of a sample of the files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seg_datamodule.errors import UserInputError
from seg_datamodule.io.images.root import SAMPLE_SIZE, ImageRootError, sample_image_root, sample_positions


@pytest.mark.parametrize("n, k", [(0, 64), (1, 64), (5, 64), (64, 64), (1000, 64), (1000, 7)])
def test_sample_positions_are_distinct_sorted_and_spread(n: int, k: int) -> None:
    positions = sample_positions(n, k)
    assert len(positions) == min(n, k) and len(set(positions.tolist())) == len(positions)
    assert np.all(np.diff(positions) > 0)
    if n:
        assert positions[0] == 0 and positions[-1] == n - 1  # the first and last image are looked at


def _names(n: int) -> list[str]:
    return [f"sub/{i:04d}.jpg" for i in range(n)]


def test_a_folder_holding_all_some_or_none_of_the_files(tmp_path: Path) -> None:
    names = _names(200)
    root = tmp_path / "images"
    for name in names[::2]:  # every other file present
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    half = sample_image_root(root, len(names), names.__getitem__, "val_images", "val.json")
    assert half.images == 200 and half.sampled == SAMPLE_SIZE
    assert 0.3 < half.missing_share < 0.7 and all(name in names[1::2] for name in half.missing)
    for name in names[1::2]:
        (root / name).write_bytes(b"x")
    assert sample_image_root(root, len(names), names.__getitem__, "val_images", "val.json").missing == ()
    # Another split's folder: none of the sample is there, one line naming the key, folder and an example.
    other = _names(200)
    with pytest.raises(ImageRootError, match=r"val_images '.*images' holds none of the 64 files sampled from the "
                                             r"200 images other\.json names \(e\.g\. '.*sub/0000\.png'\)") as err:
        sample_image_root(root, 200, lambda i: other[i].replace(".jpg", ".png"), "val_images", "other.json")
    assert err.value.key == "val_images" and err.value.root == str(root)
    assert isinstance(err.value, UserInputError) and isinstance(err.value, FileNotFoundError)


def test_a_missing_file_or_empty_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ImageRootError, match=r"train_images '.*nowhere' does not exist; expected the folder of the "
                                             r"3 images t\.json names"):
        sample_image_root(tmp_path / "nowhere", 3, _names(3).__getitem__, "train_images", "t.json")
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(ImageRootError, match="is not a folder"):
        sample_image_root(tmp_path / "file.jpg", 3, _names(3).__getitem__, "train_images", "t.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageRootError, match=r"train_images '.*empty' is empty; expected the 3 images t\.json names, "
                                             r"e\.g\. 'sub/0000\.jpg'"):
        sample_image_root(tmp_path / "empty", 3, _names(3).__getitem__, "train_images", "t.json")
    # An index of no image needs no file (the caller decides whether an empty split is an error).
    assert sample_image_root(tmp_path / "empty", 0, _names(0).__getitem__, "k", "t.json").sampled == 0
