"""LitData's private loader state is rewritten by StreamTrainLoader: any release other than the
one verified is refused at import with an error naming the supported one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("litdata")

from seg_datamodule import compat  # noqa: E402
from seg_datamodule.io.stream import loader  # noqa: E402


def test_an_unknown_litdata_is_refused_naming_the_supported_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "installed_version", lambda package: "0.2.80")
    with pytest.raises(ImportError, match=r"litdata 0\.2\.76 only, and litdata 0\.2\.80 is installed"):
        loader.check_litdata()


def test_a_loader_without_the_counters_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no _num_samples_yielded_streaming, _latest_worker_idx"):
        loader.check_litdata(SimpleNamespace(restore=False))


def test_the_installed_litdata_passes() -> None:
    loader.check_litdata()
