"""Pixels on the device (issue 53) on the CPU device, against the worker path, in one run.

A batch is 16 real-size JPEGs (the ten CC BY fixture images, 406 to 640 px a side, and six
synthetic 640 x 480 photos) and 16 mosaics of 640 x 640, each of 4 tiles: its own image and
three batch partners (``draw_batch_partners``). Timed, one thread each (``torch.set_num_threads(1)``,
``cv2.setNumThreads(0)`` as in the loader's workers), median of ``--repeat`` runs after a warm-up:

* device path: ``decode_jpegs`` of the 16 files (one batched call), then ``warp_tiles_device`` of
  the 16 canvases (one pass);
* worker path: ``decode_image_bytes`` of each tile's file (4 per sample, 64 decodes: a worker
  decodes what its sample needs) and of the 16 files once (for comparison), then ``warp_tiles``
  per sample.

For the default recipe (axis-aligned tiles, ``cv2.resize`` in the workers) and for rotated and
sheared tiles (``degrees=10, shear=2``: ``cv2.warpAffine``). The CPU stands in for an accelerator
here: what this measures is the kernel's cost per pixel on one core, not a GPU's speed.

Run: ``python benchmarks/bench_device_pixels.py [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import torch

from seg_datamodule.io.images.device_decode import decode_jpegs
from seg_datamodule.io.images.decode import decode_image_bytes
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.kernels.device_warp import warp_tiles_device
from seg_datamodule.transforms.kernels.plan import draw_batch_partners
from seg_datamodule.transforms.kernels.warp import warp_tiles

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "coco-cc-by").rglob("*.jpg"))
BATCH = 16


def synthetic_photo(rng: np.random.Generator, h: int = 480, w: int = 640) -> bytes:
    """A photo-like JPEG (quality 90): smooth shading, textured noise, sharp-edged shapes."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / rng.uniform(40, 120) + c) * np.cos(y / rng.uniform(40, 120))
                     for c in range(3)], -1)
    image = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
    for _ in range(12):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.circle(image, center, int(rng.integers(10, 80)), color, -1)
    return cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(0)
    rng = np.random.default_rng(0)
    files = [p.read_bytes() for p in FIXTURES] + [synthetic_photo(rng) for _ in range(BATCH - len(FIXTURES))]
    encoded = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    decoded_np = [decode_image_bytes(f)[0] for f in files]
    sizes = np.array([im.shape[:2] for im in decoded_np])
    partners = draw_batch_partners(rng, BATCH)
    tile_images = [[b, *map(int, partners[b])] for b in range(BATCH)]
    print(f"batch: {BATCH} JPEGs ({sum(map(len, files)) / 1e6:.1f} MB), {BATCH} mosaics of 640 x 640, "
          f"4 tiles each; one thread; median of {args.repeat} (ms per batch)")
    for name, step in (("axis-aligned (resize)", MosaicAffine(image_size=640)),
                       ("rotated+sheared (warpAffine)", MosaicAffine(image_size=640, degrees=10, shear=2))):
        plans = [step.plan(step.draw(rng, True), sizes[row]) for row in tile_images]
        images = decode_jpegs(encoded, "cpu", [False] * BATCH)
        dev_decode = median_ms(lambda: decode_jpegs(encoded, "cpu", [False] * BATCH), args.repeat)
        dev_warp = median_ms(lambda: warp_tiles_device(images, plans, tile_images), args.repeat)
        cpu_decode_tiles = median_ms(lambda: [decode_image_bytes(files[i]) for row in tile_images for i in row],
                                     args.repeat)
        cpu_decode_once = median_ms(lambda: [decode_image_bytes(f) for f in files], args.repeat)
        cpu_warp = median_ms(lambda: [warp_tiles([decoded_np[i] for i in row], plan)
                                      for row, plan in zip(tile_images, plans)], args.repeat)
        diff = np.abs(warp_tiles_device(images, plans, tile_images).permute(0, 2, 3, 1).numpy().astype(int)
                      - np.stack([warp_tiles([decoded_np[i] for i in row], p) for row, p in zip(tile_images, plans)]))
        print(f"\n{name}: against the worker path's canvases, max difference {diff.max()}, "
              f"{(diff > 0).mean():.1e} of the values differ")
        print(f"  device  decode_jpegs (16 files)          {dev_decode:8.1f}")
        print(f"  device  warp_tiles_device (16 canvases)  {dev_warp:8.1f}")
        print(f"  device  total                            {dev_decode + dev_warp:8.1f}")
        print(f"  worker  cv2 decode, 4 tiles a sample (64) {cpu_decode_tiles:7.1f}   (16 files once: {cpu_decode_once:.1f})")
        print(f"  worker  warp_tiles (16 canvases)         {cpu_warp:8.1f}")
        print(f"  worker  total                            {cpu_decode_tiles + cpu_warp:8.1f}")


if __name__ == "__main__":
    main()
