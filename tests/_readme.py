"""The fenced code blocks of the README and the docs site as runnable steps, for ``tests/test_readme.py``.

Every ```` ```bash ```` and ```` ```python ```` block of ``README.md`` and of every page of
``docs/`` (:func:`doc_pages`: the README, then the pages in ``mkdocs.yml``'s navigation order)
becomes one or more :class:`Step` s, named after the page and the section they stand in
(``use-it-in-your-own-code`` in the README, ``guides/coco:train-on-coco-2017`` on a page,
``-2``, ``-3`` ... for later blocks of a section). A block that cannot run in a test carries the line
``<!-- readme-test: skip (why) -->`` just before its fence and is reported skipped by name; a block
that needs an optional part (``tests/_optional.py``) carries ``<!-- readme-test: needs ultralytics -->``
there, and a step that runs a shipped config needs what the config's header installs
(:func:`config_needs`): without the part, the step is skipped saying which. A
command shown twice (the quick start on the README and on the first page) runs once: a step whose
command, as run, an earlier step already runs is left out (:func:`steps_from_blocks`).

A step runs as a user would run it, with five kinds of change, all listed here:

- **paths**: ``/data/coco/...``, ``annotations/instances_*.json`` and bare ``train2017`` /
  ``val2017`` name a COCO root made of coco-mini (:func:`make_coco_root`: its files, plus a
  test-dev image-info file and a ``test2017`` folder made from val), ``/data/lvis/...`` the LVIS
  API's 100-image file in v1 form (:func:`make_lvis_root`), ``/data/coco-seg/...`` coco-mini in
  Ultralytics' layout with its ``data.yaml`` (``_yolo.make_yolo_root``, beside the COCO root);
  ``s3://bucket/...`` names a local folder (no S3 server here);
- **interpreter**: ``.venv/bin/python`` (or ``python``) is the interpreter running the tests,
  and ``seg-datamodule`` (or ``.venv/bin/seg-datamodule``) is its console script;
- **size**: ``fit`` / ``validate`` / ``test`` / ``predict`` runs get :func:`cli_limits` appended
  (a few small steps on two workers, 128 px canvases; a Mask R-CNN fit samples fewer regions,
  :data:`MASK_RCNN_LIMITS`), Python blocks the same limits through :data:`PY_LIMITS`; a
  ``fit`` that resumes (``--ckpt_path``) runs one epoch more than the run that wrote the
  checkpoint; a Python block's own ``max_epochs=`` gives way to the limit's;
- **help**: a benchmark script runs with ``--help`` (the benchmarks themselves take minutes), each
  as ``__main__`` in turn in one interpreter (``tests/test_readme.py``'s ``_HELP_DRIVER``);
- **warnings**: a command that runs a shipped config (``--config configs/...``) runs with every
  warning a user would see as an error (:data:`WARNINGS_AS_ERRORS`), so the shipped configs stay
  quiet;
- **weights**: the pretrained weights the configs start from (``yolo11n-seg.pt``, torchvision's
  ImageNet ResNet-50) are stand-ins of the same layout with random values, written by
  ``tests/_pretrained.py`` into the run folder and ``$TORCH_HOME`` (there is no network).

The installation and test commands of the quick start are not run (that would install the
project or run this suite inside itself); the test checks instead that ``.ci/run`` runs them.
``mkdocs build`` is run by ``tests/test_docs.py``, not here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CLI_LIMITS", "MASK_RCNN_LIMITS", "PY_LIMITS", "WARNINGS_AS_ERRORS", "warning_flags", "Block", "Step", "cli_limits", "doc_pages",
    "config_needs", "make_coco_root", "make_lvis_root", "parse_blocks", "steps_from_blocks", "substitute_python", "substitute_token",
]

#: The canvas side of every run: small (the suite's time), a multiple of 32 (the YOLO configs' stride).
SIZE = "128"

#: Appended to every ``fit`` / ``validate`` / ``test`` command: small, but every stage runs
#: (training past the profiler's warm-up, validation with COCO AP, the checkpoint at the end).
#: Logging every step: the YOLO configs accumulate 64 / 4 = 16 batches per optimiser step (their
#: nominal batch), so these 8 batches make one step, and Lightning logs on optimiser steps.
CLI_LIMITS = [
    "--trainer.limit_train_batches", "8", "--trainer.limit_val_batches", "2",
    "--trainer.check_val_every_n_epoch", "1", "--trainer.num_sanity_val_steps", "0",
    "--trainer.log_every_n_steps", "1", "--data.batch_size", "4", "--data.image_size", SIZE,
    "--data.num_workers", "2",
]
#: A Mask R-CNN fit samples fewer regions than torchvision's training defaults (512 per image for
#: the box head, 2000 proposals kept): its RoI heads, not the canvas, are its CPU cost (4.4 s a
#: step at 128 px, 1.6 s so).
MASK_RCNN_LIMITS = ["--model.init_args.mask_rcnn_kwargs",
                    '{"box_batch_size_per_image": 64, "rpn_pre_nms_top_n_train": 300, "rpn_post_nms_top_n_train": 300}']
#: The evaluation-only limits (``validate``, ``test``, ``predict``): two small batches.
_EVAL_LIMITS = ["--data.val_batch_size", "4", "--data.image_size", SIZE, "--data.num_workers", "2"]
#: The same limits for Python blocks, as (pattern, replacement) over the source.
PY_LIMITS = [
    (r"\bmax_epochs=\d+,?\s*", ""),  # the block's own epoch count gives way to the limit's (next)
    (r"\bTrainer\(", "Trainer(max_epochs=1, limit_train_batches=8, limit_val_batches=2, limit_test_batches=2, "
                     "limit_predict_batches=2, num_sanity_val_steps=0, "),
    (r"\bimage_size=\d+", f"image_size={SIZE}"),
    (r"\b(val_)?batch_size=\d+", r"\1batch_size=4"),
    (r"\bnum_workers=\d+", "num_workers=2"),
]


#: Python's ``-W`` options that make every warning a user sees an error: Python's default filters
#: hide these four categories (outside ``__main__``), every other warning is printed.
WARNINGS_AS_ERRORS = ["-W", "error", "-W", "ignore::DeprecationWarning", "-W", "ignore::PendingDeprecationWarning",
                      "-W", "ignore::ImportWarning", "-W", "ignore::ResourceWarning"]


def warning_flags(config: str | None) -> list[str]:
    """:data:`WARNINGS_AS_ERRORS` for a command that runs a shipped config (``configs/...``), else none."""
    return WARNINGS_AS_ERRORS if config is not None and Path(config).parent.name == "configs" else []


def cli_limits(subcommand: str | None, resumes: bool, config: str | None = None) -> list[str]:
    """What a test appends to a CLI command of the README or a config (see the module docstring)."""
    if subcommand == "fit":
        model = MASK_RCNN_LIMITS if config is not None and Path(config).name == "maskrcnn.yaml" else []
        return [*CLI_LIMITS, *model, "--trainer.max_epochs", "2" if resumes else "1"]
    if subcommand == "loader-bench":
        return ["--data.batch_size", "4", "--data.image_size", SIZE]
    if subcommand == "inspect":  # a few images and probe samples, at the suite's canvas
        return ["--data.batch_size", "4", "--data.image_size", SIZE, "--samples", "4", "--probe", "8"]
    if subcommand in ("validate", "test", "predict"):
        return [f"--trainer.limit_{'val' if subcommand == 'validate' else subcommand}_batches", "2", *_EVAL_LIMITS]
    return []


def make_coco_root(coco_mini: Path, root: Path) -> Path:
    """A COCO 2017 root made of coco-mini: what ``/data/coco`` stands for in the README.

    ``annotations/instances_{train,val}2017.json``, ``train2017/`` and ``val2017/`` are coco-mini's
    (linked); ``test2017/`` is val2017's images and ``annotations/image_info_test-dev2017.json`` is
    val's file without its annotations, the shape of COCO test-dev's.
    """
    import json

    (root / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        (root / "annotations" / f"instances_{split}2017.json").symlink_to(
            coco_mini / "annotations" / f"instances_{split}2017.json")
        (root / f"{split}2017").mkdir()  # a folder of links, so the LVIS images can join it
        for image in (coco_mini / f"{split}2017").iterdir():
            (root / f"{split}2017" / image.name).symlink_to(image)
    (root / "test2017").symlink_to(coco_mini / "val2017")
    val = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    info = {k: v for k, v in val.items() if k != "annotations"}
    (root / "annotations" / "image_info_test-dev2017.json").write_text(json.dumps(info))
    return root


def make_lvis_root(coco_root: Path, root: Path) -> Path:
    """What ``/data/lvis`` stands for: the LVIS API's ``lvis_val_100.json`` in v1 form (no
    ``file_name``; paths from ``coco_url``) as both ``lvis_v1_train.json`` and ``lvis_v1_val.json``,
    its images generated at their sizes in ``coco_root`` where coco-mini does not have them."""
    import cv2
    import numpy as np
    from _lvis import load_json, write_v1

    root.mkdir(parents=True)
    data = load_json(write_v1(root / "lvis_v1_train.json"))
    (root / "lvis_v1_val.json").write_text((root / "lvis_v1_train.json").read_text())
    rng = np.random.default_rng(0)
    for image in data["images"]:
        path = coco_root.joinpath(*image["coco_url"].split("/")[-2:])
        if path.exists():  # coco-mini's own image of that id (its true size)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (image["height"] // 16 + 1, image["width"] // 16 + 1, 3), dtype=np.uint8)
        cv2.imwrite(str(path), cv2.resize(pixels, (image["width"], image["height"]), interpolation=cv2.INTER_NEAREST))
    return root

_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
_NEEDS = re.compile(r"<!--\s*readme-test:\s*needs\s+(?P<parts>[\w, ]+?)\s*-->")
#: A config's header names the extra it needs as its install line does (``seg-datamodule[ultralytics]``).
_CONFIG_NEEDS = re.compile(r"pip install \"seg-datamodule\[(?P<extra>\w+)\]\"")
_FENCE = re.compile(r"^```(?P<lang>[A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of the README or of a docs page.

    Attributes:
        name: the section's slug, with ``-2``, ``-3`` ... for later blocks of that section, after
            ``page:`` for a docs page (``guides/coco:train-on-coco-2017``).
        lang: ``"bash"`` or ``"python"`` (other fences are prose and not collected).
        code: the block's text.
        line: 1-based line of the opening fence.
        skip: why the block is not run, from its ``readme-test: skip`` marker; ``None`` runs it.
        needs: the optional parts (``tests/_optional.py``) its steps need, from its
            ``readme-test: needs ultralytics`` marker: without them its steps are skipped, saying which.
    """

    name: str
    lang: str
    code: str
    line: int
    skip: str | None = None
    needs: tuple[str, ...] = ()


