"""Where a dataset's pixels come from: the index protocol, a per-worker LRU cache, a per-batch
decode table that decodes each image once per batch.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import replace
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.structures import EncodedImage, Polygons

__all__ = ["BatchDecodes", "FederatedIndex", "ImageIndex", "ImageSource", "LRUCache", "TileDecodes"]


@runtime_checkable
class ImageIndex(Protocol):
    """What :class:`~seg_datamodule.data.samples.dataset.SegDataset` needs from an index (``CocoIndex`` has it)."""

    image_ids: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    #: ``"raise"`` or ``"skip"``: what to do with an image that fails to load.
    on_bad_sample: str

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


@runtime_checkable
class FederatedIndex(Protocol):
    """An index that also knows LVIS's per-image category lists (``CocoIndex`` does)."""

    def neg_labels(self, i: int) -> np.ndarray:
        """int64 (K,) sorted labels verified absent from image ``i``."""
        ...

    def not_exhaustive_labels(self, i: int) -> np.ndarray:
        """int64 (M,) sorted labels whose instances in image ``i`` may not all be annotated."""
        ...


class LRUCache:
    """Per-kind least-recently-used caches of at most ``capacity`` entries each (0: no caching)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kinds: dict[str, OrderedDict[Any, Any]] = {}

    def get(self, kind: str, key: Any, make: Callable[[], Any]) -> Any:
        """The cached value of ``(kind, key)``, made (and kept) on a miss."""
        if self.capacity == 0:
            return make()
        cache = self._kinds.setdefault(kind, OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = make()
        cache[key] = value
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        return value


class ImageSource:
    """An index's images and crowd masks, through a per-worker LRU cache.

    Args:
        index (ImageIndex): where the images come from.
        cache_images (int): entries kept per kind (0: none).
    """

    def __init__(self, index: ImageIndex, cache_images: int) -> None:
        self.index, self.cache_images = index, cache_images
        self._cache: LRUCache | None = None

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_cache": None}  # a worker starts with an empty cache

    def reset(self) -> None:
        """Empty the cache (a new worker)."""
        self._cache = None

    def image(self, i: int, reduce: int, log: Counter[str]) -> np.ndarray:
        """Image ``i`` decoded at ``reduce``; raises ``BadImageError``.

        Cached by ``(i, reduce)``: serving a finer decode would change the pixels, and a sample
        would then depend on what its worker happened to decode before. Every decode (a cache
        miss) adds 1 to ``log["decodes"]``, and to ``log["reduced_decodes"]`` when ``reduce > 1``.
        """
        return self._lru().get("images", (i, reduce), lambda: self._decode(i, reduce, log))

    def crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask (decoded from RLE), or None."""
        return self._lru().get("crowd", i, lambda: self.index.crowd_mask(i))

    def encoded(self, i: int, reduce: int, log: Counter[str]) -> EncodedImage | np.ndarray:
        """``pixels_on_device``: image ``i``'s JPEG file for the device to decode at ``reduce`` (the
        index's ``encoded_image``, header checked), or, for another format, its pixels decoded here
        as :meth:`image` decodes them; raises ``BadImageError`` as :meth:`image` does. Cached and
        counted as :meth:`image` (the device decodes what the workers ship)."""

        def make() -> EncodedImage | np.ndarray:
            reader = getattr(self.index, "encoded_image", None)
            found = None if reader is None else reader(i)
            if found is None:
                return self._decode(i, reduce, log)
            _count_decode(reduce, log)
            return replace(found, reduce=reduce)

        return self._lru().get("encoded", (i, reduce), make)

    def _decode(self, i: int, reduce: int, log: Counter[str]) -> np.ndarray:
        image = self.index.load_image(i, reduce=reduce)
        _count_decode(reduce, log)
        return image

    def _lru(self) -> LRUCache:
        if self._cache is None:
            self._cache = LRUCache(self.cache_images)
        return self._cache


def _count_decode(reduce: int, log: Counter[str]) -> None:
    """One decode at ``reduce`` (made here, or on the device from the bytes shipped)."""
    log["decodes"] += 1
    if reduce > 1:
        log["reduced_decodes"] += 1


class TileDecodes:
    """Decodes for a sample built alone: each tile at its own scale (through the cache).

    Args:
        source (ImageSource): the images.
        log (Counter): where decodes are counted (see :meth:`ImageSource.image`).
        encoded (bool): ``pixels_on_device``: serve :meth:`ImageSource.encoded` instead.
    """

    def __init__(self, source: ImageSource, log: Counter[str], encoded: bool = False) -> None:
        self._source, self._log, self._encoded = source, log, encoded

    def get(self, i: int, reduce: int) -> tuple[np.ndarray | EncodedImage, int]:
        """Image ``i`` at ``reduce``, and ``reduce``; raises ``BadImageError``."""
        return self._fetch(i, reduce), reduce

    def _fetch(self, i: int, reduce: int) -> np.ndarray | EncodedImage:
        """:meth:`ImageSource.image`, or (``encoded``: ``pixels_on_device``) :meth:`ImageSource.encoded`."""
        return (self._source.encoded if self._encoded else self._source.image)(i, reduce, self._log)

    def crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask (through the cache), or None."""
        return self._source.crowd(i)


class BatchDecodes(TileDecodes):
    """The images one batch decodes: each image once, at the finest scale any of its tiles needs.

    A batch's tiles are planned first, so the decode scale of every image is known before any
    decode (:meth:`want`); :meth:`get` then serves every tile that shows the image from that one
    decode. What a batch holds depends only on the batch, never on which worker built it or what
    it built before, so samples stay a pure function of ``(seed, epoch, batch)``. Arguments as
    :class:`TileDecodes`.
    """

    def __init__(self, source: ImageSource, log: Counter[str], encoded: bool = False) -> None:
        super().__init__(source, log, encoded)
        self._wanted: dict[int, int] = {}
        self._done: dict[int, tuple[np.ndarray | EncodedImage, int] | BadImageError] = {}
        self._crowds: dict[int, np.ndarray | None] = {}

    def want(self, i: int, reduce: int) -> None:
        """Record that a tile shows image ``i`` and could take it at ``reduce``."""
        self._wanted[i] = min(reduce, self._wanted.get(i, reduce))

    def get(self, i: int, reduce: int) -> tuple[np.ndarray | EncodedImage, int]:
        """Image ``i`` and the reduction it was decoded at (``<= reduce`` when planned).

        Raises:
            BadImageError: the image failed to load (once decoded, the failure is remembered).
        """
        if i not in self._done:
            r = min(reduce, self._wanted.get(i, reduce))
            try:
                self._done[i] = (self._fetch(i, r), r)
            except BadImageError as err:
                self._done[i] = err
        done = self._done[i]
        if isinstance(done, BadImageError):
            raise done
        return done

    def crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask, decoded from RLE once per batch, or None.

        An image shows in four mosaics of its batch on average; without a cache
        (``cache_images=0``, the COCO-sized case) each would decode its crowd RLE again.
        """
        if i not in self._crowds:
            self._crowds[i] = self._source.crowd(i)
        return self._crowds[i]
