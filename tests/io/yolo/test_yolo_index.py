"""An Ultralytics split as a CocoIndex: ids, pixels, counts, the cache (and Ultralytics' pickled cache never
opened), turned photos, the COCO ground truth it scores against."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from _yolo_cases import SQUARE, TRIANGLE, make_dataset, write_image
from seg_datamodule.io.images.ids import ImageIdClashError, stable_image_id
from seg_datamodule.io.images.decode import BadImageError, decode_image_with_size
from seg_datamodule.io.yolo import BadLabelError, build_yolo_index, ground_truth


def test_the_index_of_a_split(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"000000000042.jpg": f"{TRIANGLE}\n{SQUARE}\n", "IMG_7.jpg": SQUARE,
                                   "background.jpg": None, "empty.jpg": "\n", "7.jpg": f"{SQUARE}\n1 .5 .5 .1 .1\n"})
    index = build_yolo_index(yaml, "train", cache_dir=tmp_path / "cache", box_only="drop")
    assert [index.file_name(i) for i in range(len(index))] == ["000000000042.jpg", "7.jpg", "IMG_7.jpg",
                                                               "background.jpg", "empty.jpg"]
    assert index.image_ids.tolist() == [42, 7, stable_image_id("IMG_7.jpg"), stable_image_id("background.jpg"),
                                        stable_image_id("empty.jpg")]
    assert index.category_ids.tolist() == [0, 1] and index.class_names == ["a", "b"]
    assert index.instance_counts.tolist() == [2, 1, 1, 0, 0]
    assert np.concatenate([index.annotation_ids(i) for i in range(5)]).tolist() == [1, 2, 3, 4]
    assert index.image_size(0) == (40, 60) and (index.orientations == 1).all()
    # Normalised to the 60 x 40 image: x * 60, y * 40.
    np.testing.assert_allclose(index.polygons(0).instance(1)[0], [[36, 24], [54, 24], [54, 36], [36, 36]])
    np.testing.assert_allclose(index.bboxes(0), [[6, 4, 24, 16], [36, 24, 18, 12]])
    assert index.dropped_counts["box_only"] == 1 and index.skip_counts == {}
    assert index.source_counts == {"image_label_missing": 1, "image_label_empty": 1, "image_box_only": 1}
    assert index.ann_file == yaml and index.image_root == tmp_path / "images" / "train"
    assert pickle.loads(pickle.dumps(index)) == index
    assert index.load_image(0).shape == (40, 60, 3)


def test_two_files_with_one_id_are_refused(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"7.jpg": TRIANGLE, "007.jpg": SQUARE})
    with pytest.raises(ImageIdClashError, match="'007.jpg' and '7.jpg' would both have image id 7"):
        build_yolo_index(yaml, "train", use_cache=False)


def test_the_cache_is_keyed_on_labels_and_images(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"a.jpg": TRIANGLE, "b.jpg": SQUARE})
    cache = tmp_path / "cache"
    first = build_yolo_index(yaml, "train", cache_dir=cache)
    warm = build_yolo_index(yaml, "train", cache_dir=cache)
    assert not first.from_cache and warm.from_cache and warm == first and warm.cache_path == first.cache_path
    assert build_yolo_index(yaml, "train", cache_dir=cache, on_bad_sample="skip").from_cache  # one cache for both
    label = tmp_path / "labels/train/b.txt"
    label.write_text(SQUARE.replace("1 ", "0 ", 1))  # the same size, new content
    changed = build_yolo_index(yaml, "train", cache_dir=cache)
    assert not changed.from_cache and changed.labels(1).tolist() == [0]
    time.sleep(0.01)
    image = tmp_path / "images/train/a.jpg"
    write_image(tmp_path / "new.jpg", (50, 60))
    os.replace(tmp_path / "new.jpg", image)  # an image replaced by a new file (an export, rsync, git)
    assert build_yolo_index(yaml, "train", cache_dir=cache).image_size(0) == (50, 60)
    # Rewritten in place (same inode, not stat'ed at start): the index keeps the size it read,
    # and the changed size stops at decoding, named, as for a COCO file's image.
    inode = image.stat().st_ino
    write_image(image, (70, 40))
    assert image.stat().st_ino == inode
    stale = build_yolo_index(yaml, "train", cache_dir=cache)
    assert stale.from_cache and stale.image_size(0) == (50, 60)
    with pytest.raises(BadImageError, match="70x40") as caught:
        decode_image_with_size(image, expected_size=stale.image_size(0))
    assert caught.value.reason == "image_size_mismatch"
    label.unlink()  # now a background
    assert build_yolo_index(yaml, "train", cache_dir=cache).source_counts == {"image_label_missing": 1}



def test_a_listed_split_is_keyed_on_its_images_and_labels(tmp_path: Path) -> None:
    """A split given as a .txt list: an image replaced by a new file, or a label edited, rebuilds."""
    make_dataset(tmp_path, {"a.jpg": TRIANGLE, "b.jpg": SQUARE})
    (tmp_path / "train.txt").write_text("images/train/a.jpg\nimages/train/b.jpg\n")
    yaml = tmp_path / "list.yaml"
    yaml.write_text(f"path: {tmp_path}\ntrain: train.txt\nnames: [a, b]\n")
    cache = tmp_path / "cache"
    assert not build_yolo_index(yaml, "train", cache_dir=cache).from_cache
    assert build_yolo_index(yaml, "train", cache_dir=cache).from_cache
    write_image(tmp_path / "new.jpg", (50, 60))
    os.replace(tmp_path / "new.jpg", tmp_path / "images/train/b.jpg")
    replaced = build_yolo_index(yaml, "train", cache_dir=cache)
    assert not replaced.from_cache and replaced.image_size(1) == (50, 60)
    (tmp_path / "labels/train/a.txt").write_text(TRIANGLE.replace("0 ", "1 ", 1))
    edited = build_yolo_index(yaml, "train", cache_dir=cache)
    assert not edited.from_cache and edited.labels(0).tolist() == [1]

def test_a_cache_built_in_skip_mode_raises_in_raise_mode(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"a.jpg": f"{TRIANGLE}\n5 0 0 1 0 1 1\n"})
    cache = tmp_path / "cache"
    assert build_yolo_index(yaml, "train", cache_dir=cache, on_bad_sample="skip").skip_counts == {"label_bad_class": 1}
    with pytest.raises(BadLabelError, match=r"a.txt:2: class 5 is not an integer in 0..1"):
        build_yolo_index(yaml, "train", cache_dir=cache)


def test_ultralytics_label_cache_is_never_opened(tmp_path: Path) -> None:
    """Ultralytics' ``labels/<split>.cache`` is a pickle (np.load with allow_pickle): planted, it is never opened."""
    yaml = make_dataset(tmp_path, {"a.jpg": TRIANGLE})
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):  # what unpickling the file would run
            return (os.mkdir, (str(marker),))

    planted = [tmp_path / "labels" / "train.cache", tmp_path / "labels" / "train" / "labels.cache",
               tmp_path / "labels.cache"]
    for path in planted:
        with open(path, "wb") as f:
            np.save(f, np.array([Payload()], dtype=object), allow_pickle=True)
    opened: list[str] = []
    watching = [True]

    def audit(event: str, args: tuple) -> None:
        if watching[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)  # stays for the process; inert once ``watching`` is cleared
    try:
        index = build_yolo_index(yaml, "train", cache_dir=tmp_path / "cache")
    finally:
        watching[0] = False
    assert index.num_instances == 1 and any(p.endswith("a.txt") for p in opened)  # the hook saw the reads
    assert not [p for p in opened if p.endswith(".cache")] and not marker.exists()
    # The plant is live: loading it as Ultralytics does (np.load, allow_pickle=True) runs the payload.
    np.load(planted[0], allow_pickle=True)
    assert marker.exists()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_a_turned_photo_is_indexed_and_decoded_as_shown(tmp_path: Path, orientation: int) -> None:
    yaml = make_dataset(tmp_path, {"a.jpg": TRIANGLE})
    path = tmp_path / "images/train/a.jpg"
    write_image(path, (40, 60), orientation=orientation)  # stored 40 x 60
    index = build_yolo_index(yaml, "train", use_cache=False, verify_images=True)
    shown = (60, 40) if orientation in (6, 8) else (40, 60)
    assert index.image_size(0) == shown and index.orientations.tolist() == [orientation]
    # Normalised coordinates are scaled by the size as shown.
    np.testing.assert_allclose(index.polygons(0).vertices[1], [0.5 * shown[1], 0.1 * shown[0]])
    from PIL import Image, ImageOps

    reference = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    np.testing.assert_array_equal(index.load_image(0), reference)
    if int(cv2.__version__.split(".")[0]) >= 5:  # as Ultralytics' loader (cv2.imdecode) decodes it
        np.testing.assert_array_equal(index.load_image(0), cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB))
    assert index.load_image(0, reduce=4).shape == (-(-shown[0] // 4), -(-shown[1] // 4), 3)


def test_the_ground_truth_scores_itself_perfectly(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"1.jpg": f"{TRIANGLE}\n{SQUARE}\n", "2.jpg": SQUARE, "3.jpg": None})
    index = build_yolo_index(yaml, "train", cache_dir=tmp_path / "cache")
    path = ground_truth(index, tmp_path / "cache")
    assert path.parent == tmp_path / "cache" / "ground_truth" and path.name.startswith("data-")
    assert ground_truth(index, tmp_path / "cache") == path  # the same content, the same file
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
        assert sorted(gt.getImgIds()) == [1, 2, 3] and len(gt.anns) == 3
        results = [{"image_id": a["image_id"], "category_id": a["category_id"], "segmentation": gt.annToRLE(a),
                    "bbox": a["bbox"], "score": 1.0} for a in gt.anns.values()]
        for iou_type in ("segm", "bbox"):
            evaluator = COCOeval(gt, gt.loadRes(results), iou_type)
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
            assert evaluator.stats[0] == pytest.approx(1.0)
    other = ground_truth(index, use_cache=False)
    assert other.read_bytes() == path.read_bytes() and other.parent != path.parent


def test_chunks_of_any_size_give_the_same_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seg_datamodule.io.yolo import index as index_module

    labels = {f"{k}.jpg": f"{TRIANGLE}\n{SQUARE}\n" if k % 3 else None for k in range(7)}
    labels["5.jpg"] = f"{TRIANGLE}\n9 0 0 1 0 1 1\n1 .5 .5 .1 .1\n"
    yaml = make_dataset(tmp_path, labels)
    whole = build_yolo_index(yaml, "train", use_cache=False, on_bad_sample="skip", box_only="drop")
    monkeypatch.setattr(index_module, "_CHUNK_IMAGES", 2)
    chunked = build_yolo_index(yaml, "train", use_cache=False, on_bad_sample="skip", box_only="drop")
    assert chunked == whole and chunked.skip_counts == {"label_bad_class": 1}
    assert chunked.source_counts == whole.source_counts == {"image_label_missing": 3, "image_box_only": 1}
    assert chunked.dropped_counts["box_only"] == 1 and chunked.num_instances == 7
    monkeypatch.setattr(index_module, "_CHUNK_IMAGES", 3)
    with pytest.raises(BadLabelError, match=r"5.txt:2: class 9"):
        build_yolo_index(yaml, "train", use_cache=False)
