"""Copy-paste and MixUp as pure functions: pixels, occluded boxes and drops, traceable ids, draws."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from _reference import reference_rasterize
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.group.copy_paste import flipped_source, paste_instances, paste_mask, select_for_paste
from seg_datamodule.transforms.group.sample_mixing import SampleMixing
from seg_datamodule.transforms.group.mixup import mixup_samples


def _rect(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)


def _sample(rects: list[tuple[float, float, float, float]], canvas=(40, 50), first_id=100, colour=10,
            crowd: np.ndarray | None = None) -> Sample:
    polygons = Polygons.from_instances([[_rect(*r)] for r in rects])
    return Sample(image=np.full((*canvas, 3), colour, np.uint8), image_id=first_id, polygons=polygons,
                  labels=np.arange(len(rects), dtype=np.int64) % 3,
                  annotation_ids=first_id + np.arange(len(rects), dtype=np.int64),
                  boxes=polygons.boxes().astype(np.float32), crowd_mask=crowd)


def test_paste_mask_is_the_pixel_centres_of_the_union() -> None:
    tri = np.array([[2.3, 1.1], [30.7, 9.2], [12.5, 35.9]])
    polys = Polygons.from_instances([[tri], [_rect(20, 20, 44, 30)]])
    want = reference_rasterize([[tri], [_rect(20, 20, 44, 30)]], (40, 50), 1).any(axis=0)
    assert np.array_equal(paste_mask(polys, (40, 50)), want)
    assert not paste_mask(Polygons.empty(), (40, 50)).any()


def test_a_covered_instance_keeps_the_box_of_what_shows_and_a_buried_one_is_dropped() -> None:
    target = _sample([(0, 0, 20, 10), (30, 0, 40, 10), (0, 20, 10, 30), (45, 35, 48, 38)])
    # Covers the right 12 px of instance 0, all of instance 1 and nothing of instance 2.
    source = _sample([(8, 0, 42, 12)], first_id=900, colour=200)
    out, occluded = paste_instances(target, source, np.array([True]), min_area_ratio=0.1, min_box_size=2.0)
    assert occluded == 1
    assert out.annotation_ids.tolist() == [100, 102, 103, 900]  # 101 buried; the copy keeps its id
    assert out.origins.tolist() == [0, 0, 0, 1]
    np.testing.assert_array_equal(out.boxes[0], [0, 0, 8, 10])  # what stays visible
    np.testing.assert_array_equal(out.boxes[1:3], target.boxes[2:4])  # untouched: the same box
    np.testing.assert_array_equal(out.boxes[3], source.boxes[0])
    assert (out.image[:12, 8:42] == 200).all() and (out.image[12:, :] == 10).all()
    assert (target.image == 10).all()  # the target is left alone
    # Occluders: instance 0 lies under the pasted rectangle, the others under nothing.
    assert [len(out.occluders.instance(n)) for n in range(4)] == [1, 0, 0, 0]
    out.validate()


def test_the_threshold_is_relative_to_the_pixels_before_the_paste() -> None:
    target = _sample([(0, 0, 20, 10)])
    for covered_px, ratio, kept in ((17, 0.2, False), (16, 0.2, True), (19, 0.0, True), (20, 0.0, False)):
        source = _sample([(20 - covered_px, 0, 20, 10)], first_id=900)
        out, occluded = paste_instances(target, source, np.array([True]), min_area_ratio=ratio, min_box_size=0.0)
        assert (100 in out.annotation_ids.tolist()) == kept and occluded == (not kept), (covered_px, ratio)
    # A visible strip thinner than min_box_size goes too.
    out, occluded = paste_instances(target, _sample([(1, 0, 20, 10)], first_id=900), np.array([True]),
                                    min_area_ratio=0.0, min_box_size=2.0)
    assert occluded == 1


def test_crowd_regions_under_a_paste_are_no_longer_ignored() -> None:
    crowd = np.zeros((40, 50), bool)
    crowd[0:20, 0:20] = True
    out, _ = paste_instances(_sample([(30, 30, 40, 40)], crowd=crowd), _sample([(10, 10, 30, 30)], first_id=900),
                             np.array([True]), min_area_ratio=0.1, min_box_size=2.0)
    assert out.crowd_mask[:10, :20].all() and not out.crowd_mask[10:20, 10:20].any()


def test_flipped_source_mirrors_pixels_polygons_and_boxes() -> None:
    s = _sample([(2, 3, 9, 7)])
    s.image[3:7, 2:9] = 77
    f = flipped_source(s)
    assert np.array_equal(f.image, s.image[:, ::-1]) and (f.image[3:7, 41:48] == 77).all()
    np.testing.assert_array_equal(f.boxes[0], [41, 3, 48, 7])
    np.testing.assert_array_equal(f.polygons.boxes()[0], [41, 3, 48, 7])


def test_paste_argument_errors() -> None:
    with pytest.raises(ValueError, match="differs from the target"):
        paste_instances(_sample([(0, 0, 5, 5)]), _sample([(0, 0, 5, 5)], canvas=(30, 30)), np.array([True]),
                        min_area_ratio=0.1, min_box_size=2.0)
    with pytest.raises(ValueError, match="pick must be"):
        paste_instances(_sample([(0, 0, 5, 5)]), _sample([(0, 0, 5, 5)]), np.array([True, False]),
                        min_area_ratio=0.1, min_box_size=2.0)


def test_pasting_onto_an_empty_sample_and_pasting_nothing() -> None:
    empty = _sample([])
    out, occluded = paste_instances(empty, _sample([(0, 0, 5, 5)], first_id=900), np.array([True]),
                                    min_area_ratio=0.1, min_box_size=2.0)
    assert occluded == 0 and out.annotation_ids.tolist() == [900] and out.origins.tolist() == [1]
    same, occluded = paste_instances(_sample([(0, 0, 5, 5)]), _sample([(0, 0, 5, 5)], first_id=900),
                                     np.array([False]), min_area_ratio=0.1, min_box_size=2.0)
    assert occluded == 0 and same.annotation_ids.tolist() == [100] and (same.image == 10).all()


def test_select_for_paste_draws_a_non_empty_subset() -> None:
    rng = np.random.default_rng(0)
    sizes = [int(select_for_paste(rng, 5).sum()) for _ in range(400)]
    assert min(sizes) == 1 and max(sizes) == 5
    assert select_for_paste(rng, 0).shape == (0,)


def test_mixup_blends_pixels_and_keeps_both_sets_of_instances() -> None:
    crowd = np.zeros((40, 50), bool)
    crowd[0, 0] = True
    a, b = _sample([(0, 0, 5, 5)], colour=100, crowd=crowd), _sample([(10, 10, 20, 20), (1, 1, 3, 3)], first_id=500, colour=200)
    out = mixup_samples(a, b, 0.25)
    assert (out.image == cv2.addWeighted(a.image, 0.25, b.image, 0.75, 0.0)).all() and out.image[0, 0, 0] == 175
    assert out.annotation_ids.tolist() == [100, 500, 501] and out.origins.tolist() == [0, 2, 2]
    assert out.crowd_mask.sum() == 1 and out.occluders is None
    with pytest.raises(ValueError, match="ratio must be in"):
        mixup_samples(a, b, 1.5)


def test_mixing_draws_a_fixed_number_of_values_and_checks_its_arguments() -> None:
    for kwargs in (dict(copy_paste=0.5), dict(copy_paste=0.5, mixup=0.15), dict(mixup=1.0, copy_paste_mode="batch")):
        rng = np.random.default_rng(1)
        SampleMixing(**kwargs).draw(rng, 8)
        assert rng.random() == pytest.approx(_after_five_draws())
    draws = [SampleMixing(copy_paste=1.0, copy_paste_mode="batch", mixup=1.0).draw(np.random.default_rng(s), 4)
             for s in range(200)]
    assert {d.paste_shift for d in draws} == {d.mix_shift for d in draws} == {1, 2, 3}
    assert all(d.paste and d.mix for d in draws)
    assert 0.3 < min(d.ratio for d in draws) and max(d.ratio for d in draws) < 0.7  # Beta(32, 32)
    assert SampleMixing(copy_paste=1.0).draw(np.random.default_rng(0), 1).mix_shift == 0
    for kwargs, message in ((dict(copy_paste=1.5), "copy_paste"), (dict(mixup=-0.1), "mixup"),
                            (dict(copy_paste_mode="other"), "copy_paste_mode")):
        with pytest.raises(ValueError, match=message):
            SampleMixing(**kwargs)


def _after_five_draws() -> float:
    rng = np.random.default_rng(1)
    rng.random(4)
    rng.beta(32.0, 32.0)
    return float(rng.random())


def test_lvis_label_lists_follow_what_is_pasted_and_blended() -> None:
    """A pasted category is no longer verified absent; a blend is absent only where both images are."""
    from dataclasses import replace

    target = replace(_sample([(0, 0, 5, 5)]), neg_labels=np.array([1, 2, 7], np.int64),
                     not_exhaustive_labels=np.array([4], np.int64))
    source = replace(_sample([(10, 10, 20, 20), (30, 5, 40, 15)], first_id=500),  # labels 0 and 1
                     neg_labels=np.array([2, 5], np.int64), not_exhaustive_labels=np.array([6], np.int64))
    pasted, _ = paste_instances(target, source, np.array([False, True]), min_area_ratio=0.1, min_box_size=1)
    assert pasted.labels.tolist() == [0, 1]
    assert pasted.neg_labels.tolist() == [2, 7]  # label 1 is on the canvas now
    assert pasted.not_exhaustive_labels.tolist() == [4]
    blend = mixup_samples(target, source, 0.5)
    assert blend.neg_labels.tolist() == [2] and blend.not_exhaustive_labels.tolist() == [4, 6]
    plain = mixup_samples(_sample([(0, 0, 5, 5)]), _sample([(1, 1, 3, 3)]), 0.5)  # a COCO index: no lists
    assert plain.neg_labels is None and plain.not_exhaustive_labels is None
