"""The real images that ship with the tests (tests/fixtures/coco-cc-by): each may ship, is credited,
and is what its annotation file says; without ../shared the tests that need COCO data run on them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest

# What the coco_mini fixture of tests/conftest.py falls back to (not imported: several conftest modules).
COCO_CC_BY = Path(__file__).resolve().parent / "fixtures" / "coco-cc-by"
README = (COCO_CC_BY / "README.md").read_text()
ROW = re.compile(r"^\| (?P<file>(train|val)2017/\d+\.jpg) \| (?P<id>\d+) \| (?P<w>\d+)x(?P<h>\d+) \| .+? \| "
                 r"(?P<flickr>http\S+) \| (?P<coco>http\S+) \| CC BY 2\.0 \(id 4\) \|$", re.M)


def _images() -> list[tuple[str, dict]]:
    out = []
    for split in ("train", "val"):
        data = json.loads((COCO_CC_BY / "annotations" / f"instances_{split}2017.json").read_text())
        out += [(f"{split}2017/{img['file_name']}", img) for img in data["images"]]
    return out


def test_at_most_ten_cc_by_images_each_credited_in_the_readme() -> None:
    """The one exception coco-mini's README allows: at most 10 images of licence id 4 (CC BY 2.0),
    with a file naming each one's flickr_url, coco_url and licence."""
    images = _images()
    rows = {m["file"]: m for m in ROW.finditer(README)}
    assert 0 < len(images) <= 10 and len(rows) == len(images)
    for path, img in images:
        assert img["license"] == 4, path
        row = rows[path]
        assert (int(row["id"]), int(row["w"]), int(row["h"])) == (img["id"], img["width"], img["height"])
        assert (row["flickr"], row["coco"]) == (img["flickr_url"], img["coco_url"])
    files = sorted(str(p.relative_to(COCO_CC_BY)) for p in COCO_CC_BY.glob("*2017/*"))
    assert files == sorted(path for path, _ in images)  # no image without its entry, none missing
    for split in ("train", "val"):
        licences = json.loads((COCO_CC_BY / "annotations" / f"instances_{split}2017.json").read_text())["licenses"]
        assert [(x["id"], x["url"]) for x in licences] == [(4, "http://creativecommons.org/licenses/by/2.0/")]


@pytest.mark.parametrize("split", ["train", "val"])
def test_each_split_has_crowd_regions_and_images_decode_at_their_size(split: str) -> None:
    data = json.loads((COCO_CC_BY / "annotations" / f"instances_{split}2017.json").read_text())
    ids = {img["id"] for img in data["images"]}
    assert all(a["image_id"] in ids for a in data["annotations"])
    assert any(a["iscrowd"] for a in data["annotations"]) and len(data["categories"]) == 80
    for img in data["images"]:
        pixels = cv2.imread(str(COCO_CC_BY / f"{split}2017" / img["file_name"]))
        assert pixels.shape == (img["height"], img["width"], 3), img["file_name"]


def test_the_fixture_is_small() -> None:
    assert sum(p.stat().st_size for p in COCO_CC_BY.rglob("*") if p.is_file()) < 1.5 * 2**20


def test_tiled_root_mirrors_every_annotation_with_its_pixels(tmp_path):
    """The fresh-clone stand-in for coco-mini (conftest's ``coco_mini``): copy 1 of each image is
    the image mirrored, and each of its annotations, decoded by pycocotools, is the source's mask
    mirrored, crowd RLE included; ids are new and unique."""
    from pycocotools import mask as mask_utils

    from _datasets import tile_coco_root

    root = tile_coco_root(COCO_CC_BY, tmp_path / "tiled", copies=2)
    for split in ("train", "val"):
        src = json.loads((COCO_CC_BY / "annotations" / f"instances_{split}2017.json").read_text())
        out = json.loads((root / "annotations" / f"instances_{split}2017.json").read_text())
        assert len(out["images"]) == 2 * len(src["images"])
        assert len(out["annotations"]) == 2 * len(src["annotations"])
        assert len({a["id"] for a in out["annotations"]}) == len(out["annotations"])
        assert len({i["id"] for i in out["images"]}) == len(out["images"])
        sizes = {i["id"]: (i["height"], i["width"]) for i in src["images"]}
        by_id = {a["id"]: a for a in out["annotations"]}
        for ann in src["annotations"]:
            h, w = sizes[ann["image_id"]]
            mirror = by_id[ann["id"] + 10**8]
            assert mirror["image_id"] == ann["image_id"] + 10**7

            def decode(seg):
                rle = mask_utils.frPyObjects(seg, h, w)
                return mask_utils.decode(mask_utils.merge(rle) if isinstance(rle, list) else rle)

            got, want = decode(mirror["segmentation"]), decode(ann["segmentation"])[:, ::-1]
            if ann["iscrowd"]:  # a mask mirrored is exact
                np.testing.assert_array_equal(got, want)
            else:  # pycocotools' polygon fill rounds edges one way: a mirrored pixel may move by one
                assert (got != want).sum() <= 2 * h + sum(len(r) for r in ann["segmentation"]), ann["id"]
                assert (got & want).sum() / max((got | want).sum(), 1) > 0.5, ann["id"]
            x, y, bw, bh = ann["bbox"]
            assert mirror["bbox"] == pytest.approx([w - x - bw, y, bw, bh])
        for img in src["images"]:
            a = cv2.imread(str(COCO_CC_BY / f"{split}2017" / img["file_name"]))
            b = cv2.imread(str(root / f"{split}2017" / f"{img['id'] + 10**7:012d}.jpg"))
            same = cv2.imread(str(root / f"{split}2017" / f"{img['id']:012d}.jpg"))
            np.testing.assert_array_equal(same, a)
            assert np.abs(b.astype(int) - a[:, ::-1].astype(int)).mean() < 4  # re-encoded at quality 95
