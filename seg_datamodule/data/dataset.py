"""Training (mosaic) and validation (letterbox) samples over a COCO index.

* training: a YOLO 4-image mosaic with probability ``mosaic`` (partners from the same batch by
  default, see ``mosaic_partners``), else the image alone; a random affine folded into one
  matrix per tile (one resample per pixel; polygons through the same matrices, exactly
  clipped); a horizontal flip; then the user's albumentations pipeline; then YOLO's HSV jitter
  (``hsv``; or only its gains, for the accelerator);
* ``recipe="lsj"``: large-scale jitter of one image instead (scale jitter, fixed-size crop,
  flip; :mod:`~seg_datamodule.transforms.lsj`);
* then, with ``copy_paste`` / ``mixup``, copy-paste (exact occlusion) and MixUp with another
  sample of the batch (:mod:`~seg_datamodule.transforms.mixing`);
* validation (``train=False``): the image letterboxed to ``s x s`` with ``scale``, ``pad`` and
  ``orig_size`` set so predictions map back; no instance is dropped for its size.

Randomness: a sample draws from ``default_rng([seed, epoch, index])`` and a batch's mosaic
partners from ``(seed, epoch, indices)``, so batches do not depend on ``num_workers`` and
different samples (hence workers) draw differently. Copy-paste and MixUp draw from the same
generator after everything the sample drew for itself, and take partners from the batch as they
were before any mixing, so with both off every sample is what it was without them. Items are ``(epoch, index)`` from
:class:`~seg_datamodule.data.sampler.EpochShardSampler`, or plain indices read with the epoch of
:meth:`SegDataset.set_epoch` (shared memory, so persistent workers see it).

Accounting: every annotation of every tile drawn is in the sample or counted by reason in
:attr:`SegDataset.counts`, shared with the workers; decodes per output image are in
:attr:`SegDataset.decode_counts`.
"""

from __future__ import annotations

import collections
from typing import Callable, Literal, Sequence

import albumentations as A
import numpy as np
from torch.utils.data import Dataset

from seg_datamodule.data.accounting import CountedSamples, SkipCounter
from seg_datamodule.data.assemble import assemble_sample, empty_sample, load_tiles, other_index
from seg_datamodule.data.loading import BatchDecodes, ImageIndex, ImageSource, SharedEpoch, worker_init_fn
from seg_datamodule.io.images import IMAGE_ERROR_REASONS, BadImageError
from seg_datamodule.ops.checks import check_bool, check_choice, check_int, check_number
from seg_datamodule.structures import Sample
from seg_datamodule.transforms.albu import AlbumentationsTransform
from seg_datamodule.transforms.augment import GlobalDraw, MosaicAffine
from seg_datamodule.transforms.hsv import HSVJitter, refuse_random_hsv
from seg_datamodule.transforms.lsj import LargeScaleJitter, LSJDraw
from seg_datamodule.transforms.mixing import MixResult, SampleMixing
from seg_datamodule.transforms.plan import draw_batch_partners
from seg_datamodule.transforms.plan import TilePlan, choose_reduce, visible_tiles
from seg_datamodule.transforms.polygons import DROP_REASONS

# Tags the batch partner generator's seed apart from the per-sample ``[seed, epoch, index]`` ones.
_PARTNER_STREAM = 0x6D6F7361

__all__ = ["ADDED_KEYS", "COUNT_KEYS", "DECODE_KEYS", "ImageIndex", "SegDataset", "worker_init_fn"]

#: Keys of :attr:`SegDataset.counts` that count targets added by copy-paste and MixUp.
ADDED_KEYS: tuple[str, ...] = ("pasted", "mixed_in")

#: Keys of :attr:`SegDataset.counts`. ``kept`` and the drop reasons of
#: :data:`~seg_datamodule.transforms.polygons.DROP_REASONS` count annotations (once per sample that drew the
#: image); ``bad_image`` counts annotations of images that failed to load; the ``image_*`` keys
#: count the images that failed to load, by :class:`~seg_datamodule.io.images.BadImageError` reason;
#: ``pasted`` and ``mixed_in`` (:data:`ADDED_KEYS`) count the targets copy-paste and MixUp added
#: (copies of annotations counted in their own sample too), so ``kept`` + the drop reasons +
#: ``bad_image`` = the annotations drawn + ``pasted`` + ``mixed_in``.
COUNT_KEYS: tuple[str, ...] = (*DROP_REASONS, "bad_image", *IMAGE_ERROR_REASONS, *ADDED_KEYS)

