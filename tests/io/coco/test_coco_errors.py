"""Skip reasons, their summary line and the SkipCounter that carries them across workers."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

from _coco_cases import _build
from seg_datamodule.data.counts import SkipCounter
from seg_datamodule.io.coco import CocoIndex, format_skip_summary
from seg_datamodule.io.images.decode import BadImageError


class _LoadImages(torch.utils.data.Dataset):
    def __init__(self, index: CocoIndex, counter: SkipCounter | None = None) -> None:
        self.index, self.counter = index, counter

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> int:
        try:
            return int(self.index.load_image(i).shape[0])
        except BadImageError as err:
            if self.counter is None:
                raise
            self.counter.add_error(err)
            return -1




# --------------------------------------------------------------------------------------------
# SkipCounter


def test_skip_counter_basics() -> None:
    counter = SkipCounter()
    assert counter.counts() == {} and counter.total() == 0 and counter.summary() == "nothing skipped"
    counter.add("image_missing")
    counter.add("image_corrupt", 2)
    counter.add_error(BadImageError("x", reason="image_truncated"))
    counter.add_error(BadImageError("rebuilt from a message in the main process"))
    assert counter.counts() == {"image_missing": 1, "image_truncated": 1, "image_corrupt": 3}
    assert counter.total() == 5
    assert counter.summary() == "skipped 5 images (image_corrupt 3, image_missing 1, image_truncated 1)"
    with pytest.raises(ValueError, match="unknown skip reason 'polygon'"):
        counter.add("polygon")
    counter.reset()
    assert counter.counts() == {}
    with pytest.raises(ValueError, match="distinct strings"):
        SkipCounter(["a", "a"])


def test_skip_counter_pickled_outside_spawning_is_a_snapshot() -> None:
    counter = SkipCounter(["a", "b"])
    counter.add("b", 3)
    copied = copy.deepcopy(counter)
    loaded = pickle.loads(pickle.dumps(counter))
    copied.add("a")
    assert counter.counts() == {"b": 3}
    assert copied.counts() == {"a": 1, "b": 3} and loaded.counts() == {"b": 3}


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_skip_counter_counts_across_workers(image_dataset: Path, context: str) -> None:
    index = _build(image_dataset)
    index.file_path(1).unlink()
    index.file_path(2).write_bytes(b"garbage")
    counter = SkipCounter(context=torch.multiprocessing.get_context(context))
    dataset = torch.utils.data.ConcatDataset([_LoadImages(index, counter)] * 4)  # 12 items, 8 bad
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=context, collate_fn=list
    )
    heights = [h for batch in loader for h in batch]
    assert sorted(heights) == [-1] * 8 + [40] * 4
    assert counter.counts() == {"image_missing": 4, "image_corrupt": 4}


def test_format_skip_summary() -> None:
    assert format_skip_summary({}) == "nothing skipped"
    assert format_skip_summary({"zero_area": 1}) == "skipped 1 annotation (zero_area 1)"
    text = format_skip_summary({"image_missing": 2, "zero_area": 1, "bbox_invalid": 3, "image_corrupt": 0})
    assert text == "skipped 2 images (image_missing 2) and 4 annotations (bbox_invalid 3, zero_area 1)"


