"""What can be wrong with an image file: :class:`BadImageError` and its reason keys.

Bad files raise :class:`BadImageError` naming the file and a ``reason`` key: ``image_missing``
(no such file), ``image_unreadable`` (other OS errors, not a regular file, over the byte limit),
``image_size_mismatch`` (the header's size is not the expected one), ``image_truncated`` (a JPEG without its
end-of-image marker after the scan data, or a file the decoder finds cut short) and
``image_corrupt`` (not decodable). Corruption *inside* JPEG scan data that libjpeg only warns
about yields garbage pixels in every decoder measured; :mod:`seg_datamodule.io.images.decode` cannot
detect it.
"""

from __future__ import annotations

import os

from seg_datamodule.errors import UserInputError

__all__ = ["IMAGE_ERROR_REASONS", "BadImageError"]

#: Reason keys a :class:`BadImageError` carries (also skip-count keys, see ``coco.SKIP_REASONS``).
IMAGE_ERROR_REASONS: tuple[str, ...] = (
    "image_missing",
    "image_unreadable",
    "image_truncated",
    "image_corrupt",
    "image_size_mismatch",
)


class BadImageError(UserInputError, ValueError):
    """An image file that is missing, unreadable, truncated, corrupt or of the wrong size.

    The message names the file (and, when raised through a ``CocoIndex``, the image id); the
    attributes let a dataset in ``on_bad_sample="skip"`` mode count the failure by reason.

    It pickles with its attributes, and it can be rebuilt from its message alone, which is what a
    PyTorch DataLoader does when it re-raises a worker's exception in the main process (the
    message, with the file name, survives; the attributes are then ``None``).

    Attributes:
        path (str | None): the image file.
        reason (str | None): one of :data:`IMAGE_ERROR_REASONS`.
        image_id (int | None): COCO image id, when known.
        image_index (int | None): index of the image in its ``CocoIndex``, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        reason: str | None = None,
        image_id: int | None = None,
        image_index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.reason = reason
        self.image_id = image_id
        self.image_index = image_index
