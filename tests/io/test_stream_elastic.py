"""Streamed global batches from a real S3 API (moto on 127.0.0.1): every world size and worker count (issue 63).

Simulated ranks: one loader per rank (``world=(rank, W)``), all sharing one chunk cache as the
ranks of one node do, iterated in lockstep; a step's global batch is the ranks' batches
concatenated in rank order, hashed (image ids and pixels). The reference is the same sequence at
``W = 1`` with no workers; downloads are counted from the server's request log.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("litdata")

from litdata.constants import _FORCE_DOWNLOAD_TIME  # noqa: E402

from _child import run_child  # noqa: E402
from _datasets import make_dataset  # noqa: E402
from _recorder import read_counts, read_steps  # noqa: E402
from _s3_server import LoopbackS3, demo_chunk_set  # noqa: E402

from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402
from seg_datamodule.data.config.options import StreamOptions  # noqa: E402
from seg_datamodule.data.loaders.streaming import stream_train_loader  # noqa: E402
from seg_datamodule.io.stream import chunk_cache, window_from_meta  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*max_cache_size.*"),
              pytest.mark.filterwarnings("ignore:.*worker processes in total.*:UserWarning"),  # 4 workers on 2 cores
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

GLOBAL_BATCH = 8  # 48 demo images: 6 global batches an epoch


@pytest.fixture(scope="module")
def chunks(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return demo_chunk_set(demo_dir, tmp_path_factory.mktemp("elastic") / "chunks", "200KB")


def _loaders(url: str, meta: dict, cache: Path, world: int, workers: int, options: dict,
             max_cache_size: str | None = None, global_batch: int = GLOBAL_BATCH) -> list[Any]:
    stream = StreamOptions(url, cache_dir=str(cache), max_cache_size=max_cache_size, storage_options=options)
    # Mosaic partners come from the rank's batch (as map-style under DDP), so pixels are compared
    # across world sizes without mosaic; the images and their order are the same either way.
    return [stream_train_loader(stream, make_dataset(window_from_meta(meta), image_size=48, seed=3, mosaic=0.0),
                                DetectionCollate(), batch_size=global_batch // world, num_workers=workers,
                                world=(rank, world))
            for rank in range(world)]


def _epoch(loaders: list[Any], stop_after: int | None = None) -> list[str]:
    """One epoch of the ranks in lockstep: the hash of each step's global batch.

    A rank's workers start at its first ``next``, so here rank 1's start after rank 0's first
    batch (a skew a DDP run, its ranks in their own processes, does not have). The ranks are not
    started from threads: with them, DataLoader workers died (exit code 1, no traceback) in one CI
    run and one local run, likely from forking in two threads at once (not proven)."""
    hashes = []
    for step, batches in enumerate(zip(*loaders, strict=True)):
        digest = hashlib.sha256()  # the ranks' batches concatenated in rank order
        digest.update(torch.cat([batch.image_ids for batch in batches]).numpy().tobytes())
        digest.update(torch.cat([batch.images for batch in batches]).numpy().tobytes())
        hashes.append(digest.hexdigest()[:16])
        if stop_after is not None and step + 1 == stop_after:
            break
    return hashes


def test_the_same_global_batches_for_every_world_size_and_worker_count(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path
) -> None:
    url = s3.upload(chunks[0], "cross")
    meta = chunks[1]
    sequences = {}
    for world in (1, 2, 4):
        for workers in (0, 1, 2, 4):
            loaders = _loaders(url, meta, tmp_path / f"c{world}-{workers}", world, workers, s3.options)
            sequences[(world, workers)] = [_epoch(loaders), _epoch(loaders)]  # two epochs
    reference = sequences[(1, 0)]
    assert len(reference[0]) == meta["num_records"] // GLOBAL_BATCH == 6
    assert reference[0] != reference[1]  # a new order each epoch
    different = {key: seq for key, seq in sequences.items() if seq != reference}
    assert not different, sorted(different)


@pytest.mark.parametrize(("world", "workers"), [(1, 2), (2, 1)])
def test_a_plan_made_a_batch_at_a_time_streams_the_same_global_batches(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path, world: int, workers: int,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers make their plans one batch at a time (``OrderedRecords.segment_items``): LitData reads
    visits that are made as it goes, across seams, and the last index is still marked (no leftover
    reference: no ``.cnt`` after the epoch)."""
    url = s3.upload(chunks[0], f"lazy{world}{workers}")
    meta = chunks[1]
    want = _epoch(_loaders(url, meta, tmp_path / "whole", 1, 0, s3.options))
    loaders = _loaders(url, meta, tmp_path / "lazy", world, workers, s3.options)
    for loader in loaders:
        loader.dataset.segment_items = 1  # rounds up to one batch a segment
        loader.dataset.ahead_items = 1  # downloads handed over a block at a time, as the reader gets there
    before = s3.gets(f"lazy{world}{workers}")
    monkeypatch.setattr(chunk_cache, "CO_WORKER_GRACE_S", 1000.0)  # a chunk never handed over waits 30 s
    started = time.monotonic()
    assert _epoch(loaders) == want
    # A chunk never handed over is fetched by LitData's reader only after _FORCE_DOWNLOAD_TIME
    # (30 s) of waiting, and once: the count below would not see it, the time does.
    assert time.monotonic() - started < _FORCE_DOWNLOAD_TIME
    assert not list((tmp_path / "lazy").rglob("*.cnt"))
    gets = s3.gets(f"lazy{world}{workers}")
    if world == 1:  # split: each chunk once, handed to LitData in pieces (two ranks: each fetches what it reads)
        num_chunks = len([p for p in chunks[0].iterdir() if p.suffix == ".bin"])
        assert len(gets) == num_chunks and all(gets[key] - before.get(key, 0) == 1 for key in gets), gets


