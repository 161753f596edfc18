"""End-to-end train-loader throughput at real scale (nothing fits a cache): ours vs Ultralytics.

Dataset: COCO-sized data never fits a per-worker image cache, so the headline is measured on a
dataset too large to cache: coco-mini's 80 train images repeated through ``--images`` entries
(default 2,048, above the DataModule's auto-cache limit of 512) of a generated annotation file,
each entry its own image id, annotation ids and file name (a symlink to the real JPEG). The OS
page cache holds the 80 files for both sides alike, so this measures decoding and augmentation,
not the disk.

Ours: ``CocoIndex`` -> ``SegDataset`` (4-image mosaic, random affine, flip, a YOLO-recipe
albumentations pipeline, exact polygon clip) -> ``DetectionCollate`` (stride-4 masks), batch 32,
``cache_images=0`` (what the DataModule picks for a dataset this size), in three configurations:
``mosaic_partners="batch"`` (opt-in: partners are the batch's other images, each image
decoded once per batch) with YOLO's HSV jitter in the workers (``hsv``, ``hsv_on_device=False``,
after the albumentations steps, in Ultralytics' order), the same with the jitter moved to the
accelerator (``hsv_on_device=True``: the workers only draw the gains; the device step's own cost
is timed apart, below), and ``"uniform"`` partners (the default: over the dataset, four decodes per mosaic;
``--no-uniform`` leaves the uniform rows out). The decodes per output image are counted by the
dataset and printed. Two more rows (``--no-device-pixels`` leaves them out) are
``pixels_on_device`` (issue 53), partners from the batch and over the dataset: the workers ship
JPEG bytes and plans and make the targets, the device decodes, warps, flips and jitters (that step
is timed apart, below, like the HSV one). Their recipe has no albumentations steps (they need the
workers' pixels; Ultralytics' defaults run each with p=0.01). Their rows are the workers' cost,
which is what the issue's goal compares with Ultralytics' per-image CPU time.

The device step (:func:`~seg_datamodule.transforms.pixel.hsv.hsv_jitter_batch_` on one collated batch of
``--batch-size`` images) is timed on the CPU, one thread (an upper bound of what it costs on an
accelerator), and on CUDA when one is available (CUDA events, after a warm-up that builds its
tables), best of ``--device-repeat``.

Peer: Ultralytics' segmentation loader as it ships with ``cache=False`` (``imgsz=640,
mosaic=1.0, mask_ratio=4, overlap_mask=False``, batch 32, its default hyper-parameters), labels
converted from the same JSON by ``ultralytics.data.converter.convert_coco``; measured in the
same run when ``ultralytics`` is importable (install it outside the project environment, e.g.
``pip install --target /tmp/ultra --no-deps ultralytics`` and ``PYTHONPATH=/tmp/ultra``; it is
never a dependency). It draws mosaic partners from a buffer of recently decoded images
(``min(n, 8 * batch, 1000)`` per worker, so about one decode per output image) at the price of
batches that depend on worker timing; ours gets one decode per image from the batch instead, and
keeps the same batches for any number of workers.

What differs between the two, so the ratio is read right. Ultralytics resamples every polygon
to 1,000 points when it loads the labels (``segment_resamples``, more if a polygon already has
more vertices) and carries those points through mosaic and affine; ours keeps COCO's own
vertices, and rasterises exactly where it uses ``cv2.fillPoly`` (see ``bench_raster.py``). Its
``build_dataloader`` prefetches 4 batches per worker (``prefetch_factor=4``); ours uses the
DataLoader default of 2. In this timing loop, which takes batches as fast as they come, the
workers never wait for work with either depth; the deeper queue holds more memory and matters
when the consumer is bursty (a training step). ``overlap_mask=False`` is not Ultralytics'
default: by default it merges an image's instance masks into one index mask at stride 4, smaller
objects drawn over larger ones, so where objects overlap only one keeps the pixels. Per-instance
masks, one stride-4 mask per instance, are what ``DetectionCollate`` produces and a YOLACT-style
loss needs, so they are the like-for-like output; the merged mask is less work and gives
different targets.

Timing: after ``--warmup`` batches (worker start-up), images per second over ``--batches``
batches, best of ``--repeat`` runs, the contenders interleaved run by run (the machine may be
shared: the spread of the runs is printed). OpenCV is set to one thread in the main process too
(Ultralytics does this on import), and ``--breakdown`` splits our single-thread CPU time per
image into stages (read, decode, resize/warp, polygons, pixel steps, jitter, raster, collate,
...: :data:`STAGES`, each stage its own time only, printed as a table; CPU time, so other load
on the machine inflates it less than wall time).

Allocator: our loader keeps freed buffers in the process that builds samples (glibc's trim and
mmap thresholds, :mod:`seg_datamodule.data.batching.allocator`: its workers, or the main process with no
workers). ``--allocator kept`` (the default) sets it in this process before anything runs, so
every row built here, ours and Ultralytics' alike, and Ultralytics' workers (forked from here)
run with the same allocator: the ratios compare loaders, not allocator settings. ``--allocator
default`` leaves glibc as it ships here; ours still sets it in its own workers, as it does for a
user.

Decode only: the JPEG decodes our loader makes in ``--batches`` batches (the files and the DCT
reduction it chose for each, recorded on one thread) are decoded again from memory by a bare
``cv2.imdecode`` (BGR, no read, no colour conversion), one thread, best of ``max(--repeat, 3)``:
the floor for decoding these images at these sizes, printed as its own row in images/s and CPU
ms per image. Ours is printed as a percentage of it: images/s at ``workers=0``, and CPU time per
image in the single-thread table.

Copy-paste and MixUp (issue 21): with ``--copy-paste 0.5 --mixup 0.15`` (the defaults; 0 and 0
leave them out) a second pair of rows runs ours (``copy_paste_mode="flip"``, MixUp with another
sample of the batch) beside Ultralytics given the same ``copy_paste``, ``copy_paste_mode: flip``
and ``mixup`` values, and the single-thread CPU section prints each augmentation's extra cost per
image on both sides (each alone, then both, minus the plain recipe). What differs: Ultralytics'
``copy_paste`` is the fraction of the (non-overlapping) flipped instances pasted in every image,
ours the probability per image of pasting a random subset; its MixUp builds a whole second
mosaic for the partner (decodes included), ours blends in another sample of the batch.

Run: ``python benchmarks/bench_loader.py [--coco-mini PATH] [--images 2048] [--workers 0 2]
[--copy-paste 0.5] [--mixup 0.15] [--breakdown]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")

import albumentations as A
import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

from seg_datamodule.transforms.pixel.hsv import HSVJitter, hsv_jitter_batch_
from seg_datamodule.io.coco.index import CocoIndex
from seg_datamodule.data.batching.allocator import keep_freed_memory
from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.batching.device_pixels import make_pixels
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.data.loaders.arguments import worker_init_fn
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco-mini"


#: Ultralytics' default ``hsv_h, hsv_s, hsv_v``.
YOLO_HSV = (0.015, 0.7, 0.4)


def yolo_recipe() -> A.Compose:
    """Ultralytics' default albumentations steps (its HSV jitter runs after them: ``hsv``)."""
    return A.Compose([
        A.Blur(p=0.01),
        A.MedianBlur(p=0.01),
        A.ToGray(p=0.01),
        A.CLAHE(p=0.01),
    ])


