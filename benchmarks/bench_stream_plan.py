"""What a streamed epoch's plan costs each worker before its first batch, by dataset size (issue 63).

``python benchmarks/bench_stream_plan.py [--sizes 100000 1000000 4000000] [--chunk-items 100]``

Before its first batch, every worker of every rank sets up the epoch's global order, the chunks
it downloads for its rank, and its plan of chunk visits. ``OrderedRecords.__iter__`` makes each
as it is read: the order a block at a time
(:class:`~seg_datamodule.io.stream.order.EpochOrder`), the downloads a block at a time as the
reader nears them (:class:`~seg_datamodule.io.stream.plan.NodeDownloads`), the plan a segment at a
time (:class:`~seg_datamodule.io.stream.plan.WorkerPlan`); up front only the chunks' permutation
and the worker's places in the order (numpy). This times that, to the first batch's segment and
its downloads, 8 blocks ahead. The peer, timed in the same run on the same layout, is everything
made whole up front, as ``OrderedRecords`` made it up to 2026-12-07: the whole order
(:func:`~seg_datamodule.io.stream.order.epoch_order`), the whole download list
(:func:`_whole_downloads`), and the whole plan (:func:`~seg_datamodule.io.stream.plan.worker_plan`
then LitData's ``worker_plan_to_chunks``, under ``gc_paused``). Each stage is printed, so what
still grows with the dataset is named. Best of ``--repeats``; on a busy machine compare within one
run only.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np
from litdata.streaming.elastic import worker_plan_to_chunks

from seg_datamodule.io.stream.order import EpochOrder, chunk_offsets, epoch_order, worker_positions
from seg_datamodule.io.stream.plan import Deal, NodeDownloads, WorkerPlan, gc_paused, worker_plan


def _whole_downloads(order: np.ndarray, offsets: np.ndarray, global_batch: int, workers: int, worker: int) -> list:
    """The download list of one rank's worker, made whole (``order.worker_downloads`` up to 2026-12-07)."""
    positions, starts = worker_positions(len(order), global_batch, 1, 0)
    active = min(max(1, workers), len(starts) - 1)
    chunks = np.searchsorted(offsets, order[positions], side="right") - 1
    first = np.full(len(offsets) - 1, len(chunks), np.int64)
    np.minimum.at(first, chunks, np.arange(len(chunks), dtype=np.int64))
    read = np.flatnonzero(first < len(chunks))
    return read[np.argsort(first[read], kind="stable")][worker::active].tolist()


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _stages(sizes: list[int], batch: int, workers: int, repeats: int) -> dict[str, float]:
    """Seconds of each stage for worker 0 of one rank."""
    offsets = chunk_offsets(sizes)
    deal = (batch, 1, 0, workers, 0)

    def as_read() -> None:
        order = EpochOrder(0, 0, sizes)
        plan = WorkerPlan(order, *worker_positions(len(order), *deal), offsets)
        plan.ensure(0)
        downloads = NodeDownloads(order, Deal(*deal))
        for _ in range(9):  # the first block and 8 ahead (OrderedRecords' default reach)
            downloads.next_block()

    def whole() -> None:
        with gc_paused():
            order = epoch_order(0, 0, sizes)
            _whole_downloads(order, offsets, batch, workers, 0)
            visits, _ = worker_plan(order, offsets, *deal)
            worker_plan_to_chunks(visits)

    order = epoch_order(0, 0, sizes)
    return {
        "places in the order": _best(lambda: worker_positions(len(order), *deal), repeats),
        "as read": _best(as_read, repeats),
        "order, whole": _best(lambda: epoch_order(0, 0, sizes), repeats),
        "downloads, whole": _best(lambda: _whole_downloads(order, offsets, batch, workers, 0), repeats),
        "all, whole": _best(whole, repeats),
    }


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
    order, offsets, deal = epoch_order(1, 0, check), chunk_offsets(check), (args.batch_size, 1, 0, args.workers, 0)
    made = WorkerPlan(EpochOrder(1, 0, check), *worker_positions(len(order), *deal), offsets, segment_items=40)
    if (list(zip(made.make_all().chunks, made.item_lists)), made.positions) != worker_plan(order, offsets, *deal) or \
            NodeDownloads(EpochOrder(1, 0, check), Deal(*deal)).all() != _whole_downloads(order, offsets, *deal[:1],
                                                                                     args.workers, 0):
        raise SystemExit("the plans or download lists differ: the comparison would be void")
    for n in args.sizes:
        t = _stages([args.chunk_items] * (n // args.chunk_items), args.batch_size, args.workers, args.repeats)
        stages = ", ".join(f"{name} {seconds:.4f}" for name, seconds in t.items())
        print(f"{n:>10,} images: before the first batch {t['as read']:.4f} s "
              f"({t['as read'] / n * 1e6:.4f} s per million), all made whole {t['all, whole']:.3f} s; "
              f"ratio {t['all, whole'] / t['as read']:.0f}x  [{stages} s]", flush=True)


if __name__ == "__main__":
    main()
