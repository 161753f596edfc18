"""Training batches streamed from LitData chunks, built in the workers by the map-style sample path.

* :class:`StreamBatchCollate`: the DataLoader ``collate_fn`` (it runs in the worker): binds the
  batch's records to a :class:`~seg_datamodule.io.stream.records.RecordWindow`, builds the
  samples with :class:`~seg_datamodule.data.samples.dataset.SegDataset` (mosaic partners from the batch,
  one decode per image, the same per-sample seeds ``(seed, epoch, index)``) and collates them with
  :class:`~seg_datamodule.data.batching.collate.DetectionCollate`. A streamed batch is therefore
  bit-identical to the map-style batch of the same images in the same order.
* :class:`StreamTrainLoader`: a ``litdata.StreamingDataLoader`` that Lightning checkpoints, with
  two fixes: the state it saves is the one after the batches training consumed (Lightning fetches
  one ahead), and LitData's ``restore`` flag is cleared on the second ``iter()`` after a resume
  (LitData 0.2.76 clears it only when an epoch is exhausted, which Lightning does not do, so the
  next epoch replayed the old tail). Its delivered counts are the map-style loader's
  (:class:`~seg_datamodule.data.counts.DeliveredCounts`). An epoch left before its end (an early
  stop) releases its workers at once (:func:`~seg_datamodule.data.loaders.release.release_workers`),
  not after their batch in progress, whose chunk may still be downloading.

The records themselves (:class:`~seg_datamodule.io.stream.loader.StreamRecords`, checked before
LitData reads them) come from :mod:`seg_datamodule.io.stream`. Needs ``seg-datamodule[stream]``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from litdata import StreamingDataLoader
from litdata.streaming.dataloader import _StreamingMultiProcessingDataLoaderIter

from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.data.config.options import StreamOptions
from seg_datamodule.data.counts import DeliveredCounts, batch_counts
from seg_datamodule.data.loaders.release import release_workers
from seg_datamodule.data.loaders.resume import current_rank
from seg_datamodule.io.stream.loader import StreamRecords, check_litdata
from seg_datamodule.io.stream.records import RecordWindow
from seg_datamodule.structures import DetectionBatch, SampleBatch

__all__ = ["StreamBatchCollate", "StreamTrainLoader", "stream_train_loader"]


class StreamBatchCollate:
    """``collate_fn``: a list of records -> a :class:`DetectionBatch`, in the DataLoader worker.

    Args:
        dataset (SegDataset): training dataset over a :class:`RecordWindow`, with
            ``cache_images=0`` (a window holds only its own batch, so a cache would never hit).
        collate (DetectionCollate): the map-style collate.

    Raises:
        TypeError: ``dataset`` is not a training ``SegDataset`` over a ``RecordWindow``.
    """

    def __init__(self, dataset: SegDataset, collate: DetectionCollate) -> None:
        if not isinstance(dataset, SegDataset) or not isinstance(dataset.index, RecordWindow):
            raise TypeError(f"dataset must be a SegDataset over a RecordWindow, got {dataset!r:.80}")
        if not dataset.train:
            raise ValueError("streaming builds training batches: dataset.train must be True")
        self.dataset, self.collate = dataset, collate

    def __call__(self, records: Sequence[dict[str, Any]]) -> DetectionBatch:
        return self.collate(self.samples(records))

    def samples(self, records: Sequence[dict[str, Any]]) -> SampleBatch:
        """The batch's samples and their counts, before collation."""
        window: RecordWindow = self.dataset.index  # type: ignore[assignment]
        window.bind(records)
        try:
            items = [(int(r.get("epoch", self.dataset.epoch)), int(r["index"])) for r in records]
            return self.dataset.__getitems__(items)
        finally:
            window.bind(())  # drop the pixels' bytes as soon as the batch is built


class _ReleasingIterator(_StreamingMultiProcessingDataLoaderIter):
    """LitData's multi-process iterator whose workers are released at once when it is left."""

    def _shutdown_workers(self) -> None:
        release_workers(self)
        super()._shutdown_workers()


