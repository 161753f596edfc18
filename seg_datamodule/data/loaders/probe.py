"""The loader probe: the train loader alone at several ``num_workers``, measured from the training thread.

What ``seg-datamodule loader-bench`` (:mod:`~seg_datamodule.cli`) runs: for each worker count,
``warmup`` batches (worker start-up), then ``batches`` batches timed as a training loop takes
them, with nothing else to do. Per worker count (:class:`ProbeRow`): images per second, ms per
batch on the training thread (wall time in ``next()`` and in dropping the batch; and that
thread's CPU time, the part a training step would lose to receiving batches), JPEG decodes per
output image (each batch's own ``counts``), and peak memory: the proportional set size (PSS,
``/proc/<pid>/smaps_rollup``, so pages shared between forked workers are counted once, split
between them) of each worker and of all of them, sampled by a thread every 50 ms.
:func:`workers_for_target` reads the rows for the fewest workers that reach a rate.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seg_datamodule.ops.checks import check_int

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ProbeRow",
    "default_worker_counts",
    "measure_batches",
    "pss_mib",
    "plot_probe",
    "probe_loader",
    "workers_for_target",
    "write_csv",
]


@dataclass(frozen=True)
class ProbeRow:
    """One worker count's measurement (a CSV row).

    Attributes:
        workers (int): ``num_workers``.
        batches (int): batches timed (after the warm-up).
        images (int): images in them.
        img_s (float): images per second over the timed batches.
        batch_ms (float): wall ms per batch on the training thread (``next()`` and the drop).
        train_thread_cpu_ms (float): CPU ms of the training thread per batch in the same span.
        decodes_per_image (float): JPEG decodes per output image (NaN when batches carry no counts).
        worker_pss_peak_mib (float): the largest PSS of one worker (NaN with 0 workers).
        workers_pss_peak_mib (float): the largest PSS of all workers together (NaN with 0 workers).
        main_pss_peak_mib (float): the largest PSS of the training process.
    """

    workers: int
    batches: int
    images: int
    img_s: float
    batch_ms: float
    train_thread_cpu_ms: float
    decodes_per_image: float
    worker_pss_peak_mib: float
    workers_pss_peak_mib: float
    main_pss_peak_mib: float


def pss_mib(pid: int) -> float:
    """Proportional set size of a process in MiB, from ``/proc/<pid>/smaps_rollup``; NaN where unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as file:
            for line in file:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):  # not Linux, the process ended, an odd kernel
        pass
    return math.nan


def default_worker_counts(cores: int) -> list[int]:
    """0, 1 and the powers of two up to ``cores``: ``[0, 1, 2, 4, 8]`` for 8 cores."""
    check_int("cores", cores, 1)
    counts, power = [0, 1], 2
    while power <= cores:
        counts.append(power)
        power *= 2
    return counts


def _images_in(batch: Any) -> int:
    images = getattr(batch, "images", None)
    if images is not None:
        return int(len(images))
    return int(len(batch))


def _endless(loader: Iterable[Any]) -> Iterator[Any]:
    """Epoch after epoch, telling the sampler its epoch as Lightning does."""
    epoch = 0
    while True:
        batch_sampler = getattr(loader, "batch_sampler", None)
        for sampler in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
                break
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the train loader yields no batch: is the dataset empty, or the batch larger than it?")
        epoch += 1


