"""What the pictures show, not only that they exist (issue 62): the written files decoded and compared,
pixel by pixel or colour by colour, with a reference computed here from the annotations or the batch.

The data are flat-coloured images with squares on the mask grid, so every expected colour is a
number: a pixel outside any instance keeps its image's colour, one inside instance ``j`` of its
image is ``(1 - alpha) * image + alpha * palette[j]`` (``draw_instances``' blend), and an outline
carries its documented colour. JPEG (quality 90, 4:4:4) moves flat areas by a few grey levels:
the tolerances below are a few levels, far under the distance between any two colours compared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from seg_datamodule import COCOSegDataModule, DetectionBatch
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.pictures import (canvas_predictions, confusion_figure, label_figure, label_stats, pr_figure,
                                     results_figure)
from seg_datamodule.pictures.html import Card, Report, write_report
from seg_datamodule.pictures.inspect import inspect_split
from seg_datamodule.pictures.writer import host_copy, write_picture
from seg_datamodule.visualize import _palette

ALPHA = 0.45  # draw_instances' default mask opacity
GREEN, RED, MAGENTA = (40, 200, 40), (230, 30, 30), (230, 0, 230)  # inspect's outlines
#: Image k of the generated split: its flat RGB colour and its squares (x, y, side), on the stride-4 grid.
COLOURS = [(200, 60, 20), (20, 90, 210), (120, 200, 40)]
SQUARES = [[(8, 8, 40)], [(60, 20, 32), (16, 72, 24)], [(32, 32, 48), (88, 88, 24), (4, 100, 20)]]
NAMES = {3: "cat", 5: "dog"}


def _read(path: Path) -> np.ndarray:
    """A written picture as RGB int (cv2 reads BGR)."""
    picture = cv2.imread(str(path))
    assert picture is not None, path
    return cv2.cvtColor(picture, cv2.COLOR_BGR2RGB).astype(np.int64)


def _blend(image: tuple[int, int, int], colour: np.ndarray) -> np.ndarray:
    return (1 - ALPHA) * np.asarray(image, np.float64) + ALPHA * np.asarray(colour, np.float64)


def _square_mask(shape: tuple[int, int], squares: list[tuple[int, int, int]], grow: int = 0) -> np.ndarray:
    out = np.zeros(shape, bool)
    for x, y, side in squares:
        out[max(y - grow, 0) : y + side + grow, max(x - grow, 0) : x + side + grow] = True
    return out


def _write_split(root: Path, crowd_and_box_only: bool = False) -> Path:
    """Three 128 x 128 PNGs (ids 10, 11, 12) of :data:`COLOURS` with :data:`SQUARES`, classes alternating
    cat, dog; with ``crowd_and_box_only``, a crowd square on image 11 and a box-only one on image 12."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for k, (colour, squares) in enumerate(zip(COLOURS, SQUARES)):
        cv2.imwrite(str(root / "img" / f"{k}.png"), np.full((128, 128, 3), colour[::-1], np.uint8))
        images.append({"id": 10 + k, "file_name": f"{k}.png", "width": 128, "height": 128})
        for j, (x, y, side) in enumerate(squares):
            annotations.append({"id": 100 + 10 * k + j, "image_id": 10 + k, "category_id": (3, 5)[j % 2],
                                "bbox": [x, y, side, side], "area": side * side, "iscrowd": 0,
                                "segmentation": [[x, y, x + side, y, x + side, y + side, x, y + side]]})
    if crowd_and_box_only:
        crowd = np.zeros((128, 128), np.uint8, order="F")
        crowd[96:124, 96:124] = 1
        rle = mask_utils.encode(crowd)
        annotations.append({"id": 900, "image_id": 11, "category_id": 3, "bbox": [96, 96, 28, 28], "area": 784,
                            "iscrowd": 1, "segmentation": {"size": [128, 128], "counts": rle["counts"].decode()}})
        annotations.append({"id": 901, "image_id": 12, "category_id": 5, "bbox": [8, 8, 16, 24], "area": 384,
                            "iscrowd": 0, "segmentation": []})
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": c, "name": n} for c, n in NAMES.items()]}))
    return path