def _batch_len(batch: Any) -> int:
    """Images in a batch: ours (``DetectionBatch``) or Ultralytics' (a dict with ``img``)."""
    return len(batch["img"]) if isinstance(batch, dict) else len(batch)


def _time_batches(batches: Iterator[Any], warmup: int, count: int) -> float:
    """Images per second over ``count`` batches after ``warmup`` batches.

    Counts the images each batch really holds: Ultralytics' loader ends each pass over the 80
    images with a batch of 16.
    """
    for _ in range(warmup):
        next(batches)
    images = 0
    start = time.perf_counter()
    for _ in range(count):
        images += _batch_len(next(batches))
    return images / (time.perf_counter() - start)


# ----------------------------------------------------------------------------- ours


def make_large_split(root: Path, work: Path, num_images: int, annotate_every: int = 1) -> tuple[Path, Path]:
    """coco-mini train repeated through ``num_images`` entries: a JSON and a folder of symlinks.

    Entry ``k`` is image ``k % 80`` of coco-mini under a new id, file name and annotation ids, so
    both loaders see ``num_images`` distinct images (pixels and instances repeat); only every
    ``annotate_every``-th entry keeps its annotations (a smaller JSON for very large splits).
    """
    data = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    images, anns = sorted(data["images"], key=lambda im: im["id"]), data["annotations"]
    by_image: dict[int, list[dict]] = defaultdict(list)
    for ann in anns:
        by_image[ann["image_id"]].append(ann)
    folder = work / "images" / "train2017"
    folder.mkdir(parents=True)
    out_images, out_anns = [], []
    for k in range(num_images):
        im = images[k % len(images)]
        name = f"{k:07d}_{im['file_name']}"
        (folder / name).symlink_to((root / "train2017" / im["file_name"]).resolve())
        out_images.append(dict(im, id=k + 1, file_name=name))
        for ann in by_image[im["id"]] if k % annotate_every == 0 else ():
            out_anns.append(dict(ann, id=len(out_anns) + 1, image_id=k + 1))
    ann_file = work / "annotations" / "instances_train2017.json"
    ann_file.parent.mkdir(parents=True)
    ann_file.write_text(json.dumps(dict(data, images=out_images, annotations=out_anns)))
    return ann_file, folder