class StreamTrainLoader(StreamingDataLoader):
    """``StreamingDataLoader`` with consumed-batch checkpoints, the restore fix and delivered counts.

    Args:
        dataset (StreamRecords): the records.
        progress: returns how many batches of the current epoch training consumed (the
            DataModule passes the Trainer's count); ``None``: the batches handed out.
        counts: where delivered counts go (a reloaded loader continues its predecessor's).
        **kwargs: as for ``StreamingDataLoader`` (``collate_fn`` a :class:`StreamBatchCollate`).
    """

    def __init__(self, dataset: StreamRecords, *, progress: Callable[[], int] | None = None,
                 counts: DeliveredCounts | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        check_litdata(self)
        self.progress = progress
        self._iters_since_restore = 0
        self._marks: list[tuple[int, int]] = []  # after each batch handed out this epoch
        self._first_mark: tuple[int, int] = (0, 0)
        self.counts = DeliveredCounts() if counts is None else counts  # the map-style loader's (per rank under DDP)
        self._iteration = 0  # which iter() the counted batches came from (the "epoch" of DeliveredCounts)
        self._loaded: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        # LitData 0.2.76 clears `restore` only when an epoch runs to StopIteration; Lightning stops
        # at len(loader) batches, so after a mid-epoch resume the next epoch replayed the old tail.
        if self.restore:
            self._iters_since_restore += 1
            if self._iters_since_restore > 1:
                self.restore = False
        else:
            self._iters_since_restore = 0
        self._first_mark = (self._num_samples_yielded_streaming if self.restore else 0,
                            self._latest_worker_idx if self.restore else 0)
        self._marks = []
        self._loaded = None
        self._iteration += 1
        for batch in super().__iter__():
            self.counts.add(self._iteration, len(self._marks), batch_counts(batch))
            self._marks.append((self._num_samples_yielded_streaming, self._latest_worker_idx))
            yield batch

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return _ReleasingIterator(self)

    def _unconsumed(self) -> int:
        """Batches handed out this epoch that training has not taken (fetched ahead)."""
        if self.progress is None or not self._marks:
            return 0
        resumed = 0 if self._first_mark == (0, 0) else self._first_mark[0] // max(1, int(self.batch_size or 1))
        return max(0, len(self._marks) + resumed - int(self.progress()))

    @property
    def delivered_counts(self) -> dict[str, int]:
        """Annotation and decode counts of the batches training consumed."""
        return self.counts.consumed(self._iteration, len(self._marks) - self._unconsumed())

    def state_dict(self) -> dict[str, Any]:
        """LitData's state, taken after the last batch training consumed, plus delivered counts."""
        ahead = self._unconsumed()
        saved = (self._num_samples_yielded_streaming, self._latest_worker_idx)
        if ahead:
            k = len(self._marks) - ahead
            mark = self._marks[k - 1] if k > 0 else self._first_mark
            self._num_samples_yielded_streaming, self._latest_worker_idx = mark
        try:
            state = super().state_dict()
            state["dataset"] = dict(state["dataset"])  # LitData hands out its live dict
        finally:
            self._num_samples_yielded_streaming, self._latest_worker_idx = saved
        # Every rank's counts (rank 0 alone writes the checkpoint), as the map-style loader saves them.
        state["delivered_counts"] = self.counts.state(self._iteration, len(self._marks) - self._unconsumed())
        return state

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Resume from ``obj``; a second load of the same state before iterating is ignored."""
        key = (int(obj["current_epoch"]), int(obj["num_samples_yielded"]))
        if self._loaded == key:
            return
        super().load_state_dict(obj)
        self._loaded = key
        self._iters_since_restore = 0
        self.counts.load(obj.get("delivered_counts", {}), current_rank())
        self._marks = []


def stream_train_loader(
    stream: StreamOptions,
    dataset: SegDataset,
    collate: DetectionCollate,
    *,
    batch_size: int,
    progress: Callable[[], int] | None = None,
    **loader_kwargs: Any,
) -> StreamTrainLoader:
    """A :class:`StreamTrainLoader` of shuffled records from ``stream.source`` built into batches by ``dataset``.

    Build it in ``setup()`` or later: LitData reads the ranks when the dataset is constructed.
    LitData shuffles the chunks and the items within them with ``dataset.seed``.

    Args:
        stream (StreamOptions): the source (``local:/path``, copied through the cache as a remote
            would be; a plain path, read in place; or ``s3://...``) and LitData's cache and
            storage options.
        dataset (SegDataset): a training dataset over the source's :class:`RecordWindow`
            (see :func:`~seg_datamodule.io.stream.loader.window_from_meta`).
        collate (DetectionCollate): the collate of the map-style path.
        batch_size (int): as for the map-style loader.
        progress: batches of the epoch training consumed (see :class:`StreamTrainLoader`).
        **loader_kwargs: more ``DataLoader`` arguments (``num_workers``, ``pin_memory``,
            ``prefetch_factor``, ``worker_init_fn``, ``persistent_workers``).
    """
    records = StreamRecords(stream.source, cache_dir=stream.cache_dir, shuffle=True, seed=dataset.seed,
                            max_cache_size=stream.max_cache_size, storage_options=dict(stream.storage_options))
    return StreamTrainLoader(records, batch_size=batch_size, collate_fn=StreamBatchCollate(dataset, collate),
                             progress=progress, **loader_kwargs)
