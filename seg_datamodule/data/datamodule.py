"""``COCOSegDataModule``: the LightningDataModule a config's ``data:`` section builds.

What this module holds: the YAML surface (one keyword argument per key, checked and turned into
option objects by :mod:`~seg_datamodule.data.config.keys`), and Lightning's hooks, each a thin
adapter to one of three collaborators, each usable alone:
:class:`~seg_datamodule.data.splits.sources.SplitSources` (which splits, their indices, the categories;
each stage builds only the splits it reads), :class:`~seg_datamodule.data.loaders.build.LoaderFactory`
(datasets, samplers, DataLoaders, the train loader's resumable state) and
:class:`~seg_datamodule.data.report.RunCounts` (where every annotation went, the report).
With no split named it trains on the embedded demo dataset, through
:attr:`COCOSegDataModule.fallback_splits`, which the package sets on import (``data/`` does not
import the demo). The data path itself (index, recipe, collate, batch) is described once, in the
docs' package layout page; determinism and resume in the docs' determinism page.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ClassVar, Literal

import albumentations as A
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from seg_datamodule.data.config.keys import DataModuleOptions, Forward, PathKey
from seg_datamodule.data.loaders.build import AUTO_CACHE_MAX_IMAGES, LoaderContext, LoaderFactory
from seg_datamodule.data.report import RunCounts
from seg_datamodule.data.splits.sources import STAGE_SPLITS, Fallback, SplitSources
from seg_datamodule.transforms import Step
from seg_datamodule.transforms.pixel.hsv import apply_pending_hsv
from seg_datamodule.data.batching.device_pixels import apply_pending_pixels

__all__ = ["AUTO_CACHE_MAX_IMAGES", "COCOSegDataModule"]

log = logging.getLogger(__name__)


class COCOSegDataModule(LightningDataModule):
    """Instance-segmentation batches from COCO-format data, masks rasterised in the workers.

    Every file and folder given is checked here: a missing one (or a folder where a file belongs)
    raises :class:`~seg_datamodule.io.paths.InputPathError` naming the argument.

    Args:
        train_ann: COCO instances JSON for training; when no split at all is named (no
            ``train_ann``, ``train_stream``, ``val_ann``, ``test_ann`` or ``predict_images``), the
            embedded demo dataset's training and validation splits.
        train_images: folder of the training images (``file_name`` is relative to it).
        val_ann: COCO instances JSON for validation (optional).
        val_images: folder of the validation images.
        test_ann: COCO JSON of a held-out split for ``trainer.test``: an instances file, or an
            image-info file without ``annotations`` (COCO test-dev); letterboxed without
            augmentation like validation, negatives kept. Its category ids must be the
            DataModule's (those of the first split named, or of the checkpoint restored).
        test_images: folder of the test images.
        predict_images: what ``trainer.predict`` reads: a folder walked recursively for every
            file OpenCV decodes (ids derived from the relative paths, see
            :func:`~seg_datamodule.io.predict_source.stable_image_id`), or, with ``predict_ann``,
            the folder that JSON's ``file_name`` values are in. Batches carry ``scales``,
            ``pads``, ``orig_sizes`` and ``image_ids`` and no targets; a bad image is skipped
            and counted in the batch's ``counts``, or raises, by ``on_bad_sample``.
        predict_ann: a COCO image-info or instances JSON listing the images to predict (ids and
            sizes from it; annotations are not read).
        dataset: an Ultralytics ``data.yaml`` instead of the COCO files, read as Ultralytics reads it
            (EXIF orientation applied, nothing in it run; :mod:`seg_datamodule.io.yolo`).
        train_split: the data.yaml split that trains (``null``: none).
        val_split: the one that validates, COCO AP on a ground truth of its labels (``null``: none).
        test_split: the one ``trainer.test`` scores (``null``: none).
        image_size: output canvas side ``s`` (square ``s x s``).
        mask_stride: stride of the mask grid (4 for YOLACT's ProtoNet).
        mask_fill: ``centre``, the exact cell-centre test, or ``ultralytics`` (:mod:`~seg_datamodule.ops.pixel_fill`).
        batch_size: training images per batch (per rank).
        val_batch_size: validation, test and predict images per batch; ``None`` uses ``batch_size``.
        num_workers: DataLoader worker processes (masks are rasterised there); ``"auto"``
            (default): the cores this process may run on, shared by the ranks of its node, less
            one for training, at most 8 (:func:`~seg_datamodule.data.config.options.auto_num_workers`).
        mosaic: probability of a 4-image mosaic per training sample.
        close_mosaic: turn mosaic off for the last N epochs (needs ``trainer.max_epochs``).
        degrees: random rotation range in degrees.
        translate: random translation as a fraction of ``image_size``.
        scale: random scale range ``(low, high)``.
        shear: random shear range in degrees.
        flip_lr: probability of a horizontal flip (pixels and polygons together).
        min_area_ratio: drop an instance keeping under this fraction of its area when clipped (``clipped``).
        min_box_size: drop an instance whose clipped box is under this many pixels a side (``small_box``).
        transforms: per-sample albumentations pipeline for training (YAML ``class_path`` /
            ``init_args`` of an ``albumentations.Compose``), or a path that ``A.load`` reads.
        hsv: YOLO's HSV gain jitter for training, ``(hgain, sgain, vgain)`` (Ultralytics'
            ``hsv_h, hsv_s, hsv_v``: ``(0.015, 0.7, 0.4)``), applied after ``transforms``; ``None``
            (default) leaves colours alone. This key is the one way to set the jitter: a
            pipeline naming the albumentations ``RandomHSV`` this package once shipped is refused.
        hsv_on_device: the workers only draw each sample's gains (from its own generator, so the
            batches are the same) and ship them in ``DetectionBatch.hsv_gains``;
            :meth:`on_after_batch_transfer` jitters the batch on its device, in place. False
            (default) jitters in the workers. True with ``hsv`` None is refused (nothing to move).
        pixels_on_device: training workers ship JPEG bytes and plans; :meth:`on_after_batch_transfer`
            decodes (batched ``decode_jpeg``), warps, flips and jitters them on the device. Targets
            and counts are unchanged; the guide (docs/guides/device-pixels.md) says how the pixels
            compare. Refused beside ``transforms``, copy-paste, MixUp or 90-degree turns.
        on_bad_sample: ``"raise"`` (default) fails with a message naming the file and ids;
            ``"skip"`` leaves bad annotations or images out and counts them by reason.
        drop_crowd: leave crowd regions out (otherwise they become ``ignore_masks``).
        crowd_as_instances: train on crowd (``iscrowd=1``) regions as instances, converted to exact
            polygons like non-crowd RLE and counted (``skip_counts``: ``crowd_as_instances``), for
            exports that mark every mask a crowd (CVAT's COCO export). Without it, setup warns
            (once per file) when most of a file's annotations are crowd regions.
        box_only: a box without a mask. ``"raise"`` (default): stop at setup naming the files,
            so no object is trained as background by surprise; ``"drop_images"``: leave those
            images out; ``"drop"``: drop the boxes alone (their images train without them);
            ``"keep"``: box targets without a mask (``DetectionBatch.has_mask``). Counted either way.
        allow_no_targets: let a split without a single target instance through setup (negatives
            only on purpose); otherwise setup stops it (nothing to learn, nothing to score, no
            label file found) naming why and the key that fixes it (:mod:`~seg_datamodule.data.splits.scan`).
        plots: at fit start, write the label pictures of each split and the first three training
            batches drawn into the run folder (and a logger that takes images):
            :class:`~seg_datamodule.pictures.FitPictures`; with a model scored by a COCO metric also
            validation batches beside their predictions, results, PR curves and a confusion matrix
            (:class:`~seg_datamodule.pictures.ValPictures`).
        drop_empty: leave out images without target instances (kept as negatives by default).
        verify_images: decode every image at setup and check its size.
        cache_dir: where the annotation index cache lives (default: the user cache dir).
        use_cache: read and write the index cache; False builds in memory every time (an
            unwritable cache location falls back to that by itself, with one warning).
        index_check: what a start checks before a cached Ultralytics index serves: ``"files"``
            (default: every label file) or ``"folders"`` (the folders alone; misses a label file
            rewritten in place; see ``IndexOptions.index_check``).
        cache_images: decoded images kept per worker (LRU); 0 keeps none. ``None`` (default)
            caches a dataset of at most ``AUTO_CACHE_MAX_IMAGES`` images whole and nothing of a
            larger one (a cache far smaller than the dataset is rarely hit; ~1 MB per image).
        recipe: ``"mosaic"`` (default): mosaic + random affine + flip; ``"lsj"``: large-scale jitter of one image
            (``lsj_scale`` of ``image_size``, crop, pad, flip; the mosaic and affine keys do not apply); or a list
            of steps, a Layout first, at most one group step (``SampleMixing``) last (``class_path`` / ``init_args``;
            ``transforms``, ``hsv``, ``hsv_on_device`` and a geometry key changed from its default are then
            refused: they go in the steps' ``init_args``). See :mod:`~seg_datamodule.transforms.layouts.lsj`,
            :mod:`~seg_datamodule.transforms.recipe`.
        lsj_scale: LSJ's scale range ``(low, high)`` as factors of ``image_size``.
        copy_paste: probability per training sample of pasting a random subset of another
            canvas's instances (pixels exactly where their polygons cover pixel centres); the
            instances below keep exactly what stays visible (dropped as ``occluded`` under
            ``min_area_ratio``). See :mod:`~seg_datamodule.transforms.group.copy_paste`.
        copy_paste_mode: ``"flip"`` (default): from the sample's own mirror image; ``"batch"``:
            from another sample of the batch (already decoded: no extra decode).
        mixup: probability per training sample of MixUp with another sample of the batch
            (``r ~ Beta(32, 32)``, both sets of instances kept).
        mosaic_partners: ``"uniform"`` (map-style default): from the whole dataset (trains best,
            four decodes per mosaic); ``"batch"`` (a stream's default): other images of the batch,
            one decode each, opt-in (slower to learn early, ``docs/benchmarks/train-parity.md``).
        on_resume_mismatch: a checkpoint whose train-loader state was saved for another dataset,
            batch size, world size or seed: ``"raise"`` (default) refuses it with a message
            naming the difference; ``"restart"`` warns and starts that epoch from its first batch.
        pin_memory: page-lock batches for faster host-to-device copies.
        persistent_workers: keep workers alive between epochs (when ``num_workers > 0``).
        prefetch_factor: batches each worker prepares ahead (when ``num_workers > 0``).
        seed: base seed of shuffling and augmentation (the same on every rank).
        demo_dir: where the demo dataset is generated (default: the user cache dir).
        train_stream: train from LitData chunks written by ``seg-datamodule convert``
            (``"s3://bucket/coco-train"``, ``"local:/path"``, or a plain folder read in place)
            instead of ``train_ann`` / ``train_images``; validation stays map-style. Batches are
            built as in the map-style path in one global order (:mod:`~seg_datamodule.io.stream.order`):
            the same global batches for any world size and ``num_workers``, resumable on a world size
            keeping ``batch_size x world_size``; a partial last global batch under DDP is counted in
            :attr:`skip_counts`. Workers are not persistent. Needs ``seg-datamodule[stream]``.
            Nothing in the chunk set is executed: its metadata and ``index.json`` must be exactly
            what this version writes (:func:`~seg_datamodule.io.stream.source.check_stream_source`),
            or setup raises ``StreamFormatError`` naming the file and the field.
        stream_cache_dir: LitData's local chunk cache (default: LitData's).
        stream_max_cache_size: LitData's cache budget, e.g. ``"50GB"`` (default: LitData's).
        stream_storage_options: boto3 client arguments for an ``s3://`` stream, e.g.
            ``{"endpoint_url": "http://minio:9000"}`` (default: ``AWS_ENDPOINT_URL_S3`` /
            ``AWS_ENDPOINT_URL`` and boto3's credential chain); completed with a bounded retry
            budget by :func:`~seg_datamodule.io.stream.endpoint.s3_storage_options`. Not saved
            in checkpoints (it may hold credentials).
        repeat_factor_threshold: repeat-factor sampling (LVIS uses 0.001; see
            :mod:`~seg_datamodule.data.loaders.repeat_factors`): an image whose rarest category is in a
            fraction ``f`` of the training images appears ``max(1, sqrt(t / f))`` times per
            epoch, fractional parts drawn per epoch from ``(seed, epoch)``; frequencies are
            counted from ``train_ann``. ``None`` (default): off. The epoch length follows the
            draw, so the Trainer needs ``reload_dataloaders_every_n_epochs=1`` (checked at
            setup); the report gives the epoch length and the mean factor. Not with
            ``train_stream``.
    """

    #: What stands in when no split is named: ``fallback_splits(demo_dir)`` gives the train and val
    #: paths. The package sets it to :func:`~seg_datamodule.demo.data.ensure_demo_dataset` on import,
    #: so that ``data/`` does not import the demo; None: a stage without its split is refused.
    fallback_splits: ClassVar[Fallback | None] = None
    #: What ``plots: true`` adds to the Trainer at fit: the package sets it to
    #: :func:`~seg_datamodule.pictures.callback.attach_run_pictures` on import (the pictures read
    #: ``data/``, so ``data/`` does not import them); None: no pictures.
    run_pictures: ClassVar[Callable[[Any, bool], None] | None] = None

    # The path keys, kept by the sources (a new value replaces the sources' paths).
    train_ann = PathKey()
    train_images = PathKey()
    val_ann = PathKey()
    val_images = PathKey()
    test_ann = PathKey()
    test_images = PathKey()
    predict_images = PathKey()
    predict_ann = PathKey()
    dataset = PathKey()
    train_split = PathKey()
    val_split = PathKey()
    test_split = PathKey()
    train_stream = PathKey()
    # What the collaborators build and hold, read (and written) through the DataModule as before.
    demo_dir = Forward("sources")
    stream_meta = Forward("sources")
    train_index = Forward("sources")
    val_index = Forward("sources")
    test_index = Forward("sources")
    loader_options = Forward("loaders")  # one home: a new value (loader-bench's num_workers) reaches the loaders
    train_dataset = Forward("loaders")
    val_dataset = Forward("loaders")
    test_dataset = Forward("loaders")
    predict_dataset = Forward("loaders")
    repeat_factors = Forward("loaders")
    consumed = Forward("counts")

    def __init__(
        self,
        train_ann: str | None = None,
        train_images: str | None = None,
        val_ann: str | None = None,
        val_images: str | None = None,
        test_ann: str | None = None,
        test_images: str | None = None,
        predict_images: str | None = None,
        predict_ann: str | None = None,
        dataset: str | None = None,
        train_split: str | None = "train",
        val_split: str | None = "val",
        test_split: str | None = "test",
        image_size: int = 640,
        mask_stride: int = 4,
        mask_fill: Literal["centre", "ultralytics"] = "centre",
        batch_size: int = 16,
        val_batch_size: int | None = None,
        num_workers: int | Literal["auto"] = "auto",
        mosaic: float = 1.0,
        close_mosaic: int = 0,
        mosaic_partners: Literal["batch", "uniform"] | None = None,
        recipe: Literal["mosaic", "lsj"] | list[Step] = "mosaic",
        lsj_scale: tuple[float, float] = (0.1, 2.0),
        copy_paste: float = 0.0,
        copy_paste_mode: Literal["flip", "batch"] = "flip",
        mixup: float = 0.0,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
        flip_lr: float = 0.5,
        min_area_ratio: float = 0.1,
        min_box_size: float = 2.0,
        transforms: A.BaseCompose | str | None = None,
        hsv: tuple[float, float, float] | None = None,
        hsv_on_device: bool = False,
        pixels_on_device: bool = False,
        on_bad_sample: Literal["raise", "skip"] = "raise",
        drop_crowd: bool = False,
        crowd_as_instances: bool = False,
        box_only: Literal["raise", "drop_images", "drop", "keep"] = "raise",
        allow_no_targets: bool = False,
        plots: bool = True,
        drop_empty: bool = False,
        verify_images: bool = False,
        cache_dir: str | None = None,
        use_cache: bool = True,
        index_check: Literal["files", "folders"] = "files",
        cache_images: int | None = None,
        on_resume_mismatch: Literal["raise", "restart"] = "raise",
        pin_memory: bool = True,
        persistent_workers: bool = True,
        prefetch_factor: int | None = 2,
        seed: int = 0,
        demo_dir: str | None = None,
        train_stream: str | None = None,
        stream_cache_dir: str | None = None,
        stream_max_cache_size: str | None = None,
        stream_storage_options: dict[str, Any] | None = None,
        repeat_factor_threshold: float | None = None,
    ) -> None:
        super().__init__()
        # Every check the keys need, and their typed options (one object per layer), built once.
        options = DataModuleOptions.from_keys(locals())
        # Storage options may hold credentials: kept out of checkpoints' hyperparameters.
        self.save_hyperparameters(ignore=["transforms", "stream_storage_options",
                                          *([] if isinstance(recipe, str) else ["recipe"])])  # a list: objects
        self.seed, self.cache_images = options.seed, options.cache_images
        self.on_resume_mismatch, self.repeat_factor_threshold = options.on_resume_mismatch, options.repeat_factor_threshold
        self.index_options, self.augment, self.stream_options = options.index, options.augment, options.stream
        # The collaborators: where the data comes from, the loaders, and where every annotation went.
        self.sources = SplitSources(options.paths, options.index, stream_storage_options, type(self).fallback_splits,
                                    demo_dir, options.allow_no_targets)
        self.loaders = LoaderFactory(options.augment, options.loader, options.seed, options.stream,
                                     options.on_resume_mismatch, options.repeat_factor_threshold)
        self.counts = RunCounts(self.sources, self.loaders)
        self.plots = options.plots

    # ------------------------------------------------------------------ options, read back

    @property
    def image_size(self) -> int:
        """The canvas side ``s``."""
        return self.augment.image_size

    @property
    def batch_size(self) -> int:
        """Training images per batch (per rank)."""
        return self.loader_options.batch_size

    @property
    def val_batch_size(self) -> int:
        """Validation, test and predict images per batch."""
        return self.loader_options.val_batch_size

    @property
    def num_workers(self) -> int:
        """DataLoader worker processes per loader (``"auto"`` resolved for this node's ranks)."""
        local_ranks = 1 if self.trainer is None else max(1, int(self.trainer.num_devices))
        return int(self.loader_options.for_node(local_ranks).num_workers)

    @property
    def mask_stride(self) -> int:
        """Stride of the mask grid."""
        return self.loader_options.mask_stride

    @property
    def on_bad_sample(self) -> str:
        """``"raise"`` or ``"skip"`` (the indices' and so the datasets')."""
        return self.index_options.on_bad_sample

    # ------------------------------------------------------------------ sources and categories

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of each label ``0..C-1`` (sorted; see :mod:`~seg_datamodule.data.splits.sources`)."""
        return self.sources.category_ids

    @property
    def num_classes(self) -> int:
        """C, the number of categories (contiguous labels ``0..C-1``)."""
        return self.sources.num_classes

    @property
    def class_names(self) -> list[str]:
        """Category names in label order."""
        return self.sources.class_names

    @property
    def category_source(self) -> str | None:
        """Where the categories come from (a file, the stream, ``"the checkpoint restored"``), or None yet."""
        return self.sources.category_source

    def categories_state(self) -> dict[str, Any]:
        """``{"categories": {"ids", "names"}}`` for a checkpoint (:meth:`SplitSources.categories_state`)."""
        return self.sources.categories_state()

    def restore_categories(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's categories, or check them against the files' (:meth:`SplitSources.restore_categories`)."""
        self.sources.restore_categories(state)

    def evaluation_file(self, stage: str) -> str | None:
        """The COCO / LVIS JSON that scores ``stage`` (:meth:`SplitSources.evaluation_file`)."""
        return self.sources.evaluation_file(stage)

    # ------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Generate the demo data and write the index caches of the stage's splits (once per node)."""
        self.sources.build(self._stage())

    def setup(self, stage: str) -> None:
        """Build what ``stage`` reads, and check its image folders before any worker starts."""
        self.sources.build(stage)
        self.counts.announce(self.sources.check_images(stage), getattr(self, "trainer", None))
        if stage == "fit":
            self._setup_train()
            if type(self).run_pictures is not None:
                type(self).run_pictures(self.trainer, self.plots)
        if stage in ("fit", "validate"):
            self.loaders.setup_eval("val", self.sources.val_index)
        elif stage == "test":
            self.loaders.setup_eval("test", self.sources.split_index("test"))
        elif stage == "predict" and self.predict_dataset is None:
            self.loaders.setup_predict(self.sources.predict_images(), self.on_bad_sample)
        for split in STAGE_SPLITS.get(stage, ()):  # a new run of an evaluation stage counts afresh
            if split != "train":
                self.consumed.reset(split)

    def _stage(self) -> str | None:
        """The Trainer's stage (``"fit"``, ``"validate"``, ...), or None without a Trainer."""
        fn = None if self.trainer is None else self.trainer.state.fn
        return None if fn is None else str(getattr(fn, "value", fn))

    def _setup_train(self) -> None:
        max_epochs = None
        if self.trainer is not None and self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            max_epochs = int(self.trainer.max_epochs)
        index: Any = self.sources.train_index
        cache_images = self.cache_images
        if self.train_dataset is None and self.stream_meta is not None:  # a window over each streamed batch
            from seg_datamodule.io.stream import window_from_meta

            index, cache_images = window_from_meta(self.stream_meta, self.train_stream, self.on_bad_sample), 0
        self.loaders.setup_train(index, cache_images, max_epochs)
        self.loaders.fit_repeat_factors(self.sources.train_index, self.trainer)

    def _world_size(self) -> int:
        return 1 if self.trainer is None else int(self.trainer.world_size)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        return self.loaders.train_loader_for(LoaderContext.of(self.trainer))

    def val_dataloader(self) -> DataLoader | list:
        if self.val_dataset is None and (self.val_ann is not None or (self.dataset and self.val_split)):
            self.setup("validate")
        return [] if self.val_dataset is None else self.loaders.eval_loader("val", LoaderContext.of(self.trainer))

    def test_dataloader(self) -> DataLoader | list:
        """The ``test_ann`` split, in order, letterboxed (as :meth:`val_dataloader`); ``[]`` without one."""
        self.loaders.setup_eval("test", self.sources.split_index("test"))
        return [] if self.test_dataset is None else self.loaders.eval_loader("test", LoaderContext.of(self.trainer))

    def predict_dataloader(self) -> DataLoader:
        """``predict_images`` in order, letterboxed, without targets (see :mod:`~seg_datamodule.data.samples.predict`).

        Raises:
            ValueError: no ``predict_images`` was given.
        """
        if self.predict_dataset is None:
            self.loaders.setup_predict(self.sources.predict_images(), self.on_bad_sample)
        return self.loaders.predict_loader(LoaderContext.of(self.trainer))

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Make the batch's pending pixels and HSV jitter (``*_on_device``) on its device, then run the model's hook.

        Lightning runs only the DataModule's hook when both define it, so the model's own
        ``on_after_batch_transfer`` is called from here, after the jitter. (Evaluation batches are
        counted by their loader as it hands them out: :class:`~seg_datamodule.data.loaders.resume.CountingLoader`.)
        """
        trainer = self.trainer
        batch = apply_pending_hsv(apply_pending_pixels(batch))
        model = None if trainer is None else trainer.lightning_module
        if model is not None and is_overridden("on_after_batch_transfer", model):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch

    def stepping_batches(self) -> int | float:
        """``trainer.estimated_stepping_batches``, with every epoch's own length under repeat-factor
        sampling (:meth:`LoaderFactory.stepping_batches`)."""
        return self.loaders.stepping_batches(self.trainer)

    def loader_state(self) -> dict[str, Any]:
        """The train loader's state, also kept by the DataModule so a resume can apply it early enough.

        Lightning saves the loader's own ``state_dict`` with the fit loop and restores it in
        ``FitLoop.setup_data``; but when ``configure_optimizers`` reads
        ``trainer.estimated_stepping_batches`` (any schedule sized to the run, as
        :class:`~seg_datamodule.demo.model.YolactLite` does), ``setup_data`` runs before the
        loops are restored, creates and starts the iterator, and is then skipped, so that state
        would never reach the loader. The DataModule's state is restored before that point.
        """
        return self.loaders.loader_state()

    def keep_loader_state(self, state_dict: dict[str, Any]) -> None:
        """Keep the train loader's state for the next ``train_dataloader()`` (see :meth:`loader_state`)."""
        self.loaders.keep_loader_state(state_dict)

    def state_dict(self) -> dict[str, Any]:
        """The train loader's state (:meth:`loader_state`) and the categories, for checkpoints."""
        return {**self.loader_state(), **self.categories_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check (or, for a folder to predict, take) the checkpoint's categories; keep the loader's state."""
        self.restore_categories(state_dict)
        self.keep_loader_state(state_dict)

    # ------------------------------------------------------------------ where the annotations went

    @property
    def skip_counts(self) -> dict[str, dict[str, int]]:
        """Where every annotation went, by source and reason.

        ``train_index`` / ``val_index``: annotations and images left out of the index at setup
        (``on_bad_sample="skip"``, ``drop_crowd``, ``drop_empty``). ``train`` / ``val``: per
        annotation of every tile drawn, ``kept`` (in the sample) or the reason it was dropped
        (outside the canvas, clipped below ``min_area_ratio``, a tiny box, a bad image).
        Each batch carries its counts, and only the batches a loop took are counted (not those
        the workers built ahead), for any ``num_workers``: ``train`` over the run (a resumed run
        continues the count saved in the checkpoint), ``val`` and ``test`` over the last pass
        over their loader (the sanity check, each validation, a ``for`` loop of one's own: the
        same numbers whoever iterates). Under DDP each rank counts its own shard.
        """
        return self.counts.skip_counts(self._world_size())

    def report(self) -> str:
        """A human-readable summary of :attr:`skip_counts` and the training decodes per image."""
        return self.counts.report(self._world_size())

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.counts.print_report(getattr(self, "trainer", None), "", self._world_size())

    def on_exception(self, exception: BaseException) -> None:
        """The end-of-fit report, also when ``fit`` stops on Ctrl-C or an exception (so far)."""
        self.counts.report_on_exception(getattr(self, "trainer", None), exception, self._world_size())
