"""`postprocess_batch` and verl's drop-in `postprocess_batch_func`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import torch
from tensordict import NonTensorData

from ref.errors import PartitionMismatchError, ShapeMismatchError, where
from ref.metrics import fold_metrics
from ref.structure import check_metrics, check_partition_count, check_settings, drop_padding, model_outputs

from ._assemble import assemble
from ._entry import entry
from ._parts import check_parts
from ._permutation import check_permutation

__all__ = ["postprocess_batch", "postprocess_batch_func", "read_setting"]


@entry
def postprocess_batch(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    *,
    use_dynamic_bsz: bool = True,
    pad_mode: str = "no_padding",
) -> dict[str, Any]:
    """Put micro-batch outputs back together in original sample order (``ref.postprocess_batch``'s meaning).

    ``output_lst[m]`` may hold ``model_output`` (a dict of jagged ``[b_m, (j), *F]`` or dense
    ``[b_m, *F]`` tensors), ``loss`` and ``metrics``; ``indices[m]`` lists the original positions of
    micro-batch ``m``'s rows. With ``perm = [i for p in indices for i in p]``, row ``perm[n]`` of each
    result is row ``n`` of the concatenation. Returns ``{"model_output": {key: [B, ...]}, "loss":
    [...], "metrics": {...}}``. Every defect raises a `ref.errors.RebatchError` subclass, in the
    order documented in ``docs/spec.md``.
    """
    if isinstance(pad_mode, Enum):
        pad_mode = pad_mode.value
    check_settings(use_dynamic_bsz, pad_mode, indices)
    output_lst, indices = drop_padding(output_lst, indices)
    outs = model_outputs(output_lst)
    check_metrics(output_lst)
    perm = None
    if use_dynamic_bsz:
        check_partition_count(indices, len(outs))
        perm = check_permutation(indices, sum(len(p) for p in indices))

    model_output: dict[str, Any] = {}
    keys = list(outs[0]) if outs else []
    sizes = [len(p) for p in indices] if perm is not None and indices is not None else None
    _assemble_keys(outs, keys, sizes, perm, pad_mode, model_output)

    losses = [o["loss"] for o in output_lst if "loss" in o]
    metrics = fold_metrics(o["metrics"] for o in output_lst if "metrics" in o)
    return {"model_output": model_output, "loss": losses, "metrics": metrics}


def _assemble_keys(
    outs: Sequence[Mapping[str, Any]],
    keys: list[Any],
    sizes: list[int] | None,
    perm: torch.Tensor | None,
    pad_mode: str,
    model_output: dict[str, Any],
) -> None:
    """Check and assemble each key into ``model_output``; ``sizes``: each partition's size (None, as
    ``perm``, without dynamic batch size)."""
    first_rows: list[int] = []
    for key in keys:
        parts = check_parts([mo[key] for mo in outs], key, allow_jagged=pad_mode == "no_padding")
        if key == keys[0]:
            first_rows = [p.rows for p in parts]
        for m, part in enumerate(parts):
            if sizes is not None:
                if part.rows != sizes[m]:
                    raise PartitionMismatchError(
                        f"{where(key, m)}{part.rows} rows, but its partition has {sizes[m]} indices"
                    )
            elif part.rows != first_rows[m]:
                raise ShapeMismatchError(
                    f"{where(key, m)}{part.rows} rows, but key {keys[0]!r} has {first_rows[m]} there"
                )
        model_output[key] = assemble(parts, perm, key)


def read_setting(data: Any, key: str, default: Any) -> Any:
    """A setting read as verl reads it: ``data.get(key, default)``, unwrapping ``NonTensorData``."""
    if data is None:
        return default
    value = data.get(key, default)
    if isinstance(value, NonTensorData):
        value = value.data
    return value


@entry
def postprocess_batch_func(
    output_lst: Sequence[Mapping[str, Any]], indices: Sequence[Sequence[int]] | None, data: Any
) -> dict[str, Any]:
    """Drop-in for verl's ``postprocess_batch_func(output_lst, indices, data)``: same call, same result.

    ``data`` (a TensorDict, or None) carries ``use_dynamic_bsz`` (default True) and ``pad_mode``
    (default ``"no_padding"``; a string or verl's ``DatasetPadMode``) as ``NonTensorData``.
    """
    use_dynamic_bsz = read_setting(data, "use_dynamic_bsz", True)
    pad_mode = read_setting(data, "pad_mode", "no_padding")
    if isinstance(use_dynamic_bsz, torch.Tensor) and use_dynamic_bsz.numel() == 1:
        use_dynamic_bsz = bool(use_dynamic_bsz.item())
    return postprocess_batch(output_lst, indices, use_dynamic_bsz=use_dynamic_bsz, pad_mode=pad_mode)
