"""Every module, function, class or command a docstring, message, the README or a docs page names exists.

A cross-reference (``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:``, ``:attr:``,
``:exc:``) or a literal ````seg_datamodule.x.y```` in the package's source is resolved by import:
fully qualified names from the package root, short names in the namespace of the module that
writes them (its imports included). An ``:attr:`` may name an instance attribute, which the
class's source sets as ``self.<name>``. Commands written as ``seg-datamodule <word>`` must be
subcommands the CLI has.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seg_datamodule"
ROLE = re.compile(r":(mod|func|class|meth|data|attr|exc|obj):`~?([A-Za-z_][A-Za-z0-9_.]*)`")
LITERAL = re.compile(r"``(seg_datamodule(?:\.[A-Za-z_][A-Za-z0-9_]*)+)``")
COMMAND = re.compile(r"`+(seg-datamodule[a-z-]*)(?: ([a-z][a-z-]*))?")
#: The console scripts pyproject.toml installs.
SCRIPTS = set(re.findall(r"^([\w-]+) = ", (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("[")[0], re.M))
#: LightningCLI's subcommands and the two that cli.main dispatches itself.
SUBCOMMANDS = {"fit", "validate", "test", "predict", "convert", "loader-bench", "inspect"}
_MISSING = object()


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out.append((name.removesuffix(".__init__"), path))
    return out


def _walk(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def _resolve_qualified(name: str) -> Any:
    """The object a dotted name from an importable root names, or ``_MISSING``."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        return _walk(module, parts[k:])
    return _MISSING


def _is_instance_attribute(owner: Any, name: str) -> bool:
    if not inspect.isclass(owner):
        return False
    try:
        source = inspect.getsource(owner)
    except (OSError, TypeError):
        return False
    return re.search(rf"\bself\.{re.escape(name)}\s*[:=]", source) is not None


def _resolves(module: ModuleType, role: str, target: str) -> bool:
    first, *rest = target.split(".")
    if target.startswith("seg_datamodule."):
        found = _resolve_qualified(target)
        if found is _MISSING and role == "attr" and rest:
            return _is_instance_attribute(_resolve_qualified(target.rsplit(".", 1)[0]), target.rsplit(".", 1)[1])
        return found is not _MISSING
    base = getattr(module, first, getattr(builtins, first, _MISSING))
    if base is _MISSING:  # another package's name (torch.Tensor), or a method of a class here
        if _resolve_qualified(target) is not _MISSING:
            return True
        return role in ("meth", "attr") and not rest and any(
            inspect.isclass(v) and (hasattr(v, first) or _is_instance_attribute(v, first)) for v in vars(module).values())
    if _walk(base, rest) is not _MISSING:
        return True
    return role == "attr" and bool(rest) and _is_instance_attribute(_walk(base, rest[:-1]), rest[-1])


@pytest.mark.parametrize("name,path", _modules(), ids=[n for n, _ in _modules()])
def test_cross_references_resolve(name: str, path: Path) -> None:
    module = importlib.import_module(name)
    text = path.read_text()
    refs = [(m[1], m[2]) for m in ROLE.finditer(text)] + [("lit", t) for t in LITERAL.findall(text)]
    broken = [f":{role}:`{target}`" for role, target in refs if not _resolves(module, role, target)]
    assert not broken, f"{path.relative_to(ROOT)} names what does not exist: {broken}"


def test_commands_named_are_subcommands() -> None:
    texts = {path: path.read_text() for _, path in _modules()}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        texts[page] = page.read_text()
    unknown = sorted({f"{path.relative_to(ROOT)}: {script} {word}".strip() for path, text in texts.items()
                      for script, word in COMMAND.findall(text)
                      if script not in SCRIPTS or (word and word not in SUBCOMMANDS)})
    assert not unknown, unknown


def test_the_checker_catches_a_stale_name() -> None:
    from seg_datamodule.transforms.layouts import mosaic as augment

    assert _resolves(augment, "func", "seg_datamodule.transforms.kernels.plan.snap_for_resize")
    assert not _resolves(augment, "func", "seg_datamodule.mosaic.snap_for_resize")  # a module that moved
    assert not _resolves(augment, "class", "NoSuchThing")
    assert _resolves(augment, "class", "np.random.Generator")
    assert _resolves(importlib.import_module("seg_datamodule.io.coco.index"), "attr",
                     "seg_datamodule.io.coco.index.CocoIndex.dropped_counts")  # set in __init__
    assert SCRIPTS == {"seg-datamodule"}
    assert COMMAND.findall("run ``seg-datamodule-convert`` now") == [("seg-datamodule-convert", "")]  # no such script
    assert COMMAND.findall("``seg-datamodule synthetic``") == [("seg-datamodule", "synthetic")]