def test_a_resume_taken_at_two_ranks_continues_exactly_on_one_and_four(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path
) -> None:
    url = s3.upload(chunks[0], "resume")
    meta = chunks[1]
    straight = _loaders(url, meta, tmp_path / "straight", 1, 0, s3.options)
    want = _epoch(straight) + _epoch(straight)
    first = _loaders(url, meta, tmp_path / "first", 2, 2, s3.options)
    assert _epoch(first, stop_after=2) == want[:2]
    states = [loader.state_dict() for loader in first]
    assert states[0]["order"] == states[1]["order"]
    assert states[0]["order"]["consumed"] == 2 * GLOBAL_BATCH and states[0]["order"]["epoch"] == 0
    for world, workers in ((1, 1), (4, 2)):
        resumed = _loaders(url, meta, tmp_path / f"resumed{world}", world, workers, s3.options)
        for loader in resumed:
            loader.load_state_dict(states[0])
        assert _epoch(resumed) + _epoch(resumed) == want[2:], (world, workers)
    # a global batch the new world size cannot keep: one line naming what can
    bad = _loaders(url, meta, tmp_path / "bad", 1, 0, s3.options, global_batch=4)[0]  # batch_size 4 on one rank
    with pytest.raises(ValueError, match=r"global batch of 8 .* with batch_size 4 on 1 ranks; .*: 8 on 1, 4 on 2, "
                                         r"2 on 4, 1 on 8$"):
        bad.load_state_dict(states[0])


@pytest.mark.parametrize(("max_cache_size", "world", "workers", "global_batch"),
                         [(None, 2, 2, GLOBAL_BATCH), (None, 1, 2, GLOBAL_BATCH), (None, 1, 4, 4),
                          ("1MB", 2, 2, GLOBAL_BATCH), ("1MB", 2, 2, 4), ("1MB", 1, 1, 2)])
