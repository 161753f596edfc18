"""The package's shape, checked: module sizes, the import direction, and how many parameters a function takes.

What ``../shared/STYLE.md`` asks and issue 25 made checkable:

* every module under ~400 lines (:data:`MAX_LINES`);
* imports run ``io -> transforms -> data``: nothing under ``seg_datamodule/io/`` or
  ``seg_datamodule/transforms/`` imports ``seg_datamodule.data`` (not even lazily inside a
  function), and the step kinds (``transforms/steps.py``) import none of the steps;
* no function or method takes more than :data:`MAX_PARAMS` parameters (every parameter counts:
  ``self``, positional, keyword-only, ``*args``, ``**kwargs``), except the public ``__init__`` of
  the DataModule and of the LightningModules, whose flat arguments are YAML keys
  (:data:`YAML_SURFACES`).

The scan reads the source with :mod:`ast`, so a dataclass's generated ``__init__`` (an option
object's fields) is not counted: option objects are how long argument lists are meant to travel.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seg_datamodule"
MAX_LINES = 400
MAX_PARAMS = 8
#: ``module:Class`` whose ``__init__`` is a LightningCLI / YAML surface (flat keyword arguments).
YAML_SURFACES = {
    "seg_datamodule/data/datamodule.py:COCOSegDataModule",
    "seg_datamodule/demo/model.py:YolactLite",
    "seg_datamodule/integrations/ultralytics.py:YOLOSegModule",
    "seg_datamodule/integrations/torchvision.py:MaskRCNNModule",
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
            + (a.kwarg is not None))


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualified name, node)`` of every function and method, nested ones included."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_the_scan_sees_the_package() -> None:
    assert len(_modules()) > 50
    assert any(p.name == "datamodule.py" for p in _modules())


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_under_the_line_budget(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (budget {MAX_LINES}): split it by concern"


def test_nothing_under_io_imports_data() -> None:
    offenders = []
    for path in sorted((PACKAGE / "io").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.level == 0 else [("." * node.level) + node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name == "seg_datamodule.data" or name.startswith("seg_datamodule.data."):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
                if name.startswith("..") and "data" in name.split("."):  # a relative climb into data/
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, "io/ must not import data/ (imports run io -> transforms -> data):\n" + "\n".join(offenders)


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, lazy ones included (relative ones as written)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module if node.level == 0 else "." * node.level + node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
    return out


def test_nothing_under_transforms_imports_data() -> None:
    """Steps run in the data path but know nothing of it: ``data/`` executes them, not the reverse."""
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for path in sorted((PACKAGE / "transforms").rglob("*.py")) for line, name in _imported(path)
                 if name.startswith(("seg_datamodule.data", ".")) or name == "seg_datamodule.data"]
    assert not offenders, "transforms/ must not import data/ (nor import relatively):\n" + "\n".join(offenders)


def test_the_step_kinds_import_no_step() -> None:
    """``transforms/steps.py`` (the kinds) sits below every step: it imports only errors, structures, ops and plans."""
    allowed = ("seg_datamodule.errors", "seg_datamodule.structures", "seg_datamodule.ops",
               "seg_datamodule.transforms.plan")
    names = [name for _, name in _imported(PACKAGE / "transforms" / "steps.py") if name.startswith("seg_datamodule")]
    assert names and all(name.startswith(allowed) for name in names), names


def test_no_function_takes_more_than_eight_parameters() -> None:
    offenders = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        for name, node in _functions(ast.parse(path.read_text())):
            n = _params(node)
            if n <= MAX_PARAMS:
                continue
            owner, _, method = name.rpartition(".")
            if method == "__init__" and f"{rel}:{owner}" in YAML_SURFACES:
                continue
            offenders.append(f"{rel}:{node.lineno} {name} takes {n} parameters")
    assert not offenders, (f"more than {MAX_PARAMS} parameters (take an options object or make a small class):\n"
                           + "\n".join(offenders))


def test_the_yaml_surfaces_exist() -> None:
    """The exemption list names real classes (a renamed module would silently widen it otherwise)."""
    for entry in YAML_SURFACES:
        rel, _, cls = entry.partition(":")
        tree = ast.parse((ROOT / rel).read_text())
        assert any(isinstance(n, ast.ClassDef) and n.name == cls for n in ast.walk(tree)), entry


def test_the_parameter_count_counts_every_kind() -> None:
    """A hand-computed case: self, positional-only, plain, *args, keyword-only and **kwargs all count."""
    tree = ast.parse("class C:\n    def f(self, a, /, b, *args, c, d=1, **kw): ...\n")
    [(name, node)] = _functions(tree)
    assert name == "C.f" and _params(node) == 7
