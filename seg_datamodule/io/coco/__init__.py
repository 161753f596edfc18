"""COCO annotation files -> a flat, worker-safe, cached index; bad input named or counted."""

from seg_datamodule.io.coco.errors import SKIP_REASONS, BadAnnotationError, format_skip_summary
from seg_datamodule.io.coco.index import CocoIndex, default_cache_dir

__all__ = ["SKIP_REASONS", "BadAnnotationError", "CocoIndex", "default_cache_dir", "format_skip_summary"]