def build_ours(ann_file: Path, images: Path, image_size: int, partners: str, hsv_on_device: bool,
               cache_dir: Path, copy_paste: float = 0.0, mixup: float = 0.0,
               pixels_on_device: bool = False) -> SegDataset:
    """Our dataset in one configuration (``pixels_on_device``: without the albumentations steps,
    which need the workers' pixels; Ultralytics' run each with p=0.01)."""
    index = CocoIndex.build(ann_file, images, cache_dir=cache_dir)
    augment = AugmentOptions(MosaicAffine(image_size=image_size), mosaic=1.0,
                             transforms=None if pixels_on_device else yolo_recipe(), mosaic_partners=partners,
                             hsv=HSVJitter(YOLO_HSV, on_device=hsv_on_device or pixels_on_device),
                             copy_paste=copy_paste, copy_paste_mode="flip", mixup=mixup,
                             pixels_on_device=pixels_on_device)
    return SegDataset(index, augment, cache_images=0, seed=0)


def measure_ours(ds: SegDataset, workers: int, batch_size: int, warmup: int, count: int) -> tuple[float, float]:
    """Images per second, and decodes per output image over the whole run (warm-up included)."""
    total = batch_size * (warmup + count)
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=RandomSampler(ds, num_samples=total, generator=torch.Generator().manual_seed(0)),
        num_workers=workers,
        collate_fn=DetectionCollate(mask_stride=4),
        worker_init_fn=worker_init_fn if workers else None,
    )
    ds.on_worker_start()
    ds.reset_counts()
    rate = _time_batches(iter(loader), warmup, count)
    counts = ds.decode_counts
    return rate, counts["decodes"] / max(counts["samples"], 1)


#: The stages of ``--breakdown``: stage -> the functions it times, as ``"module:attribute.path"``.
#: A function imported with ``from m import f`` is looked up in its caller's module at call time,
#: so it is wrapped there (``seg_datamodule.io.coco.image_checks:read_image_view``, not the module
#: that defines it). When modules move, retarget them here, in one place.
STAGES: dict[str, tuple[str, ...]] = {
    "read (open, fstat, readv)": ("seg_datamodule.io.coco.image_checks:read_image_view",),
    "decode (libjpeg, to RGB)": ("seg_datamodule.io.coco.image_checks:decode_oriented",),
    "load_image (paths, size checks)": ("seg_datamodule.io.coco.index:CocoIndex.load_image",),
    "crowd RLE decode": ("seg_datamodule.io.coco.index:CocoIndex.crowd_mask",),
    "resize/warp (one resample per tile)": ("seg_datamodule.data.samples.pipeline:warp_tiles",),
    "polygons (clip, map, clip, drops)": ("seg_datamodule.data.samples.pipeline:transform_polygons",
                                          "seg_datamodule.data.samples.pipeline:transform_polygons_batch",
                                          "seg_datamodule.data.samples.pipeline:drop_reasons"),
    "pixel steps (albumentations)": ("seg_datamodule.transforms.pixel.albu:AlbumentationsTransform.apply",),
    "jitter (HSV: cvtColor x2, LUT)": ("seg_datamodule.transforms.pixel.hsv:hsv_jitter",),
    "raster (stride-4 masks)": ("seg_datamodule.data.batching.collate:rasterize_flat",
                                "seg_datamodule.data.batching.collate:rasterize_visible"),
    "collate (boxes, stack)": ("seg_datamodule.data.batching.collate:DetectionCollate.__call__",),
}


