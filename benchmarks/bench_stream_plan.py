"""What a streamed epoch's plan costs each worker before its first batch, by dataset size (issue 63).

``python benchmarks/bench_stream_plan.py [--sizes 100000 1000000 4000000] [--chunk-items 100]``

Before its first batch, every worker of every rank computes the epoch's global order, the chunks
it downloads for its rank (``worker_downloads``, where the downloads are split) and its plan of
chunk visits. ``OrderedRecords.__iter__`` makes the plan as it is read
(:class:`~seg_datamodule.io.stream.plan.WorkerPlan`: up front only numpy arrays of the worker's
items and the set of chunks it reads; the visits and positions of one segment for the first
batch). The peer, timed in the same run on the same layout, is the whole plan made up front
(:func:`~seg_datamodule.io.stream.plan.worker_plan` then LitData's ``worker_plan_to_chunks``,
under ``gc_paused``), as ``OrderedRecords`` made it up to 2026-12-07. Each stage is printed, so
what still grows with the dataset is named. Best of ``--repeats``; on a busy machine compare
within one run only.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

from litdata.streaming.elastic import worker_plan_to_chunks

from seg_datamodule.io.stream.order import chunk_offsets, epoch_order, worker_positions
from seg_datamodule.io.stream.plan import WorkerPlan, gc_paused, worker_downloads, worker_plan


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _stages(sizes: list[int], batch: int, workers: int, repeats: int) -> dict[str, float]:
    """Seconds of each stage for worker 0 of one rank (its inputs made once, outside the timers)."""
    offsets = chunk_offsets(sizes)
    order = epoch_order(0, 0, sizes)
    args = (order, offsets, batch, 1, 0, workers, 0)

    def lazy() -> None:
        plan = WorkerPlan(order, *worker_positions(len(order), batch, 1, 0, workers, 0), offsets)
        plan.ensure(0)
        plan.chunk_set()

    def whole() -> None:
        with gc_paused():
            visits, _ = worker_plan(*args)
            worker_plan_to_chunks(visits)

    return {
        "order": _best(lambda: epoch_order(0, 0, sizes), repeats),
        "downloads": _best(lambda: worker_downloads(*args), repeats),
        "plan, as read": _best(lazy, repeats),
        "plan, whole": _best(whole, repeats),
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
    order = epoch_order(1, 0, check)
    whole = worker_plan(order, chunk_offsets(check), args.batch_size, 1, 0, args.workers, 0)
    positions = worker_positions(len(order), args.batch_size, 1, 0, args.workers, 0)
    made = WorkerPlan(order, *positions, chunk_offsets(check), segment_items=40).make_all()
    if (list(zip(made.chunks, made.item_lists)), made.positions) != whole:
        raise SystemExit("the two plans differ: the comparison would be void")
    for n in args.sizes:
        t = _stages([args.chunk_items] * (n // args.chunk_items), args.batch_size, args.workers, args.repeats)
        now = t["order"] + t["downloads"] + t["plan, as read"]
        before = t["order"] + t["downloads"] + t["plan, whole"]
        stages = ", ".join(f"{name} {seconds:.3f}" for name, seconds in t.items())
        print(f"{n:>10,} images: before the first batch {now:.3f} s ({now / n * 1e6:.3f} s per million), "
              f"whole plan {before:.3f} s; ratio {before / now:.1f}x  [{stages} s]", flush=True)


if __name__ == "__main__":
    main()
