"""``seg-datamodule convert``: the command line of :func:`~seg_datamodule.io.stream.convert.convert_coco`.

``seg-datamodule convert ANN_FILE IMAGES OUTPUT [--on-bad-sample skip] [--chunk-bytes 64MB] ...``
writes LitData chunks to ``OUTPUT`` (a folder or ``s3://...``; ``--endpoint-url`` or
``AWS_ENDPOINT_URL`` for an S3-compatible store) and prints a one-line summary;
``seg-datamodule convert DATA_YAML OUTPUT [--split train]`` converts a split of an Ultralytics
dataset (:func:`~seg_datamodule.io.stream.convert.convert_yolo`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from seg_datamodule.io.coco import format_skip_summary

__all__ = ["convert_main", "convert_parser"]


def convert_parser() -> argparse.ArgumentParser:
    """The ``convert`` subcommand's argument parser."""
    parser = argparse.ArgumentParser(
        prog="seg-datamodule convert",
        description="Convert a COCO annotation file and its image folder, or a split of an Ultralytics data.yaml, to "
                    "LitData chunks (one record per image) for COCOSegDataModule(train_stream=...). Needs: pip install "
                    "'seg-datamodule[stream]'.",
    )
    parser.add_argument("ann_file", help="COCO instances JSON, or an Ultralytics data.yaml (then no IMAGES)")
    parser.add_argument("images", nargs="?", default=None,
                        help="folder of the images (file_name is relative to it); not for a data.yaml")
    parser.add_argument("output", help="output folder, local:/folder, or s3://bucket/prefix")
    parser.add_argument("--split", default=None,
                        help="the data.yaml's split to convert (default train); not for a COCO JSON")
    parser.add_argument("--on-bad-sample", choices=("raise", "skip"), default="raise",
                        help="raise on the first bad entry (default) or skip and count it")
    parser.add_argument("--drop-crowd", action="store_true", help="leave crowd regions out")
    parser.add_argument("--crowd-as-instances", action="store_true",
                        help="train on crowd (iscrowd=1) regions as instances (exports such as CVAT's mark every "
                             "mask a crowd)")
    parser.add_argument("--box-only", choices=("raise", "drop_images", "drop", "keep"), default="raise",
                        help="annotations with a box and no mask: stop naming them (default: dropped, their objects "
                             "would train as background), leave their images out, drop the boxes alone, or keep "
                             "them as box targets without a mask")
    parser.add_argument("--drop-empty", action="store_true", help="leave out images without target instances")
    parser.add_argument("--verify-images", action="store_true",
                        help="decode every image now; bad ones raise or are skipped (recommended for training)")
    parser.add_argument("--chunk-bytes", default="64MB", help="target chunk size (default 64MB)")
    parser.add_argument("--num-workers", type=int, default=4, help="conversion processes (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input shuffle")
    parser.add_argument("--overwrite", action="store_true", help="replace existing chunks")
    parser.add_argument("--start-method", default="fork", choices=("fork", "spawn", "forkserver"),
                        help="how conversion workers start (default fork)")
    parser.add_argument("--endpoint-url", default=None,
                        help="S3-compatible endpoint for an s3:// output, e.g. http://minio:9000 (default: "
                             "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)")
    parser.add_argument("--json", action="store_true", help="print the whole metadata as JSON")
    return parser


def convert_main(argv: Sequence[str] | None = None) -> dict:
    """Run ``seg-datamodule convert``; returns the metadata written beside the chunks."""
    from seg_datamodule.io.coco import IndexOptions
    from seg_datamodule.io.stream.convert import ChunkOptions, convert_coco, convert_yolo

    parser = convert_parser()
    args = parser.parse_args(argv)
    is_yaml = args.ann_file.lower().endswith((".yaml", ".yml"))
    if is_yaml and args.images is not None:
        parser.error("a data.yaml names its own images: give DATA_YAML OUTPUT [--split NAME], without IMAGES")
    if not is_yaml and (args.images is None or args.split is not None):
        parser.error("a COCO JSON needs its IMAGES folder (ANN_FILE IMAGES OUTPUT); --split is for a data.yaml")
    # The flags stay flat for users; the options travel as two frozen types from here on.
    index_options = IndexOptions(on_bad_sample=args.on_bad_sample, drop_crowd=args.drop_crowd,
                                 drop_empty=args.drop_empty, verify_images=args.verify_images,
                                 crowd_as_instances=args.crowd_as_instances, box_only=args.box_only)
    chunk_options = ChunkOptions(chunk_bytes=args.chunk_bytes, num_workers=args.num_workers, seed=args.seed,
                                 overwrite=args.overwrite, start_method=args.start_method)
    storage = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    if is_yaml:
        meta = convert_yolo(args.ann_file, args.split or "train", args.output, index_options, chunk_options,
                            storage_options=storage)
    else:
        meta = convert_coco(args.ann_file, args.images, args.output, index_options, chunk_options,
                            storage_options=storage)
    if args.json:
        print(json.dumps(meta, indent=1))
    else:
        size = meta.get("chunk_bytes_total")
        written = f"{size / 2**20:.1f} MiB of chunks" if size else "chunks uploaded"
        print(f"{args.output}: {meta['num_records']} images, {meta['num_instances']} instances, {written} "
              f"(images {meta['image_bytes'] / 2**20:.1f} MiB + {'data.yaml' if is_yaml else 'JSON'} "
              f"{meta['ann_file_bytes'] / 2**20:.1f} MiB); "
              f"{format_skip_summary(meta['skip_counts'])}", file=sys.stdout)
    return meta
