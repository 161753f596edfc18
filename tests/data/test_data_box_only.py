"""Box-only targets in batches (issue 41, ``box_only: keep``): ``DetectionBatch.has_mask`` False,
an all-False mask row and the box of the original box mapped onto the canvas; the flag survives
mosaic, copy-paste and MixUp; every annotation is in a batch or counted; streamed records carry boxes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seg_datamodule import COCOSegDataModule
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.stream.records import check_record, record_from_index, record_polygons
from seg_datamodule.transforms.kernels.polygons import DROP_REASONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io" / "coco"))
from test_coco_box_only import strip_segmentations  # noqa: E402

S = 128


@pytest.fixture(scope="module")
def stripped(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[int], Path]:
    folder = tmp_path_factory.mktemp("box_only")
    ann, ids = strip_segmentations(coco_mini, folder / "val.json")
    return ann, ids, coco_mini / "val2017"


def _module(stripped: tuple[Path, set[int], Path], tmp_path: Path, **kwargs) -> COCOSegDataModule:
    ann, _, images = stripped
    return COCOSegDataModule(train_ann=str(ann), train_images=str(images), val_ann=str(ann), val_images=str(images),
                             image_size=S, batch_size=8, num_workers=0, persistent_workers=False,
                             cache_dir=str(tmp_path / "cache"), **kwargs)


def test_validation_box_only_targets_are_their_letterboxed_boxes(stripped, tmp_path: Path) -> None:
    ann, ids, _ = stripped
    by_id = {a["id"]: a for a in json.loads(ann.read_text())["annotations"]}
    dm = _module(stripped, tmp_path, box_only="keep")
    dm.setup("fit")
    seen, delivered = set(), 0
    for batch in dm.val_dataloader():
        assert batch.has_mask is not None and batch.has_mask.dtype == torch.bool
        assert batch.has_mask.shape == batch.labels.shape
        counts = batch.counts
        delivered += sum(counts.get(k, 0) for k in DROP_REASONS)
        assert counts.get("kept", 0) == len(batch.labels)
        image_of = torch.repeat_interleave(torch.arange(len(batch)), batch.boxes_per_image)
        for n, aid in enumerate(batch.annotation_ids.tolist()):
            assert bool(batch.has_mask[n]) == (aid not in ids)
            if aid not in ids:
                continue
            seen.add(aid)
            assert not batch.masks[n].any()
            # Reference: the JSON box, scaled and padded as the image was, clipped to the canvas.
            b = image_of[n]
            x, y, w, h = by_id[aid]["bbox"]
            scale, (px, py) = float(batch.scales[b]), batch.pads[b].tolist()
            ref = np.clip([x * scale + px, y * scale + py, (x + w) * scale + px, (y + h) * scale + py], 0, S)
            np.testing.assert_allclose(batch.boxes[n].numpy(), ref, atol=1e-3)
    index = dm.val_index if hasattr(dm, "val_index") else CocoIndex.build(ann, stripped[2], box_only="keep")
    assert seen == ids and delivered == index.num_instances


def test_drop_gives_no_flag_and_no_box_only_target(stripped, tmp_path: Path) -> None:
    _, ids, _ = stripped
    dm = _module(stripped, tmp_path, box_only="drop")
    dm.setup("fit")
    for _, batch in zip(range(2), dm.val_dataloader()):
        assert batch.has_mask is None and not set(batch.annotation_ids.tolist()) & ids


def test_the_flag_survives_mosaic_copy_paste_and_mixup(stripped, tmp_path: Path) -> None:
    _, ids, _ = stripped
    dm = _module(stripped, tmp_path, box_only="keep", mosaic=1.0, copy_paste=1.0, mixup=1.0, degrees=10.0)
    dm.setup("fit")
    origins_of_box_only: set[int] = set()
    totals = {"targets": 0, "counted": 0}
    for _, batch in zip(range(4), dm.train_dataloader()):
        assert batch.has_mask is not None and batch.origins is not None
        flags = batch.has_mask
        box_only = torch.tensor([aid in ids for aid in batch.annotation_ids.tolist()], dtype=torch.bool)
        # Pasted and mixed-in copies keep their id: a box-only one stays box-only.
        assert torch.equal(~flags, box_only)
        assert not batch.masks[~flags].any()
        boxes = batch.boxes[~flags]
        assert ((boxes >= 0) & (boxes <= S)).all() and (boxes[:, 2:] > boxes[:, :2]).all()
        origins_of_box_only.update(batch.origins[~flags].tolist())
        counts = batch.counts
        totals["targets"] += len(batch.labels)
        totals["counted"] += counts.get("kept", 0)
    assert origins_of_box_only >= {0, 1, 2}  # own, pasted by copy-paste, mixed in by MixUp
    assert totals["targets"] == totals["counted"]  # every target of a batch is counted kept


def test_streamed_records_carry_the_boxes(stripped) -> None:
    ann, ids, images = stripped
    index = CocoIndex.build(ann, images, use_cache=False, box_only="keep")
    for i in range(5):
        record = record_from_index(index, i, b"")
        check_record(record)
        np.testing.assert_array_equal(record["bboxes"].reshape(-1, 4), index.bboxes(i))
        rings = np.diff(record_polygons(record).instance_offsets) if len(record["labels"]) else np.zeros(0)
        assert ((rings == 0) == np.isin(record["annotation_ids"], list(ids))).all()
    bad = dict(record_from_index(index, 0, b""), bboxes=np.zeros(1))
    with pytest.raises(ValueError, match="bboxes"):
        check_record(bad)
