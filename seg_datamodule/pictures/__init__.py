"""Pictures of a run, in its log folder and its logger (issue 51).

:class:`FitPictures` draws the data at fit start (label pictures per split, the first training
batches); :class:`ValPictures` draws validation batches beside their predictions and, at the end
of fit, the results plot, PR curves and a confusion matrix. The DataModule's ``plots`` key adds
both (:func:`attach_run_pictures`). :mod:`~seg_datamodule.pictures.labels` and
:mod:`~seg_datamodule.pictures.results` hold the pure counting and drawing.
"""

from seg_datamodule.pictures.callback import FitPictures, attach_run_pictures
from seg_datamodule.pictures.labels import COCO_SIZES, LabelStats, figure_rgb, label_figure, label_stats
from seg_datamodule.pictures.results import confusion_figure, confusion_matrix, pr_figure, results_figure
from seg_datamodule.pictures.validation import ValPictures, canvas_predictions

__all__ = [
    "COCO_SIZES", "FitPictures", "LabelStats", "ValPictures", "attach_run_pictures", "canvas_predictions",
    "confusion_figure", "confusion_matrix", "figure_rgb", "label_figure", "label_stats", "pr_figure", "results_figure",
]
