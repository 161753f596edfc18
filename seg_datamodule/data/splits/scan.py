"""What each split holds, said at setup: one scan line per split, and no split that has nothing to learn or score.

Ultralytics prints "79 images, 1 backgrounds, 0 corrupt" before it trains; a counter read at the
end of a run is not a warning. So at setup, before any worker starts, every split a stage reads
gets a :class:`SplitScan` (:func:`scan_index`): images, backgrounds, images without a label
file or with box-only labels, bad images found so far, instances, crowd regions and their share,
and what the index left out by reason. :func:`check_scan` then stops a split that cannot do its
job (issue 49):

* training on no target instance (every annotation a crowd region, every box dropped, every
  label file missing, nothing in the file) is a :class:`NothingToLearnError`;
* a validation or test ground truth with no instance to score (COCO AP would print -1, or not
  be computed at all) is a :class:`NothingToScoreError`; a test file without annotations at all
  (COCO test-dev's image info) is not scored, by design, and passes;
* an Ultralytics split where no image has a label file is a :class:`LabelsNotFoundError` naming
  where labels were looked for and the nearest folder there is (``Labels/`` beside ``labels/``);
  for a validation or test split it first says the split has nothing to score (a ``test:`` split
  may be COCO's test-dev, without labels) and names the key that scores another split.

``allow_no_targets=True`` (the DataModule's key) lets a split of negatives on purpose through;
the scan line still says so. The scans are printed once per split, kept in the end-of-fit report,
and written to ``data_scan.json`` in the run's log folder (:func:`write_scan_json`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from seg_datamodule.data.splits.checks import EmptySplitError
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.yolo.labels_hint import labels_not_found_hint

__all__ = ["LabelsNotFoundError", "NothingToScoreError", "NothingToLearnError", "SCAN_FILE", "SplitScan",
           "check_scan", "scan_index", "write_scan_json"]

#: The scans' file in the run's log folder.
SCAN_FILE = "data_scan.json"
#: The held-out splits: the stage that scores each, and how to score another split instead.
_HELD_OUT = {"val": ("validate", "--data.val_split SPLIT, one with labels (or null: fit without validation)"),
             "test": ("test", "--data.test_split val")}
#: The key that lets a split without a target instance through.
_ALLOW = "allow_no_targets: true (--data.allow_no_targets true)"


class NothingToLearnError(EmptySplitError):
    """A training split without a single target instance: it would train every object as background."""


class NothingToScoreError(EmptySplitError):
    """A validation or test ground truth without an instance COCO AP can score (it would print -1)."""


class LabelsNotFoundError(EmptySplitError):
    """An Ultralytics split where no image has a label file (a misnamed ``labels`` folder)."""


@dataclass(frozen=True)
class SplitScan:
    """What one split's index holds, counted at setup.

    Attributes:
        split (str): ``"train"``, ``"val"`` or ``"test"``.
        source (str): the COCO JSON, or ``"<data.yaml> [<split>]"``.
        images (int): images indexed.
        backgrounds (int): images without a target instance or crowd region (negatives).
        labels_missing (int): of those, images without a label file (Ultralytics' backgrounds).
        box_only_images (int): images whose source had an annotation with a box and no mask
            (before ``box_only`` was applied).
        bad_images (int): images found corrupt or missing so far and left out (``verify_images``,
            or an Ultralytics split's headers; the rest are counted as the workers meet them).
        instances (int): target instances (a box-only one kept by ``box_only: keep`` included).
        converted (int): of those, crowd regions turned into instances (``crowd_as_instances``).
        crowd (int): crowd regions kept as ignore regions.
        crowd_dropped (int): crowd regions left out (``drop_crowd``).
        left_out (dict[str, int]): what the index left out, by reason (``image_*`` reasons count
            images, the others annotations).
    """

    split: str
    source: str
    images: int
    backgrounds: int
    labels_missing: int
    box_only_images: int
    bad_images: int
    instances: int
    converted: int
    crowd: int
    crowd_dropped: int
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def crowd_share(self) -> float:
        """The share of the source's target and crowd annotations that are crowd regions (converted included)."""
        crowd = self.crowd + self.crowd_dropped + self.converted
        total = self.instances + self.crowd + self.crowd_dropped
        return crowd / total if total else 0.0

    def line(self) -> str:
        """One line: ``train /data/coco.json: 80 images (1 background, ...), 731 instances, ...``."""
        images = [f"{self.backgrounds} background{'s' * (self.backgrounds != 1)}"]
        if self.labels_missing:
            images.append(f"{self.labels_missing} without a label file")
        images += [f"{self.box_only_images} with box-only labels", f"{self.bad_images} corrupt or missing"]
        use = "trained" if self.split == "train" else "scored"
        converted = (f" ({self.converted} of them crowd regions {use} as instances: crowd_as_instances)"
                     if self.converted else "")
        crowd = f"{self.crowd} crowd regions" + (f", {self.crowd_dropped} dropped" if self.crowd_dropped else "")
        left = ", ".join(f"{k} {v}" for k, v in sorted(self.left_out.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{self.split} {self.source}: {self.images} images ({', '.join(images)}), {self.instances} instances"
                f"{converted}, {crowd} ({self.crowd_share:.0%} of annotations crowd); "
                + (f"left out: {left}" if left else "nothing left out"))

    def as_dict(self) -> dict[str, Any]:
        """The fields, the crowd share and the line, for JSON."""
        return {**asdict(self), "crowd_share": self.crowd_share, "line": self.line()}


def scan_index(split: str, source: str, index: CocoIndex) -> SplitScan:
    """The :class:`SplitScan` of a split's index (counts only; nothing is read from disk).

    Args:
        split: the split's name.
        source: what names it, for the line.
        index: its index, with the build's options applied.
    """
    per_image = index.instance_counts + index.crowd_counts
    left_out = {k: int(v) for k, v in {**index.skip_counts, **index.dropped_counts}.items()
                if v and k != "crowd_as_instances"}
    crowd_dropped = left_out.pop("crowd_dropped", 0)
    return SplitScan(
        split=split, source=source, images=len(index), backgrounds=int((per_image == 0).sum()),
        labels_missing=int(index.source_counts.get("image_label_missing", 0)),
        box_only_images=int(index.source_counts.get("image_box_only", 0)),
        bad_images=sum(v for k, v in index.skip_counts.items() if k.startswith("image_")),
        instances=index.num_instances, converted=int(index.dropped_counts.get("crowd_as_instances", 0)),
        crowd=index.num_crowd, crowd_dropped=crowd_dropped, left_out=left_out)


def check_scan(scan: SplitScan, index: CocoIndex, allow_no_targets: bool = False) -> None:
    """Stop a split with nothing to learn or score (see the module docstring), unless allowed.

    Args:
        scan: the split's scan.
        index: its index (for the paths a message names).
        allow_no_targets: let a split without a target instance through.

    Raises:
        LabelsNotFoundError: an Ultralytics split where no image has a label file.
        NothingToLearnError: a training split without a target instance.
        NothingToScoreError: a validation split, or an annotated test split, without one.
    """
    if scan.instances or allow_no_targets or not scan.images:
        return
    if scan.labels_missing == scan.images and scan.split in _HELD_OUT:
        stage, other = _HELD_OUT[scan.split]
        raise LabelsNotFoundError(
            f"{scan.source}: none of its {scan.images} images has a label file, so `{stage}` has nothing to score "
            f"(a split without labels, as COCO's test-dev); score a split with labels: {other}. "
            f"If this one has labels: {labels_not_found_hint(str(index.file_path(0)))}")
    if scan.labels_missing == scan.images:
        raise LabelsNotFoundError(
            f"{scan.source}: none of its {scan.images} images has a label file, so it would "
            f"{'train on' if scan.split == 'train' else 'score'} nothing; {labels_not_found_hint(str(index.file_path(0)))}. "
            f"A split of negatives on purpose: {_ALLOW}")
    why = _why_empty(scan)
    if scan.split == "train":
        raise NothingToLearnError(f"{scan.source}: no target instance to train on: {why}; every object would be "
                                  f"learned as background. Negatives only on purpose: {_ALLOW}")
    annotated = scan.crowd or scan.crowd_dropped or any(not k.startswith("image_") for k in scan.left_out)
    if scan.split == "test" and not annotated:
        return  # an image-info file (COCO test-dev): not scored, by design
    raise NothingToScoreError(f"{scan.source}: no instance for COCO AP to score ({scan.split}): {why}; "
                             f"its AP would be -1 or not computed. On purpose: {_ALLOW}")


def _why_empty(scan: SplitScan) -> str:
    """Why a split has no target instance, with the key that changes it."""
    total = scan.crowd + scan.crowd_dropped
    if total:
        return (f"all {total} of its annotations are crowd regions (iscrowd=1), which are ignore regions, not "
                "targets; an export that marks every mask a crowd (CVAT's COCO export) needs crowd_as_instances: true "
                "(--data.crowd_as_instances true)")
    boxes = scan.left_out.get("box_only", 0)
    if boxes:
        return (f"all {boxes} of its annotations are boxes without a mask, left out (box_only); box_only: keep trains "
                "their boxes (box loss, no mask loss)")
    lost = {k: v for k, v in scan.left_out.items() if not k.startswith("image_")}
    if lost:
        return "every annotation was left out (" + ", ".join(f"{k} {v}" for k, v in sorted(lost.items())) + ")"
    if scan.labels_missing:
        return f"{scan.labels_missing} of its {scan.images} images have no label file and the others empty ones"
    return "it has no annotation"


def write_scan_json(folder: str | Path, scans: Mapping[str, SplitScan],
                    delivered: Mapping[str, Mapping[str, int]] | None = None) -> Path:
    """Write the scans (and, at the end of fit, where the annotations went) to ``folder/data_scan.json``.

    Args:
        folder: the run's log folder (created if needed).
        scans: split -> its scan.
        delivered: the DataModule's ``skip_counts`` (source -> reason -> count), or None.

    Returns:
        the file written.
    """
    path = Path(folder) / SCAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"splits": {name: scan.as_dict() for name, scan in scans.items()}}
    if delivered is not None:
        data["where_the_annotations_went"] = {k: dict(v) for k, v in delivered.items()}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
