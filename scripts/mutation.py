"""Mutation testing of the kernels and structures against their focused test files.

Each *mutant* is the package with one small change to one module: an arithmetic operator swapped
(``+`` for ``-``, ``*`` for ``/``, ...), a comparison loosened or tightened (``<`` for ``<=``,
``==`` for ``!=``), ``and`` for ``or``, a ``not`` dropped, a number moved by one, ``True`` for
``False``, ``minimum`` for ``maximum``, ``min`` for ``max``, ``any`` for ``all``, or a bare call
statement (``np.clip(..., out=x)``) removed. The module's focused tests then run against it: a
mutant that makes a test fail (or time out) is *killed*; one that passes *survives*, and is
either a gap in the tests or *equivalent* (it cannot change any result). Survivors are printed
with their line so a person can tell which.

How it stays fast: the parent process imports the package, numpy, torch and pytest once; each
mutant runs in a forked child that recompiles the mutated module and swaps the new code objects
into the already-imported functions (``function.__code__``), so every ``from ... import`` of
them sees the mutant, then runs ``pytest.main`` on the target's tests with ``-x``. No files are
written into the repository; hypothesis runs derandomised and without its example database, so
a run is reproducible.

Sizing: with ``--budget-minutes`` (default 25, the whole run) each module gets an equal share of
what is left, and a seeded random sample of its mutants when all of them would not fit in it (the
report says how many ran). Mutants are first screened with a quarter of each hypothesis test's
examples (``--examples-scale``); only the survivors run again with all of them, so a survivor
is one the full tests let through. ``--jobs 2`` runs two mutants at once (default: the number of
CPUs, at most 2).

Run: ``python scripts/mutation.py`` (all targets) or
``python scripts/mutation.py geometry collate --budget-minutes 5``; ``--list`` prints the
targets, ``--max-mutants N`` caps each module, ``--json out.json`` saves the results.
Needs only the ``dev`` extra (pytest, hypothesis).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Targets: a module, the tests that claim to cover it, optionally only some of its functions.


@dataclass(frozen=True)
class Target:
    name: str
    module: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()  # qualified-name prefixes; empty means the whole module


TARGETS: tuple[Target, ...] = (
    Target("raster", "seg_datamodule.ops.raster", ("tests/ops/test_raster.py",)),
    Target("geometry", "seg_datamodule.ops.geometry",
           ("tests/ops/test_geometry.py", "-k", "not affine and not compose and not cv2")),
    Target("ragged", "seg_datamodule.ops.ragged",
           ("tests/ops/test_ragged.py", "tests/ops/test_raster.py", "tests/ops/test_geometry.py")),
    Target("polygons", "seg_datamodule.structures.polygons",
           ("tests/ops/test_geometry.py", "tests/transforms/test_mosaic.py")),
    Target("transport", "seg_datamodule.transforms.kernels.polygons", ("tests/transforms/test_mosaic.py",)),
    Target("collate", "seg_datamodule.data.batching.collate", ("tests/data/test_collate.py",)),
    Target("rle", "seg_datamodule.ops.rle", ("tests/demo/test_demo_data.py", "-k", "rle")),
    # The COCO index's checks, one module each; the lock and counter tests (spawned processes, ~55 s)
    # test no parsing.
    *(Target(f"coco-{name}", f"seg_datamodule.io.coco.{name}",
             ("tests/io/coco", "-k", "not processes_starting_together and not skip_counter"))
      for name in ("parse", "scan", "instances", "tables")),
    Target("sampler", "seg_datamodule.data.loaders.sampler", ("tests/data/test_datamodule.py", "-k", "sampler")),
)

# --------------------------------------------------------------------------------------------
# Mutation sites

_BINOP_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
_CMP_SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_NAME_SWAPS = {
    "minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min", "any": "all", "all": "any",
    "argmin": "argmax", "argmax": "argmin", "floor": "ceil", "ceil": "floor",
}
_SYMBOL = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.And: "and", ast.Or: "or",
}


@dataclass
class Site:
    """One mutation: where it is and how to apply it to a freshly parsed tree."""

    line: int
    col: int  # 1-based
    where: str  # qualified name of the enclosing function, or "<module>"
    description: str
    apply: Callable[[], None] = field(repr=False)


def _sites(tree: ast.Module, functions: tuple[str, ...]) -> list[Site]:
    """Every mutation site of ``tree`` in a deterministic order (same order for every parse)."""
    sites: list[Site] = []

    def wanted(qualname: str) -> bool:
        return not functions or any(qualname == f or qualname.startswith(f + ".") for f in functions)

    def visit_body(stmts: list[ast.stmt], qualname: str) -> None:
        for index, stmt in enumerate(stmts):
            if index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):
                continue  # docstring
            visit_stmt(stmt, stmts, index, qualname)

    def visit_stmt(stmt: ast.stmt, parent: list[ast.stmt], index: int, qualname: str) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = stmt.name if qualname == "<module>" else f"{qualname}.{stmt.name}"
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and wanted(inner):
                for default in [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]]:
                    visit_expr(default, inner)
            visit_body(stmt.body, inner)
            return
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _assigns_all(stmt):
            return
        if not wanted(qualname):
            # Still descend: a nested def may be wanted (never the case for our targets).
            return
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            def remove(parent=parent, index=index, stmt=stmt) -> None:
                parent[index] = ast.copy_location(ast.Pass(), stmt)
            sites.append(Site(stmt.lineno, stmt.col_offset + 1, qualname, "call statement removed", remove))
        for name, value in ast.iter_fields(stmt):
            if name in ("annotation", "returns", "type_comment"):
                continue
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    visit_body_plain(value, qualname)
                else:
                    for item in value:
                        if isinstance(item, ast.expr):
                            visit_expr(item, qualname)
                        elif isinstance(item, ast.AST):
                            visit_node_children(item, qualname)
            elif isinstance(value, ast.expr):
                visit_expr(value, qualname)
            elif isinstance(value, ast.AST):
                visit_node_children(value, qualname)

    def visit_body_plain(stmts: list[ast.stmt], qualname: str) -> None:
        for index, stmt in enumerate(stmts):
            visit_stmt(stmt, stmts, index, qualname)

    def visit_node_children(node: ast.AST, qualname: str) -> None:
        # excepthandler, comprehension, keyword, arguments, withitem, match_case ...
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns"):
                continue
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    visit_body_plain(value, qualname)
                else:
                    for item in value:
                        if isinstance(item, ast.expr):
                            visit_expr(item, qualname)
                        elif isinstance(item, ast.AST):
                            visit_node_children(item, qualname)
            elif isinstance(value, ast.expr):
                visit_expr(value, qualname)
            elif isinstance(value, ast.AST):
                visit_node_children(value, qualname)

    def visit_expr(node: ast.expr, qualname: str) -> None:
        if isinstance(node, ast.JoinedStr):
            return  # f-strings: messages
        add = sites.append
        if isinstance(node, (ast.BinOp,)) and type(node.op) in _BINOP_SWAPS:
            new = _BINOP_SWAPS[type(node.op)]
            add(Site(node.lineno, node.col_offset + 1, qualname, f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}",
                     lambda node=node, new=new: setattr(node, "op", new())))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            add(Site(node.lineno, node.col_offset + 1, qualname, f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}",
                     lambda node=node, new=new: setattr(node, "op", new())))
        elif isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _CMP_SWAPS:
                    new = _CMP_SWAPS[type(op)]
                    add(Site(node.lineno, node.col_offset + 1, qualname, f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}",
                             lambda node=node, k=k, new=new: node.ops.__setitem__(k, new())))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
            label = {ast.Not: "not", ast.USub: "-", ast.Invert: "~"}[type(node.op)]

            add(Site(node.lineno, node.col_offset + 1, qualname, f"unary {label} removed",
                     lambda node=node: setattr(node, "_mutation_drop", True)))
        elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)) and node.value is not None \
                and node.value is not Ellipsis:
            value = node.value
            if isinstance(value, bool):
                new_value: object = not value
            elif isinstance(value, int):
                new_value = value + 1 if value != 1 else 0
            elif isinstance(value, float):
                new_value = value + 1.0 if value != 0.0 else 1.0
            else:
                new_value = None
            if new_value is not None:
                add(Site(node.lineno, node.col_offset + 1, qualname, f"{value!r} -> {new_value!r}",
                         lambda node=node, new_value=new_value: setattr(node, "value", new_value)))
        elif isinstance(node, ast.Attribute) and node.attr in _NAME_SWAPS:
            new_attr = _NAME_SWAPS[node.attr]
            add(Site(node.lineno, node.col_offset + 1, qualname, f".{node.attr} -> .{new_attr}",
                     lambda node=node, new_attr=new_attr: setattr(node, "attr", new_attr)))
        elif isinstance(node, ast.Name) and node.id in ("min", "max", "any", "all") and isinstance(node.ctx, ast.Load):
            new_id = _NAME_SWAPS[node.id]
            add(Site(node.lineno, node.col_offset + 1, qualname, f"{node.id} -> {new_id}",
                     lambda node=node, new_id=new_id: setattr(node, "id", new_id)))
        elif isinstance(node, ast.Lambda):
            visit_expr(node.body, qualname)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                visit_expr(child, qualname)
            elif isinstance(child, ast.AST) and not isinstance(child, (ast.operator, ast.cmpop, ast.boolop,
                                                                          ast.unaryop, ast.expr_context)):
                visit_node_children(child, qualname)

    visit_body(tree.body, "<module>")
    return sites


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _assigns_all(stmt: ast.stmt) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def _skip_pragmas(sites: list[Site], source: str) -> list[Site]:
    lines = source.splitlines()
    return [s for s in sites if "pragma: no mutate" not in lines[s.line - 1]]


# --------------------------------------------------------------------------------------------
# Installing a mutant into the already-imported module (in a forked child)


def _swap_code(old: object, new: object, filename: str) -> None:
    """Give ``old`` (a function, or a method wrapper) the code and defaults of ``new``.

    Raises:
        ValueError: the two codes close over different variables (a removed ``super()`` call
            drops the ``__class__`` cell); the caller then replaces the object itself.
    """
    for attr in ("__func__", "fget", "fset", "fdel", "func"):
        if hasattr(old, attr) and hasattr(new, attr) and getattr(old, attr) is not None:
            _swap_code(getattr(old, attr), getattr(new, attr), filename)
    if isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType):
        if old.__code__.co_filename != filename:
            return  # generated (dataclass __init__ ...) or imported: not this module's code
        old.__code__ = new.__code__
        old.__defaults__ = new.__defaults__
        old.__kwdefaults__ = new.__kwdefaults__


def install(module: types.ModuleType, code: types.CodeType) -> None:
    """Run the mutated module body in a scratch namespace and move its code into ``module``."""
    namespace = {"__name__": module.__name__, "__file__": module.__file__,
                 "__package__": module.__package__, "__spec__": module.__spec__, "__builtins__": __builtins__}
    exec(code, namespace)
    filename = module.__file__
    for name, new in namespace.items():
        old = module.__dict__.get(name)
        if old is None or old is new:
            continue
        if isinstance(old, type) and isinstance(new, type) and old.__module__ == module.__name__:
            for attr, new_attr in vars(new).items():
                old_attr = vars(old).get(attr)
                if old_attr is not None:
                    try:
                        _swap_code(old_attr, new_attr, filename)
                    except ValueError:
                        setattr(old, attr, new_attr)
        elif isinstance(old, types.FunctionType):
            try:
                _swap_code(old, new, filename)
            except ValueError:
                module.__dict__[name] = new  # callers that imported the old one keep it
        elif isinstance(old, (int, float, bool, tuple)) and type(old) is type(new) and old != new:
            module.__dict__[name] = new  # a module constant (modules that copied it keep theirs)


# --------------------------------------------------------------------------------------------
# Running


@dataclass
class Result:
    target: str
    index: int
    line: int
    col: int  # 1-based
    where: str
    description: str
    source_line: str
    status: str  # killed, timeout, survived, error
    seconds: float


def _pytest_args(target: Target, basetemp: Path) -> list[str]:
    return [*target.tests, "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", "--no-header",
            "-W", "ignore::pytest.PytestAssertRewriteWarning", f"--basetemp={basetemp}",
            "-o", "addopts=--strict-markers", "--timeout=0"]


def _scale_hypothesis_examples(scale: float) -> None:
    """Scale the default and every explicit ``@settings(max_examples=N)`` (at least 10 examples)."""
    from hypothesis import settings

    settings.register_profile("mutation-scaled", parent=settings.get_profile("mutation"),
                              max_examples=max(10, int(settings.default.max_examples * scale)))
    settings.load_profile("mutation-scaled")
    original = settings.__init__

    def init(self, parent=None, **kwargs):  # noqa: ANN001 - hypothesis' own signature
        if "max_examples" in kwargs:
            kwargs["max_examples"] = max(10, int(kwargs["max_examples"] * scale))
        original(self, parent, **kwargs)

    settings.__init__ = init


def _child(target: Target, code: types.CodeType | None, basetemp: Path, log: Path,
           examples_scale: float) -> None:
    """In the forked child: install the mutant, run the tests, exit with pytest's code."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.setpgid(0, 0)  # its own process group, so a timeout can kill its DataLoader workers too
        if code is not None:
            install(sys.modules[target.module], code)
        if examples_scale != 1.0:
            _scale_hypothesis_examples(examples_scale)
        import pytest

        rc = pytest.main(_pytest_args(target, basetemp))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(rc))
    except BaseException:  # noqa: BLE001 - report anything as an error exit
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(97)


