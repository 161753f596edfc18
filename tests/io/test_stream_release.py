"""A streamed epoch left before its end releases its workers at once (issue 60).

Before: torch asked each LitData worker to stop and joined it with a 5 s timeout, and a worker
reads the request only between batches; one waiting on a chunk download finished that batch
first, so every early stop of a streamed run waited up to 10 s for batches nobody reads. Here the
downloads are made slow on purpose (a known, injected cost), and the release is compared with it.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

pytest.importorskip("litdata")

from seg_datamodule.data.datamodule import COCOSegDataModule  # noqa: E402
from seg_datamodule.data.loaders import streaming  # noqa: E402
from seg_datamodule.io.coco import IndexOptions  # noqa: E402
from seg_datamodule.io.stream import ChunkOptions, convert_coco  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*max_cache_size.*")

#: What each chunk download costs while the flag file exists (the injected cost).
DOWNLOAD_S = 5.0  # the release takes 0.6 s on an idle machine, up to 1.9 s under a full test run beside training


@pytest.fixture
def slow_downloads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Chunk downloads of ``local:`` sources take :data:`DOWNLOAD_S` while the returned file exists
    (the workers are forked: they inherit the patch, and see the file go)."""
    from litdata.streaming import downloader

    flag = tmp_path / "slow"
    flag.touch()
    original = downloader.LocalDownloader.download_file

    def slow(self, remote: str, local: str) -> None:
        if flag.exists() and not remote.endswith("index.json"):
            time.sleep(DOWNLOAD_S)
        original(self, remote, local)

    monkeypatch.setattr(downloader.LocalDownloader, "download_file", slow)
    return flag


@pytest.mark.slow
def test_an_abandoned_epoch_releases_its_workers_at_once_and_the_next_epoch_is_whole(
        demo_dir: Path, tmp_path: Path, slow_downloads: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "stream"
    meta = convert_coco(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017", str(out),
                        IndexOptions(), ChunkOptions(chunk_bytes="128KB", start_method="fork"))
    dm = COCOSegDataModule(train_stream=f"local:{out}", image_size=96, batch_size=4, num_workers=2,
                           stream_cache_dir=str(tmp_path / "cache"),
                           stream_max_cache_size="300KB")
    dm.setup("fit")
    loader = dm.train_dataloader()
    stopped = []
    monkeypatch.setattr(streaming, "release_workers", _counting(streaming.release_workers, stopped))

    epoch = iter(loader)
    first = next(epoch)  # each worker then waits on its next chunk, DOWNLOAD_S away
    assert len(first) == 4
    start = time.perf_counter()
    del epoch
    gc.collect()
    released = time.perf_counter() - start
    assert stopped == [True], stopped  # the workers were stopped here, not by torch's 5 s joins
    assert released < DOWNLOAD_S / 2, f"released in {released:.2f} s; a download in progress takes {DOWNLOAD_S} s"

    # Nothing the ended workers held is needed again: the next epoch streams every image once.
    slow_downloads.unlink()
    ids = [i for batch in loader for i in batch.image_ids.tolist()]
    assert sorted(ids) == sorted(meta["image_ids"])


def _counting(function, calls: list):
    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(result)
        return result

    return wrapper
