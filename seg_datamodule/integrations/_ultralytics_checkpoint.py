"""The weights of an Ultralytics ``.pt`` checkpoint, read without running anything the file names.

An Ultralytics checkpoint (``yolo11n-seg.pt``, a run's ``best.pt``) is a pickle of a whole
model object; ``torch.load(weights_only=True)`` refuses it and a plain ``torch.load`` would
import and call whatever the file names. :func:`read_ultralytics_weights` parses it with an
unpickler that resolves no name from the file except torch's tensor-rebuild functions, torch
dtypes, ``OrderedDict`` and ``set`` (the subset of torch's own ``weights_only`` allow-list a
checkpoint needs). Every other class or function the file names (the model's classes, a
``__reduce__`` calling ``os.system``) becomes an inert record of the arguments and state it was
given; nothing is imported, called or instantiated. The state dict is then rebuilt from those
records the way ``nn.Module.state_dict`` walks a module tree: ``_parameters``, persistent
``_buffers``, ``_modules``.
"""

from __future__ import annotations

import collections
import os
import pickle
import types
from typing import Any

import torch
from torch import Tensor

from seg_datamodule.integrations._weights import WeightsFileError, read_state_dict

__all__ = ["read_ultralytics_weights", "read_yolo_weights"]

_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("__builtin__", "set"): set,  # protocol-2 pickles name Python 2's module
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "frozenset"): frozenset,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): torch._utils._rebuild_parameter_with_state,
}


#: Deeper module nesting than any model has; a checkpoint whose modules nest deeper holds a cycle.
_MAX_DEPTH = 64


class _Inert:
    """What a class or function named by the file becomes: a record, never the real thing."""

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        record = object.__new__(cls)
        record.args, record.state, record.items = args, None, []
        return record

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE calls the "function" with its arguments
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:  # REDUCE on what a record "returned"
        return type(self)(*args)

    def __setstate__(self, state: Any) -> None:  # BUILD
        self.state = state

    def append(self, item: Any) -> None:  # APPEND(S) of a list-like reduce
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:  # SETITEM(S) of a dict-like reduce
        self.items.append((key, value))


class _InertUnpickler(pickle.Unpickler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._records: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        key = (module, name)
        if key not in self._records:
            self._records[key] = type(name, (_Inert,), {"qualname": f"{module}.{name}"})
        return self._records[key]


# What torch.load needs of a pickle module: an Unpickler (and load, for pre-1.6 files).
_INERT_PICKLE = types.SimpleNamespace(
    __name__="inert_pickle", Unpickler=_InertUnpickler,
    load=lambda f, **kwargs: _InertUnpickler(f, **kwargs).load(),
)


def read_ultralytics_weights(path: str) -> tuple[dict[str, Tensor], str]:
    """The float32 state dict of an Ultralytics checkpoint's model, as ``ckpt["ema"] or ckpt["model"]``.

    Ultralytics' own loader takes the EMA when the checkpoint has one (a run's ``last.pt``) and the
    model otherwise (a released or final ``.pt``), in float32 (``model.float()``); so does this.

    Args:
        path: the ``.pt`` file.

    Returns:
        The state dict, and a description for messages (``"ultralytics.nn.tasks.SegmentationModel,
        80 classes"``).

    Raises:
        WeightsFileError: the file is missing, unreadable, or holds no model.
    """
    if not os.path.isfile(path):
        raise WeightsFileError(f"weights file {path!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_INERT_PICKLE)
    except Exception as err:  # a broken archive or pickle
        raise WeightsFileError(f"weights file {path!r} is not a readable torch checkpoint: {err}") from err
    root = ckpt if isinstance(ckpt, _Inert) else None
    if isinstance(ckpt, dict):
        root = ckpt.get("ema") or ckpt.get("model")
    if not isinstance(root, _Inert):
        raise WeightsFileError(f"weights file {path!r} holds no Ultralytics model (neither 'ema' nor 'model')")
    state = _module_state(root, path)
    config = root.state.get("yaml") if isinstance(root.state, dict) else None
    classes = config.get("nc") if isinstance(config, dict) else None
    described = root.qualname + (f", {classes} classes" if isinstance(classes, int) else "")
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, described


def _module_state(root: _Inert, path: str) -> dict[str, Tensor]:
    """``nn.Module.state_dict`` of a module's record: parameters, persistent buffers, submodules."""
    out: dict[str, Tensor] = {}
    stack = [("", root)]
    while stack:
        prefix, record = stack.pop()
        state = record.state if isinstance(record, _Inert) else None
        # A module may be shared (Ultralytics' Conv shares one SiLU) but a tree is never this deep: a cycle.
        if not isinstance(state, dict) or prefix.count(".") > _MAX_DEPTH:
            raise WeightsFileError(f"weights file {path!r}: {prefix or 'the model'} is not a module of a model")
        params, buffers, modules = (state.get(k, {}) for k in ("_parameters", "_buffers", "_modules"))
        transient = state.get("_non_persistent_buffers_set", set())
        if not all(isinstance(d, dict) for d in (params, buffers, modules)) or not isinstance(transient, set):
            raise WeightsFileError(f"weights file {path!r}: {prefix or 'the model'} is not a module of a model")
        for name, tensor in [*params.items(), *((n, b) for n, b in buffers.items() if n not in transient)]:
            if tensor is None:
                continue
            if not isinstance(tensor, Tensor):
                raise WeightsFileError(f"weights file {path!r}: {prefix}{name} is not a tensor")
            out[prefix + name] = tensor.detach()
        children = [(f"{prefix}{name}.", child) for name, child in modules.items() if child is not None]
        stack.extend(reversed(children))  # depth first, in module order, as state_dict lists them
    return out


def read_yolo_weights(path: str) -> tuple[dict[str, Tensor], str]:
    """A plain ``state_dict`` file (``torch.load(weights_only=True)``) or else an Ultralytics checkpoint.

    Returns:
        The state dict, and how messages name its source.

    Raises:
        WeightsFileError: see :func:`read_state_dict` and :func:`read_ultralytics_weights`.
    """
    if not os.path.isfile(path):
        raise WeightsFileError(
            f"weights file {path!r} does not exist (nothing is downloaded at run time; get a released Ultralytics "
            f"checkpoint once with: python -c \"from ultralytics.utils.downloads import attempt_download_asset; "
            f"attempt_download_asset('{os.path.basename(path)}')\", or set weights: null to train from scratch)"
        )
    try:
        return read_state_dict(path), path
    except WeightsFileError:
        pass  # a pickled model, not a plain state_dict
    state, described = read_ultralytics_weights(path)
    return state, f"{path} ({described})"
