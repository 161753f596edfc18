"""Repeat-factor sampling: factors against a hand-computed case and Detectron2's formula, the epoch
draw against its expectation, and the sampler's determinism, sharding and resume."""

from __future__ import annotations

import collections
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from _datasets import make_dataset
from seg_datamodule import DetectionCollate, EpochShardSampler, SegDataset
from seg_datamodule.data.loaders.arguments import worker_init_fn
from seg_datamodule.data.loaders.repeat_factors import (category_frequencies, describe_repeat_factors, draw_repeats,
                                                image_repeat_factors, repeat_factor_summary)
from seg_datamodule.data.loaders.resume import ResumableDataLoader
from seg_datamodule.io.coco import CocoIndex
from _lvis import LVIS_VAL_100, load_json
from test_dataset import FakeIndex


def detectron2_repeat_factors(dataset_dicts: list[dict], repeat_thresh: float) -> list[float]:
    """Detectron2's ``RepeatFactorTrainingSampler.repeat_factors_from_category_frequency``, as
    written there (an independent oracle, over dataset dicts)."""
    category_freq: dict[int, float] = collections.defaultdict(int)
    for dataset_dict in dataset_dicts:
        cat_ids = {ann["category_id"] for ann in dataset_dict["annotations"]}
        for cat_id in cat_ids:
            category_freq[cat_id] += 1
    num_images = len(dataset_dicts)
    for k, v in category_freq.items():
        category_freq[k] = v / num_images
    category_rep = {cat_id: max(1.0, math.sqrt(repeat_thresh / cat_freq)) for cat_id, cat_freq in category_freq.items()}
    rep_factors = []
    for dataset_dict in dataset_dicts:
        cat_ids = {ann["category_id"] for ann in dataset_dict["annotations"]}
        rep_factors.append(max({category_rep[cat_id] for cat_id in cat_ids}, default=1.0))
    return rep_factors


def test_a_hand_computed_case() -> None:
    # 10 images, 3 categories: A in images 0-8 (f = 0.9), B in image 0 only (f = 0.1), C in
    # images 0-3 (f = 0.4); image 9 has no annotation. t = 0.9: r_A = 1, r_B = 3, r_C = 1.5;
    # the epoch: 3 + 3 * 1.5 + 6 * 1 = 13.5 samples expected, mean factor 1.35.
    pairs = [(i, 0) for i in range(9)] + [(0, 1)] + [(i, 2) for i in range(4)]
    images, labels = np.array(pairs).T
    assert np.allclose(category_frequencies(images, labels, 10, 3), [0.9, 0.1, 0.4])
    factors = image_repeat_factors(images, labels, 10, 3, 0.9)
    assert np.allclose(factors, [3.0, 1.5, 1.5, 1.5, 1, 1, 1, 1, 1, 1])
    assert np.allclose(image_repeat_factors(images, labels, 10, 3, 0.001), 1.0)
    summary = repeat_factor_summary(factors)
    assert summary == {"images": 10, "expected_epoch_samples": 13.5, "mean_factor": 1.35, "max_factor": 3.0,
                       "repeated_images": 4}
    assert "13.5 samples per epoch expected, 15 drawn this epoch; mean factor 1.3500" in describe_repeat_factors(
        factors, 0.9, 15)
    with pytest.raises(ValueError, match="threshold must be in"):
        image_repeat_factors(images, labels, 10, 3, 0.0)