def _start(target: Target, code: types.CodeType | None, workdir: Path, tag: str,
           examples_scale: float) -> tuple[int, Path]:
    basetemp = workdir / f"tmp-{tag}"
    log = workdir / f"log-{tag}.txt"
    pid = os.fork()
    if pid == 0:
        _child(target, code, basetemp, log, examples_scale)
    return pid, log


def _classify(rc: int) -> str:
    # pytest: 0 all passed, 1 some failed, 2 interrupted, 3 internal error, 4 usage, 5 none collected.
    if rc == 0:
        return "survived"
    if rc == 1:
        return "killed"
    return "error"


class Runner:
    def __init__(self, jobs: int, workdir: Path) -> None:
        self.jobs = jobs
        self.workdir = workdir
        self.running: dict[int, tuple[float, float, Callable[[str, float], None], Path]] = {}

    def submit(self, target: Target, code: types.CodeType | None, timeout: float, tag: str,
               done: Callable[[str, float], None], examples_scale: float = 1.0) -> None:
        while len(self.running) >= self.jobs:
            self._reap(block=True)
        pid, log = _start(target, code, self.workdir, tag, examples_scale)
        self.running[pid] = (time.monotonic(), timeout, done, log)

    def _reap(self, block: bool) -> None:
        while True:
            now = time.monotonic()
            for pid, (start, timeout, done, log) in list(self.running.items()):
                waited, status = os.waitpid(pid, os.WNOHANG)
                if waited == pid:
                    del self.running[pid]
                    rc = os.waitstatus_to_exitcode(status)
                    outcome = _classify(rc)
                    if outcome == "error":
                        outcome = f"error (rc {rc}, see {log})"
                    done(outcome, now - start)
                    return
                if now - start > timeout:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    os.waitpid(pid, 0)
                    del self.running[pid]
                    done("timeout", now - start)
                    return
            if not block:
                return
            time.sleep(0.05)

    def drain(self) -> None:
        while self.running:
            self._reap(block=True)

    def kill_all(self) -> None:
        """Stop every child still running (each is its own process group)."""
        for pid in list(self.running):
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.running.clear()


