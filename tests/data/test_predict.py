"""Predict and test sources: folders of mixed images, image-info files, the letterbox they share with validation."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch

from _datasets import make_dataset
from seg_datamodule import BadImageError, COCOSegDataModule, COCOResultsWriter
from seg_datamodule.data.samples.predict import PredictDataset, SkippedImage, empty_batch
from seg_datamodule.evaluation import writer as writer_module
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.predict_source import images_from_index, list_image_folder, stable_image_id
from seg_datamodule.models import YolactLite

#: (relative path, (H, W), writer) of the good images of the mixed folder.
GOOD = {
    "a_color.jpg": (50, 70),
    "b_rgba.png": (33, 20),
    "sub/c_gray.png": (40, 41),
    "sub/deeper/d_gray.JPG": (61, 30),
    "e_bitmap.bmp": (17, 29),  # no JPEG / PNG header: its size comes from a full decode
}
BAD = {"sub/broken.jpg": "image_truncated", "zz_noise.png": "image_corrupt"}


def _mixed_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for name, (h, w) in GOOD.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if "gray" in name:
            pixels = rng.integers(0, 255, (h, w), dtype=np.uint8)
        elif "rgba" in name:
            pixels = rng.integers(0, 255, (h, w, 4), dtype=np.uint8)
        else:
            pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        ext = path.suffix.lower()
        ok, data = cv2.imencode(ext, pixels)
        assert ok
        path.write_bytes(data.tobytes())
    # Bad files: a JPEG cut in half, and noise named .png.
    jpeg = cv2.imencode(".jpg", rng.integers(0, 255, (30, 30, 3), dtype=np.uint8))[1].tobytes()
    (root / "sub" / "broken.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (root / "zz_noise.png").write_bytes(rng.integers(0, 255, 300, dtype=np.uint8).tobytes())
    (root / "notes.txt").write_text("not an image")
    return root


def _dm(tmp_path: Path, folder: Path, num_workers: int = 0, **kwargs) -> COCOSegDataModule:
    return COCOSegDataModule(predict_images=str(folder), image_size=64, batch_size=2, val_batch_size=3,
                             num_workers=num_workers, demo_dir=str(tmp_path / "demo"),
                             cache_dir=str(tmp_path / "cache"),
                             **kwargs)


def test_folder_listing_is_recursive_sorted_and_counts_other_files(tmp_path: Path) -> None:
    folder = _mixed_folder(tmp_path / "images")
    images = list_image_folder(folder)
    assert images.file_names == tuple(sorted([*GOOD, *BAD]))
    assert images.counts == {"files_ignored": 1}
    assert images.image_ids.tolist() == [stable_image_id(n) for n in images.file_names]
    assert len(set(images.image_ids.tolist())) == len(images) and (images.image_ids > 0).all()
    assert all(images.size(i) is None for i in range(len(images)))
    # An image keeps its id when the folder changes.
    (folder / "0_new.png").write_bytes(cv2.imencode(".png", np.zeros((5, 5), np.uint8))[1].tobytes())
    again = list_image_folder(folder)
    assert dict(zip(again.file_names, again.image_ids.tolist()))["a_color.jpg"] == stable_image_id("a_color.jpg")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        list_image_folder(folder / "a_color.jpg")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no image file"):
        list_image_folder(tmp_path / "empty")


def test_mixed_folder_predicts_with_right_sizes_and_counts_the_bad_file(tmp_path: Path) -> None:
    folder = _mixed_folder(tmp_path / "images")
    dm = _dm(tmp_path, folder, on_bad_sample="skip")
    dm.setup("predict")
    ids = {stable_image_id(n): n for n in [*GOOD, *BAD]}
    seen, counts = {}, {"predicted": 0, "image_corrupt": 0, "image_truncated": 0}
    for batch in dm.predict_dataloader():
        assert batch.boxes.shape == (0, 4) and batch.masks.shape[0] == 0 and batch.images.shape[1:] == (3, 64, 64)
        for key in counts:
            counts[key] += batch.counts[key]
        for image_id, size, scale, pad in zip(batch.image_ids.tolist(), batch.orig_sizes.tolist(),
                                              batch.scales.tolist(), batch.pads.tolist()):
            seen[ids[image_id]] = tuple(size)
            h, w = size
            assert scale == pytest.approx(min(64 / h, 64 / w))
            # Centred up to the layout's snapping: the image fills one side and fits the other.
            assert 0 <= pad[0] and pad[0] + w * scale <= 64 + 1e-3 and 0 <= pad[1] and pad[1] + h * scale <= 64 + 1e-3
            assert min(pad) < 1e-3 and abs(pad[0] - (64 - w * scale) / 2) < 1 and abs(pad[1] - (64 - h * scale) / 2) < 1
    assert seen == GOOD
    assert counts == {"predicted": len(GOOD), "image_corrupt": 1, "image_truncated": 1}

    dm_raise = _dm(tmp_path, folder)
    dm_raise.setup("predict")
    with pytest.raises(BadImageError, match="broken.jpg"):
        for _ in dm_raise.predict_dataloader():
            pass


def _demo_categories(demo_dir: Path) -> dict[str, str]:
    """The demo's training split, named for its categories (a folder to predict names none)."""
    return {"train_ann": str(demo_dir / "annotations" / "instances_train2017.json"),
            "train_images": str(demo_dir / "train2017")}


