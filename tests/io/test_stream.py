"""COCO -> LitData chunks and streamed training batches (``seg_datamodule.io.stream``).

The references are the map-style objects themselves: every record against ``CocoIndex`` (ids,
polygons, labels, crowd, bytes), every streamed batch against ``SegDataset`` + ``DetectionCollate``
over the same ``CocoIndex`` for the same images, epoch and order (bit for bit).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("litdata")

from litdata import StreamingDataset  # noqa: E402

from _child import run_child  # noqa: E402
from _datasets import make_dataset  # noqa: E402
from _recorder import read_counts, read_steps  # noqa: E402

from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402
from seg_datamodule.data.samples.dataset import SegDataset  # noqa: E402
from seg_datamodule.data.config.options import StreamOptions  # noqa: E402
from seg_datamodule.data.loaders.streaming import stream_train_loader  # noqa: E402
from seg_datamodule.io.coco import CocoIndex  # noqa: E402
from seg_datamodule.io.images.decode import BadImageError  # noqa: E402
from seg_datamodule.io.stream import (  # noqa: E402
    ChunkOptions,
    IndexOptions,
    META_FILE,
    RECORD_DTYPES,
    check_record,
    convert_coco,
    read_stream_meta,
    record_from_index,
    window_from_meta,
)

# LitData's advice for production cache sizes; the tests use a tiny cache on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:.*max_cache_size.*")


def _convert(ann: Path, images: Path, out: Path, on_bad_sample: str = "raise", chunk_bytes: str = "128KB") -> dict:
    return convert_coco(ann, images, str(out), IndexOptions(on_bad_sample=on_bad_sample),
                        ChunkOptions(chunk_bytes=chunk_bytes, start_method="fork"))


def _records(out: Path) -> dict[int, dict]:
    """Every record of a converted folder (read in place), by CocoIndex position."""
    records = {}
    for record in StreamingDataset(str(out)):
        check_record(record, str(out))
        assert record["index"] not in records
        records[record["index"]] = record
    return records


def _assert_round_trip(index: CocoIndex, records: dict[int, dict], positions: list[int]) -> None:
    assert sorted(records) == sorted(positions)
    for i, record in records.items():
        assert record["image_id"] == int(index.image_ids[i])
        assert (record["height"], record["width"]) == (int(index.heights[i]), int(index.widths[i]))
        assert record["image"] == index.file_path(i).read_bytes()  # stored as is, not re-encoded
        polygons = index.polygons(i)
        assert np.array_equal(record["vertices"].reshape(-1, 2), polygons.vertices)
        assert np.array_equal(record["ring_offsets"], polygons.ring_offsets)
        assert np.array_equal(record["instance_offsets"], polygons.instance_offsets)
        assert np.array_equal(record["labels"], index.labels(i))
        assert np.array_equal(record["annotation_ids"], index.annotation_ids(i))
        assert np.array_equal(record["crowd_annotation_ids"], index.crowd_annotation_ids(i))
        assert np.array_equal(record["neg_labels"], index.neg_labels(i))
        assert np.array_equal(record["not_exhaustive_labels"], index.not_exhaustive_labels(i))
        for key, dtype in RECORD_DTYPES.items():
            assert record[key].dtype == dtype, key
        window = window_from_meta_of(index)
        window.bind([record])
        crowd = index.crowd_mask(i)
        got = window.crowd_mask(i)
        assert (crowd is None and got is None) or np.array_equal(crowd, got)
        assert np.array_equal(window.load_image(i, 2), index.load_image(i, 2))


def window_from_meta_of(index: CocoIndex):
    return window_from_meta({"image_ids": index.image_ids, "heights": index.heights, "widths": index.widths})


@pytest.fixture(scope="module")
def demo_stream(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The demo training split converted to small chunks (several per epoch)."""
    out = tmp_path_factory.mktemp("stream") / "demo-train"
    meta = _convert(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017", out)
    return out, meta


def test_convert_demo_round_trips_against_coco_index(demo_dir: Path, demo_stream: tuple[Path, dict]) -> None:
    out, meta = demo_stream
    index = CocoIndex.build(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017")
    assert len([p for p in out.iterdir() if p.suffix == ".bin"]) > 1  # the epoch spans chunks
    _assert_round_trip(index, _records(out), list(range(len(index))))
    assert read_stream_meta(f"local:{out}") == meta
    assert meta["num_records"] == len(index)
    assert meta["class_names"] == index.class_names
    assert meta["category_ids"] == index.category_ids.tolist()
    assert meta["image_ids"] == index.image_ids.tolist()
    assert meta["skip_counts"] == index.skip_counts
    assert meta["image_bytes"] > 0 and meta["chunk_bytes_total"] >= meta["image_bytes"]


def test_convert_coco_mini_round_trips_with_crowd(coco_mini: Path, tmp_path: Path) -> None:
    ann, images = coco_mini / "annotations" / "instances_train2017.json", coco_mini / "train2017"
    meta = _convert(ann, images, tmp_path / "mini", on_bad_sample="skip", chunk_bytes="2MB")
    index = CocoIndex.build(ann, images, on_bad_sample="skip")
    records = _records(tmp_path / "mini")
    _assert_round_trip(index, records, list(range(len(index))))
    assert any(r["crowd_rle"].size for r in records.values()), "coco-mini should have crowd regions"
    assert meta["skip_counts"] == index.skip_counts
    assert meta["num_instances"] == index.num_instances


def test_dtype_guard_forces_dtypes_whatever_the_source_gives(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LitData fixes a 1-D array's dtype from the first record: the converter must cast."""
    ann, images = demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017"
    truth = CocoIndex.build(ann, images)
    polygons, labels = CocoIndex.polygons, CocoIndex.labels

    def odd_polygons(self, i):  # float32 vertices, int32 offsets for odd images (exact values)
        p = polygons(self, i)
        if i % 2:
            p = type(p)(np.round(p.vertices).astype(np.float32), p.ring_offsets.astype(np.int32),
                        p.instance_offsets.astype(np.int32))
        return p

    monkeypatch.setattr(CocoIndex, "polygons", odd_polygons)
    monkeypatch.setattr(CocoIndex, "labels", lambda self, i: labels(self, i).astype(np.int32 if i % 2 else np.int64))
    _convert(ann, images, tmp_path / "mixed")  # fork: the workers see the patched methods
    records = _records(tmp_path / "mixed")
    assert len(records) == len(truth)
    for i, record in records.items():
        expected = truth.polygons(i)
        vertices = np.round(expected.vertices) if i % 2 else expected.vertices
        assert np.array_equal(record["vertices"].reshape(-1, 2), vertices)
        assert np.array_equal(record["instance_offsets"], expected.instance_offsets)
        assert np.array_equal(record["labels"], truth.labels(i))


def test_check_record_names_the_image_and_the_field(demo_dir: Path) -> None:
    index = CocoIndex.build(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017")
    i = next(k for k in range(len(index)) if len(index.labels(k)))
    record = record_from_index(index, i, b"")
    check_record(record)
    bad = dict(record, labels=record["labels"].astype(np.int32))
    with pytest.raises(ValueError, match=rf"image id {int(index.image_ids[i])}: field 'labels' must be a 1-D int64"):
        check_record(bad, "chunks")
    bad = dict(record, ring_offsets=record["ring_offsets"][:-1])
    with pytest.raises(ValueError, match="inconsistent polygon arrays"):
        check_record(bad)
    with pytest.raises(ValueError, match="lacks"):
        check_record({k: v for k, v in record.items() if k != "crowd_rle"})


def test_unreadable_image_raises_or_is_counted(demo_dir: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    shutil.copytree(demo_dir / "train2017", images)
    index = CocoIndex.build(demo_dir / "annotations" / "instances_train2017.json", images)
    missing = index.file_path(3)
    missing.unlink()
    ann = demo_dir / "annotations" / "instances_train2017.json"
    with pytest.raises(BadImageError, match=rf"image id {int(index.image_ids[3])}: image file .* does not exist"):
        _convert(ann, images, tmp_path / "raise")
    meta = _convert(ann, images, tmp_path / "skip", on_bad_sample="skip")
    assert meta["skip_counts"]["image_missing"] == 1
    assert meta["num_records"] == len(index) - 1
    assert 3 not in _records(tmp_path / "skip")


def _map_style_batch(index: CocoIndex, reference: SegDataset, epoch: int, image_ids: list[int]):
    positions = [index.index_of_image_id(i) for i in image_ids]
    return DetectionCollate(shared_memory=False)(reference.__getitems__([(epoch, p) for p in positions]))


@pytest.mark.slow
@pytest.mark.parametrize("num_workers, mix", [(0, False), (2, False), (2, True)])
def test_stream_epochs_cover_every_image_once_with_map_style_masks(
    demo_dir: Path, demo_stream: tuple[Path, dict], tmp_path: Path, num_workers: int, mix: bool
) -> None:
    out, meta = demo_stream
    index = CocoIndex.build(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017")
    kwargs: dict = dict(image_size=192, seed=5, mosaic_partners="batch")
    if mix:  # copy-paste and MixUp partners from the streamed batch, as in the map-style one
        kwargs |= dict(copy_paste=0.5, copy_paste_mode="batch", mixup=0.5)
    dataset = make_dataset(window_from_meta(meta), **kwargs)
    reference = make_dataset(index, **kwargs)
    # `local:` copies chunks through the cache like a remote; the cache holds about one chunk.
    # LitData shuffles with the dataset's seed (5).
    stream = StreamOptions(f"local:{out}", cache_dir=str(tmp_path / "cache"), max_cache_size="200KB")
    loader = stream_train_loader(stream, dataset, DetectionCollate(), batch_size=8, num_workers=num_workers)
    for epoch in range(2):
        seen: list[int] = []
        kept = 0
        for batch in loader:
            ids = batch.image_ids.tolist()
            seen += ids
            expected = _map_style_batch(index, reference, epoch, ids)
            for name in ("images", "masks", "ignore_masks", "boxes", "labels", "annotation_ids", "boxes_per_image"):
                assert torch.equal(getattr(batch, name), getattr(expected, name)), name
            assert (batch.origins is None) == (expected.origins is None) == (not mix)
            if mix:
                assert torch.equal(batch.origins, expected.origins)
            assert batch.counts == expected.counts
            kept += batch.counts.get("kept", 0)
        assert sorted(seen) == sorted(index.image_ids.tolist()), f"epoch {epoch}: not every image exactly once"
        assert kept > 0


def test_an_lvis_stream_carries_the_federated_lists(tmp_path: Path) -> None:
    """LVIS's neg / not-exhaustive lists travel in the records (schema version 2, issue 35): a
    streamed batch carries the map-style batch's lists, bit for bit."""
    from _lvis import load_json, write_images, write_v1

    ann = write_v1(tmp_path / "lvis_v1_val_100.json")
    write_images(load_json(ann), tmp_path / "coco", from_url=True)
    out = tmp_path / "lvis-stream"
    meta = _convert(ann, tmp_path / "coco", out, chunk_bytes="2MB")
    index = CocoIndex.build(ann, tmp_path / "coco", use_cache=False)
    records = _records(out)
    _assert_round_trip(index, records, list(range(len(index))))
    assert sum(len(r["neg_labels"]) for r in records.values()) > 0
    assert sum(len(r["not_exhaustive_labels"]) for r in records.values()) > 0
    kwargs: dict = dict(image_size=64, seed=5, mosaic_partners="batch")
    dataset, reference = make_dataset(window_from_meta(meta), **kwargs), make_dataset(index, **kwargs)
    stream = StreamOptions(str(out), cache_dir=str(tmp_path / "cache"))
    loader = stream_train_loader(stream, dataset, DetectionCollate(), batch_size=8, num_workers=0)
    for batch, _ in zip(loader, range(3)):
        expected = _map_style_batch(index, reference, 0, batch.image_ids.tolist())
        for name in ("neg_labels", "neg_labels_per_image", "not_exhaustive_labels", "not_exhaustive_labels_per_image",
                     "labels", "masks"):
            assert torch.equal(getattr(batch, name), getattr(expected, name)), name


def test_convert_command_line(demo_dir: Path, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "seg_datamodule", "convert", str(demo_dir / "annotations" / "instances_train2017.json"),
         str(demo_dir / "train2017"), str(out), "--chunk-bytes", "256KB", "--num-workers", "1"],
        cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{out}: 48 images" in result.stdout and "nothing skipped" in result.stdout
    assert read_stream_meta(str(out))["num_records"] == 48
    assert (out / META_FILE).is_file() and (out / "index.json").is_file()


def test_convert_options_check_their_arguments_when_made(tmp_path: Path) -> None:
    """The flags of ``seg-datamodule convert`` become two checked frozen options; nothing else is taken."""
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 'maybe'"):
        IndexOptions(on_bad_sample="maybe")
    with pytest.raises(TypeError, match="drop_crowd must be a bool, got 1"):
        IndexOptions(drop_crowd=1)
    with pytest.raises(ValueError, match="num_workers must be >= 1, got 0"):
        ChunkOptions(num_workers=0)
    with pytest.raises(TypeError, match="index_options must be of type IndexOptions"):
        convert_coco("a.json", "images", str(tmp_path / "out"), {"on_bad_sample": "skip"})
    assert not (tmp_path / "out").exists()


def test_package_imports_without_litdata() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'litdata' or name.startswith('litdata.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import seg_datamodule, seg_datamodule.io.stream, seg_datamodule.data.datamodule, seg_datamodule.cli\n"
        "try:\n"
        "    seg_datamodule.io.stream.convert_coco('a', 'b', 'c')\n"
        "except ImportError as err:\n"
        "    assert 'seg-datamodule[stream]' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": ""})


def test_loader_state_is_taken_after_the_batches_training_consumed(
    demo_stream: tuple[Path, dict], tmp_path: Path
) -> None:
    """A batch handed out but not trained on (fetched ahead) is streamed again after a resume."""
    out, meta = demo_stream

    def loader(progress=None):
        # seed: the order's too
        dataset = make_dataset(window_from_meta(meta), image_size=96, seed=1, mosaic_partners="batch")
        return stream_train_loader(StreamOptions(str(out), cache_dir=str(tmp_path / "cache")), dataset,
                                   DetectionCollate(), batch_size=4, num_workers=0, progress=progress)

    uninterrupted = loader()
    straight, following = ([(b.image_ids.tolist(), b.masks.sum().item()) for b in uninterrupted] for _ in range(2))
    consumed = [0]
    first = loader(progress=lambda: consumed[0])
    batches = iter(first)
    for _ in range(4):  # four handed out, three trained on
        next(batches)
    consumed[0] = 3
    state = first.state_dict()
    assert state["order"]["consumed"] == 12 and state["order"]["epoch"] == 0  # global items trained on
    resumed = loader()
    resumed.load_state_dict(state)
    assert [(b.image_ids.tolist(), b.masks.sum().item()) for b in resumed] == straight[3:]
    assert [(b.image_ids.tolist(), b.masks.sum().item()) for b in resumed] == following  # next epoch: whole


def test_a_dataset_over_a_window_follows_the_windows_on_bad_sample(demo_stream: tuple[Path, dict]) -> None:
    """What a bad image does is the window's (the index's) policy, read by the dataset over it."""
    _, meta = demo_stream
    assert window_from_meta(meta).on_bad_sample == "raise"
    assert make_dataset(window_from_meta(meta), image_size=64).on_bad_sample == "raise"
    skipping = make_dataset(window_from_meta(meta, on_bad_sample="skip"), image_size=64)
    assert skipping.on_bad_sample == "skip" and skipping.path.skip_bad
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 'ignore'"):
        window_from_meta(meta, on_bad_sample="ignore")


# ----------------------------------------------------------------------------- the DataModule


def test_datamodule_trains_from_the_stream_and_validates_map_style(
    demo_dir: Path, demo_stream: tuple[Path, dict], tmp_path: Path
) -> None:
    from seg_datamodule.data.datamodule import COCOSegDataModule

    out, meta = demo_stream
    with pytest.raises(ValueError, match="not both"):
        COCOSegDataModule(train_stream=f"local:{out}", train_ann="a.json", train_images="b")
    val_ann = str(demo_dir / "annotations" / "instances_val2017.json")
    dm = COCOSegDataModule(train_stream=f"local:{out}", val_ann=val_ann,
                           val_images=str(demo_dir / "val2017"), image_size=96, batch_size=8, num_workers=0,
                           stream_cache_dir=str(tmp_path / "cache"), stream_max_cache_size="300KB")
    assert dm.num_classes == len(meta["category_ids"]) and dm.class_names == meta["class_names"]
    dm.setup("fit")
    ids = [i for batch in dm.train_dataloader() for i in batch.image_ids.tolist()]
    assert sorted(ids) == sorted(meta["image_ids"])
    assert len(next(iter(dm.val_dataloader()))) == 8
    counts = dm.skip_counts
    assert counts["train_index"]["image_ddp_tail_per_epoch"] == 0
    assert counts["train"]["kept"] > 0


def test_mosaic_partners_default_to_the_dataset_map_style_and_to_the_batch_streamed(
    demo_dir: Path, demo_stream: tuple[Path, dict], tmp_path: Path
) -> None:
    """Unset, partners come from the whole dataset (they train best); a stream holds only its batch's
    records, so it takes them from the batch and refuses ``uniform`` in one line, in the DataModule and
    in ``stream_train_loader``."""
    from seg_datamodule.data.datamodule import COCOSegDataModule

    out, meta = demo_stream
    mapped = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, batch_size=8, num_workers=0)
    streamed = COCOSegDataModule(train_stream=f"local:{out}", image_size=96, batch_size=8, num_workers=0)
    assert mapped.augment.mosaic_partners == "uniform" and streamed.augment.mosaic_partners == "batch"
    assert COCOSegDataModule(demo_dir=str(demo_dir), mosaic_partners="batch").augment.mosaic_partners == "batch"
    with pytest.raises(ValueError, match=r"^mosaic_partners 'uniform' draws partners over the whole dataset, which a "
                       rf"stream \(local:{re.escape(str(out))}\) cannot read at random: give mosaic_partners 'batch' "
                       r"\(or leave it unset\)$"):
        COCOSegDataModule(train_stream=f"local:{out}", mosaic_partners="uniform")
    stream = StreamOptions(str(out), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="mosaic_partners 'uniform' draws partners over the whole dataset"):
        stream_train_loader(stream, make_dataset(window_from_meta(meta), image_size=96), DetectionCollate(),
                            batch_size=8)
    # Without a mosaic there are no partners to draw: nothing to refuse.
    loader = stream_train_loader(stream, make_dataset(window_from_meta(meta), image_size=96, mosaic=0.0),
                                 DetectionCollate(), batch_size=8, num_workers=0)
    assert len(next(iter(loader))) == 8


# ----------------------------------------------------------------------------- real runs

HERE = Path(__file__).resolve().parent


def _run(out: Path, stream: str, workers: int, *args: str) -> subprocess.CompletedProcess:
    root = str(HERE.parents[1])
    env = dict(os.environ, PYTHONPATH=root)
    return run_child([sys.executable, str(HERE / "_stream_run.py"), str(out), stream, "--workers", str(workers),
                      *args], env, out.parent / f"logs-{out.name}")


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "kill_at"), [pytest.param(0, 7, marks=pytest.mark.extended), (2, 12)])
def test_sigkill_then_resume_streams_the_same_batches_through_the_next_epoch(
    demo_stream: tuple[Path, dict], tmp_path: Path, workers: int, kill_at: int
) -> None:
    """12 batches per epoch; killed mid-epoch (step 7) or right after an epoch's last batch was
    checkpointed (step 12): the resumed run trains on bit-identical batches to the end of the
    next epoch (LitData's stale ``restore`` flag would replay the old tail there) and counts the same."""
    source = f"local:{demo_stream[0]}"
    straight = _run(tmp_path / "straight" / "run", source, workers)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "killed" / "run", source, workers, "--kill-at", str(kill_at))
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _run(tmp_path / "killed" / "resumed", source, workers, "--ckpt",
                   str(tmp_path / "killed" / "ckpt" / "last.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = read_steps(tmp_path / "straight" / "run"), read_steps(tmp_path / "killed" / "resumed")
    assert min(got) == kill_at and max(got) == max(want) == 23
    key = ("epoch", "batch_idx", "image_ids", "images", "masks", "ignore")
    for step in got:
        assert [got[step][k] for k in key] == [want[step][k] for k in key], step
    assert read_counts(tmp_path / "killed" / "resumed") == read_counts(tmp_path / "straight" / "run")


@pytest.mark.slow
@pytest.mark.extended  # DDP over a stream; the default tier runs DDP in tests/data/test_datamodule.py
def test_ddp_ranks_stream_disjoint_shards_and_count_the_dropped_tail(demo_dir: Path, tmp_path: Path) -> None:
    """Two CPU processes over 47 records (one image missing, skipped at conversion): each epoch the
    ranks see disjoint images, and what they do not see is the tail counted in the report."""
    images = tmp_path / "images"
    shutil.copytree(demo_dir / "train2017", images)
    next(iter(sorted(images.iterdir()))).unlink()
    meta = _convert(demo_dir / "annotations" / "instances_train2017.json", images, tmp_path / "c47",
                    on_bad_sample="skip")
    assert meta["num_records"] == 47
    run = _run(tmp_path / "ddp" / "run", f"local:{tmp_path / 'c47'}", 0, "--devices", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    counts = read_counts(tmp_path / "ddp" / "run")["train_index"]
    assert counts["image_missing"] == 1
    for epoch in (0, 1):
        shards = [[i for r in read_steps(tmp_path / "ddp" / "run", rank).values() if r["epoch"] == epoch
                   for i in r["image_ids"]] for rank in (0, 1)]
        assert all(len(s) == len(set(s)) for s in shards)
        assert not set(shards[0]) & set(shards[1])
        assert len(shards[0]) + len(shards[1]) + counts["image_ddp_tail_per_epoch"] == 47
    assert counts["image_ddp_tail_per_epoch"] == 7  # batches of 4: 5 per rank, 40 of 47 streamed


def test_convert_leaves_the_processs_start_method_as_it_was(demo_dir: Path, tmp_path: Path) -> None:
    """litdata.optimize sets spawn for the whole process; later DataLoaders must not inherit it."""
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    convert_coco(demo_dir / "annotations" / "instances_val2017.json", demo_dir / "val2017", str(tmp_path / "out"),
                 IndexOptions(), ChunkOptions(chunk_bytes="128KB", num_workers=1))
    assert multiprocessing.get_start_method(allow_none=True) == before
