"""Benchmark the CPU HSV kernel (``hsv_jitter_batch_``, what ``hsv_on_device`` runs on a CPU run)
alone and beside busy processes, with torch's default thread count and with the kernel's own.

Issue 35 measured 4.0-7.6 s per 32 x 640^2 batch with torch's default threads while another
process held a core, against 0.22-0.25 s on one thread: torch's OpenMP team waits for the thread
whose core is taken. The kernel now runs on :data:`~seg_datamodule.transforms.pixel.hsv.CPU_THREADS`
threads of its own; this script prints both, alone and beside ``--busy`` spinning processes (one
run each, best of ``--repeats``), and the ratio contended / alone of each: the fix holds when the
kernel's own ratio stays near ``(busy + 1) / cores`` or below and the default one does not.

Usage::

    python benchmarks/bench_hsv_contention.py                       # 32 x 640^2, 2 busy processes
    python benchmarks/bench_hsv_contention.py --batch 2 --size 64   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seg_datamodule.transforms.pixel import hsv  # noqa: E402


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _time(images: torch.Tensor, gains: torch.Tensor, threads: int | None, repeats: int) -> float:
    """Best seconds of ``hsv_jitter_batch_`` on a copy of ``images``; ``threads`` None: torch's default."""
    saved = hsv.CPU_THREADS
    hsv.CPU_THREADS = threads if threads is not None else torch.get_num_threads()
    try:
        best = float("inf")
        for _ in range(repeats):
            batch = images.clone()
            start = time.perf_counter()
            hsv.hsv_jitter_batch_(batch, gains)
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        hsv.CPU_THREADS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the kernel")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, generator=generator)
    gains = (torch.rand(args.batch, 3, dtype=torch.float64, generator=generator) * 2 - 1) * torch.tensor(
        [0.015, 0.7, 0.4], dtype=torch.float64)
    hsv.hsv_jitter_batch_(images[:1].clone(), gains[:1])  # builds the colour tables (once per process)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    settings = {"torch default": None, "kernel's own": hsv.CPU_THREADS}
    print(f"hsv_jitter_batch_ on {args.batch} x 3 x {args.size}^2, {cores} cores, torch default threads "
          f"{torch.get_num_threads()}, the kernel's own {hsv.CPU_THREADS}; best of {args.repeats}")
    alone = {name: _time(images, gains, threads, args.repeats) for name, threads in settings.items()}
    stop = multiprocessing.get_context("fork").Event()
    spinners = [multiprocessing.get_context("fork").Process(target=_spin, args=(stop,), daemon=True)
                for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.5)
        contended = {name: _time(images, gains, threads, args.repeats) for name, threads in settings.items()}
    finally:
        stop.set()
        for p in spinners:
            p.join(5)
    for name in settings:
        print(f"{name:>14}: alone {alone[name]:.3f} s, beside {args.busy} busy {contended[name]:.3f} s, "
              f"ratio {contended[name] / alone[name]:.2f}")


if __name__ == "__main__":
    main()
