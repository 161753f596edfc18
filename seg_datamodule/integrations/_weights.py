"""Pretrained weights into a model: read a state_dict without unpickling, keep what fits, say what not.

Both integrations start from pretrained weights whose head rarely fits the user's classes (COCO's
80 or 91 against the dataset's ``num_classes``). As Ultralytics' ``intersect_dicts`` and
torchvision's fine-tuning recipe do, every tensor whose name and shape match is loaded and the
rest keep the model's own initialisation; :class:`Transfer` records which, and its
:meth:`~Transfer.summary` names them. A file of which less than half fits is refused: that is a
checkpoint of another architecture, not a head to re-learn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from seg_datamodule.errors import UserInputError

__all__ = ["Transfer", "WeightsFileError", "load_matching", "match_state_dict", "read_state_dict"]

#: The fewest of a model's tensors a weights file must fill (see the module docstring).
MIN_FILLED = 0.5


class WeightsFileError(UserInputError, ValueError):
    """A weights file that is missing, not a state_dict, or for another model."""


@dataclass(frozen=True)
class Transfer:
    """What a weights file gave a model.

    Attributes:
        source: the file or weights name, for messages.
        loaded: the model's tensors taken from the file.
        skipped: ``(name, file shape, model shape)`` of the tensors both have in different shapes
            (a head for another number of classes); the model keeps its own.
        missing: the model's tensors the file lacks (they keep the model's own).
        unexpected: the file's tensors the model lacks (ignored).
    """

    source: str
    loaded: tuple[str, ...]
    skipped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]

    def summary(self, shown: int = 4) -> str:
        """One paragraph: how many tensors were loaded, and the first ``shown`` of each other kind."""
        total = len(self.loaded) + len(self.skipped) + len(self.missing)
        parts = [f"{self.source} fills {len(self.loaded)} of the model's {total} tensors"]
        if self.skipped:
            under = _common_prefix([n for n, _, _ in self.skipped])
            names = ", ".join(f"{n} {tuple(a)} in the file, {tuple(b)} here" for n, a, b in self.skipped[:shown])
            more = f" and {len(self.skipped) - shown} more" if len(self.skipped) > shown else ""
            parts.append(f"skipped {len(self.skipped)} of another shape{f' (all under {under})' if under else ''}, "
                         f"which start from this model's initialisation: {names}{more}")
        for what, names in (("not in the file", self.missing), ("in the file only, ignored", self.unexpected)):
            if names:
                more = f" and {len(names) - shown} more" if len(names) > shown else ""
                parts.append(f"{len(names)} {what}: {', '.join(names[:shown])}{more}")
        return "; ".join(parts)


def _common_prefix(names: list[str]) -> str:
    """The dotted module path all ``names`` share (``"model.23.cv3"``), or ``""``."""
    parts = [n.split(".")[:-1] for n in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common)


def read_state_dict(path: str, what: str = "weights file") -> dict[str, Tensor]:
    """A ``state_dict`` file, read with ``torch.load(weights_only=True)``: nothing in it is executed.

    Args:
        path: the file.
        what: how messages name it (the argument it came from).

    Returns:
        The names and tensors, on the CPU.

    Raises:
        WeightsFileError: the file is missing, is not a plain state_dict (a pickled object
            included), or holds something other than names and tensors.
    """
    if not os.path.isfile(path):
        raise WeightsFileError(f"{what} {path!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for pickled objects, RuntimeError for a broken archive
        raise WeightsFileError(
            f"{what} {path!r} is not a plain state_dict (read with weights_only=True): {err}"
        ) from err
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                 for k, v in state.items()):
        raise WeightsFileError(f"{what} {path!r} must hold a state_dict (names -> tensors)")
    return dict(state)


def match_state_dict(model_state: Mapping[str, Tensor], file_state: Mapping[str, Tensor], source: str) -> Transfer:
    """Which of ``file_state`` fits ``model_state``: equal name and shape (Ultralytics' ``intersect_dicts``).

    A ``num_batches_tracked`` the model does not have is dropped silently, as torchvision's
    ``FrozenBatchNorm2d`` drops it.
    """
    loaded, skipped, missing = [], [], []
    for name, tensor in model_state.items():
        if name not in file_state:
            missing.append(name)
        elif tuple(file_state[name].shape) != tuple(tensor.shape):
            skipped.append((name, tuple(file_state[name].shape), tuple(tensor.shape)))
        else:
            loaded.append(name)
    unexpected = [n for n in file_state if n not in model_state and not n.endswith("num_batches_tracked")]
    return Transfer(source, tuple(loaded), tuple(skipped), tuple(missing), tuple(unexpected))


def load_matching(model: nn.Module, file_state: Mapping[str, Tensor], source: str) -> Transfer:
    """Load the tensors of ``file_state`` that fit ``model`` and log what was skipped.

    Args:
        model: the model to fill (in place).
        file_state: names and tensors (any float dtype: each is cast to the model's).
        source: the file or weights name, for messages.

    Returns:
        The :class:`Transfer`.

    Raises:
        WeightsFileError: less than half of the model's tensors fit (another architecture).
    """
    model_state = model.state_dict()
    transfer = match_state_dict(model_state, file_state, source)
    if len(transfer.loaded) < MIN_FILLED * len(model_state):
        raise WeightsFileError(f"{transfer.summary()}; is it a checkpoint of this architecture?")
    model.load_state_dict({n: file_state[n].to(model_state[n].dtype) for n in transfer.loaded}, strict=False)
    rank_zero_info(transfer.summary())
    return transfer