#: Keys of :attr:`SegDataset.decode_counts`: samples built, images decoded (cache misses) and
#: how many of those decodes ran at reduced JPEG scale.
DECODE_KEYS: tuple[str, ...] = ("samples", "decodes", "reduced_decodes")


class SegDataset(Dataset[Sample]):
    """Mosaic / random-affine training samples, or letterboxed validation samples.

    Args:
        index (ImageIndex): the images and annotations (a ``CocoIndex``).
        image_size (int): output side ``s`` (square ``s x s``).
        geometry (MosaicAffine | None): the random affine (rotation, translation, scale,
            shear) and flip training draws, for ``image_size``; None: the YOLO defaults.
        train (bool): training augmentation when True; plain letterbox when False.
        mosaic (float): probability of a 4-image mosaic per training sample.
        close_mosaic (int): switch mosaic off for the last ``close_mosaic`` epochs (needs
            ``max_epochs``).
        max_epochs (int | None): the run's epochs, for ``close_mosaic`` (or
            :meth:`set_max_epochs`).
        min_area_ratio (float): drop (as ``clipped``) an instance keeping less than this fraction
            of its area after clipping; training only. 0.1 is Ultralytics' detection threshold;
            masks are exact at borders, so it is about what a fragment shows, not mask error.
        min_box_size (float): an instance whose clipped box is narrower or lower than this many
            output pixels is dropped (reason ``small_box``); training only.
        transforms (albumentations.BaseCompose | str | None): per-sample albumentations
            pipeline (training only), or a file ``A.load`` reads; see
            :class:`~seg_datamodule.transforms.albu.AlbumentationsTransform`.
        seed (int): base seed.
        on_bad_sample (str): ``"raise"`` or ``"skip"`` when an image fails to load (use the
            value the index was built with). Skipping replaces a training tile by another image
            drawn from the sample's generator, and gives an empty (grey, no instances)
            validation sample; both are counted.
        cache_images (int): decoded images (and crowd masks) kept per worker (LRU); 0 keeps
            none. Pays off when the dataset a worker sees is small.
        max_retries (int): bad images tolerated per sample before giving up.
        mosaic_partners (str): where a mosaic's three other images come from. ``"batch"``
            (default): the batch's other images (:func:`~seg_datamodule.transforms.plan.
            draw_batch_partners`, from ``(seed, epoch, batch)``): each image is decoded once per
            batch and is the main tile of its sample and a partner in exactly three others, at
            other positions, scales and crops; one decode per output image instead of four, and
            batches still independent of ``num_workers``. ``"uniform"``: the whole dataset (four
            decodes per mosaic without a cache). ``ds[i]`` and batches of one always use
            ``"uniform"``; DataLoaders with a ``batch_size`` call :meth:`__getitems__`.
        recipe (str): ``"mosaic"`` (default; ``geometry`` a ``MosaicAffine``) or ``"lsj"``:
            large-scale jitter of one image (``geometry`` a
            :class:`~seg_datamodule.transforms.lsj.LargeScaleJitter`; ``mosaic`` and
            ``close_mosaic`` do not apply).
        lsj_scale (tuple[float, float]): LSJ's scale range when ``geometry`` is None.
        copy_paste (float): probability of copy-paste per training sample (see
            :class:`~seg_datamodule.transforms.mixing.SampleMixing`); instances left with less
            than ``min_area_ratio`` of their pixels are dropped as ``occluded``.
        copy_paste_mode (str): ``"flip"`` (the sample's own mirror image) or ``"batch"`` (another
            sample of the batch; for ``ds[i]``, of the dataset).
        mixup (float): probability of MixUp per training sample, with another sample of the batch
            (for ``ds[i]``, of the dataset).
        hsv (HSVJitter | None): YOLO's HSV gain jitter (training only), after ``transforms``;
            with ``hsv.on_device`` each sample carries its gains (``Sample.hsv_gains``) instead,
            for :func:`~seg_datamodule.transforms.hsv.hsv_jitter_batch_` on the accelerator.
            Its gains are the sample generator's last draw, so they are the same either way.

    Raises:
        TypeError: ``index`` lacks the :class:`ImageIndex` interface, or an argument has the
            wrong type.
        ValueError: an argument is out of range.
    """

    def __init__(
        self,
        index: ImageIndex,
        *,
        image_size: int = 640,
        geometry: MosaicAffine | None = None,
        train: bool = True,
        mosaic: float = 1.0,
        close_mosaic: int = 0,
        max_epochs: int | None = None,
        min_area_ratio: float = 0.1,
        min_box_size: float = 2.0,
        transforms: A.BaseCompose | str | None = None,
        seed: int = 0,
        on_bad_sample: Literal["raise", "skip"] = "raise",
        cache_images: int = 0,
        max_retries: int = 10,
        mosaic_partners: Literal["batch", "uniform"] = "batch",
        recipe: Literal["mosaic", "lsj"] = "mosaic",
        lsj_scale: tuple[float, float] = (0.1, 2.0),
        copy_paste: float = 0.0,
        copy_paste_mode: Literal["flip", "batch"] = "flip",
        mixup: float = 0.0,
        hsv: HSVJitter | None = None,
    ) -> None:
        # 1. The index.
        if not isinstance(index, ImageIndex):
            raise TypeError(
                "index must provide image_ids, heights, widths, __len__, polygons, labels, "
                f"annotation_ids, crowd_mask and load_image (a CocoIndex), got {type(index).__name__}"
            )
        self.index = index
        self._sizes = np.stack(
            [np.asarray(index.heights, np.int64), np.asarray(index.widths, np.int64)], axis=1
        )
        # 2. Plain arguments.
        self.train = check_bool("train", train)
        self.mosaic = check_number("mosaic", mosaic, 0.0, 1.0)
        self.close_mosaic = check_int("close_mosaic", close_mosaic, minimum=0)
        self.max_epochs = None if max_epochs is None else check_int("max_epochs", max_epochs, 1)
        self.min_area_ratio = check_number("min_area_ratio", min_area_ratio, 0.0, 1.0)
        self.min_box_size = check_number("min_box_size", min_box_size)
        self.seed = check_int("seed", seed, minimum=0)
        self.on_bad_sample = check_choice("on_bad_sample", on_bad_sample, ("raise", "skip"))
        self.cache_images = check_int("cache_images", cache_images, minimum=0)
        self.max_retries = check_int("max_retries", max_retries, minimum=0)
        self.mosaic_partners = check_choice("mosaic_partners", mosaic_partners, ("batch", "uniform"))
        # 3. The augmentation stages (they check their own arguments).
        self.recipe = check_choice("recipe", recipe, ("mosaic", "lsj"))
        kind = LargeScaleJitter if self.recipe == "lsj" else MosaicAffine
        if geometry is None:
            geometry = (LargeScaleJitter(image_size, tuple(lsj_scale)) if self.recipe == "lsj"
                        else MosaicAffine(image_size=image_size))
        elif not isinstance(geometry, kind):
            raise TypeError(f"geometry must be a {kind.__name__} or None, got {type(geometry).__name__} "
                            f"(recipe={self.recipe!r})")
        elif geometry.image_size != image_size:
            raise ValueError(f"image_size {image_size!r} differs from geometry.image_size {geometry.image_size}")
        self.geometry = geometry
        self.image_size = geometry.image_size
        self.transforms = AlbumentationsTransform(transforms)
        self.mixing = SampleMixing(copy_paste, copy_paste_mode, mixup, self.min_area_ratio, self.min_box_size)
        if hsv is not None and not isinstance(hsv, HSVJitter):
            raise TypeError(f"hsv must be an HSVJitter or None, got {type(hsv).__name__}")
        if hsv is not None:
            refuse_random_hsv(self.transforms.transforms)
        self.hsv = hsv
        # 4. Shared state, read by (persistent) workers: the epoch and the run's epochs; counts.
        self._state = SharedEpoch(max_epochs)
        self.counter = SkipCounter(COUNT_KEYS)
        self.decode_counter = SkipCounter(DECODE_KEYS)
        self.images = ImageSource(index, self.cache_images, self._count_decode)
        self._tally: collections.Counter[str] | None = None

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        mode = "train" if self.train else "val"
        return (
            f"SegDataset({len(self)} images, {mode}, image_size={self.image_size}, "
            f"mosaic={self.mosaic}, mosaic_partners={self.mosaic_partners!r}, "
            f"close_mosaic={self.close_mosaic}, {self.geometry!r}, {self.mixing!r}, "
            f"transforms={self.transforms.transforms!r}, hsv={self.hsv!r})"
        )

    @property
    def epoch(self) -> int:
        """The epoch plain indices use (shared with the workers)."""
        return self._state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for plain indices; persistent workers see it (shared memory)."""
        self._state.set_epoch(epoch)

    def set_max_epochs(self, max_epochs: int) -> None:
        """Set the run's number of epochs, which ``close_mosaic`` counts back from."""
        self.max_epochs = self._state.set_max_epochs(max_epochs)

    def mosaic_active(self, epoch: int) -> bool:
        """Whether mosaic may apply in ``epoch`` (training, and not within ``close_mosaic``).

        Raises:
            RuntimeError: ``close_mosaic > 0`` but ``max_epochs`` was never given.
        """
        if not self.train or self.mosaic == 0.0 or self.recipe == "lsj":
            return False
        if self.close_mosaic == 0:
            return True
        max_epochs = self._state.max_epochs
        if max_epochs is None:
            raise RuntimeError(
                f"close_mosaic={self.close_mosaic} needs max_epochs: pass max_epochs= or call "
                "set_max_epochs() before iterating"
            )
        return epoch < max_epochs - self.close_mosaic

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
        epoch = self.epoch if epoch is None else epoch
        return np.random.default_rng([self.seed, int(epoch), int(index), *([int(copy)] if copy else [])])

    def on_worker_start(self) -> None:
        """Per-worker reset (called by :func:`worker_init_fn`): an empty image cache."""
        self.images.reset()

    # ------------------------------------------------------------------ loading

    def _load(self, i: int, reduce: int) -> np.ndarray:
        return self.images.image(i, reduce)

    def _crowd(self, i: int) -> np.ndarray | None:
        return self.images.crowd(i)

    def _count_decode(self, key: str) -> None:
        self._count(self.decode_counter, key)

    def _bad(self, err: BadImageError, i: int, count: bool = True) -> None:
        """Count a bad image (and its annotations), or re-raise it."""
        if self.on_bad_sample == "raise":
            raise err
        if not count:
            return
        self._count(self.counter, err.reason if err.reason in IMAGE_ERROR_REASONS else "image_corrupt")
        self._count(self.counter, "bad_image", len(self.index.labels(i)))

    # ------------------------------------------------------------------ samples

    def __getitem__(self, item: int | tuple[int, ...]) -> Sample:
        """One sample, built alone (mosaic partners uniform over the dataset).

        Args:
            item: an image index, or ``(epoch, index)`` from ``EpochShardSampler`` (``(epoch,
                index, copy)`` with repeat-factor sampling; see :meth:`generator`).

        Returns:
            Sample: ``s x s`` image, clipped polygons in output pixels, boxes from them.

        Raises:
            IndexError: the index is out of range.
            BadImageError: an image fails to load and ``on_bad_sample="raise"``.
            RuntimeError: more than ``max_retries`` bad images in one sample.
        """
        epoch, index, copy = self._key(item)
        self._count(self.decode_counter, "samples")
        if not self.train:
            return self._val_sample(index)
        rng, sample = self._alone(epoch, index, copy)
        if not self.mixing.enabled:
            return sample
        # Built alone, the partners come from the dataset: built the same way, left uncounted
        # (only the targets they lend are, as pasted / mixed in).
        draw = self.mixing.draw(rng, len(self))
        need = {draw.paste_shift if draw.paste else 0, draw.mix_shift if draw.mix else 0} - {0}
        bases = {k: self._alone(epoch, (index + k) % len(self), count=False)[1] for k in sorted(need)}
        return self._count_mix(self.mixing.apply(rng, sample, draw, bases.get(draw.paste_shift),
                                                 bases.get(draw.mix_shift)))

    def _alone(self, epoch: int, index: int, copy: int = 0, count: bool = True) -> tuple[np.random.Generator, Sample]:
        """Sample ``index`` (its ``copy``) of ``epoch`` before mixing, its partners uniform over the dataset."""
        rng = self.generator(index, epoch, copy)
        use_mosaic = self._use_mosaic(rng, epoch)
        ids = self.geometry.draw_indices(rng, index, len(self)) if use_mosaic else np.array([index], np.int64)
        draw = self.geometry.draw(rng, use_mosaic)
        return rng, self._train_sample(rng, epoch, index, ids, draw, lambda i, r: (self._load(i, r), r), count)

    def _count_mix(self, result: MixResult) -> Sample:
        """Count what mixing added (``pasted``, ``mixed_in``) and took (``occluded``) as targets."""
        for key, n in (("pasted", result.pasted), ("mixed_in", result.mixed_in), ("occluded", result.occluded),
                       ("kept", result.pasted + result.mixed_in - result.occluded)):
            if n:
                self._count(self.counter, key, n)
        return result.sample

    def __getitems__(self, items: Sequence[int | tuple[int, ...]]) -> list[Sample]:
        """A batch of samples; what a DataLoader with a ``batch_size`` calls (in its worker).

        With ``mosaic_partners="batch"`` (training, two or more items) each mosaic draws its
        three partners from the batch's other images, with a generator seeded from
        ``(seed, epoch, indices)``; every tile is planned before any decode, and each image is
        then decoded once, at the finest JPEG scale any of its tiles needs.

        Returns:
            CountedSamples: the samples, with ``.counts``, this batch's share of :attr:`counts`
            and :attr:`decode_counts` (the collate puts it on ``DetectionBatch.counts``).

        Raises:
            the same as :meth:`__getitem__`.
        """
        keys = [self._key(item) for item in items]
        self._tally = collections.Counter()
        try:
            samples = self._batch(keys)
            return CountedSamples(samples, counts=dict(self._tally))
        finally:
            self._tally = None

    def _batch(self, keys: list[tuple[int, int, int]]) -> list[Sample]:
        if not self.train or len(keys) < 2 or (self.mosaic_partners == "uniform" and not self.mixing.enabled):
            return [self[key] for key in keys]
        self._count(self.decode_counter, "samples", len(keys))
        if self.mosaic_partners == "uniform":
            rngs, samples = (list(x) for x in zip(*[self._alone(epoch, index, copy) for epoch, index, copy in keys]))
        else:
            rngs, samples = self._batch_partnered(keys)
        if not self.mixing.enabled:
            return samples
        return [self._count_mix(result) for result in self.mixing.mix_group(rngs, samples)]

    def _batch_partnered(self, keys: list[tuple[int, int, int]]) -> tuple[list[np.random.Generator], list[Sample]]:
        """The batch's samples before mixing, mosaic partners from the batch; and their generators."""
        # 1. Per sample: mosaic or not, drawn from its own generator as in __getitem__.
        rngs = [self.generator(index, epoch, copy) for epoch, index, copy in keys]
        mosaics = [self._use_mosaic(rng, epoch) for rng, (epoch, _, _) in zip(rngs, keys)]
        # 2. Partners: positions of other batch images, from the batch's own generator.
        indices = np.array([index for _, index, _ in keys], np.int64)
        batch_rng = np.random.default_rng([self.seed, keys[0][0], _PARTNER_STREAM, *indices.tolist()])
        partners = draw_batch_partners(batch_rng, len(keys))
        ids = [
            indices[np.concatenate([[b], partners[b]])] if mosaics[b] else indices[b : b + 1]
            for b in range(len(keys))
        ]
        # 3. Plan every tile first, so each image is decoded once at the finest scale it needs.
        draws = [self.geometry.draw(rng, use_mosaic) for rng, use_mosaic in zip(rngs, mosaics)]
        decodes = BatchDecodes(self._load)
        for draw, tile_ids in zip(draws, ids):
            plan = self.geometry.plan(draw, self._sizes[tile_ids])
            for k in np.flatnonzero(visible_tiles(plan)):
                decodes.want(int(tile_ids[k]), choose_reduce(plan.matrices[k]))
        return rngs, [
            self._train_sample(rng, epoch, index, tile_ids, draw, decodes.get)
            for rng, (epoch, index, _), tile_ids, draw in zip(rngs, keys, ids, draws)
        ]

    def _count(self, counter: SkipCounter, key: str, n: int = 1) -> None:
        """Count in the shared counter, and in the tally of the batch being built (if any)."""
        counter.add(key, n)
        if self._tally is not None:
            self._tally[key] += n

    def _key(self, item: int | tuple[int, ...]) -> tuple[int, int, int]:
        """``(epoch, index, copy)`` of an item; raises ``IndexError`` when out of range."""
        if isinstance(item, tuple):
            epoch, index, copy = int(item[0]), int(item[1]), int(item[2]) if len(item) > 2 else 0
        else:
            epoch, index, copy = self.epoch, int(item), 0
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} images")
        return epoch, index, copy

    def _use_mosaic(self, rng: np.random.Generator, epoch: int) -> bool:
        return bool(rng.random() < self.mosaic) and self.mosaic_active(epoch)

    def _train_sample(
        self,
        rng: np.random.Generator,
        epoch: int,
        index: int,
        ids: np.ndarray,
        draw: GlobalDraw | LSJDraw,
        load: Callable[[int, int], tuple[np.ndarray, int]],
        count: bool = True,
    ) -> Sample:
        def on_bad(err: BadImageError, bad: int, retries: int) -> int:
            self._bad(err, bad, count)
            if retries > self.max_retries:
                raise RuntimeError(f"more than max_retries={self.max_retries} bad images while building "
                                   f"sample {index} (epoch {epoch}); last: {err}") from err
            return other_index(rng, bad, len(self))

        ids, plan, images, reduces = load_tiles(
            ids, lambda tile_ids: self.geometry.plan(draw, self._sizes[tile_ids]), load, on_bad
        )
        return self._finish(rng, ids, plan, images, reduces, flip=draw.flip, count=count)

    def _val_sample(self, index: int) -> Sample:
        plan, scale, pad = self.geometry.letterbox.plan(tuple(self._sizes[index]))
        reduce = choose_reduce(plan.matrices[0])
        orig_size = (int(self._sizes[index, 0]), int(self._sizes[index, 1]))
        try:
            image = self._load(index, reduce)
        except BadImageError as err:
            self._bad(err, index)
            return empty_sample(int(self.index.image_ids[index]), self.image_size, scale, pad, orig_size)
        sample = self._finish(None, np.array([index]), plan, [image], [reduce], flip=False)
        sample.scale, sample.pad, sample.orig_size = float(scale), (float(pad[0]), float(pad[1])), orig_size
        return sample

    def _finish(
        self,
        rng: np.random.Generator | None,
        ids: np.ndarray,
        plan: TilePlan,
        images: list[np.ndarray | None],
        reduces: list[int],
        flip: bool,
        count: bool = True,
    ) -> Sample:
        """Assemble the sample (see :func:`assemble_sample`) and count where its annotations went."""
        visible = visible_tiles(plan)
        crowds = [self._crowd(int(i)) if v else None for i, v in zip(ids, visible)]
        augment = rng is not None
        sample, codes = assemble_sample(
            self.index, ids, plan, images, reduces, crowds, flip=flip,
            transforms=self.transforms if augment else None, rng=rng,
            # Validation crops nothing and keeps tiny instances: losses see every target there.
            min_area_ratio=self.min_area_ratio if augment else 0.0,
            min_box_size=self.min_box_size if augment else 0.0,
            hsv=self.hsv if augment else None,
        )
        for reason, n in zip(DROP_REASONS, np.bincount(codes, minlength=len(DROP_REASONS))):
            if n and count:
                self._count(self.counter, reason, int(n))
        return sample
