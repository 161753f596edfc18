"""COCO annotation files -> a flat, worker-safe, cached index; bad input named or counted.

``parse`` reads and checks the JSON, ``scan`` checks its annotations chunk by chunk,
``instances`` turns annotation chunks into arrays, ``tables`` assembles, selects on and checks
them, ``cache`` stores them, ``building`` loads them and applies build's options (``crowd`` turns
crowd regions into instances), ``reading`` opens the images, ``errors`` says what can be wrong,
``index`` is the :class:`CocoIndex` users see.
"""

from seg_datamodule.io.coco.building import IndexOptions
from seg_datamodule.io.coco.cache import default_cache_dir
from seg_datamodule.io.coco.errors import SKIP_REASONS, BadAnnotationError, format_skip_summary
from seg_datamodule.io.coco.index import CocoIndex

__all__ = ["SKIP_REASONS", "BadAnnotationError", "CocoIndex", "IndexOptions", "default_cache_dir", "format_skip_summary"]
