"""Training (mosaic) and validation (letterbox) samples over a COCO index.

* training: a YOLO 4-image mosaic with probability ``mosaic`` (partners from the same batch by
  default, see ``mosaic_partners``), else the image alone; a random affine folded into one
  matrix per tile (one resample per pixel; polygons through the same matrices, exactly
  clipped); a horizontal flip; then the user's albumentations pipeline; then YOLO's HSV jitter
  (``hsv``; or only its gains, for the accelerator);
* ``recipe="lsj"``: large-scale jitter of one image instead (scale jitter, fixed-size crop,
  flip; :mod:`~seg_datamodule.transforms.layouts.lsj`);
* then, with ``copy_paste`` / ``mixup``, copy-paste (exact occlusion) and MixUp with another
  sample of the batch (:mod:`~seg_datamodule.transforms.group.sample_mixing`);
* validation (``train=False``): the image letterboxed to ``s x s`` with ``scale``, ``pad`` and
  ``orig_size`` set so predictions map back; no instance is dropped for its size.

Randomness: a sample draws from ``default_rng([seed, epoch, index])`` and a batch's mosaic
partners from ``(seed, epoch, indices)``, so batches do not depend on ``num_workers`` and
different samples (hence workers) draw differently. Copy-paste and MixUp draw from the same
generator after everything the sample drew for itself, and take partners from the batch as they
were before any mixing, so with both off every sample is what it was without them. Items are ``(epoch, index)`` from
:class:`~seg_datamodule.data.loaders.sampler.EpochShardSampler`, or plain indices read with the epoch of
:meth:`SegDataset.set_epoch` (shared memory, so persistent workers see it).

Accounting: every annotation of every tile drawn is in the sample or counted by reason in
:attr:`SegDataset.counts`, shared with the workers; decodes per output image are in
:attr:`SegDataset.decode_counts`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from seg_datamodule.data.counts import SkipCounter
from seg_datamodule.data.samples.decoding import ImageIndex
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.data.samples.pipeline import Counts, Pipeline, SampleKey
from seg_datamodule.io.images.decode import IMAGE_ERROR_REASONS
from seg_datamodule.ops.checks import check_bool, check_choice, check_int
from seg_datamodule.structures import Sample, SampleBatch
from seg_datamodule.transforms.kernels.polygons import DROP_REASONS

__all__ = ["ADDED_KEYS", "COUNT_KEYS", "DECODE_KEYS", "ImageIndex", "SegDataset"]

#: Keys of :attr:`SegDataset.counts` that count targets added by copy-paste and MixUp.
ADDED_KEYS: tuple[str, ...] = ("pasted", "mixed_in")

#: Keys of :attr:`SegDataset.counts`. ``kept`` and the drop reasons of
#: :data:`~seg_datamodule.transforms.kernels.polygons.DROP_REASONS` count annotations (once per sample that drew the
#: image); ``bad_image`` counts annotations of images that failed to load; the ``image_*`` keys
#: count the images that failed to load, by :class:`~seg_datamodule.io.images.decode.BadImageError` reason;
#: ``pasted`` and ``mixed_in`` (:data:`ADDED_KEYS`) count the targets copy-paste and MixUp added
#: (copies of annotations counted in their own sample too), so ``kept`` + the drop reasons +
#: ``bad_image`` = the annotations drawn + ``pasted`` + ``mixed_in``.
COUNT_KEYS: tuple[str, ...] = (*DROP_REASONS, "bad_image", *IMAGE_ERROR_REASONS, *ADDED_KEYS)

#: Keys of :attr:`SegDataset.decode_counts`: samples built, images decoded (cache misses) and
#: how many of those decodes ran at reduced JPEG scale.
DECODE_KEYS: tuple[str, ...] = ("samples", "decodes", "reduced_decodes")


class SharedEpoch:
    """The epoch plain indices use and the run's epoch count, in shared memory.

    Persistent DataLoader workers keep their own copy of the dataset; values set in the main
    process reach them through the shared tensor.

    Args:
        max_epochs: the run's epochs, or None when not known yet.
    """

    def __init__(self, max_epochs: int | None = None) -> None:
        self._values = torch.tensor([0, -1 if max_epochs is None else max_epochs], dtype=torch.int64)
        self._values.share_memory_()

    def __getstate__(self) -> dict[str, Any]:
        return {"_values": self._values}  # the numpy view is rebuilt on first read

    def _view(self) -> np.ndarray:
        # Reading a numpy scalar is ~50x cheaper than indexing the tensor.
        view = self.__dict__.get("_np")
        if view is None:
            view = self.__dict__["_np"] = self._values.numpy()
        return view

    @property
    def epoch(self) -> int:
        return int(self._view()[0])

    @property
    def max_epochs(self) -> int | None:
        value = int(self._view()[1])
        return None if value < 0 else value

    def set_epoch(self, epoch: int) -> None:
        self._values[0] = check_int("epoch", epoch, 0)

    def set_max_epochs(self, max_epochs: int) -> int:
        self._values[1] = check_int("max_epochs", max_epochs, 1)
        return int(max_epochs)


class SegDataset(Dataset[Sample]):
    """Mosaic / random-affine (or LSJ) training samples, or letterboxed validation samples.

    A thin holder of the dataset's state (the index, the shared epoch, the shared counters) over
    :class:`~seg_datamodule.data.samples.pipeline.Pipeline`, which builds every sample and returns
    its counts as values.

    Args:
        index (ImageIndex): the images and annotations (a ``CocoIndex``); its
            ``on_bad_sample`` decides what an image that fails to load does: ``"raise"``, or
            ``"skip"``: a training tile is replaced by another image drawn from the sample's
            generator, a validation sample is empty (grey, no instances); both are counted.
        augment (AugmentOptions | None): what training draws, and the canvas size (its
            geometry's ``image_size``); None: the defaults (640 px, YOLO's mosaic recipe).
            Validation reads only the canvas size.
        train (bool): training augmentation when True; plain letterbox when False.
        seed (int): base seed.
        cache_images (int): decoded images (and crowd masks) kept per worker (LRU); 0 keeps
            none. Pays off when the dataset a worker sees is small.
        max_epochs (int | None): the run's epochs, for ``close_mosaic`` (or
            :meth:`set_max_epochs`).
        max_retries (int): bad images tolerated per sample before giving up.

    ``ds[i]`` and batches of one build a sample alone (mosaic and mixing partners uniform over
    the dataset); DataLoaders with a ``batch_size`` call :meth:`__getitems__`, where
    ``mosaic_partners="batch"`` takes partners from the batch (one decode per output image).

    Raises:
        TypeError: ``index`` lacks the :class:`ImageIndex` interface, or an argument has the
            wrong type.
        ValueError: an argument is out of range.
    """

    def __init__(
        self,
        index: ImageIndex,
        augment: AugmentOptions | None = None,
        *,
        train: bool = True,
        seed: int = 0,
        cache_images: int = 0,
        max_epochs: int | None = None,
        max_retries: int = 10,
    ) -> None:
        if not isinstance(index, ImageIndex):
            raise TypeError(
                "index must provide image_ids, heights, widths, on_bad_sample, __len__, polygons, labels, "
                f"annotation_ids, crowd_mask and load_image (a CocoIndex), got {type(index).__name__}"
            )
        # An index's own policy, checked here: Pipeline reads anything but "skip" as "raise".
        check_choice("index.on_bad_sample", index.on_bad_sample, ("raise", "skip"))
        augment = AugmentOptions() if augment is None else augment
        if not isinstance(augment, AugmentOptions):
            raise TypeError(f"augment must be an AugmentOptions or None, got {type(augment).__name__}")
        self.index, self.augment = index, augment
        self.train = check_bool("train", train)
        self.seed = check_int("seed", seed, minimum=0)
        self.cache_images = check_int("cache_images", cache_images, minimum=0)
        self.max_retries = check_int("max_retries", max_retries, minimum=0)
        self.path = Pipeline(index, augment.build_recipe(), augment.sampling, self.seed, self.cache_images,
                             self.max_retries)
        # Shared state, read by (persistent) workers: the epoch and the run's epochs; counts.
        self._state = SharedEpoch(None if max_epochs is None else check_int("max_epochs", max_epochs, 1))
        self.counter = SkipCounter(COUNT_KEYS)
        self.decode_counter = SkipCounter(DECODE_KEYS)

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        mode = "train" if self.train else "val"
        a, recipe = self.augment, self.path.recipe
        albu = recipe.albumentations
        return (
            f"SegDataset({len(self)} images, {mode}, image_size={self.image_size}, "
            f"mosaic={a.mosaic}, mosaic_partners={a.mosaic_partners!r}, "
            f"close_mosaic={a.close_mosaic}, {a.geometry!r}, {recipe.group!r}, "
            f"transforms={None if albu is None else albu.transforms!r}, hsv={recipe.hsv!r})"
        )

    @property
    def image_size(self) -> int:
        """The canvas side ``s`` (the geometry's)."""
        return self.augment.image_size

    @property
    def on_bad_sample(self) -> str:
        """The index's ``on_bad_sample``."""
        return self.index.on_bad_sample

    @property
    def epoch(self) -> int:
        """The epoch plain indices use (shared with the workers)."""
        return self._state.epoch

    @property
    def max_epochs(self) -> int | None:
        """The run's epochs (shared with the workers), or None."""
        return self._state.max_epochs

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for plain indices; persistent workers see it (shared memory)."""
        self._state.set_epoch(epoch)

    def set_max_epochs(self, max_epochs: int) -> None:
        """Set the run's number of epochs, which ``close_mosaic`` counts back from."""
        self._state.set_max_epochs(max_epochs)

    def mosaic_active(self, epoch: int) -> bool:
        """Whether mosaic may apply in ``epoch`` (training, and not within ``close_mosaic``).

        Raises:
            RuntimeError: ``close_mosaic > 0`` but ``max_epochs`` was never given.
        """
        a = self.augment
        if not self.train or a.mosaic == 0.0 or a.recipe == "lsj":
            return False
        if a.close_mosaic == 0:
            return True
        max_epochs = self._state.max_epochs
        if max_epochs is None:
            raise RuntimeError(
                f"close_mosaic={a.close_mosaic} needs max_epochs: pass max_epochs= or call "
                "set_max_epochs() before iterating"
            )
        return epoch < max_epochs - a.close_mosaic

    @property
    def counts(self) -> dict[str, int]:
        """Annotation and bad-image counts by :data:`COUNT_KEYS`, summed over workers."""
        return {key: 0 for key in COUNT_KEYS} | self.counter.counts()

    def reset_counts(self) -> None:
        """Zero :attr:`counts` and :attr:`decode_counts`."""
        self.counter.reset()
        self.decode_counter.reset()

    @property
    def decode_counts(self) -> dict[str, int]:
        """``samples`` built, image ``decodes`` and ``reduced_decodes`` (see :data:`DECODE_KEYS`),
        summed over workers; ``decodes / samples`` is the decodes per output image."""
        return {key: 0 for key in DECODE_KEYS} | self.decode_counter.counts()

    def generator(self, index: int, epoch: int | None = None, copy: int = 0) -> np.random.Generator:
        """The generator sample ``index`` of ``epoch`` (default: the current one) draws from.

        ``copy`` tells apart the copies of an image that repeat-factor sampling puts in one
        epoch (copy 0 draws as an image drawn once does), so each copy is augmented differently.
        """
        return self.path.generator(SampleKey(self.epoch if epoch is None else int(epoch), int(index), int(copy)))

    def on_worker_start(self) -> None:
        """Per-worker reset (called by :func:`~seg_datamodule.data.loaders.arguments.worker_init_fn`): an empty image cache."""
        self.path.images.reset()

    # ------------------------------------------------------------------ samples

    def __getitem__(self, item: int | tuple[int, ...]) -> Sample:
        """One sample, built alone (mosaic and mixing partners uniform over the dataset).

        Args:
            item: an image index, or ``(epoch, index)`` from ``EpochShardSampler`` (``(epoch,
                index, copy)`` with repeat-factor sampling; see :meth:`generator`).

        Returns:
            Sample: ``s x s`` image, clipped polygons in output pixels, boxes from them.

        Raises:
            IndexError: the index is out of range.
            BadImageError: an image fails to load and the index's ``on_bad_sample`` is ``"raise"``.
            RuntimeError: more than ``max_retries`` bad images in one sample.
        """
        key = self._key(item)
        sample, counts = self.path.train_one(key) if self.train else self.path.letterboxed(key.index)
        self._add(counts)
        return sample

    def __getitems__(self, items: Sequence[int | tuple[int, ...]]) -> SampleBatch:
        """A batch of samples; what a DataLoader with a ``batch_size`` calls (in its worker).

        With ``mosaic_partners="batch"`` (training, two or more items) each mosaic draws its
        three partners from the batch's other images, with a generator seeded from
        ``(seed, epoch, indices)``; every tile is planned before any decode, and each image is
        then decoded once, at the finest JPEG scale any of its tiles needs.

        Returns:
            SampleBatch: the samples and this batch's share of :attr:`counts` and
            :attr:`decode_counts` (the collate puts it on ``DetectionBatch.counts``).

        Raises:
            the same as :meth:`__getitem__`.
        """
        keys = [self._key(item) for item in items]
        if not self.train or len(keys) < 2:
            built = [self.path.train_one(key) if self.train else self.path.letterboxed(key.index) for key in keys]
            samples, counts = [s for s, _ in built], sum((c for _, c in built), Counts())
        else:
            samples, counts = self.path.train_batch(keys)
        self._add(counts)
        return SampleBatch(tuple(samples), {k: int(v) for k, v in counts.items() if v})

    def _add(self, counts: Counts) -> None:
        """Add a batch's (or sample's) counts to the shared counters."""
        for key, n in counts.items():
            if n:
                (self.decode_counter if key in DECODE_KEYS else self.counter).add(key, n)

    def _key(self, item: int | tuple[int, ...]) -> SampleKey:
        """The :class:`SampleKey` of an item; raises ``IndexError`` when out of range."""
        if isinstance(item, tuple):
            epoch, index, copy = int(item[0]), int(item[1]), int(item[2]) if len(item) > 2 else 0
        else:
            epoch, index, copy = self.epoch, int(item), 0
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} images")
        return SampleKey(epoch, index, copy, self.mosaic_active(epoch))