class _MemorySampler:
    """A thread that reads the PSS of this process and its children every ``interval_s``.

    Reading ``smaps_rollup`` walks a process's page tables; a thread keeps that off the timed
    loop (the reads are system calls, outside the GIL), and the peaks are what it saw.
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peaks = {"worker": -math.inf, "workers": -math.inf, "main": -math.inf}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loader-probe-pss", daemon=True)

    def sample(self) -> None:
        children = [child.pid for child in multiprocessing.active_children() if child.pid is not None]
        workers = [value for value in map(pss_mib, children) if math.isfinite(value)]
        if workers:
            self.peaks["worker"] = max(self.peaks["worker"], max(workers))
            self.peaks["workers"] = max(self.peaks["workers"], sum(workers))
        main = pss_mib(os.getpid())
        if math.isfinite(main):
            self.peaks["main"] = max(self.peaks["main"], main)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> _MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def peak(self, key: str) -> float:
        value = self.peaks[key]
        return value if math.isfinite(value) else math.nan


def measure_batches(
    batches: Iterator[Any],
    warmup: int,
    count: int,
    *,
    workers: int = 0,
    sample_memory: bool = True,
    on_batch: Callable[[], None] | None = None,
) -> ProbeRow:
    """Take ``warmup`` then ``count`` batches from ``batches`` as a training loop would; time the latter.

    The timer runs from the first timed ``next()`` to the release of the last batch, back to
    back, as ``benchmarks/bench_loader.py`` times a loader; CPU time is the training thread's
    (``time.thread_time``) over the same span.

    Args:
        batches: an iterator of batches (``DetectionBatch`` or anything with ``len``).
        warmup (int): batches taken before the timer starts, >= 0.
        count (int): batches timed, >= 1.
        workers (int): the loader's ``num_workers``, for the row.
        sample_memory (bool): read the PSS of this process and its children every 50 ms
            from a thread, from the first warm-up batch on.
        on_batch: called after every batch (a progress bar); keep it cheap, it is timed.

    Returns:
        ProbeRow: the measurement.

    Raises:
        TypeError, ValueError: a bad ``warmup`` or ``count``.
        StopIteration: the iterator ran out.
    """
    check_int("warmup", warmup, 0)
    check_int("count", count, 1)
    sampler = _MemorySampler() if sample_memory else contextlib.nullcontext()
    images = decodes = samples = 0
    counted = False
    with sampler:
        for _ in range(warmup):
            batch = next(batches)
            del batch
            if on_batch is not None:
                on_batch()
        cpu0, start = time.thread_time(), time.perf_counter()
        for _ in range(count):
            batch = next(batches)
            images += _images_in(batch)
            counts = getattr(batch, "counts", None)
            if counts:
                counted = True
                decodes += int(counts.get("decodes", 0))
                samples += int(counts.get("samples", 0))
            del batch  # released here, as a training step releases its batch
            if on_batch is not None:
                on_batch()
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu0

    def peak(key: str) -> float:
        return sampler.peak(key) if isinstance(sampler, _MemorySampler) else math.nan

    return ProbeRow(
        workers=workers,
        batches=count,
        images=images,
        img_s=images / elapsed if elapsed > 0 else math.inf,
        batch_ms=1e3 * elapsed / count,
        train_thread_cpu_ms=1e3 * cpu / count,
        decodes_per_image=decodes / samples if counted and samples else math.nan,
        worker_pss_peak_mib=peak("worker") if workers else math.nan,
        workers_pss_peak_mib=peak("workers") if workers else math.nan,
        main_pss_peak_mib=peak("main"),
    )


def probe_loader(
    make_loader: Callable[[int], Iterable[Any]],
    worker_counts: Sequence[int],
    batches: int,
    warmup: int = 2,
    *,
    progress: bool = True,
    sample_memory: bool = True,
) -> list[ProbeRow]:
    """Measure a train loader at each worker count, one after the other, each loader shut down after.

    Args:
        make_loader: builds the train loader for a ``num_workers``.
        worker_counts: the counts, each >= 0, e.g. :func:`default_worker_counts`.
        batches (int): batches timed per count, >= 1.
        warmup (int): batches before the timer per count (worker start-up), >= 0.
        progress (bool): a progress bar per count on stderr.
        sample_memory (bool): sample PSS after each batch (see :func:`measure_batches`).

    Returns:
        list[ProbeRow]: one row per worker count, in the order given.

    Raises:
        ValueError: an empty or negative ``worker_counts``, or a loader with no batch.
    """
    counts = [check_int("worker_counts[]", w, 0) for w in worker_counts]
    if not counts:
        raise ValueError("worker_counts must name at least one num_workers, got []")
    check_int("batches", batches, 1)
    check_int("warmup", warmup, 0)
    rows = []
    for workers in counts:
        bar = None
        if progress:
            from tqdm import tqdm  # Lightning's own progress bar library

            bar = tqdm(total=warmup + batches, desc=f"num_workers={workers}", unit="batch", leave=False)
        loader = make_loader(workers)
        iterator = _endless(loader)
        try:
            rows.append(measure_batches(iterator, warmup, batches, workers=workers, sample_memory=sample_memory,
                                        on_batch=None if bar is None else bar.update))
        finally:
            if bar is not None:
                bar.close()
            iterator.close()
            _shut_down(loader)
            del iterator, loader
            gc.collect()
    return rows


def _shut_down(loader: Any) -> None:
    """Stop a loader's persistent workers now, so the next count's do not run beside them.

    A persistent ``DataLoader`` keeps its iterator (and workers) as long as the loader lives,
    and whoever built the loader may keep it. ``_iterator`` and ``_shutdown_workers`` are
    torch's private names, hence the guard; without them the workers end with the loader.
    """
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
        loader._iterator = None
    multiprocessing.active_children()  # joins the workers that ended


def workers_for_target(
    rows: Sequence[ProbeRow], target_img_s: float, cores: int | None = None
) -> tuple[int | None, str]:
    """The fewest measured workers that reach ``target_img_s``, and a sentence saying so.

    When none does, the sentence extrapolates from the best measured per-worker rate (img/s over
    workers, among rows with workers) and says whether that many fit on ``cores`` (one core is
    the training process's).

    Returns:
        tuple[int | None, str]: the worker count (``None`` when no row reaches the target).

    Raises:
        ValueError: no rows, or a target that is not a positive number.
    """
    if not rows:
        raise ValueError("rows must hold at least one measurement")
    if not (isinstance(target_img_s, (int, float)) and target_img_s > 0 and math.isfinite(target_img_s)):
        raise ValueError(f"target_img_s must be a positive number, got {target_img_s!r}")
    reached = sorted((row for row in rows if row.img_s >= target_img_s), key=lambda row: row.workers)
    if reached:
        row = reached[0]
        return row.workers, (
            f"num_workers={row.workers} reaches {target_img_s:g} img/s ({row.img_s:.1f} img/s measured)."
        )
    best = max(rows, key=lambda row: row.img_s)
    with_workers = [row for row in rows if row.workers > 0]
    sentence = (
        f"No measured num_workers reaches {target_img_s:g} img/s"
        f" (best: {best.img_s:.1f} img/s at {best.workers})."
    )
    if with_workers:
        per_worker = max(row.img_s / row.workers for row in with_workers)
        needed = math.ceil(target_img_s / per_worker)
        sentence += f" At the best {per_worker:.1f} img/s per worker it would take about {needed} workers"
        if cores is not None and needed > cores - 1:
            sentence += f", more than the {max(cores - 1, 0)} this machine's {cores} cores leave beside training"
        sentence += "."
    return None, sentence


def write_csv(rows: Sequence[ProbeRow], path: str | os.PathLike) -> Path:
    """One line per worker count, the fields of :class:`ProbeRow` as columns; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[f.name for f in fields(ProbeRow)])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    return path


