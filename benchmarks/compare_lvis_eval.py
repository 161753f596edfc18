"""Could faster-coco-eval's LVIS mode replace this project's LVIS evaluation? Measured, not assumed (issue 52).

On the LVIS API's own 100-image fixture (``tests/fixtures/lvis/lvis_val_100.json``), the
imperfect detections of ``tests/evaluation/test_lvis_metric.py`` (shifted ground truth, wrong
labels, boxes of unverified, negative and not-exhaustive categories, 60 images) are scored three
ways for ``bbox`` and ``segm``: the official ``lvis`` package (``LVISEval``, the reference),
``LVISMaskMAP`` (this project's port), and faster-coco-eval's ``COCOeval_faster(lvis_style=True)``
(its LVIS mode, ``maxDets`` 300). Prints the 13 LVIS numbers of each and the largest difference
from the official one; an evaluator that fails prints its error.

Run: ``python benchmarks/compare_lvis_eval.py`` (needs the ``lvis`` package and faster-coco-eval:
``pip install --no-deps lvis==0.5.3``, as ``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "evaluation")]

from _lvis import LVIS_VAL_100, load_json  # noqa: E402
from test_lvis_metric import _OFFICIAL_NAMES, _full_res_batch, _imperfect  # noqa: E402

from seg_datamodule.evaluation import LVISMaskMAP, deduplicate  # noqa: E402
from seg_datamodule.evaluation.lvis_eval import LVIS_STAT_NAMES  # noqa: E402

#: faster-coco-eval's ``stats_as_dict`` names of the LVIS numbers (its AR is at maxDets 300).
_FCE_NAMES = ("AP_all", "AP_50", "AP_75", "AP_small", "AP_medium", "AP_large", "APr", "APc", "APf", "AR_all",
              "AR_small", "AR_medium", "AR_large")


def _results(dets, sizes, iou_type: str) -> list[dict]:
    det_image = np.repeat(dets.image_ids.numpy(), dets.dets_per_image.numpy())
    rles = dets.rles(sizes)
    out = []
    for k, image_id in enumerate(det_image.tolist()):
        r = {"image_id": image_id, "category_id": int(dets.category_ids[k]), "score": float(dets.scores[k])}
        if iou_type == "segm":
            r["segmentation"] = {"size": rles[k]["size"], "counts": rles[k]["counts"].decode()}
        else:
            r["bbox"] = dets.boxes[k].double().tolist()
        out.append(r)
    return out


def _official(results: list[dict], images: list[int], iou_type: str) -> dict[str, float]:
    import lvis

    np.float = float  # lvis 0.5.3 still calls np.float
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        gt = lvis.LVIS(str(LVIS_VAL_100))
        evaluator = lvis.LVISEval(gt, lvis.LVISResults(gt, [dict(r) for r in results]), iou_type)
        evaluator.params.img_ids = images
        evaluator.run()
    return {n: float(evaluator.get_results()[o]) for n, o in zip(LVIS_STAT_NAMES, _OFFICIAL_NAMES)}


def _faster(results: list[dict], images: list[int], iou_type: str) -> dict[str, float]:
    from faster_coco_eval import COCO, COCOeval_faster

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(LVIS_VAL_100))
        evaluator = COCOeval_faster(gt, gt.loadRes([dict(r) for r in results]), iou_type, lvis_style=True)
        evaluator.params.imgIds = images
        evaluator.params.maxDets = [300]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats_as_dict
    return {n: float(stats[f]) for n, f in zip(LVIS_STAT_NAMES, _FCE_NAMES)}


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    import faster_coco_eval

    print(f"faster-coco-eval {faster_coco_eval.__version__}, numpy {np.__version__}")
    data = load_json()
    metric = LVISMaskMAP(LVIS_VAL_100)
    generator = torch.Generator().manual_seed(0)
    for image in data["images"][:60]:
        metric.update([_imperfect(data, image, generator)], _full_res_batch(image))
    ours = {k: float(v) for k, v in metric.compute().items()}
    dets = deduplicate(metric.detections())
    images = sorted(set(dets.image_ids.tolist()))
    for iou_type in ("bbox", "segm"):
        results = _results(dets, metric.coco.sizes, iou_type)
        official = _official(results, images, iou_type)
        rows = {"LVISMaskMAP (this project)": {n: ours[f"{iou_type}_{n}"] for n in LVIS_STAT_NAMES}}
        try:
            rows["faster-coco-eval lvis_style"] = _faster(results, images, iou_type)
        except Exception as error:  # measured: say what failed
            print(f"{iou_type}: faster-coco-eval lvis_style failed: {type(error).__name__}: {error}")
        for name, row in rows.items():
            worst = max(abs(row[n] - official[n]) for n in LVIS_STAT_NAMES)
            print(f"{iou_type}: {name}: largest difference from the official LVISEval {worst:.2e} "
                  f"(AP {row['AP']:.6f}, official {official['AP']:.6f})")


if __name__ == "__main__":
    main()
