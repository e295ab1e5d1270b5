"""Checks that one key's outputs can be put together, and the jagged invariants for nested tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ref.errors import (
    DeviceMismatchError,
    DtypeMismatchError,
    InvalidJaggedError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)

__all__ = ["check_parts", "jagged_parts", "num_rows", "is_jagged"]


def is_jagged(x: torch.Tensor) -> bool:
    return x.is_nested


def num_rows(x: torch.Tensor) -> int:
    """``B``: the leading dimension (rows of a nested tensor)."""
    return int(x.size(0))


def _trailing(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape[2:]) if x.is_nested else tuple(x.shape[1:])


def check_parts(parts: Sequence[Any], key: Any = None, *, allow_jagged: bool = True) -> list[torch.Tensor]:
    """``parts`` checked to agree with ``parts[0]`` (same order of checks as ``ref``).

    For each micro-batch ``m``: it must be a tensor; a nested tensor must be jagged with its ragged
    dimension at 1 (`InvalidJaggedError`) and needs ``allow_jagged`` (`UnsupportedSettingError`); a
    dense one needs a batch dimension (`ShapeMismatchError`). Then, against micro-batch 0: layout
    (`ShapeMismatchError`), dtype (`DtypeMismatchError`), device (`DeviceMismatchError`), trailing
    shape (`ShapeMismatchError`).
    """
    out: list[torch.Tensor] = []
    for m, x in enumerate(parts):
        at = where(key, m)
        if not isinstance(x, torch.Tensor):
            raise ShapeMismatchError(f"{at}an output must be a tensor, got {type(x).__name__}")
        if x.is_nested:
            if x.layout != torch.jagged:
                raise InvalidJaggedError(f"{at}a nested tensor must use the jagged layout, got {x.layout}")
            if x._ragged_idx != 1:
                raise InvalidJaggedError(f"{at}the ragged dimension must be 1, got {x._ragged_idx}")
            if not allow_jagged:
                raise UnsupportedSettingError(f"{at}jagged outputs need pad_mode 'no_padding', got shape {x.shape}")
        elif x.dim() == 0:
            raise ShapeMismatchError(f"{at}a dense output needs a leading batch dimension, got a scalar")
        if out:
            first = out[0]
            if x.is_nested != first.is_nested:
                kind, kind0 = ("jagged" if t.is_nested else "dense" for t in (x, first))
                raise ShapeMismatchError(f"{at}layout {kind} differs from micro-batch 0's {kind0}")
            if x.dtype != first.dtype:
                raise DtypeMismatchError(f"{at}dtype {x.dtype} differs from micro-batch 0's {first.dtype}")
            if x.device != first.device:
                raise DeviceMismatchError(f"{at}device {x.device} differs from micro-batch 0's {first.device}")
            if _trailing(x) != _trailing(first):
                raise ShapeMismatchError(
                    f"{at}trailing shape {_trailing(x)} differs from micro-batch 0's {_trailing(first)}"
                )
        out.append(x)
    return out


def jagged_parts(
    parts: Sequence[torch.Tensor], key: Any = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Each jagged part's ``values`` ``[N_m, *F]`` and int64 ``offsets`` ``[b_m + 1]``, and all row lengths ``[B]``.

    The one validator of the jagged invariants on the torch side: 1-D integer offsets, ``offsets[0] == 0``,
    non-decreasing, ``offsets[-1] == len(values)`` (`InvalidJaggedError`). Reading offsets costs a
    host-device synchronisation on an accelerator, so the values are checked where the offsets live
    on the CPU; on an accelerator they are trusted (torch builds them).
    A part with holes (``lengths()`` set) is made contiguous first.
    """
    values: list[torch.Tensor] = []
    offsets: list[torch.Tensor] = []
    for m, x in enumerate(parts):
        if x.lengths() is not None:
            x = x.contiguous()
        v, o = x.values(), x.offsets()
        at = where(key, m)
        if o.dim() != 1 or o.dtype.is_floating_point or o.dtype == torch.bool or o.numel() < 1:
            raise InvalidJaggedError(
                f"{at}offsets must be 1-D integers with at least one entry, got {o.dtype}{list(o.shape)}"
            )
        values.append(v)
        offsets.append(o.to(torch.int64))
    lengths = torch.cat([o.diff() for o in offsets]) if offsets else torch.zeros(0, dtype=torch.int64)
    if offsets and offsets[0].device.type == "cpu":
        ends = torch.tensor([[0, v.shape[0]] for v in values], dtype=torch.int64)
        got = torch.stack([torch.stack([o[0], o[-1]]) for o in offsets])
        if bool((got != ends).any()) or bool((lengths < 0).any()):
            _explain_bad_offsets(values, offsets, key)
    return values, offsets, lengths


def _explain_bad_offsets(values: list[torch.Tensor], offsets: list[torch.Tensor], key: Any) -> None:
    """Raise `InvalidJaggedError` for the first part whose offsets break an invariant (error path only)."""
    for m, (v, o) in enumerate(zip(values, offsets, strict=True)):
        at = where(key, m)
        if int(o[0]) != 0:
            raise InvalidJaggedError(f"{at}offsets[0] must be 0, got {int(o[0])}")
        steps = o.diff()
        if bool((steps < 0).any()):
            i = int((steps < 0).nonzero()[0, 0])
            raise InvalidJaggedError(
                f"{at}offsets must be non-decreasing, got offsets[{i}] = {int(o[i])} > offsets[{i + 1}] = {int(o[i + 1])}"
            )
        if int(o[-1]) != v.shape[0]:
            raise InvalidJaggedError(f"{at}offsets[-1] must equal len(values) = {v.shape[0]}, got {int(o[-1])}")
