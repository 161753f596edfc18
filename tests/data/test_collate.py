"""collate_detection: shapes, order, boxes, crowd, shared memory, real DataLoader workers."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from _reference import reference_rasterize
from seg_datamodule import DetectionBatch, DetectionCollate, Polygons, Sample, collate_detection


def make_sample(image_id: int, instances: list, size: tuple[int, int] = (37, 50), *, seed: int = 0,
                boxes: np.ndarray | None = None, crowd: np.ndarray | None = None) -> Sample:
    rng = np.random.default_rng(seed)
    vertices, ring_offsets, instance_offsets = Polygons.from_instances(instances).arrays
    n = len(instances)
    return Sample(
        image=rng.integers(0, 256, (*size, 3), dtype=np.uint8),
        image_id=image_id,
        polygons=Polygons(vertices, ring_offsets, instance_offsets),
        labels=np.arange(n, dtype=np.int64) + image_id,
        annotation_ids=np.arange(n, dtype=np.int64) + 1000 * image_id,
        boxes=boxes,
        crowd_mask=crowd,
    )


def random_instances(rng: np.random.Generator, n: int, size: tuple[int, int]) -> list:
    h, w = size
    return [[rng.uniform(-5, max(h, w) + 5, (rng.integers(3, 9), 2)) for _ in range(rng.integers(1, 3))]
            for _ in range(n)]


def make_samples(seed: int = 0, counts=(3, 0, 5, 1), size=(37, 50)) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [make_sample(i, random_instances(rng, n, size), size, seed=i) for i, n in enumerate(counts)]


def test_shapes_dtypes_and_order():
    samples = make_samples()
    batch = collate_detection(samples, mask_stride=4)
    assert isinstance(batch, DetectionBatch)
    assert batch.images.shape == (4, 3, 37, 50) and batch.images.dtype == torch.uint8
    assert batch.masks.shape == (9, 10, 13) and batch.masks.dtype == torch.bool
    assert batch.boxes.shape == (9, 4) and batch.boxes.dtype == torch.float32
    assert batch.labels.dtype == torch.int64 and batch.boxes_per_image.tolist() == [3, 0, 5, 1]
    assert batch.image_ids.tolist() == [0, 1, 2, 3]
    assert batch.ignore_masks.shape == (4, 10, 13) and not batch.ignore_masks.any()
    assert batch.orig_sizes.tolist() == [[37, 50]] * 4
    for b, (sample, masks) in enumerate(zip(samples, batch.split_masks())):
        instances = [[sample.polygons.vertices[sample.polygons.ring_offsets[r]:sample.polygons.ring_offsets[r + 1]]
                      for r in range(sample.polygons.instance_offsets[n], sample.polygons.instance_offsets[n + 1])]
                     for n in range(sample.num_instances)]
        np.testing.assert_array_equal(masks.numpy(), reference_rasterize(instances, (37, 50), 4))
        np.testing.assert_array_equal(batch.images[b].permute(1, 2, 0).numpy(), sample.image)
    # labels are arange(n) + image_id per sample: [0, 1, 2] + [] + [2, 3, 4, 5, 6] + [3]
    assert batch.labels.tolist() == [0, 1, 2, 2, 3, 4, 5, 6, 3]
    np.testing.assert_array_equal(batch.annotation_ids.numpy(), np.concatenate([s.annotation_ids for s in samples]))


def test_batch_without_any_instance():
    batch = collate_detection([make_sample(7, []), make_sample(8, [])], mask_stride=4)
    assert batch.masks.shape == (0, 10, 13)
    assert batch.boxes.shape == (0, 4) and batch.labels.shape == (0,)
    assert batch.boxes_per_image.tolist() == [0, 0]
    assert [m.shape[0] for m in batch.split_masks()] == [0, 0]


def test_boxes_are_taken_or_derived_by_exact_clip():
    # Canvas 20 x 20. Boxes are worked out by hand from the visible part of each polygon.
    # A triangle leaving the canvas along a slanted edge: visible part (0,0) (20,0) (20,20) (0,20)
    # cut by x + y <= 40, i.e. the whole canvas: box [0, 0, 20, 20].
    tri = [[[0, 0], [40, 0], [0, 40]]]
    # The tip (20, 40) lies below the canvas. The edges (10,0)-(20,40) (x = 10 + y / 4) and
    # (20,40)-(0,0) (x = y / 2) leave through y = 20 at x = 15 and x = 10: the visible part is
    # (0,0) (10,0) (15,20) (10,20), box [0, 0, 15, 20]. Clamping the tip to (20, 20) would give
    # [0, 0, 20, 20]: the box must come from the clip, not from clamped vertices.
    tip = [[[0, 0], [10, 0], [20, 40]]]
    # Two vertices outside on different sides, edges crossing a corner region diagonally:
    # (5,5) (30,10) (10,30). Edge (5,5)-(30,10) (y = 4 + x / 5) leaves x = 20 at y = 8;
    # edge (30,10)-(10,30) (x + y = 40) passes the corner (20, 20); edge (10,30)-(5,5)
    # (x = 4 + y / 5) leaves y = 20 at x = 8. Visible: (5,5) (20,8) (20,20) (8,20): box
    # [5, 5, 20, 20] (clamping happens to give the same box here).
    corner = [[[5, 5], [30, 10], [10, 30]]]
    # Entirely outside: nothing visible, a zero-size box (clamping gives the point (20, 20)).
    outside = [[[25, 2], [40, 2], [30, 12]]]
    given = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], np.float32)
    # Samples of one instance and of none around them: each derives its own boxes.
    batch = collate_detection([make_sample(0, [tri, tip, corner, outside], (20, 20)),
                               make_sample(1, [tri, tip, corner, outside], (20, 20), boxes=given),
                               make_sample(2, [], (20, 20)),
                               make_sample(3, [tip], (20, 20))],
                              mask_stride=4)
    boxes = batch.boxes.numpy()
    assert boxes.shape == (9, 4)
    np.testing.assert_allclose(boxes[:3], [[0, 0, 20, 20], [0, 0, 15, 20], [5, 5, 20, 20]], atol=1e-5)
    assert boxes[3, 2] - boxes[3, 0] == 0 and boxes[3, 3] - boxes[3, 1] == 0
    np.testing.assert_array_equal(boxes[4:8], given)
    np.testing.assert_allclose(boxes[8], [0, 0, 15, 20], atol=1e-5)
    # Every mask cell (reference rasteriser, stride 1) lies in its derived box.
    masks = reference_rasterize([[np.asarray(r, float) for r in inst] for inst in (tri, tip, corner)], (20, 20), 1)
    for mask, (x0, y0, x1, y1) in zip(masks, boxes):
        ys, xs = np.nonzero(mask)
        assert x0 <= xs.min() + 0.5 and xs.max() + 0.5 <= x1 and y0 <= ys.min() + 0.5 and ys.max() + 0.5 <= y1


def test_crowd_regions_sampled_at_cell_centres():
    crowd = np.zeros((37, 50), bool)
    crowd[8:16, 4:12] = True  # centres (j + 0.5) * 4 = 2, 6, 10, ...: rows 2, 3 and columns 1, 2 inside
    batch = collate_detection([make_sample(0, [], crowd=crowd), make_sample(1, [])], mask_stride=4)
    want = np.zeros((10, 13), bool)
    want[2:4, 1:3] = True
    np.testing.assert_array_equal(batch.ignore_masks[0].numpy(), want)
    assert not batch.ignore_masks[1].any()
    # Odd canvas sizes: the last cell centre can fall outside the image (never inside a crowd).
    crowd = np.ones((5, 5), bool)
    batch = collate_detection([make_sample(0, [], (5, 5), crowd=crowd)], mask_stride=4)
    np.testing.assert_array_equal(batch.ignore_masks[0].numpy(), [[True, False], [False, False]])


@settings(max_examples=60, deadline=None)
@given(stride=st.integers(1, 8), size=st.tuples(st.integers(1, 41), st.integers(1, 41)),
       rects=st.lists(st.tuples(st.integers(-3, 44), st.integers(-3, 44), st.integers(0, 20), st.integers(0, 20)),
                      min_size=1, max_size=3))
def test_crowd_regions_off_the_stride_grid_are_sampled_at_cell_centres(stride, size, rects):
    # Crowd rectangles at any pixel offset (not multiples of the stride). Reference, from the
    # geometry alone: pixels x0..x1-1 cover [x0, x1), so cell (i, j) is ignored iff its centre
    # ((j + 0.5) s, (i + 0.5) s) lies in [x0, x1) x [y0, y1) of some rectangle.
    h, w = size
    crowd = np.zeros((h, w), bool)
    hp, wp = -(-h // stride), -(-w // stride)
    cx, cy = (np.arange(wp) + 0.5) * stride, (np.arange(hp) + 0.5) * stride
    want = np.zeros((hp, wp), bool)
    for x0, y0, dw, dh in rects:
        x1, y1 = min(x0 + dw, w), min(y0 + dh, h)
        x0, y0 = max(x0, 0), max(y0, 0)
        if x0 < x1 and y0 < y1:
            crowd[y0:y1, x0:x1] = True
            want |= ((cy >= y0) & (cy < y1))[:, None] & ((cx >= x0) & (cx < x1))[None, :]
    batch = collate_detection([make_sample(0, [], size, crowd=crowd), make_sample(1, [], size)], mask_stride=stride)
    np.testing.assert_array_equal(batch.ignore_masks[0].numpy(), want)
    assert not batch.ignore_masks[1].any()


def test_letterbox_metadata_is_carried():
    s = dataclasses.replace(make_sample(3, []), scale=0.5, pad=(4.0, 2.0), orig_size=(74, 100))
    batch = collate_detection([s])
    assert batch.scales.tolist() == [0.5] and batch.pads.tolist() == [[4.0, 2.0]]
    assert batch.orig_sizes.tolist() == [[74, 100]]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="empty batch"):
        collate_detection([])
    with pytest.raises(ValueError, match="image id 1: canvas \\(20, 20\\) differs"):
        collate_detection([make_sample(0, []), make_sample(1, [], (20, 20))])
    bad = dataclasses.replace(make_sample(5, [[[[0, 0], [4, 0], [4, 4]]]]), labels=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="image id 5: 1 instances but 3 labels"):
        collate_detection([bad])
    with pytest.raises(ValueError, match="mask_stride must be >= 1, got 0"):
        DetectionCollate(mask_stride=0)


def test_shared_memory_outputs_and_zero_fill():
    batch = DetectionCollate(mask_stride=4, shared_memory=True)(make_samples())
    assert batch.masks.is_shared() and batch.images.is_shared() and batch.ignore_masks.is_shared()
    np.testing.assert_array_equal(batch.masks.numpy(), collate_detection(make_samples()).masks.numpy())
    # shared_memory=None (the default): private memory outside a DataLoader worker.
    private = DetectionCollate(mask_stride=4)(make_samples())
    assert not private.masks.is_shared() and not private.images.is_shared()


def test_defaults_are_stride_4_and_channels_last():
    samples = make_samples()  # 37 x 50 canvases: stride 4 gives 10 x 13 cells
    for batch in (DetectionCollate()(samples), collate_detection(samples)):
        assert batch.mask_stride == 4 and batch.masks.shape[1:] == (10, 13)
        assert batch.images.is_contiguous(memory_format=torch.channels_last)
        assert not batch.images.is_contiguous()


def test_samples_collate_and_batches_pickle():
    samples = make_samples()
    collate = DetectionCollate(mask_stride=8)
    again = pickle.loads(pickle.dumps(collate))
    assert again.mask_stride == 8
    restored = pickle.loads(pickle.dumps(samples))
    np.testing.assert_array_equal(restored[2].polygons.vertices, samples[2].polygons.vertices)
    batch = pickle.loads(pickle.dumps(collate(samples)))
    assert batch.masks.shape[1:] == (5, 7)


def test_lightning_moves_the_batch_to_a_device():
    from lightning.pytorch.utilities import move_data_to_device

    batch = collate_detection(make_samples())
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert isinstance(moved, DetectionBatch)
    assert torch.equal(moved.masks, batch.masks) and moved.mask_stride == 4


@pytest.mark.needs("cuda")  # pinning needs an accelerator
def test_pin_memory_keeps_the_batch_type():
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned = pin_memory(collate_detection(make_samples()))
    assert isinstance(pinned, DetectionBatch) and pinned.masks.is_pinned()


class _SampleDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Sample:
        rng = np.random.default_rng(i)
        return make_sample(i, random_instances(rng, i % 4, (64, 48)), (64, 48), seed=i)


class _SharedInWorker(DetectionCollate):
    """Reports whether the batch was built in shared memory, before the hand-over moves it there."""

    def __call__(self, samples):  # type: ignore[override]
        batch = super().__call__(samples)
        return batch, batch.masks.is_shared(), batch.images.is_shared(), batch.ignore_masks.is_shared()


def test_default_collate_allocates_in_shared_memory_inside_workers():
    loader = DataLoader(_SampleDataset(6), batch_size=3, num_workers=1, collate_fn=_SharedInWorker(mask_stride=4))
    flags = [tuple(item[1:]) for item in loader]
    assert flags == [(True, True, True)] * 2


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_in_real_dataloader_workers_with_pin_memory():
    dataset = _SampleDataset(12)
    loader = DataLoader(dataset, batch_size=5, num_workers=2, pin_memory=True,
                        collate_fn=DetectionCollate(mask_stride=4))
    seen = []
    for batch in loader:
        assert isinstance(batch, DetectionBatch)
        assert batch.masks.shape[1:] == (16, 12)
        for image_id, masks in zip(batch.image_ids.tolist(), batch.split_masks()):
            sample = dataset[image_id]
            want = collate_detection([sample]).masks
            assert torch.equal(masks, want), f"image {image_id}"
            seen.append(image_id)
    assert seen == list(range(12))


@pytest.mark.parametrize("shared", [False, True])
def test_image_memory_formats_hold_the_same_pixels(shared):
    samples = make_samples()
    last = DetectionCollate(mask_stride=4, shared_memory=shared)(samples).images
    plain = DetectionCollate(mask_stride=4, shared_memory=shared, channels_last=False)(samples).images
    assert last.shape == plain.shape == (4, 3, 37, 50)
    assert last.is_contiguous(memory_format=torch.channels_last) and plain.is_contiguous()
    assert torch.equal(last, plain)
    assert last.is_shared() == plain.is_shared() == shared
    # It survives the trip between processes with its strides.
    again = pickle.loads(pickle.dumps(last))
    assert again.stride() == last.stride() and torch.equal(again, last)
    with pytest.raises(TypeError, match="channels_last must be a bool"):
        DetectionCollate(channels_last=1)


@pytest.mark.parametrize("layout", ["contiguous", "flipped view", "cropped view", "fortran"])
def test_channel_first_images_equal_numpy_transpose_for_any_sample_layout(layout):
    # The planes are written by cv2.split; numpy's transposing copy is the reference.
    samples = []
    for sample in make_samples():
        big = np.random.default_rng(sample.image_id).integers(0, 256, (45, 60, 3), dtype=np.uint8)
        image = {"contiguous": big[:37, :50].copy(), "flipped view": big[:37, 50:0:-1],
                 "cropped view": big[3:40, 5:55], "fortran": np.asfortranarray(big[:37, :50])}[layout]
        samples.append(dataclasses.replace(sample, image=image))
    plain = DetectionCollate(mask_stride=4, shared_memory=False, channels_last=False)(samples).images
    expected = np.stack([s.image.transpose(2, 0, 1) for s in samples])
    assert plain.is_contiguous() and np.array_equal(plain.numpy(), expected)
