"""Every path the README and the docs site show runs, and so does every config in ``configs/``.

Each bash and python block of ``README.md`` and of every page of ``docs/`` is run as a user would
run it on real COCO-format data (coco-mini), with a logger attached, in page order (the README,
then the site's navigation) in one working folder (so the resume command finds the checkpoint the
COCO run wrote); a command shown on two pages runs once. ``tests/_readme.py`` says exactly what is
substituted (paths, the interpreter, a small step limit). When a page changes, these tests
follow it: a new block is run, and a command no runner knows fails until it is taught or marked
``<!-- readme-test: skip (why) -->``. ``tests/test_docs.py`` builds the site itself. Then every ``configs/*.yaml`` runs through the real CLI
with its own model and callbacks (a config the README already ran is not run twice); every run of
a shipped config turns each warning a user would see into an error (issue 40).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from _optional import NEEDS_COUNTS, PARTS
from _readme import (
    Step, cli_limits, config_needs, doc_pages, make_coco_root, make_lvis_root, parse_blocks, steps_from_blocks, substitute_python,
    substitute_token, WARNINGS_AS_ERRORS, warning_flags,
)
from _pretrained import write_pretrained_weights
from _yolo import make_yolo_root

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [block for page, text in doc_pages(ROOT) for block in parse_blocks(text, page)]
STEPS = steps_from_blocks(BLOCKS, ROOT)
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TIMEOUT = 900


@dataclass
class Result:
    """What one step did: its command, exit status, output and the log folder it wrote."""

    argv: list[str]
    returncode: int
    output: str
    log_dir: Path | None


def _ci_commands() -> list[str]:
    """``.ci/run``'s commands, normalised (``--clear`` dropped: CI reuses no folder anyway)."""
    out = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:  # a line inside a multi-line string: not a command of its own
            continue
        if tokens:
            out.append(" ".join(t for t in tokens if t != "--clear"))
    return out


class _Runner:
    """Runs the pages' steps lazily and in order, each at most once, in one folder."""

    def __init__(self, work: Path, coco: Path, cache: Path) -> None:
        self.work, self.coco, self.bucket = work, coco, work / "bucket"
        for name in ("configs", "benchmarks"):
            (work / name).symlink_to(ROOT / name)
        self.env = dict(os.environ, SEG_DATAMODULE_CACHE=str(cache), MPLBACKEND="Agg", TORCH_HOME=str(work / "torch"))
        write_pretrained_weights(CONFIGS, work, work / "torch")  # what the configs start from (no network here)
        self.results: dict[str, Result] = {}
        self.helps: dict[str, Result] = {}  # every benchmark's --help, from one interpreter

    def result(self, name: str) -> Result:
        """The result of the step called ``name``, running every earlier step first."""
        for step in STEPS:
            if step.name not in self.results:
                self.results[step.name] = self._run(step)
            if step.name == name:
                return self.results[name]
        raise KeyError(name)

    def _exec(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=TIMEOUT)

    def _bench_helps(self) -> dict[str, Result]:
        """Every benchmark step's ``--help``, each script run as ``__main__`` in turn in one new
        interpreter (one start, not one a script: a start was most of each such step's ~5 s)."""
        steps = [s for s in STEPS if s.kind == "bench"]
        driver = self.work / "bench_helps.py"
        driver.write_text(_HELP_DRIVER)
        jobs = [[step.name, str(self.work / step.argv[1]), *step.argv[2:], "--help"] for step in steps]
        proc = self._exec([sys.executable, str(driver), json.dumps(jobs)], self.work)
        assert proc.returncode == 0, proc.stderr[-4000:]
        done = json.loads(proc.stdout.splitlines()[-1])
        return {step.name: Result([sys.executable, *step.argv[1:], "--help"], *done[step.name], None)
                for step in steps}

    def _newest_log_dir(self, root: Path) -> Path | None:
        dirs = [p for p in root.glob("**/version_*") if p.is_dir()]
        return max(dirs, key=lambda p: p.stat().st_mtime_ns) if dirs else None

    def _run(self, step: Step) -> Result:
        if step.kind == "python":
            folder = self.work / ("py-" + re.sub(r"[^A-Za-z0-9_-]+", "-", step.name))
            folder.mkdir()
            script = folder / "block.py"
            script.write_text(substitute_python(step.source, self.coco))
            proc = self._exec([sys.executable, str(script)], folder)
            return Result([str(script)], proc.returncode, proc.stdout + proc.stderr, self._newest_log_dir(folder))
        if step.kind == "bench":
            if step.name not in self.helps:
                self.helps.update(self._bench_helps())
            return self.helps[step.name]
        if step.kind != "cli":  # install / suite: checked against .ci/run; site: tests/test_docs.py
            return Result(step.argv, 0, "", None)
        prog = Path(step.argv[0]).name
        rest = step.argv[3:] if prog.startswith("python") else step.argv[1:]
        argv = [sys.executable, *warning_flags(step.config), "-m", "seg_datamodule",
                *(substitute_token(t, self.coco, self.bucket) for t in rest)]
        argv += cli_limits(step.subcommand, resumes="--ckpt_path" in rest, config=step.config)
        proc = self._exec(argv, self.work)
        log_dir = self._newest_log_dir(self.work / "runs") if step.subcommand == "fit" else None
        return Result(argv, proc.returncode, proc.stdout + proc.stderr, log_dir)


