"""Where every annotation of a ``COCOSegDataModule`` went: per source and reason, and the report.

A mixin of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule`; the counts themselves are
kept by the indices, the datasets' shared counters and the train loader's
:class:`~seg_datamodule.data.resume.DeliveredCounts`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.console import print_summary
from seg_datamodule.data.accounting import ConsumedCounts, format_report
from seg_datamodule.data.dataset import COUNT_KEYS, DECODE_KEYS, SegDataset
from seg_datamodule.data.repeat_factors import describe_repeat_factors
from seg_datamodule.io.coco import CocoIndex

__all__ = ["CountsHooks"]


class CountsHooks:
    """``skip_counts``, ``report`` and the report at the end of ``fit``."""

    batch_size: int
    stream_meta: dict[str, Any] | None
    repeat_factors: np.ndarray | None
    repeat_factor_threshold: float | None
    train_index: CocoIndex | None
    val_index: CocoIndex | None
    test_index: CocoIndex | None
    train_dataset: SegDataset | None
    val_dataset: SegDataset | None
    test_dataset: SegDataset | None
    consumed: ConsumedCounts
    _train_loader: Any

    @property
    def skip_counts(self) -> dict[str, dict[str, int]]:
        """Where every annotation went, by source and reason.

        ``train_index`` / ``val_index``: annotations and images left out of the index at setup
        (``on_bad_sample="skip"``, ``drop_crowd``, ``drop_empty``). ``train`` / ``val``: per
        annotation of every tile drawn, ``kept`` (in the sample) or the reason it was dropped
        (outside the canvas, clipped below ``min_area_ratio``, a tiny box, a bad image).
        Each batch carries its counts, and only the batches a loop took are counted (not those
        the workers built ahead), for any ``num_workers``: ``train`` over the run (a resumed run
        continues the count saved in the checkpoint), ``val`` and ``test`` over the last
        validation or test run (the sanity check is a run of its own). Under DDP each rank counts
        its own shard.
        """
        out: dict[str, dict[str, int]] = {}
        for name, index in (("train_index", self.train_index), ("val_index", self.val_index),
                            ("test_index", self.test_index)):
            if index is not None:
                out[name] = {**index.skip_counts, **index.dropped_counts}
        if self.stream_meta is not None:  # skipped at conversion; per epoch, LitData's DDP tail
            from seg_datamodule.io.stream import stream_drop_count

            out["train_index"] = {**self.stream_meta["skip_counts"], **self.stream_meta["dropped_counts"],
                                  "image_ddp_tail_per_epoch": stream_drop_count(
                                      self.stream_meta["num_records"], self._world()[0], self.batch_size)}
        for name, dataset in (("train", self.train_dataset), ("val", self.val_dataset), ("test", self.test_dataset)):
            if dataset is not None:
                out[name] = {key: 0 for key in COUNT_KEYS} | {
                    k: v for k, v in self._counts_of(name, dataset).items() if k in COUNT_KEYS
                }
        return out

    def _counts_of(self, name: str, dataset: SegDataset) -> dict[str, int]:
        """Training: the batches trained on (exact across a resume); else the last run's consumed batches."""
        if name != "train":
            return self.consumed.counts(name)
        if self._train_loader is not None:
            return self._train_loader.delivered_counts
        return dataset.counts | dataset.decode_counts

    def report(self) -> str:
        """A human-readable summary of :attr:`skip_counts` and the training decodes per image."""
        dataset = self.train_dataset
        decodes, recipe = None, "mosaic"
        if dataset is not None:
            counts = self._counts_of("train", dataset)
            decodes = {key: counts.get(key, 0) for key in DECODE_KEYS}
            augment, recipe = dataset.augment, dataset.augment.recipe
            partners = f"mosaic_partners={augment.mosaic_partners!r}, " if recipe == "mosaic" and augment.mosaic else ""
            decodes["setting"] = f"recipe={recipe!r}, {partners}cache_images={dataset.cache_images}"
        report = format_report(self.skip_counts, decodes, recipe)
        if self.repeat_factors is not None and self.repeat_factor_threshold is not None:
            drawn = None if self._train_loader is None else len(self._train_loader.sampler)
            report += "\n" + describe_repeat_factors(self.repeat_factors, self.repeat_factor_threshold, drawn)
        return report

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self._print_report("")

    def on_exception(self, exception: BaseException) -> None:
        """The end-of-fit report, also when ``fit`` stops on Ctrl-C or an exception (so far)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.state.fn != "fit" or trainer.global_step == 0:
            return  # nothing trained: the exception's own line says what happened
        try:
            self._print_report(f", until {type(exception).__name__} stopped fit")
        except Exception as error:  # never hide the exception being handled
            rank_zero_info(f"seg_datamodule: no report of where the annotations went: {error!r}")

    def _print_report(self, when: str) -> None:
        print_summary(getattr(self, "trainer", None),
                      f"seg_datamodule: where the annotations went (by reason){when}\n{self.report()}")