def test_chunk_downloads_per_epoch_per_node(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path, max_cache_size: str | None, world: int, workers: int,
    global_batch: int
) -> None:
    """Ranks of one node (one cache), two epochs, GETs counted from the server's log: each chunk
    once an epoch. None: LitData's default cache (it holds the whole set): once in the first
    epoch, never again; at two ranks each worker fetches what it reads, under LitData's per-chunk
    lock (with LitData's async prefetch, which OrderedRecords then turns off, two workers fetched
    one chunk at once); at one rank the workers split the chunks and fetch them with the async
    prefetch (``plan.worker_downloads``). 1MB (about 5 of the 12 chunks): a chunk goes when the node's last
    visit to it ends and comes back the next epoch. With a global batch of 4 or 2 a worker's
    batch is one or two images and it comes back to a chunk several times an epoch: LitData's one
    reference per chunk, dropped at every visit's end, let a chunk be deleted between two visits
    (fetched again, or a FileNotFoundError in LitData's wait), and its prefetch thread, handed one
    entry per visit, fetched chunks again after their last visit (2 to 3 GETs for 3 to 5 of the
    12 chunks before both were mended; at 2 x 2 workers, with the ranks started apart, 4 to 7
    chunks twice or three times then, 3 to 6 twice now on an idle machine)."""
    prefix = f"once{max_cache_size or ''}-{world}-{workers}-{global_batch}"
    url = s3.upload(chunks[0], prefix)
    loaders = _loaders(url, chunks[1], tmp_path / "cache", world, workers, s3.options, max_cache_size, global_batch)
    num_chunks = len([p for p in chunks[0].iterdir() if p.suffix == ".bin"])
    per_epoch = []
    for _ in range(2):
        before = s3.gets(prefix)
        _epoch(loaders)
        after = s3.gets(prefix)
        per_epoch.append({key: after[key] - before.get(key, 0) for key in after})
    print(f"max_cache_size {max_cache_size}, {world} x {workers}, global batch {global_batch}: "
          f"GETs per chunk per epoch {[sorted(e.values()) for e in per_epoch]}")
    assert len(per_epoch[0]) == num_chunks  # every chunk was read
    if max_cache_size is not None and world * workers > 1:
        # Readers that start apart still cost a download (no barrier is taken): here rank 1's
        # workers start after rank 0's first batch (see _epoch), and a reader finishes a block of
        # these tiny chunks in about 0.1 s. Bounded (a chunk at most twice on an idle machine,
        # three times under xdist's load), exact with one reader (below) and with a cache that
        # holds the set.
        assert all(max(e.values()) <= 3 and len(e) == num_chunks for e in per_epoch)
        return
    assert max(per_epoch[0].values()) == 1
    if max_cache_size is None:
        assert sum(per_epoch[1].values()) == 0  # the cache kept them all
    else:
        assert max(per_epoch[1].values()) == 1 and len(per_epoch[1]) == num_chunks