#: Runs each ``[name, script, *argv]`` of ``sys.argv[1]`` (JSON) as ``python script *argv`` would, one after
#: another in this interpreter, and prints ``{name: [exit code, output]}`` as its last line.
_HELP_DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
done = {}
for name, script, *argv in json.loads(sys.argv[1]):
    out, code, path = io.StringIO(), 0, list(sys.path)
    sys.argv, sys.path[0] = [script, *argv], os.path.dirname(script)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            code, _ = 1, out.write(traceback.format_exc())
    sys.path[:] = path
    done[name] = [code, out.getvalue()]
print(json.dumps(done))
"""


@pytest.fixture(scope="module")
def runner(tmp_path_factory, coco_mini, demo_dir) -> _Runner:
    # The demo dataset generated once per session is found where the README's cache root puts it.
    coco = make_coco_root(coco_mini, tmp_path_factory.mktemp("coco") / "coco")
    make_lvis_root(coco, coco.parent / "lvis")
    make_yolo_root(coco_mini, coco.parent / "coco-seg")
    return _Runner(tmp_path_factory.mktemp("readme"), coco, demo_dir.parent)


def _metric_columns(log_dir: Path) -> set[str]:
    with open(log_dir / "metrics.csv", newline="") as f:
        return set(next(csv.reader(f)))


# ------------------------------------------------------------------------------ fast checks


def test_readme_blocks_are_found_and_named():
    names = [b.name for b in BLOCKS]
    assert len(names) == len(set(names))
    # The sections the issues list; a renamed section or a lost block fails here.
    for expected in ("quick-start", "use-it-in-your-own-code", "guides/coco:train-on-coco-2017",
                     "guides/coco:resume-after-a-preemption", "guides/evaluation:coco-map-in-validation",
                     "guides/streaming:streaming-from-object-storage-litdata", "guides/test-predict:test-and-predict",
                     "guides/lvis:train-on-lvis", "guides/ultralytics:ultralytics-datasets-data-yaml",
                     "index:build-this-site"):
        assert expected in names, f"no runnable block in section {expected!r}"
    assert not [b for b in BLOCKS if b.skip is not None and not b.skip.strip()]


def test_a_command_shown_twice_runs_once():
    """The quick start is on the README and on the site's first page: its steps are the README's."""
    shown = [b for b in BLOCKS if "seg_datamodule fit --config configs/demo.yaml\n" in b.code + "\n"]
    assert [b.name for b in shown] == ["quick-start", "index:install-and-run-the-demo"]
    assert [s.name for s in STEPS if s.kind == "cli" and s.argv[-1] == "configs/demo.yaml"] == ["quick-start#3"]
    twice = parse_blocks("# A\n```bash\nseg-datamodule fit --config c.yaml\n```\n", "p") + parse_blocks(
        "# B\n```bash\n.venv/bin/python -m seg_datamodule fit --config c.yaml\n```\n```python\nprint(1)\n```\n", "q")
    assert [s.name for s in steps_from_blocks(twice)] == ["p:a", "q:b-2"]
    # Not more than a handful of runs for the whole site (the suite's time is tight); 39 since both real
    # models' guides show test and predict (issue 50), 42 with the pictures guide (issue 51), 43 with
    # the Pillow comparison (issue 52; a benchmark runs with --help alone), 47 with the device-pixels
    # guide (issue 53: a snippet, a fit on COCO and on a data.yaml, the GPU script), 48 with the training
    # parity page (issue 61; its benchmark runs with --help alone), 49 with its batch comparison (--help too).
    assert sum(s.kind in ("cli", "bench", "python") for s in STEPS) <= 49


def _readme_commands_script():
    """``.ci/readme_commands.py``, the extractor ``.ci/run`` runs the README's quick start with."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_runs_exactly_the_readmes_quick_start_commands():
    """``.ci/run``'s first phase runs what ``.ci/readme_commands.py`` reads out of the README: the quick
    start's install-and-demo line and its test command, as written (issue 60)."""
    script = _readme_commands_script()
    commands = script.quick_start_commands((ROOT / "README.md").read_text())
    quick = next(b for b in BLOCKS if b.name == "quick-start")
    assert commands == [line for line in quick.code.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ['python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m '
                        "seg_datamodule fit --config configs/demo.yaml", ".venv/bin/python -m pytest"]
    steps = [s for s in STEPS if s.name.startswith("quick-start")]
    assert [s.kind for s in steps] == ["install", "install", "cli", "suite"]
    # From the command line, as .ci/run calls it; a continuation is joined, a comment dropped.
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), str(ROOT / "README.md")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines() == commands, proc.stderr
    made = script.quick_start_commands("# x\n## Quick start\n\ntext\n```bash\n# 1. a\npip install \\\n  x\n\n"
                                       "# 2. b\npytest\n```\n```bash\nnot this\n```\n## Next\n")
    assert made == ["pip install x", "pytest"]
    for broken in ("# x\n", "## Quick start\nno block\n## Next\n```bash\nx\n```\n",
                   "## Quick start\n```bash\n# c\n```\n"):
        with pytest.raises(ValueError, match="README.md"):
            script.quick_start_commands(broken)
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'commands=$(python3 .ci/readme_commands.py "$fresh/README.md")' in ci
    assert 'bash -euo pipefail -c "$command"' in ci
    # Nothing of CI's environment stands in for the user's (the gap behind issue 60's 8 red tests).
    assert not re.search(r"ln -s\S* .*\.venv", ci) and ci.index("readme_commands.py") < ci.index("[ultralytics]")