def _resolve(target: str) -> tuple[Any, str]:
    """``"module:A.b"`` -> (the object holding ``b``, ``"b"``)."""
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


@contextlib.contextmanager
def stage_timer(stages: dict[str, tuple[str, ...]] = STAGES) -> Iterator[dict[str, float]]:
    """Time our stages in this thread by wrapping the functions the dataset calls.

    Each stage gets its own CPU time only: a wrapped function called inside another (the raster
    inside the collate, the read inside ``load_image``) is taken out of its caller's stage, so
    the stages add up to no more than the total.
    """
    totals: dict[str, float] = defaultdict(float)
    children: list[float] = []  # per open wrapped call: CPU time of wrapped calls inside it
    patched: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, stage: str) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            children.append(0.0)
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.thread_time() - start
                totals[stage] += elapsed - children.pop()
                if children:
                    children[-1] += elapsed

        patched.append((owner, name, original))
        setattr(owner, name, timed)

    for stage, targets in stages.items():
        for target in targets:
            wrap(*_resolve(target), stage)
    try:
        yield totals
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def breakdown(ds: SegDataset, batch_size: int, batches: int) -> None:
    """Print our single-thread CPU time per image by stage (:data:`STAGES`), as a table."""
    collate = DetectionCollate(mask_stride=4)
    gen = torch.Generator().manual_seed(1)
    order = torch.randint(0, len(ds), (batch_size * batches,), generator=gen).tolist()
    ds.on_worker_start()
    with stage_timer() as totals:
        start = time.thread_time()
        for b in range(batches):
            collate(ds.__getitems__(order[b * batch_size : (b + 1) * batch_size]))
        wall = time.thread_time() - start
    n = batch_size * batches
    print(f"  where the CPU time goes (one thread, mosaic_partners={ds.augment.mosaic_partners!r}, "
          f"hsv_on_device={ds.augment.hsv.on_device}, {n} images, {1e3 * wall / n:.2f} ms/image):")
    print(f"    {'stage':40s} {'ms/image':>9s} {'share':>7s}")
    other = wall - sum(totals.values())
    for stage in [*STAGES, "other (draws, plans, Python)"]:
        t = totals.get(stage, 0.0) if stage in STAGES else other
        print(f"    {stage:40s} {1e3 * t / n:9.2f} {100 * t / wall:6.1f}%")


# ----------------------------------------------------------------------------- decode only

#: ``cv2.imdecode`` flags per JPEG reduction (BGR, EXIF orientation ignored, as our decoder).
_DECODE_FLAGS = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                 8: cv2.IMREAD_REDUCED_COLOR_8}


def recorded_decodes(ds: SegDataset, batch_size: int, batches: int) -> list[tuple[Path, int]]:
    """The (file, reduce) of every decode ours makes in ``batches`` batches (single thread)."""
    calls: list[tuple[Path, int]] = []
    original = CocoIndex.__dict__["load_image"]

    def recording(index: CocoIndex, i: int, reduce: int = 1, **kwargs: Any) -> Any:
        calls.append((index.file_path(i), reduce))
        return original(index, i, reduce, **kwargs)

    gen = torch.Generator().manual_seed(2)
    order = torch.randint(0, len(ds), (batch_size * batches,), generator=gen).tolist()
    ds.on_worker_start()
    CocoIndex.load_image = recording  # type: ignore[method-assign]
    try:
        for b in range(batches):
            ds.__getitems__(order[b * batch_size : (b + 1) * batch_size])
    finally:
        CocoIndex.load_image = original  # type: ignore[method-assign]
    return calls


