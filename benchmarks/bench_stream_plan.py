"""What a streamed epoch's plan costs each worker before its first batch, by dataset size (issue 63).

``python benchmarks/bench_stream_plan.py [--sizes 100000 1000000 4000000] [--chunk-items 100]``

Every worker of every rank computes, before its first batch, the epoch's global order and its own
plan of chunk visits (:func:`~seg_datamodule.io.stream.order.worker_plan` then LitData's
``worker_plan_to_chunks``, under ``gc_paused``, as ``OrderedRecords.__iter__`` runs them), so this time is part
of every epoch's time to the first batch and grows with the dataset. The peer, timed in the same
run on the same layout, is the same plan made item by item with the garbage collector running,
as ``OrderedRecords`` made it up to 2026-12-06 (:func:`_loop_plan`). Best of ``--repeats``; on a
busy machine compare within one run only.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np
from litdata.streaming.elastic import worker_plan_to_chunks

from seg_datamodule.io.stream.order import chunk_offsets, epoch_order, gc_paused, worker_batches, worker_plan


def _loop_plan(seed: int, sizes: list[int], global_batch: int, workers: int) -> Any:
    """Worker 0's plan item by item: visits grouped per batch in a dict, positions from the inverse order."""
    order, offsets = epoch_order(seed, 0, sizes), chunk_offsets(sizes)
    visits: list[tuple[int, list[int]]] = []
    for batch in worker_batches(order, global_batch, 1, 0, workers, 0):
        seen: dict[int, list[int]] = {}
        for chunk, item in zip((np.searchsorted(offsets, batch, side="right") - 1).tolist(), batch.tolist()):
            seen.setdefault(chunk, []).append(item)
        for chunk, items in seen.items():
            if visits and visits[-1][0] == chunk:
                visits[-1][1].extend(items)
            else:
                visits.append((chunk, items))
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    return worker_plan_to_chunks(visits), {item: int(position[item]) for _, items in visits for item in items}


def _plan(seed: int, sizes: list[int], global_batch: int, workers: int) -> Any:
    """Worker 0's plan as ``OrderedRecords.__iter__`` makes it."""
    with gc_paused():
        visits, positions = worker_plan(epoch_order(seed, 0, sizes), chunk_offsets(sizes), global_batch, 1, 0, workers)
        return worker_plan_to_chunks(visits), positions


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--chunk-items", type=int, default=100, help="images per chunk")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"worker 0 of {args.workers}, one rank, batch {args.batch_size}, {args.chunk_items}-image chunks, window 4")
    check = [args.chunk_items] * 50
    if _plan(1, check, args.batch_size, args.workers) != _loop_plan(1, check, args.batch_size, args.workers):
        raise SystemExit("the two plans differ: the comparison would be void")
    for n in args.sizes:
        sizes = [args.chunk_items] * (n // args.chunk_items)
        ours = _best(lambda: _plan(0, sizes, args.batch_size, args.workers), args.repeats)
        loop = _best(lambda: _loop_plan(0, sizes, args.batch_size, args.workers), args.repeats)
        print(f"{n:>10,} images: plan {ours:.3f} s ({ours / n * 1e6:.2f} s per million), item by item {loop:.3f} s; "
              f"ratio {loop / ours:.1f}x", flush=True)


if __name__ == "__main__":
    main()