def test_every_readme_install_command_is_run_by_ci():
    """Install steps are not run by a test: CI runs each of them, as written, on a fresh machine (the
    quick start's through ``.ci/readme_commands.py``, the others as lines of ``.ci/run``)."""
    ci = _ci_commands()
    for step in STEPS:
        if step.kind == "install" and not step.name.startswith("quick-start"):
            command = " ".join(t for t in step.argv if t != "--clear")
            assert command in ci, f"README block {step.name}: .ci/run does not run {command!r}"


def test_every_readme_command_has_a_runner():
    # steps_from_blocks raised at import if not; this names the kinds that are run.
    assert {s.kind for s in STEPS} <= {"cli", "bench", "python", "install", "suite", "site"}
    assert sum(s.kind == "bench" for s in STEPS) >= 5


def test_shipped_configs_run_with_warnings_as_errors():
    """issue 40: 14-24 warning lines per run of a shipped config; now any warning fails its run."""
    assert warning_flags("configs/coco.yaml") == WARNINGS_AS_ERRORS == warning_flags(str(CONFIGS[0]))
    assert warning_flags("runs/coco/version_0/config.yaml") == [] == warning_flags(None)
    shipped = [s for s in STEPS if s.kind == "cli" and s.config and s.config.startswith("configs/")]
    assert {Path(s.config).name for s in shipped} >= {"demo.yaml", "coco.yaml", "predict.yaml"}


