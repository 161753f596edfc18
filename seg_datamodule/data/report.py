"""Where every annotation of a DataModule's run went: per source and reason, and the report.

:class:`RunCounts` is a collaborator of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule`
that works alone too: it reads the counts kept by the indices (:class:`~seg_datamodule.data.splits.sources.SplitSources`),
the datasets' shared counters and the train loader's :class:`~seg_datamodule.data.counts.DeliveredCounts`
(:class:`~seg_datamodule.data.loaders.build.LoaderFactory`), and holds the evaluation batches
the loops consumed (:class:`~seg_datamodule.data.counts.ConsumedCounts`). It also says, at
setup, what each split holds (:mod:`~seg_datamodule.data.splits.scan`), and writes both to the run's
log folder (``data_scan.json``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.console import print_summary
from seg_datamodule.data.counts import ConsumedCounts, format_report
from seg_datamodule.data.samples.dataset import COUNT_KEYS, DECODE_KEYS
from seg_datamodule.data.loaders.build import LoaderFactory
from seg_datamodule.data.loaders.repeat_factors import describe_repeat_factors
from seg_datamodule.data.splits.scan import SplitScan, write_scan_json
from seg_datamodule.data.splits.sources import SplitSources

__all__ = ["RunCounts"]


class RunCounts:
    """``skip_counts`` and the report of one DataModule's sources and loaders.

    Args:
        sources (SplitSources): the indices (what was left out at setup).
        loaders (LoaderFactory): the datasets and the train loader (what the batches kept and dropped).
    """

    def __init__(self, sources: SplitSources, loaders: LoaderFactory) -> None:
        self.sources, self.loaders = sources, loaders

    @property
    def consumed(self) -> ConsumedCounts:
        """The validation and test batches handed out, per split (the last pass of each): the loaders' own."""
        return self.loaders.eval_counts

    def skip_counts(self, world_size: int = 1) -> dict[str, dict[str, int]]:
        """Where every annotation went, by source and reason (see ``COCOSegDataModule.skip_counts``).

        Args:
            world_size: the run's processes (LitData drops a tail per epoch that does not split over them).
        """
        sources, loaders = self.sources, self.loaders
        out: dict[str, dict[str, int]] = {}
        for name, index in (("train_index", sources.train_index), ("val_index", sources.val_index),
                            ("test_index", sources.test_index)):
            if index is not None:
                out[name] = {**index.skip_counts, **index.dropped_counts}
        meta = sources.stream_meta
        if meta is not None:  # skipped at conversion; per epoch, LitData's DDP tail
            from seg_datamodule.io.stream import stream_drop_count

            out["train_index"] = {**meta["skip_counts"], **meta["dropped_counts"],
                                  "image_ddp_tail_per_epoch": stream_drop_count(
                                      meta["num_records"], world_size, loaders.loader_options.batch_size)}
        for name, dataset in (("train", loaders.train_dataset), ("val", loaders.val_dataset),
                              ("test", loaders.test_dataset)):
            if dataset is not None:
                out[name] = {key: 0 for key in COUNT_KEYS} | {
                    k: v for k, v in self.counts_of(name).items() if k in COUNT_KEYS
                }
        return out

    def counts_of(self, name: str) -> dict[str, int]:
        """Training: the batches trained on (exact across a resume); else the last run's consumed batches."""
        if name != "train":
            return self.consumed.counts(name)
        if self.loaders.train_loader is not None:
            return self.loaders.train_loader.delivered_counts
        dataset = self.loaders.train_dataset
        return {} if dataset is None else dataset.counts | dataset.decode_counts

    def report(self, world_size: int = 1) -> str:
        """A human-readable summary of :meth:`skip_counts` and the training decodes per image."""
        loaders = self.loaders
        dataset = loaders.train_dataset
        decodes: dict[str, Any] | None = None
        recipe = "mosaic"
        if dataset is not None:
            counts = self.counts_of("train")
            decodes = {key: counts.get(key, 0) for key in DECODE_KEYS}
            augment, recipe = dataset.augment, dataset.augment.recipe
            partners = f"mosaic_partners={augment.mosaic_partners!r}, " if recipe == "mosaic" and augment.mosaic else ""
            decodes["setting"] = f"recipe={recipe!r}, {partners}cache_images={dataset.cache_images}"
        scans = [scan.line() for scan in self.sources.scans.values()]
        report = "\n".join([*scans, format_report(self.skip_counts(world_size), decodes, recipe)])
        if loaders.repeat_factors is not None and loaders.repeat_factor_threshold is not None:
            drawn = None if loaders.train_loader is None else len(loaders.train_loader.sampler)
            report += "\n" + describe_repeat_factors(loaders.repeat_factors, loaders.repeat_factor_threshold, drawn)
        return report

    def announce(self, scans: list[SplitScan], trainer: Any) -> None:
        """Print the scan line of each split just set up (before any worker starts) and write the scans.

        Args:
            scans: the splits scanned for the first time.
            trainer: the ``Trainer`` or None (the lines are then logged).
        """
        if scans:
            print_summary(trainer, "seg_datamodule: what each split holds\n" + "\n".join(s.line() for s in scans))
            self.write_json(trainer)

    def print_report(self, trainer: Any, when: str = "", world_size: int = 1) -> None:
        """Print :meth:`report` once (the end of fit) and write it, with the scans, to ``data_scan.json``."""
        print_summary(trainer, f"seg_datamodule: where the annotations went (by reason){when}\n{self.report(world_size)}")
        self.write_json(trainer, self.skip_counts(world_size))

    def report_on_exception(self, trainer: Any, exception: BaseException, world_size: int = 1) -> None:
        """:meth:`print_report` when ``fit`` stops on Ctrl-C or an exception after some steps; never raises."""
        if trainer is None or trainer.state.fn != "fit" or trainer.global_step == 0:
            return  # nothing trained: the exception's own line says what happened
        try:
            self.print_report(trainer, f", until {type(exception).__name__} stopped fit", world_size)
        except Exception as error:  # never hide the exception being handled
            rank_zero_info(f"seg_datamodule: no report of where the annotations went: {error!r}")

    def write_json(self, trainer: Any, delivered: dict[str, dict[str, int]] | None = None) -> None:
        """``data_scan.json`` in the run's log folder, on rank 0, when the Trainer has a logger."""
        if trainer is None or not getattr(trainer, "loggers", None):
            return
        folder = trainer.log_dir  # a collective under DDP: every rank sets up and tears down
        if trainer.is_global_zero and folder is not None:
            write_scan_json(folder, self.sources.scans, delivered)
