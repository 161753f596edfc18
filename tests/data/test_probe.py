"""The loader probe (``seg-datamodule loader-bench``): its measurement, its rows, its command.

Its 0-worker img/s is compared with ``benchmarks/bench_loader.py``'s own measurement of the same
data, interleaved run by run so load from elsewhere hits both alike.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from seg_datamodule.cli import loader_bench_main
from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.loaders.probe import (
    ProbeRow,
    default_worker_counts,
    measure_batches,
    probe_loader,
    pss_mib,
    workers_for_target,
    write_csv,
)

ROOT = Path(__file__).resolve().parents[2]


def _row(workers: int, img_s: float) -> ProbeRow:
    nan = math.nan
    return ProbeRow(workers, 10, 80, img_s, 8e3 / img_s / 10, 1.0, 1.0, nan, nan, 100.0)


def test_default_worker_counts_and_pss() -> None:
    assert default_worker_counts(1) == [0, 1]
    assert default_worker_counts(6) == [0, 1, 2, 4]
    assert default_worker_counts(8) == [0, 1, 2, 4, 8]
    with pytest.raises(ValueError, match="cores must be >= 1"):
        default_worker_counts(0)
    if Path("/proc/self/smaps_rollup").exists():
        assert 1.0 < pss_mib(os.getpid()) < 1e6
    assert math.isnan(pss_mib(2**22 + 12345))  # no such process


def test_workers_for_target_by_hand() -> None:
    rows = [_row(0, 50.0), _row(1, 45.0), _row(2, 90.0), _row(4, 160.0)]
    assert workers_for_target(rows, 80.0) == (2, "num_workers=2 reaches 80 img/s (90.0 img/s measured).")
    assert workers_for_target(rows, 40.0)[0] == 0
    workers, sentence = workers_for_target(rows, 300.0, cores=4)
    # best per worker: 45 img/s (1 worker); 300 / 45 -> 7 workers, more than 3 beside training.
    assert workers is None and "about 7 workers" in sentence and "more than the 3" in sentence
    with pytest.raises(ValueError, match="target_img_s must be a positive number"):
        workers_for_target(rows, 0.0)
    with pytest.raises(ValueError, match="rows must hold"):
        workers_for_target([], 10.0)


class _Batch:
    def __init__(self, n: int) -> None:
        self.images = torch.zeros(n, 3, 2, 2, dtype=torch.uint8)
        self.counts = {"samples": n, "decodes": n // 2}


def test_measure_batches_against_injected_cost(tmp_path: Path) -> None:
    waits: list[float] = []

    def slow() -> Iterator[_Batch]:
        while True:
            start = time.perf_counter()
            time.sleep(0.02)
            waits.append(time.perf_counter() - start)
            yield _Batch(4)

    row = measure_batches(slow(), warmup=2, count=10, workers=0)
    assert row.batches == 10 and row.images == 40 and row.decodes_per_image == 0.5
    measured = sum(waits[2:12])  # the batches timed, as the source itself measured them
    assert row.img_s == pytest.approx(40 / measured, rel=0.1)
    assert row.batch_ms == pytest.approx(1e3 * measured / 10, rel=0.1)
    assert row.train_thread_cpu_ms < row.batch_ms  # sleeping costs the thread no CPU
    assert math.isnan(row.worker_pss_peak_mib) and row.main_pss_peak_mib > 0
    path = write_csv([row, row], tmp_path / "x" / "probe.csv")
    with path.open() as file:
        lines = list(csv.DictReader(file))
    assert len(lines) == 2 and float(lines[0]["img_s"]) == row.img_s
    with pytest.raises(ValueError, match="count must be >= 1"):
        measure_batches(slow(), warmup=0, count=0)


def _bench_loader() -> Any:
    spec = importlib.util.spec_from_file_location("bench_loader", ROOT / "benchmarks" / "bench_loader.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_loader"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_zero_worker_rate_agrees_with_the_loader_benchmark(coco_mini: Path, tmp_path: Path) -> None:
    bench = _bench_loader()
    ann, images = bench.make_large_split(coco_mini, tmp_path / "split", 96)
    ds = bench.build_ours(ann, images, 320, "batch", False, tmp_path / "index")
    batch_size, warmup, count = 8, 1, 5

    def probe_once() -> float:
        # The loader bench_loader.measure_ours builds, measured by the probe's own function.
        total = batch_size * (warmup + count)
        loader = DataLoader(ds, batch_size=batch_size, collate_fn=DetectionCollate(mask_stride=4),
                            sampler=RandomSampler(ds, num_samples=total, generator=torch.Generator().manual_seed(0)))
        ds.on_worker_start()
        return measure_batches(iter(loader), warmup, count, sample_memory=False).img_s

    def bench_once() -> float:
        return bench.measure_ours(ds, 0, batch_size, warmup, count)[0]

    probe_once(), bench_once()  # not kept: the first pass opens and decodes every file cold
    theirs, ours = [], []
    for k in range(4):  # interleaved, each side first in turn: load from elsewhere hits both alike
        for measure in (probe_once, bench_once) if k % 2 else (bench_once, probe_once):
            (ours if measure is probe_once else theirs).append(measure())
    # Best of each: load from other tests only ever slows a pass (CI saw one side's three passes
    # at 97-143 img/s beside the other's 164-222, each pass a fraction of a second), so the fastest
    # pass is the least disturbed measure of each; the noise is still measured on both sides.
    noise = max((max(v) - min(v)) / max(v) for v in (ours, theirs))
    ratio = max(ours) / max(theirs)
    assert abs(ratio - 1.0) <= max(0.25, 1.5 * noise), (ours, theirs)


def _config(coco_mini: Path, tmp_path: Path) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(
        "seed_everything: 0\n"
        "trainer:\n  max_epochs: 3\n  logger: false\n"
        "model:\n  class_path: seg_datamodule.models.YolactLite\n  init_args:\n    width: 8\n    num_prototypes: 4\n"
        "data:\n"
        f"  train_ann: {coco_mini / 'annotations/instances_train2017.json'}\n"
        f"  train_images: {coco_mini / 'train2017'}\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "  image_size: 192\n  batch_size: 4\n  num_workers: 2\n  close_mosaic: 1\n"  # cache_images: auto
    )
    return path


@pytest.mark.slow
# LightningCLI's own call of a jsonargparse API that jsonargparse deprecates (add_instantiator).
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
def test_loader_bench_command_from_yaml(coco_mini: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    rows = loader_bench_main([
        "--config", str(_config(coco_mini, tmp_path)), "--workers", "0,1", "--batches", "3", "--warmup", "1",
        "--target-img-s", "1", "--out", str(out), "--data.batch_size", "2",
        "--data.mosaic_partners", "batch",
    ])
    printed = capsys.readouterr().out
    assert "train loader alone: batch 2, image_size 192" in printed  # the override reached the module
    assert "image cache: off, every image decoded" in printed  # coco-mini would fit in it: not measured
    assert "num_workers=0 reaches 1 img/s" in printed
    out = out / "version_0"  # each run's own folder
    with (out / "loader_bench.csv").open() as file:
        lines = list(csv.DictReader(file))
    assert [int(line["workers"]) for line in lines] == [0, 1] == [row.workers for row in rows]
    assert all(int(line["images"]) == 6 for line in lines)
    # Partners from the batch, no cache: every output image is exactly one decode.
    assert [row.decodes_per_image for row in rows] == [1.0, 1.0]
    assert math.isnan(rows[0].worker_pss_peak_mib) and rows[1].worker_pss_peak_mib > 0
    assert rows[1].workers_pss_peak_mib == pytest.approx(rows[1].worker_pss_peak_mib)
    assert (out / "loader_bench.png").stat().st_size > 1000
    assert multiprocessing.active_children() == []  # each count's workers were shut down


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
def test_loader_bench_uses_the_image_cache_only_when_asked(coco_mini: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    # issue 40: on coco-mini the default cache held every image and the bench measured cache hits.
    base = ["--config", str(_config(coco_mini, tmp_path)), "--workers", "0", "--batches", "1", "--warmup", "0",
            "--out", str(tmp_path / "out"), "--no-memory"]
    loader_bench_main([*base, "--image-cache"])
    assert "image cache: up to 80 decoded images per worker (data.cache_images)" in capsys.readouterr().out
    loader_bench_main([*base, "--data.cache_images", "5"])  # asked for on the command line
    assert "image cache: up to 5 decoded images per worker" in capsys.readouterr().out
    # Nothing of an earlier run is replaced: each writes a folder of its own.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["version_0", "version_1"]


def test_probe_loader_shuts_workers_down_and_checks_arguments() -> None:
    with pytest.raises(ValueError, match="worker_counts must name"):
        probe_loader(lambda w: [], [], batches=1)
    with pytest.raises(ValueError, match="yields no batch"):
        probe_loader(lambda w: [], [0], batches=1, progress=False)


def test_loader_bench_needs_a_config() -> None:
    with pytest.raises(SystemExit, match="give --config"):
        loader_bench_main(["--workers", "0"])
    with pytest.raises(SystemExit, match="--workers must be"):
        loader_bench_main(["--config", "x.yaml", "--workers", "a,b"])
