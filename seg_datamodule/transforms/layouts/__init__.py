"""Layouts: where each source image lands on the canvas. Pure placement (``plan``), mosaic with a random affine and the letterbox (``mosaic``), large-scale jitter (``lsj``)."""
