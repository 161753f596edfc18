"""Batched JPEG decoding on any torch device, the same pixels as the workers' OpenCV decode.

For issue 53 (pixels on the device) the workers ship a batch's encoded JPEGs and the accelerator
decodes them (:func:`decode_jpegs`) before warping them
(:func:`~seg_datamodule.transforms.kernels.device_warp.warp_tiles_device`). torchvision's batched
``decode_jpeg`` wraps libjpeg-turbo on the CPU, as OpenCV does: the same pixels bit for bit
(``tests/transforms/test_device_warp.py``), except CMYK, converted here as OpenCV converts it.
On CUDA nvJPEG decodes, with its own rounding.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg

from seg_datamodule.io.images.exif import exif_orientation, jpeg_segments

__all__ = ["block_mean", "decode_jpegs"]

_SOF_MARKERS = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def _jpeg_components(data: memoryview) -> int:
    """Components in a JPEG's SOF segment (1 grey, 3 colour, 4 CMYK or YCCK); 0 if not found."""
    for marker, pos, _ in jpeg_segments(data):
        if marker in _SOF_MARKERS:
            return int(data[pos + 9]) if pos + 9 < len(data) else 0
    return 0


def _cmyk_to_rgb(cmyk: torch.Tensor) -> torch.Tensor:
    """OpenCV's CMYK (Adobe, inverted) to RGB, ``k - ((255 - c) * k >> 8)``; torchvision's own
    conversion rounds instead and comes out one grey level above on most pixels."""
    v = cmyk.to(torch.int32)
    k = v[3:4]
    return (k - (((255 - v[:3]) * k) >> 8)).to(torch.uint8)


