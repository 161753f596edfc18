"""Training (mosaic) and validation (letterbox) samples over a COCO index.

:class:`SegDataset` turns image indices into :class:`~seg_datamodule.sample.Sample` objects:

* training: a YOLO 4-image mosaic with probability ``mosaic`` (off for the last ``close_mosaic``
  epochs), else the image letterboxed; then a random affine folded into one matrix per tile
  (one resample per pixel, the polygons through the same matrices and exactly clipped, see
  :mod:`seg_datamodule.mosaic`); a horizontal flip; then the user's albumentations pipeline;
* validation (``train=False``): the image letterboxed to ``s x s``, with ``scale``, ``pad`` and
  ``orig_size`` set so predictions map back to the original pixels.

Randomness: each sample draws from its own generator, ``np.random.default_rng([seed, epoch,
index])``, so a batch does not depend on which worker built it: the same seed gives the same
batches for any ``num_workers``, and different samples (hence different workers) draw
differently. ``__getitem__`` accepts ``(epoch, index)`` as yielded by
:class:`~seg_datamodule.sampler.EpochShardSampler`, or a plain index, for which the epoch set by
:meth:`SegDataset.set_epoch` is used (held in shared memory, so persistent workers see it; call
it before the epoch's iterator is created, e.g. in ``on_train_epoch_start``).

Accounting: every annotation of every tile drawn is either in the sample or counted by reason
in :attr:`SegDataset.counts` (see :data:`COUNT_KEYS`), in a :class:`~seg_datamodule.coco.SkipCounter`
shared with the DataLoader workers (the mechanism the index's bad-sample counts use).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal, Protocol, runtime_checkable

import albumentations as A
import cv2
import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from seg_datamodule.data.accounting import SkipCounter
from seg_datamodule.io.images import IMAGE_ERROR_REASONS, BadImageError
from seg_datamodule.ops.checks import check_bool, check_choice, check_int, check_number
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.albu import AlbumentationsTransform
from seg_datamodule.transforms.augment import MosaicAffine
from seg_datamodule.transforms.plan import TilePlan, choose_reduce, visible_tiles
from seg_datamodule.transforms.polygons import DROP_REASONS, drop_reasons, transform_polygons
from seg_datamodule.transforms.warp import FILL_VALUE, warp_tiles

__all__ = ["COUNT_KEYS", "ImageIndex", "SegDataset", "worker_init_fn"]

#: Keys of :attr:`SegDataset.counts`. ``kept`` and the drop reasons of
#: :data:`~seg_datamodule.mosaic.DROP_REASONS` count annotations (once per sample that drew the
#: image); ``bad_image`` counts annotations of images that failed to load; the ``image_*`` keys
#: count the images that failed to load, by :class:`~seg_datamodule.images.BadImageError` reason.
COUNT_KEYS: tuple[str, ...] = (*DROP_REASONS, "bad_image", *IMAGE_ERROR_REASONS)


@runtime_checkable
class ImageIndex(Protocol):
    """What :class:`SegDataset` needs from an index (``seg_datamodule.coco.CocoIndex`` has it)."""

    image_ids: np.ndarray
    heights: np.ndarray
    widths: np.ndarray

    def __len__(self) -> int: ...

    def polygons(self, i: int) -> Polygons:
        """Image ``i``'s target instances in original pixels."""
        ...

    def labels(self, i: int) -> np.ndarray:
        """int64 (N,) contiguous labels of those instances."""
        ...

    def annotation_ids(self, i: int) -> np.ndarray:
        """int64 (N,) their COCO annotation ids."""
        ...

    def crowd_mask(self, i: int) -> np.ndarray | None:
        """bool (H, W) union of crowd regions, or None."""
        ...

    def load_image(self, i: int, reduce: int = 1) -> np.ndarray:
        """uint8 (ceil(H / reduce), ceil(W / reduce), 3) RGB; raises BadImageError."""
        ...


