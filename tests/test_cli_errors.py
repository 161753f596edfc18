"""A user's mistake on the command line is one line and exit code 2 (issue 40).

Before: a missing ``train_ann`` printed a 55-line traceback, a YAML typo 97 lines of usage before
the one line that mattered. The unit tests pin the pieces (the closest key, the one-line form, an
error re-raised from a real DataLoader worker); the CLI tests count the lines a real command prints.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from _cli import Ran, run_commands
from seg_datamodule.cli_errors import MAX_CHARS, TRACEBACK_ENV, close_key, one_line, user_error_line
from seg_datamodule.errors import UserInputError
from seg_datamodule.io.images.errors import BadImageError

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"data.train_ann", "data.train_images", "data.val_ann", "trainer.max_epochs", "config"}


# ------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize("message,expected", [
    ("Subcommand 'fit' does not accept option 'data.trian_ann'", "data.train_ann"),  # a typo in the YAML
    ("unrecognized arguments: --data.trian_ann x", "data.train_ann"),  # on the command line
    ("unrecognized arguments: --trainer.max_epohcs 3", "trainer.max_epochs"),
    ("unrecognized arguments: --data.batch_size 3", None),  # nothing close: no guess
    ("Option 'widht' is not accepted", None),
    ("Parser key \"data.train_ann\":\n  Expected a <class 'str'>. Got value: 3", None),  # a known key
])
def test_close_key(message: str, expected: str | None) -> None:
    assert close_key(message, KEYS) == expected


def test_one_line_flattens_and_bounds_a_message() -> None:
    assert one_line('Parser key "model":\n\n  - Expected a path\n  - Does not validate') == (
        'Parser key "model": - Expected a path - Does not validate')
    long = one_line("x " * MAX_CHARS)
    assert len(long) <= MAX_CHARS and long.endswith(" ...") and "\n" not in long


class _StrictError(UserInputError, ValueError):
    """A user error torch cannot rebuild from its message (a required keyword)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Raises(Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        raise self.error


def _from_worker(error: Exception) -> BaseException:
    with pytest.raises(Exception) as info:
        next(iter(DataLoader(_Raises(error), num_workers=1)))
    return info.value


def test_a_user_error_is_one_line() -> None:
    error = BadImageError("image id 7: image file a.jpg does not exist\n(second line)", reason="image_missing")
    assert user_error_line(error) == "BadImageError: image id 7: image file a.jpg does not exist (second line)"
    assert user_error_line(ValueError("a bug")) is None
    assert user_error_line(KeyboardInterrupt()) is None


@pytest.mark.slow
def test_a_worker_error_is_unwrapped_to_the_original() -> None:
    # torch re-raises the worker's error with the worker's whole traceback as its message.
    wrapped = _from_worker(BadImageError("image id 7: image file a.jpg does not exist", reason="image_missing"))
    assert isinstance(wrapped, BadImageError) and "Original Traceback" in str(wrapped)
    assert user_error_line(wrapped) == "BadImageError: image id 7: image file a.jpg does not exist"
    # One it cannot rebuild arrives as a RuntimeError: the type comes from the text.
    strict = _from_worker(_StrictError("bad thing in file x", code=3))
    assert type(strict) is RuntimeError
    assert user_error_line(strict) == "_StrictError: bad thing in file x"
    # A bug in a worker stays a bug.
    assert user_error_line(_from_worker(ZeroDivisionError("division by zero"))) is None


# ------------------------------------------------------------------------------ the command line


_COCO = ["fit", "--config", str(ROOT / "configs" / "coco.yaml")]
_BAD_FILE = [*_COCO, "--data.train_ann", "train.json", "--data.train_images", "images", "--data.val_ann", "null",
             "--data.val_images", "null"]


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Ran]]:
    """(the working folder, each mistake's run): every command of this section, in two interpreters
    (one with the full traceback asked for), not one each: a CLI start is ~6 s of imports."""
    cwd = tmp_path_factory.mktemp("mistakes")
    (cwd / "mine.yaml").write_text("data:\n  trian_ann: instances_train2017.json\n")
    (cwd / "train.json").write_text('{"images": [], "annotations": [')
    (cwd / "images").mkdir()
    plain = {"missing": [*_COCO, "--data.train_ann", "nope/train.json"],
             "yaml typo": [*_COCO, "--config", "mine.yaml"],
             "flag typo": [*_COCO, "--data.val_ann=x", "--data.trian_ann", "x"],
             "bad file": [*_BAD_FILE, "--data.cache_dir", str(cwd / "cache")]}
    asked = {"usage": ["fit", "--config", "mine.yaml"],  # exits 2: the next runs
             "missing, traceback": [*_COCO, "--data.train_ann", "nope/train.json"]}  # raises: last
    runs = dict(zip(plain, run_commands(list(plain.values()), cwd)))
    runs.update(zip(asked, run_commands(list(asked.values()), cwd, env=dict(os.environ, **{TRACEBACK_ENV: "1"}))))
    assert set(runs) == set(plain) | set(asked), sorted(runs)
    return cwd, runs


def _lines(ran: Ran) -> list[str]:
    """What the user sees, less Lightning's "Seed set to 0" (printed before anything is checked)."""
    return [line for line in ran.output.splitlines() if line and not line.startswith("Seed set to")]


@pytest.mark.slow
def test_a_missing_annotation_file_is_one_line_before_the_model(mistakes) -> None:
    cwd, runs = mistakes
    ran = runs["missing"]
    assert ran.code == 2, ran.stderr[-3000:]
    [line] = _lines(ran)  # was a 55-line traceback
    assert line.startswith("seg-datamodule fit: error: InputPathError: train_ann: expected an existing file, got "
                           f"'nope/train.json' ({cwd / 'nope' / 'train.json'}): no such file or folder")
    assert TRACEBACK_ENV in line
    again = runs["missing, traceback"]
    assert again.code == 1 and "Traceback (most recent call last)" in again.stderr
    assert again.stderr.rstrip().splitlines()[-1].startswith("seg_datamodule.io.paths.InputPathError: train_ann")


@pytest.mark.slow
def test_a_yaml_typo_is_one_line_with_the_key_meant(mistakes) -> None:
    _, runs = mistakes
    ran = runs["yaml typo"]
    assert ran.code == 2
    [line] = _lines(ran)  # was 97 lines of usage, the one that mattered last
    assert line.startswith("seg-datamodule: error: Subcommand 'fit' does not accept option 'data.trian_ann' "
                           "(did you mean 'data.train_ann'?)")
    flag = runs["flag typo"]
    assert flag.code == 2 and len(_lines(flag)) == 1 and "did you mean 'data.train_ann'?" in flag.stderr
    usage = runs["usage"]
    assert usage.code == 2 and "usage: seg-datamodule" in usage.stderr  # the full usage, on request


@pytest.mark.slow
def test_a_bad_annotation_file_is_one_line(mistakes) -> None:
    _, runs = mistakes
    ran = runs["bad file"]
    assert ran.code == 2, ran.stderr[-3000:]
    [line] = _lines(ran)
    assert line.startswith("seg-datamodule fit: error: BadAnnotationError: ") and "train.json" in line
