"""LightningCLI entry point: ``python -m seg_datamodule fit --config configs/demo.yaml``.

``test`` scores ``data.test_ann`` (``--ckpt_path`` a checkpoint); ``predict --config
configs/predict.yaml --ckpt_path ... --data.predict_images folder/`` writes a COCO results file
through :class:`~seg_datamodule.evaluation.writer.COCOResultsWriter`.

``seg-datamodule convert ANN IMAGES OUTPUT`` writes LitData chunks for ``data.train_stream``
(:mod:`~seg_datamodule.io.stream.cli`; not a LightningCLI subcommand, it trains nothing).

``seg-datamodule loader-bench --config CONFIG [--workers 0,1,2] [--batches N] [--target-img-s R]
[--data.KEY VALUE ...]`` runs only the train loader of the same YAML as ``fit`` at each
``num_workers`` (:mod:`~seg_datamodule.data.loaders.probe`), printing a table and writing a CSV and a PNG
into a new ``runs/loader-bench/version_<N>/``. The DataModule is built by this LightningCLI from
the config (``run=False``), as ``fit`` builds it, but no Trainer is; it runs without the image
cache (which holds a whole small dataset) unless ``--image-cache`` asks for it, and says which.

The DataModule is fixed (:class:`~seg_datamodule.data.datamodule.COCOSegDataModule`); the model is
any ``LightningModule`` chosen by ``class_path``. ``data.num_classes`` (read from the annotation
file of the first split named) is linked into ``model.init_args.num_classes``, so a config never
repeats it; a DataModule whose only split is a folder to predict takes the categories the
``--ckpt_path`` checkpoint was trained on.

A user's mistake is one line and exit code 2 (:mod:`~seg_datamodule.cli_errors`: a parse error
with the closest key, any :class:`~seg_datamodule.errors.UserInputError`, one from a DataLoader
worker included; ``SEG_DATAMODULE_TRACEBACK=1`` for the traceback). A run writes its
``config.yaml`` only into its logger's folder, leaves ``trainer.precision`` unset to the one that
fits the accelerator and prints no Lightning tips (:mod:`~seg_datamodule.cli_defaults`). A fit
resumed from a checkpoint that has nothing left to train (a finished run's ``last.ckpt`` with
the same ``trainer.max_epochs``) says so in one line instead of ending silently.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import ArgsType, LightningCLI

from seg_datamodule.cli_defaults import RunFolderConfig, default_precision, quiet_console
from seg_datamodule.cli_errors import OneLineParser, user_error_message
from seg_datamodule.console import print_summary
from seg_datamodule.data.datamodule import COCOSegDataModule

__all__ = ["SegCLI", "datamodule_from_config", "loader_bench_main", "main"]

#: What ``seg-datamodule --help`` says above LightningCLI's own subcommands: the two it dispatches itself.
_DESCRIPTION = (
    "Train, validate, test or predict with COCOSegDataModule (the LightningCLI subcommands below). "
    "Three more commands: 'seg-datamodule convert ANN IMAGES OUTPUT' writes LitData chunks to stream "
    "(data.train_stream); 'seg-datamodule loader-bench --config CONFIG' runs the train loader alone at "
    "several num_workers; 'seg-datamodule inspect --config CONFIG [--split S]' writes an HTML report of a "
    "split. Each takes --help."
)


class SegCLI(LightningCLI):
    """LightningCLI with the DataModule's class count linked into the model.

    Parse errors are one line (:class:`~seg_datamodule.cli_errors.OneLineParser`), the config is
    saved into the run's own folder only (:class:`~seg_datamodule.cli_defaults.RunFolderConfig`),
    and an unset ``trainer.precision`` fits the accelerator
    (:func:`~seg_datamodule.cli_defaults.default_precision`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", OneLineParser)
        # prog: not __main__.py under python -m
        kwargs.setdefault("parser_kwargs", {"prog": "seg-datamodule", "description": _DESCRIPTION})
        kwargs.setdefault("save_config_callback", RunFolderConfig)
        self._resumed_step: int | None = None
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args: ArgsType) -> None:  # noqa: ANN001 (jsonargparse parser)
        """Parse as LightningCLI does, noting the ``--model...`` options typed on the command line."""
        words = sys.argv[1:] if args is None else args
        self._typed_model_keys = typed_model_keys(words) if isinstance(words, (list, tuple)) else set()
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """The ``--ckpt_path`` checkpoint's hyperparameters build the model, but what is typed wins.

        Lightning >= 2.6 replaces the model's configuration with the checkpoint's hyperparameters,
        the command line included: ``predict --ckpt_path last.ckpt --model.init_args.conf 0.25`` ran
        with the training run's ``conf`` and said nothing (Lightning's open PR 21455). The options
        typed on the command line are put back over them; config files still give way.
        """
        subcommand = self.config.get("subcommand")
        typed = {key: self.config[f"{subcommand}.{key}"] for key in self._typed_model_keys
                 if subcommand and f"{subcommand}.{key}" in self.config}
        super()._parse_ckpt_path()
        for key, value in typed.items():
            self.config[f"{subcommand}.{key}"] = value

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 (jsonargparse parser)
        parser.link_arguments("data", "model.init_args.num_classes", compute_fn=self._num_classes,
                              apply_on="instantiate")

    def _num_classes(self, datamodule: COCOSegDataModule) -> int:
        """The DataModule's class count, checked against the ``--ckpt_path`` checkpoint's categories.

        Before the model is built (a model of the wrong size would fail on the weights first);
        with no split naming categories (a folder to predict), the checkpoint's are taken.
        """
        config = getattr(self, "config", None) or {}
        ckpt_path = (config.get(config.get("subcommand") or "", None) or {}).get("ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            datamodule.restore_categories(checkpoint.get(type(datamodule).__qualname__) or {})
        return datamodule.num_classes

    def before_fit(self) -> None:
        """Note the optimiser step the ``--ckpt_path`` checkpoint was saved at (``after_fit`` compares)."""
        ckpt_path = self.config[self.subcommand].get("ckpt_path") if self.subcommand else None
        if ckpt_path and Path(ckpt_path).is_file():
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            self._resumed_step = checkpoint.get("global_step")

    def after_fit(self) -> None:
        """A resumed fit that took no step: say why (issue 37: it left an empty run folder silently)."""
        if self._resumed_step is None or self.trainer.global_step != self._resumed_step:
            return
        limit = self.trainer.max_epochs
        print_summary(self.trainer, f"seg-datamodule fit: nothing left to train: the checkpoint was saved at step "
                                    f"{self._resumed_step}, already at trainer.max_epochs={limit} (or max_steps); "
                                    f"raise --trainer.max_epochs to train on")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if "trainer" in config and config.get("trainer.precision") is None:
            precision = default_precision(config.get("trainer.accelerator") or "auto")
            if precision is not None:  # saved in config.yaml as what the run used
                config["trainer.precision"] = precision

    def _run_subcommand(self, subcommand: str) -> None:
        with warnings.catch_warnings():
            if subcommand != "fit":  # validate / test / predict restore weights, not the training callbacks
                warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks used")
                # ModelCheckpoint's fit state (best_k_models, ...) from another run's folder: nothing to save here
                warnings.filterwarnings("ignore", message="The dirpath has changed from")
            super()._run_subcommand(subcommand)


def main(args: ArgsType = None) -> SegCLI | None:
    """Run the CLI (also the ``seg-datamodule`` console script).

    A user's mistake (:func:`~seg_datamodule.cli_errors.user_error_message`) is printed as one
    line on stderr and exits with code 2; anything else keeps its traceback.

    Args:
        args: command-line arguments; ``None`` reads ``sys.argv``.
    """
    quiet_console()
    argv = sys.argv[1:] if args is None else args
    words = list(argv) if isinstance(argv, (list, tuple)) else []
    prog = " ".join(["seg-datamodule", *[str(w) for w in words[:1] if not str(w).startswith("-")]])
    try:
        if words[:1] == ["convert"]:
            from seg_datamodule.io.stream.cli import convert_main

            convert_main(words[1:])
            return None
        if words[:1] == ["loader-bench"]:
            loader_bench_main(words[1:])
            return None
        if words[:1] == ["inspect"]:
            from seg_datamodule.pictures.inspect import inspect_main

            inspect_main(words[1:], configured)
            return None
        return SegCLI(LightningModule, COCOSegDataModule, subclass_mode_model=True, args=args)
    except Exception as exc:
        message = user_error_message(prog, exc)
        if message is None:
            raise
        sys.stderr.write(message + "\n")
        raise SystemExit(2) from None


def typed_model_keys(words: Sequence[object]) -> set[str]:
    """The model options in command-line ``words``, as config keys under the subcommand.

    ``--model.init_args.conf 0`` and ``--model.conf=0`` (jsonargparse's short form) give
    ``model.init_args.conf``; ``--model X`` (a class or a file) gives ``model``.
    """
    keys = set()
    for word in words:
        name = str(word).split("=", 1)[0]
        if name == "--model":
            keys.add("model")
        elif name.startswith("--model."):
            parts = name.removeprefix("--").split(".")
            if parts[1] not in ("class_path", "init_args", "dict_kwargs"):
                parts.insert(1, "init_args")
            keys.add(".".join(parts))
    return keys


class _DataOnlyCLI(SegCLI):
    """Parses the config and instantiates its classes as ``fit`` would, but builds no Trainer."""

    def instantiate_trainer(self, **kwargs):  # noqa: ANN003, ANN201 (LightningCLI's signature)
        return None


def datamodule_from_config(cli_args: Sequence[str]) -> COCOSegDataModule:
    """The DataModule that ``fit`` with these arguments would train on, set up for ``"fit"``.

    Args:
        cli_args: LightningCLI arguments without a subcommand, e.g. ``["--config",
            "configs/coco.yaml", "--data.num_workers", "4"]``.

    The config's ``trainer.max_epochs`` reaches the training dataset as the Trainer's would
    (``close_mosaic`` counts back from it).
    """
    datamodule, config = configured(cli_args)
    datamodule.setup("fit")
    max_epochs = config.get("trainer", {}).get("max_epochs")
    if isinstance(max_epochs, int) and max_epochs > 0 and datamodule.train_dataset is not None:
        datamodule.train_dataset.set_max_epochs(max_epochs)
    return datamodule


class _DataModuleOnlyCLI(_DataOnlyCLI):
    """Instantiates the DataModule alone: no model is built (its weights files need not be there) and
    no split is read (the class count the model would get is not asked for)."""

    def instantiate_classes(self) -> None:
        config = self.config.clone()
        config["model"] = None
        self.config_init = self.parser.instantiate_classes(config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = None

    def _num_classes(self, datamodule: COCOSegDataModule) -> int:
        return 1  # never used: no model is built


def configured(cli_args: Sequence[str]) -> tuple[COCOSegDataModule, Any]:
    """The DataModule these LightningCLI arguments configure (not set up) and the parsed config."""
    # LightningCLI warns when it is given args while sys.argv holds others (ours, the subcommand's).
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = _DataModuleOnlyCLI(
            LightningModule, COCOSegDataModule, subclass_mode_model=True, run=False, save_config_callback=None,
            args=list(cli_args),
        )
    finally:
        sys.argv = argv
    return cli.datamodule, cli.config


def _loader_bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seg-datamodule loader-bench", allow_abbrev=False,
        description="Run only the train loader of a fit config at several num_workers; print img/s, ms per batch "
                    "on the training thread, decodes per image and peak worker memory (PSS); write a CSV and a PNG. "
                    "Other arguments (--config, --data.KEY VALUE) are the fit command's.",
    )
    parser.add_argument("--workers", default=None,
                        help="comma-separated num_workers (default: 0, 1 and powers of two up to the cores)")
    parser.add_argument("--batches", type=int, default=20, help="batches timed per worker count (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="batches before the timer (default 2)")
    parser.add_argument("--target-img-s", type=float, default=None,
                        help="say how many workers reach this many images per second")
    parser.add_argument("--out", default="runs/loader-bench",
                        help="each run writes loader_bench.csv and loader_bench.png into a new version_<N> folder "
                             "in this one (default runs/loader-bench)")
    parser.add_argument("--no-memory", action="store_true", help="do not sample PSS after every batch")
    parser.add_argument("--image-cache", action="store_true",
                        help="measure with the config's image cache (data.cache_images: on a dataset of up to 512 "
                             "images the default caches every image, which no dataset of COCO's size can); by "
                             "default the loader runs without one")
    return parser


def _new_run_folder(parent: Path) -> Path:
    """``parent/version_<N>`` with N one past the highest there (CSVLogger's rule), created."""
    taken = [int(p.name[8:]) for p in parent.glob("version_*") if p.name[8:].isdigit()] if parent.is_dir() else []
    folder = parent / f"version_{max(taken, default=-1) + 1}"
    folder.mkdir(parents=True, exist_ok=False)
    return folder


def _worker_counts(text: str | None, cores: int) -> list[int]:
    from seg_datamodule.data.loaders.probe import default_worker_counts

    if text is None:
        return default_worker_counts(cores)
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"seg-datamodule loader-bench: --workers must be comma-separated ints, got {text!r}") from None
    if not counts or min(counts) < 0:
        raise SystemExit(f"seg-datamodule loader-bench: --workers must be ints >= 0, got {text!r}")
    return counts


def _format_rows(rows: Sequence) -> str:
    def mib(value: float) -> str:
        return "-" if not math.isfinite(value) else f"{value:.0f}"

    header = (f"{'workers':>7} {'img/s':>8} {'ms/batch':>9} {'thread cpu ms':>13} {'decodes/img':>11}"
              f" {'PSS/worker MiB':>14} {'PSS workers MiB':>15} {'PSS main MiB':>12}")
    lines = [header, "-" * len(header)]
    for row in rows:
        decodes = "-" if not math.isfinite(row.decodes_per_image) else f"{row.decodes_per_image:.2f}"
        lines.append(
            f"{row.workers:>7} {row.img_s:>8.1f} {row.batch_ms:>9.1f} {row.train_thread_cpu_ms:>13.2f} {decodes:>11}"
            f" {mib(row.worker_pss_peak_mib):>14} {mib(row.workers_pss_peak_mib):>15} {mib(row.main_pss_peak_mib):>12}"
        )
    return "\n".join(lines)


def loader_bench_main(argv: Sequence[str] | None = None) -> list:
    """Run ``seg-datamodule loader-bench``; returns the :class:`~seg_datamodule.data.loaders.probe.ProbeRow` list."""
    from seg_datamodule.data.loaders.probe import plot_probe, probe_loader, workers_for_target, write_csv
    from seg_datamodule.profiling.trainer_internals import available_cores

    args, cli_args = _loader_bench_parser().parse_known_args(argv)
    if not any(a == "--config" or a.startswith("--config=") for a in cli_args):
        raise SystemExit("seg-datamodule loader-bench: give --config, the YAML you pass to fit")
    cores = available_cores()
    counts = _worker_counts(args.workers, cores)
    # A small dataset fits in the image cache and would measure cache hits, not decodes (issue 40).
    asked = args.image_cache or any(a.split("=")[0] == "--data.cache_images" for a in cli_args)
    datamodule = datamodule_from_config(cli_args if asked else [*cli_args, "--data.cache_images", "0"])

    def make_loader(workers: int):  # noqa: ANN202 (a DataLoader of the module's own kind)
        datamodule.loader_options = replace(datamodule.loader_options, num_workers=workers)  # the one setting the probe varies
        if datamodule.train_dataset is not None:  # each count starts as a fresh run: an empty cache
            datamodule.train_dataset.on_worker_start()
        return datamodule.train_dataloader()

    cached = 0 if datamodule.train_dataset is None else datamodule.train_dataset.cache_images
    print(f"train loader alone: batch {datamodule.batch_size}, image_size {datamodule.image_size},"
          f" {args.batches} batches after {args.warmup} warm-up per worker count, {cores} cores", flush=True)
    print(f"image cache: up to {cached} decoded images per worker (data.cache_images), so repeated images are not "
          "decoded again" if cached else "image cache: off, every image decoded as on a dataset too large to cache "
          "(--image-cache measures with the config's data.cache_images)", flush=True)
    rows = probe_loader(make_loader, counts, args.batches, args.warmup, sample_memory=not args.no_memory)
    print(_format_rows(rows))
    if args.target_img_s is not None:
        print(workers_for_target(rows, args.target_img_s, cores)[1])
    out = _new_run_folder(Path(args.out))
    csv_path = write_csv(rows, out / "loader_bench.csv")
    png_path = out / "loader_bench.png"
    plot_probe(rows, args.target_img_s, title=f"train loader: batch {datamodule.batch_size}, "
               f"{datamodule.image_size} px, {cores} cores").savefig(png_path, dpi=100)
    print(f"written: {csv_path}, {png_path}")
    return rows


if __name__ == "__main__":
    main()
