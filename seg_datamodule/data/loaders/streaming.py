"""Training batches streamed from LitData chunks, built in the workers by the map-style sample path.

* :class:`StreamBatchCollate`: the DataLoader ``collate_fn`` (it runs in the worker): binds the
  batch's records to a :class:`~seg_datamodule.io.stream.records.RecordWindow`, builds the
  samples with :class:`~seg_datamodule.data.samples.dataset.SegDataset` (mosaic partners from the batch,
  one decode per image, the same per-sample seeds ``(seed, epoch, index)``) and collates them with
  :class:`~seg_datamodule.data.batching.collate.DetectionCollate`. A streamed batch is therefore
  bit-identical to the map-style batch of the same images in the same order.
* :class:`StreamTrainLoader`: a ``litdata.StreamingDataLoader`` over
  :class:`~seg_datamodule.io.stream.ordered.OrderedRecords`, which streams the global order of
  :mod:`seg_datamodule.io.stream.order` (issue 63): the same global batches for every world size
  and ``num_workers``. Lightning checkpoints its state, ``(seed, epoch, global items consumed)``
  taken after the batches training consumed (Lightning fetches one ahead); it resumes at the
  next global batch on another world size. Its delivered counts are the map-style loader's
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
from seg_datamodule.io.stream.loader import check_litdata
from seg_datamodule.io.stream.order import DEFAULT_WINDOW, OrderState, per_rank_batch
from seg_datamodule.io.stream.ordered import OrderedRecords
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
        records = _in_order(records)
        window.bind(records)
        try:
            items = [(int(r.get("epoch", self.dataset.epoch)), int(r["index"])) for r in records]
            return self.dataset.__getitems__(items)
        finally:
            window.bind(())  # drop the pixels' bytes as soon as the batch is built


def _in_order(records: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    """A batch's records in their global order (read chunk by chunk), checked to be one run of it.

    Raises:
        RuntimeError: the positions are not one contiguous run of the order (LitData did not
            serve the plan it was given).
    """
    if not records or "position" not in records[0]:
        return records
    records = sorted(records, key=lambda r: int(r["position"]))
    positions = [int(r["position"]) for r in records]
    if positions[0] < 0 or positions != list(range(positions[0], positions[0] + len(positions))):
        raise RuntimeError(f"LitData served a batch outside the global order (positions {positions[:8]}...): the "
                           "private plan seg_datamodule.io.stream.ordered sets has stopped working with this LitData")
    return records


class _ReleasingIterator(_StreamingMultiProcessingDataLoaderIter):
    """LitData's multi-process iterator whose workers are released at once when it is left."""

    def _shutdown_workers(self) -> None:
        release_workers(self)
        super()._shutdown_workers()