class _DropMarked(ast.NodeTransformer):
    """Replace a unary operation marked by its site with its operand (``not x`` -> ``x``)."""

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        return node.operand if getattr(node, "_mutation_drop", False) else node


def _compile_mutant(source: str, filename: str, target: Target, index: int) -> types.CodeType:
    tree = ast.parse(source, filename)
    sites = _skip_pragmas(_sites(tree, target.functions), source)
    sites[index].apply()
    tree = _DropMarked().visit(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec")


def run_target(target: Target, runner: Runner, budget_s: float, max_mutants: int | None, seed: int,
               verbose: bool, examples_scale: float) -> tuple[list[Result], dict[str, object]]:
    """Baseline, then a screening pass (hypothesis examples scaled), then survivors at full strength."""
    started = time.monotonic()
    module = sys.modules[target.module]
    filename = module.__file__
    source = Path(filename).read_text()
    lines = source.splitlines()
    sites = _skip_pragmas(_sites(ast.parse(source, filename), target.functions), source)

    # 1. Baseline: the tests must pass on the real code; their time sizes the timeout.
    baseline: dict[str, object] = {}

    def base_done(outcome: str, seconds: float) -> None:
        baseline.update(outcome=outcome, seconds=seconds)

    runner.submit(target, None, 600, f"{target.name}-baseline", base_done, examples_scale)
    runner.drain()
    if baseline["outcome"] != "survived":
        print(f"[{target.name}] baseline tests do not pass ({baseline['outcome']}); skipped", flush=True)
        return [], {"mutants": len(sites), "sampled": 0, "baseline_s": baseline["seconds"], "skipped": True}
    base_s = float(baseline["seconds"])
    timeout = max(15.0, 3.0 * base_s + 5.0)
    full_timeout = max(15.0, 3.0 * base_s / examples_scale + 5.0)

    # 2. Sample what fits in three quarters of the budget (the rest is for re-checking
    # survivors at full strength): a survivor costs the whole baseline, a kill usually less.
    screen_s = 0.75 * budget_s
    expected = 0.6 * base_s + 0.3
    fit = max(1, int((screen_s - base_s) * runner.jobs / expected))
    cap = min(len(sites), fit, max_mutants or len(sites))
    order = list(range(len(sites)))
    if cap < len(sites):
        order = sorted(random.Random(seed).sample(order, cap))
    print(f"[{target.name}] {target.module}: {len(sites)} mutants, running {len(order)} "
          f"(baseline {base_s:.1f} s with hypothesis examples x{examples_scale:g}, timeout {timeout:.0f} s)",
          flush=True)

    results: dict[int, Result] = {}

    def record(index: int, outcome: str, seconds: float, final: bool) -> None:
        site = sites[index]
        result = Result(target.name, index, site.line, site.col, site.where, site.description,
                        lines[site.line - 1].strip(), outcome, seconds)
        results[index] = result
        if verbose or (final and (outcome == "survived" or outcome.startswith("error"))):
            print(f"  {outcome:>8s} {Path(filename).name}:{site.line}:{site.col} {site.where}: "
                  f"{site.description}   | {result.source_line[:90]}", flush=True)

    deadline = started + screen_s  # the baseline counts too
    not_run = 0
    full = examples_scale >= 1.0
    for index in order:
        if time.monotonic() > deadline:
            not_run += 1  # the estimate was optimistic: keep to the budget, say so below
            continue
        code = _compile_mutant(source, filename, target, index)
        runner.submit(target, code, timeout, f"{target.name}-{index}",
                      lambda outcome, seconds, index=index: record(index, outcome, seconds, full),
                      examples_scale)
    runner.drain()

    # 3. Survivors of the screening pass again, with every hypothesis example the tests ask for.
    if not full:
        unchecked = 0
        for index in [i for i, r in results.items() if r.status == "survived"]:
            if time.monotonic() > started + budget_s:
                unchecked += 1
                results[index].description += " (screening only: no budget left to re-check)"
                print(f"  survived {Path(filename).name}:{sites[index].line}:{sites[index].col} "
                      f"{sites[index].where}: {results[index].description}", flush=True)
                continue
            code = _compile_mutant(source, filename, target, index)

            def again(outcome: str, seconds: float, index: int = index) -> None:
                record(index, outcome, seconds, True)
                if outcome != "survived":
                    results[index].description += " (killed only at full strength)"

            runner.submit(target, code, full_timeout, f"{target.name}-{index}-full", again, 1.0)
        runner.drain()
    if not_run:
        print(f"[{target.name}] budget spent: {not_run} sampled mutants not run", flush=True)
    return [results[i] for i in sorted(results)], {
        "mutants": len(sites), "sampled": len(order) - not_run, "baseline_s": base_s, "skipped": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="target names (default: all); see --list")
    parser.add_argument("--list", action="store_true", help="print the targets and their mutant counts")
    parser.add_argument("--budget-minutes", type=float, default=25.0, help="whole run, split over the targets")
    parser.add_argument("--max-mutants", type=int, default=None, help="at most this many mutants per target")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutant sample")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("--examples-scale", type=float, default=0.25,
                        help="screen with this fraction of each test's hypothesis examples (min 10); "
                             "survivors are re-run with all of them")
    parser.add_argument("--keep-logs", action="store_true", help="keep the per-mutant pytest logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every mutant, not only survivors")
    args = parser.parse_args()

    os.chdir(ROOT)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chosen = [t for t in TARGETS if not args.targets or t.name in args.targets]
    unknown = set(args.targets) - {t.name for t in TARGETS}
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {[t.name for t in TARGETS]}")

    # Import once in the parent: every child inherits it (the slow part of starting pytest).
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    from hypothesis import settings

    import seg_datamodule  # noqa: F401
    for target in chosen:
        importlib.import_module(target.module)
    # Reproducible hypothesis runs that leave no database behind. Explicit @settings in the test
    # files inherit these (they are created after this profile is loaded, in the child).
    settings.register_profile("mutation", database=None, derandomize=True, deadline=None)
    settings.load_profile("mutation")

    if args.list:
        for t in chosen:
            src = Path(sys.modules[t.module].__file__).read_text()
            n = len(_skip_pragmas(_sites(ast.parse(src), t.functions), src))
            print(f"{t.name:10s} {t.module:40s} {n:5d} mutants  tests: {' '.join(t.tests)}")
        return

    budget_s = args.budget_minutes * 60
    started = time.monotonic()
    summary = []
    all_results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        workdir = Path(tempfile.mkdtemp(prefix="mutation-logs-")) if args.keep_logs else Path(tmp)
        runner = Runner(args.jobs, workdir)
        # A SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the children are stopped too.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            for k, target in enumerate(chosen):
                left = budget_s - (time.monotonic() - started)
                share = max(30.0, left / (len(chosen) - k))
                results, info = run_target(target, runner, share, args.max_mutants, args.seed, args.verbose,
                                           args.examples_scale)
                all_results.extend(results)
                summary.append((target, results, info))
        finally:
            runner.kill_all()

    print("\nkill rate per module (timeouts count as killed):")
    print(f"{'target':10s} {'module':40s} {'mutants':>8s} {'run':>5s} {'killed':>7s} {'timeout':>8s} "
          f"{'survived':>9s} {'error':>6s} {'kill rate':>10s}")
    for target, results, info in summary:
        n = len(results)
        killed = sum(r.status == "killed" for r in results)
        timed = sum(r.status == "timeout" for r in results)
        survived = sum(r.status == "survived" for r in results)
        errors = n - killed - timed - survived
        rate = f"{100 * (killed + timed) / max(1, n - errors):.1f}%" if n else "-"
        print(f"{target.name:10s} {target.module:40s} {info['mutants']:8d} {n:5d} {killed:7d} {timed:8d} "
              f"{survived:9d} {errors:6d} {rate:>10s}")
    survivors = [r for r in all_results if r.status == "survived"]
    if survivors:
        print("\nsurviving mutants:")
        for r in survivors:
            print(f"  {r.target}: {r.line}:{r.col} in {r.where}: {r.description}   | {r.source_line[:100]}")
    print(f"\ntotal {time.monotonic() - started:.0f} s with {args.jobs} job(s)")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in all_results], indent=1))


if __name__ == "__main__":
    main()