def test_a_budget_of_ten_megabytes_below_the_set_streams_past_litdatas_disk_slot_gate(
    s3: LoopbackS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 10 MB (and twice a chunk) LitData 0.2.76 gates downloads on node-wide disk slots, each
    freed only when its chunk is deleted; in the global order a chunk goes only when the node's
    last visit ends, and with the gate every reader waited on a chunk no thread would fetch (12 MB
    over 27 chunks of 1 MB at 50 ms a GET: a reader's timeout; with no latency the slots did not
    run out). With the gate off for these readers (``chunk_cache.references_decide_deletes``) the
    epoch streams the batches of a run with no budget, each chunk fetched at most three times (the
    bound of the 1 MB case above). 12 MB holds too few blocks past the readers to split the
    downloads (``plan.downloads_ahead``): each worker fetches what it reads."""
    from litdata.streaming import item_loader

    from _datasets import tile_coco_root

    monkeypatch.setattr(item_loader, "_MAX_WAIT_TIME", 30)  # a reader stuck fails in 30 s, not 120 (forked too)
    root = tile_coco_root(HERE.parent / "fixtures" / "coco-cc-by", tmp_path / "tiled", 32)  # 160 real images
    folder, meta = demo_chunk_set(root, tmp_path / "chunks", "1MB")
    num_chunks = len([p for p in folder.iterdir() if p.suffix == ".bin"])
    assert num_chunks >= 20 and sum(p.stat().st_size for p in folder.iterdir()) > 20e6  # the gate's range
    url = s3.upload(folder, "gate")
    want = _epoch(_loaders(url, meta, tmp_path / "whole", 1, 0, s3.options))
    before = s3.gets("gate")
    s3.delay_chunk_gets(0.05)  # a remote store's latency
    assert _epoch(_loaders(url, meta, tmp_path / "budget", 1, 2, s3.options, "12MB")) == want
    gets = {key: n - before.get(key, 0) for key, n in s3.gets("gate").items()}
    assert len(gets) == num_chunks and max(gets.values()) <= 3, gets


def test_under_a_budget_the_workers_split_the_downloads_and_the_cache_stays_within_it(
    s3: LoopbackS3, tmp_path: Path
) -> None:
    """A budget below the set that holds a few blocks past the readers: the workers split the
    downloads (several GETs in flight; fetching what each reads, one at a time, two at most), each
    chunk is fetched once, the chunks on disk stay within the budget, and the batches are those of
    a run with no budget. 10 MB over 54 chunks of 500 KB (24 MB), at 50 ms a GET, a global batch
    of 2, 2 workers. Slips caught: the look-ahead not bounded by the budget
    (``plan.downloads_ahead``: 8 blocks and the spread) held 14.6 MB; LitData's thread
    taking one ended visit a turn (not ``chunk_cache.references_decide_deletes``) kept chunks past
    their last visit (289 MB under 50 MB in the benchmark); a download adding a reference of its own
    (LitData's, for a chunk outside the reader's "shared" set) left chunks behind; each worker
    fetching what it reads failed too."""
    from _datasets import tile_coco_root
    from _disk_peak import DiskPeak

    root = tile_coco_root(HERE.parent / "fixtures" / "coco-cc-by", tmp_path / "tiled", 32)  # 160 real images
    folder, meta = demo_chunk_set(root, tmp_path / "chunks", "500KB")
    num_chunks = len([p for p in folder.iterdir() if p.suffix == ".bin"])
    set_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".bin")
    # the budget below holds about 40 % of it, less than LitData would fetch ahead unbounded (8 blocks)
    assert num_chunks >= 50 and set_bytes > 22e6
    url = s3.upload(folder, "split-budget")
    want = _epoch(_loaders(url, meta, tmp_path / "whole", 1, 0, s3.options, global_batch=2))
    before = s3.gets("split-budget")
    in_flight = s3.delay_chunk_gets(0.05)  # a remote store's latency
    loader = _loaders(url, meta, tmp_path / "budget", 1, 2, s3.options, "10MB", global_batch=2)[0]
    with DiskPeak(tmp_path / "budget", every_s=0.005) as disk:
        assert _epoch([loader]) == want
    gets = {key: n - before.get(key, 0) for key, n in s3.gets("split-budget").items()}
    assert len(gets) == num_chunks and set(gets.values()) == {1}, gets
    assert max(in_flight) >= 3, in_flight
    assert 0 < disk.peak <= 10e6, disk.peak
    # Each chunk went at its node's last visit: none left, and no reference (a download of a chunk
    # only a co-worker reads took one of its own, never dropped: 10 chunks left in the benchmark)
    assert DiskPeak(tmp_path / "budget").size() == 0 and not list((tmp_path / "budget").rglob("*.cnt"))
    # The references are counted a block at a time as its downloads are handed over, not all before
    # the first batch (a file lock each: the first batch would wait on every chunk of the set).
    partial = iter(_loaders(url, meta, tmp_path / "first", 1, 2, s3.options, "10MB", global_batch=2)[0])
    assert len(next(partial)) == 2
    counted = len(list((tmp_path / "first").rglob("*.cnt")))
    del partial
    print(f"at most {disk.peak / 1e6:.1f} MB on disk, {max(in_flight)} GETs in flight, {counted} chunks counted "
          "at the first batch")
    assert 0 < counted <= num_chunks // 3, counted


def test_a_reader_fetches_a_chunk_no_co_worker_fetches_after_two_seconds(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 of two ranks on a node streams alone: half the chunks it reads are on the lists of
    rank 1's workers, which never start (a rank that started late, or a chunk deleted before a
    late reader counted its visits). Its readers fetch each such chunk themselves after
    ``CO_WORKER_GRACE_S``; LitData's own force download comes after 30 s (here never, so a
    reader waiting for it times out at 20 s). Rank 0's batches are those of a run where each
    rank fetches what it reads, and each chunk is fetched once."""
    from litdata.streaming import item_loader

    monkeypatch.setattr(item_loader, "_FORCE_DOWNLOAD_TIME", 1000)  # forked with the workers
    monkeypatch.setattr(item_loader, "_MAX_WAIT_TIME", 20)
    monkeypatch.setattr(chunk_cache, "CO_WORKER_GRACE_S", 0.3)
    url = s3.upload(chunks[0], "alone")
    reference = _loaders(url, chunks[1], tmp_path / "each", 2, 0, s3.options)[0]  # ranks not known: its own
    want = [hashlib.sha256(batch.images.numpy().tobytes()).hexdigest() for batch in reference]
    before = s3.gets("alone")
    loader = _loaders(url, chunks[1], tmp_path / "node", 2, 2, s3.options)[0]
    loader.dataset.ranks_on_node = 2
    assert [hashlib.sha256(batch.images.numpy().tobytes()).hexdigest() for batch in loader] == want
    gets = {key: n - before.get(key, 0) for key, n in s3.gets("alone").items()}
    assert gets and set(gets.values()) == {1}, gets


def test_a_wait_on_a_co_workers_chunk_asks_for_it_once_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_CoWorkerReadiness`` against a clock set by hand: LitData's wait asks for a chunk's readiness
    about once a second; the fetch is asked once a wait, after ``grace_s``; a chunk not asked about
    for 2.5 s starts a new wait."""
    from threading import Event

    now = [100.0]
    monkeypatch.setattr(chunk_cache, "time", lambda: now[0])
    asked: list[int] = []
    looked_up: set[int] = set()

    class Config:  # as LitData's ChunksConfig answers a ChunkedIndex: (path, begin, size)
        def __getitem__(self, index: Any) -> tuple[str, int, int]:
            looked_up.add(index.chunk_index)
            return (f"/nonexistent/chunk-{index.chunk_index}.bin", 0, 10)

    ready = chunk_cache._CoWorkerReadiness(lambda chunk: Event(), Config(), asked.append, grace_s=2.0)
    for t in (100.0, 101.0, 101.9):
        now[0] = t
        ready(7)
    assert asked == []
    for t in (102.0, 103.0, 104.0):  # 2 s into the wait: asked once
        now[0] = t
        ready(7)
    assert asked == [7]
    now[0] = 104.5
    ready(8)  # another chunk's wait is its own
    assert asked == [7]
    now[0] = 110.0  # chunk 7 not asked about since 104: a new wait
    ready(7)
    assert asked == [7]
    now[0] = 112.0
    ready(7)
    assert asked == [7, 7]
    assert looked_up == {7, 8}


def test_a_litdata_without_the_prefetch_switches_is_refused_when_the_loader_is_built(
    chunks: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from litdata.streaming.reader import PrepareChunksThread

    from seg_datamodule.io.stream.ordered import OrderedRecords

    for name in ("_slot_budget_enabled", "_maybe_delete_chunks", "_apply_delete"):
        with monkeypatch.context() as patch:
            patch.delattr(PrepareChunksThread, name)
            with pytest.raises(RuntimeError, match=rf"^litdata's prefetch thread has no {name}: its disk-slot gate "
                                                   r"and its deletes cannot follow the global order's visits "
                                                   r"\(verified on litdata 0\.2\.76\)$"):
                OrderedRecords(str(chunks[0]))


def test_one_ranks_workers_split_the_downloads_and_fetch_several_at_once(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path
) -> None:
    """One rank, two workers, 0.3 s per chunk GET: each chunk fetched once, and more than one
    GET per worker in flight (LitData's async prefetch on each worker's share of the chunks,
    ``plan.RankDownloads``). Fetching each chunk it reads under LitData's per-chunk lock, one
    at a time, as the ranks of a shared node do, a worker has one GET in flight: at most two."""
    url = s3.upload(chunks[0], "split")
    in_flight = s3.delay_chunk_gets(0.3)
    loader = _loaders(url, chunks[1], tmp_path / "cache", 1, 2, s3.options)[0]
    hashes = _epoch([loader])
    num_chunks = len([p for p in chunks[0].iterdir() if p.suffix == ".bin"])
    gets = s3.gets("split")
    assert len(gets) == num_chunks and set(gets.values()) == {1}, gets
    assert max(in_flight) >= 3, in_flight
    assert hashes == _epoch(_loaders(url, chunks[1], tmp_path / "cache0", 1, 0, s3.options))  # the same batches
    # The cache holds the set, so LitData deletes nothing and no reference is counted (a count per
    # chunk per worker, a file lock each, before the first batch): no count file mid-epoch.
    partial = iter(_loaders(url, chunks[1], tmp_path / "cache1", 1, 2, s3.options)[0])
    assert len(next(partial)) == GLOBAL_BATCH
    assert not list((tmp_path / "cache1").rglob("*.cnt"))
    del partial


def test_the_ranks_whose_workers_split_a_nodes_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Known (the DataModule's Trainer, or torchrun's ``LOCAL_WORLD_SIZE``), the node's ranks split
    its downloads; LitData's own count of nodes is trusted only for a rank alone on its node
    (on several CPU nodes it says one); simulated ranks (stepped in turn) never wait on each other."""
    from types import SimpleNamespace

    from litdata.utilities.env import _DistributedEnv

    from seg_datamodule.io.stream.ordered import OrderedRecords

    def on_node(known: int | None, simulated: bool, world: int, nodes: int) -> int | None:
        records = SimpleNamespace(ranks_on_node=known, _simulated=simulated)
        return OrderedRecords._ranks_on_node(records, _DistributedEnv(world, 0, nodes))  # type: ignore[arg-type]

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert on_node(None, False, 1, 1) == 1 and on_node(None, False, 4, 4) == 1  # alone on its node
    assert on_node(None, False, 4, 1) is None and on_node(None, True, 2, 1) is None  # may share: each its own
    assert on_node(4, False, 8, 1) == 4 and on_node(2, True, 2, 1) == 2  # told
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert on_node(None, False, 4, 1) == 2 and on_node(None, True, 4, 1) is None  # torchrun's, not a simulation's
    with pytest.raises(ValueError, match="ranks_on_node must be a positive divisor of the world size 4, got 3"):
        on_node(3, False, 4, 1)


def test_a_reader_sees_a_chunk_a_co_worker_published_within_milliseconds(tmp_path: Path) -> None:
    """LitData's own wait looks at the file once a second when its prefetch thread did not fetch
    the chunk; the wrapped provider (``chunk_cache.see_co_workers_downloads``) sees it at once."""
    import threading
    import time

    from litdata.streaming.item_loader import PyTreeLoader

    from seg_datamodule.io.stream.chunk_cache import ChunkReady, see_co_workers_downloads

    path = tmp_path / "chunk-0-0.bin"
    size = 10
    ready = ChunkReady(threading.Event(), str(path), size)
    assert ready.wait(0.05) is False  # nothing there
    path.write_bytes(b"x" * 4)
    assert ready.wait(0.05) is False  # still being written
    path.unlink()
    events: dict[int, threading.Event] = {}

    def waited(wrap: bool) -> float:
        """Seconds LitData's wait takes for a file another thread publishes after 0.2 s."""
        path.unlink(missing_ok=True)
        loader = PyTreeLoader()
        if wrap:
            see_co_workers_downloads(loader, _OneChunk(str(path), size))
        loader.set_chunk_ready_provider(lambda c: events.setdefault(c, threading.Event()))  # never set
        threading.Timer(0.2, lambda: path.write_bytes(b"x" * size)).start()
        start = time.perf_counter()
        loader._wait_until_chunk_ready(0, str(path), size)
        return time.perf_counter() - start

    theirs, ours = waited(wrap=False), waited(wrap=True)
    assert theirs >= 1.0  # LitData's: the event's 1 s timeout, then the file
    assert ours < theirs / 2, (ours, theirs)


class _OneChunk:
    """A ``ChunksConfig`` 's lookup for one file: any index is ``(path, begin, size)``."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size

    def __getitem__(self, index: Any) -> tuple[str, int, int]:
        return self.path, 0, self.size


def test_change_references_keeps_litdatas_count_file(tmp_path: Path) -> None:
    """The count LitData reads (``<chunk>.cnt``, an integer) moves by the delta at once; at 0 the
    file goes, as LitData's own decrement removes it; no downloader (a local set): nothing kept."""
    from types import SimpleNamespace

    from litdata.streaming.config import ChunksConfig

    from seg_datamodule.io.stream.chunk_cache import change_references

    chunk_file = tmp_path / "chunk-0-3.bin"
    config = SimpleNamespace(_downloader=object(), _chunk_lock_filepath=lambda c: str(tmp_path / f"chunk-0-{c}.bin"))
    count = Path(str(chunk_file) + ".cnt")
    assert change_references(config, 3, 4) == 4 and count.read_text() == "4"
    # LitData's own decrement reads and writes the same file
    assert ChunksConfig.decrement_local_lock(config, 3) == 3 and count.read_text() == "3"
    assert change_references(config, 3, -2) == 1 and count.read_text() == "1"
    assert change_references(config, 3, -5) == 0 and not count.exists()
    local = SimpleNamespace(_downloader=None, _chunk_lock_filepath=config._chunk_lock_filepath)
    assert change_references(local, 3, 2) == 0 and not count.exists()


HERE = Path(__file__).resolve().parent


def _run(out: Path, stream: str, *args: str) -> subprocess.CompletedProcess:
    """``_stream_run.py`` (two epochs of the demo model, a checkpoint every step) in its own process."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
    return run_child([sys.executable, str(HERE / "_stream_run.py"), str(out), stream, *args], env,
                     out.parent / f"logs-{out.name}", timeout_s=600)


@pytest.mark.slow
def test_ddp_ranks_of_a_node_split_its_downloads_and_train_on_the_global_batches(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path
) -> None:
    """DDP on two CPU processes x 2 workers from the S3 server (0.2 s a chunk GET), LitData's default
    cache (it holds the set): the DataModule tells the loader the Trainer's processes share the
    node (``ranks_on_node``), so the four workers split the node's chunks. Each chunk is fetched
    once in two epochs, more than one GET per worker is in flight (each worker fetching what it
    reads, one at a time, has at most one: 4), and the steps train on the global batches of one
    process with a batch of 8 (read from the same S3)."""
    import json

    url = s3.upload(chunks[0], "node")
    in_flight = s3.delay_chunk_gets(0.2)
    options = ("--max-cache-size", "none", "--storage-options", json.dumps(s3.options))
    ddp = _run(tmp_path / "ddp" / "run", url, "--batch-size", "4", "--devices", "2", "--workers", "2", *options)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    gets = s3.gets("node")
    num_chunks = len([p for p in chunks[0].iterdir() if p.suffix == ".bin"])
    assert len(gets) == num_chunks and set(gets.values()) == {1}, gets
    assert max(in_flight) > 4, in_flight
    one = _run(tmp_path / "one" / "run", url, "--batch-size", "8", *options)
    assert one.returncode == 0, one.stderr[-3000:]
    want, ranks = read_steps(tmp_path / "one" / "run"), [read_steps(tmp_path / "ddp" / "run", r) for r in (0, 1)]
    assert sorted(want) == sorted(ranks[0]) == sorted(ranks[1]) and len(want) == 12  # 6 steps an epoch
    for step in want:
        assert ranks[0][step]["image_ids"] + ranks[1][step]["image_ids"] == want[step]["image_ids"], step


@pytest.mark.slow
@pytest.mark.extended  # four real runs: DDP on two CPU processes, then on four
def test_sigkill_at_two_ranks_then_resume_on_one_and_on_four_gives_the_uninterrupted_global_batches(
    chunks: tuple[Path, dict], tmp_path: Path
) -> None:
    """Killed (SIGKILL) at step 3 of 2 ranks x batch 4, resumed from its last checkpoint on 1 rank x
    batch 8 and on 4 ranks x batch 2: every step to the end of the next epoch trains on the images,
    in the order, of a straight 1 x 8 run (pixels differ across world sizes: mosaic partners come
    from the rank's batch)."""
    source = str(chunks[0])
    straight = _run(tmp_path / "straight" / "run", source, "--batch-size", "8")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "killed" / "run", source, "--batch-size", "4", "--devices", "2", "--kill-at", "3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    # A copy: the resumed runs write their own checkpoints where the killed run wrote its.
    at_kill = shutil.copy(tmp_path / "killed" / "ckpt" / "last.ckpt", tmp_path / "at_kill.ckpt")
    resumed = _run(tmp_path / "killed" / "resumed", source, "--batch-size", "8", "--ckpt", str(at_kill))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = read_steps(tmp_path / "straight" / "run"), read_steps(tmp_path / "killed" / "resumed")
    before = [read_steps(tmp_path / "killed" / "run", rank) for rank in (0, 1)]
    assert min(got) == 3 and max(got) == max(want) == 11
    for step in range(3):  # the killed run's global batches were the straight run's too
        assert before[0][step]["image_ids"] + before[1][step]["image_ids"] == want[step]["image_ids"], step
    for step in got:
        assert (got[step]["epoch"], got[step]["image_ids"]) == (want[step]["epoch"], want[step]["image_ids"]), step
    four = _run(tmp_path / "killed" / "resumed4", source, "--batch-size", "2", "--devices", "4", "--ckpt", str(at_kill))
    assert four.returncode == 0, four.stderr[-3000:]
    ranks = [read_steps(tmp_path / "killed" / "resumed4", rank) for rank in range(4)]
    assert all(sorted(r) == sorted(got) for r in ranks)
    for step in got:  # the four ranks' batches of a step, in rank order, are the straight run's batch
        assert [r[step]["epoch"] for r in ranks] == [want[step]["epoch"]] * 4, step
        assert sum((r[step]["image_ids"] for r in ranks), []) == want[step]["image_ids"], step
    # Where every annotation went, counted across a resume on another world size: each trained image
    # is in 4 mosaics of its rank's batch, so the ranks' outcomes sum to the straight run's total
    # (a rank's counts of the killed run are dealt to the resumed ranks, none dropped).
    total = sum(read_counts(tmp_path / "straight" / "run")["train"].values())
    assert total > 0
    assert sum(read_counts(tmp_path / "killed" / "resumed")["train"].values()) == total
    assert sum(sum(read_counts(tmp_path / "killed" / "resumed4", r)["train"].values()) for r in range(4)) == total