class SegDataset(Dataset[Sample]):
    """Mosaic / random-affine training samples, or letterboxed validation samples.

    Args:
        index (ImageIndex): the images and annotations (a ``CocoIndex``).
        image_size (int): output side ``s`` (square ``s x s``).
        train (bool): training augmentation when True; plain letterbox when False.
        mosaic (float): probability of a 4-image mosaic per training sample.
        close_mosaic (int): switch mosaic off for the last ``close_mosaic`` epochs (needs
            ``max_epochs``).
        max_epochs (int | None): the run's epochs, for ``close_mosaic`` (or
            :meth:`set_max_epochs`).
        degrees (float): random rotation range, degrees.
        translate (float): random translation, fraction of ``s``.
        scale (tuple[float, float]): random scale range.
        shear (float): random shear range, degrees.
        flip_lr (float): probability of a horizontal flip.
        min_area_ratio (float): an instance whose clipped area is below this fraction of its area
            before clipping (both in output pixels) is dropped (reason ``clipped``). 0.1 keeps
            any object with a tenth of it in view, Ultralytics' detection threshold (it uses 0.01
            of the box area for segments); masks here are exact at the borders, so the threshold
            is about whether a fragment still shows the object, not about mask error.
        min_box_size (float): an instance whose clipped box is narrower or lower than this many
            output pixels is dropped (reason ``small_box``).
        transforms (albumentations.BaseCompose | str | None): per-sample albumentations
            pipeline (training only), or a file ``A.load`` reads; see
            :class:`~seg_datamodule.augment.AlbumentationsTransform`.
        seed (int): base seed.
        on_bad_sample (str): ``"raise"`` or ``"skip"`` when an image fails to load (use the
            value the index was built with). Skipping replaces a training tile by another image
            drawn from the sample's generator, and gives an empty (grey, no instances)
            validation sample; both are counted.
        cache_images (int): decoded images (and crowd masks) kept per worker, least recently
            used out; 0 keeps none. Pays off when the dataset, or the part of it a worker sees,
            is small (Ultralytics buffers ``min(n, 8 * batch, 1000)`` images per worker).
        max_retries (int): bad images tolerated per sample before giving up.

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
        train: bool = True,
        mosaic: float = 1.0,
        close_mosaic: int = 0,
        max_epochs: int | None = None,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
        flip_lr: float = 0.5,
        min_area_ratio: float = 0.1,
        min_box_size: float = 2.0,
        transforms: A.BaseCompose | str | None = None,
        seed: int = 0,
        on_bad_sample: Literal["raise", "skip"] = "raise",
        cache_images: int = 0,
        max_retries: int = 10,
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
        # 3. The augmentation stages (they check their own arguments).
        self.geometry = MosaicAffine(
            image_size=image_size,
            degrees=degrees,
            translate=translate,
            scale=scale,
            shear=shear,
            flip_lr=flip_lr,
        )
        self.image_size = self.geometry.image_size
        self.transforms = AlbumentationsTransform(transforms)
        # 4. Shared state: [epoch, max_epochs or -1], read by (persistent) workers.
        self._state = torch.tensor([0, -1 if max_epochs is None else max_epochs], dtype=torch.int64)
        self._state.share_memory_()
        self.counter = SkipCounter(COUNT_KEYS)
        self._cache: dict[str, OrderedDict[Any, Any]] | None = None

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        mode = "train" if self.train else "val"
        return (
            f"SegDataset({len(self)} images, {mode}, image_size={self.image_size}, "
            f"mosaic={self.mosaic}, close_mosaic={self.close_mosaic}, {self.geometry!r}, "
            f"transforms={self.transforms.transforms!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # a worker starts with an empty cache
        state.pop("_state_np", None)  # rebuilt from the (shared) tensor
        return state

    @property
    def epoch(self) -> int:
        """The epoch plain indices use (shared with the workers)."""
        return int(self._state_view()[0])

    def _state_view(self) -> np.ndarray:
        """numpy view of the shared state (reading a numpy scalar is ~50x cheaper than torch's)."""
        view = self.__dict__.get("_state_np")
        if view is None:
            view = self._state.numpy()
            self.__dict__["_state_np"] = view
        return view

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for plain indices; persistent workers see it (shared memory)."""
        self._state[0] = check_int("epoch", epoch, minimum=0)

    def set_max_epochs(self, max_epochs: int) -> None:
        """Set the run's number of epochs, which ``close_mosaic`` counts back from."""
        self.max_epochs = check_int("max_epochs", max_epochs, minimum=1)
        self._state[1] = self.max_epochs

    def mosaic_active(self, epoch: int) -> bool:
        """Whether mosaic may apply in ``epoch`` (training, and not within ``close_mosaic``).

        Raises:
            RuntimeError: ``close_mosaic > 0`` but ``max_epochs`` was never given.
        """
        if not self.train or self.mosaic == 0.0:
            return False
        if self.close_mosaic == 0:
            return True
        max_epochs = int(self._state_view()[1])
        if max_epochs < 0:
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
        """Zero :attr:`counts`."""
        self.counter.reset()

    def generator(self, index: int, epoch: int | None = None) -> np.random.Generator:
        """The generator sample ``index`` of ``epoch`` (default: the current one) draws from."""
        epoch = self.epoch if epoch is None else epoch
        return np.random.default_rng([self.seed, int(epoch), int(index)])

    def on_worker_start(self) -> None:
        """Per-worker reset (called by :func:`worker_init_fn`): an empty image cache."""
        self._cache = None

    # ------------------------------------------------------------------ loading

    def _load(self, i: int, reduce: int) -> np.ndarray:
        """Decode image ``i`` at ``reduce``, through the per-worker cache.

        The cache is keyed by ``(i, reduce)``: serving a finer decode would change the pixels,
        and then a sample would depend on what its worker happened to decode before.
        """
        return self._cached("images", (i, reduce), lambda: self.index.load_image(i, reduce=reduce))

    def _crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask (decoded from RLE), through the per-worker cache."""
        return self._cached("crowd", i, lambda: self.index.crowd_mask(i))

    def _cached(self, kind: str, key: Any, make: Any) -> Any:
        """Per-kind LRU caches of at most ``cache_images`` entries each."""
        if self.cache_images == 0:
            return make()
        if self._cache is None:
            self._cache = {}
        cache = self._cache.setdefault(kind, OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = make()
        cache[key] = value
        while len(cache) > self.cache_images:
            cache.popitem(last=False)
        return value

    def _bad(self, err: BadImageError, i: int) -> None:
        """Count a bad image (and its annotations), or re-raise it."""
        if self.on_bad_sample == "raise":
            raise err
        self.counter.add_error(err)
        self.counter.add("bad_image", len(self.index.labels(i)))

    # ------------------------------------------------------------------ samples

    def __getitem__(self, item: int | tuple[int, int]) -> Sample:
        """One sample.

        Args:
            item: an image index, or ``(epoch, index)`` from ``EpochShardSampler``.

        Returns:
            Sample: ``s x s`` image, clipped polygons in output pixels, boxes from them.

        Raises:
            IndexError: the index is out of range.
            BadImageError: an image fails to load and ``on_bad_sample="raise"``.
            RuntimeError: more than ``max_retries`` bad images in one sample.
        """
        epoch, index = (int(item[0]), int(item[1])) if isinstance(item, tuple) else (self.epoch, int(item))
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} images")
        rng = self.generator(index, epoch)
        if self.train:
            return self._train_sample(rng, epoch, index)
        return self._val_sample(index)

    def _train_sample(self, rng: np.random.Generator, epoch: int, index: int) -> Sample:
        # 1. Draw the geometry: mosaic or not, the other tiles, centre, affine, flip.
        use_mosaic = bool(rng.random() < self.mosaic) and self.mosaic_active(epoch)
        ids = (
            self.geometry.draw_indices(rng, index, len(self))
            if use_mosaic
            else np.array([index], np.int64)
        )
        draw = self.geometry.draw(rng, use_mosaic)
        plan = self.geometry.plan(draw, self._sizes[ids])

        # 2. Decode the visible tiles at the coarsest sufficient JPEG scale; replace bad ones.
        images: list[np.ndarray | None] = [None] * len(ids)
        reduces = [1] * len(ids)
        retries = 0
        k = 0
        visible = visible_tiles(plan)
        while k < len(ids):
            if visible[k]:
                reduces[k] = choose_reduce(plan.matrices[k])
                try:
                    images[k] = self._load(int(ids[k]), reduces[k])
                except BadImageError as err:
                    self._bad(err, int(ids[k]))
                    retries += 1
                    if retries > self.max_retries:
                        raise RuntimeError(
                            f"more than max_retries={self.max_retries} bad images while building "
                            f"sample {index} (epoch {epoch}); last: {err}"
                        ) from err
                    ids[k] = _other_index(rng, int(ids[k]), len(self))
                    plan = self.geometry.plan(draw, self._sizes[ids])
                    visible = visible_tiles(plan)
                    continue
            k += 1
        return self._finish(rng, ids, plan, images, reduces, augment=True, flip=draw.flip)

    def _val_sample(self, index: int) -> Sample:
        plan, scale, pad = self.geometry.letterbox.plan(tuple(self._sizes[index]))
        reduce = choose_reduce(plan.matrices[0])
        orig_size = (int(self._sizes[index, 0]), int(self._sizes[index, 1]))
        try:
            image = self._load(index, reduce)
        except BadImageError as err:
            self._bad(err, index)
            return _empty_sample(int(self.index.image_ids[index]), self.image_size, scale, pad, orig_size)
        sample = self._finish(None, np.array([index]), plan, [image], [reduce], augment=False, flip=False)
        sample.scale, sample.pad, sample.orig_size = float(scale), (float(pad[0]), float(pad[1])), orig_size
        return sample

    def _finish(
        self,
        rng: np.random.Generator | None,
        ids: np.ndarray,
        plan: TilePlan,
        images: list[np.ndarray | None],
        reduces: list[int],
        augment: bool,
        flip: bool,
    ) -> Sample:
        # 3. Pixels: one resample per tile, straight into the output.
        image = warp_tiles(images, plan, reduces)

        # 4. Crowd regions through the same matrices (nearest), if the index keeps them.
        visible = visible_tiles(plan)  # cached on the plan
        crowd_tiles = [self._crowd(int(i)) if v else None for i, v in zip(ids, visible)]
        crowd = None
        if any(c is not None for c in crowd_tiles):
            sel = [k for k, c in enumerate(crowd_tiles) if c is not None]
            sub = TilePlan(plan.matrices[sel], plan.regions[sel], plan.output_size,
                           None if plan.resize is None else plan.resize[sel])
            crowd = warp_tiles(
                [crowd_tiles[k].view(np.uint8) for k in sel],
                sub,
                fill=0,
                interpolation=cv2.INTER_NEAREST,
                out=np.zeros(plan.output_size, np.uint8),
            )

        # 5. Polygons: clip to each tile's region, map, clip to the output.
        labels = np.concatenate([self.index.labels(int(i)) for i in ids]).astype(np.int64)
        ann_ids = np.concatenate([self.index.annotation_ids(int(i)) for i in ids]).astype(np.int64)
        polygons, area_before, area_after = transform_polygons([self.index.polygons(int(i)) for i in ids], plan)

        # 6. Horizontal flip: mirror pixels and vertices (exact; no resample).
        if flip:
            w = plan.output_size[1]
            image = cv2.flip(image, 1, dst=image)  # in place: the canvas is ours
            crowd = None if crowd is None else cv2.flip(crowd, 1, dst=crowd)
            polygons = polygons.flip_lr(w)

        # 7. The user's albumentations pipeline (training only); geometric steps move the
        # vertices as keypoints, then the polygons are clipped to the image again.
        if augment and self.transforms:
            assert rng is not None
            if self.transforms.geometric:
                image, vertices, crowd = self.transforms(rng, image, polygons.vertices, crowd)
                unclipped = Polygons(vertices, polygons.ring_offsets, polygons.instance_offsets)
                polygons = unclipped.clip((0.0, 0.0, float(image.shape[1]), float(image.shape[0])))
                moved, after = unclipped.areas(), polygons.areas()
                # Compound the two clips' ratios: before * (moved / area_after) is the area the
                # final clip should be compared with.
                with np.errstate(divide="ignore", invalid="ignore"):
                    area_before = np.where(area_after > 0, area_before * moved / area_after, area_before)
                area_after = after
            else:
                image = self.transforms(rng, image)[0]

        # 8. Drop what is degenerate, outside, mostly cut off or tiny; count every annotation.
        codes, boxes = drop_reasons(polygons, area_before, area_after, self.min_area_ratio, self.min_box_size)
        for reason, count in zip(DROP_REASONS, np.bincount(codes, minlength=len(DROP_REASONS))):
            if count:
                self.counter.add(reason, int(count))
        keep = codes == 0
        return Sample(
            image=np.ascontiguousarray(image),
            image_id=int(self.index.image_ids[int(ids[0])]),
            polygons=polygons.select(keep),
            labels=labels[keep],
            annotation_ids=ann_ids[keep],
            boxes=boxes[keep].astype(np.float32),
            crowd_mask=None if crowd is None else crowd.astype(bool),
        )


def _other_index(rng: np.random.Generator, bad: int, n: int) -> int:
    """A uniform draw from ``0..n-1`` without ``bad`` (``bad`` itself when it is the only one)."""
    if n < 2:
        return bad
    other = int(rng.integers(0, n - 1))
    return other + (other >= bad)


def _empty_sample(
    image_id: int, image_size: int, scale: float, pad: tuple[float, float], orig_size: tuple[int, int]
) -> Sample:
    return Sample(
        image=np.full((image_size, image_size, 3), FILL_VALUE, np.uint8),
        image_id=image_id,
        polygons=Polygons.empty(),
        labels=np.zeros(0, np.int64),
        annotation_ids=np.zeros(0, np.int64),
        boxes=np.zeros((0, 4), np.float32),
        scale=float(scale),
        pad=(float(pad[0]), float(pad[1])),
        orig_size=orig_size,
    )


def worker_init_fn(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: one thread per worker, a fresh per-worker cache.

    ``cv2.setNumThreads(0)`` and ``torch.set_num_threads(1)`` stop each worker from spawning a
    thread pool per core (with ``W`` workers on ``C`` cores that is ``W x C`` threads fighting).
    No seeding is needed: every sample seeds its own generator (see the module docstring).
    """
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    info = get_worker_info()
    dataset = getattr(info, "dataset", None)
    if hasattr(dataset, "on_worker_start"):
        dataset.on_worker_start()
