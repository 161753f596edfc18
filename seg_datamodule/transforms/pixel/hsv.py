"""YOLO's HSV gain jitter: the one step, and its two kernels (numpy in the workers, torch on a device).

:class:`HSVJitter` is the step: it holds the gain ranges, draws each sample's three gains from the
sample's own generator (so they do not depend on the worker that builds it) and applies them in
the worker (:func:`hsv_jitter`, OpenCV) or records them on the canvas for the device.
:func:`hsv_jitter_batch_` applies gains to a ``(B, 3, H, W)`` uint8 batch in place, on whatever
device the batch is on, and gives what :func:`hsv_jitter` gives for the same
gains: it follows OpenCV's 8-bit ``RGB2HSV`` integer arithmetic exactly, the same lookup tables
(built in float64 as numpy builds them), and OpenCV's SIMD ``HSV2RGB`` float arithmetic (its
fused multiply-adds emulated in float64, its final truncation), so on the x86 OpenCV builds this
was checked on the two agree bit for bit over every possible pixel; other builds may differ by
one grey level (they round, or do not fuse).

On the CPU the kernel runs on :data:`CPU_THREADS` threads of its own (torch's count is restored
after): its lookups gain little from more, and torch's OpenMP team waits for a thread whose core
another process holds, which turned 0.25 s per 32 x 640^2 batch into 4-8 s (issue 35;
``benchmarks/bench_hsv_contention.py``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
from typing import Any, ClassVar, Iterator, Sequence

import cv2
import numpy as np
import torch

from seg_datamodule.ops.checks import check_number
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, step_arguments

__all__ = ["CPU_THREADS", "HSVJitter", "apply_pending_hsv", "hsv_jitter", "hsv_jitter_batch_", "hsv_luts"]

_SHIFT = 12  # OpenCV's fixed-point shift in RGB2HSV_b
_ROUND = 1 << (_SHIFT - 1)
_LEVELS = np.arange(256, dtype=np.float64)
# OpenCV's RGB2HSV_b tables: saturate_cast<int>((255 << 12) / i) and ((180 << 12) / (6 i)), 0 at 0.
_SDIV = np.concatenate([[0], np.rint((255 << _SHIFT) / _LEVELS[1:])]).astype(np.int32)
_HDIV = np.concatenate([[0], np.rint((180 << _SHIFT) / (6.0 * _LEVELS[1:]))]).astype(np.int32)
# Per sector of the hue circle, which of (v, v(1-s), v(1-sf), v(1-s(1-f))) is R, G and B.
_SECTOR_TABS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))
# The float32 constants OpenCV's HSV2RGB_b uses (6.0f / 180, 1.0f / 255.0f, 255.0f).
_HSCALE = float(np.float32(6.0) / np.float32(180.0))
_INV255 = float(np.float32(1.0) / np.float32(255.0))
#: Pixels per chunk off the CPU: 32 images of 640 x 640 in one pass (one launch per op).
_DEVICE_CHUNK_PIXELS = 1 << 24
#: Threads of the CPU kernel (see the module docstring): one keeps its cost when cores are contended.
CPU_THREADS = 1


def hsv_jitter(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """YOLO's HSV jitter: shift hue, scale saturation and value, with lookup tables.

    Args:
        image (ndarray[H, W, 3] uint8): RGB image.
        gains (ndarray[3] float): hue shift as a fraction of the hue circle, and saturation and
            value gains minus one (``0`` changes nothing), as Ultralytics' ``RandomHSV`` draws them.

    Returns:
        ndarray[H, W, 3] uint8: the jittered RGB image (a new array).
    """
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((1, 256, 3), np.uint8)
    lut[0, :, 0] = ((x + gains[0] * 180) % 180).astype(np.uint8)
    lut[0, :, 1] = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    lut[0, :, 2] = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    lut[0, 0, 1] = 0  # keep pure greys grey (Ultralytics 8.3.79)
    # One 3-channel lookup in place: half the cost of split / 3 x LUT / merge.
    cv2.LUT(hsv, lut, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=hsv)


class HSVJitter(CanvasStep):
    """YOLO's HSV jitter as a pixel step: each sample's gains ``uniform(-1, 1, 3) * (h, s, v)``.

    The draw is Ultralytics' ``RandomHSV`` one, in float64, from the generator passed in. It runs
    last, after the albumentations step (Ultralytics' order), and draws after every other
    per-sample step, so setting it changes no other augmentation.

    Args:
        gains (Sequence[float]): ``(hgain, sgain, vgain)``: hue shift range as a fraction of the
            hue circle (YOLO ``hsv_h``, 0.015), saturation and value gain ranges (``hsv_s`` 0.7,
            ``hsv_v`` 0.4).
        on_device (bool): the workers only draw the gains and ship them in the batch
            (``DetectionBatch.hsv_gains``) for :func:`hsv_jitter_batch_` on the accelerator;
            False jitters in the workers.

    Raises:
        TypeError: ``gains`` is not a sequence of three numbers, or ``on_device`` not a bool.
        ValueError: a gain is negative or not finite.
    """

    phase: ClassVar[DrawPhase] = "pixels"

    def __init__(self, gains: Sequence[float] = (0.015, 0.7, 0.4), on_device: bool = False) -> None:
        with step_arguments("HSVJitter"):
            if isinstance(gains, (str, bytes)) or not isinstance(gains, Sequence) or len(gains) != 3:
                raise TypeError(f"hsv must be three numbers (hgain, sgain, vgain), got {gains!r}")
            h, s, v = (check_number(f"hsv {name}", g) for name, g in zip(("hgain", "sgain", "vgain"), gains))
            if not isinstance(on_device, bool):
                raise TypeError(f"hsv_on_device must be a bool, got {on_device!r}")
            self.gains = (h, s, v)
            self.on_device = on_device

    def __repr__(self) -> str:
        return f"HSVJitter(gains={self.gains}, on_device={self.on_device})"

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One sample's gains, ``float64 (3,)`` (three numbers drawn from ``rng``)."""
        return rng.uniform(-1, 1, 3) * self.gains

    def apply(self, canvas: Canvas, params: np.ndarray) -> Canvas:
        """Jitter the canvas with the gains ``params`` (:func:`hsv_jitter`), or, ``on_device``,
        record them on it for :func:`hsv_jitter_batch_` on the accelerator."""
        if self.on_device:
            return replace(canvas, hsv_gains=params)
        return replace(canvas, image=hsv_jitter(canvas.image, params))


def hsv_luts(gains: torch.Tensor) -> torch.Tensor:
    """Each image's hue, saturation and value lookup tables, as ``hsv_jitter`` builds them.

    Built in float64 (on the CPU when the device has no float64, as MPS) so every entry equals
    numpy's: a hue entry one off would turn a saturated pixel by 2 degrees, up to 9 grey levels.

    Args:
        gains (Tensor[B, 3] float64): hue shift (fraction of the circle), saturation and value
            gains minus one.

    Returns:
        Tensor[B, 3, 256] uint8 on ``gains.device``.
    """
    device = gains.device
    g = gains.to("cpu" if device.type == "mps" else device, torch.float64)
    x = torch.from_numpy(_LEVELS).to(g.device)
    hue = torch.remainder(x + g[:, 0:1] * 180, 180)
    sat = torch.clamp(x * (g[:, 1:2] + 1), 0, 255)
    val = torch.clamp(x * (g[:, 2:3] + 1), 0, 255)
    luts = torch.stack([hue, sat, val], dim=1).to(torch.uint8)
    luts[:, 1, 0] = 0  # pure greys stay grey (Ultralytics 8.3.79)
    return luts.to(device)


def _rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit RGB -> HSV (hue in ``0..179``), in int32: ``(3, P)`` -> ``(3, P)``."""
    r, g, b = rgb.unbind(0)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    s = (diff * torch.from_numpy(_SDIV)[v] + _ROUND) >> _SHIFT
    # The first of r, g, b that holds the maximum decides the sector, as in OpenCV.
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * torch.from_numpy(_HDIV)[diff] + _ROUND) >> _SHIFT
    h = torch.where(h < 0, h + 180, h)
    return torch.stack([h, s, v])


def _hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """OpenCV's SIMD 8-bit HSV -> RGB, in float32 as it computes: ``(3, P)`` int -> ``(3, P)`` int32."""
    h, s, v = hsv.to(torch.float32).unbind(0)
    h = h * _HSCALE
    s = s * _INV255
    v = v * _INV255
    sector = torch.trunc(h)
    f = h - sector

    def one_minus_s_times(t: torch.Tensor) -> torch.Tensor:
        # OpenCV's x86 build fuses 1 - s * t into one rounding; the product is exact in float64.
        return (1 - s.double() * t.double()).float()

    tabs = torch.stack([v, v * (1 - s), v * one_minus_s_times(f), v * one_minus_s_times(1 - f)])
    pick = torch.tensor(_SECTOR_TABS)[sector.long() % 6].T  # (3, P): which tab is R, G, B
    # OpenCV's SIMD path truncates (its scalar tail, under 32 pixels of an image, rounds).
    return torch.trunc(torch.gather(tabs, 0, pick) * 255.0).clamp_(0, 255).to(torch.int32)


def _pack(channels: torch.Tensor) -> torch.Tensor:
    """``(3, P)`` values ``0..255`` -> ``(P,)`` int32 ``c0 << 16 | c1 << 8 | c2``."""
    c = channels.to(torch.int32)
    return (c[0] << 16) | (c[1] << 8) | c[2]


@functools.lru_cache(maxsize=None)
def _cpu_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Every colour's HSV and every HSV's colour, computed once (about a second on one core).

    Returns:
        rgb_to_hsv (Tensor[2^24] int32): at ``r << 16 | g << 8 | b``, ``h << 16 | s << 8 | v``.
        hsv_to_rgb (Tensor[181 << 16] int32): at ``h << 16 | s << 8 | v`` (``h`` up to 180, a
        hue table may hold it), ``r << 16 | g << 8 | b``.
    """
    codes = torch.arange(1 << 24, dtype=torch.int32)
    rgb = torch.stack([codes >> 16, (codes >> 8) & 255, codes & 255])
    rgb_to_hsv = torch.cat([_pack(_rgb_to_hsv(part)) for part in rgb.split(1 << 20, dim=1)])
    hsv = rgb[:, : 181 << 16]
    hsv_to_rgb = torch.cat([_pack(_hsv_to_rgb(part)) for part in hsv.split(1 << 20, dim=1)])
    return rgb_to_hsv, hsv_to_rgb


_DEVICE_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_cpu_tables` on ``device`` (copied there once; 112 MiB)."""
    if device not in _DEVICE_TABLES:
        _DEVICE_TABLES[device] = tuple(t.to(device) for t in _cpu_tables())  # type: ignore[assignment]
    return _DEVICE_TABLES[device]


def hsv_jitter_batch_(images: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """YOLO's HSV jitter on a batch, in place, on the batch's device.

    Equals :func:`hsv_jitter` applied to each image with its
    gains, within one grey level per channel (bit for bit where OpenCV fuses multiply-adds and
    truncates, as its x86 SIMD build does); greys stay grey. Per pixel it is two lookups in
    tables of every colour (built once per process, on the CPU, and kept on each device) and
    three in the image's own hue, saturation and value tables.

    Args:
        images (Tensor[B, 3, H, W] uint8): RGB images, any memory format; overwritten.
        gains (Tensor[B, 3] float): per image, the hue shift (fraction of the hue circle) and the
            saturation and value gains minus one (``HSVJitter.draw``); float64 gives the lookup
            tables ``hsv_jitter`` builds from the same numbers.

    Returns:
        Tensor[B, 3, H, W] uint8: ``images``.

    Raises:
        ValueError: ``images`` is not ``(B, 3, H, W)`` uint8 or ``gains`` not ``(B, 3)``.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be uint8 (B, 3, H, W), got {images.dtype} {tuple(images.shape)}")
    if gains.shape != (images.shape[0], 3):
        raise ValueError(f"gains must be ({images.shape[0]}, 3) for {images.shape[0]} images, got {tuple(gains.shape)}")
    batch, _, height, width = images.shape
    if batch == 0 or height * width == 0:
        return images
    rgb_to_hsv, hsv_to_rgb = _tables(images.device)
    on_cpu = images.device.type == "cpu"
    with _threads(CPU_THREADS if on_cpu else None):
        _jitter(images, hsv_luts(gains).to(torch.int32).view(-1), rgb_to_hsv, hsv_to_rgb, on_cpu)
    return images


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """Run the block on ``count`` torch threads (None: as they are), restoring the count after."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _jitter(images: torch.Tensor, luts: torch.Tensor, rgb_to_hsv: torch.Tensor, hsv_to_rgb: torch.Tensor,
            on_cpu: bool) -> None:
    """The lookups of :func:`hsv_jitter_batch_`; ``luts`` each image's three tables side by side
    (entry ``c * 256 + x`` of image ``b`` at ``(3 b + c) * 256 + x``)."""
    batch, _, height, width = images.shape
    # The CPU goes image by image (its temporaries stay in cache); accelerators in few passes.
    step = 1 if on_cpu else max(1, _DEVICE_CHUNK_PIXELS // (height * width))
    for start in range(0, batch, step):
        chunk = images[start : start + step]
        n = chunk.shape[0]
        rgb = chunk.permute(1, 0, 2, 3).reshape(3, n * height * width)
        hsv = rgb_to_hsv.index_select(0, _pack(rgb)).view(n, height * width)
        base = torch.arange(start, start + n, device=images.device, dtype=torch.int32)[:, None] * 768
        jittered = [luts.index_select(0, (((hsv >> shift) & 255) + (base + 256 * c)).view(-1))
                    for c, shift in enumerate((16, 8, 0))]
        out = hsv_to_rgb.index_select(0, _pack(torch.stack(jittered)))
        for c, shift in enumerate((16, 8, 0)):
            chunk[:, c].copy_(((out >> shift) & 255).view(n, height, width))


def apply_pending_hsv(batch: Any) -> Any:
    """Apply a ``DetectionBatch``'s pending ``hsv_gains`` to its images in place, then clear them.

    What ``COCOSegDataModule.on_after_batch_transfer`` runs on the batch's device; anything
    without pending gains (validation batches, other types) passes unchanged.

    Args:
        batch: a ``DetectionBatch`` (or anything else).

    Returns:
        ``batch``, with ``images`` jittered and ``hsv_gains`` set to ``None``.
    """
    gains = getattr(batch, "hsv_gains", None)
    if gains is not None:
        hsv_jitter_batch_(batch.images, gains)
        batch.hsv_gains = None  # applied: a second call changes nothing
    return batch
