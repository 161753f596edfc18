"""The one pipeline every sample goes through: a recipe executed, samples and counts returned as values.

Read top to bottom, the stages a training sample meets:

1. **Plan-phase draws** (:meth:`Pipeline.draw_tiles`): from the sample's own generator, mosaic or
   not, its tile images (for ``mosaic_partners="batch"``, the batch's other images), the layout's
   draw, then the plan-phase canvas steps (the flip). Nothing is decoded yet.
2. **Plan tiles, decode once** (:meth:`Pipeline._partnered`, :mod:`~seg_datamodule.data.samples.tiles`): a
   batch plans every tile before its first decode, so each image is decoded once, at the finest
   JPEG scale any of its tiles needs; an image that fails to load comes back as an event, replaced
   (``on_bad_sample="skip"``) or raised.
3. **Targets** (:mod:`~seg_datamodule.data.samples.targets`): what the index holds for the tiles' images.
4. **Warp once** (:func:`assemble_sample`): pixels, crowd regions and polygons onto the canvas,
   one resample per tile (a batch transports all its samples' polygons in one pass, and decodes
   each image's crowd regions once); then the **canvas steps** drawn in step 1, the **pixel
   steps** (drawn now, in order), and the **drops**.
5. **Group steps** (copy-paste, MixUp): every sample of the batch mixed with partners from the
   same batch, as they were before any mixing.
6. **Counts**: every method returns its samples *and* their counts (annotations by reason,
   decodes) as values; the dataset adds them to its shared counters and the batch carries them.

Invariants the stages keep:

* every step draws a fixed count of numbers from the sample's generator, in a fixed order (the
  layout, the plan-phase steps, the pixel steps, the group step), whatever it drew;
* a batch is a pure function of ``(seed, epoch, indices)``: same batches for any ``num_workers``,
  under DDP and after a resume;
* one resample per tile: geometry is folded into the plan; canvas steps are exact on the output;
* every annotation is kept or counted with its reason (a drop, ``occluded``, ``bad_image``);
* training, validation, ``__getitem__``, ``__getitems__`` and streaming all come through here.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

import cv2
import numpy as np

from seg_datamodule.data.samples.decoding import BatchDecodes, ImageIndex, ImageSource, TileDecodes
from seg_datamodule.data.config.options import SampleOptions
from seg_datamodule.data.samples.targets import TileTargets, fetch_targets
from seg_datamodule.data.samples.tiles import BadTile, Decoder, TileDraw, TileLoader, Tiles
from seg_datamodule.io.images.decode import IMAGE_ERROR_REASONS, BadImageError
from seg_datamodule.structures import PendingTiles, Polygons, Sample
from seg_datamodule.transforms.kernels.box_only import without_rings
from seg_datamodule.transforms.kernels.plan import TilePlan, choose_reduce, draw_batch_partners, visible_tiles
from seg_datamodule.transforms.kernels.polygons import DROP_REASONS, drop_reasons, transform_polygons, transform_polygons_batch
from seg_datamodule.transforms.recipe import Recipe
from seg_datamodule.transforms.steps import Canvas, CanvasStep, MixResult, draw_canvas_steps
from seg_datamodule.transforms.kernels.warp import FILL_VALUE, warp_tiles

__all__ = ["Counts", "Frame", "Pipeline", "SampleKey", "SampleSteps", "assemble_sample", "empty_sample"]

#: Reason (or decode key) -> count, for one sample or one batch.
Counts = collections.Counter

# Tags the batch partner generator's seed apart from the per-sample ``[seed, epoch, index]`` ones.
_PARTNER_STREAM = 0x6D6F7361


@dataclass(frozen=True)
class SampleKey:
    """Which sample to build.

    Attributes:
        epoch (int): the epoch it belongs to.
        index (int): its image.
        copy (int): which of the image's copies in the epoch (repeat-factor sampling; 0 draws as
            an image drawn once does).
        mosaic_allowed (bool): whether mosaic may apply this epoch (``close_mosaic``).
    """

    epoch: int
    index: int
    copy: int = 0
    mosaic_allowed: bool = False


@dataclass(frozen=True)
class SampleSteps:
    """The per-sample steps of training (validation has none and keeps every instance).

    Attributes:
        pixel_steps (tuple[CanvasStep, ...]): the recipe's pixel steps, drawn and applied in order
            after the plan-phase ones (the user's albumentations pipeline, then YOLO's HSV jitter,
            Ultralytics' order; with ``on_device`` HSV records its gains on the sample instead).
        min_area_ratio (float): drop an instance keeping less than this fraction of its area.
        min_box_size (float): drop an instance whose box is narrower or lower than this.
    """

    pixel_steps: tuple[CanvasStep, ...]
    min_area_ratio: float
    min_box_size: float


@dataclass(frozen=True)
class Frame:
    """Where a letterboxed validation image sits on the canvas (so predictions map back)."""

    scale: float
    pad: tuple[float, float]
    orig_size: tuple[int, int]


class Pipeline:
    """Executes a recipe over one index: training and validation samples, with their counts.

    Args:
        index (ImageIndex): the images and annotations; its ``on_bad_sample`` says whether a bad
            image is replaced (``"skip"``) or raised.
        recipe (Recipe): the steps (its layout also fixes the canvas size and letterboxes validation).
        sampling (SampleOptions): the sample-level numbers that are not steps.
        seed (int): base seed.
        cache_images (int): decoded images (and crowd masks) kept per worker.
        max_retries (int): bad images tolerated per sample before giving up.
    """

    def __init__(self, index: ImageIndex, recipe: Recipe, sampling: SampleOptions, seed: int, cache_images: int,
                 max_retries: int) -> None:
        self.index, self.recipe, self.sampling, self.seed = index, recipe, sampling, seed
        self.geometry = recipe.layout
        self.group = recipe.group if recipe.group is not None and recipe.group.enabled else None
        self.sizes = np.stack([np.asarray(index.heights, np.int64), np.asarray(index.widths, np.int64)], axis=1)
        self.skip_bad = index.on_bad_sample == "skip"
        self.images = ImageSource(index, cache_images)
        self.tiles = TileLoader(self.geometry, self.sizes, self.skip_bad, max_retries)
        self.steps = SampleSteps(recipe.pixel_steps, sampling.min_area_ratio, sampling.min_box_size)
        #: Workers ship JPEG bytes and plans; the device makes the pixels (training samples only).
        self.device_pixels = sampling.pixels_on_device
        #: When a list: per sample built, (annotation ids, DROP_REASONS codes) of the instances dropped.
        self.drop_log: list[tuple[np.ndarray, np.ndarray]] | None = None

    def generator(self, key: SampleKey) -> np.random.Generator:
        """The generator sample ``key`` draws from: ``default_rng([seed, epoch, index(, copy)])``."""
        return np.random.default_rng([self.seed, key.epoch, key.index, *([key.copy] if key.copy else [])])


    # ------------------------------------------------------------------ training

    def draw_tiles(self, rng: np.random.Generator, key: SampleKey, ids: np.ndarray | None = None) -> TileDraw:
        """The sample's tiles: mosaic or not (one draw, always), its images (``ids``, or drawn
        uniformly over the dataset for a mosaic), the layout, then the plan-phase canvas steps."""
        mosaic = bool(rng.random() < self.sampling.mosaic) and key.mosaic_allowed
        if ids is None:
            ids = (self.geometry.draw_indices(rng, key.index, len(self.sizes)) if mosaic
                   else np.array([key.index], np.int64))
        elif not mosaic:
            ids = ids[:1]
        draw = self.geometry.draw(rng, mosaic)
        return TileDraw(ids, draw, draw_canvas_steps(self.recipe.canvas_steps, rng))

    def _alone(self, key: SampleKey, counts: Counts, decodes: Counts) -> tuple[np.random.Generator, Sample]:
        rng = self.generator(key)
        tiles = self.draw_tiles(rng, key)
        return rng, self._build(rng, key, tiles, TileDecodes(self.images, decodes, self.device_pixels), counts)

    def _partnered(self, keys: Sequence[SampleKey], counts: Counts) -> tuple[list[np.random.Generator], list[Sample]]:
        """The batch's samples before mixing, mosaic partners from the batch; and their generators."""
        # 1. Partners: positions of other batch images, from the batch's own generator.
        indices = np.array([key.index for key in keys], np.int64)
        batch_rng = np.random.default_rng([self.seed, keys[0].epoch, _PARTNER_STREAM, *indices.tolist()])
        partners = draw_batch_partners(batch_rng, len(keys))
        # 2. Per sample, from its own generator: mosaic or not, then the geometry.
        rngs = [self.generator(key) for key in keys]
        draws = [self.draw_tiles(rng, key, indices[np.concatenate([[b], partners[b]])])
                 for b, (rng, key) in enumerate(zip(rngs, keys))]
        # 3. Every tile planned before any decode, so each image is decoded once at the finest
        # scale it needs.
        decoder = BatchDecodes(self.images, counts, self.device_pixels)
        plans = [self.tiles.plan(tiles) for tiles in draws]
        for tiles, plan in zip(draws, plans):
            for k in np.flatnonzero(visible_tiles(plan)):
                decoder.want(int(tiles.ids[k]), choose_reduce(plan.matrices[k]))
        # 4. Each sample's tiles loaded with its plan (a plan is a function of the draw alone),
        # the batch's polygons transported in one pass, then each sample assembled.
        loaded = [self._load(rng, key, tiles, decoder, counts, plan)
                  for rng, key, tiles, plan in zip(rngs, keys, draws, plans)]
        moved = transform_polygons_batch([list(targets.polygons) for _, targets in loaded],
                                         [tiles.plan for tiles, _ in loaded])  # type: ignore[misc]
        return rngs, [self._assemble(rng, tiles, targets, draw, counts, transported)
                      for rng, draw, (tiles, targets), transported in zip(rngs, draws, loaded, moved)]

    def _load(self, rng: np.random.Generator, key: SampleKey, draw: TileDraw, decoder: Decoder, counts: Counts,
              plan: TilePlan | None = None) -> tuple[Tiles, TileTargets]:
        """A sample's tiles (bad images settled) and what the index holds for them."""
        tiles = self.tiles.load(draw, decoder, rng, f"sample {key.index} (epoch {key.epoch})", plan)
        self._settle(tiles.bad, counts)
        return tiles, fetch_targets(self.index, decoder, tiles.ids, tiles.visible)

    def _assemble(self, rng: np.random.Generator, tiles: Tiles, targets: TileTargets, draw: TileDraw,
                  counts: Counts, transported: tuple[Polygons, np.ndarray, np.ndarray] | None = None) -> Sample:
        sample, codes = assemble_sample(tiles, targets, self.steps, rng, draw.canvas, transported=transported,
                                        pixels_on_device=self.device_pixels)
        _count_codes(codes, counts)
        if self.drop_log is not None:  # `seg-datamodule inspect`: which annotation went, and why
            self.drop_log.append((targets.annotation_ids[codes > 0], codes[codes > 0]))
        return sample

    def _build(self, rng: np.random.Generator, key: SampleKey, draw: TileDraw, decoder: Decoder,
               counts: Counts) -> Sample:
        tiles, targets = self._load(rng, key, draw, decoder, counts)
        return self._assemble(rng, tiles, targets, draw, counts)

    def train_batch(self, keys: Sequence[SampleKey]) -> tuple[list[Sample], Counts]:
        """A training batch (two or more keys), mosaic partners as ``sampling.mosaic_partners`` says."""
        counts: Counts = Counts(samples=len(keys))
        if self.sampling.mosaic_partners == "batch":
            rngs, samples = self._partnered(keys, counts)
        else:
            rngs, samples = [], []
            for key in keys:
                rng, sample = self._alone(key, counts, counts)
                rngs.append(rng)
                samples.append(sample)
        if self.group is not None:
            samples = [_count_mix(result, counts) for result in self.group.mix_group(rngs, samples)]
        return samples, counts

    def train_one(self, key: SampleKey) -> tuple[Sample, Counts]:
        """One training sample built alone: mosaic and mixing partners uniform over the dataset."""
        counts: Counts = Counts(samples=1)
        rng, sample = self._alone(key, counts, counts)
        if self.group is None:
            return sample, counts
        # Built alone, the partners come from the dataset: built the same way, their decodes
        # counted, their annotations not (only the targets they lend are, as pasted / mixed in).
        n = len(self.sizes)

        def partner(shift: int) -> Sample:
            return self._alone(SampleKey(key.epoch, (key.index + shift) % n, 0, key.mosaic_allowed), Counts(), counts)[1]

        return _count_mix(self.group.mix_one(rng, sample, n, partner), counts), counts

    # ------------------------------------------------------------------ validation

    def letterboxed(self, i: int) -> tuple[Sample, Counts]:
        """Image ``i`` letterboxed to ``s x s``, every instance kept (validation, test)."""
        counts: Counts = Counts(samples=1)
        plan, scale, pad = self.geometry.letterbox.plan(tuple(self.sizes[i]))
        frame = Frame(float(scale), (float(pad[0]), float(pad[1])), (int(self.sizes[i, 0]), int(self.sizes[i, 1])))
        reduce = choose_reduce(plan.matrices[0])
        try:
            image = self.images.image(i, reduce, counts)
        except BadImageError as err:
            self._settle((BadTile(i, err),), counts)
            return empty_sample(int(self.index.image_ids[i]), self.geometry.image_size, frame), counts
        tiles = Tiles(np.array([i], np.int64), plan, (image,), (reduce,))
        targets = fetch_targets(self.index, self.images, tiles.ids, tiles.visible)
        sample, codes = assemble_sample(tiles, targets, None, None, frame=frame)
        _count_codes(codes, counts)
        return sample, counts

    # ------------------------------------------------------------------ bad images

    def _settle(self, bad: Sequence[BadTile], counts: Counts) -> None:
        """Raise the first bad image (``on_bad_sample="raise"``), or count each with its annotations."""
        for event in bad:
            if not self.skip_bad:
                raise event.error
            reason = event.error.reason
            counts[reason if reason in IMAGE_ERROR_REASONS else "image_corrupt"] += 1
            counts["bad_image"] += len(self.index.labels(event.index))