def decode_only(decodes: list[tuple[Path, int]], repeat: int) -> tuple[float, float]:
    """JPEG decoding alone of ``decodes`` from memory: (images/s wall, CPU ms per image), one thread.

    Bare ``cv2.imdecode`` to BGR at each decode's own reduction, no read, no colour conversion:
    the floor a loader decoding these images at these sizes cannot go under. Best of ``repeat``.
    """
    blobs = [(np.frombuffer(path.read_bytes(), np.uint8), _DECODE_FLAGS[r] | cv2.IMREAD_IGNORE_ORIENTATION)
             for path, r in decodes]
    best_wall, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for blob, flags in blobs:
            cv2.imdecode(blob, flags)
        best_cpu = min(best_cpu, time.thread_time() - start_cpu)
        best_wall = min(best_wall, time.perf_counter() - start)
    return len(blobs) / best_wall, 1e3 * best_cpu / len(blobs)


# ----------------------------------------------------------------------------- ultralytics


def prepare_ultralytics(ann_file: Path, images: Path, work: Path) -> Path:
    """YOLO-format copy of the split (image symlinks, labels from convert_coco)."""
    from ultralytics.data.converter import convert_coco

    ann_dir = work / "annotations"
    ann_dir.mkdir(parents=True)
    shutil.copy(ann_file, ann_dir)
    out = work / "converted"
    with contextlib.redirect_stdout(io.StringIO()):
        convert_coco(labels_dir=str(ann_dir), save_dir=str(out), use_segments=True, cls91to80=True)
    target = out / "images" / "train2017"
    target.mkdir(parents=True)
    for f in images.iterdir():
        (target / f.name).symlink_to(f.resolve())
    return target


def measure_ultralytics(images: Path, workers: int, batch_size: int, image_size: int, warmup: int,
                        count: int, buffer: bool = True, mixing: dict[str, float] | None = None) -> float:
    from ultralytics.data.build import build_dataloader

    dataset = ultralytics_dataset(images, batch_size, image_size, buffer, mixing)
    loader = build_dataloader(dataset, batch=batch_size, workers=workers, shuffle=True, pin_memory=False,
                              device="cpu")

    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    return _time_batches(forever(), warmup, count)


# ----------------------------------------------------------------------------- CPU time


def cpu_ms_per_image(get_batch: Any, collate: Any, n: int, batch_size: int, repeat: int = 5) -> float:
    """Single-thread CPU ms per image (batch of samples + collate), the best of ``repeat`` batches.

    CPU time of one thread, unlike wall time, barely moves when other processes share the
    machine, so this ratio is the stable one; the wall-clock loader figures above are the goal.
    """
    best = float("inf")
    rng = torch.Generator().manual_seed(3)
    collate(get_batch(torch.randint(0, n, (batch_size,), generator=rng).tolist()))  # warm buffers
    for _ in range(repeat):
        indices = torch.randint(0, n, (batch_size,), generator=rng).tolist()
        start = time.thread_time()
        collate(get_batch(indices))
        best = min(best, (time.thread_time() - start) / batch_size * 1e3)
    return best


def _ultralytics_mosaics(transform: Any) -> Iterator[Any]:
    """Every ``Mosaic`` inside Ultralytics' nested transforms."""
    from ultralytics.data.augment import Mosaic

    if isinstance(transform, Mosaic):
        yield transform
    for child in getattr(transform, "transforms", None) or []:
        yield from _ultralytics_mosaics(child)
    if getattr(transform, "pre_transform", None) is not None:
        yield from _ultralytics_mosaics(transform.pre_transform)


