"""The statistics ``benchmarks/train_parity.py`` reports: the ratio of means and its bootstrap interval.

(The benchmark itself trains for minutes with the Ultralytics extra; its summary is pure numpy.)
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("train_parity", ROOT / "benchmarks" / "train_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interval_of_constant_sides_is_their_ratio(parity) -> None:
    assert parity.ratio_interval([0.2, 0.2, 0.2], [0.1, 0.1, 0.1]) == pytest.approx((2.0, 2.0))


def test_interval_brackets_the_ratio_of_means_and_is_seeded(parity) -> None:
    ours, theirs = [0.194, 0.179, 0.137, 0.083, 0.153, 0.165], [0.191, 0.143, 0.235, 0.171, 0.246, 0.167]
    lo, hi = parity.ratio_interval(ours, theirs)
    ratio = np.mean(ours) / np.mean(theirs)
    assert lo < ratio < hi
    # the extremes of any resample: every draw of ours at its min over theirs at its max, and the reverse
    assert min(ours) / max(theirs) <= lo and hi <= max(ours) / min(theirs)
    assert parity.ratio_interval(ours, theirs) == (lo, hi)
    assert parity.ratio_interval(ours, theirs, seed=1) != (lo, hi)


def test_interval_narrows_with_more_seeds(parity) -> None:
    seeds = [0.16, 0.2, 0.24]
    few = parity.ratio_interval(seeds, seeds)
    many = parity.ratio_interval(seeds * 20, seeds * 20)  # the same spread, 20 times the seeds
    assert few[0] < 1.0 < few[1] and many[0] < 1.0 < many[1]
    assert many[1] - many[0] < (few[1] - few[0]) / 3  # about sqrt(20) narrower


def test_a_peer_at_zero_gives_no_interval(parity) -> None:
    lo, hi = parity.ratio_interval([0.1, 0.2], [0.0, 0.0])
    assert math.isnan(lo) and math.isnan(hi)


def test_summary_rows_carry_the_interval(parity) -> None:
    def run(side: str, seed: int, ap: float) -> dict:
        return {"side": side, "label": side, "seed": seed, "epochs": [{"segm_AP": ap, "segm_AP50": 2 * ap}]}

    results = [run("ultralytics", 0, 0.1), run("ultralytics", 1, 0.3), run("seg_datamodule", 0, 0.2),
               run("seg_datamodule", 1, 0.2)]
    (row,) = parity.summarise(results, 1, {"ultralytics": "ultralytics", "seg_datamodule": "seg_datamodule"})
    assert row["ratio/segm_AP"] == pytest.approx(1.0)
    assert row["ultralytics/segm_AP"] == pytest.approx((0.2, 0.1))
    lo, hi = row["ratio_ci95/segm_AP"]
    assert lo == pytest.approx(0.2 / 0.3) and hi == pytest.approx(0.2 / 0.1)  # theirs resampled to all-0.3 / all-0.1


def _args(parity, *extra: str):
    """The benchmark's own parsed arguments (its defaults), with ``--key value`` changes."""
    return parity.parse_args([word for item in extra for word in item.split(" ")])


def test_a_run_is_reused_only_with_its_own_settings(parity, tmp_path) -> None:
    run = tmp_path / "seg_datamodule_seed0"
    run.mkdir()
    settings = parity.run_settings("seg_datamodule", _args(parity))
    (run / parity.SETTINGS).write_text(json.dumps(settings))
    parity.check_settings(run, parity.run_settings("seg_datamodule", _args(parity)))  # same: reused
    with pytest.raises(SystemExit) as err:
        parity.check_settings(run, parity.run_settings("seg_datamodule", _args(parity, "--epochs 10")))
    assert str(err.value) == (f"{run} holds a run made with other settings (epochs 20 there, 10 now): "
                              "delete it, or pass another --out")
    with pytest.raises(SystemExit, match=r"ours \[\] there, \['data.mask_fill=ultralytics'\] now"):
        fill = _args(parity, "--ours data.mask_fill=ultralytics", "--variant fill")
        parity.check_settings(run, parity.run_settings("seg_datamodule", fill))
    # a run made before the shipped config changed is not that config's run
    changed = dict(settings, config="0" * 16)
    (run / parity.SETTINGS).write_text(json.dumps(changed))
    with pytest.raises(SystemExit, match=r"config '0{16}' there, '[0-9a-f]{16}' now"):
        parity.check_settings(run, parity.run_settings("seg_datamodule", _args(parity)))
    # Ultralytics' side does not depend on this project's changes: the same run serves every variant.
    assert parity.run_settings("ultralytics", _args(parity, "--ours data.mask_fill=ultralytics", "--variant fill")) == \
        parity.run_settings("ultralytics", _args(parity))