class StreamTrainLoader(StreamingDataLoader):
    """``StreamingDataLoader`` over the global order, with elastic checkpoints and delivered counts.

    Its state is :class:`~seg_datamodule.io.stream.order.OrderState` ``(seed, epoch, global items
    consumed)``, taken after the batches training consumed (Lightning fetches one ahead), plus the
    delivered counts. It resumes at the next global batch on any world size and ``num_workers``
    that keep the global batch (``batch_size x world_size``); LitData's own loader state and its
    ``restore`` flag are not used.

    Args:
        dataset (OrderedRecords): the records.
        progress: returns how many batches of the current epoch training consumed (the
            DataModule passes the Trainer's count); ``None``: the batches handed out.
        counts: where delivered counts go (a reloaded loader continues its predecessor's).
        **kwargs: as for ``StreamingDataLoader`` (``collate_fn`` a :class:`StreamBatchCollate`).

    Raises:
        TypeError: ``dataset`` is not an :class:`OrderedRecords`.
    """

    def __init__(self, dataset: OrderedRecords, *, progress: Callable[[], int] | None = None,
                 counts: DeliveredCounts | None = None, **kwargs: Any) -> None:
        if not isinstance(dataset, OrderedRecords):
            raise TypeError(f"dataset must be an OrderedRecords, got {type(dataset).__name__}")
        super().__init__(dataset, **kwargs)
        check_litdata(self)
        dataset.global_batch = int(self.batch_size or 1) * dataset.world_size
        self.progress = progress
        self.counts = DeliveredCounts() if counts is None else counts  # the map-style loader's (per rank under DDP)
        self._iteration = 0  # which iter() the counted batches came from (the "epoch" of DeliveredCounts)
        self._handed = 0  # batches handed out by this iter()
        self._first = 0  # global batches of the epoch trained on before this iter() (a resumed epoch)
        self._resume: OrderState | None = None
        self._loaded: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        dataset: OrderedRecords = self.dataset  # type: ignore[assignment]
        if self._resume is not None:
            self.current_epoch = self._resume.epoch  # LitData's __iter__ adds one (it counts from 1)
            dataset.start = self._resume.consumed
            self._resume = None
        else:
            dataset.start = 0
        self.restore = False
        self._first = -(-dataset.start // int(dataset.global_batch or 1))
        self._handed = 0
        self._iteration += 1
        for batch in super().__iter__():
            self.counts.add(self._iteration, self._handed, batch_counts(batch))
            self._handed += 1
            yield batch

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return _ReleasingIterator(self)

    def _consumed_batches(self) -> int:
        """Batches of the current epoch training consumed (this rank's; the same on every rank)."""
        if self.progress is None:
            return self._first + self._handed
        return max(self._first, min(self._first + self._handed, int(self.progress())))

    @property
    def delivered_counts(self) -> dict[str, int]:
        """Annotation and decode counts of the batches training consumed."""
        return self.counts.consumed(self._iteration, self._consumed_batches() - self._first)

    def order_state(self) -> OrderState:
        """Where the run is in the global order, after the batches training consumed."""
        if self._resume is not None:  # loaded and not streamed yet
            return self._resume
        dataset: OrderedRecords = self.dataset  # type: ignore[assignment]
        size = int(dataset.global_batch or 1)
        epoch, batches = max(0, int(self.current_epoch) - 1), self._consumed_batches()
        if self.current_epoch > 0 and batches >= dataset.batches_in_epoch():
            # The epoch's last batch was trained on: a resume starts the next epoch (Lightning
            # resumes there with one iter(), not with an empty one for the finished epoch first).
            epoch, batches = epoch + 1, 0
        consumed = min(batches * size, dataset.num_records)
        return OrderState(seed=int(dataset.seed), epoch=epoch, consumed=consumed, global_batch=size,
                          window=dataset.window, chunks=dataset.digest)

    def state_dict(self) -> dict[str, Any]:
        """The :class:`OrderState` (as a dict, under ``"order"``) and every rank's delivered counts."""
        # Every rank's counts (rank 0 alone writes the checkpoint), as the map-style loader saves them.
        return {"order": self.order_state().to_dict(),
                "delivered_counts": self.counts.state(self._iteration, self._consumed_batches() - self._first)}

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Resume from ``obj`` at its next global batch; a second load of the same state is ignored.

        Raises:
            ValueError: a state without the global order (LitData's own, saved before it), another
                seed or chunk set, or a global batch this world size cannot keep (naming the batch
                sizes that keep it).
        """
        if "order" not in obj:
            raise ValueError("this checkpoint's streamed loader state has no global order (it was saved by a "
                             "version that followed LitData's shuffle); it cannot be resumed in the global order")
        state = OrderState.from_dict(obj["order"])
        if (state.epoch, state.consumed) == self._loaded:
            return
        dataset: OrderedRecords = self.dataset  # type: ignore[assignment]
        if state.seed != int(dataset.seed):
            raise ValueError(f"the checkpoint streamed with seed {state.seed}, this run has seed {dataset.seed}: "
                             "the global order would differ")
        if state.chunks and state.chunks != dataset.digest:
            raise ValueError("the checkpoint streamed another chunk set (its chunk sizes differ from "
                             f"{dataset.input_dir.url or dataset.input_dir.path}'s)")
        per_rank_batch(state.global_batch, dataset.world_size, int(self.batch_size or 1))
        dataset.global_batch, dataset.window = state.global_batch, state.window
        self._resume = state
        self._loaded = (state.epoch, state.consumed)
        self.counts.load(obj.get("delivered_counts", {}), current_rank(), dataset.world_size)


def stream_train_loader(
    stream: StreamOptions,
    dataset: SegDataset,
    collate: DetectionCollate,
    *,
    batch_size: int,
    progress: Callable[[], int] | None = None,
    window: int = DEFAULT_WINDOW,
    world: tuple[int, int] | None = None,
    **loader_kwargs: Any,
) -> StreamTrainLoader:
    """A :class:`StreamTrainLoader` of shuffled records from ``stream.source`` built into batches by ``dataset``.

    Build it in ``setup()`` or later: LitData reads the ranks when the dataset is constructed.
    The order is :func:`~seg_datamodule.io.stream.order.epoch_order` with ``dataset.seed``.

    Args:
        stream (StreamOptions): the source (``local:/path``, copied through the cache as a remote
            would be; a plain path, read in place; or ``s3://...``) and LitData's cache and
            storage options.
        dataset (SegDataset): a training dataset over the source's :class:`RecordWindow`
            (see :func:`~seg_datamodule.io.stream.loader.window_from_meta`).
        collate (DetectionCollate): the collate of the map-style path.
        batch_size (int): as for the map-style loader.
        progress: batches of the epoch training consumed (see :class:`StreamTrainLoader`).
        window (int): chunks whose items are shuffled together.
        world (tuple[int, int] | None): ``(rank, world_size)`` to stream as (simulated ranks);
            None: the process group's.
        **loader_kwargs: more ``DataLoader`` arguments (``num_workers``, ``pin_memory``,
            ``prefetch_factor``, ``worker_init_fn``, ``persistent_workers``).

    Raises:
        ValueError: ``dataset`` draws mosaic partners over the dataset (``mosaic_partners="uniform"``):
            a stream holds only the batch's records.
    """
    a = dataset.augment
    if a.mosaic > 0 and a.geometry.mosaic_capable and a.mosaic_partners == "uniform":
        raise ValueError(f"mosaic_partners 'uniform' draws partners over the whole dataset, which a stream "
                         f"({stream.source}) cannot read at random: build the dataset with mosaic_partners 'batch'")
    records = OrderedRecords(stream.source, cache_dir=stream.cache_dir, seed=dataset.seed, window=window, world=world,
                             max_cache_size=stream.max_cache_size, storage_options=dict(stream.storage_options))
    return StreamTrainLoader(records, batch_size=batch_size, collate_fn=StreamBatchCollate(dataset, collate),
                             progress=progress, **loader_kwargs)
