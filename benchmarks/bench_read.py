"""Reading and decoding one image file: the ways of doing each, timed side by side in one run.

Files: coco-mini's JPEGs (train and val, ~160 KB each), repeated to ``--files`` reads; the OS
page cache holds them, so this is the per-file cost of the system calls and allocations, not
the disk. One thread, CPU time (``time.thread_time``), best of ``--repeat`` passes, the
contenders interleaved pass by pass.

Reading (the same checks and errors, :mod:`seg_datamodule.io.images.files`):

* ``read_image_file`` -- ``bytes``: ``os.read`` in chunks of up to 16 MiB until an empty read
  (``os.read(fd, n)`` allocates ``n`` bytes first, then shrinks them);
* ``read_image_view`` -- one ``readv`` into this thread's reused buffer, a view returned (no
  allocation per file); and the same followed by a copy to ``bytes``, which shows what a
  consumer that needs ``bytes`` would give back.

Decoding (``--reduce`` factors, the same bytes): ``cv2.imdecode`` to BGR + ``cvtColor`` against
the library's :func:`~seg_datamodule.io.images.decode.decode_image_bytes` (``IMREAD_COLOR_RGB`` where
OpenCV has it) and the bare ``imdecode`` (no conversion, BGR) as the floor; then reading and
decoding together: ``read_image_file`` + ``decode_image_bytes`` against
:func:`~seg_datamodule.io.images.decode.decode_image_with_size` (which reads with ``read_image_view``).

Run: ``python benchmarks/bench_read.py [--coco-mini PATH] [--files 2000] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Callable

import cv2
import numpy as np

from seg_datamodule.io.images.decode import decode_image_bytes, decode_image_with_size, read_image_file, read_image_view

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco-mini"
_REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}


def best_ms(fn: Callable[[], object], repeat: int, per: int) -> float:
    """CPU ms per item of ``fn()`` (which handles ``per`` items), best of ``repeat``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return 1e3 * best / per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", DEFAULT_ROOT)))
    parser.add_argument("--files", type=int, default=2000, help="reads per pass (coco-mini's JPEGs repeated)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reduce", type=int, nargs="*", default=[1, 2, 4])
    args = parser.parse_args()
    cv2.setNumThreads(0)
    files = sorted(str(p) for p in args.coco_mini.glob("*2017/*.jpg"))
    paths = [files[k % len(files)] for k in range(args.files)]
    readers = {"read_image_file (bytes, before)": read_image_file, "read_image_view (reused buffer)": read_image_view,
               "read_image_view + copy to bytes": lambda p: bytes(read_image_view(p))}
    for path in files:  # every reader returns the same bytes
        assert len({bytes(reader(path)) for reader in readers.values()}) == 1, path
    times: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, reader in readers.items():
            ms = best_ms(lambda: [reader(p) for p in paths], 1, len(paths))
            times[name] = min(times.get(name, float("inf")), ms)
    print(f"opencv {cv2.__version__}, {len(files)} JPEGs read {args.files} times per pass, one thread, "
          f"CPU time, best of {args.repeat}")
    base = times["read_image_file (bytes, before)"]
    for name, ms in times.items():
        print(f"  read   {name:34s} {1e3 * ms:7.1f} us/file  ({base / ms:.2f}x before)")

    blobs = [Path(f).read_bytes() for f in files]
    for reduce in args.reduce:
        flag = _REDUCED[reduce] | cv2.IMREAD_IGNORE_ORIENTATION
        decoders = {
            "imdecode BGR + cvtColor (before)": lambda d: cv2.cvtColor(
                cv2.imdecode(np.frombuffer(d, np.uint8), flag), cv2.COLOR_BGR2RGB),
            "decode_image_bytes": lambda d: decode_image_bytes(d, reduce=reduce),
            "bare imdecode BGR (floor)": lambda d: cv2.imdecode(np.frombuffer(d, np.uint8), flag),
        }
        ends = {  # read + decode, as the loader does it, against the bytes reader
            "read_image_file + decode_image_bytes": lambda p: decode_image_bytes(read_image_file(p), reduce=reduce),
            "decode_image_with_size (view)": lambda p: decode_image_with_size(p, reduce=reduce),
        }
        dtimes: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, decode in decoders.items():
                ms = best_ms(lambda: [decode(d) for d in blobs], 1, len(blobs))
                dtimes[name] = min(dtimes.get(name, float("inf")), ms)
            for name, end_to_end in ends.items():
                ms = best_ms(lambda: [end_to_end(p) for p in files], 1, len(files))
                dtimes[name] = min(dtimes.get(name, float("inf")), ms)
        for name, ms in dtimes.items():
            base = dtimes["imdecode BGR + cvtColor (before)" if name in decoders
                          else "read_image_file + decode_image_bytes"]
            print(f"  decode reduce={reduce} {name:38s} {ms:6.3f} ms/image  ({base / ms:.2f}x before)")


if __name__ == "__main__":
    main()