def test_crowd_regions_count_like_annotations(tmp_path: Path) -> None:
    def ann(aid, iid, cid, crowd=0):
        seg = {"size": [20, 20], "counts": [10, 5, 385]} if crowd else [[1, 1, 8, 1, 8, 8]]
        return {"id": aid, "image_id": iid, "category_id": cid, "bbox": [1, 1, 7, 7], "area": 24.0,
                "segmentation": seg, "iscrowd": crowd}
    coco = {"images": [{"id": i, "file_name": f"{i}.jpg", "height": 20, "width": 20} for i in range(4)],
            "annotations": [ann(1, 0, 7), ann(2, 0, 7), ann(3, 1, 7), ann(4, 2, 9, crowd=1)],
            "categories": [{"id": 7, "name": "a"}, {"id": 9, "name": "b"}]}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    index = CocoIndex.build(tmp_path / "c.json", tmp_path, use_cache=False)
    images, labels = index.category_presence()
    assert list(zip(images.tolist(), labels.tolist())) == [(0, 0), (1, 0), (2, 1)]
    # f_a = 2/4, f_b = 1/4; t = 1: r_a = sqrt(2), r_b = 2; image 3 has nothing.
    assert np.allclose(image_repeat_factors(images, labels, 4, 2, 1.0), [math.sqrt(2), math.sqrt(2), 2.0, 1.0])


@pytest.fixture(scope="module")
def lvis_index(tmp_path_factory: pytest.TempPathFactory) -> CocoIndex:
    return CocoIndex.build(LVIS_VAL_100, tmp_path_factory.mktemp("img"), use_cache=False)


@pytest.mark.parametrize("threshold", [0.001, 0.02, 0.05, 0.3])
def test_lvis_val_100_factors_are_detectron2s(lvis_index: CocoIndex, threshold: float) -> None:
    data = load_json()
    dicts = [{"annotations": [a for a in data["annotations"] if a["image_id"] == img["id"]]} for img in data["images"]]
    want = detectron2_repeat_factors(dicts, threshold)
    order = [lvis_index.index_of_image_id(img["id"]) for img in data["images"]]
    got = image_repeat_factors(*lvis_index.category_presence(), len(lvis_index), lvis_index.num_classes, threshold)
    assert np.allclose(got[order], want, rtol=0, atol=1e-12)


def test_epoch_composition_follows_the_factors(lvis_index: CocoIndex) -> None:
    factors = image_repeat_factors(*lvis_index.category_presence(), len(lvis_index), lvis_index.num_classes, 0.05)
    assert factors.max() > 2 and (factors % 1 > 0).sum() > 10  # a case where the draw matters
    sampler = EpochShardSampler(range(len(factors)), seed=5, repeat_factors=factors)
    epochs = 400
    counts = np.zeros((epochs, len(factors)))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        items = list(sampler)
        assert len(items) == len(sampler) and {e for e, _, _ in items} == {epoch}
        np.add.at(counts[epoch], [i for _, i, _ in items], 1)
        # Each copy of an image has its own number 0..k-1.
        copies = collections.defaultdict(list)
        for _, i, c in items:
            copies[i].append(c)
        assert all(sorted(c) == list(range(len(c))) for c in copies.values())
    assert ((counts == np.floor(factors)) | (counts == np.ceil(factors))).all()
    # Detectron2's expectation per image: r_i (independent Bernoulli draws; 5 sigma).
    frac = factors - np.floor(factors)
    sigma = np.sqrt(frac * (1 - frac) / epochs)
    assert (np.abs(counts.mean(0) - factors) <= 5 * sigma + 1e-12).all()
    assert len({len(np.flatnonzero(c)) for c in counts}) == 1  # every image, every epoch
    assert len({c.sum() for c in counts}) > 1  # the epoch length follows the draw


def test_draw_is_a_pure_function_of_the_generator() -> None:
    factors = np.array([1.0, 1.5, 2.25, 3.0])
    a = draw_repeats(factors, np.random.default_rng(3))
    assert np.array_equal(a, draw_repeats(factors, np.random.default_rng(3)))
    assert a[0] == 1 and a[3] == 3 and a[1] in (1, 2) and a[2] in (2, 3)