def test_skip_markers_name_a_reason():
    text = "x\n<!-- readme-test: skip (needs an S3 server) -->\n```bash\necho hi\n```\n## S\n```python\nprint(1)\n```\n"
    blocks = parse_blocks(text)
    assert [(b.name, b.skip) for b in blocks] == [("top", "needs an S3 server"), ("s", None)]
    assert [s.kind for s in steps_from_blocks(blocks)] == ["python"]
    with pytest.raises(ValueError, match="no test runs 'echo hi'"):
        steps_from_blocks(parse_blocks("```bash\necho hi\n```\n"))


# ------------------------------------------------------------------------------ the runs


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(s.name, marks=[pytest.mark.needs(*s.needs)] if s.needs else [])
                                  for s in STEPS if s.kind in ("cli", "bench", "python")])
def test_readme_step_runs(name, runner):
    step = next(s for s in STEPS if s.name == name)
    result = runner.result(name)
    assert result.returncode == 0, f"{shlex.join(result.argv)}\n{result.output[-4000:]}"
    if step.kind == "bench":
        assert "usage:" in result.output
    if step.kind == "cli" and step.subcommand == "predict":  # the writer's files, as the command or configs/predict.yaml names them
        argv = list(step.argv)
        output = argv[argv.index("--trainer.callbacks.output") + 1] if "--trainer.callbacks.output" in argv else (
            "runs/predict/results.json")
        results = json.loads((runner.work / output).read_text())
        images = json.loads((runner.work / output).with_name(Path(output).stem + "_images.json").read_text())
        assert isinstance(results, list) and images["info"]["images_predicted"] == len(images["images"]) > 0
        if "--trainer.callbacks.draw_dir" in argv:  # a picture per image predicted (at most 50)
            pictures = list((runner.work / argv[argv.index("--trainer.callbacks.draw_dir") + 1]).glob("*.jpg"))
            assert len(pictures) == min(50, len(images["images"]))
    if step.kind == "cli" and step.subcommand == "test":
        assert "test/segm_AP" in result.output, result.output[-2000:]
    if step.kind == "cli" and step.subcommand == "fit":
        assert result.log_dir is not None, result.output[-2000:]
        columns = _metric_columns(result.log_dir)
        assert "val/segm_AP" in columns and "train/loss" in columns, sorted(columns)
        assert (result.log_dir / "step_time.json").is_file()
        assert (result.log_dir / "checkpoints" / "last.ckpt").is_file()
        if "--ckpt_path" in step.argv:
            assert re.search(r"Restor\w+ .*from the checkpoint", result.output), result.output[-2000:]
            with open(result.log_dir / "metrics.csv", newline="") as f:
                epochs = {row["epoch"] for row in csv.DictReader(f) if row.get("epoch")}
            assert epochs == {"1"}, epochs  # the resumed run trained the next epoch only
    if step.kind == "python" and result.log_dir is not None:
        assert (result.log_dir / "metrics.csv").is_file()


def _config_command(config: Path) -> str:
    """The subcommand a config's header names (``python -m seg_datamodule fit --config ...``)."""
    match = re.search(r"seg_datamodule (\w+) --config configs/" + re.escape(config.name), config.read_text())
    return match[1] if match else "fit"