@dataclass
class Step:
    """One command (bash) or one whole block (python) to run.

    Attributes:
        name: the block's name, ``#k`` appended for the k-th command of a bash block.
        kind: ``"cli"`` (``python -m seg_datamodule`` / ``seg-datamodule``), ``"bench"``,
            ``"python"``, ``"install"`` or ``"suite"`` (checked against ``.ci/run``, not run), or
            ``"site"`` (``mkdocs build``, run by ``tests/test_docs.py``).
        argv: the command as the README writes it (bash), or ``[]`` (python).
        source: the block's code (python), or ``""``.
        subcommand: for ``cli``: ``fit``, ``validate``, ``convert``, ...
        config: for ``cli``: the ``--config`` file it names, if any.
        needs: the optional parts it needs: its block's, and those its shipped config names
            (:func:`config_needs`).
    """

    name: str
    kind: str
    argv: list[str] = field(default_factory=list)
    source: str = ""
    subcommand: str | None = None
    config: str | None = None
    needs: tuple[str, ...] = ()


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def doc_pages(root: Path) -> list[tuple[str, str]]:
    """``(page, text)`` of ``README.md`` (page ``""``) and of every page of ``mkdocs.yml``'s nav, in order.

    The order is the order the steps run in, one working folder for all: the COCO guide's fit
    writes the checkpoint its resume command and the test and predict guide read.
    """
    import yaml

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for value in node.values() for p in walk(value)]
        if isinstance(node, list):
            return [p for item in node for p in walk(item)]
        return []

    config = yaml.safe_load((root / "mkdocs.yml").read_text())
    pages = [("", (root / "README.md").read_text())]
    for page in walk(config["nav"]):
        pages.append((page.removesuffix(".md"), (root / config.get("docs_dir", "docs") / page).read_text()))
    return pages


