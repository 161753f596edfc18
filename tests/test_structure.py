"""The package's shape, checked: module sizes, the import direction, and how many parameters a function takes.

What ``../shared/STYLE.md`` asks and issue 25 made checkable:

* every module under ~400 lines (:data:`MAX_LINES`; the exceptions in :data:`LINE_BUDGETS` say why);
* imports run ``io -> transforms -> data``: nothing under ``seg_datamodule/io/`` or
  ``seg_datamodule/transforms/`` imports ``seg_datamodule.data`` (not even lazily inside a
  function), the step kinds (``transforms/steps.py``) import none of the steps, and the pipeline
  (``data/samples/pipeline.py``) imports from ``transforms/`` only the recipe, the step interfaces and the
  kernels, never a concrete step; nothing under ``data/`` imports
  the demo, and the DataModule's collaborators do not import the DataModule (issue 36);
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
#: Modules allowed past :data:`MAX_LINES`, and why a cut by size would be worse than the length.
LINE_BUDGETS = {
    # The YAML surface alone: its docstring (one entry per key, ~125 lines) and signature (~60),
    # plus Lightning hooks that are each a few lines handing over to the collaborators (sources,
    # loaders, counts). Checking the keys and building the options lives in data/config/keys.py; cutting
    # the rest again would bring back mixins that re-declare the host's attributes (issue 36).
    "seg_datamodule/data/datamodule.py": 510,
    # The same for YOLOSegModule: its YAML surface (~30 keys documented, ~35 in the signature, their checks)
    # and Lightning hooks handing over to its collaborators (the loss, UltralyticsStepper, the EMA
    # callback, decode_detections, the evaluation stages).
    "seg_datamodule/integrations/ultralytics.py": 415,
}
#: The DataModule's collaborators: each usable alone, so none imports the DataModule.
COLLABORATORS = ("splits/sources.py", "loaders/build.py", "report.py")
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
    lines, budget = len(path.read_text().splitlines()), LINE_BUDGETS.get(str(path.relative_to(ROOT)), MAX_LINES)
    assert lines <= budget, f"{path.relative_to(ROOT)} has {lines} lines (budget {budget}): split it by concern"


def test_the_line_budget_exceptions_exist() -> None:
    """Each exception names a real module (a renamed one would silently keep a wider budget) that
    still needs it (one that shrank under :data:`MAX_LINES` drops its exception)."""
    for rel in LINE_BUDGETS:
        assert (ROOT / rel).is_file(), rel
        assert len((ROOT / rel).read_text().splitlines()) > MAX_LINES, f"{rel} fits {MAX_LINES} lines: drop its budget"


def _imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path`` (or ``source`` as if it were there), lazy ones
    inside functions included, relative ones made absolute; ``from m import x`` gives ``m`` and ``m.x``."""
    out = []
    package = ".".join(path.relative_to(ROOT).parent.parts)
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(part for part in (base, node.module or "") if part)
            out += [(node.lineno, name)] + [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
    return out


def test_data_does_not_import_the_demo() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for path in sorted((PACKAGE / "data").rglob("*.py")) for line, name in _imported(path)
                 if name == "seg_datamodule.demo" or name.startswith("seg_datamodule.demo.")]
    assert not offenders, "data/ must not import the demo (the package wires it in):\n" + "\n".join(offenders)


def test_the_collaborators_do_not_import_the_datamodule() -> None:
    offenders = [f"{name}:{line} imports {module}" for name in COLLABORATORS
                 for line, module in _imported(PACKAGE / "data" / name)
                 if module.startswith("seg_datamodule.data.datamodule")]
    assert not offenders, "a collaborator must work without the DataModule:\n" + "\n".join(offenders)


def test_the_import_scan_sees_relative_and_lazy_imports() -> None:
    """A hand-written case: a relative climb, a relative sibling and an import inside a function."""
    source = "from ..demo import data\nfrom . import datamodule\ndef f():\n    import seg_datamodule.demo.model\n"
    names = {name for _, name in _imported(PACKAGE / "data" / "datamodule.py", source)}
    assert {"seg_datamodule.demo.data", "seg_datamodule.data.datamodule", "seg_datamodule.demo.model"} <= names



@pytest.mark.parametrize("folder", ["io", "transforms"])
def test_nothing_below_data_imports_data(folder: str) -> None:
    """``io/`` reads, ``transforms/`` holds the steps and kernels; ``data/`` executes them, not the reverse."""
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for path in sorted((PACKAGE / folder).rglob("*.py")) for line, name in _imported(path)
                 if name == "seg_datamodule.data" or name.startswith("seg_datamodule.data.")]
    assert not offenders, f"{folder}/ must not import data/ (imports run io -> transforms -> data):\n" + "\n".join(offenders)


