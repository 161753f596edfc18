"""Pure numpy kernels with no randomness: argument checks, ragged offsets, affines, polygon
geometry (exact clip, areas, boxes), the exact windowed rasteriser and RLE codecs.

Imports nothing else from the package; every stage above builds on it.
"""
