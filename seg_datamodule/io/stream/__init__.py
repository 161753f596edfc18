"""Object-storage training: COCO -> LitData chunks (:mod:`.convert`), streamed back (:mod:`.loader`).

Importing this package does not import LitData (an optional extra, ``pip install
'seg-datamodule[stream]'``); the loader classes import it on first use.
"""

from __future__ import annotations

from typing import Any

from seg_datamodule.io.stream.convert import FORMAT_VERSION, META_FILE, convert_coco, read_stream_meta, split_source
from seg_datamodule.io.stream.records import RECORD_DTYPES, RecordWindow, check_record, record_from_index

__all__ = [
    "FORMAT_VERSION", "META_FILE", "RECORD_DTYPES", "RecordWindow", "StreamBatchCollate", "StreamRecords",
    "StreamTrainLoader", "check_record", "convert_coco", "read_stream_meta", "record_from_index",
    "split_source", "stream_drop_count", "stream_train_loader", "window_from_meta",
]

_LAZY = ("StreamBatchCollate", "StreamRecords", "StreamTrainLoader", "stream_drop_count", "stream_train_loader",
         "window_from_meta")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from seg_datamodule.io.stream import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