def test_predict_step_boxes_lie_inside_each_image(tmp_path: Path, demo_dir: Path) -> None:
    folder = _mixed_folder(tmp_path / "images")
    dm = _dm(tmp_path, folder, on_bad_sample="skip", **_demo_categories(demo_dir))
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4).eval()
    model.category_ids = dm.category_ids
    dm.setup("predict")
    with torch.no_grad():
        for batch in dm.predict_dataloader():
            dets = model.predict_step(batch, 0)
            assert dets.dets_per_image.tolist() == [1] * len(batch)  # one whole-image detection each
            for (h, w), box in zip(batch.orig_sizes.tolist(), dets.boxes.tolist()):
                x, y, bw, bh = box
                assert x >= 0 and y >= 0 and x + bw <= w + 1e-4 and y + bh <= h + 1e-4
                assert box == pytest.approx([0.0, 0.0, w, h], abs=1e-3)  # the image without its pad
            assert set(dets.category_ids.tolist()) <= set(dm.category_ids)
        # A batch whose every image was bad: no detections, no error.
        none = model.predict_step(empty_batch(64, 4, {"predicted": 0, "image_corrupt": 3}), 0)
        assert none.image_ids.numel() == 0 and none.scores.numel() == 0
    model.category_ids = None
    with pytest.raises(RuntimeError, match="predict_step needs category_ids"):
        model.predict_step(batch, 0)


def test_predict_canvas_is_the_validation_canvas(coco_mini: Path, tmp_path: Path) -> None:
    ann, root = coco_mini / "annotations" / "instances_val2017.json", coco_mini / "val2017"
    index = CocoIndex.build(ann, root, cache_dir=str(tmp_path / "cache"))
    val = make_dataset(index, image_size=320, train=False)
    from_json = PredictDataset(images_from_index(index, root, ann), image_size=320)
    folder = list_image_folder(root)
    from_folder = PredictDataset(folder, image_size=320)
    position = {name: i for i, name in enumerate(folder.file_names)}
    for i in sorted({0, len(index) // 2, len(index) - 1}):  # first, middle, last
        expected, a = val[i], from_json[i]
        b = from_folder[position[index.file_name(i)]]
        assert not isinstance(a, SkippedImage) and not isinstance(b, SkippedImage)
        assert a.image_id == expected.image_id == b.image_id  # a COCO file name's stem is its id
        for got in (a, b):
            assert np.array_equal(got.image, expected.image)
            assert (got.scale, got.pad, got.orig_size) == (expected.scale, expected.pad, expected.orig_size)


def test_image_info_json_as_test_and_predict_source(coco_mini: Path, tmp_path: Path) -> None:
    """COCO test-dev's shape: images and categories only."""
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    info = {"images": data["images"][:5], "categories": data["categories"]}
    ann = tmp_path / "image_info.json"
    ann.write_text(json.dumps(info))
    train = coco_mini / "annotations" / "instances_train2017.json"
    dm = COCOSegDataModule(train_ann=str(train), train_images=str(coco_mini / "train2017"),
                           test_ann=str(ann), test_images=str(coco_mini / "val2017"),
                           predict_images=str(coco_mini / "val2017"), predict_ann=str(ann),
                           image_size=96, val_batch_size=2, num_workers=0, cache_dir=str(tmp_path / "cache"))
    dm.setup("test")
    batches = list(dm.test_dataloader())
    assert sum(len(b) for b in batches) == 5 and all(b.labels.numel() == 0 for b in batches)
    dm.setup("predict")
    ids = [i for b in dm.predict_dataloader() for i in b.image_ids.tolist()]
    assert ids == [img["id"] for img in info["images"]]
    assert dm.skip_counts["test_index"] == {k: 0 for k in dm.skip_counts["test_index"]}

    other = dict(info, categories=info["categories"][:3])
    ann.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="category ids .* differ"):
        COCOSegDataModule(train_ann=str(train), train_images=str(coco_mini / "train2017"), test_ann=str(ann),
                          test_images=str(coco_mini / "val2017"), num_workers=0, use_cache=False).setup("test")
    with pytest.raises(ValueError, match="predict_ann needs predict_images"):
        COCOSegDataModule(predict_ann=str(ann))
    with pytest.raises(ValueError, match="give both test_ann and test_images"):
        COCOSegDataModule(test_ann=str(ann))


@pytest.mark.slow
def test_trainer_predict_writes_results_and_the_id_mapping(tmp_path: Path, demo_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _mixed_folder(tmp_path / "images")
    # Samples and counts cross from workers.
    dm = _dm(tmp_path, folder, num_workers=2, on_bad_sample="skip", **_demo_categories(demo_dir))
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    out = tmp_path / "out" / "results.json"
    printed: list[str] = []
    monkeypatch.setattr(writer_module, "rank_zero_info", printed.append)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[COCOResultsWriter(str(out))])
    assert trainer.predict(model, datamodule=dm, return_predictions=False) is None
    results = json.loads(out.read_text())
    images = json.loads((tmp_path / "out" / "results_images.json").read_text())
    by_name = {i["file_name"]: (i["height"], i["width"]) for i in images["images"]}
    assert by_name == GOOD and len(results) == len(GOOD)
    assert images["info"]["images_predicted"] == len(GOOD)
    assert images["info"]["images_skipped"] == {"image_corrupt": 1, "image_truncated": 1}
    # notes.txt: counted where the user looks, not only in the listing (issue 35).
    assert images["info"]["files_ignored"] == 1 and images["info"]["left_out_when_listing"] == {}
    assert len(printed) == 1 and "skipped 2 bad images" in printed[0] and "1 files ignored (not images)" in printed[0]
    assert [c["id"] for c in images["categories"]] == dm.category_ids
    assert {r["image_id"] for r in results} == {i["id"] for i in images["images"]}