def test_a_run_without_a_record_of_its_settings_is_refused(parity, tmp_path) -> None:
    with pytest.raises(SystemExit, match="no record of its settings"):
        parity.check_settings(tmp_path, parity.run_settings("ultralytics", _args(parity)))


@pytest.mark.needs("ultralytics")
def test_the_data_folder_is_reused_only_with_its_own_settings(parity, tmp_path) -> None:
    """The generated data (COCO and its Ultralytics copy) is made once; asked for with another
    size, seed or count it is refused, naming what differs, not silently served."""
    data = tmp_path / "data"
    kwargs = {"num_train": 3, "num_val": 2, "size": (64, 96), "seed": 5}
    made = parity.make_dataset(data, **kwargs)
    labels = sorted(p.name for p in (data / "labels" / "train").iterdir())
    assert made == data / "data.yaml" and len(labels) == 3
    stamp = made.stat().st_mtime_ns
    assert parity.make_dataset(data, **kwargs) == made and made.stat().st_mtime_ns == stamp  # reused as is
    with pytest.raises(SystemExit) as err:
        parity.make_dataset(data, **dict(kwargs, seed=6))
    assert str(err.value) == (f"{data} holds a run made with other settings (seed 5 there, 6 now): "
                              "delete it, or pass another --out")


def test_ultralytics_against_itself_is_its_later_seeds_over_its_earlier(parity) -> None:
    def run(side: str, seed: int, ap: float) -> dict:
        return {"side": side, "label": side, "seed": seed, "epochs": [{"segm_AP": ap, "segm_AP50": ap}]}

    label = {"ultralytics": "ultralytics", "seg_datamodule": "seg_datamodule"}
    ours = [run("seg_datamodule", s, 0.5) for s in range(5)]
    # listed out of seed order: the halves are by seed, not by position
    peer = [run("ultralytics", 3, 0.6), run("ultralytics", 0, 0.2), run("ultralytics", 4, 0.5),
            run("ultralytics", 1, 0.4), run("ultralytics", 2, 9.0)]
    (row,) = parity.summarise(ours + peer, 1, label)
    assert row["peer_halves/segm_AP"] == pytest.approx(((0.6 + 0.5) / 2) / ((0.2 + 0.4) / 2))  # seed 2 sits out
    (row,) = parity.summarise(ours + peer[:3], 1, label)  # 3 seeds: no halves of 2
    assert row["peer_halves/segm_AP"] is None
    zero = [run("ultralytics", s, 0.0 if s < 2 else 0.3) for s in range(4)]
    (row,) = parity.summarise(ours + zero, 1, label)  # the earlier half at 0: no ratio
    assert row["peer_halves/segm_AP"] is None


def test_batch_numbers_by_hand() -> None:
    spec = importlib.util.spec_from_file_location("parity_batches", ROOT / "benchmarks" / "parity_batches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch = pytest.importorskip("torch")
    img = torch.full((2, 3, 32, 32), 114, dtype=torch.uint8)  # two grey canvases
    img[0, 0, :16, :16] = 200  # image 0: a red-ish quarter (saturation 86/200 there)
    masks = torch.zeros(3, 8, 8, dtype=torch.uint8)
    masks[0, :4, :4] = 1  # 16 of 64 cells, its box 0.5 x 0.5 of the canvas: 16 / 16 cells
    masks[1, 0, :2] = 1  # 2 cells in a box of 0.25 x 0.25 (4 cells): 0.5
    masks[2, 4:, 4:] = 1  # image 1's one instance: 16 cells, box 0.5 x 1.0 (32 cells)
    batch = {"img": img, "batch_idx": torch.tensor([0.0, 0.0, 1.0]),
             "bboxes": torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.1, 0.1, 0.25, 0.25], [0.75, 0.5, 0.5, 1.0]]),
             "masks": masks}
    got = module.batch_stats([batch])
    assert got["instances / image"].tolist() == [2, 1]
    assert got["box width"].tolist() == pytest.approx([0.5, 0.25, 0.5])
    assert got["mask px (stride 4)"].tolist() == [16, 2, 16]
    assert got["mask / box"].tolist() == pytest.approx([1.0, 0.5, 0.5])
    assert got["masks cover"].tolist() == pytest.approx([16 / 64, 16 / 64])
    assert got["saturation"].tolist() == pytest.approx([0.25 * 86 / 200, 0.0], abs=1e-6)
    assert got["value"].tolist() == pytest.approx([(0.25 * 200 + 0.75 * 114) / 255, 114 / 255], abs=1e-6)
    assert got["padding grey"].tolist() == [114, 114]
    assert got["padding share"].tolist() == [0.75, 1.0]
    # One step of 86 grey levels along 16 rows of one channel, and along 16 columns: 16 of 3 x 32 x 31 each way.
    assert got["sharpness"].tolist() == pytest.approx([16 * 86 / 255 / (3 * 32 * 31), 0.0], abs=1e-7)
    empty = module.batch_stats([{**batch, "batch_idx": torch.zeros(0), "bboxes": torch.zeros(0, 4),
                                 "masks": torch.zeros(0, 8, 8)}])
    assert empty["instances / image"].tolist() == [0, 0] and empty["masks cover"].tolist() == [0.0, 0.0]
    assert len(empty["box width"]) == 0


