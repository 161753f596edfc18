"""Loading: what is read from a user's files, checked, into arrays the rest of the package trusts.

- ``images/``: image files, read bounded (``files``), decoded to RGB ``uint8`` (``decode``), what
  can be wrong with them (``errors``), EXIF orientation and header sizes (``exif``), image roots
  (``root``) and the ids of images named only by their files (``ids``);
- ``coco/``: a COCO or LVIS JSON into the flat, cached, worker-safe ``CocoIndex``;
- ``yolo/``: an Ultralytics ``data.yaml`` and its label files into the same index;
- ``stream/``: COCO into LitData chunks and back (``seg-datamodule convert``, ``train_stream``);
- ``predict_source`` (folders and image-info files to predict) and ``paths`` (the paths a user
  names, checked where given; the cache folder, its lock, names kept in their root).
"""
