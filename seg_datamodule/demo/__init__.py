"""The embedded demo: a generated COCO-format dataset and a small YOLACT-style model."""