def test_stop_after_is_checked_against_the_schedule(parity, capsys) -> None:
    assert _args(parity).kept == 20 and _args(parity, "--stop-after 8").kept == 8
    assert _args(parity, "--stop-after 8").epochs == 20  # the schedule stays the full one
    assert _args(parity, "--stop-after 20").stop_after is None  # the whole schedule: nothing stops
    for bad, said in (("--stop-after 0", "between 1 and --epochs (20), got 0"),
                      ("--stop-after 21", "between 1 and --epochs (20), got 21"),
                      ("--stop-after 5 --epochs 4", "between 1 and --epochs (4), got 5")):
        with pytest.raises(SystemExit):
            _args(parity, bad)
        assert said in capsys.readouterr().err


def test_a_run_stopped_early_serves_its_epochs_and_no_more(parity, tmp_path) -> None:
    a = _args(parity, "--stop-after 3")
    run = tmp_path / "ultralytics_seed0"
    run.mkdir()
    (run / parity.SETTINGS).write_text(json.dumps(parity.run_settings("ultralytics", a)))
    epochs = [{"segm_AP": 0.1 * e, "segm_AP50": 0.2 * e} for e in range(1, 6)]
    (run / "result.json").write_text(json.dumps({"side": "ultralytics", "label": "ultralytics", "seed": 0,
                                                 "train_seconds": 1.0, "epochs": epochs}))
    kw = dict(out=tmp_path, data_yaml=None, weights=None, val_json=None, val_images=None, names=[])
    assert parity.run_side("ultralytics", 0, a=a, **kw)["epochs"] == epochs[:3]  # reused, its first 3
    assert parity.run_side("ultralytics", 0, a=_args(parity, "--stop-after 5"), **kw)["epochs"] == epochs
    with pytest.raises(SystemExit) as err:  # a run of 5 epochs is not the full schedule's 20
        parity.run_side("ultralytics", 0, a=_args(parity), **kw)
    assert str(err.value) == (f"{run} holds 5 epochs of the schedule (--stop-after), 20 asked for: "
                              "delete it to train it further")


def test_ultralytics_side_stops_after_its_epoch(parity, monkeypatch) -> None:
    """The script's callback, run against a stand-in for ``ultralytics.YOLO`` and its trainer's epochs."""
    import sys
    import types

    monkeypatch.syspath_prepend(str(ROOT))  # the script's subprocess runs in the repository root

    seen: dict = {}

    class FakeYOLO:
        def __init__(self, weights: str) -> None:
            seen["weights"], seen["callbacks"] = weights, []

        def add_callback(self, event: str, fn) -> None:
            seen["callbacks"].append((event, fn))

        def train(self, **kwargs) -> None:
            seen["kwargs"] = kwargs

    monkeypatch.setitem(sys.modules, "ultralytics", types.SimpleNamespace(YOLO=FakeYOLO))
    exec(parity.ultralytics_script(None, {"epochs": 20, "seed": 3}, None), {})
    assert seen == {"weights": "yolo11n-seg.yaml", "callbacks": [], "kwargs": {"epochs": 20, "seed": 3}}
    exec(parity.ultralytics_script("/w/last.pt", {"epochs": 20}, 4), {})
    [(event, fn)] = seen["callbacks"]
    assert event == "on_fit_epoch_end" and seen["weights"] == "/w/last.pt" and seen["kwargs"] == {"epochs": 20}
    stops = []
    for epoch in range(6):  # Ultralytics' trainer.epoch counts from 0
        trainer = types.SimpleNamespace(epoch=epoch, stop=False)
        fn(trainer)
        stops.append(trainer.stop)
    assert stops == [False, False, False, True, True, True]
    stopped = types.SimpleNamespace(epoch=0, stop=True)  # a stop already asked for (early stopping) stands
    fn(stopped)
    assert stopped.stop is True
    from benchmarks._parity_stop import stop_ultralytics_after

    with pytest.raises(ValueError, match="epoch must be >= 1, got 0"):
        stop_ultralytics_after(0)