def ultralytics_dataset(images: Path, batch_size: int, image_size: int, buffer: bool = True,
                        mixing: dict[str, float] | None = None) -> Any:
    """Ultralytics' training dataset (``mixing``: its ``copy_paste`` / ``mixup`` values, flip mode).

    With ``buffer=False`` it works as ours does without a cache: mosaic partners drawn uniformly
    from the whole dataset (``Mosaic.buffer_enabled = False``; by default Ultralytics draws them
    from its buffer of recently decoded images, so a mosaic decodes one new image, not four) and
    no decoded image kept (``max_buffer_length = 2`` keeps one).
    """
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset

    overrides = {"imgsz": image_size, "mosaic": 1.0, "mask_ratio": 4, "overlap_mask": False,
                 "task": "segment", "cache": False}
    if mixing:
        overrides |= {"copy_paste": mixing.get("copy_paste", 0.0), "mixup": mixing.get("mixup", 0.0),
                      "copy_paste_mode": "flip"}
    cfg = get_cfg(overrides=overrides)
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    dataset = build_yolo_dataset(cfg, str(images), batch=batch_size, data=data, mode="train", stride=32)
    if not buffer:
        dataset.max_buffer_length = 2  # BaseDataset.load_image then keeps one image
        for mosaic in _ultralytics_mosaics(dataset.transforms):
            mosaic.buffer_enabled = False
    return dataset


# ----------------------------------------------------------------------------- the device step


def device_step(ds: SegDataset, batch_size: int, repeat: int) -> None:
    """Time ``hsv_jitter_batch_`` on one real collated batch: CPU (one thread), and CUDA if present."""
    batch = DetectionCollate(mask_stride=4)(ds.__getitems__(list(range(batch_size))))
    images, gains = batch.images, batch.hsv_gains
    assert gains is not None
    print(f"device step (hsv_jitter_batch_, {tuple(images.shape)} uint8), best of {repeat}:")
    on_gpu, gpu_gains = (images.cuda(), gains.cuda()) if torch.cuda.is_available() else (None, None)
    _time_device_step(lambda: hsv_jitter_batch_(images.clone(), gains),
                      None if on_gpu is None else lambda: hsv_jitter_batch_(on_gpu.clone(), gpu_gains),
                      batch_size, repeat)


def _time_device_step(on_cpu: Any, on_cuda: Any, batch_size: int, repeat: int) -> None:
    """Print the best of ``repeat`` calls of ``on_cpu`` (wall and thread CPU time) and of ``on_cuda``
    (CUDA events; None: no CUDA here), each after one untimed call (tables, kernels, handles)."""
    on_cpu()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        on_cpu()
        best_cpu = min(best_cpu, time.thread_time() - start_cpu)
        best = min(best, time.perf_counter() - start)
    print(f"  cpu, 1 thread   {1e3 * best:8.2f} ms/batch wall, {1e3 * best_cpu:8.2f} ms/batch CPU time "
          f"({1e3 * best_cpu / batch_size:.2f} ms/image)")
    if on_cuda is None:
        print("  cuda            not available here")
        return
    on_cuda()
    times = []
    for _ in range(repeat):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        on_cuda()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    print(f"  {torch.cuda.get_device_name()}  {min(times):8.3f} ms/batch ({batch_size * 1e3 / min(times):.0f} images/s)")


def device_pixels_step(ds: SegDataset, batch_size: int, repeat: int) -> None:
    """Time the ``pixels_on_device`` step (``make_pixels``: decode, average, warp, flip; then the
    HSV jitter) on one real collated batch: CPU (one thread), and CUDA if present."""
    batch = DetectionCollate(mask_stride=4)(ds.__getitems__(list(range(batch_size))))
    pending, gains = batch.pending_pixels, batch.hsv_gains
    assert pending is not None and gains is not None
    print(f"device step (make_pixels then hsv_jitter_batch_, {batch_size} images, "
          f"{len(pending.sources)} files), best of {repeat}:")
    gpu_gains = gains.cuda() if torch.cuda.is_available() else None
    _time_device_step(lambda: hsv_jitter_batch_(make_pixels(pending, "cpu"), gains),
                      None if gpu_gains is None else lambda: hsv_jitter_batch_(make_pixels(pending, "cuda"), gpu_gains),
                      batch_size, repeat)


# ----------------------------------------------------------------------------- main

#: Our rows: (mosaic partners, HSV jitter on the device, pixels on the device).
OURS = {"ours, HSV in workers": ("batch", False, False), "ours, HSV on device": ("batch", True, False),
        "ours, uniform partners": ("uniform", False, False),
        "ours, pixels on device": ("batch", True, True),
        "ours, pixels on device, uniform": ("uniform", True, True)}