def test_the_step_kinds_import_no_step() -> None:
    """``transforms/steps.py`` (the kinds) sits below every step: it imports only errors, structures, ops and plans."""
    allowed = ("seg_datamodule.errors", "seg_datamodule.structures", "seg_datamodule.ops",
               "seg_datamodule.transforms.kernels.plan")
    names = [name for _, name in _imported(PACKAGE / "transforms" / "steps.py") if name.startswith("seg_datamodule")]
    assert names and all(name.startswith(allowed) for name in names), names

#: What ``data/samples/pipeline.py`` may import from ``transforms/``: the recipe and step interfaces,
#: the kernels (the pure placement among them), never a concrete step (it executes whatever steps the recipe holds).
PIPELINE_TRANSFORMS = ("recipe", "steps", "kernels")


def _pipeline_offenders(source: str | None = None) -> list[str]:
    """``line: name`` of each ``transforms/`` import of ``data/samples/pipeline.py`` (or ``source`` there)
    outside :data:`PIPELINE_TRANSFORMS`."""
    out = []
    for line, name in _imported(PACKAGE / "data" / "samples" / "pipeline.py", source):
        parts = name.split(".")
        inside = ".".join(parts[2:])
        if (parts[:2] == ["seg_datamodule", "transforms"] and len(parts) > 2
                and not any(inside == a or inside.startswith(a + ".") for a in PIPELINE_TRANSFORMS)):
            out.append(f"{line}: {name}")
    return out


def test_the_pipeline_imports_no_concrete_step() -> None:
    """The pipeline executes a recipe: no ``AlbumentationsTransform``, ``HSVJitter``, ``SampleMixing`` by name."""
    names = {name for _, name in _imported(PACKAGE / "data" / "samples" / "pipeline.py")}
    assert "seg_datamodule.transforms.recipe.Recipe" in names  # the scan reads the real module
    offenders = _pipeline_offenders()
    assert not offenders, "data/samples/pipeline.py imports a concrete step (use the recipe):\n" + "\n".join(offenders)


def test_the_pipeline_rule_catches_a_step_by_name() -> None:
    """Hand-written offenders: a step module, a step from the package, a lazy import of one."""
    source = ("from seg_datamodule.transforms.group.sample_mixing import SampleMixing\n"
              "from seg_datamodule.transforms import HSVJitter\n"
              "from seg_datamodule.transforms.kernels.plan import TilePlan\n"
              "def f():\n    import seg_datamodule.transforms.pixel.albu\n"
              "from seg_datamodule.transforms.layouts.mosaic import MosaicAffine\n"
              "from seg_datamodule.transforms.kernels.warp import warp_tiles\n")
    assert _pipeline_offenders(source) == ["1: seg_datamodule.transforms.group.sample_mixing",
                                           "1: seg_datamodule.transforms.group.sample_mixing.SampleMixing",
                                           "2: seg_datamodule.transforms.HSVJitter",
                                           "6: seg_datamodule.transforms.layouts.mosaic",
                                           "6: seg_datamodule.transforms.layouts.mosaic.MosaicAffine",
                                           "5: seg_datamodule.transforms.pixel.albu"]  # the lazy one last


#: Module names that repeat on purpose: one per input format, side by side (``io/coco/index.py``,
#: ``io/yolo/index.py``; the errors of images, COCO and YOLO files).
PARALLEL_NAMES = {"io": {"errors", "index"}}


def _repeated_names(folder: Path, allowed: set[str]) -> dict[str, list[str]]:
    """Module stems that occur more than once under ``folder`` (``__init__`` and ``allowed`` aside),
    with the subpackage names among them: a module ``loaders.py`` beside a folder ``loaders/`` repeats."""
    seen: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        if path.stem != "__init__":
            seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    for path in sorted(folder.rglob("__init__.py")):
        if path.parent != folder:
            seen.setdefault(path.parent.name, []).append(str(path.parent.relative_to(ROOT)) + "/")
    return {stem: paths for stem, paths in seen.items() if len(paths) > 1 and stem not in allowed}


@pytest.mark.parametrize("folder", ["data", "io", "transforms"])
def test_no_two_modules_share_a_name(folder: str) -> None:
    """Issue 52: a newcomer finds a module by its name, so within ``data/``, ``io/`` and ``transforms/``
    no two modules (or a module and a subpackage) are called the same."""
    repeated = _repeated_names(PACKAGE / folder, PARALLEL_NAMES.get(folder, set()))
    assert not repeated, f"{folder}/ repeats names: {repeated}"


def test_the_name_rule_catches_a_repeat(tmp_path: Path) -> None:
    """A hand-made tree: ``loaders.py`` beside ``loaders/``, and ``scan.py`` in two subpackages."""
    for rel in ("loaders.py", "loaders/__init__.py", "loaders/build.py", "a/__init__.py", "a/scan.py",
                "b/__init__.py", "b/scan.py", "b/errors.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        repeated = _repeated_names(tmp_path, {"errors"})
    finally:
        ROOT = saved
    assert repeated == {"loaders": ["loaders.py", "loaders/"], "scan": ["a/scan.py", "b/scan.py"]}


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
