"""The profiler's private reaches into the Trainer: each gone name falls back with one warning
that names the Lightning or torch verified, instead of an ImportError or a silent shift."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from seg_datamodule.compat import UnverifiedPrivateAPIWarning
from seg_datamodule.profiling import trainer_internals


def _trainer(**epoch_loop: object) -> SimpleNamespace:
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(**epoch_loop), _combined_loader=None)
    return SimpleNamespace(fit_loop=fit_loop, global_step=7)


def test_log_step_reads_lightnings_counter() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer_internals.log_step(_trainer(_batches_that_stepped=3)) == 3


def test_without_the_counter_the_global_step_stands_in_with_one_warning() -> None:
    with pytest.warns(UnverifiedPrivateAPIWarning, match="_batches_that_stepped") as caught:
        assert trainer_internals.log_step(_trainer()) == 7
    assert "verified on lightning 2.6.0 to 2.6.6" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer_internals.log_step(_trainer()) == 7


def test_a_missing_lightning_helper_is_a_warning_not_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.utilities import combined_loader

    monkeypatch.delattr(combined_loader, "_shutdown_workers_and_reset_iterator")
    with pytest.warns(UnverifiedPrivateAPIWarning, match="_shutdown_workers_and_reset_iterator"):
        assert trainer_internals.shut_down_train_workers(_trainer()) is False


def test_a_missing_torch_iterator_method_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.data import dataloader

    monkeypatch.delattr(dataloader._MultiProcessingDataLoaderIter, "_shutdown_workers")
    with pytest.warns(UnverifiedPrivateAPIWarning, match="verified on torch 2.4.1 to 2.14.1"):
        assert trainer_internals.shut_down_train_workers(_trainer()) is False


def test_a_fit_loop_without_its_combined_loader_is_a_warning() -> None:
    trainer = _trainer()
    del trainer.fit_loop._combined_loader
    with pytest.warns(UnverifiedPrivateAPIWarning, match="no _combined_loader"):
        assert trainer_internals.shut_down_train_workers(trainer) is False


def test_no_loader_yet_is_not_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer_internals.shut_down_train_workers(_trainer()) is False