def _turn(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """``(C, H, W)`` pixels turned for display, as :func:`~seg_datamodule.io.images.exif.apply_orientation`."""
    if orientation >= 5:  # 5-8: transposed, then flipped as 1-4 are
        image, orientation = image.transpose(-2, -1), {5: 1, 6: 2, 7: 3, 8: 4}[orientation]
    dims = {1: (), 2: (-1,), 3: (-2, -1), 4: (-2,)}[orientation]
    return (image.flip(dims) if dims else image).contiguous()


def _batched_decode() -> bool:
    """Whether this torchvision's ``decode_jpeg`` takes a list (0.20 and later; 0.19 takes one tensor)."""
    major, minor = (int(part) for part in torchvision.__version__.split(".")[:2])
    return (major, minor) >= (0, 20)


_BATCHED = _batched_decode()


def _decode(encoded: list[torch.Tensor], mode: ImageReadMode, device: torch.device) -> list[torch.Tensor]:
    """One batched ``decode_jpeg`` call (none for an empty list; one call per image on torchvision 0.19)."""
    if not encoded:
        return []
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its codecs in favour of TorchCodec; they still work.
        warnings.filterwarnings("ignore", ".*decoding and encoding capabilities of TorchVision", DeprecationWarning)
        if _BATCHED:
            return decode_jpeg(encoded, mode=mode, device=device)
        return [decode_jpeg(data, mode=mode, device=device) for data in encoded]


def block_mean(image: torch.Tensor, reduce: int) -> torch.Tensor:
    """Average ``reduce x reduce`` pixel blocks, as :func:`~seg_datamodule.io.images.exif.block_mean`
    does with numpy (bit for bit): the last row and column of blocks partial, means rounded half up.

    Args:
        image (Tensor[C, H, W] uint8): pixels.
        reduce (int): block side.

    Returns:
        Tensor[C, ceil(H / reduce), ceil(W / reduce)] uint8.
    """
    if reduce == 1:
        return image
    c, h, w = image.shape
    rows, cols = -(-h // reduce), -(-w // reduce)
    padded = torch.zeros((c, rows * reduce, cols * reduce), dtype=torch.int32, device=image.device)
    padded[:, :h, :w] = image
    sums = padded.view(c, rows, reduce, cols, reduce).sum(dim=(2, 4), dtype=torch.int32)
    heights = (h - reduce * torch.arange(rows, device=image.device)).clamp(max=reduce)
    widths = (w - reduce * torch.arange(cols, device=image.device)).clamp(max=reduce)
    counts = (heights[:, None] * widths[None, :]).to(torch.int32)
    return torch.div(sums + counts // 2, counts, rounding_mode="floor").to(torch.uint8)


def decode_jpegs(
    encoded: Sequence[torch.Tensor], device: torch.device | str, oriented: Sequence[bool],
    reduces: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Decode a batch of JPEGs to RGB ``uint8`` on ``device``, as the workers' OpenCV decode does.

    One batched ``torchvision.io.decode_jpeg`` call (nvJPEG on CUDA). Grey JPEGs come out grey
    in three channels; CMYK and YCCK ones are decoded on the CPU to four channels and converted
    with OpenCV's formula (torchvision's is one grey level off). EXIF orientation is read from the
    header and applied by torch ops (torchvision applies it on the CPU only). On the CPU the
    pixels equal :func:`~seg_datamodule.io.images.decode.decode_image_bytes` (``oriented`` False) and
    :func:`~seg_datamodule.io.images.exif.decode_oriented` (True) bit for bit.

    Args:
        encoded (Sequence[Tensor[n] uint8]): the files' bytes, on the CPU.
        device (torch.device | str): where the pixels go.
        oriented (Sequence[bool]): per image, apply its EXIF orientation (Ultralytics-style data,
            labels refer to the turned image) or ignore it (COCO: sizes and polygons refer to the
            stored pixels).

        reduces (Sequence[int] | None): per image, average ``r x r`` blocks (:func:`block_mean`)
            where the workers decode ``r`` times smaller: of the turned pixels as
            :func:`~seg_datamodule.io.images.exif.decode_oriented` does (bit for bit), of the stored
            ones in place of libjpeg's scaled IDCT (which it approximates: a mean difference near
            0.4 levels, more than 2 in about 0.2 % of values); None: full size.

    Returns:
        list[Tensor[3, H, W] uint8]: RGB pixels on ``device``, in the order of ``encoded``.

    Raises:
        TypeError: an entry is not a 1-D ``uint8`` CPU tensor.
        ValueError: ``oriented`` (or ``reduces``) and ``encoded`` differ in length.
        RuntimeError: torchvision cannot decode a file (corrupt, or not a JPEG).
    """
    if len(oriented) != len(encoded) or (reduces is not None and len(reduces) != len(encoded)):
        raise ValueError(f"oriented has {len(oriented)} entries (reduces {None if reduces is None else len(reduces)}) "
                         f"but encoded has {len(encoded)}")
    device = torch.device(device)
    for k, data in enumerate(encoded):
        if not (isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.ndim == 1
                and data.device.type == "cpu"):
            raise TypeError(f"encoded[{k}] must be a 1-D uint8 CPU tensor, got {data!r:.80}")
    views = [memoryview(data.numpy()) for data in encoded]
    four = [k for k, view in enumerate(views) if _jpeg_components(view) == 4]
    rest = [k for k in range(len(encoded)) if k not in set(four)]
    out: list[torch.Tensor] = [torch.empty(0)] * len(encoded)
    for k, image in zip(rest, _decode([encoded[k] for k in rest], ImageReadMode.RGB, device)):
        out[k] = image
    # CMYK: the four channels as stored (UNCHANGED), converted as OpenCV converts them.
    for k, image in zip(four, _decode([encoded[k] for k in four], ImageReadMode.UNCHANGED, torch.device("cpu"))):
        out[k] = _cmyk_to_rgb(image) if image.shape[0] == 4 else image.expand(3, -1, -1)
    for k, view in enumerate(views):
        # Turned, then averaged (as decode_oriented does); else averaged as a scaled decode.
        orientation = exif_orientation(view) if oriented[k] else 1
        out[k] = block_mean(_turn(out[k], orientation) if orientation != 1 else out[k],
                            1 if reduces is None else int(reduces[k]))
    # decode_jpeg leaves the pixels on the CPU for any device but CUDA.
    return [image.to(device) for image in out]
