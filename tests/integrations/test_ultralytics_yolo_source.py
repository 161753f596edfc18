"""Parity with Ultralytics' own ``YOLODataset`` on an Ultralytics dataset made of real images (coco-mini val).

The split is written here in Ultralytics' layout (``images/val2017`` linking coco-mini's JPEGs,
``labels/val2017/*.txt`` with one polygon line per non-crowd annotation), with three cases real
exports have: a background image (its label file removed), a box line among an image's polygons,
and a phone photo (a JPEG stored turned, with EXIF orientation 6). Ultralytics reads it with its
own dataset code in validation mode (letterbox to 640, ``rect=False``); this package reads it with
:func:`~seg_datamodule.io.yolo.build_yolo_index` and the DataModule (``dataset=``). Then:

* every image Ultralytics keeps has the same size (the turned one for the photo), the same
  classes in the same order, polygons equal to 1e-4 px and boxes to 1e-4 px once denormalised
  (Ultralytics holds float32 normalised numbers);
* the image with a box line: Ultralytics 8.4 drops the whole image ("labels mix segment and
  detection rows"); here, with ``box_only: drop``, its polygons are kept and the box line is counted
  as ``box_only`` (the default refuses the split; ``drop_images`` drops the image as Ultralytics does);
* the background image has no instance in either, and is counted as ``image_label_missing``;
* the letterboxed validation canvases are pixel-identical where the scale is 1 (the photo
  included), and one fixed YOLO11n-seg model gives the same box, class and DFL losses on a batch
  of ours and on Ultralytics' batch of the same images (the mask losses differ by how masks are
  rasterised, see ``test_ultralytics_parity.py``).
"""

from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pytest
import torch

from _yolo import rotate_with_exif, write_data_yaml, write_yolo_split
from seg_datamodule import COCOSegDataModule, collate_detection
from seg_datamodule.integrations import YOLOSegModule, to_ultralytics_batch

pytestmark = [pytest.mark.slow, pytest.mark.needs("ultralytics")]

SIZE = 640


