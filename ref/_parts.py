"""Checks that one key's outputs from several micro-batches can be put together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._jagged import Jagged, is_concrete, validate_jagged
from .dtypes import check_dtype
from .errors import (
    DeviceMismatchError,
    DtypeMismatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)

__all__ = ["check_parts", "check_invariants", "num_rows", "Part"]

Part = Jagged | jax.Array


def num_rows(x: Part) -> int:
    """``B``: rows of a `Jagged`, or the leading dimension of a dense array."""
    return x.num_rows if isinstance(x, Jagged) else int(x.shape[0])


def _device(x: Part) -> Any:
    arr = x.values if isinstance(x, Jagged) else x
    if not is_concrete(arr):
        return None
    return frozenset(arr.devices())


def _describe(x: Part) -> str:
    return "jagged" if isinstance(x, Jagged) else "dense"


def check_invariants(parts: Sequence[Part], key: Any = None) -> None:
    """The jagged invariants of each `Jagged` part, in micro-batch order (`InvalidJaggedError`).

    Every operation runs this on its inputs, however a `Jagged` was built (its constructor,
    ``tree_unflatten``, ``jax.tree_util.tree_map``, a ``jax.jit`` output): the values-reading invariants
    when the offsets are concrete, the others always.
    """
    for m, part in enumerate(parts):
        if isinstance(part, Jagged):
            validate_jagged(part.values, part.offsets, key=key, micro_batch=m)


def check_parts(
    parts: Sequence[Any], key: Any = None, *, allow_jagged: bool = True, invariants: bool = True
) -> list[Part]:
    """``parts`` as `Jagged` or ``jax.Array``, checked to agree with ``parts[0]``.

    For each micro-batch ``m`` in order: a dense part needs a leading batch dimension
    (`ShapeMismatchError`); a jagged part needs ``allow_jagged`` (`UnsupportedSettingError`); then,
    against micro-batch 0: the layout (`ShapeMismatchError`), the dtype (`DtypeMismatchError`), the
    device (`DeviceMismatchError`) and the trailing shape (`ShapeMismatchError`). Then the common dtype
    must be supported (`UnsupportedSettingError`, `ref.dtypes.SUPPORTED_DTYPES`); then, with ``invariants``,
    the jagged invariants of every part (`check_invariants`; ``postprocess_batch`` runs them itself,
    after the row counts).
    """
    out: list[Part] = []
    for m, part in enumerate(parts):
        x: Part = part if isinstance(part, Jagged) else jnp.asarray(part)
        at = where(key, m)
        if isinstance(x, Jagged):
            if not allow_jagged:
                raise UnsupportedSettingError(
                    f"{at}jagged outputs need pad_mode 'no_padding', got a jagged {x!r}"
                )
        elif x.ndim == 0:
            raise ShapeMismatchError(f"{at}a dense output needs a leading batch dimension, got a scalar")
        if out:
            first = out[0]
            if _describe(x) != _describe(first):
                raise ShapeMismatchError(
                    f"{at}layout {_describe(x)} differs from micro-batch 0's {_describe(first)}"
                )
            if x.dtype != first.dtype:
                raise DtypeMismatchError(f"{at}dtype {x.dtype} differs from micro-batch 0's {first.dtype}")
            dev, dev0 = _device(x), _device(first)
            if dev is not None and dev0 is not None and dev != dev0:
                raise DeviceMismatchError(
                    f"{at}device {sorted(map(str, dev))} differs from micro-batch 0's "
                    f"{sorted(map(str, dev0))}"
                )
            trail = x.feature_shape if isinstance(x, Jagged) else tuple(x.shape[1:])
            trail0 = first.feature_shape if isinstance(first, Jagged) else tuple(first.shape[1:])
            if trail != trail0:
                raise ShapeMismatchError(f"{at}trailing shape {trail} differs from micro-batch 0's {trail0}")
        out.append(x)
    if out:
        check_dtype(out[0].dtype, at=where(key, 0))
    if invariants:
        check_invariants(out, key)
    return out