def plot_probe(rows: Sequence[ProbeRow], target_img_s: float | None = None, title: str = "") -> Figure:
    """img/s against ``num_workers`` (and the target as a line); the PSS of all workers on a second axis."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), layout="constrained")
    axis = figure.subplots()
    ordered = sorted(rows, key=lambda row: row.workers)
    x = [row.workers for row in ordered]
    axis.plot(x, [row.img_s for row in ordered], marker="o", color="#1f77b4", label="img/s")
    for row in ordered:
        axis.annotate(f"{row.img_s:.0f}", (row.workers, row.img_s), textcoords="offset points", xytext=(0, 6),
                      ha="center", fontsize="small")
    if target_img_s is not None:
        axis.axhline(target_img_s, color="#d62728", linestyle="--", label=f"target {target_img_s:g} img/s")
    axis.set_xlabel("num_workers")
    axis.set_ylabel("img/s (training thread's view)")
    axis.set_xticks(x)
    axis.set_ylim(bottom=0)
    memory = [row.workers_pss_peak_mib for row in ordered]
    if any(math.isfinite(m) for m in memory):
        twin = axis.twinx()
        twin.plot(x, memory, marker="s", color="#7f7f7f", linestyle=":", label="workers' PSS (MiB)")
        twin.set_ylabel("peak PSS of all workers, MiB")
        twin.set_ylim(bottom=0)
        twin.legend(loc="lower right", fontsize="small")
    axis.legend(loc="upper left", fontsize="small")
    axis.set_title(title or "train loader throughput")
    return figure
