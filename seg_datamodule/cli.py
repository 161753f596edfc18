"""LightningCLI entry point: ``python -m seg_datamodule fit --config configs/demo.yaml``.

``test`` scores ``data.test_ann`` (``--ckpt_path`` a checkpoint); ``predict --config
configs/predict.yaml --ckpt_path ... --data.predict_images folder/`` writes a COCO results file
through :class:`~seg_datamodule.evaluation.writer.COCOResultsWriter`.

``seg-datamodule convert ANN IMAGES OUTPUT`` writes LitData chunks for ``data.train_stream``
(:mod:`~seg_datamodule.io.stream.cli`; not a LightningCLI subcommand, it trains nothing).

The DataModule is fixed (:class:`~seg_datamodule.data.datamodule.COCOSegDataModule`); the model is
any ``LightningModule`` chosen by ``class_path``. ``data.num_classes`` (read from the annotation
file) is linked into ``model.init_args.num_classes``, so a config never repeats it.
"""

from __future__ import annotations

import sys

from lightning.pytorch import LightningModule
from lightning.pytorch.cli import ArgsType, LightningCLI

from seg_datamodule.data.datamodule import COCOSegDataModule

__all__ = ["SegCLI", "main"]


class SegCLI(LightningCLI):
    """LightningCLI with the DataModule's class count linked into the model."""

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 (jsonargparse parser)
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")


def main(args: ArgsType = None) -> SegCLI | None:
    """Run the CLI (also the ``seg-datamodule`` console script).

    Args:
        args: command-line arguments; ``None`` reads ``sys.argv``.
    """
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, (list, tuple)) and argv[:1] == ["convert"]:
        from seg_datamodule.io.stream.cli import convert_main

        convert_main(list(argv[1:]))
        return None
    return SegCLI(
        LightningModule,
        COCOSegDataModule,
        subclass_mode_model=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
