"""The real images that ship with the tests (tests/fixtures/coco-cc-by): each may ship, is credited,
and is what its annotation file says; without ../shared the tests that need COCO data run on them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
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


def test_the_tiled_root_is_the_fixture_under_new_ids(tmp_path):
    """The fresh-clone stand-in for coco-mini (conftest's ``coco_mini``): copy ``k`` of each image is
    its file byte for byte under a new id, with every annotation under a new, unique id."""
    from _datasets import tile_coco_root

    root = tile_coco_root(COCO_CC_BY, tmp_path / "tiled", copies=3)
    for split in ("train", "val"):
        src = json.loads((COCO_CC_BY / "annotations" / f"instances_{split}2017.json").read_text())
        out = json.loads((root / "annotations" / f"instances_{split}2017.json").read_text())
        assert out["categories"] == src["categories"] and out["licenses"] == src["licenses"]
        assert len(out["images"]) == 3 * len(src["images"]) == len({i["id"] for i in out["images"]})
        assert len(out["annotations"]) == 3 * len(src["annotations"]) == len({a["id"] for a in out["annotations"]})
        images = {i["id"]: i for i in out["images"]}
        for k in range(3):
            for img in src["images"]:
                copy = images[img["id"] + k * 10**7]
                assert (copy["width"], copy["height"]) == (img["width"], img["height"])
                assert (root / f"{split}2017" / copy["file_name"]).read_bytes() == \
                    (COCO_CC_BY / f"{split}2017" / img["file_name"]).read_bytes()
            by_id = {a["id"]: a for a in out["annotations"]}
            for ann in src["annotations"]:
                copy = by_id[ann["id"] + k * 10**8]
                assert copy == {**ann, "id": copy["id"], "image_id": ann["image_id"] + k * 10**7}
