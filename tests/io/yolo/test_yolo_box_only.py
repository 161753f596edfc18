"""``box_only`` on an Ultralytics split (issue 41): box lines dropped and counted, or kept as
instances without a ring whose box is the line's, denormalised."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _yolo_cases import SQUARE, TRIANGLE, make_dataset
from seg_datamodule.io.yolo import build_yolo_index


def test_box_lines_are_dropped_or_kept_and_counted(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"a.jpg": f"{TRIANGLE}\n1 .5 .5 .2 .4\n{SQUARE}\n", "b.jpg": "0 .25 .5 .5 1\n",
                                   "c.jpg": SQUARE})
    cache = tmp_path / "cache"
    drop = build_yolo_index(yaml, "train", cache_dir=cache, box_only="drop")
    keep = build_yolo_index(yaml, "train", cache_dir=cache, box_only="keep")
    images = build_yolo_index(yaml, "train", cache_dir=cache, box_only="drop_images")
    assert keep.from_cache and images.from_cache
    lines = 5
    assert (drop.num_instances, drop.dropped_counts["box_only"]) == (3, 2)
    # drop_images: only c.jpg is left; a.jpg's two polygons are counted with its image.
    assert [images.file_name(i) for i in range(len(images))] == ["c.jpg"]
    assert {k: images.dropped_counts[k] for k in ("box_only", "annotation_of_box_only_image", "image_box_only_dropped")} \
        == {"box_only": 2, "annotation_of_box_only_image": 2, "image_box_only_dropped": 2}
    assert (keep.num_instances, keep.dropped_counts["box_only"]) == (5, 0)
    for index in (drop, keep):
        assert index.num_instances + index.dropped_counts["box_only"] == lines and index.skip_counts == {}
    # Polygons keep their ids (1..3, as without box lines); box lines come after, without a ring.
    assert np.concatenate([drop.annotation_ids(i) for i in range(3)]).tolist() == [1, 2, 3]
    assert keep.annotation_ids(0).tolist() == [1, 2, 4] and keep.annotation_ids(1).tolist() == [5]
    assert np.diff(keep.polygons(0).instance_offsets).tolist() == [1, 1, 0]
    assert keep.labels(0).tolist() == [0, 1, 1] and keep.labels(1).tolist() == [0]
    # cx cy w h normalised on the 40 x 60 (H x W) image -> [x, y, w, h] in pixels.
    np.testing.assert_allclose(keep.bboxes(0)[2], [(0.5 - 0.1) * 60, (0.5 - 0.2) * 40, 0.2 * 60, 0.4 * 40])
    np.testing.assert_allclose(keep.bboxes(1)[0], [0, 0, 30, 40])