def _datamodule(ann: Path, root: Path) -> COCOSegDataModule:
    # batch_size 2 for three samples: sample 2 is the first of the report's second batch
    return COCOSegDataModule(train_ann=str(ann), train_images=str(ann.parent / "img"), val_ann=str(ann),
                             val_images=str(ann.parent / "img"), image_size=128, batch_size=2, val_batch_size=2,
                             num_workers=0, cache_dir=str(root / "cache"))


def _figures(page: Path) -> list[tuple[str, str, str]]:
    """``(img src, caption title, caption detail)`` of every figure, in page order."""
    return re.findall(r'<figure><img src="([^"]+)"[^>]*><figcaption><b>([^<]*)</b>([^<]*)</figcaption>',
                      page.read_text())


def test_the_inspect_report_shows_each_sample_with_its_own_targets(tmp_path: Path) -> None:
    ann = _write_split(tmp_path)
    page = inspect_split(_datamodule(ann, tmp_path), "val", tmp_path / "report", samples=3)
    figures = _figures(page)
    assert len(figures) == 6
    for k, (colour, squares) in enumerate(zip(COLOURS, SQUARES)):
        (raw_src, raw_title, raw_detail), (recipe_src, recipe_title, recipe_detail) = figures[2 * k : 2 * k + 2]
        # the captions: image k of the file, sample k, and as many targets as image k has annotations
        assert (raw_src, raw_title, raw_detail) == (f"images/raw_{k}.jpg", f"image id {10 + k}", f"{k}.png as read")
        assert (recipe_src, recipe_title, recipe_detail) == (f"images/recipe_{k}.jpg", f"sample {k} (letterbox)",
                                                             f"{len(squares)} targets")

        # As read (128 px: drawn at scale 1): image k's colour, its squares outlined in green, nothing else.
        raw = _read(page.parent / raw_src)
        assert raw.shape == (128, 128, 3)
        # (JPEG rings up to ~20 levels within 6 px of an outline; the class names stand at the corner)
        near = _square_mask((128, 128), squares, grow=6) & ~_square_mask((128, 128), squares, grow=-6)
        near |= _square_mask((128, 128), [(x, y - 2, 36) for x, y, _ in squares])
        assert np.abs(raw[~near] - colour).max() < 24
        assert (np.abs(raw[~near] - colour).max(axis=1) > 8).mean() < 0.01
        for x, y, side in squares:
            interior = raw[y + 14 : y + side - 3, x + 3 : x + side - 3]  # below the class name
            assert np.abs(interior.reshape(-1, 3).mean(axis=0) - colour).max() < 3
            assert np.abs(interior - colour).max() < 24
            for px, py in ((x, y + side // 2), (x + side, y + side // 2), (x + side // 2, y + side)):  # edges
                assert np.abs(raw[py, px] - GREEN).max() < 30, (k, px, py, raw[py, px])

        # Through the letterbox (the identity here): each square blended with its palette colour, in order.
        recipe = _read(page.parent / recipe_src)
        assert recipe.shape == (128, 128, 3)
        names = _square_mask((128, 128), [(x, y, 36) for x, y, _ in squares])
        outside = ~(_square_mask((128, 128), squares, grow=6) | names)
        assert np.abs(recipe[outside] - colour).max() < 24  # no other sample's masks or boxes
        assert (np.abs(recipe[outside] - colour).max(axis=1) > 8).mean() < 0.01
        palette = _palette(len(squares))
        for j, (x, y, side) in enumerate(squares):
            interior = recipe[y + 14 : y + side - 3, x + 3 : x + side - 3].reshape(-1, 3).mean(axis=0)
            assert np.abs(interior - _blend(colour, palette[j])).max() < 6, (k, j, interior)
            edge = recipe[y + side // 2, x]  # the box's left edge: the palette colour itself
            assert np.abs(edge - palette[j]).max() < 30, (k, j, edge, palette[j])


def test_the_inspect_gallery_draws_each_annotation_on_its_own_image(tmp_path: Path) -> None:
    ann = _write_split(tmp_path, crowd_and_box_only=True)
    page = inspect_split(_datamodule(ann, tmp_path), "val", tmp_path / "report", samples=3)
    text = page.read_text()
    assert "setup stops this split" in text  # box_only: raise, the default; the gallery is written all the same
    assert re.findall(r"<h3>(\w+) \((\d+) shown\)</h3>", text) == [("crowd", "1"), ("box_only", "1")]
    cards = {title: (src, detail) for src, title, detail in _figures(page)}

    src, detail = cards["crowd: image id 11"]
    assert detail == "1.png: crowd annotation ids [900] (hatched)"
    picture = _read(page.parent / src)
    hatch = picture[100:120, 100:120].reshape(-1, 3)
    hatched = np.abs(hatch - (np.asarray(COLOURS[1]) // 2 + [120, 0, 120])).max(axis=1) < 12
    plain = np.abs(hatch - COLOURS[1]).max(axis=1) < 12
    assert 0.3 < hatched.mean() < 0.7 and (hatched | plain).mean() > 0.8  # half the stripes, on image 11
    assert np.abs(picture[97, 110] - MAGENTA).max() < 40  # the region's outline
    outside = ~_square_mask((128, 128), SQUARES[1] + [(96, 96, 28)], grow=3)
    assert np.abs(picture[outside] - COLOURS[1]).max() < 60

    src, detail = cards["box_only: annotation id 901"]
    assert detail == "image id 12, 2.png"
    picture = _read(page.parent / src)
    for x, y in ((8, 16), (24, 16), (16, 32), (24, 30)):  # 901's box (16 x 24), in red
        assert np.abs(picture[y, x] - RED).max() < 30, (x, y, picture[y, x])
    for x, y, side in SQUARES[2]:  # the image's other annotations in green
        assert np.abs(picture[y + side // 2 + 6, x + side] - GREEN).max() < 30
    assert np.abs(picture[60, 60] - COLOURS[2]).max() < 8



def test_the_recipes_drops_are_drawn_in_red_on_their_own_images(tmp_path: Path) -> None:
    ann = _write_split(tmp_path)
    page = inspect_split(_datamodule(ann, tmp_path), "train", tmp_path / "report", samples=1, probe=8)
    where = {100 + 10 * k + j: (k, j) for k, squares in enumerate(SQUARES) for j in range(len(squares))}
    drops = [(src, title, detail) for src, title, detail in _figures(page) if not src.startswith("images/r")]
    assert drops and {t.split(":")[0] for _, t, _ in drops} <= {"outside", "clipped", "small_box", "degenerate"}
    for src, title, detail in drops:
        k, dropped = where[int(title.rsplit(" ", 1)[1])]
        assert detail == f"image id {10 + k}, {k}.png (in red)"
        picture = _read(page.parent / src)
        assert np.abs(picture[124, 64] - COLOURS[k]).max() < 12  # image k (no square reaches there)
        for j, (x, y, side) in enumerate(SQUARES[k]):  # the dropped one red, the image's others green
            edge = picture[y + side // 2, x - 1 : x + 2]  # 3 px wide in red, 1 in green
            assert np.abs(edge[1] - (RED if j == dropped else GREEN)).max() < 30, (title, j)
            assert (np.abs(edge - RED).max(axis=1) < 40).all() if j == dropped else \
                (np.abs(edge[[0, 2]] - GREEN).max(axis=1) > 40).all(), (title, j, edge)


def test_the_indexs_skips_are_drawn_in_thick_red_on_their_own_images(tmp_path: Path) -> None:
    """A skipped annotation's card: its ring and box from the file in thick red on its own image, the
    image's kept annotations in green, the index's message as the caption, and how many are shown."""
    ann = _write_split(tmp_path)
    data = json.loads(ann.read_text())
    data["annotations"] += [  # two points on image 11; an unknown category on image 12
        {"id": 950, "image_id": 11, "category_id": 3, "bbox": [100, 60, 20, 40], "area": 10, "iscrowd": 0,
         "segmentation": [[100, 60, 120, 60]]},
        {"id": 951, "image_id": 12, "category_id": 99, "bbox": [100, 8, 20, 20], "area": 400, "iscrowd": 0,
         "segmentation": [[100, 8, 120, 8, 120, 28, 100, 28]]}]
    ann.write_text(json.dumps(data))
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(tmp_path / "img"), image_size=128, batch_size=2,
                           num_workers=0, cache_dir=str(tmp_path / "cache"), on_bad_sample="skip")
    page = inspect_split(dm, "train", tmp_path / "report", samples=1, probe=8)
    cards = {title: (src, detail) for src, title, detail in _figures(page) if title.split(":")[0]
             in ("polygon_too_few_points", "annotation_unknown_category_id")}
    assert set(cards) == {"polygon_too_few_points: annotation id 950", "annotation_unknown_category_id: annotation id 951"}
    assert "polygon_too_few_points (1 shown)" in page.read_text()
    assert "annotation id 950 (image id 11, file 1.png): polygon ring 0 has 2 points" in cards[
        "polygon_too_few_points: annotation id 950"][1]
    for title, k, red_at, box in (("polygon_too_few_points: annotation id 950", 1, [(110, 60), (120, 80), (100, 95), (110, 100)],
                                   (100, 60, 20, 40)),
                                  ("annotation_unknown_category_id: annotation id 951", 2, [(110, 8), (100, 18)],
                                   (100, 8, 20, 20))):
        picture = _read(page.parent / cards[title][0])
        assert picture.shape[:2] == (128, 128), title
        x, y, w, h = box
        for px, py in red_at:  # on the ring or the box: red, 3 px wide (the pixel beside it too)
            for dx, dy in ((0, 0), (1, 0), (0, 1)) if px in (x, x + w) else ((0, 0), (0, 1), (0, -1)):
                assert np.abs(picture[py + dy, px + dx] - RED).max() < 40, (title, px + dx, py + dy)
        for sx, sy, side in SQUARES[k]:  # the image's own annotations, in thin green
            assert np.abs(picture[sy + side // 2, sx] - GREEN).max() < 30, (title, sx, sy)
        assert np.abs(picture[y + h // 2, x + w // 2] - COLOURS[k]).max() < 12  # inside the box: the image itself


def test_annotations_are_outlined_along_their_polygons_in_their_colour(tmp_path: Path) -> None:
    from seg_datamodule.pictures.inspect import _draw_annotations

    ann = _write_split(tmp_path)
    data = json.loads(ann.read_text())
    data["annotations"] = [{**data["annotations"][0], "segmentation": [[20, 20, 100, 20, 20, 100]],
                            "bbox": [20, 20, 80, 80], "area": 3200}]  # a triangle: its outline is not its box
    ann.write_text(json.dumps(data))
    index = CocoIndex.build(ann, tmp_path / "img", use_cache=False)
    for red, boxes in (({100}, False), (set(), False), ({100}, True)):
        picture = _draw_annotations(index, 0, red, boxes=boxes).astype(np.int64)
        colour = RED if red else GREEN
        for x, y in ((60, 60), (20, 60), (60, 20)):  # the hypotenuse's and the legs' middles
            assert np.abs(picture[y, x] - colour).max() < 30, (red, boxes, x, y, picture[y, x])
        corner = picture[100, 100]  # the box's corner, away from the triangle: drawn only with boxes
        assert np.abs(corner - (colour if boxes else COLOURS[0])).max() < (30 if boxes else 1), (red, boxes, corner)

def test_the_report_page_puts_each_picture_beside_its_caption(tmp_path: Path) -> None:
    def card(title: str, value: int) -> Card:
        return Card(title, f"detail {title}", np.full((20, 30, 3), (value, 255 - value, value // 2), np.uint8))

    samples = [(card(f"raw {k}", 30 * k), card(f"built {k}", 30 * k + 10)) for k in range(3)]
    report = Report(title="t <&>", facts=["a", "b"], samples=samples,
                    gallery={"crowd": [card("c0", 200), card("c1", 220)], "clipped": [Card("text", "why")]},
                    reasons={"crowd": "crowd means", "clipped": "clipped means"},
                    label_picture=np.full((10, 10, 3), (1, 2, 250), np.uint8))
    page = write_report(report, tmp_path)
    text = page.read_text()
    assert "<title>t &lt;&amp;&gt;</title>" in text and "<pre>a\nb</pre>" in text
    assert re.findall(r"<h3>(\w+) \((\d+) shown\)</h3><p>([^<]*)</p>", text) == [
        ("crowd", "2", "crowd means"), ("clipped", "1", "clipped means")]
    assert '<div class="text">no picture</div><figcaption><b>text</b>why' in text
    expected = {f"raw {k}": 30 * k for k in range(3)} | {f"built {k}": 30 * k + 10 for k in range(3)} | {
        "c0": 200, "c1": 220}
    figures = _figures(page)
    assert [t for _, t, _ in figures] == [t for k in range(3) for t in (f"raw {k}", f"built {k}")] + ["c0", "c1"]
    for src, title, detail in figures:
        value = expected[title]
        assert detail == f"detail {title}"
        assert np.abs(_read(page.parent / src) - (value, 255 - value, value // 2)).max() < 4, title
    assert (_read(tmp_path / "images" / "labels.png") == (1, 2, 250)).all()


def test_written_pictures_keep_their_colours(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)
    assert (_read(write_picture(tmp_path / "a" / "x.png", rgb)) == rgb).all()  # PNG: lossless, RGB kept
    flat = np.zeros((32, 48, 3), np.uint8)
    flat[:, :16], flat[:, 16:32], flat[:, 32:] = (250, 10, 10), (10, 250, 10), (10, 10, 250)
    back = _read(write_picture(tmp_path / "x.jpg", flat))
    assert np.abs(back - flat)[:, [2, 3, 20, 24, 40, 44]].max() < 6  # JPEG: red stays red, not blue


def _batch(counts: list[int], size: int = 32, stride: int = 4) -> DetectionBatch:
    """A batch whose every value says where it came from (image index, instance index)."""
    n, b = sum(counts), len(counts)
    grid = size // stride
    masks = torch.zeros(n, grid, grid, dtype=torch.bool)
    for k in range(n):
        masks[k, k % grid, : k % grid + 1] = True
    return DetectionBatch(
        images=torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 3, size, size) * 40 + 10,
        boxes=torch.arange(n * 4, dtype=torch.float32).view(n, 4), labels=torch.arange(n) % 3, masks=masks,
        boxes_per_image=torch.tensor(counts), image_ids=torch.arange(b) + 100, annotation_ids=torch.arange(n) + 1000,
        ignore_masks=torch.arange(b).view(b, 1, 1).expand(b, grid, grid) % 2 == 1, scales=torch.arange(b) + 0.5,
        pads=torch.arange(b * 2, dtype=torch.float32).view(b, 2), orig_sizes=torch.arange(b * 2).view(b, 2) + 50,
        mask_stride=stride, origins=torch.arange(n, dtype=torch.uint8) % 3)


def test_the_host_copy_keeps_the_first_images_with_their_own_targets() -> None:
    batch = _batch([2, 0, 3, 1])
    for m, n in ((1, 2), (2, 2), (3, 5), (4, 6)):
        copy = host_copy(batch, m)
        assert copy.boxes_per_image.tolist() == [2, 0, 3, 1][:m]
        for name in ("images", "image_ids", "ignore_masks", "scales", "pads", "orig_sizes"):
            assert torch.equal(getattr(copy, name), getattr(batch, name)[:m]), name
        for name in ("boxes", "labels", "masks", "annotation_ids", "origins"):
            assert torch.equal(getattr(copy, name), getattr(batch, name)[:n]), name


def test_predictions_are_drawn_on_their_own_image_at_the_letterboxed_place() -> None:
    # two 64 x 64 canvases of 128 x 96 originals at scale 0.5, pads (left, top) (0, 8) and (4, 0)
    canvas = torch.stack([torch.full((3, 64, 64), 0.0) + torch.tensor([200.0, 60, 20]).view(3, 1, 1),
                          torch.full((3, 64, 64), 0.0) + torch.tensor([20.0, 90, 210]).view(3, 1, 1)])
    batch = DetectionBatch(images=canvas, boxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long),
                           masks=torch.zeros(0, 16, 16, dtype=torch.bool), boxes_per_image=torch.tensor([0, 0]),
                           image_ids=torch.tensor([7, 9]), annotation_ids=torch.zeros(0, dtype=torch.long),
                           ignore_masks=torch.zeros(2, 16, 16, dtype=torch.bool), scales=torch.tensor([0.5, 0.5]),
                           pads=torch.tensor([[0.0, 8.0], [4.0, 0.0]]), orig_sizes=torch.tensor([[96, 128]] * 2))

    def result(image_id: int, x: int, y: int, side: int, score: float) -> dict:
        mask = np.zeros((96, 128), np.uint8, order="F")
        mask[y : y + side, x : x + side] = 1
        return {"image_id": image_id, "category_id": 3, "bbox": [x, y, side, side], "score": score,
                "segmentation": mask_utils.encode(mask)}

    results = [result(7, 16, 56, 32, 0.6), result(7, 80, 8, 40, 0.9), result(9, 40, 40, 56, 0.8),
               result(9, 0, 0, 24, 0.1)]  # the last scores below min_score: not drawn
    grid = canvas_predictions(batch, results, NAMES, min_score=0.25).astype(np.int64)
    assert grid.shape == (64, 128, 3)
    palette = _palette(2)
    # each image's entries on its own tile, best score first (palette 0), at x * 0.5 + left, y * 0.5 + top
    expected = [(0, [((40, 12, 20), palette[0]), ((8, 36, 16), palette[1])]), (1, [((24, 20, 28), _palette(1)[0])])]
    for i, drawn in expected:
        tile, colour = grid[:, 64 * i : 64 * (i + 1)], np.asarray(COLOURS[i])
        squares = [square for square, _ in drawn]
        drawn_at = _square_mask((64, 64), squares, grow=1)
        for x, y, side in squares:  # "cat 0.90" is written from the box's corner on
            drawn_at[max(y - 1, 0) : y + 14, max(x - 1, 0) : x + side + 50] = True
        assert np.abs(tile[~drawn_at] - colour).max() == 0  # nothing else drawn
        for (x, y, side), pal in drawn:
            interior = np.median(tile[y + 2 : y + side - 2, x + 2 : x + side - 2].reshape(-1, 3), axis=0)
            assert np.abs(interior - _blend(COLOURS[i], pal)).max() <= 1, (i, x, y)  # the label aside
            assert np.abs(tile[y + side // 2, x] - pal).max() < 40  # the box's edge


def _texts(ax: object) -> list[str]:
    return [t.get_text() for t in ax.texts]  # type: ignore[attr-defined]


def test_the_label_figure_shows_the_counts(tmp_path: Path) -> None:
    ann = _write_split(tmp_path)
    stats = label_stats("val", CocoIndex.build(ann, tmp_path / "img", use_cache=False))
    figure = label_figure(stats)
    classes, sizes, per_image = figure.axes[:3]
    assert [p.get_height() for p in classes.patches] == [4, 2]  # cat 4, dog 2
    assert [t.get_text() for t in classes.get_xticklabels()] == ["cat", "dog"]
    assert classes.get_title() == "instances per class (2 of 2 classes present)"
    # areas 1600 1024 576 2304 576 400: small 3 (below 32²), medium 3
    assert [p.get_height() for p in sizes.patches] == [3, 3, 0]
    assert _texts(sizes) == ["3 (50%)", "3 (50%)", "0 (0%)"]
    assert [p.get_height() for p in per_image.patches] == [0, 1, 1, 1]  # images with 0, 1, 2, 3 instances
    assert [p.get_x() + p.get_width() / 2 for p in per_image.patches] == [0, 1, 2, 3]  # each bar over its count
    assert per_image.get_title() == "instances per image (0 backgrounds of 3)"
    assert figure.get_suptitle() == "val: 3 images, 6 instances, 0 crowd regions"


def test_the_results_figures_draw_their_numbers() -> None:
    series = {"train/loss": [(0, 3.0), (5, 2.0)], "val/AP": [(0, 0.1), (1, 0.3)], "empty": []}
    figure = results_figure(series, {"train/loss": "step", "val/AP": "epoch"})
    assert [ax.get_title() for ax in figure.axes] == ["train/loss", "val/AP"]
    assert [ax.get_xlabel() for ax in figure.axes] == ["step", "epoch"]
    for ax, name in zip(figure.axes, ["train/loss", "val/AP"]):
        line = ax.lines[0]
        assert line.get_xdata().tolist() == [x for x, _ in series[name]]
        assert line.get_ydata().tolist() == [y for _, y in series[name]]

    matrix = np.array([[3, 1, 0], [0, 2, 2], [1, 0, 0]])
    figure = confusion_figure(matrix, ["cat", "dog"])
    ax = figure.axes[0]
    shares = np.asarray(ax.images[0].get_array())
    np.testing.assert_allclose(shares, (matrix / matrix.sum(axis=1, keepdims=True)).T)  # [predicted, true]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cat", "dog", "background"]
    assert {(t.get_position(), t.get_text()) for t in ax.texts} == {
        ((0, 0), "0.75"), ((0, 1), "0.25"), ((1, 1), "0.50"), ((1, 2), "0.50"), ((2, 0), "1.00")}
    assert ax.get_title().endswith("(score >= 0.25, box IoU >= 0.45; 9 counted)")

    precision = -np.ones((10, 101, 3, 4, 3))
    precision[0, :, 0, 0, -1] = np.linspace(1.0, 0.5, 101)  # cat
    precision[0, :, 2, 0, -1] = 0.25  # bird; dog has no ground truth
    precision[1:] = 0.0  # other IoUs, areas and detection limits: not drawn
    ax = pr_figure(precision, ["cat", "dog", "bird"], "box").axes[0]
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["cat 0.750", "bird 0.250", "all classes 0.500 AP50"]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.linspace(1.0, 0.5, 101))
    np.testing.assert_allclose(ax.lines[2].get_ydata(), (np.linspace(1.0, 0.5, 101) + 0.25) / 2)
    assert ax.get_title() == "box precision-recall at IoU 0.5 (2 classes with ground truth)"


def test_results_entries_belong_to_their_images() -> None:
    from seg_datamodule.evaluation.predictions import CocoDetections
    from seg_datamodule.pictures.validation import _results_entries

    dets = CocoDetections(image_ids=torch.tensor([7, 9, 4]), dets_per_image=torch.tensor([2, 0, 1]),
                          category_ids=torch.tensor([3, 5, 3]), scores=torch.tensor([0.9, 0.5, 0.7]),
                          boxes=torch.tensor([[0.0, 0, 4, 4], [1, 1, 2, 2], [3, 3, 5, 5]]),
                          rle_lengths=torch.zeros(3, dtype=torch.int64), rle_bytes=torch.zeros(0, dtype=torch.uint8))
    entries = _results_entries(dets, {7: (10, 10), 9: (10, 10), 4: (10, 10)})
    assert [(e["image_id"], e["category_id"], e["bbox"]) for e in entries] == [
        (7, 3, [0.0, 0, 4, 4]), (7, 5, [1, 1, 2, 2]), (4, 3, [3, 3, 5, 5])]
    assert [e["score"] for e in entries] == pytest.approx([0.9, 0.5, 0.7])
    assert all("segmentation" not in e for e in entries)


class _Writer:
    """A PictureWriter that keeps what it is given: ``(name, draw, step)``."""

    def __init__(self, folder: Path, trainer: object) -> None:
        self.submitted: list[tuple[str, object, int]] = []

    def submit(self, name: str, draw: object, step: int = 0) -> None:
        self.submitted.append((name, draw, step))


def test_fit_pictures_draw_each_split_and_each_batch_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from seg_datamodule.pictures import FitPictures, figure_rgb
    from seg_datamodule.pictures import callback
    from seg_datamodule.visualize import batch_grid

    monkeypatch.setattr(callback, "run_folder", lambda trainer: tmp_path)
    monkeypatch.setattr(callback, "PictureWriter", _Writer)
    train = CocoIndex.build(_write_split(tmp_path / "a"), tmp_path / "a" / "img", use_cache=False)
    val = CocoIndex.build(_write_split(tmp_path / "b", crowd_and_box_only=True), tmp_path / "b" / "img",
                          use_cache=False, box_only="keep")  # a crowd region more than train
    sources = SimpleNamespace(train_index=train, val_index=val)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(class_names=["cat", "dog"], sources=sources), global_step=3)
    pictures = FitPictures(batches=2, max_images=3)
    pictures.on_fit_start(trainer, None)  # type: ignore[arg-type]
    batches = [_batch([2, 0, 3, 1]), _batch([1, 1, 1, 1]), _batch([0, 2, 0, 2])]
    for k, batch in enumerate(batches):
        pictures.on_train_batch_start(trainer, None, batch, 5 + k)  # type: ignore[arg-type]  # as a resumed fit
    submitted = pictures._writer.submitted  # type: ignore[union-attr]
    assert [(name, step) for name, _, step in submitted] == [
        ("labels_train.png", 3), ("labels_val.png", 3), ("train_batch0.jpg", 3), ("train_batch1.jpg", 3)]
    for (_, draw, _), split, index in zip(submitted, ("train", "val"), (train, val)):
        assert np.array_equal(draw(), figure_rgb(label_figure(label_stats(split, index)))), split
    for (_, draw, _), batch in zip(submitted[2:], batches):
        assert np.array_equal(draw(), batch_grid(host_copy(batch, 3), 3, 4, ["cat", "dog"]))


def test_val_pictures_draw_the_batch_with_its_labels_and_predictions(tmp_path: Path) -> None:
    import dataclasses
    from types import SimpleNamespace

    from seg_datamodule.evaluation.coco_eval import load_coco
    from seg_datamodule.evaluation.predictions import CocoDetections
    from seg_datamodule.pictures import ValPictures
    from seg_datamodule.visualize import batch_grid

    coco = load_coco(_write_split(tmp_path))
    dets = CocoDetections(image_ids=torch.tensor([10, 12]), dets_per_image=torch.tensor([1, 1]),
                          category_ids=torch.tensor([5, 3]), scores=torch.tensor([0.9, 0.3]),
                          boxes=torch.tensor([[4.0, 4, 16, 12], [8, 8, 8, 8]]),
                          rle_lengths=torch.zeros(2, dtype=torch.int64), rle_bytes=torch.zeros(0, dtype=torch.uint8))
    # the metric's class order is not the names' order: label 0 is dog
    metric = SimpleNamespace(detections=lambda: dets, coco=coco, category_ids=[5, 3])
    batch = dataclasses.replace(_batch([2, 0, 3, 1]), image_ids=torch.tensor([10, 11, 12, 11]))
    pictures = ValPictures(max_images=3, min_score=0.5)
    pictures._writer = _Writer(tmp_path, None)  # type: ignore[assignment]
    trainer = SimpleNamespace(sanity_checking=False, global_step=7)
    pictures._validation_batch(trainer, SimpleNamespace(coco_metric=metric), batch, 0, 0)  # type: ignore[arg-type]
    (labels_name, labels_draw, step), (pred_name, pred_draw, _) = pictures._writer.submitted  # type: ignore[union-attr]
    assert (labels_name, pred_name, step) == ("val_batch0_labels.jpg", "val_batch0_pred.jpg", 7)
    host = host_copy(batch, 3)
    assert np.array_equal(labels_draw(), batch_grid(host, 3, 4, ["dog", "cat"]))
    entries = [{"image_id": 10, "category_id": 5, "score": 0.9, "bbox": [4.0, 4, 16, 12]}]
    expected = canvas_predictions(host, entries, NAMES, 0.5, 3)
    assert np.array_equal(pred_draw(), expected)
    assert not np.array_equal(expected, canvas_predictions(host, [], NAMES, 0.5, 3))  # the entry is drawn