def parse_blocks(text: str, page: str = "") -> list[Block]:
    """A page's bash and python blocks, in order, named by page and section (see :class:`Block`)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section, seen = "top", {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = _slug(line.lstrip("#"))
        match = _FENCE.match(line)
        if match is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        lang = match["lang"]
        if lang in ("bash", "sh", "shell", "python", "py"):
            seen[section] = seen.get(section, 0) + 1
            name = section if seen[section] == 1 else f"{section}-{seen[section]}"
            name = f"{page}:{name}" if page else name
            skip = _SKIP.search(lines[i - 1]) if i else None
            needs = _NEEDS.search(lines[i - 1]) if i else None
            blocks.append(Block(name=name, lang="python" if lang.startswith("py") else "bash",
                                code="\n".join(lines[i + 1:end]), line=i + 1,
                                skip=skip["why"].strip() if skip else None,
                                needs=tuple(re.split(r"[,\s]+", needs["parts"].strip())) if needs else ()))
        i = end + 1
    return blocks


def config_needs(config: Path) -> tuple[str, ...]:
    """The extras a shipped config needs: those its header's install line names (``pip install
    "seg-datamodule[ultralytics]"``), which is where its reader learns it too."""
    header = []
    for line in config.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return tuple(m["extra"] for m in _CONFIG_NEEDS.finditer("\n".join(header)))


def _commands(code: str) -> list[list[str]]:
    """A bash block's simple commands: continuations joined, comments dropped, ``&&`` split."""
    joined = re.sub(r"\\\n", " ", code)
    commands: list[list[str]] = []
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        current: list[str] = []
        for token in tokens:
            if token == "&&":
                commands.append(current)
                current = []
            else:
                current.append(token)
        if current:
            commands.append(current)
    return commands


