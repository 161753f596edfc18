"""Kernels the pipeline runs for every sample: one resample per pixel (``warp``), polygon transport and drop reasons (``polygons``), box-only instances through the geometry (``box_only``)."""
