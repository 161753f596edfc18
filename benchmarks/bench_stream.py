"""Streaming from LitData chunks vs the map-style loader, with injected per-chunk download latency.

``python benchmarks/bench_stream.py [--ann A --images D] [--latency-ms 0 50 200] [--workers 2] [--no-s3]``

Data: coco-mini's train split when present (else the embedded demo data), converted once to
chunks of ``--chunk-bytes``. The stream is read through ``local:``, which copies every chunk into
the LitData cache as a remote source would; ``--latency-ms`` adds a sleep to every chunk
download (a ``local:`` downloader registered with ``register_downloader``, inherited by the
forked workers). The cache is capped at ``--max-cache`` so chunks are evicted and re-fetched.
The ``s3://`` row streams the same chunks from a real S3 API on the loopback (moto's
``ThreadedMotoServer`` on 127.0.0.1 over plain ``http://``, needs ``moto[server]``; ``--no-s3``
leaves it out), through the package's endpoint handling (``stream_storage_options``).

Per configuration, one epoch through the bare loader (``COCOSegDataModule.train_dataloader``,
same augmentation, ``image_size`` and batch size on both sides): time to first batch, images per
second after it and per worker, the peak size of the LitData cache folder, and the peak RSS of
each DataLoader worker (sampled every 20 ms). Then, with ``--trainer``, one epoch of a real
Trainer run of the tiny demo model with :class:`StepTimeProfiler`: the ``train_dataloader_next``
share of the step. Also: the converted size against the JPEGs + the JSON. Numbers are from a
shared machine: compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from litdata.streaming.downloader import LocalDownloaderWithCache, register_downloader

from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.io.stream import ChunkOptions, IndexOptions, convert_coco

_LATENCY_S = [0.0]  # read by the downloader in the (forked) workers
_DOWNLOADS = [0]


class _SlowLocal(LocalDownloaderWithCache):
    """``local:`` with a sleep before every chunk download (a remote's latency)."""

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        if not os.path.exists(local_filepath):
            time.sleep(_LATENCY_S[0])
            _DOWNLOADS[0] += 1
        super().download_file(remote_filepath, local_filepath)


class _Sampler:
    """Peak cache-folder bytes and per-worker RSS, sampled in a thread."""

    def __init__(self, cache: Path | None) -> None:
        self.cache, self.peak_cache, self.peak_rss = cache, 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            if self.cache is not None and self.cache.exists():
                size = sum(p.stat().st_size for p in self.cache.rglob("*") if p.is_file() and p.suffix == ".bin")
                self.peak_cache = max(self.peak_cache, size)
            for child in me.children():
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                self.peak_rss[child.pid] = max(self.peak_rss.get(child.pid, 0), rss)
            self._stop.wait(0.02)


def _epoch(dm: COCOSegDataModule, cache: Path | None) -> dict[str, float]:
    dm.setup("fit")
    loader = dm.train_dataloader()
    with _Sampler(cache) as sampler:
        start = time.perf_counter()
        first, images, batches = None, 0, 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            else:
                images += len(batch)
            batches += 1
        wall = time.perf_counter() - start
    rate = images / max(1e-9, wall - (first or 0.0))
    rss = sorted(sampler.peak_rss.values())
    return {"first_batch_s": round(first or 0.0, 3), "img_per_s": round(rate, 1),
            "img_per_s_per_worker": round(rate / max(1, dm.num_workers), 1), "batches": batches,
            "peak_cache_MiB": round(sampler.peak_cache / 2**20, 2),
            "peak_worker_rss_MiB": [round(r / 2**20) for r in rss]}


def _loopback_s3(chunks: Path) -> tuple[Any, str, dict[str, Any]]:
    """``(server, url, storage_options)``: ``chunks`` uploaded to a moto server on 127.0.0.1."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}", "aws_access_key_id": "bench",
               "aws_secret_access_key": "bench", "region_name": "us-east-1"}
    client = boto3.client("s3", **options)
    client.create_bucket(Bucket="bench")
    for file in sorted(chunks.iterdir()):
        client.upload_file(str(file), "bench", f"chunks/{file.name}")
    return server, "s3://bench/chunks", options


def _trainer_share(dm: COCOSegDataModule, out: Path) -> float:
    from lightning.pytorch import Trainer

    from seg_datamodule.models import YolactLite
    from seg_datamodule.profiling import StepTimeProfiler

    profiler = StepTimeProfiler(warmup_steps=1, dirpath=str(out), save_plot=False)
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      num_sanity_val_steps=0, callbacks=[profiler])
    trainer.fit(YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=4), datamodule=dm)
    return round(float(profiler.summary()["train_dataloader_next"]["share"]), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ann")
    parser.add_argument("--images")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0, 50, 200])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=320)
    parser.add_argument("--chunk-bytes", default="1MB")
    parser.add_argument("--max-cache", default="4MB")
    parser.add_argument("--trainer", action="store_true", help="also a Trainer epoch per configuration")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-s3", action="store_true", help="leave out the s3:// (loopback server) row")
    args = parser.parse_args()
    if args.ann is None:
        mini = Path(__file__).resolve().parents[2] / "shared/data/coco-mini"
        if (mini / "annotations/instances_train2017.json").is_file():
            args.ann, args.images = str(mini / "annotations/instances_train2017.json"), str(mini / "train2017")
        else:
            from seg_datamodule.demo.data import ensure_demo_dataset

            demo = ensure_demo_dataset()
            args.ann, args.images = str(demo.train_ann), str(demo.train_images)
    work = Path(args.out or tempfile.mkdtemp(prefix="bench_stream_"))
    chunks = work / "chunks"
    shutil.rmtree(chunks, ignore_errors=True)
    start = time.perf_counter()
    meta = convert_coco(args.ann, args.images, str(chunks), IndexOptions(on_bad_sample="skip"),
                        ChunkOptions(chunk_bytes=args.chunk_bytes, num_workers=2, start_method="fork"))
    results: dict[str, Any] = {
        "images": meta["num_records"], "convert_s": round(time.perf_counter() - start, 2),
        "chunks": len(list(chunks.glob("*.bin"))),
        "converted_MiB": round(meta["chunk_bytes_total"] / 2**20, 2),
        "jpeg_plus_json_MiB": round((meta["image_bytes"] + meta["ann_file_bytes"]) / 2**20, 2),
        "workers": args.workers, "batch_size": args.batch_size, "image_size": args.image_size, "runs": {},
    }
    common = dict(image_size=args.image_size, batch_size=args.batch_size, num_workers=args.workers, seed=0,
                  pin_memory=False)
    register_downloader("local:", _SlowLocal, overwrite=True)
    configs: list[tuple[str, dict[str, Any], Path | None]] = [
        ("map-style", dict(train_ann=args.ann, train_images=args.images, on_bad_sample="skip"), None)]
    for latency in args.latency_ms:
        cache = work / f"cache-{latency:g}ms"
        configs.append((f"stream {latency:g} ms/chunk", dict(train_stream=f"local:{chunks}", latency=latency,
                                                             stream_max_cache_size=args.max_cache,
                                                             stream_cache_dir=str(cache)), cache))
    server = None
    if not args.no_s3:
        server, url, options = _loopback_s3(chunks)
        cache = work / "cache-s3"
        configs.append(("stream s3:// loopback", dict(train_stream=url, stream_storage_options=options,
                                                      stream_max_cache_size=args.max_cache,
                                                      stream_cache_dir=str(cache)), cache))
    for name, kwargs, cache in configs:
        _LATENCY_S[0] = float(kwargs.pop("latency", 0.0)) / 1000.0
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
        run = _epoch(COCOSegDataModule(**common, **kwargs), cache)
        if args.trainer:
            if cache is not None:
                shutil.rmtree(cache, ignore_errors=True)
            run["train_dataloader_next_share"] = _trainer_share(COCOSegDataModule(**common, **kwargs), work / "prof")
        results["runs"][name] = run
        print(name, json.dumps(run), flush=True)
    if server is not None:
        server.stop()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
