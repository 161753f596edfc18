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