def _config_overrides(config: Path, coco: Path) -> list[str]:
    """``--data.KEY path`` for every ``/data/...`` path of the config's ``data`` section (see
    ``substitute_token``: the COCO root made of coco-mini, and the LVIS files beside it)."""
    data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
    return [arg for key, value in data.items() if isinstance(value, str) and value.startswith("/data/")
            for arg in (f"--data.{key}", substitute_token(value, coco, coco))]


@pytest.mark.slow
@pytest.mark.parametrize("config", [pytest.param(c, id=c.name, marks=[pytest.mark.needs(*config_needs(c))]
                                                 if config_needs(c) else []) for c in CONFIGS])
def test_every_config_runs(config, runner, coco_mini):
    """Each config through the real CLI for a few steps, with its own model and callbacks, warning of nothing."""
    ran = [s for s in STEPS if s.kind == "cli" and s.config and Path(s.config).name == config.name]
    if ran:  # the README ran this config already: that run must have passed
        result = runner.result(ran[0].name)
        assert result.returncode == 0, result.output[-4000:]
        return
    command = _config_command(config)
    work = runner.work / f"config-{config.stem}"
    work.mkdir()
    write_pretrained_weights([config], work, runner.work / "torch")
    argv = [sys.executable, *warning_flags(str(config)), "-m", "seg_datamodule", command, "--config", str(config),
            *_config_overrides(config, runner.coco), *cli_limits(command, resumes=False, config=str(config))]
    proc = subprocess.run(argv, cwd=work, env=runner.env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{(proc.stdout + proc.stderr)[-4000:]}"


# ------------------------------------------------------------------------------ optional parts

#: What in a step or a config needs the Ultralytics extra: its module, or a config that builds it.
_NEEDS_ULTRALYTICS = re.compile(r"YOLOSegModule|yolo11n_seg|yolov8n_seg|\bfrom ultralytics\b|\bimport ultralytics\b")


def test_what_needs_an_optional_part_says_so():
    """A block or config that needs the extra names it (else a fresh clone's run fails, issue 60)."""
    for step in STEPS:
        assert set(step.needs) <= set(PARTS), (step.name, step.needs)
        if step.kind in ("cli", "python") and _NEEDS_ULTRALYTICS.search(step.source or shlex.join(step.argv)):
            assert "ultralytics" in step.needs, (
                f"{step.name} needs the Ultralytics extra: mark its block <!-- readme-test: needs ultralytics -->")
    for config in CONFIGS:
        if _NEEDS_ULTRALYTICS.search("\n".join(line for line in config.read_text().splitlines()
                                               if not line.startswith("#"))):
            assert config_needs(config) == ("ultralytics",), (
                f'{config.name}: its header must say pip install "seg-datamodule[ultralytics]"')
    marked = parse_blocks("# A\n<!-- readme-test: needs ultralytics, lvis -->\n```bash\nseg-datamodule fit\n```\n", "p")
    assert [(b.name, b.needs) for b in marked] == [("p:a", ("ultralytics", "lvis"))]
    assert [s.needs for s in steps_from_blocks(marked)] == [("ultralytics", "lvis")]


_STATED = re.compile(r"(\d+)\s+(?:tests?\s+)?needs?\s[^`]*`\[(\w+)\]`")


def test_the_readme_states_how_many_tests_need_each_part(request):
    """The README's test paragraph: how many default-tier tests need each optional part."""
    counts = request.config.stash[NEEDS_COUNTS]
    if not counts["<whole>"]:
        pytest.skip("counted only when every test file is collected (a run of some files counts only theirs)")
    readme = (ROOT / "README.md").read_text()
    stated = {part: int(n) for n, part in _STATED.findall(readme)}
    assert stated == {part: counts.get(part, 0) for part in PARTS}, stated
