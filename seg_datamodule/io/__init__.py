"""Loading: what is read from a user's files, checked, into arrays the rest of the package trusts.

- images: ``images`` (decoding to RGB ``uint8``), ``image_files`` (bounded, regular-file reads),
  ``image_errors`` (``BadImageError`` and its reasons), ``orientation`` (EXIF), ``image_root``
  and ``image_ids`` (folders and the ids of images named only by their files);
- ``coco/``: a COCO or LVIS JSON into the flat, cached, worker-safe ``CocoIndex``;
- ``yolo/``: an Ultralytics ``data.yaml`` and its label files into the same index;
- ``stream/``: COCO into LitData chunks and back (``seg-datamodule convert``, ``train_stream``);
- ``predict_source`` (folders and image-info files to predict), ``input_paths`` (the paths a user
  names, checked where given) and ``paths`` (the cache folder, its lock, names kept in their root).
"""
