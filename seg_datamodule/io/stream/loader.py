"""Training batches streamed from LitData chunks, built in the workers by the map-style machinery.

* :class:`StreamRecords`: a ``litdata.StreamingDataset`` of records that tags each record with
  the epoch being streamed (0-based, as Lightning counts). It trusts nothing in the chunk set:
  ``index.json`` is checked against the record schema
  (:func:`~seg_datamodule.io.stream.source.check_stream_index`) before LitData reads it, in the
  process that builds the loader and again in every worker (each opens the chunks itself), and
  every LitData serializer but the schema's three is replaced by one that refuses (so even an
  ``index.json`` swapped after the check cannot select ``pickle``).
* :class:`StreamBatchCollate`: the DataLoader ``collate_fn`` (it runs in the worker): binds the
  batch's records to a :class:`~seg_datamodule.io.stream.records.RecordWindow`, builds the
  samples with :class:`~seg_datamodule.data.dataset.SegDataset` (mosaic partners from the batch,
  one decode per image, the same per-sample seeds ``(seed, epoch, index)``) and collates them with
  :class:`~seg_datamodule.data.collate.DetectionCollate`. A streamed batch is therefore
  bit-identical to the map-style batch of the same images in the same order.
* :class:`StreamTrainLoader`: a ``litdata.StreamingDataLoader`` that Lightning checkpoints, with
  two fixes: the state it saves is the one after the batches training consumed (Lightning fetches
  one ahead), and LitData's ``restore`` flag is cleared on the second ``iter()`` after a resume
  (LitData 0.2.76 clears it only when an epoch is exhausted, which Lightning does not do, so the
  next epoch replayed the old tail).

Differences from the map-style loader: which images share a batch depends on LitData's
chunk-wise shuffle, ``seed`` and ``num_workers`` (batches are the same for 0 and 1 workers, not
for 2 and 4; fixed for a fixed worker count); under DDP LitData drops the tail that does not
split into whole batches per rank (counted by :func:`stream_drop_count`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.serializers import _SERIALIZERS, Serializer

from seg_datamodule.compat import require_version, verified_note
from seg_datamodule.data.collate import DetectionCollate
from seg_datamodule.data.dataset import SegDataset
from seg_datamodule.data.resume import DeliveredCounts, current_rank
from seg_datamodule.io.stream.endpoint import s3_storage_options
from seg_datamodule.io.stream.records import RecordWindow
from seg_datamodule.io.stream.schema import RECORD_SCHEMA, StreamFormatError
from seg_datamodule.io.stream.source import check_stream_index
from seg_datamodule.structures import DetectionBatch

__all__ = [
    "RefusedSerializer", "StreamBatchCollate", "StreamRecords", "StreamTrainLoader", "check_litdata",
    "schema_serializers", "stream_drop_count", "stream_train_loader", "window_from_meta",
]


def check_litdata(loader: object | None = None) -> None:
    """Raise unless LitData is the release the state fixes were verified on (and, given a
    ``loader``, it has the private counters they rewrite). Called at import.

    :class:`StreamTrainLoader` rewrites LitData's private counters and ``restore`` flag; with
    another release they may mean something else and a resumed run would see other samples.

    Raises:
        ImportError: another LitData is installed (the message names the supported release).
        RuntimeError: ``loader`` lacks one of the counters.
    """
    require_version("litdata_state", extra="stream")
    missing = [n for n in _LITDATA_STATE if loader is not None and not hasattr(loader, n)]
    if missing:
        raise RuntimeError(f"litdata.StreamingDataLoader has no {', '.join(missing)}: StreamTrainLoader's "
                           f"checkpoints need them ({verified_note('litdata_state')})")


_LITDATA_STATE = ("restore", "_num_samples_yielded_streaming", "_latest_worker_idx")
check_litdata()


def window_from_meta(meta: dict[str, Any], name: str = "stream") -> RecordWindow:
    """The :class:`RecordWindow` of a converted dataset (metadata from
    :func:`~seg_datamodule.io.stream.source.check_stream_source`)."""
    return RecordWindow(np.asarray(meta["image_ids"], np.int64), np.asarray(meta["heights"], np.int64),
                        np.asarray(meta["widths"], np.int64), name=name)


def stream_drop_count(num_records: int, world_size: int, batch_size: int) -> int:
    """Records per epoch LitData 0.2.76 leaves out under DDP (``drop_last`` is forced on with ranks > 1).

    It deals whole batches: every rank gets ``(num_records // batch_size) // world_size`` batches
    (split over its workers), and the rest of the records is not streamed that epoch. Single
    process: nothing is dropped (the last worker takes the remainder).
    """
    if world_size <= 1:
        return 0
    return int(num_records - (num_records // batch_size // world_size) * batch_size * world_size)


class RefusedSerializer(Serializer):
    """A LitData serializer that refuses to read: what every serializer outside the schema becomes.

    LitData's item loader calls ``setup`` when it reads the chunk set's config, before any chunk,
    so a ``data_format`` naming ``pickle`` (or ``numpy``, ``file``, ...) stops there.

    Args:
        name: the serializer it replaces, for the message.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def _refuse(self, what: Any = None) -> StreamFormatError:
        return StreamFormatError(
            f"index.json: field 'config.data_format': {what or self.name!r} is not a serializer of the record "
            "schema; refusing to deserialize any chunk with it", path="index.json", field="config.data_format")

    def setup(self, metadata: Any) -> None:
        raise self._refuse(metadata)

    def serialize(self, data: Any) -> tuple[bytes, str | None]:
        raise self._refuse()

    def deserialize(self, data: bytes) -> Any:
        raise self._refuse()

    def can_serialize(self, data: Any) -> bool:
        return False


def schema_serializers() -> dict[str, Serializer]:
    """LitData's serializers with every one the record schema does not use replaced by a refusal."""
    used = {kind if isinstance(kind, str) else "no_header_numpy" for _, kind in RECORD_SCHEMA}
    return {name: RefusedSerializer(name) for name in _SERIALIZERS if name not in used}


class StreamRecords(StreamingDataset):
    """A ``StreamingDataset`` of checked records that carry ``"epoch"``: the 0-based epoch being streamed.

    The source's ``index.json`` is checked before LitData reads it, here and in every worker
    (:meth:`_create_cache`, where each worker opens its chunks); the serializers are
    :func:`schema_serializers`.

    Args:
        input_dir: the source (a folder, ``local:/folder``, a bucket URL).
        **kwargs: as for ``litdata.StreamingDataset`` (``storage_options`` completed by
            :func:`~seg_datamodule.io.stream.endpoint.s3_storage_options`) (keywords only; not ``serializers``,
            ``item_loader`` or ``index_path``).

    Raises:
        FileNotFoundError, StreamFormatError: see
            :func:`~seg_datamodule.io.stream.source.check_stream_index`.
        TypeError: ``serializers``, ``item_loader`` or ``index_path`` given.
    """

    def __init__(self, input_dir: str, **kwargs: Any) -> None:
        given = sorted(set(kwargs) & {"serializers", "item_loader", "index_path"})
        if given:  # each would let LitData read something other than the checked index and schema
            raise TypeError(f"StreamRecords reads the checked record schema only: {given} cannot be given")
        kwargs["storage_options"] = s3_storage_options(input_dir, kwargs.get("storage_options"))
        check_stream_index(input_dir, kwargs["storage_options"])
        super().__init__(input_dir, serializers=schema_serializers(), **kwargs)

    def _create_cache(self, worker_env: Any) -> Any:
        # Each worker builds its own reader (and LitData downloads index.json again for a remote or
        # `local:` source): check what it is about to read, first. A private LitData hook: the
        # swapped-index tests in tests/io/test_stream_schema.py fail if it stops firing, and the
        # refusing serializers hold either way.
        source = self.input_dir.url or self.input_dir.path
        # Again in the worker: a spawned worker starts without the http:// switch of the parent.
        self.storage_options = s3_storage_options(source, self.storage_options)
        check_stream_index(source, self.storage_options)
        return super()._create_cache(worker_env)

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        if isinstance(item, dict):
            item["epoch"] = int(self.current_epoch) - 1  # LitData counts epochs from 1
        return item


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

    def samples(self, records: Sequence[dict[str, Any]]) -> list:
        """The batch's samples (a ``CountedSamples``), before collation."""
        window: RecordWindow = self.dataset.index  # type: ignore[assignment]
        window.bind(records)
        try:
            items = [(int(r.get("epoch", self.dataset.epoch)), int(r["index"])) for r in records]
            return self.dataset.__getitems__(items)
        finally:
            window.bind(())  # drop the pixels' bytes as soon as the batch is built


class StreamTrainLoader(StreamingDataLoader):
    """``StreamingDataLoader`` with consumed-batch checkpoints, the restore fix and delivered counts.

    Args:
        dataset (StreamRecords): the records.
        progress: returns how many batches of the current epoch training consumed (the
            DataModule passes the Trainer's count); ``None``: the batches handed out.
        **kwargs: as for ``StreamingDataLoader`` (``collate_fn`` a :class:`StreamBatchCollate`).
    """

    def __init__(self, dataset: StreamRecords, *, progress: Callable[[], int] | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        check_litdata(self)
        self.progress = progress
        self._iters_since_restore = 0
        self._marks: list[tuple[int, int]] = []  # after each batch handed out this epoch
        self._first_mark: tuple[int, int] = (0, 0)
        self.counts = DeliveredCounts()  # shared with the map-style loader (per rank under DDP)
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
            self.counts.add(self._iteration, len(self._marks), getattr(batch, "counts", None) or {})
            self._marks.append((self._num_samples_yielded_streaming, self._latest_worker_idx))
            yield batch

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
    source: str,
    dataset: SegDataset,
    collate: DetectionCollate,
    *,
    batch_size: int,
    num_workers: int,
    seed: int,
    cache_dir: str | None = None,
    max_cache_size: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[], int] | None = None,
    **loader_kwargs: Any,
) -> StreamTrainLoader:
    """A :class:`StreamTrainLoader` of shuffled records from ``source`` built into batches by ``dataset``.

    Build it in ``setup()`` or later: LitData reads the ranks when the dataset is constructed.

    Args:
        source: ``local:/path`` (copied through the cache, as a remote would be), a plain path
            (read in place), or ``s3://...``.
        dataset (SegDataset): a training dataset over the source's :class:`RecordWindow`
            (see :func:`window_from_meta`).
        collate (DetectionCollate): the collate of the map-style path.
        batch_size, num_workers, seed: as for the map-style loader (``seed`` also shuffles the
            chunks and the items within them).
        cache_dir, max_cache_size, storage_options: LitData's (``max_cache_size`` as ``"50GB"``).
        progress: batches of the epoch training consumed (see :class:`StreamTrainLoader`).
        **loader_kwargs: more ``DataLoader`` arguments (``pin_memory``, ``prefetch_factor``,
            ``worker_init_fn``, ``persistent_workers``).
    """
    records = StreamRecords(source, cache_dir=cache_dir, shuffle=True, seed=seed,
                            max_cache_size=max_cache_size, storage_options=storage_options or {})
    return StreamTrainLoader(records, batch_size=batch_size, num_workers=num_workers,
                             collate_fn=StreamBatchCollate(dataset, collate), progress=progress, **loader_kwargs)
