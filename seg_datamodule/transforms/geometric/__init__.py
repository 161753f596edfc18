"""Canvas steps that move pixels and polygons together: flips (``flips``) and 90-degree turns (``turns``)."""
