"""Loading: image decoding, the cache folder and its lock, and the COCO annotation index."""