def test_deterministic_from_seed_and_epoch_and_disjoint_across_ranks() -> None:
    factors = np.random.default_rng(0).uniform(1.0, 3.0, 37)
    whole = EpochShardSampler(range(37), seed=2, repeat_factors=factors)
    again = EpochShardSampler(range(37), seed=2, repeat_factors=factors)
    for s in (whole, again):
        s.set_epoch(4)
    assert list(whole) == list(again)
    other = EpochShardSampler(range(37), seed=2, repeat_factors=factors)
    other.set_epoch(5)
    assert list(other) != list(whole)
    total = len(whole)
    for ranks in (2, 3):
        shards = []
        for rank in range(ranks):
            s = EpochShardSampler(range(37), num_replicas=ranks, rank=rank, seed=2, repeat_factors=factors)
            s.set_epoch(4)
            shards.append(list(s))
        assert len({len(x) for x in shards}) == 1 and len(shards[0]) == -(-total // ranks)
        dealt = [item for group in zip(*shards) for item in group]
        assert dealt[:total] == list(whole)  # the same draw, dealt round-robin
        assert dealt[total:] == list(whole)[: len(dealt) - total]  # padded with its first items
        dropped = [list(EpochShardSampler(range(37), num_replicas=ranks, rank=r, seed=2, drop_last=True,
                                          repeat_factors=factors)) for r in range(ranks)]
        assert not set(dropped[0]) & set(dropped[1])


def test_bad_factors_are_refused() -> None:
    with pytest.raises(ValueError, match="repeat_factors must be 3 finite numbers >= 1"):
        EpochShardSampler(range(3), repeat_factors=[1.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="repeat_factors must be 3"):
        EpochShardSampler(range(3), repeat_factors=[1.0, 2.0])


def test_each_copy_is_augmented_from_its_own_generator() -> None:
    ds = make_dataset(FakeIndex(n=6), image_size=64, seed=3, mosaic=0.0)
    plain, first, second = ds[(0, 2)], ds[(0, 2, 0)], ds[(0, 2, 1)]
    assert np.array_equal(plain.image, first.image)
    assert not np.array_equal(first.image, second.image)


def _print(batch) -> tuple:
    digest = lambda t: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()  # noqa: E731
    return tuple(batch.image_ids.tolist()), digest(batch.images), digest(batch.masks)


def _loader(ds: SegDataset, factors: np.ndarray, workers: int) -> ResumableDataLoader:
    return ResumableDataLoader(ds, batch_size=4, sampler=EpochShardSampler(ds, seed=3, repeat_factors=factors),
                               num_workers=workers, collate_fn=DetectionCollate(mask_stride=4),
                               worker_init_fn=worker_init_fn if workers else None)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_resumes_mid_epoch_and_is_the_same_for_any_num_workers(workers: int) -> None:
    ds = make_dataset(FakeIndex(n=10), image_size=64, seed=3)
    factors = np.array([1.0, 2.5, 1.0, 1.0, 3.2, 1.0, 1.7, 1.0, 1.0, 1.0])
    straight = _loader(ds, factors, 0)
    want, lengths = [], []
    for epoch in (0, 1):
        straight.sampler.set_epoch(epoch)
        lengths.append(len(straight))
        want += [_print(b) for b in straight]
    assert lengths[0] != lengths[1] or len(want) == sum(lengths)
    first = _loader(ds, factors, workers)
    it = iter(first)
    got = [_print(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["epoch_batches"] == lengths[0]
    del it
    resumed = _loader(ds, factors, workers)
    resumed.load_state_dict(state)
    assert len(resumed) == lengths[0]  # the resumed epoch's length, before any iter()
    got += [_print(b) for b in resumed]
    resumed.sampler.set_epoch(1)
    assert len(resumed) == lengths[1]
    got += [_print(b) for b in resumed]
    assert got == want
    # A state drawn with other factors is refused by name.
    other = _loader(ds, np.ones(10), 0)
    with pytest.raises(ValueError, match="repeat_factors"):
        other.load_state_dict(state)
