"""Nothing in a chunk set is executed (``seg_datamodule.io.stream.schema`` / ``.source`` / ``.loader``).

The attack is the real one: chunks written by ``litdata.optimize`` with this project's record keys
but the ``image`` field stored by LitData's ``pickle`` serializer as an object whose unpickling
writes a marker file, beside a real metadata file. A control test shows plain LitData runs it; the
DataModule, the loader and every worker must refuse it by name with the marker never written.
Variants of the schema (an extra, a missing, a reordered key) are real ``litdata.optimize``
outputs too; the rest are edits of a real conversion's ``index.json`` and metadata.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

litdata = pytest.importorskip("litdata")

from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402
from seg_datamodule.data.samples.dataset import SegDataset  # noqa: E402
from seg_datamodule.data.config.options import AugmentOptions, StreamOptions  # noqa: E402
from seg_datamodule.data.loaders.streaming import stream_train_loader  # noqa: E402
from seg_datamodule.io.coco import CocoIndex  # noqa: E402
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine  # noqa: E402
from seg_datamodule.io.stream import (  # noqa: E402
    ChunkOptions,
    META_FILE,
    SCHEMA_VERSION,
    StreamFormatError,
    check_stream_source,
    convert_coco,
    read_stream_meta,
    record_from_index,
    window_from_meta,
)
from seg_datamodule.io.stream import loader as stream_loader  # noqa: E402
from seg_datamodule.io.stream.loader import RefusedSerializer, StreamRecords, schema_serializers  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*max_cache_size.*")


class Payload:
    """Unpickling it runs code: it writes ``marker`` (what an attacker's shell command would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _written(edit: Callable[[dict], dict], index: CocoIndex, i: int) -> dict:
    """``litdata.optimize``'s function: image ``i``'s record, edited. (The record is built in the
    worker: LitData pickles the inputs to its workers, so a Payload input would run there.)"""
    return edit(record_from_index(index, i, index.file_path(i).read_bytes()))


def _optimize(index: CocoIndex, edit: Callable[[dict], dict], out: Path, meta_from: Path, n: int | None = None) -> Path:
    """Write the (edited) records of ``index`` with ``litdata.optimize``, a real metadata file beside them."""
    litdata.optimize(functools.partial(_written, edit, index), list(range(n or len(index))), str(out),
                     chunk_bytes="64KB", num_workers=1, start_method="fork", verbose=False)
    shutil.copy(meta_from / META_FILE, out / META_FILE)
    return out


@pytest.fixture(scope="module")
def demo_index(demo_dir: Path) -> CocoIndex:
    return CocoIndex.build(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017")


@pytest.fixture(scope="module")
def clean(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real conversion of the demo training split."""
    out = tmp_path_factory.mktemp("trust") / "clean"
    convert_coco(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017", str(out),
                 chunk_options=ChunkOptions(start_method="fork", chunk_bytes="256KB"))
    return out


def _poison(marker: Path, record: dict) -> dict:
    return dict(record, image=Payload(marker))


@pytest.fixture(scope="module")
def poisoned(demo_index: CocoIndex, clean: Path) -> tuple[Path, Path]:
    """``(chunks, marker)``: every record's ``image`` pickled as a :class:`Payload`."""
    out = clean.parent / "poisoned"
    marker = clean.parent / "marker"
    _optimize(demo_index, functools.partial(_poison, marker), out, clean)
    config = json.loads((out / "index.json").read_text())["config"]
    assert config["data_format"][4] == "pickle"  # LitData chose pickle for the object, as in the issue
    assert not marker.exists()  # writing it ran nothing
    return out, marker


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_index(folder: Path, edit: Callable[[dict], None]) -> Path:
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def _edit_meta(folder: Path, edit: Callable[[dict], None]) -> Path:
    meta = json.loads((folder / META_FILE).read_text())
    edit(meta)
    (folder / META_FILE).write_text(json.dumps(meta))
    return folder


# ----------------------------------------------------------------------------- the attack


def test_control_plain_litdata_runs_the_payload(poisoned: tuple[Path, Path]) -> None:
    """Without the check, reading one item of the poisoned set runs the attacker's code."""
    out, marker = poisoned
    try:
        litdata.StreamingDataset(str(out))[0]
        assert marker.exists()
    finally:
        marker.unlink(missing_ok=True)


_PICKLE = r"index\.json: field 'config\.data_format': record field 'image' is stored with LitData serializer 'pickle'"


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("scheme", ["", "local:"])
def test_datamodule_refuses_the_poisoned_set_before_unpickling(
    poisoned: tuple[Path, Path], tmp_path: Path, num_workers: int, scheme: str
) -> None:
    from seg_datamodule.data.datamodule import COCOSegDataModule

    out, marker = poisoned
    assert not marker.exists()
    dm = COCOSegDataModule(train_stream=f"{scheme}{out}", image_size=64, batch_size=4, num_workers=num_workers,
                           stream_cache_dir=str(tmp_path / "cache"))
    with pytest.raises(StreamFormatError, match=_PICKLE) as err:
        next(iter(dm.train_dataloader()))
    assert err.value.path == str(out / "index.json") and err.value.field == "config.data_format"
    dataset = SegDataset(window_from_meta(read_stream_meta(str(out))),
                         AugmentOptions(MosaicAffine(64), mosaic_partners="batch"))
    with pytest.raises(StreamFormatError, match=_PICKLE):  # the loader alone, without the DataModule
        next(iter(stream_train_loader(StreamOptions(f"{scheme}{out}", cache_dir=str(tmp_path / "cache2")), dataset,
                                      DetectionCollate(), batch_size=4, num_workers=num_workers)))
    assert not marker.exists()
    assert not list((tmp_path / "cache").rglob("*.bin"))  # not even a chunk was copied


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("scheme", ["", "local:"])
def test_every_worker_checks_the_index_it_is_about_to_read(
    clean: Path, poisoned: tuple[Path, Path], tmp_path: Path, num_workers: int, scheme: str
) -> None:
    """The chunks are swapped for the poisoned set after the loader was built (and checked):
    each worker checks again before it opens them."""
    source, marker = _copy(clean, tmp_path / "swapped"), poisoned[1]
    meta = read_stream_meta(str(source))
    dataset = SegDataset(window_from_meta(meta), AugmentOptions(MosaicAffine(64), mosaic_partners="batch"))
    loader = stream_train_loader(StreamOptions(f"{scheme}{source}", cache_dir=str(tmp_path / "cache")), dataset,
                                 DetectionCollate(), batch_size=4, num_workers=num_workers)
    for chunk in source.glob("*.bin"):
        chunk.unlink()
    for file in poisoned[0].iterdir():
        shutil.copy(file, source / file.name)
    with pytest.raises(StreamFormatError, match="config.data_format") as err:
        next(iter(loader))
    assert num_workers == 0 or "in DataLoader worker process" in str(err.value)  # the worker's own check
    assert not marker.exists()


def test_serializers_outside_the_schema_refuse_even_without_the_check(
    poisoned: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index.json swapped between the check and LitData's read still cannot select pickle."""
    out, marker = poisoned
    monkeypatch.setattr(stream_loader, "check_stream_index", lambda *args, **kwargs: 0)
    monkeypatch.setattr(stream_loader, "read_stream_index", lambda *args, **kwargs: {"chunks": []})
    records = StreamRecords(str(out))
    with pytest.raises(StreamFormatError, match="'pickle' is not a serializer of the record schema"):
        records[0]
    assert not marker.exists()


def test_schema_serializers_keep_only_the_schemas_three() -> None:
    from litdata.streaming.serializers import _SERIALIZERS, _get_serializers

    serializers = _get_serializers(schema_serializers())
    kept = {name for name, s in serializers.items() if not isinstance(s, RefusedSerializer)}
    assert kept == {"int", "bytes", "no_header_numpy"}
    assert set(serializers) == set(_SERIALIZERS)
    for key in ("serializers", "item_loader", "index_path"):
        with pytest.raises(TypeError, match=key):
            StreamRecords("unused", **{key: None})


# ----------------------------------------------------------------------------- other schemas


def _extra(r: dict) -> dict:
    return {**r, "extra": 1}


def _missing(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "crowd_rle"}


def _reordered(r: dict) -> dict:
    return {"image": r["image"], **{k: v for k, v in r.items() if k != "image"}}


def _int32_labels(r: dict) -> dict:
    return {**r, "labels": r["labels"].astype(np.int32)}


@pytest.mark.parametrize(("edit", "message"), [
    (_extra, r"unexpected \['extra'\]"),
    (_missing, r"missing \['crowd_rle'\]"),
    (_reordered, "in another order"),
    (_int32_labels, r"field 'labels' is stored .* 'no_header_numpy:\d+'"),
], ids=["extra", "missing", "reordered", "dtype"])
def test_an_optimized_variant_of_the_schema_raises_the_named_error(
    demo_index: CocoIndex, clean: Path, tmp_path: Path, edit: Callable[[dict], dict], message: str
) -> None:
    from seg_datamodule.data.datamodule import COCOSegDataModule

    out = _optimize(demo_index, edit, tmp_path / "variant", clean, n=6)
    dm = COCOSegDataModule(train_stream=str(out), image_size=64, batch_size=4, num_workers=0)
    with pytest.raises(StreamFormatError, match=rf"{out / 'index.json'}: field 'config\.data_(spec|format)': "
                                                rf".*{message}"):
        dm.setup("fit")


def _set_chunk_name(name: str) -> Callable[[dict], None]:
    def edit(index: dict) -> None:
        index["chunks"][0]["filename"] = name
    return edit


def _set_config(key: str, value: Any) -> Callable[[dict], None]:
    def edit(index: dict) -> None:
        index["config"][key] = value
    return edit


def _set_format(position: int, value: str) -> Callable[[dict], None]:
    def edit(index: dict) -> None:
        index["config"]["data_format"][position] = value
    return edit


@pytest.mark.parametrize(("edit", "field", "message"), [
    (_set_chunk_name("../chunk-0-0.bin"), "chunks[0].filename", "not a plain"),
    (_set_chunk_name("/tmp/chunk-0-0.bin"), "chunks[0].filename", "not a plain"),
    (_set_chunk_name("sub/chunk-0-0.bin"), "chunks[0].filename", "not a plain"),
    (_set_chunk_name("chunk..bin"), "chunks[0].filename", "not a plain"),
    (_set_chunk_name("chunk-0-1.bin"), "chunks[1].filename", "listed twice"),
    (_set_format(5, "numpy"), "config.data_format", "'vertices' is stored with LitData serializer 'numpy'"),
    (_set_format(5, "no_header_numpy:9"), "config.data_format", "'vertices' is stored"),
    (_set_format(0, "pickle"), "config.data_format", "'index' is stored with LitData serializer 'pickle'"),
    (_set_config("data_spec", "[1, {}]"), "config.data_spec", "not a pytree spec"),
    (_set_config("data_spec", "not json"), "config.data_spec", "malformed JSON"),
    (_set_config("compression", "zstd"), "config.compression", "must be null"),
    (_set_config("encryption", {"algorithm": "fernet", "level": "chunk"}), "config.encryption", "must be null"),
    (_set_config("item_loader", "TokensLoader"), "config.item_loader", "must be 'PyTreeLoader'"),
    (_set_config("format", "mds"), "config.format", "not a key this version writes"),
    (lambda index: index.update(shards=[]), "(top level)", "must be an object with"),
    (lambda index: index["chunks"].clear(), "chunks", "non-empty list"),
    (lambda index: index["chunks"][0].update(chunk_size=-1), "chunks[0].chunk_size", "non-negative int"),
    (lambda index: index["chunks"][0].update(chunk_size=index["chunks"][0]["chunk_size"] + 1), "chunks",
     "written by different conversions"),
], ids=["dotdot", "absolute", "separator", "dots", "twice", "numpy", "dtype", "int-pickle", "spec", "spec-json",
        "compression", "encryption", "item-loader", "mds", "shards", "no-chunks", "size", "count"])
def test_an_edited_index_raises_naming_the_file_and_the_field(
    clean: Path, tmp_path: Path, edit: Callable[[dict], None], field: str, message: str
) -> None:
    folder = _edit_index(_copy(clean, tmp_path / "edited"), edit)
    for source in (str(folder), f"local:{folder}"):
        with pytest.raises(StreamFormatError, match=message) as err:
            check_stream_source(source)
        assert str(folder / "index.json") in str(err.value)
        assert err.value.field == field


def test_a_symlinked_chunk_outside_the_folder_is_refused(clean: Path, tmp_path: Path) -> None:
    folder = _copy(clean, tmp_path / "linked")
    outside = tmp_path / "outside.bin"
    shutil.move(folder / "chunk-0-0.bin", outside)
    (folder / "chunk-0-0.bin").symlink_to(outside)
    with pytest.raises(StreamFormatError, match="resolves to .*outside the dataset folder") as err:
        check_stream_source(str(folder))
    assert err.value.field == "chunks[0].filename"


def test_malformed_or_missing_index_json(clean: Path, tmp_path: Path) -> None:
    folder = _copy(clean, tmp_path / "broken")
    (folder / "index.json").write_text('{"chunks": [')
    with pytest.raises(StreamFormatError, match=rf"{folder / 'index.json'}: malformed JSON"):
        check_stream_source(str(folder))
    (folder / "index.json").write_text('{"chunks": NaN}')
    with pytest.raises(StreamFormatError, match="malformed JSON .*NaN"):
        check_stream_source(str(folder))
    (folder / "index.json").write_text("[" * 100_000)
    with pytest.raises(StreamFormatError, match="malformed JSON"):
        check_stream_source(str(folder))
    (folder / "index.json").unlink()  # LitData would build an index from shards it finds; we refuse
    with pytest.raises(FileNotFoundError, match=rf"{folder / 'index.json'} not found"):
        check_stream_source(str(folder))


# ----------------------------------------------------------------------------- the metadata


@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda m: m.update(version=SCHEMA_VERSION + 1), "version",
     rf"schema version {SCHEMA_VERSION + 1}; this package reads version {SCHEMA_VERSION}"),
    (lambda m: m.update(version=SCHEMA_VERSION - 1), "version", rf"schema version {SCHEMA_VERSION - 1}"),
    (lambda m: m.update(format="other"), "format", "must be 'seg_datamodule.stream'"),
    (lambda m: m.pop("image_ids"), "image_ids", "is missing"),
    (lambda m: m.update(extra=1), "extra", "is not a field"),
    (lambda m: m.update(heights=m["heights"][:-1]), "heights", "differ in length"),
    (lambda m: m.update(widths=["640"] * len(m["widths"])), "widths", "list of ints"),
    (lambda m: m.update(positions=[*m["positions"][:-1], len(m["image_ids"])]), "positions", "distinct positions"),
    (lambda m: m.update(num_records=True), "num_records", "must be int"),
    (lambda m: m.update(class_names=m["class_names"][:-1]), "class_names", "one per category id"),
    (lambda m: m.update(skip_counts={"x": -1}), "skip_counts", "counts"),
    (lambda m: m.update(image_ids=[m["image_ids"][0]] * len(m["image_ids"])), "image_ids", "twice"),
], ids=["newer", "older", "format", "missing", "unknown", "lengths", "type", "position", "bool", "names", "counts",
        "duplicate-id"])
def test_an_edited_metadata_file_raises_naming_the_file_and_the_field(
    clean: Path, tmp_path: Path, edit: Callable[[dict], None], field: str, message: str
) -> None:
    folder = _edit_meta(_copy(clean, tmp_path / "meta"), edit)
    with pytest.raises(StreamFormatError, match=message) as err:
        read_stream_meta(f"local:{folder}")
    assert str(folder / META_FILE) in str(err.value) and err.value.field == field


def test_a_real_conversion_passes_and_convert_refuses_its_own_drift(
    demo_dir: Path, clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = check_stream_source(f"local:{clean}")
    assert meta == json.loads((clean / META_FILE).read_text()) and meta["version"] == SCHEMA_VERSION
    from seg_datamodule.io.stream import convert as convert_module

    original = convert_module.record_from_index
    monkeypatch.setattr(convert_module, "record_from_index", lambda *a: {**original(*a), "extra": 0})
    with pytest.raises(StreamFormatError, match=r"unexpected \['extra'\]"):  # fork: workers see the patch
        convert_coco(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017",
                     str(tmp_path / "drift"), chunk_options=ChunkOptions(start_method="fork"))


# ----------------------------------------------------------------------------- s3:// (a loopback moto server)


# The `s3` fixture (a LoopbackS3) is in tests/io/conftest.py.


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_s3_poisoned_set_is_refused_before_unpickling(
    s3: Any, poisoned: tuple[Path, Path], tmp_path: Path, num_workers: int
) -> None:
    from seg_datamodule.data.datamodule import COCOSegDataModule

    options = s3.options
    url, marker = s3.upload(poisoned[0], "poisoned"), poisoned[1]
    with pytest.raises(StreamFormatError, match=_PICKLE) as err:
        check_stream_source(url, options)
    assert err.value.path == f"{url}/index.json"
    dm = COCOSegDataModule(train_stream=url, image_size=64, batch_size=4, num_workers=num_workers,
                           stream_cache_dir=str(tmp_path / "cache"))
    with pytest.raises(StreamFormatError, match=_PICKLE):
        next(iter(dm.train_dataloader()))
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_s3_clean_set_streams_and_a_swapped_index_is_refused_by_the_workers(
    s3: Any, clean: Path, poisoned: tuple[Path, Path], tmp_path: Path, num_workers: int
) -> None:
    client, options = s3.client, s3.options
    url = s3.upload(clean, "data")
    local = {r["index"]: r for r in litdata.StreamingDataset(str(clean))}
    streamed = StreamRecords(url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    for record in streamed:
        want = local[record["index"]]
        assert record["image"] == want["image"] and np.array_equal(record["vertices"], want["vertices"])
    assert len(streamed) == len(local)
    meta = check_stream_source(url, options)
    dataset = SegDataset(window_from_meta(meta), AugmentOptions(MosaicAffine(64), mosaic_partners="batch"))
    loader = stream_train_loader(StreamOptions(url, cache_dir=str(tmp_path / "cache2"), storage_options=options),
                                 dataset, DetectionCollate(), batch_size=4, num_workers=num_workers)
    client.delete_objects(Bucket="bucket", Delete={"Objects": [{"Key": f"data/{p.name}"} for p in clean.iterdir()]})
    s3.upload(poisoned[0], "data")  # swapped after the loader was built and checked
    with pytest.raises(StreamFormatError, match="config.data_format"):
        next(iter(loader))
    assert not poisoned[1].exists()