def test_our_side_stops_after_its_epoch_with_the_full_schedule(parity, tmp_path, monkeypatch) -> None:
    """This project's side: ``StopAfterEpoch`` in the overlay ends a real Lightning run after epoch N,
    its checkpoint written and ``max_epochs`` (the schedule's length) untouched."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    monkeypatch.syspath_prepend(str(ROOT))  # the CLI's subprocess runs in the repository root
    from benchmarks._parity_stop import StopAfterEpoch

    a = _args(parity, "--stop-after 2")
    overlay = json.loads(parity.our_overlay(tmp_path, tmp_path / "data.yaml", 0, a, None).read_text())
    stop = [c for c in overlay["trainer"]["callbacks"] if c["class_path"] == "benchmarks._parity_stop.StopAfterEpoch"]
    assert stop == [{"class_path": "benchmarks._parity_stop.StopAfterEpoch", "init_args": {"epoch": 2}}]
    assert overlay["trainer"]["max_epochs"] == 20
    full = json.loads(parity.our_overlay(tmp_path, tmp_path / "data.yaml", 0, _args(parity), None).read_text())
    assert [c["class_path"] for c in full["trainer"]["callbacks"]] == ["lightning.pytorch.callbacks.ModelCheckpoint"]

    max_epochs_seen: list[int] = []

    class Model(BoringModel):
        def on_train_epoch_start(self) -> None:
            max_epochs_seen.append(self.trainer.max_epochs)

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="epoch{epoch}", auto_insert_metric_name=False,
                           every_n_epochs=1, save_top_k=-1)
    trainer = pl.Trainer(max_epochs=5, limit_train_batches=2, limit_val_batches=0, num_sanity_val_steps=0,
                         callbacks=[StopAfterEpoch(2), ckpt], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(Model())
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch0.ckpt", "epoch1.ckpt"]
    assert max_epochs_seen == [5, 5] and trainer.max_epochs == 5
    with pytest.raises(ValueError, match="epoch must be >= 1, got 0"):
        StopAfterEpoch(0)


def test_prescale_resizes_as_ultralytics_load_image_sizes_it(parity, tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    for (h, w), want in (((200, 300), (171, 256)), ((360, 240), (256, 171)), ((256, 100), (256, 100)),
                         ((100, 120), (214, 256))):
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        cv2.imwrite(str(tmp_path / "im.png"), image)
        got = parity.prescale_image(tmp_path / "im.png", 256)
        assert got.shape[:2] == want  # ceil(side x 256 / long side), the long side 256 (an upscale too)
        if (h, w) == want:
            assert np.array_equal(got, image)  # already that size: untouched
    with pytest.raises(FileNotFoundError, match=r"nothing\.jpg: not a readable image"):
        parity.prescale_image(tmp_path / "nothing.jpg", 256)


@pytest.mark.needs("ultralytics")
def test_prescaled_data_holds_resized_train_pngs_and_the_same_labels(parity, tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2")
    plain = parity.make_dataset(tmp_path / "data", num_train=4, num_val=2, size=(240, 360), seed=3)
    scaled = parity.make_dataset(tmp_path / "data_prescaled", num_train=4, num_val=2, size=(240, 360), seed=3,
                                 prescale=256)
    train = sorted((scaled.parent / "images" / "train").iterdir())
    assert [p.suffix for p in train] == [".png"] * 4
    for png in train:
        source = plain.parent / "images" / "train" / png.with_suffix(".jpg").name
        original = cv2.imread(str(source))
        got = cv2.imread(str(png))
        r = 256 / max(original.shape[:2])
        assert got.shape[:2] == tuple(min(math.ceil(s * r), 256) for s in original.shape[:2])
        assert np.array_equal(got, cv2.resize(original, got.shape[1::-1], interpolation=cv2.INTER_LINEAR))
    assert all(p.is_symlink() for p in (scaled.parent / "images" / "val").iterdir())
    for split in ("train", "val"):  # normalised labels: the same lines for the resized images
        for label in (plain.parent / "labels" / split).iterdir():
            assert (scaled.parent / "labels" / split / label.name).read_text() == label.read_text()
    assert json.loads((scaled.parent / parity.SETTINGS).read_text())["prescale"] == 256
    assert "prescale" not in json.loads((plain.parent / parity.SETTINGS).read_text())
    with pytest.raises(SystemExit, match="prescale None there, 256 now"):
        parity.make_dataset(tmp_path / "data", num_train=4, num_val=2, size=(240, 360), seed=3, prescale=256)
