"""Issue 52, item 3: would Pillow's lazy header reading do for the index build what ours does?

An Ultralytics split's index reads every image's header for its size as a person sees it (EXIF
orientation applied: what label coordinates are normalised by). The package parses the JPEG /
PNG / WebP headers and the EXIF ``Orientation`` tag itself
(:func:`~seg_datamodule.io.images.exif.read_image_header`); Pillow, already a dependency, reads the
same lazily (``Image.open(path).size`` and ``getexif()``). The issue's rule: hand it over if the
index build of a 118k-image split does not slow by more than 5 %.

This builds the index of the split ``benchmarks/bench_yolo_index.py`` generates (``--images``,
default 118,287, train2017's count; generated once into ``--workdir`` and reused), cold (an empty
cache folder), in a fresh process per build, ``--rounds`` times alternating which reader goes
first: ours, and the same build with the header reader replaced by Pillow's (sizes and
orientations checked equal first on a sample of files with every orientation 1-8). It prints each
build's seconds, the fastest of each, and the ratio.

    python benchmarks/compare_pillow_headers.py                   # 118,287 images (~236k files, once)
    python benchmarks/compare_pillow_headers.py --images 5000     # quick
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_yolo_index import TRAIN2017_IMAGES, make_dataset  # noqa: E402

_ORIENTATION = 0x0112


def pillow_header(path: str | os.PathLike[str]) -> Any:
    """What :func:`~seg_datamodule.io.images.exif.read_image_header` returns, read by Pillow."""
    from PIL import Image

    from seg_datamodule.io.images.exif import ImageHeader, oriented_size

    with Image.open(path) as image:
        width, height = image.size
        orientation = image.getexif().get(_ORIENTATION, 1)
    orientation = orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1
    return ImageHeader(oriented_size((height, width), orientation), orientation)


def check_equal() -> int:
    """Pillow's and our header agree on JPEGs of every orientation and a PNG; returns files checked."""
    import numpy as np
    from PIL import Image

    from seg_datamodule.io.images.exif import read_image_header

    rng = np.random.default_rng(0)
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for orientation in range(1, 9):
            image = Image.fromarray(rng.integers(0, 255, (37, 53, 3), dtype=np.uint8))
            exif = Image.Exif()
            exif[_ORIENTATION] = orientation
            for fmt, suffix in (("JPEG", "jpg"), ("PNG", "png")):
                path = Path(tmp) / f"o{orientation}.{suffix}"
                buffer = io.BytesIO()
                image.save(buffer, fmt, exif=exif.tobytes())
                path.write_bytes(buffer.getvalue())
                ours, theirs = read_image_header(path), pillow_header(path)
                assert tuple(ours) == tuple(theirs), (path.name, ours, theirs)
                checked += 1
    return checked


def phase(yaml: Path, cache_dir: Path, reader: str) -> dict[str, Any]:
    import seg_datamodule.io.yolo.index as yolo_index
    from seg_datamodule.io.yolo import build_yolo_index

    if reader == "pillow":
        yolo_index.read_image_header = pillow_header  # where the index build looks it up
    shutil.rmtree(cache_dir, ignore_errors=True)
    start = time.perf_counter()
    index = build_yolo_index(yaml, "train", cache_dir=cache_dir)
    seconds = time.perf_counter() - start
    # A checksum of every image's (H, W) and orientation, to compare the two readers' indexes.
    sizes = sum(int(h) * 100_003 + int(w) * 11 + int(o) for h, w, o in zip(index.heights, index.widths, index.orientations))
    return {"seconds": seconds, "images": index.num_images, "sizes": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=TRAIN2017_IMAGES)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seg_datamodule/bench-yolo")
    parser.add_argument("--phase", choices=["ours", "pillow"])
    parser.add_argument("--yaml", type=Path)
    parser.add_argument("--cache-dir", type=Path)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.yaml, args.cache_dir, args.phase)))
        return
    print(f"headers equal on {check_equal()} files (JPEG and PNG, orientations 1-8)")
    start = time.perf_counter()
    yaml = make_dataset(args.workdir, args.images, args.size)
    print(f"split: {yaml.parent} (ready in {time.perf_counter() - start:.0f} s)")
    times: dict[str, list[float]] = {"ours": [], "pillow": []}
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as cache:
        for r in range(args.rounds):
            for reader in (["ours", "pillow"] if r % 2 == 0 else ["pillow", "ours"]):
                out = subprocess.run([sys.executable, __file__, "--phase", reader, "--yaml", str(yaml),
                                      "--cache-dir", str(Path(cache) / reader)],
                                     check=True, capture_output=True, text=True)
                results[reader] = json.loads(out.stdout.strip().splitlines()[-1])
                times[reader].append(results[reader]["seconds"])
                print(f"round {r}: {reader:6s} {results[reader]['seconds']:7.2f} s")
    assert results["ours"]["images"] == results["pillow"]["images"]
    assert results["ours"]["sizes"] == results["pillow"]["sizes"], "the two readers gave other sizes"
    best = {k: min(v) for k, v in times.items()}
    print(f"{results['ours']['images']} images, cold index build, fastest of {args.rounds}: ours {best['ours']:.2f} s, "
          f"Pillow {best['pillow']:.2f} s, Pillow / ours = {best['pillow'] / best['ours']:.3f} "
          f"(the issue's bar: 1.05)")


if __name__ == "__main__":
    main()
