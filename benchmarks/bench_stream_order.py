"""The streamed global order (issue 63) against LitData's own shuffle, over the same chunks from a loopback S3.

``python benchmarks/bench_stream_order.py [--latency-ms 50] [--workers 2] [--batch-size 8] [--repeats 2]
[--ranks 1] [--coco-root ../shared/data/coco-mini --copies 8 --chunk-bytes 1MB]``

Both sides stream the same chunk set from a real S3 API on 127.0.0.1 (the tests' ``LoopbackS3``:
moto's ``ThreadedMotoServer`` over plain ``http://``, needs ``moto[server]`` and pytest) whose every
chunk GET first sleeps ``--latency-ms`` (``LoopbackS3.delay_chunk_gets``)
(a remote store's latency, added in the server, so both sides pay it per request), and build
their batches with the same collate (``StreamBatchCollate``: the same ``SegDataset`` and
``DetectionCollate``): the only difference is the order.

* **peer**: ``StreamRecords(shuffle=True)`` in a plain ``litdata.StreamingDataLoader``: LitData's
  chunk-wise shuffle, each worker reading its own chunks.
* **ours**: :func:`~seg_datamodule.data.loaders.streaming.stream_train_loader`: the global order,
  every worker reading from the current window of chunks; the workers of the node's ranks split
  the chunks (``plan.NodeDownloads``) and each fetches its share with LitData's async prefetch.

``--max-cache-size`` gives both sides the same cache budget: below the chunk set, chunks are
deleted as they are read, and this project's workers still split the downloads, handed over as far
ahead as the budget allows (or, under a budget smaller than a few blocks past the readers, fetch
what they read one at a time: the guide's limit (4)). The most bytes of chunk files on disk at
once is sampled every 10 ms. ``--peer-max-cache-size none`` leaves the peer LitData's default
budget (the cache holds the set): at 2 simulated ranks x 2 workers under 50 MB LitData's own
shuffle did not finish (two of its workers timed out after 120 s on a chunk).

``--ranks R`` streams as R ranks of one node (simulated: ``world=(rank, R)``, each rank's loader
iterated in its own thread with its own workers, all sharing one cache directory, as the ranks
of a node share LitData's cache, and taking each batch in step, as DDP's all-reduce holds a
run's ranks); a batch of ``--batch-size`` a rank on both sides, and images per second counted
over all ranks until the last one ends.

Each repeat runs one epoch of each, alternating, every epoch with an empty cache (so every chunk
is downloaded): images per second over the epoch and after its first batch, time to the first
batch, chunk GETs from the server's log, and the most GETs in flight at once. The ratio is
ours / peer, measured in the same run. Numbers come from whatever machine runs this; on a busy
shared machine compare within one run only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from litdata import StreamingDataLoader
from litdata.utilities.env import _DistributedEnv

from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.config.options import AugmentOptions, StreamOptions
from seg_datamodule.data.loaders.streaming import StreamBatchCollate, stream_train_loader
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.io.stream import ChunkOptions, convert_coco, window_from_meta
from seg_datamodule.io.stream.loader import StreamRecords
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine

_TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(_TESTS), str(_TESTS / "io")]  # the tests' loopback S3 server and tiled COCO roots
from _disk_peak import DiskPeak  # noqa: E402
from _s3_server import LoopbackS3  # noqa: E402


def _dataset(meta: dict, image_size: int, seed: int) -> SegDataset:
    augment = AugmentOptions(MosaicAffine(image_size=image_size), mosaic_partners="batch")  # a stream's
    return SegDataset(window_from_meta(meta), augment, train=True, seed=seed)


def _epoch(loader: Any, in_flight: list[int], step: Any = None) -> dict[str, float]:
    """One epoch of ``loader``; ``in_flight``: the server's count of chunk GETs in flight as each arrived.

    ``step``, where given, is called after each batch (the ranks' barrier of :func:`_node_epoch`).
    """
    before, start = len(in_flight), time.perf_counter()
    first, images, first_images = None, 0, 0
    for batch in loader:
        if step is not None:
            step()
        images += len(batch.image_ids)
        if first is None:
            first = time.perf_counter() - start
        if images == len(batch.image_ids):
            first_images = images
    wall = time.perf_counter() - start
    steady = (images - first_images) / max(1e-9, wall - float(first or 0.0))
    mine = in_flight[before:]
    return {"images_per_s": images / wall, "steady_per_s": steady, "first_batch_s": float(first or 0.0),
            "images": images, "gets": len(mine), "in_flight": max(mine, default=0)}


def _node_epoch(loaders: list[Any], in_flight: list[int]) -> dict[str, float]:
    """One epoch of every rank's loader at once (a thread each), counted as :func:`_epoch` over the node.

    The ranks take each batch in step, as a DDP run's gradient all-reduce holds its ranks (a
    barrier after each batch): without it one rank ran ahead, and the chunks between the ranks
    stayed on disk. Images per second: all ranks' images over the time until the last rank ends;
    after the first batch: the sum of each rank's own rate after its first batch.
    """
    before, start, rows = len(in_flight), time.perf_counter(), [{} for _ in loaders]
    barrier = threading.Barrier(len(loaders))

    def run(i: int) -> None:
        try:
            rows[i] = _epoch(loaders[i], [], step=barrier.wait)
        except BaseException:
            barrier.abort()  # the other ranks stop waiting on this one
            raise
        rows[i]["end"] = time.perf_counter() - start

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(loaders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("end" not in r for r in rows):
        raise RuntimeError("a rank's loader failed (its traceback is above)")
    images, mine = sum(r["images"] for r in rows), in_flight[before:]
    return {"images_per_s": images / max(r["end"] for r in rows), "steady_per_s": sum(r["steady_per_s"] for r in rows),
            "first_batch_s": max(r["first_batch_s"] for r in rows), "images": images, "gets": len(mine),
            "in_flight": max(mine, default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ann", type=Path, default=None, help="COCO annotations (default: the demo data)")
    parser.add_argument("--images", type=Path, default=None)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-bytes", default="256KB")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1, help="simulated ranks of one node, streaming at once")
    parser.add_argument("--max-cache-size", default=None,
                        help="the node's cache budget on both sides (50MB); default LitData's (100 GB)")
    parser.add_argument("--peer-max-cache-size", default="same",
                        help="the peer's budget: 'same' (--max-cache-size), 'none' (LitData's default), or a size")
    parser.add_argument("--no-node-split", dest="node_split", action="store_false",
                        help="with --ranks > 1: each worker fetches what it reads (as before 2026-12-07, and "
                             "where the node's ranks are not known)")
    parser.add_argument("--copies", type=int, default=1,
                        help="tile a COCO root (--coco-root) this many times, every copy a genuine image under a "
                             "new id (tests/_datasets.tile_coco_root): epochs long enough that start-up does not rule")
    parser.add_argument("--coco-root", type=Path, default=None, help="a COCO root (annotations/, train2017/) to tile")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-order-"))
    try:
        if args.coco_root is not None:
            from _datasets import tile_coco_root

            root = tile_coco_root(args.coco_root, work / "tiled", args.copies)
            args.ann, args.images = root / "annotations" / "instances_train2017.json", root / "train2017"
        elif args.ann is None:
            from seg_datamodule.demo.data import ensure_demo_dataset

            root = work / "demo"
            ensure_demo_dataset(root)
            args.ann, args.images = root / "annotations" / "instances_train2017.json", root / "train2017"
        chunks = work / "chunks"
        meta = convert_coco(args.ann, args.images, str(chunks),
                            chunk_options=ChunkOptions(chunk_bytes=args.chunk_bytes, start_method="fork"))
        s3 = LoopbackS3()  # the tests' server: moto on 127.0.0.1, every request logged
        in_flight = s3.delay_chunk_gets(args.latency_ms / 1000.0)
        url, options = s3.upload(chunks, "set"), s3.options
        n_chunks = len([p for p in chunks.iterdir() if p.suffix == ".bin"])
        print(f"{meta['num_records']} images in {n_chunks} chunks, {args.latency_ms:g} ms per chunk GET, "
              f"{args.ranks} rank(s) x {args.workers} workers, batch {args.batch_size}, {args.image_size} px")
        peer_budget = {"same": args.max_cache_size, "none": None}.get(args.peer_max_cache_size,
                                                                      args.peer_max_cache_size)
        results: dict[str, list[dict[str, float]]] = {"peer": [], "ours": []}
        user_async = "LITDATA_ASYNC_CHUNK_PREFETCH" in os.environ
        for r in range(args.repeats):
            for side in ("peer", "ours"):
                cache = work / f"cache-{side}-{r}"
                dataset = _dataset(meta, args.image_size, seed=r)
                collate = StreamBatchCollate(dataset, DetectionCollate())
                loaders: list[Any] = []
                for rank in range(args.ranks):
                    if side == "peer":
                        if not user_async:  # LitData's default for the peer (ours may turn it off in its workers)
                            os.environ.pop("LITDATA_ASYNC_CHUNK_PREFETCH", None)
                        budget = {} if peer_budget is None else {"max_cache_size": peer_budget}
                        records = StreamRecords(url, cache_dir=str(cache), shuffle=True, seed=r,
                                                storage_options=options, **budget)
                        records.distributed_env = _DistributedEnv(args.ranks, rank, 1)
                        loaders.append(StreamingDataLoader(records, batch_size=args.batch_size, collate_fn=collate,
                                                           num_workers=args.workers))
                    else:
                        stream = StreamOptions(url, cache_dir=str(cache), max_cache_size=args.max_cache_size,
                                               storage_options=options)
                        loaders.append(stream_train_loader(stream, dataset, DetectionCollate(),
                                                           batch_size=args.batch_size, num_workers=args.workers,
                                                           world=(rank, args.ranks)))
                        # the simulated ranks stream at once, as a node's processes do (as the DataModule sets it)
                        loaders[-1].dataset.ranks_on_node = args.ranks if args.node_split else None
                with DiskPeak(cache) as disk:
                    row = _epoch(loaders[0], in_flight) if args.ranks == 1 else _node_epoch(loaders, in_flight)
                results[side].append(row)
                print(f"repeat {r} {side}: {row['images_per_s']:.1f} images/s ({row['steady_per_s']:.1f} after the "
                      f"first batch), first batch {row['first_batch_s']:.2f} s, {row['images']} images, "
                      f"{row['gets']} chunk GETs, at most {row['in_flight']} in flight, "
                      f"at most {disk.peak / 1e6:.1f} MB of chunks on disk", flush=True)
                shutil.rmtree(cache, ignore_errors=True)
        s3.stop()
        peer = statistics.median(r["images_per_s"] for r in results["peer"])
        ours = statistics.median(r["images_per_s"] for r in results["ours"])
        print(f"median images/s: ours {ours:.1f}, LitData's shuffle {peer:.1f}; ratio ours/peer {ours / peer:.3f}")
        peer_s = statistics.median(r["steady_per_s"] for r in results["peer"])
        ours_s = statistics.median(r["steady_per_s"] for r in results["ours"])
        print(f"median after the first batch: ours {ours_s:.1f}, LitData's shuffle {peer_s:.1f}; "
              f"ratio ours/peer {ours_s / peer_s:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