def assemble_sample(
    tiles: Tiles,
    targets: TileTargets,
    steps: SampleSteps | None,
    rng: np.random.Generator | None,
    drawn: tuple[tuple[CanvasStep, object], ...] = (),
    frame: Frame | None = None,
    transported: tuple[Polygons, np.ndarray, np.ndarray] | None = None,
    pixels_on_device: bool = False,
) -> tuple[Sample, np.ndarray]:
    """Warp the tiles into one canvas and carry every instance of every tile through.

    Args:
        tiles (Tiles): the decoded tiles and their plan.
        targets (TileTargets): the tiles' instances and crowd regions.
        steps (SampleSteps | None): training's per-sample steps; None (validation) runs none
            and drops only degenerate or outside instances.
        rng (numpy.random.Generator | None): the sample's generator, for ``steps``.
        drawn (tuple[tuple[CanvasStep, object], ...]): the canvas steps drawn in the plan phase
            (the flip) with their parameters, applied in order after the warp.
        frame (Frame | None): where a letterboxed image sits (validation).
        transported (tuple[Polygons, ndarray, ndarray] | None): what
            :func:`~seg_datamodule.transforms.kernels.polygons.transform_polygons` gives for these
            targets and plan, when the caller transported a whole batch at once; None does it here.
        pixels_on_device (bool): ``tiles`` hold encoded files (or full-size pixels) for the device:
            no warp here; the sample's ``pending`` carries them, its plan and its flips, and its
            ``image`` is a read-only stand-in of the canvas's size.

    Returns:
        sample (Sample): the kept instances.
        codes (ndarray[N] int64): per instance of every tile, 0 if kept or the index of its
            drop reason in :data:`~seg_datamodule.transforms.kernels.polygons.DROP_REASONS`.
    """
    plan = tiles.plan
    assert plan is not None, "a load ended by a bad image has no plan"
    # 1. Pixels: one resample per tile, straight into the output (or, on the device, later).
    pending = None
    if pixels_on_device:
        image = np.broadcast_to(np.uint8(FILL_VALUE), (*plan.output_size, 3))
        pending = PendingTiles(tiles.ids.copy(), tuple(tiles.images), tuple(tiles.reduces), plan.matrices,
                               plan.regions, plan.resize)
    else:
        image = warp_tiles(list(tiles.images), plan, list(tiles.reduces))  # type: ignore[arg-type]

    # 2. Crowd regions through the same matrices (nearest), if the index keeps them.
    crowd = None
    if any(c is not None for c in targets.crowds):
        sel = [k for k, c in enumerate(targets.crowds) if c is not None]
        sub = TilePlan(plan.matrices[sel], plan.regions[sel], plan.output_size,
                       None if plan.resize is None else plan.resize[sel])
        crowd = warp_tiles([targets.crowds[k].view(np.uint8) for k in sel], sub, fill=0,  # type: ignore[union-attr]
                           interpolation=cv2.INTER_NEAREST, out=np.zeros(plan.output_size, np.uint8))

    # 3. Polygons: clip to each tile's region, map, clip to the output.
    polygons, area_before, area_after = (transform_polygons(list(targets.polygons), plan) if transported is None
                                         else transported)

    canvas = Canvas(image, polygons, crowd, area_before, area_after, pending=pending)
    # 4. The canvas steps drawn before decode (the flip): exact on the output, no resample.
    for step, params in drawn:
        canvas = step.apply(canvas, params)

    # 5. The pixel steps (training only), each drawn now, in order: albumentations, then HSV
    # (Ultralytics' order; HSV drawn after every other draw, so setting it changes no other).
    if steps is not None and rng is not None:
        for step in steps.pixel_steps:
            canvas = step.apply(canvas, step.draw(rng))
    image, polygons, crowd = canvas.image, canvas.polygons, canvas.crowd
    area_before, area_after, hsv_gains = canvas.area_before, canvas.area_after, canvas.hsv_gains

    # 6. Drop what is degenerate, outside, mostly cut off or tiny (validation keeps tiny instances:
    # losses see every target there).
    min_area_ratio, min_box_size = (0.0, 0.0) if steps is None else (steps.min_area_ratio, steps.min_box_size)
    codes, boxes = drop_reasons(polygons, area_before, area_after, min_area_ratio, min_box_size)
    keep = codes == 0
    # 7. Box-only instances kept their box: now they lose the rectangle that carried it.
    has_mask = None if targets.has_mask is None else targets.has_mask[keep]
    kept = polygons.select(keep) if has_mask is None else without_rings(polygons.select(keep), has_mask)
    sample = Sample(
        image=image if canvas.pending is not None else np.ascontiguousarray(image),
        image_id=targets.image_id,
        polygons=kept,
        has_mask=None if has_mask is None or has_mask.all() else has_mask,
        labels=targets.labels[keep],
        annotation_ids=targets.annotation_ids[keep],
        boxes=boxes[keep].astype(np.float32),
        crowd_mask=None if crowd is None else crowd.astype(bool),
        hsv_gains=hsv_gains,
        neg_labels=targets.neg_labels,
        not_exhaustive_labels=targets.not_exhaustive_labels,
        pending=canvas.pending,
        **({} if frame is None else {"scale": frame.scale, "pad": frame.pad, "orig_size": frame.orig_size}),
    )
    return sample, codes


def empty_sample(image_id: int, image_size: int, frame: Frame) -> Sample:
    """A grey validation sample without instances, standing in for an image that failed to load."""
    return Sample(
        image=np.full((image_size, image_size, 3), FILL_VALUE, np.uint8),
        image_id=image_id,
        polygons=Polygons.empty(),
        labels=np.zeros(0, np.int64),
        annotation_ids=np.zeros(0, np.int64),
        boxes=np.zeros((0, 4), np.float32),
        scale=frame.scale,
        pad=frame.pad,
        orig_size=frame.orig_size,
    )


def _count_codes(codes: np.ndarray, counts: Counts) -> None:
    """Count each instance as ``kept`` or by its drop reason."""
    for reason, n in zip(DROP_REASONS, np.bincount(codes, minlength=len(DROP_REASONS))):
        if n:
            counts[reason] += int(n)


def _count_mix(result: MixResult, counts: Counts) -> Sample:
    """Count what mixing added (``pasted``, ``mixed_in``) and took (``occluded``) as targets."""
    for key, n in (("pasted", result.pasted), ("mixed_in", result.mixed_in), ("occluded", result.occluded),
                   ("kept", result.pasted + result.mixed_in - result.occluded)):
        if n:
            counts[key] += n
    return result.sample
