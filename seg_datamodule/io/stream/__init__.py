"""Object-storage training data: COCO (or an Ultralytics data.yaml split) -> LitData chunks (:mod:`.convert`), checked (:mod:`.schema`,
:mod:`.source`) and read back as records (:mod:`.loader`) from any S3-compatible endpoint
(:mod:`.endpoint`). The train loader over these records is
:mod:`seg_datamodule.data.loaders.streaming` (``io`` imports nothing from ``data``).

Importing this package does not import LitData (an optional extra, ``pip install
'seg-datamodule[stream]'``); the loader classes import it on first use.
"""

from __future__ import annotations

from typing import Any

from seg_datamodule.io.coco import IndexOptions
from seg_datamodule.io.stream.convert import FORMAT_VERSION, ChunkOptions, convert_coco, convert_yolo
from seg_datamodule.io.stream.endpoint import MissingChunkError, s3_storage_options
from seg_datamodule.io.stream.records import RecordWindow, check_record, record_from_index
from seg_datamodule.io.stream.schema import (
    META_FILE,
    RECORD_DTYPES,
    RECORD_SCHEMA,
    SCHEMA_VERSION,
    StreamFormatError,
    check_index,
    check_meta,
)
from seg_datamodule.io.stream.source import check_stream_index, check_stream_source, read_stream_meta, split_source

__all__ = [
    "ChunkOptions", "FORMAT_VERSION", "IndexOptions", "META_FILE", "MissingChunkError", "RECORD_DTYPES",
    "RECORD_SCHEMA", "RecordWindow", "SCHEMA_VERSION", "StreamFormatError", "StreamRecords", "check_index",
    "check_meta", "check_record", "check_stream_index", "check_stream_source", "convert_coco", "convert_yolo",
    "read_stream_meta",
    "record_from_index", "s3_storage_options", "split_source", "stream_drop_count", "window_from_meta",
]

_LAZY = ("StreamRecords", "stream_drop_count", "window_from_meta")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from seg_datamodule.io.stream import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