@pytest.fixture(scope="module")
def split(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory):
    """(data.yaml, Ultralytics' dataset, the stems of the background, boxed and turned images)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset

    root = tmp_path_factory.mktemp("ultralytics-layout")
    names = write_yolo_split(coco_mini / "annotations/instances_val2017.json", coco_mini / "val2017", root, "val2017")
    from PIL import Image

    images = sorted((root / "images/val2017").iterdir())
    background, boxed = images[0].stem, images[1].stem
    (root / "labels/val2017" / f"{background}.txt").unlink()
    with open(root / "labels/val2017" / f"{boxed}.txt", "a") as f:
        f.write("0 0.5 0.5 0.2 0.3\n")

    def long_side(path: Path) -> int:
        with Image.open(path) as image:
            return max(image.size)

    # The photo: one letterboxed at scale 1 (640 px long), so its canvas is compared pixel for pixel.
    photo = next(p for p in images[2:]
                 if long_side(p) == SIZE and (root / "labels/val2017" / f"{p.stem}.txt").stat().st_size > 1)
    turned = photo.stem
    rotate_with_exif(photo.resolve(), photo, 6)
    yaml = write_data_yaml(root, names, val="images/val2017")
    cfg = get_cfg(overrides={"imgsz": SIZE, "mask_ratio": 4, "overlap_mask": False, "task": "segment",
                             "cache": False})
    data = {"names": dict(enumerate(names)), "nc": len(names), "channels": 3}
    dataset = build_yolo_dataset(cfg, str(root / "images/val2017"), batch=8, data=data, mode="val", rect=False,
                                 stride=32)
    return yaml, dataset, (background, boxed, turned)


def test_the_same_instances_as_ultralytics(split, coco_mini: Path) -> None:
    from seg_datamodule.io.yolo import build_yolo_index

    yaml, dataset, (background, boxed, turned) = split
    index = build_yolo_index(yaml, "val", use_cache=False, box_only="drop")
    theirs = {Path(label["im_file"]).stem: label for label in dataset.labels}
    ours = {Path(index.file_name(i)).stem: i for i in range(len(index))}
    assert set(ours) - set(theirs) == {boxed} and len(ours) == len(theirs) + 1  # Ultralytics drops the mixed image
    assert len(ours) == len(json.loads((coco_mini / "annotations/instances_val2017.json").read_text())["images"])
    assert index.dropped_counts["box_only"] == 1
    assert index.source_counts == {"image_label_missing": 1, "image_box_only": 1}
    assert len(index.labels(ours[boxed])) > 0
    polygon_error = box_error = 0.0
    for stem, label in theirs.items():
        i = ours[stem]
        height, width = label["shape"]
        assert index.image_size(i) == (height, width), stem
        assert label["cls"][:, 0].astype(int).tolist() == index.labels(i).tolist(), stem
        polygons = index.polygons(i)
        for n, segment in enumerate(label["segments"]):
            polygon_error = max(polygon_error, float(np.abs(segment.astype(np.float64) * [width, height]
                                                          - polygons.instance(n)[0]).max()))
        if len(label["bboxes"]):
            xywh = label["bboxes"].astype(np.float64) * [width, height, width, height]
            mine = index.bboxes(i)  # x, y, w, h
            centre = mine[:, :2] + mine[:, 2:] / 2
            box_error = max(box_error, float(np.abs(xywh - np.concatenate([centre, mine[:, 2:]], 1)).max()))
    assert polygon_error < 1e-4 and box_error < 1e-4
    assert theirs[turned]["shape"] == index.image_size(ours[turned]) and index.orientations[ours[turned]] == 6
    assert len(theirs[background]["cls"]) == 0 and len(index.labels(ours[background])) == 0
    print(f"\nparity: {len(theirs)} images, polygons within {polygon_error:.2e} px, boxes within {box_error:.2e} px")


def test_letterboxed_batches_and_their_losses_match(split, tmp_path: Path) -> None:
    from ultralytics.data.dataset import YOLODataset

    yaml, dataset, (_, _, turned) = split
    dm = COCOSegDataModule(dataset=str(yaml), train_split=None, test_split=None, image_size=SIZE, box_only="drop",
                           num_workers=0, use_cache=False)
    dm.setup("validate")
    ours = {str(Path(dm.val_index.file_name(i)).stem): dm.val_dataset[i] for i in range(len(dm.val_dataset))}
    theirs = {Path(dataset.im_files[k]).stem: k for k in range(len(dataset))}
    identical = 0
    for stem, k in theirs.items():
        sample = ours[stem]
        if sample.scale != 1.0:
            continue
        item = dataset[k]
        np.testing.assert_array_equal(item["img"].numpy().transpose(1, 2, 0), sample.image, err_msg=stem)
        identical += 1
    assert ours[turned].scale == 1.0 and identical > 50
    stems = [turned, *[s for s in theirs if s != turned and ours[s].scale == 1.0 and ours[s].num_instances][:3]]
    their_batch = YOLODataset.collate_fn([dataset[theirs[s]] for s in stems])
    their_batch["img"] = their_batch["img"].float() / 255  # what Ultralytics' trainer does first
    our_batch = collate_detection([ours[s] for s in stems], mask_stride=4)
    torch.manual_seed(0)
    module = YOLOSegModule(num_classes=80).eval()
    img = to_ultralytics_batch(our_batch)["img"]
    assert torch.equal(img, their_batch["img"])
    with torch.no_grad():
        outputs = module.model(img)
        _, mine = module.criterion()(outputs, to_ultralytics_batch(our_batch))
        _, other = module.criterion()(outputs, their_batch)
    for name in ("box_loss", "cls_loss", "dfl_loss"):
        torch.testing.assert_close(mine[name], other[name], rtol=1e-5, atol=1e-6, msg=name)
    print("\nparity losses (ours / Ultralytics): " + ", ".join(
        f"{k} {float(mine[k]):.6f} / {float(other[k]):.6f}" for k in ("box_loss", "cls_loss", "dfl_loss", "seg_loss")))
