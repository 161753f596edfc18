"""Reading LitData chunks safely: the record stream and the checks around LitData.

* :class:`StreamRecords`: a ``litdata.StreamingDataset`` of records that tags each record with
  the epoch being streamed (0-based, as Lightning counts). It trusts nothing in the chunk set:
  ``index.json`` is checked against the record schema
  (:func:`~seg_datamodule.io.stream.source.check_stream_index`) before LitData reads it, in the
  process that builds the loader and again in every worker (each opens the chunks itself), and
  every LitData serializer but the schema's three is replaced by one that refuses (so even an
  ``index.json`` swapped after the check cannot select ``pickle``). Processes that share a chunk
  cache (DDP ranks on one node) construct it one at a time (:func:`cache_lock`).
* :func:`check_litdata`: the LitData release whose private loader and dataset state
  :class:`~seg_datamodule.data.loaders.streaming.StreamTrainLoader` and
  :class:`~seg_datamodule.io.stream.ordered.OrderedRecords` set.

The loader that builds training batches from these records lives in
:mod:`seg_datamodule.data.loaders.streaming` (``io`` imports nothing from ``data``).

The training order is not LitData's shuffle: :class:`~seg_datamodule.io.stream.ordered.OrderedRecords`
(a :class:`StreamRecords`) streams the global order of :mod:`seg_datamodule.io.stream.order`, the
same for every world size and ``num_workers``; under DDP the partial last global batch is not
streamed (counted by :func:`stream_drop_count`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
from litdata import StreamingDataset
from litdata.streaming.serializers import _SERIALIZERS, Serializer
from litdata.utilities.dataset_utilities import get_default_cache_dir

from seg_datamodule.compat import require_version, verified_note
from seg_datamodule.io.stream.endpoint import s3_storage_options
from seg_datamodule.io.stream.order import tail_count
from seg_datamodule.io.stream.records import RecordWindow
from seg_datamodule.io.stream.schema import RECORD_SCHEMA, StreamFormatError
from seg_datamodule.io.paths import file_lock
from seg_datamodule.io.stream.source import check_stream_index, read_stream_index, split_source

__all__ = [
    "RefusedSerializer", "StreamRecords", "cache_lock", "check_litdata", "schema_serializers", "stream_drop_count",
    "window_from_meta",
]


def check_litdata(loader: object | None = None) -> None:
    """Raise unless LitData is the release the state fixes were verified on (and, given a
    ``loader``, it has the private counters they rewrite). Called at import.

    :class:`~seg_datamodule.data.loaders.streaming.StreamTrainLoader` rewrites LitData's private counters
    and ``restore`` flag; with another release they may mean something else and a resumed run
    would see other samples.

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


def window_from_meta(meta: dict[str, Any], name: str = "stream", on_bad_sample: str = "raise") -> RecordWindow:
    """The :class:`RecordWindow` of a converted dataset (metadata from
    :func:`~seg_datamodule.io.stream.source.check_stream_source`); ``on_bad_sample`` is what a
    dataset over it does with an image that fails to decode."""
    return RecordWindow(np.asarray(meta["image_ids"], np.int64), np.asarray(meta["heights"], np.int64),
                        np.asarray(meta["widths"], np.int64), name=name, on_bad_sample=on_bad_sample,
                        orientations=meta.get("orientations"))


def stream_drop_count(num_records: int, world_size: int, batch_size: int) -> int:
    """Records per epoch no rank streams under DDP: the partial last global batch.

    Only whole global batches (``batch_size x world_size`` records) are dealt, so every rank takes
    the same number of steps (:func:`~seg_datamodule.io.stream.order.tail_count`). Single process:
    nothing is dropped (it takes the partial last batch).
    """
    return tail_count(int(num_records), int(batch_size) * int(world_size), int(world_size))


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


def cache_lock(input_dir: str, cache_dir: Any) -> contextlib.AbstractContextManager[Any]:
    """Held while a ``StreamingDataset`` of ``input_dir`` sets up its chunk cache: one process at a time.

    LitData 0.2.76 copies ``index.json`` of a remote (or ``local:``) source into
    ``<cache>/<hash of the URL>/<version>/`` when the dataset is constructed, under a file lock
    it waits for only 1 s (``S3Downloader.download_file``) and whose timeout it swallows. DDP
    ranks on one node share that folder: a rank that waited longer than 1 s for another rank's
    download (a boto3 client is slow to build on a busy machine) went on without the file and
    failed with "doesn't contain any index.json". Before the download, each rank also deletes
    the folder when it holds anything but the current version (``_clear_cache_dir_if_updated``),
    which can meet another rank's half-made folder. Holding this lock, the first rank makes the
    folder and downloads the index; the others then find both in place. The ranks keep sharing
    one cache folder, so a checkpoint's LitData state (which names it) restores on every rank.

    The lock file sits in the cache root, beside LitData's folder (inside it LitData would
    count it as another version). A plain folder, read in place, needs no lock.

    Args:
        input_dir: the source, as given to :class:`StreamRecords`.
        cache_dir: LitData's ``cache_dir``: a folder, a ``litdata`` ``Dir``, or None (LitData's default).
    """
    _, remote = split_source(input_dir)
    if not remote and not os.fspath(input_dir).startswith("local:"):
        return contextlib.nullcontext()
    folder = getattr(cache_dir, "path", cache_dir)  # a litdata Dir carries its folder as .path
    root = Path(folder if folder is not None else get_default_cache_dir())
    digest = hashlib.sha256(os.fspath(input_dir).encode("utf-8")).hexdigest()[:16]
    return file_lock(root / f".seg-datamodule-{digest}.lock")


class StreamRecords(StreamingDataset):
    """A ``StreamingDataset`` of checked records that carry ``"epoch"``: the 0-based epoch being streamed.

    The source's ``index.json`` is checked before LitData reads it, here and in every worker
    (:meth:`_create_cache`, where each worker opens its chunks); the serializers are
    :func:`schema_serializers`. Processes sharing a chunk cache construct it one at a time
    (:func:`cache_lock`).

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
        index = read_stream_index(input_dir, kwargs["storage_options"])
        self.chunk_sizes = tuple(int(chunk["chunk_size"]) for chunk in index["chunks"])  # checked ints, LitData's order
        with cache_lock(input_dir, kwargs.get("cache_dir")):
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