def _classify(name: str, argv: list[str]) -> Step:
    prog = Path(argv[0]).name
    if prog.startswith("python") and argv[1:3] == ["-m", "venv"] or prog == "pip" or argv[1:3] == ["-m", "pip"]:
        return Step(name, "install", argv)
    if prog.startswith("python") and argv[1:3] == ["-m", "pytest"]:
        return Step(name, "suite", argv)
    if prog.startswith("python") and argv[1:3] == ["-m", "seg_datamodule"] or prog == "seg-datamodule":
        rest = argv[3:] if prog.startswith("python") else argv[1:]
        config = rest[rest.index("--config") + 1] if "--config" in rest else None
        return Step(name, "cli", argv, subcommand=rest[0] if rest else None, config=config)
    if prog.startswith("python") and len(argv) >= 2 and argv[1].startswith("benchmarks/"):
        return Step(name, "bench", argv)
    if prog == "mkdocs" and argv[1:2] == ["build"]:
        return Step(name, "site", argv)
    raise ValueError(f"README block {name}: no test runs {shlex.join(argv)!r}; teach tests/_readme.py to run it "
                     "or mark the block <!-- readme-test: skip (why) -->")


def _run_key(step: Step) -> tuple:
    """What a step runs, as run: two steps with one key run once."""
    if step.kind == "python":
        return ("python", step.source)
    if step.kind == "bench":  # a benchmark runs with --help alone: its options change nothing
        return ("bench", step.argv[1])
    if step.kind == "cli":  # `python -m seg_datamodule` and `seg-datamodule` run the same
        prog = Path(step.argv[0]).name
        return ("cli", *(step.argv[3:] if prog.startswith("python") else step.argv[1:]))
    return (step.kind, *step.argv)


def steps_from_blocks(blocks: list[Block], root: Path | None = None) -> list[Step]:
    """Every step of the runnable blocks, in page order, each command once.

    Args:
        blocks: the pages' blocks.
        root: the checkout a ``--config configs/...`` is read from, for the parts it needs
            (:func:`config_needs`); ``None`` reads no config.

    Raises:
        ValueError: a command that no runner knows (so a new kind of command on a page cannot go
            untested by accident).
    """
    steps: list[Step] = []
    seen: set[tuple] = set()
    for block in blocks:
        if block.skip is not None:
            continue
        if block.lang == "python":
            candidates = [Step(block.name, "python", source=block.code)]
        else:
            commands = _commands(block.code)
            candidates = []
            for k, argv in enumerate(commands, 1):
                step = _classify(block.name if len(commands) == 1 else f"{block.name}#{k}", argv)
                if step.kind == "bench":  # name a benchmark by its script, not its position
                    step.name = f"{block.name}:{Path(argv[1]).stem}"
                candidates.append(step)
        for step in candidates:
            config = root / step.config if root is not None and step.config else None
            shipped = config is not None and config.parent.name == "configs" and config.is_file()
            extra = config_needs(config) if shipped else ()
            step.needs = tuple(dict.fromkeys((*block.needs, *extra)))
            if _run_key(step) not in seen:
                seen.add(_run_key(step))
                steps.append(step)
    return steps


def substitute_token(token: str, coco: Path, bucket: Path) -> str:
    """A README path token as it is run in a test (see the module docstring)."""
    if token.startswith("/data/lvis/"):  # made beside the COCO root (make_lvis_root)
        return str(coco.parent / "lvis" / token[len("/data/lvis/"):])
    if token.startswith("/data/coco-seg/"):  # made beside the COCO root (_yolo.make_yolo_root)
        return str(coco.parent / "coco-seg" / token[len("/data/coco-seg/"):])
    if token == "/data/coco":
        return str(coco)
    if token.startswith("/data/coco/"):
        return str(coco / token[len("/data/coco/"):])
    if token.startswith("annotations/instances_"):
        return str(coco / token)
    if token in ("train2017", "val2017"):
        return str(coco / token)
    if token.startswith("s3://bucket/"):
        return str(bucket / token[len("s3://bucket/"):])
    return token


def substitute_python(source: str, coco: Path) -> str:
    """A README Python block as it is run in a test: coco-mini's files and :data:`PY_LIMITS`."""
    source = re.sub(r'"instances_(train|val)2017\.json"',
                    lambda m: repr(str(coco / "annotations" / f"instances_{m[1]}2017.json")), source)
    source = re.sub(r'"(train|val)2017"', lambda m: repr(str(coco / f"{m[1]}2017")), source)
    source = re.sub(r'"/data/coco/([^"]*)"', lambda m: repr(str(coco / m[1])), source)
    for pattern, replacement in PY_LIMITS:
        source = re.sub(pattern, replacement, source)
    return source