PEER = "ultralytics cache=False"
#: The row whose decodes (files and reductions) the decode-only row repeats.
FLOOR_OF = "ours, HSV in workers"
#: The rows with copy-paste and MixUp on, ours and the peer's (the same values on both sides).
MIXED, PEER_MIXED = "ours, + copy-paste, mixup", "ultralytics + copy-paste, mixup"


def _device_pixels(name: str) -> bool:
    """Whether row ``name`` leaves the pixels to the device (its workers decode nothing)."""
    return name in OURS and OURS[name][2]


def _ratio(name: str, row: dict[str, float], inverse: bool = False) -> str:
    peer = PEER_MIXED if name == MIXED else PEER
    if not name.startswith("ours") or peer not in row:
        return ""
    ratio = row[peer] / row[name] if inverse else row[name] / row[peer]
    return f"  ({ratio:.2f}x Ultralytics)"


def mixing_costs(ann_file: Path, images: Path, peer: Path | None, args: argparse.Namespace, work: Path) -> None:
    """Extra single-thread CPU ms per image of copy-paste, MixUp and both, ours and Ultralytics'."""
    settings = {"plain": {}, "copy_paste": {"copy_paste": args.copy_paste}, "mixup": {"mixup": args.mixup},
                "both": {"copy_paste": args.copy_paste, "mixup": args.mixup}}
    ours, theirs = {}, {}
    for name, kw in settings.items():
        ds = build_ours(ann_file, images, args.image_size, "batch", False, work / "index", **kw)
        ds.on_worker_start()
        ours[name] = cpu_ms_per_image(ds.__getitems__, DetectionCollate(mask_stride=4), len(ds), args.batch_size)
        if peer is not None:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                udata = ultralytics_dataset(peer, args.batch_size, args.image_size, mixing=kw)
                theirs[name] = cpu_ms_per_image(lambda idx: [udata[i] for i in idx], udata.collate_fn, len(udata),
                                                args.batch_size)
    print(f"extra single-thread CPU time per image (copy_paste={args.copy_paste}, mixup={args.mixup}; "
          "the setting minus plain, best of 5 batches each):")
    for name in ("copy_paste", "mixup", "both"):
        line = f"  {name:12s} ours {ours[name] - ours['plain']:+6.2f} ms/image (of {ours[name]:.2f})"
        if theirs:
            line += f"   ultralytics {theirs[name] - theirs['plain']:+6.2f} ms/image (of {theirs[name]:.2f})"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", DEFAULT_ROOT)))
    parser.add_argument("--images", type=int, default=2048, help="entries of the generated split")
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-ultralytics", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--no-uniform", action="store_true", help="leave out the uniform-partners rows")
    parser.add_argument("--no-device-pixels", action="store_true", help="leave out the pixels_on_device rows")
    parser.add_argument("--device-repeat", type=int, default=5)
    parser.add_argument("--copy-paste", type=float, default=0.5, help="0 with --mixup 0: no mixing rows")
    parser.add_argument("--mixup", type=float, default=0.15)
    parser.add_argument("--allocator", choices=("kept", "default"), default="kept",
                        help="kept: glibc keeps freed buffers in this process too (both sides); default: as glibc ships")
    args = parser.parse_args()
    # Before any buffer is allocated: Ultralytics' workers fork from here and inherit it too.
    kept = args.allocator == "kept" and keep_freed_memory()
    mixing = {"copy_paste": args.copy_paste, "mixup": args.mixup} if args.copy_paste or args.mixup else None

    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_loader_"))
    try:
        ann_file, images = make_large_split(args.coco_mini, work / "split", args.images)
        datasets = {name: build_ours(ann_file, images, args.image_size, partners, on_device, work / "index",
                                     pixels_on_device=pixels)
                    for name, (partners, on_device, pixels) in OURS.items()
                    if not (args.no_uniform and partners == "uniform") and not (args.no_device_pixels and pixels)}
        if mixing:
            datasets[MIXED] = build_ours(ann_file, images, args.image_size, "batch", False, work / "index", **mixing)
        peer: Path | None = None
        if not args.no_ultralytics:
            try:
                os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_config"))
                import ultralytics

                peer = prepare_ultralytics(ann_file, images, work / "yolo")
                print(f"ultralytics {ultralytics.__version__} from {Path(ultralytics.__file__).parent}")
            except ImportError:
                print("ultralytics not importable: measuring ours only")
        print(f"coco-mini train repeated to {args.images} images (no cache fits), imgsz {args.image_size}, "
              f"batch {args.batch_size}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"albumentations {A.__version__}, opencv {cv2.__version__}")
        print("allocator: freed buffers kept in this process (data/batching/allocator.py), so both sides' rows built here and "
              "Ultralytics' forked workers run with it" if kept else
              "allocator: glibc's defaults in this process and Ultralytics' workers; ours keeps freed buffers in its "
              "own workers only (worker_init_fn)")
        decodes = recorded_decodes(datasets[FLOOR_OF], args.batch_size, args.batches)
        floor_rate, floor_ms = decode_only(decodes, max(args.repeat, 3))
        reductions = ", ".join(f"{r}: {n}" for r, n in sorted(Counter(r for _, r in decodes).items()))
        print(f"decode only: the {len(decodes)} JPEG decodes {FLOOR_OF!r} makes in {args.batches} batches, "
              f"each at the reduction it chose ({{{reductions}}}), from memory, bare cv2.imdecode, one thread, "
              f"best of {max(args.repeat, 3)}:")
        print(f"  {'decode only':42s} {floor_rate:7.1f} img/s   {floor_ms:6.2f} ms/image CPU")
        print(f"images/s over {args.batches} batches after {args.warmup} warm-up, best of {args.repeat}; "
              "decodes per output image counted by our loader; at workers=0, ours as % of decode only")
        for workers in args.workers:
            # Interleave the contenders repeat by repeat, so load from elsewhere hits both alike.
            runs: dict[str, list[float]] = defaultdict(list)
            per_image: dict[str, float] = {}
            for _ in range(args.repeat):
                for name, ds in datasets.items():
                    rate, per_image[name] = measure_ours(ds, workers, args.batch_size, args.warmup, args.batches)
                    runs[name].append(rate)
                if peer is not None:
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        runs[PEER].append(measure_ultralytics(peer, workers, args.batch_size, args.image_size,
                                                              args.warmup, args.batches))
                        if mixing:
                            runs[PEER_MIXED].append(measure_ultralytics(
                                peer, workers, args.batch_size, args.image_size, args.warmup, args.batches,
                                mixing=mixing))
            row = {name: max(values) for name, values in runs.items()}
            for name, value in row.items():
                spread = ", ".join(f"{v:.0f}" for v in runs[name])
                extra = f"  {per_image[name]:.2f} decodes/image" if name in per_image else ""
                if workers == 0 and name in per_image and not _device_pixels(name):
                    extra += f"  {100 * value / floor_rate:.0f} % of decode only"
                print(f"  workers={workers}  {name:32s} {value:7.1f} img/s{_ratio(name, row)}{extra}   "
                      f"[runs: {spread}]")
            sys.stdout.flush()

        print("single-thread CPU time per image (a batch of samples + collate), best of 5 batches:")
        cpu: dict[str, float] = {}
        for name, ds in datasets.items():
            ds.on_worker_start()
            cpu[name] = cpu_ms_per_image(ds.__getitems__, DetectionCollate(mask_stride=4), len(ds), args.batch_size)
        if peer is not None:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                udata = ultralytics_dataset(peer, args.batch_size, args.image_size)
                cpu[PEER] = cpu_ms_per_image(lambda idx: [udata[i] for i in idx], udata.collate_fn, len(udata),
                                             args.batch_size)
        print(f"  {'decode only':32s} {floor_ms:6.2f} ms/image")
        for name, value in cpu.items():
            floor = f"  {100 * floor_ms / value:.0f} % of decode only" if name in datasets and not _device_pixels(name) else ""
            print(f"  {name:32s} {value:6.2f} ms/image{_ratio(name, cpu, inverse=True)}{floor}")
        device_step(datasets["ours, HSV on device"], args.batch_size, args.device_repeat)
        if "ours, pixels on device" in datasets:
            device_pixels_step(datasets["ours, pixels on device"], args.batch_size, args.device_repeat)
        if mixing:
            mixing_costs(ann_file, images, peer, args, work)
        if args.breakdown:
            for ds in datasets.values():
                breakdown(ds, args.batch_size, args.batches)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
