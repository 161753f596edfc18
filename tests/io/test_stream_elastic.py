"""Streamed global batches from a real S3 API (moto on 127.0.0.1): every world size and worker count (issue 63).

Simulated ranks: one loader per rank (``world=(rank, W)``), all sharing one chunk cache as the
ranks of one node do, iterated in lockstep; a step's global batch is the ranks' batches
concatenated in rank order, hashed (image ids and pixels). The reference is the same sequence at
``W = 1`` with no workers; downloads are counted from the server's request log.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("litdata")

from _datasets import make_dataset  # noqa: E402
from _s3_server import LoopbackS3  # noqa: E402

from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402
from seg_datamodule.data.config.options import StreamOptions  # noqa: E402
from seg_datamodule.data.loaders.streaming import stream_train_loader  # noqa: E402
from seg_datamodule.io.stream import ChunkOptions, convert_coco, window_from_meta  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*max_cache_size.*"),
              pytest.mark.filterwarnings("ignore:.*worker processes in total.*:UserWarning"),  # 4 workers on 2 cores
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

GLOBAL_BATCH = 8  # 48 demo images: 6 global batches an epoch


@pytest.fixture(scope="module")
def chunks(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("elastic") / "chunks"
    meta = convert_coco(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017", str(out),
                        chunk_options=ChunkOptions(start_method="fork", chunk_bytes="200KB"))
    return out, meta


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
    """One epoch of the ranks in lockstep: the hash of each step's global batch."""
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


@pytest.mark.parametrize("max_cache_size", [None, "1MB"])
def test_chunk_downloads_per_epoch_per_node(
    s3: LoopbackS3, chunks: tuple[Path, dict], tmp_path: Path, max_cache_size: str | None
) -> None:
    """Two ranks of one node (one cache), two workers each, two epochs, GETs counted from the
    server's log. None: LitData's default cache (it holds the whole set): each chunk read in the
    first epoch, never again; some chunks twice on this busy 2-core machine (two workers of the
    node fetch a chunk at the same moment and LitData's per-chunk download lock, taken with
    timeout 0 and removed after use, lets both through; of 4 runs here 2 had no second GET, 2 had
    8 and 10 of the 12 chunks fetched twice),
    an open gap of issue 63. 1MB (about 5 of the 12 chunks, less than the set): LitData deletes a
    chunk whenever a worker leaves it with no other worker holding it, and in the global order a
    worker comes back to a chunk for its next batch of the same block, so some chunks are
    downloaded twice an epoch (an open gap of issue 63: measured, bounded here at 2)."""
    prefix = f"once{max_cache_size or ''}"
    url = s3.upload(chunks[0], prefix)
    loaders = _loaders(url, chunks[1], tmp_path / "cache", 2, 2, s3.options, max_cache_size)
    num_chunks = len([p for p in chunks[0].iterdir() if p.suffix == ".bin"])
    per_epoch = []
    for _ in range(2):
        before = s3.gets(prefix)
        _epoch(loaders)
        after = s3.gets(prefix)
        per_epoch.append({key: after[key] - before.get(key, 0) for key in after})
    print(f"max_cache_size {max_cache_size}: GETs per chunk per epoch {[sorted(e.values()) for e in per_epoch]}")
    assert len(per_epoch[0]) == num_chunks  # every chunk was read
    assert max(per_epoch[0].values()) <= 3
    if max_cache_size is None:
        assert sum(per_epoch[1].values()) == 0  # the cache kept them all
    else:
        assert max(per_epoch[1].values()) <= 3
