"""The table of private reaches and its one warning: once per process, naming the releases verified;
an unverified release of a package whose reach changes results is an error; the table's lowest
releases are the ones pyproject.toml admits and .ci/run tests."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from seg_datamodule import compat

ROOT = Path(__file__).resolve().parents[1]


def test_warns_once_per_reach_naming_installed_and_verified_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "installed_version", lambda package: "9.9.9")
    with pytest.warns(compat.UnverifiedPrivateAPIWarning) as caught:
        assert compat.warn_unverified("storage_use_count", "it is gone", "falling back")
    message = str(caught[0].message)
    assert "torch._C._storage_Use_Count" in message and "it is gone. falling back" in message
    assert "verified on torch 2.4.1 to 2.14.1; this is 9.9.9" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not compat.warn_unverified("storage_use_count", "still gone", "falling back")
    with pytest.warns(compat.UnverifiedPrivateAPIWarning, match="set_random_state"):  # another reach: its own
        assert compat.warn_unverified("albumentations_seeding", "gone", "unseeded")


def test_a_custom_warn_function_gets_the_category(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    compat.warn_unverified("fetch_action", "renamed", "no fetch phase", warn=lambda m, **kw: seen.append((m, kw)))
    assert len(seen) == 1 and seen[0][1] == {"category": compat.UnverifiedPrivateAPIWarning}


def test_require_version_names_the_supported_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "installed_version", lambda package: "0.2.76")
    compat.require_version("litdata_state", extra="stream")
    for other in ("0.2.77", "0.3.0", "(not installed)", "0.2.76.dev0"):
        monkeypatch.setattr(compat, "installed_version", lambda package, v=other: v)
        with pytest.raises(ImportError, match=re.escape(f"litdata 0.2.76 only, and litdata {other} is installed")) as err:
            compat.require_version("litdata_state", extra="stream")
        assert "pip install 'seg-datamodule[stream]'" in str(err.value)


def test_installed_version_of_a_missing_package() -> None:
    assert compat.installed_version("no-such-distribution-here") == "(not installed)"


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return dict(line.split("==") for line in lines if line)


def _lower_bounds(pyproject: Path) -> dict[str, str]:
    import tomllib

    specs = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    bounds = {}
    for spec in specs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9.]+)", spec.replace(" ", ""))
        assert match, f"{spec!r}: a lower bound only, or an upper bound with a comment naming the break"
        bounds[match.group(1)] = match.group(2)
    return bounds


def test_lowest_pins_are_the_lower_bounds_and_the_verified_floor() -> None:
    lowest, pyproject = ROOT / ".ci" / "lowest.txt", ROOT / "pyproject.toml"
    if not lowest.is_file() or not pyproject.is_file():
        pytest.skip("not run from a checkout")
    pins, bounds = _pins(lowest), _lower_bounds(pyproject)
    assert set(pins) == set(bounds), "every dependency is pinned at its lower bound in .ci/lowest.txt"
    for name, bound in bounds.items():
        assert pins[name].startswith(bound), (name, pins[name], bound)
    for key, reach in compat.REACHES.items():
        if reach.package in pins:
            assert reach.verified[0] == pins[reach.package], key


_IMPORT_TWICE = """
import importlib, warnings
warnings.simplefilter("always")
import seg_datamodule
from seg_datamodule import compat
from seg_datamodule.transforms.pixel import albu
importlib.reload(albu)  # a second import-time check: still one warning
print("warned again:", compat.warn_if_albumentationsx())
"""


@pytest.mark.parametrize("installed", [None, "2.0.9", "2.5.1"])
def test_albumentationsx_is_named_once_at_import_with_its_licence_and_the_mit_pin(tmp_path: Path,
                                                                                 installed: str | None) -> None:
    """AlbumentationsX shares albumentations' import name: its distribution's metadata (as its
    2.0.9 and 2.5.1 wheels write it) is what tells them apart."""
    import os
    import subprocess
    import sys

    if installed is not None:
        meta = tmp_path / f"albumentationsx-{installed}.dist-info"
        meta.mkdir()
        licence = ("License: GNU AFFERO GENERAL PUBLIC LICENSE\n        Version 3, 19 November 2007\n"
                   if installed == "2.0.9" else "License-Expression: AGPL-3.0-only\n")
        (meta / "METADATA").write_text(f"Metadata-Version: 2.4\nName: albumentationsx\nVersion: {installed}\n{licence}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", _IMPORT_TWICE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "LicenceWarning" in line]
    assert "warned again: False" in proc.stdout
    if installed is None:
        assert warned == [], proc.stderr[-3000:]
        return
    assert len(warned) == 1, proc.stderr[-3000:]
    licence = "GNU AFFERO GENERAL PUBLIC LICENSE" if installed == "2.0.9" else "AGPL-3.0-only"
    assert f"AlbumentationsX {installed}" in warned[0] and f"licence: {licence}" in warned[0]
    assert "pip uninstall -y albumentationsx && pip install --force-reinstall 'albumentations>=2.0.0,<=2.0.8'" in warned[0]


def test_the_mit_pin_is_within_what_pyproject_admits() -> None:
    """The pin the warning gives installs a release pyproject.toml accepts (and the verified newest)."""
    floor = re.search(r'"albumentations>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert compat.MIT_ALBUMENTATIONS == f"albumentations>={floor},<={compat.REACHES['albumentations_seeding'].verified[1]}"
