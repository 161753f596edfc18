"""The embedded demo dataset: valid COCO, pixels agree with polygons, deterministic, cache-safe."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from seg_datamodule.demo import data as demo_data
from seg_datamodule.demo.data import DEMO_CATEGORIES, DemoPaths, draw_demo_image, draw_scene, ensure_demo_dataset, generate_demo_dataset
from seg_datamodule.ops.rle import uncompressed_rle

NUM_TRAIN, NUM_VAL = 17, 4  # image 15 of train is an empty one


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    return generate_demo_dataset(tmp_path_factory.mktemp("demo"), num_train=NUM_TRAIN, num_val=NUM_VAL)


def _load(path: Path) -> COCO:
    coco = COCO()  # COCO(path) prints; build it quietly
    coco.dataset = json.loads(path.read_text())
    coco.createIndex()
    return coco


# ------------------------------------------------------------------------------------- scenes


def test_empty_scene_first() -> None:
    scene = draw_scene(np.random.default_rng(0), (40, 56), num_shapes=(0, 0), crowd_prob=0.0)
    assert scene.image.shape == (40, 56, 3) and scene.image.dtype == np.uint8
    assert scene.instances == ()
    assert not scene.instance_map.any()


def test_scene_is_pure_in_its_generator() -> None:
    a = draw_scene(np.random.default_rng(3), (200, 260))
    b = draw_scene(np.random.default_rng(3), (200, 260))
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.instance_map, b.instance_map)


# ---------------------------------------------------------------------------------- COCO JSON


@pytest.mark.parametrize("split", ["train", "val"])
def test_json_is_valid_coco(small_demo: DemoPaths, split: str) -> None:
    ann_path = small_demo.train_ann if split == "train" else small_demo.val_ann
    image_dir = small_demo.train_images if split == "train" else small_demo.val_images
    raw = json.loads(ann_path.read_text())
    assert {"info", "licenses", "images", "annotations", "categories"} <= raw.keys()
    assert [c["id"] for c in raw["categories"]] == [1, 3, 7, 12]  # not contiguous on purpose
    assert all({"id", "name", "supercategory"} <= c.keys() for c in raw["categories"])

    coco = _load(ann_path)
    assert len(coco.imgs) == (NUM_TRAIN if split == "train" else NUM_VAL)
    assert len(coco.anns) == len({a["id"] for a in raw["annotations"]})
    for img in coco.imgs.values():
        assert {"id", "file_name", "height", "width"} <= img.keys()
        assert 320 <= img["height"] <= 480 and 320 <= img["width"] <= 480
        pixels = cv2.imread(str(image_dir / img["file_name"]))
        assert pixels is not None and pixels.shape == (img["height"], img["width"], 3)
    for ann in coco.anns.values():
        assert {"id", "image_id", "category_id", "segmentation", "area", "bbox", "iscrowd"} <= ann.keys()
        img = coco.imgs[ann["image_id"]]
        assert ann["category_id"] in coco.cats
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and ann["area"] > 0
        assert x >= 0 and y >= 0 and x + w <= img["width"] and y + h <= img["height"]
        if ann["iscrowd"]:
            seg = ann["segmentation"]
            assert isinstance(seg["counts"], list) and seg["size"] == [img["height"], img["width"]]
            assert sum(seg["counts"]) == img["height"] * img["width"]
        else:
            assert all(len(ring) >= 6 and len(ring) % 2 == 0 for ring in ann["segmentation"])
        assert coco.annToMask(ann).sum() == pytest.approx(ann["area"])


def test_train_split_has_the_hard_cases(small_demo: DemoPaths) -> None:
    coco = _load(small_demo.train_ann)
    sizes = {(i["height"], i["width"]) for i in coco.imgs.values()}
    assert any(h != w for h, w in sizes) and len(sizes) > 5
    anns = list(coco.anns.values())
    assert any(a["iscrowd"] for a in anns)
    assert any(not a["iscrowd"] and len(a["segmentation"]) >= 2 for a in anns)  # multi-ring
    assert set(coco.cats) == {a["category_id"] for a in anns}
    empty = [i for i in coco.imgs if not coco.getAnnIds(imgIds=i)]
    assert empty == [sorted(coco.imgs)[15]]
    side = [max(a["bbox"][2], a["bbox"][3]) for a in anns if not a["iscrowd"]]
    assert min(side) < 60 and max(side) > 120


@pytest.mark.parametrize("split", ["train", "val"])
def test_polygons_match_painted_pixels(small_demo: DemoPaths, split: str) -> None:
    """annToMask (pycocotools, an independent rasteriser) against the pixels the scene painted,
    and against the colours in the JPEG on disk."""
    ann_path = small_demo.train_ann if split == "train" else small_demo.val_ann
    image_dir = small_demo.train_images if split == "train" else small_demo.val_images
    coco = _load(ann_path)
    ious = []
    for index, image_id in enumerate(sorted(coco.imgs)):
        info = coco.imgs[image_id]
        scene = draw_demo_image(index, split=split)
        assert scene.instance_map.shape == (info["height"], info["width"])
        anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
        assert len(anns) == len(scene.instances)
        jpeg = cv2.cvtColor(cv2.imread(str(image_dir / info["file_name"])), cv2.COLOR_BGR2RGB)
        for n, (ann, inst) in enumerate(zip(anns, scene.instances)):
            assert ann["category_id"] == inst.category_id
            target = coco.annToMask(ann).astype(bool)
            painted = scene.instance_map == n + 1
            if ann["iscrowd"]:
                # RLE round trip is exact.
                np.testing.assert_array_equal(target, painted)
            iou = (target & painted).sum() / (target | painted).sum()
            ious.append(iou)
            assert iou > 0.9, f"image {image_id} ann {ann['id']}: IoU {iou:.3f}"
            # The JPEG shows the instance's colour where the annotation says it is (crowds are
            # clusters of 8-18 px discs, whose edges JPEG's 4:2:0 chroma subsampling blurs more).
            mean = jpeg[target].astype(np.float64).mean(axis=0)
            tolerance = 50 if ann["iscrowd"] else 30
            assert np.abs(mean - np.array(inst.color)).max() < tolerance, (image_id, ann["id"], mean)
    assert np.mean(ious) > 0.97


# ---------------------------------------------------------------------------------- crowd RLE


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    density=st.floats(0.0, 1.0),
)
def test_uncompressed_rle_matches_pycocotools(h: int, w: int, seed: int, density: float) -> None:
    mask = np.random.default_rng(seed).uniform(size=(h, w)) < density
    seg = uncompressed_rle(mask)
    assert seg["size"] == [h, w] and sum(seg["counts"]) == h * w
    rle = mask_utils.frPyObjects(seg, h, w)
    np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), mask)
    # Same compressed string as pycocotools' own encoder.
    assert rle["counts"] == mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"]


# ------------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes(tmp_path: Path, small_demo: DemoPaths) -> None:
    again = generate_demo_dataset(tmp_path / "again", num_train=NUM_TRAIN, num_val=NUM_VAL)
    assert again.train_ann.read_bytes() == small_demo.train_ann.read_bytes()
    assert again.val_ann.read_bytes() == small_demo.val_ann.read_bytes()
    name = "000000000003.jpg"
    assert (again.train_images / name).read_bytes() == (small_demo.train_images / name).read_bytes()
    # Another seed draws another scene for the same image index.
    assert not np.array_equal(draw_demo_image(0, seed=0).image, draw_demo_image(0, seed=1).image)
    assert np.array_equal(draw_demo_image(0, seed=0).image, draw_demo_image(0, seed=0).image)


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_train"):
        generate_demo_dataset(tmp_path, num_train=-1)
    with pytest.raises(ValueError, match="image_size"):
        generate_demo_dataset(tmp_path, image_size=(400, 300))
    with pytest.raises(ValueError, match="split"):
        draw_demo_image(0, split="test")


# ---------------------------------------------------------------------------------- the cache


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_ensure_generates_once_then_reuses(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "demo"
    paths = ensure_demo_dataset(root)
    assert paths.root == root and (root / "COMPLETE").is_file()
    assert len(list(paths.train_images.glob("*.jpg"))) == 48
    assert len(list(paths.val_images.glob("*.jpg"))) == 16
    stamp = paths.train_ann.stat().st_mtime_ns
    assert ensure_demo_dataset(root) == paths
    assert paths.train_ann.stat().st_mtime_ns == stamp  # reused, not redrawn
    assert _leftovers(root.parent) == []


@pytest.mark.parametrize("damage", ["jpeg", "marker", "spec"])
def test_ensure_regenerates_an_incomplete_dataset(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "demo"
    paths = ensure_demo_dataset(root)
    reference = paths.train_ann.read_bytes()
    if damage == "jpeg":
        (paths.val_images / "000000010003.jpg").unlink()
    elif damage == "marker":
        (root / "COMPLETE").unlink()
    else:
        (root / "COMPLETE").write_text('{"version": 0}')
    paths.train_ann.write_text("{}")  # must not survive the regeneration
    again = ensure_demo_dataset(root)
    assert (again.val_images / "000000010003.jpg").is_file()
    assert again.train_ann.read_bytes() == reference
    assert _leftovers(tmp_path) == []


def test_ensure_default_root_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEG_DATAMODULE_CACHE", str(tmp_path))
    assert demo_data.default_demo_root() == tmp_path / f"demo-v{demo_data.DEMO_VERSION}"
    monkeypatch.delenv("SEG_DATAMODULE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo_data.default_demo_root() == tmp_path / "xdg" / "seg_datamodule" / f"demo-v{demo_data.DEMO_VERSION}"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert demo_data.default_demo_root() == Path.home() / ".cache" / "seg_datamodule" / f"demo-v{demo_data.DEMO_VERSION}"


def _race(root: str, queue: "mp.Queue[str]") -> None:
    queue.put(str(ensure_demo_dataset(root).train_ann))


@pytest.mark.slow
def test_ensure_is_safe_when_processes_race(tmp_path: Path) -> None:
    """Three processes (as DDP ranks would) ask for the dataset at once."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    root = tmp_path / "demo"
    procs = [ctx.Process(target=_race, args=(str(root), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert {queue.get(timeout=5) for _ in procs} == {str(root / "annotations" / "instances_train2017.json")}
    assert demo_data._is_complete(root, demo_data._spec(48, 16, (320, 480), 0))
    assert _leftovers(tmp_path) == []
    assert len(_load(root / "annotations" / "instances_val2017.json").imgs) == 16
    assert {c["id"] for c in DEMO_CATEGORIES} == {1, 3, 7, 12}
